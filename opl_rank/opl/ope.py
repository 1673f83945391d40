"""Off-policy evaluation of ranking policies from logged data.

Any estimator of the registry [`opl_rank.opl.estimators.OPL_ESTIMATORS`][opl_rank.opl.estimators.OPL_ESTIMATORS] (dm, ips, snips,
dr, iips, rips, topk, and any a user registers) estimates ``V(pi)`` as the mean of its
per-round terms (or their self-normalised ratio). The policy supplies its own
propensities ([`opl_rank.opl.policies`][opl_rank.opl.policies]); estimators that need a reward model get
``f_hat`` at the logged rankings and ``E_{a ~ pi}[f_hat(x, a)]`` ([`model_values`][model_values]).
Confidence intervals: normal approximation (delta method for ratios) or a percentile
bootstrap vmapped over resampling keys. Diagnostics: effective sample size
``(sum w)^2 / sum w^2`` of the estimator's weights and the largest weight; a
[`DegenerateWeightsWarning`][DegenerateWeightsWarning] when the ESS is below 1% of n or not finite.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import jax
import jax.numpy as jnp

from opl_rank import tuning
from opl_rank.data import LoggedData
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.estimators import ModelTerms
from opl_rank.opl.policies import RankingPolicy, compiled_propensities

__all__ = ["OPEResult", "DegenerateWeightsWarning", "model_values", "evaluate"]

DEGENERATE_ESS_FRACTION = 0.01  # warn when ESS < 1% of n


class DegenerateWeightsWarning(RuntimeWarning):
    """[`evaluate`][evaluate]: an estimator's importance weights are degenerate -- their
    effective sample size is below 1% of n (e.g. all weights 0, or one weight dominating)
    or not finite -- so its estimate (and interval) should not be trusted."""


@dataclasses.dataclass(frozen=True)
class OPEResult:
    """One estimate with its uncertainty and weight diagnostics."""

    estimator: str
    value: float
    stderr: float
    ci_low: float
    ci_high: float
    ci_method: str
    n: int
    ess: float  # effective sample size of the estimator's importance weights (n for dm)
    max_weight: float


def model_values(
    policy: Any,
    reward_model: Any,
    context: jax.Array,
    key: jax.Array,
    *,
    n_samples: int = 256,
    where: jax.Array | None = None,
    n_items: int | None = None,
) -> jax.Array:
    """``E_{a ~ pi}[f_hat(x, a)]`` per row ``[n]``: exact for deterministic policies, a
    Monte Carlo mean over ``n_samples`` rankings for stochastic ones (of the candidates
    ``where`` allows). ``n_items`` (D) only sizes the batches of samples (default 1024)."""
    if _is_pytree(policy) and _is_pytree(reward_model):  # this library's policies: one compiled program
        return _compiled_model_values(policy, reward_model, context, key, n_samples, where, n_items)
    return _model_values(policy, reward_model, context, key, n_samples, where, n_items)


def _is_pytree(x: Any) -> bool:
    return not jax.tree_util.all_leaves([x])


def _model_values(policy, reward_model, context, key, n_samples, where, n_items):
    if policy.deterministic:
        return reward_model.predict(context, policy.sample(None, context, where=where))
    keys = jax.random.split(key, n_samples)
    # Samples in batches of about tuning.OPE_BATCH_FLOATS sampling intermediates ([b, n, D]) each:
    # bounded memory at any n, and the same keys (hence values) as one vmap over all of them.
    per_sample = context.shape[0] * max(1024 if n_items is None else n_items, policy.n_slots)
    batch = int(max(1, min(n_samples, tuning.OPE_BATCH_FLOATS // per_sample)))
    values = jax.lax.map(
        lambda k: reward_model.predict(context, policy.sample(k, context, where=where)), keys, batch_size=batch
    )  # [N, n]
    return jnp.mean(values, axis=0)


_compiled_model_values = jax.jit(_model_values, static_argnums=(4, 6))


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _terms(entry: opl_estimators.Estimator, target, data, model, k, max_log_weight) -> opl_estimators.Terms:
    """An estimator's per-round terms as one compiled program (registry entries are jit-able:
    the learners train through them; the entry itself is the cache key)."""
    return entry.terms(target, data, model=model, k=k, max_log_weight=max_log_weight)


def _ess(w: jax.Array) -> float:
    w = jnp.where(jnp.isfinite(w), w, 0.0)
    total = float(jnp.sum(w * w))
    return float(jnp.sum(w)) ** 2 / total if total > 0 else 0.0


@functools.partial(jax.jit, static_argnums=(3, 4))  # compiled once per shape, not once per call
def _bootstrap(num, den, key, n_bootstrap, batch=64):
    """Resampled estimates ``[B]`` (vmapped over keys, in batches to bound memory)."""
    n = num.shape[0]
    den = jnp.ones_like(num) if den is None else den

    def one(k):
        idx = jax.random.randint(k, (n,), 0, n)
        return jnp.sum(num[idx]) / jnp.sum(den[idx])

    return jax.lax.map(one, jax.random.split(key, n_bootstrap), batch_size=min(batch, n_bootstrap))


def evaluate(
    policy: Any,
    data: LoggedData,
    key: jax.Array,
    *,
    estimators: Sequence[str] = ("ips", "snips", "iips", "rips"),
    reward_model: Any = None,
    k: int | None = None,
    max_log_weight: float = math.inf,
    ci: str = "bootstrap",
    n_bootstrap: int = 1000,
    level: float = 0.95,
    n_samples: int = 256,
) -> dict[str, OPEResult]:
    """Estimate ``V(policy)`` from logged data with each of ``estimators``.

    Args:
      policy: a [`RankingPolicy`][opl_rank.opl.policies.RankingPolicy].
      data: logged rounds (``iips`` needs ``log_pi0_position_marginal``).
      key: PRNG key (model values, Monte Carlo marginals, bootstrap).
      estimators: names in [`opl_rank.opl.estimators.OPL_ESTIMATORS`][opl_rank.opl.estimators.OPL_ESTIMATORS].
      reward_model: a fitted [`RewardModel`][opl_rank.opl.reward_models.RewardModel] (dm, dr, topk).
      k: topk's prefix length in ``[0, L]`` (default: a two-stage policy's own k).
      max_log_weight: clip on log importance weights (inf: none).
      ci: ``"bootstrap"`` (percentile) or ``"normal"``.
      n_bootstrap: resamples.
      level: confidence level in (0, 1).
      n_samples: Monte Carlo samples for model values / marginals.

    Returns:
      ``{name: OPEResult}``.
    """
    if not isinstance(policy, RankingPolicy):
        raise TypeError(
            f"policy must be a RankingPolicy (n_slots, deterministic, sample, log_prob, propensities), "
            f"got {type(policy).__name__}"
        )
    entries = {name: opl_estimators.get(name) for name in estimators}
    if ci not in ("bootstrap", "normal"):
        raise ValueError(f"ci must be 'bootstrap' or 'normal', got {ci!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    needs_model = [name for name, e in entries.items() if e.needs_reward_model]
    if reward_model is None and needs_model:
        raise ValueError(f"estimators {needs_model} need reward_model")
    marginals = [name for name, e in entries.items() if e.needs_position_marginals]
    if marginals and data.log_pi0_position_marginal is None:
        raise ValueError(
            f"{', '.join(marginals)} needs LoggedData.log_pi0_position_marginal "
            "(simulate with position_marginals='exact')"
        )
    n_slots = data.ranking_length
    if policy.n_slots != n_slots:
        raise ValueError(f"policy ranks {policy.n_slots} slots but the logged rankings have L={n_slots}")
    if any(e.uses_k for e in entries.values()):
        if k is None:
            k = getattr(policy, "k", None)
        if not isinstance(k, int) or not 0 <= k <= n_slots:
            raise ValueError(
                f"{', '.join(n for n, e in entries.items() if e.uses_k)} needs k, an int in [0, L={n_slots}], got {k!r}"
            )
    k_prop, k_model, k_boot = jax.random.split(key, 3)
    target = compiled_propensities(policy, data, k_prop, slot_marginals=bool(marginals))
    model = None
    if reward_model is not None:
        model = ModelTerms(
            reward_model.predict(data.context, data.ranking),
            model_values(
                policy,
                reward_model,
                data.context,
                k_model,
                n_samples=n_samples,
                where=data.item_mask,
                n_items=data.n_items,
            ),
        )
    z = NormalDist().inv_cdf(0.5 + level / 2)
    results = {}
    for i, (name, entry) in enumerate(entries.items()):
        terms = _terms(entry, target, data, model, k, max_log_weight)
        num, den, w = terms.value, terms.normalizer, terms.weight
        n = num.shape[0]
        if den is None:
            value = float(jnp.mean(num))
            stderr = float(jnp.std(num, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        else:  # ratio estimator: delta-method standard error
            ratio = jnp.sum(num) / jnp.sum(den)
            value = float(ratio)
            stderr = float(jnp.std(num - ratio * den, ddof=1) / (math.sqrt(n) * jnp.mean(den))) if n > 1 else math.nan
        if ci == "normal":
            low, high = value - z * stderr, value + z * stderr
        else:
            draws = _bootstrap(num, den, jax.random.fold_in(k_boot, i), n_bootstrap)
            low, high = (float(q) for q in jnp.quantile(draws, jnp.array([0.5 - level / 2, 0.5 + level / 2])))
        ess = min(_ess(col) for col in (w.T if w.ndim == 2 else w[None]))
        results[name] = OPEResult(name, value, stderr, low, high, ci, n, ess, float(jnp.max(w)))
        if not math.isfinite(ess) or ess < DEGENERATE_ESS_FRACTION * n:
            warnings.warn(
                DegenerateWeightsWarning(
                    f"ope.evaluate: estimator {name!r} has degenerate importance weights: effective sample "
                    f"size {ess:.4g} of n={n} (below {DEGENERATE_ESS_FRACTION:.0%} of n, or not finite; "
                    f"largest weight {float(jnp.max(w)):.4g}); its estimate {value:.4g} is not reliable"
                ),
                stacklevel=2,
            )
    return results
