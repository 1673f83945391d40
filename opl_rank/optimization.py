"""The one minibatch training loop shared by reward models and policy learners.

An epoch shuffles the rows, cuts them into fixed-size batches (the remainder of a shuffle
is skipped, so every batch has the same shape) and runs the optax steps in jit-compiled
chunks of ``STEPS_PER_CALL`` (a ``lax.scan``). The compiled chunk is cached per (loss
function, learning rate, batch size) and does not depend on ``n``: a second fit with the
same loss function -- another data set size, seed or ``lambda``, another reward model's
parameters passed as ``aux`` -- compiles nothing.
Optional early stopping on a validation loss keeps the best parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from opl_rank.data import LoggedData

__all__ = ["TrainConfig", "TrainResult", "minimize"]

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
def _chunk_runner(loss_fn: LossFn, learning_rate: float, batch: int) -> tuple:
    """The jit-compiled run of ``STEPS_PER_CALL`` optimiser steps for one loss function.

    Its shapes depend on the batch size only, never on ``n``: fits on data sets of any
    size reuse one compilation. Steps flagged inactive (the padding of an epoch's last
    chunk) are skipped by ``lax.cond``.
    """
    optimizer = optax.adam(learning_rate)

    @jax.jit
    def run_chunk(params, opt_state, template, rows, keys, active, aux):
        def step(carry, inputs):
            params, opt_state = carry
            batch_rows, k, is_active = inputs

            def update(carry):
                params, opt_state = carry
                loss, grads = jax.value_and_grad(loss_fn)(params, template.replace(**batch_rows), k, aux)
                # optax mixes Python floats and int32 counts: fine under standard promotion only.
                with jax.numpy_dtype_promotion("standard"):
                    updates, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), loss

            return jax.lax.cond(is_active, update, lambda carry: (carry, jnp.float32(0.0)), (params, opt_state))

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), (rows, keys, active))
        return params, opt_state, jnp.sum(losses)

    return optimizer, run_chunk


@functools.partial(jax.jit, static_argnames=("batch", "n_chunks"))
def _epoch_batches(data: LoggedData, key: jax.Array, batch: int, n_chunks: int) -> tuple:
    """Shuffle and cut one epoch into ``[n_chunks, STEPS_PER_CALL, batch]`` row blocks.

    Full batches only (the remainder of the shuffle is skipped); padding steps repeat
    real rows and are flagged inactive. Compiled per ``n``, but only gathers.
    """
    n = data.n_rounds
    n_batches = n // batch
    slots = n_chunks * STEPS_PER_CALL
    k_perm, k_steps = jax.random.split(key)
    order = jax.random.permutation(k_perm, n)[: n_batches * batch].reshape(n_batches, batch)
    order = jnp.concatenate([order, jnp.broadcast_to(order[:1], (slots - n_batches, batch))], axis=0)
    shape = (n_chunks, STEPS_PER_CALL)
    rows = {name: value[order].reshape(shape + value[order].shape[1:]) for name, value in data.row_fields().items()}
    keys = jax.random.split(k_steps, slots).reshape(shape)
    active = (jnp.arange(slots) < n_batches).reshape(shape)
    return rows, keys, active


@functools.lru_cache(maxsize=256)
def _evaluator(loss_fn: LossFn) -> Callable:
    return jax.jit(loss_fn)


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
      loss_fn: ``(params, batch LoggedData, key, aux) -> scalar``; jit-able. Pass the same
        function object across fits to reuse its compilation.
      params: initial parameters (any pytree).
      data: training rows.
      key: PRNG key (shuffles and the loss's own sampling).
      config: :class:`TrainConfig`.
      aux: extra arrays the loss reads (e.g. a fitted reward model's parameters).
      valid: optional validation rows for early stopping and monitoring.
      valid_loss_fn: loss on ``valid`` (default ``loss_fn``).

    Returns:
      :class:`TrainResult` with the final (or, with early stopping, best) parameters.
    """
    n = data.n_rounds
    batch = min(config.batch_size, n)
    n_batches = n // batch
    n_chunks = -(-n_batches // STEPS_PER_CALL)
    optimizer, run_chunk = _chunk_runner(loss_fn, float(config.learning_rate), batch)
    template = data.take(jnp.arange(batch))  # shared fields, and row fields of batch shape
    evaluate = _evaluator(valid_loss_fn or loss_fn)
    opt_state = optimizer.init(params)
    best = (math.inf, params)
    history: list[dict[str, float]] = []
    since_best = 0
    for epoch in range(1, config.epochs + 1):
        key, k_epoch, k_valid = jax.random.split(key, 3)
        start = time.perf_counter()
        rows, keys, active = _epoch_batches(data, k_epoch, batch, n_chunks)
        total = 0.0
        for c in range(n_chunks):
            chunk_rows = {name: value[c] for name, value in rows.items()}
            params, opt_state, chunk_loss = run_chunk(params, opt_state, template, chunk_rows, keys[c], active[c], aux)
            total = total + chunk_loss
        record = {"epoch": epoch, "train_loss": float(total) / n_batches, "seconds": time.perf_counter() - start}
        if valid is not None:
            record["valid_loss"] = float(evaluate(params, valid, k_valid, aux))
        if not math.isfinite(record["train_loss"]):
            raise FloatingPointError(f"training loss became {record['train_loss']} at epoch {epoch}")
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
