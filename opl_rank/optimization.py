"""The one minibatch training loop shared by reward models and policy learners.

An epoch is one jit-compiled call: the rows are shuffled and ``lax.scan`` runs the optax
steps over fixed-size batches (the remainder of a shuffle is skipped, so every batch has
the same shape). The compiled epoch is cached per (loss function, learning rate, n, batch
size): a second fit with the same loss function and shapes -- another seed, another
``lambda``, another reward model's parameters passed as ``aux`` -- compiles nothing.
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


@functools.lru_cache(maxsize=256)
def _epoch_runner(loss_fn: LossFn, learning_rate: float, n: int, batch: int) -> Callable:
    """The jit-compiled epoch for one loss function and shape (cached across fits)."""
    n_batches = n // batch
    optimizer = optax.adam(learning_rate)

    @jax.jit
    def run_epoch(params, opt_state, data, key, aux):
        k_perm, k_steps = jax.random.split(key)
        order = jax.random.permutation(k_perm, n)[: n_batches * batch].reshape(n_batches, batch)

        def step(carry, inputs):
            params, opt_state = carry
            idx, k = inputs
            loss, grads = jax.value_and_grad(loss_fn)(params, data.take(idx), k, aux)
            # optax mixes Python floats and int32 counts: fine under standard promotion only.
            with jax.numpy_dtype_promotion("standard"):
                updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), (order, jax.random.split(k_steps, n_batches)))
        return params, opt_state, jnp.mean(losses)

    return optimizer, run_epoch


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
    optimizer, run_epoch = _epoch_runner(loss_fn, float(config.learning_rate), n, batch)
    evaluate = _evaluator(valid_loss_fn or loss_fn)
    opt_state = optimizer.init(params)
    best = (math.inf, params)
    history: list[dict[str, float]] = []
    since_best = 0
    for epoch in range(1, config.epochs + 1):
        key, k_epoch, k_valid = jax.random.split(key, 3)
        start = time.perf_counter()
        params, opt_state, train_loss = run_epoch(params, opt_state, data, k_epoch, aux)
        record = {"epoch": epoch, "train_loss": float(train_loss), "seconds": time.perf_counter() - start}
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
