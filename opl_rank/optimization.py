"""The one minibatch training loop shared by reward models and policy learners.

An epoch shuffles the rows, cuts them into fixed-size batches (the remainder of a shuffle
is skipped, so every batch has the same shape) and runs the optax steps in jit-compiled
chunks of ``STEPS_PER_CALL`` (a ``lax.scan``). The compiled chunk is cached per (loss
function, learning rate, batch size) and does not depend on ``n``: a second fit with the
same loss function -- another data set size, seed or ``lambda``, another reward model's
parameters passed as ``aux`` -- compiles nothing.
Optional early stopping on a validation loss keeps the best parameters.

:func:`minimize_replicas` trains ``S`` independent fits that share shapes (the seeds of
one sweep cell) as one vmapped loop: one dispatch per chunk for all replicas, which is
what an accelerator wants.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from opl_rank.data import LoggedData

__all__ = ["TrainConfig", "TrainResult", "minimize", "minimize_replicas", "stack_replicas"]

LossFn = Callable[[Any, LoggedData, jax.Array, Any], jax.Array]  # (params, batch, key, aux)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    Attributes:
      epochs: maximum passes over the data.
      batch_size: rows per step; capped at ``n`` (so ``n`` smaller than a batch trains on
        full-data batches instead of failing).
      learning_rate: Adam step size.
      patience: stop after this many epochs without a better validation loss (None: no
        early stopping); the best parameters are returned.
      progress: print one line per epoch to stderr.
    """

    epochs: int = 30
    batch_size: int = 256
    learning_rate: float = 1e-2
    patience: int | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if self.patience is not None and (not isinstance(self.patience, int) or self.patience < 1):
            raise ValueError(f"patience must be None or a positive int, got {self.patience!r}")


class TrainResult(NamedTuple):
    params: Any
    history: list[dict[str, float]]  # epoch, train_loss, (valid_loss), seconds


STEPS_PER_CALL = 16


@functools.lru_cache(maxsize=256)
def _chunk_runner(loss_fn: LossFn, learning_rate: float, batch: int, treedef: Any, replicated: bool) -> tuple:
    """The jit-compiled run of ``STEPS_PER_CALL`` optimiser steps for one loss function.

    Its shapes depend on the batch size only, never on ``n``: fits on data sets of any
    size reuse one compilation. Steps flagged inactive (the padding of an epoch's last
    chunk) are skipped by ``lax.cond``. ``replicated``: every argument carries a leading
    replica axis and the chunk is vmapped over it (independent fits sharing shapes).
    """
    optimizer = optax.adam(learning_rate)

    def run_chunk(params, opt_state, template_leaves, rows, keys, active, aux):
        template = jax.tree.unflatten(treedef, template_leaves)

        def step(carry, inputs):
            params, opt_state = carry
            batch_rows, k, is_active = inputs

            def update(carry):
                params, opt_state = carry
                loss, grads = jax.value_and_grad(loss_fn)(params, _with_rows(template, batch_rows), k, aux)
                # optax mixes Python floats and int32 counts: fine under standard promotion only.
                with jax.numpy_dtype_promotion("standard"):
                    updates, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), loss

            return jax.lax.cond(is_active, update, lambda carry: (carry, jnp.float32(0.0)), (params, opt_state))

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), (rows, keys, active))
        return params, opt_state, jnp.sum(losses)

    return optimizer, jax.jit(jax.vmap(run_chunk) if replicated else run_chunk)


def _with_rows(template: Any, rows: dict[str, jax.Array]) -> Any:
    """A batch: the template (LoggedData, or a dict of row arrays) with these rows."""
    return {**template, **rows} if isinstance(template, dict) else template.replace(**rows)


def _epoch_rows(rows: dict[str, jax.Array], key: jax.Array, batch: int, n_chunks: int) -> tuple:
    """Shuffle rows ``{name: [n, ...]}`` and cut one epoch into ``[n_chunks, STEPS_PER_CALL, batch, ...]``.

    Full batches only (the remainder of the shuffle is skipped); padding steps repeat
    real rows and are flagged inactive.
    """
    n = next(iter(rows.values())).shape[0]
    n_batches = n // batch
    slots = n_chunks * STEPS_PER_CALL
    k_perm, k_steps = jax.random.split(key)
    order = jax.random.permutation(k_perm, n)[: n_batches * batch].reshape(n_batches, batch)
    order = jnp.concatenate([order, jnp.broadcast_to(order[:1], (slots - n_batches, batch))], axis=0)
    shape = (n_chunks, STEPS_PER_CALL)
    out = {name: value[order].reshape(shape + value[order].shape[1:]) for name, value in rows.items()}
    keys = jax.random.split(k_steps, slots).reshape(shape)
    active = (jnp.arange(slots) < n_batches).reshape(shape)
    return out, keys, active


@functools.partial(jax.jit, static_argnames=("batch", "n_chunks", "replicated"))
def _epoch_batches(rows: dict[str, jax.Array], key: jax.Array, batch: int, n_chunks: int, replicated: bool) -> tuple:
    """One epoch's row blocks (vmapped over a leading replica axis when ``replicated``).
    Compiled per ``n``, but only gathers."""
    cut = functools.partial(_epoch_rows, batch=batch, n_chunks=n_chunks)
    return jax.vmap(cut)(rows, key) if replicated else cut(rows, key)


@functools.lru_cache(maxsize=256)
def _evaluator(loss_fn: LossFn) -> Callable:
    return jax.jit(loss_fn)


def _split3(key: jax.Array, replicated: bool) -> tuple:
    parts = jax.vmap(lambda k: jax.random.split(k, 3))(key) if replicated else jax.random.split(key, 3)
    return (parts[:, 0], parts[:, 1], parts[:, 2]) if replicated else (parts[0], parts[1], parts[2])


def _train(
    loss_fn: LossFn, params: Any, rows: dict[str, jax.Array], template: LoggedData | list[jax.Array],
    treedef: Any, n: int, key: jax.Array, config: TrainConfig, aux: Any, replicated: bool,
    valid: LoggedData | None = None, valid_loss_fn: LossFn | None = None,
) -> TrainResult:
    """The epoch loop behind :func:`minimize` and :func:`minimize_replicas`."""
    batch = min(config.batch_size, n)
    n_batches = n // batch
    n_chunks = -(-n_batches // STEPS_PER_CALL)
    optimizer, run_chunk = _chunk_runner(loss_fn, float(config.learning_rate), batch, treedef, replicated)
    evaluate = _evaluator(valid_loss_fn or loss_fn)
    opt_state = jax.vmap(optimizer.init)(params) if replicated else optimizer.init(params)
    best = (math.inf, params)
    history: list[dict[str, float]] = []
    since_best = 0
    for epoch in range(1, config.epochs + 1):
        key, k_epoch, k_valid = _split3(key, replicated)
        start = time.perf_counter()
        blocks, keys, active = _epoch_batches(rows, k_epoch, batch, n_chunks, replicated)
        total = 0.0
        for c in range(n_chunks):
            at = (slice(None), c) if replicated else c
            chunk_rows = {name: value[at] for name, value in blocks.items()}
            params, opt_state, chunk_loss = run_chunk(params, opt_state, template, chunk_rows, keys[at], active[at], aux)
            total = total + chunk_loss
        losses = np.atleast_1d(np.asarray(total, dtype=np.float64)) / n_batches
        record = {"epoch": epoch, "train_loss": float(np.mean(losses)), "seconds": time.perf_counter() - start}
        if replicated:
            record["train_loss_replicas"] = losses.tolist()
        if valid is not None:
            record["valid_loss"] = float(evaluate(params, valid, k_valid, aux))
        if not np.all(np.isfinite(losses)):
            raise FloatingPointError(f"training loss became {losses.tolist()} at epoch {epoch}")
        history.append(record)
        if config.progress:
            extra = f"  valid_loss {record['valid_loss']:+.5f}" if "valid_loss" in record else ""
            print(f"epoch {epoch:>3}/{config.epochs}  train_loss {record['train_loss']:+.5f}{extra}", file=sys.stderr)
        if valid is not None and config.patience is not None:
            if record["valid_loss"] < best[0]:
                best, since_best = (record["valid_loss"], params), 0
            else:
                since_best += 1
                if since_best >= config.patience:
                    return TrainResult(best[1], history)
    if valid is not None and config.patience is not None and best[0] <= history[-1]["valid_loss"]:
        return TrainResult(best[1], history)
    return TrainResult(params, history)


def minimize(
    loss_fn: LossFn,
    params: Any,
    data: LoggedData,
    key: jax.Array,
    config: TrainConfig,
    *,
    aux: Any = None,
    valid: LoggedData | None = None,
    valid_loss_fn: LossFn | None = None,
) -> TrainResult:
    """Minimise ``mean over batches of loss_fn(params, batch, key, aux)`` with Adam.

    Args:
      loss_fn: ``(params, batch, key, aux) -> scalar``; jit-able. Pass the same function
        object across fits to reuse its compilation.
      params: initial parameters (any pytree).
      data: training rows: a :class:`LoggedData` (batches are LoggedData), or a dict of
        arrays sharing a leading axis ``n`` (batches are dicts; e.g. pairs of rounds).
      key: PRNG key (shuffles and the loss's own sampling).
      config: :class:`TrainConfig`.
      aux: extra arrays the loss reads (e.g. a fitted reward model's parameters).
      valid: optional validation rows for early stopping and monitoring.
      valid_loss_fn: loss on ``valid`` (default ``loss_fn``).

    Returns:
      :class:`TrainResult` with the final (or, with early stopping, best) parameters.
    """
    if isinstance(data, dict):
        rows = dict(data)
        n = next(iter(rows.values())).shape[0]
        template: Any = {name: value[: min(config.batch_size, n)] for name, value in rows.items()}
    else:
        rows, n = data.row_fields(), data.n_rounds
        template = data.take(jnp.arange(min(config.batch_size, n)))  # shared fields, row fields of batch shape
    leaves, treedef = jax.tree.flatten(template)
    return _train(
        loss_fn, params, rows, leaves, treedef, n, key, config, aux, False, valid=valid, valid_loss_fn=valid_loss_fn,
    )


def minimize_replicas(
    loss_fn: LossFn,
    params: Any,
    datas: Sequence[LoggedData],
    keys: jax.Array,
    config: TrainConfig,
    *,
    aux: Any = None,
) -> TrainResult:
    """``S`` independent :func:`minimize` runs that share shapes, vmapped into one.

    Args:
      loss_fn: as for :func:`minimize`.
      params: initial parameters with a leading replica axis ``[S, ...]`` on every leaf.
      datas: ``S`` data sets of equal shapes (``n``, ``L``, ``D``, the same optional fields).
      keys: ``[S]`` PRNG keys.
      config: :class:`TrainConfig` (no early stopping: replicas train for ``epochs``).
      aux: the loss's extra arrays with a leading replica axis (or None).

    Returns:
      :class:`TrainResult`: parameters ``[S, ...]``; each history record's ``train_loss``
      is the mean over replicas, ``train_loss_replicas`` the per-replica values. Replica
      ``s`` matches ``minimize(..., datas[s], keys[s], ...)`` up to float rounding (~1e-5).
    """
    rows, template, treedef = stack_replicas(datas, min(config.batch_size, datas[0].n_rounds))
    if keys.shape[:1] != (len(datas),):
        raise ValueError(f"keys must have shape [S={len(datas)}], got {keys.shape}")
    return _train(loss_fn, params, rows, template, treedef, datas[0].n_rounds, keys, config, aux, True)


def stack_replicas(datas: Sequence[LoggedData], batch: int) -> tuple[dict[str, jax.Array], list[jax.Array], Any]:
    """Row fields ``{name: [S, n, ...]}``, a batch-sized template's leaves ``[S, ...]`` and its treedef.

    Raises a ValueError naming the mismatch unless every data set has the same shapes.
    """
    if not datas:
        raise ValueError("datas must not be empty")
    flat = [jax.tree.flatten(d) for d in datas]
    for i, (leaves, treedef) in enumerate(flat[1:], start=1):
        shapes = [x.shape for x in leaves]
        if treedef != flat[0][1] or shapes != [x.shape for x in flat[0][0]]:
            raise ValueError(
                f"datas[{i}] does not share datas[0]'s shapes and fields (n, L, D, optional fields): "
                f"{shapes} vs {[x.shape for x in flat[0][0]]}"
            )
    rows = {name: jnp.stack([d.row_fields()[name] for d in datas]) for name in datas[0].row_fields()}
    templates = [jax.tree.flatten(d.take(jnp.arange(batch))) for d in datas]
    leaves = [jnp.stack(parts) for parts in zip(*(t[0] for t in templates))]
    return rows, leaves, templates[0][1]
