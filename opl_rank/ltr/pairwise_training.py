"""Training a pointwise neural ranker with the (unbiased) pairwise loss of [`opl_rank.ltr.pairwise`][opl_rank.ltr.pairwise].

Lists are fixed-shape ``[N, K]`` (clicked logs, or relevance-labelled lists), so one step
is compiled once per batch shape. Targets are clicks (debiased by ``correction``) or, for
the full-information oracle, the relevance indicators themselves (``correction="none"``
with ``targets=relevant``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank.ltr.pairwise import CORRECTIONS, PAIR_LOSSES, unbiased_pairwise_loss
from opl_rank.optimization import TrainConfig, minimize
from opl_rank.scorers import MLPScorer

__all__ = ["PairwiseTrainConfig", "PairwiseRanker", "train_pairwise_ranker"]


@dataclasses.dataclass(frozen=True)
class PairwiseTrainConfig:
    """Hyperparameters of [`train_pairwise_ranker`][train_pairwise_ranker].

    Attributes:
      hidden: MLP hidden sizes.
      learning_rate: Adam step size.
      epochs: passes over the lists.
      batch_lists: lists per step (capped at N).
      pair_loss: a name in [`opl_rank.ltr.pairwise.PAIR_LOSSES`][opl_rank.ltr.pairwise.PAIR_LOSSES].
      weight_decay: AdamW decoupled weight decay.
      patience: with validation lists, stop after this many epochs without a lower
        validation loss (the same debiased loss on held-out queries' clicks) and keep the
        best parameters.
    """

    hidden: tuple[int, ...] = (64, 32)
    learning_rate: float = 1e-3
    epochs: int = 40
    batch_lists: int = 128
    pair_loss: str = "ranknet"
    weight_decay: float = 0.0
    patience: int = 5

    def __post_init__(self) -> None:
        if self.pair_loss not in PAIR_LOSSES:
            raise ValueError(f"pair_loss must be one of {sorted(PAIR_LOSSES)}, got {self.pair_loss!r}")
        for name in ("epochs", "batch_lists", "patience"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


class PairwiseRanker(NamedTuple):
    """A trained scorer: ``scores(features [.., D, F]) -> [.., D]``."""

    module: MLPScorer
    params: Any
    history: list[dict[str, float]]  # per epoch: train_loss (and valid_loss)

    def scores(self, features: jax.Array) -> jax.Array:
        """``[.., D, F] -> [.., D]`` scores."""
        # flax types apply's result as Any | (output, state); without mutable= it is the output
        return cast(jax.Array, self.module.apply(self.params, jnp.asarray(features, jnp.float32)))


@functools.lru_cache(maxsize=32)
def _loss(module: MLPScorer, pair_loss: str, correction: str) -> Callable[[Any, Any, jax.Array, Any], jax.Array]:
    """The mean per-list debiased pairwise loss: one function object per setting (compiled once)."""

    def loss_fn(params: Any, batch: Any, key: jax.Array, aux: Any) -> jax.Array:
        examination, joint = aux
        scores = cast(jax.Array, module.apply(params, batch["features"]))  # the output (no mutable=), as above
        return jnp.mean(
            unbiased_pairwise_loss(
                scores,
                batch["targets"],
                examination,
                joint,
                where=batch["mask"],
                pair_loss=pair_loss,
                correction=correction,
            )
        )

    return loss_fn


def train_pairwise_ranker(
    features: np.ndarray,
    targets: np.ndarray,
    mask: np.ndarray,
    examination: np.ndarray,
    joint_examination: np.ndarray,
    key: jax.Array,
    *,
    correction: str = "joint",
    config: PairwiseTrainConfig = PairwiseTrainConfig(),
    valid: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
) -> PairwiseRanker:
    """Fit an MLP scorer by minimising the mean per-list pairwise loss with Adam(W), in the
    one training loop of [`opl_rank.optimization`][opl_rank.optimization].

    Args:
      features: ``[N, K, F]`` features of the shown documents, rank order.
      targets: ``[N, K]`` bool clicks (or relevance indicators for the oracle).
      mask: ``[N, K]`` bool shown documents.
      examination: ``[K]`` examination probabilities of the ranks.
      joint_examination: ``[K, K]`` joint examination probabilities.
      key: PRNG key (initialisation and shuffling).
      correction: ``"joint"`` (unbiased), ``"individual"`` or ``"none"``; see
        [`opl_rank.ltr.pairwise.correction_matrix`][opl_rank.ltr.pairwise.correction_matrix].
      config: [`PairwiseTrainConfig`][PairwiseTrainConfig].
      valid: optional held-out ``(features, targets, mask)`` lists (other queries' logs,
        same ranks): early stopping on the same loss, best parameters kept.
      on_epoch: ``(epoch, record)`` called on the host for every epoch, after each compiled chunk of epochs, as training goes
        (progress; see [`opl_rank.optimization.minimize`][opl_rank.optimization.minimize]).

    Returns:
      [`PairwiseRanker`][PairwiseRanker].
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    feature_array = jnp.asarray(features, jnp.float32)
    if feature_array.ndim != 3 or targets.shape != feature_array.shape[:2] or mask.shape != feature_array.shape[:2]:
        raise ValueError(
            f"need features [N, K, F], targets and mask [N, K]; got {feature_array.shape}, {targets.shape}, {mask.shape}"
        )
    module = MLPScorer(hidden=tuple(config.hidden))
    k_init, key = jax.random.split(key)
    params = module.init(k_init, feature_array[:1])
    rows = {"features": feature_array, "targets": jnp.asarray(targets, bool), "mask": jnp.asarray(mask, bool)}
    aux = (jnp.asarray(examination, jnp.float32), jnp.asarray(joint_examination, jnp.float32))
    held_out = None
    if valid is not None:
        held_out = {
            "features": jnp.asarray(valid[0], jnp.float32),
            "targets": jnp.asarray(valid[1], bool),
            "mask": jnp.asarray(valid[2], bool),
        }
    train = TrainConfig(
        epochs=config.epochs,
        batch_size=config.batch_lists,
        learning_rate=config.learning_rate,
        patience=config.patience if valid is not None else None,
        optimizer="adamw",
        weight_decay=config.weight_decay,
    )
    result = minimize(
        _loss(module, config.pair_loss, correction),
        params,
        rows,
        key,
        train,
        aux=aux,
        valid=held_out,
        on_epoch=on_epoch,
        name=f"pairwise ranker ({correction})",
    )
    history = [{name: r[name] for name in ("train_loss", "valid_loss") if name in r} for r in result.history]
    return PairwiseRanker(module, result.params, history)
