"""Full-information learning to rank with the PL policy-gradient estimators.

A pointwise MLP scores documents; a Plackett-Luce policy over those scores is trained with
any estimator of [`opl_rank.pl.gradients`][opl_rank.pl.gradients] and, for the exposure estimators, any loss
of [`opl_rank.ltr.exposure_losses`][opl_rank.ltr.exposure_losses], in the one training loop of
[`opl_rank.optimization`][opl_rank.optimization] (compiled once per config and data shapes). NDCG@K of the
deterministic ranking (sort by score) and the estimated loss on held-out queries are
recorded every epoch.

Relevance used by the estimators: ``rho_d = (2^label_d - 1) / IDCG@K`` per query, so the
relevance utility is the policy's expected NDCG@K (0 for queries without relevant docs).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp

from opl_rank import metrics
from opl_rank.ltr import exposure_losses
from opl_rank.optimization import TrainConfig, minimize
from opl_rank.pl import gradients
from opl_rank.scorers import MLPScorer

__all__ = ["LTRConfig", "LTRResult", "RankingQueries", "ideal_normalized_gains", "train_ltr", "LOSSES"]

LOSSES: dict[str, Callable[..., jax.Array]] = {
    "relevance": exposure_losses.relevance_loss,
    "frac_fair": exposure_losses.frac_fair_loss,
    "prod_fair": exposure_losses.prod_fair_loss,
    "kl_fair": exposure_losses.kl_fair_loss,
}
_EXPOSURE_ESTIMATORS = {"exposure": True, "exposure_original": False}


class RankingQueries(NamedTuple):
    """Padded per-query arrays (what [`simulators.letor.load_letor`][simulators.letor.load_letor] returns)."""

    features: Any  # [Q, D, F] float32
    labels: Any  # [Q, D] float32 graded relevance
    mask: Any  # [Q, D] bool


@dataclasses.dataclass(frozen=True)
class LTRConfig:
    """Hyperparameters of [`train_ltr`][train_ltr] (the paper's setting by default).

    Attributes:
      hidden: MLP hidden sizes (paper: 1024, 512, 256).
      learning_rate: Adamax learning rate (paper: 1e-3).
      batch_queries: queries per step (paper: 128; capped at the training set size).
      epochs: passes over the training queries.
      estimator: a name in ``gradients.GRADIENT_ESTIMATORS``.
      n_samples: ``N`` sampled rankings per query and step.
      baseline: leave-one-out baselines (ignored by PL-Rank-3).
      loss: ``relevance`` (any estimator) or ``frac_fair``, ``prod_fair``, ``kl_fair``
        (exposure estimators only).
      cutoff: ``K``, ranking length sampled and the NDCG cutoff (paper: 10).
    """

    hidden: tuple[int, ...] = (1024, 512, 256)
    learning_rate: float = 1e-3
    batch_queries: int = 128
    epochs: int = 10
    estimator: str = "exposure"
    n_samples: int = 100
    baseline: bool = True
    loss: str = "relevance"
    cutoff: int = 10

    def __post_init__(self) -> None:
        if self.estimator not in gradients.GRADIENT_ESTIMATORS:
            raise ValueError(
                f"estimator must be one of {sorted(gradients.GRADIENT_ESTIMATORS)}, got {self.estimator!r}"
            )
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {self.loss!r}")
        if self.loss != "relevance" and self.estimator not in _EXPOSURE_ESTIMATORS:
            raise ValueError(f"loss {self.loss!r} needs an exposure estimator, got {self.estimator!r}")
        for name in ("batch_queries", "epochs", "n_samples", "cutoff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.baseline and self.n_samples < 2 and self.estimator != "plrank3":
            raise ValueError("baseline=True needs n_samples >= 2")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not self.hidden or any((not isinstance(h, int)) or h < 1 for h in self.hidden):
            raise ValueError(f"hidden must be positive ints, got {self.hidden!r}")


class LTRResult(NamedTuple):
    """Trained parameters and the per-epoch history (one dict per epoch)."""

    params: Any
    history: list[dict[str, float]]


def ideal_normalized_gains(labels: jax.Array, mask: jax.Array, cutoff: int) -> jax.Array:
    """``rho = (2^label - 1) / IDCG@K`` per query (0 where IDCG is 0 or masked).

    Args:
      labels: ``[Q, D]`` graded relevance.
      mask: ``[Q, D]`` bool.
      cutoff: ``K``.

    Returns:
      ``[Q, D]`` float32.
    """
    gains = jnp.where(mask, jnp.exp2(labels.astype(jnp.float32)) - 1.0, 0.0)
    k = min(cutoff, labels.shape[-1])
    top = jax.lax.top_k(gains, k)[0]
    ideal = top @ metrics.dcg_weights(k)
    safe = jnp.where(ideal > 0, ideal, 1.0)
    return jnp.where((ideal > 0)[..., None], gains / safe[..., None], 0.0)


@functools.lru_cache(maxsize=64)
def _objective(config: LTRConfig) -> Callable[..., jax.Array]:
    """``(logits, rho, mask, key) -> [Q]`` per-query loss whose gradient is the estimator's."""
    theta = metrics.dcg_weights(config.cutoff)
    if config.estimator in _EXPOSURE_ESTIMATORS:
        corrected = _EXPOSURE_ESTIMATORS[config.estimator]
        loss_fn = LOSSES[config.loss]

        def exposure_objective(logits: jax.Array, rho: jax.Array, mask: jax.Array, key: jax.Array) -> jax.Array:
            expo = gradients.exposure(
                logits, theta, key, config.n_samples, where=mask, baseline=config.baseline, corrected=corrected
            )
            return loss_fn(expo, rho, where=mask)

        return exposure_objective
    estimator = gradients.GRADIENT_ESTIMATORS[config.estimator]
    extra = {} if config.estimator == "plrank3" else {"baseline": config.baseline}

    def gradient_objective(logits: jax.Array, rho: jax.Array, mask: jax.Array, key: jax.Array) -> jax.Array:
        return -estimator(logits, rho, theta, key, config.n_samples, where=mask, **extra)

    return gradient_objective


@functools.lru_cache(maxsize=64)
def _losses(config: LTRConfig) -> tuple[Callable, Callable]:
    """The batch loss and the per-epoch validation metrics: one function object per config,
    so every call of [`train_ltr`][train_ltr] with this config reuses one compilation."""
    model = MLPScorer(hidden=tuple(config.hidden))
    objective = _objective(config)

    def masked_logits(params: Any, features: jax.Array, mask: jax.Array) -> jax.Array:
        # flax types apply's result as Any | (output, state); without mutable= it is the output
        return jnp.where(mask, cast(jax.Array, model.apply(params, features)), -jnp.inf)

    def batch_loss(params, batch, key, aux):
        logits = masked_logits(params, batch["features"], batch["mask"])
        return jnp.mean(objective(logits, batch["rho"], batch["mask"], key))

    def valid_metrics(params, valid, key):
        logits = masked_logits(params, valid["features"], valid["mask"])
        return {
            f"valid_ndcg@{config.cutoff}": jnp.mean(
                metrics.ndcg_at_k(logits, valid["labels"], config.cutoff, where=valid["mask"])
            )
        }

    return batch_loss, valid_metrics


def train_ltr(
    train: Any,
    valid: Any,
    key: jax.Array,
    config: LTRConfig,
    *,
    progress: Callable[[dict[str, float]], None] | None = None,
) -> LTRResult:
    """Train an MLP-scored PL ranker on full-information relevance labels.

    Runs the one training loop ([`opl_rank.optimization.minimize`][opl_rank.optimization.minimize]) with Adamax.

    Args:
      train: training queries (``features [Q, D, F]``, ``labels [Q, D]``, ``mask [Q, D]``).
      valid: held-out queries, same ``F``.
      key: PRNG key (initialisation, shuffling, sampling).
      config: [`LTRConfig`][LTRConfig].
      progress: called with each epoch's record as training goes.

    Returns:
      [`LTRResult`][LTRResult]; history records hold ``epoch``, ``seconds`` (wall time since the
      previous record; the first includes compilation), ``train_loss``, ``valid_ndcg@K``
      and ``valid_loss``.
    """
    train = RankingQueries(*(jnp.asarray(a) for a in (train.features, train.labels, train.mask)))
    valid = RankingQueries(*(jnp.asarray(a) for a in (valid.features, valid.labels, valid.mask)))
    n_docs = train.features.shape[1]
    if valid.features.shape[2] != train.features.shape[2]:
        raise ValueError(f"valid has {valid.features.shape[2]} features, train {train.features.shape[2]}")
    if config.cutoff > min(n_docs, valid.features.shape[1]):
        raise ValueError(
            f"cutoff K={config.cutoff} exceeds the padded query size {min(n_docs, valid.features.shape[1])}"
        )
    batch_loss, valid_metrics = _losses(config)
    rows = {
        "features": train.features,
        "rho": ideal_normalized_gains(train.labels, train.mask, config.cutoff),
        "mask": train.mask,
    }
    held_out = {
        "features": valid.features,
        "rho": ideal_normalized_gains(valid.labels, valid.mask, config.cutoff),
        "mask": valid.mask,
        "labels": valid.labels,
    }
    key, k_init = jax.random.split(key)
    params = MLPScorer(hidden=tuple(config.hidden)).init(k_init, train.features[:1])
    times = [time.perf_counter()]

    def on_epoch(epoch: int, record: dict[str, float]) -> None:
        times.append(time.perf_counter())
        if progress is not None:
            progress({"epoch": epoch, "seconds": times[-1] - times[-2], **record})

    train_config = TrainConfig(
        epochs=config.epochs, batch_size=config.batch_queries, learning_rate=config.learning_rate, optimizer="adamax"
    )
    result = minimize(
        batch_loss,
        params,
        rows,
        key,
        train_config,
        valid=held_out,
        metrics_fn=valid_metrics,
        on_epoch=on_epoch,
        name=f"LTR ({config.estimator})",
    )
    history = [
        {
            "epoch": r["epoch"],
            "seconds": times[i + 1] - times[i],
            "train_loss": r["train_loss"],
            f"valid_ndcg@{config.cutoff}": r[f"valid_ndcg@{config.cutoff}"],
            "valid_loss": r["valid_loss"],
        }
        for i, r in enumerate(result.history)
    ]
    return LTRResult(result.params, history)
