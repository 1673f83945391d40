"""Off-policy evaluation of ranking policies from logged data.

Estimators (per-round values, then a mean; R = sum_l alpha_l r_l):

  dm      E_{a ~ pi}[f_hat(x, a)]                         (needs a reward model)
  ips     w R,              w = pi(a | x) / pi_0(a | x)
  snips   w R / mean(w)                                   (self-normalised)
  dr      w (R - f_hat(x, a)) + E_{a ~ pi}[f_hat(x, a)]   (needs a reward model)
  iips    sum_l alpha_l r_l P_pi(a_l at l) / P_0(a_l at l)  (needs logged position marginals)
  rips    sum_l alpha_l r_l pi(a_{1:l}) / pi_0(a_{1:l})
  topk    w_k (R - f_hat(x, a)) + E_{a ~ pi}[f_hat(x, a)],  w_k = pi(a_{1:k}) / pi_0(a_{1:k})
          -- R-POD's decomposition (Eq. 9) as an estimator; k = L is dr, k = 0 is dm plus
          the mean logged residual R - f_hat(x, a).

Target policies are the learners' :class:`~opl_rank.learners.PLPolicy` (exact PL
propensities and position marginals), :class:`~opl_rank.learners.RegressionPolicy`
(deterministic: propensities are indicators) and :class:`~opl_rank.learners.TwoStagePolicy`
(PL over the top k times the indicator that the second stage completes the logged prefix
the logged way; its position marginals below k are exact, beyond k they are exact by
enumerating first-stage prefixes when there are at most ``max_enumerated``, and Monte Carlo
otherwise). Confidence intervals: normal approximation or a percentile bootstrap vmapped
over resampling keys. Diagnostics: effective sample size ``(sum w)^2 / sum w^2`` and the
largest weight.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from opl_rank import plackett_luce as pl
from opl_rank.data import LoggedData

__all__ = ["ESTIMATORS", "OPEResult", "TargetPropensities", "target_propensities", "model_values", "evaluate"]

ESTIMATORS = ("dm", "ips", "snips", "dr", "iips", "rips", "topk")
_NEEDS_MODEL = ("dm", "dr", "topk")


class TargetPropensities(NamedTuple):
    """The target policy's log-propensities of the logged rankings.

    Attributes:
      log_prefix: ``[n, L]`` ``log pi(a_{1:l} | x)`` (``-inf`` off a deterministic support).
      log_slot: ``[n, L]`` ``log P_pi(a_l at slot l | x)``.
      slot_exact: False when ``log_slot`` beyond a two-stage policy's k is a Monte Carlo estimate.
    """

    log_prefix: jax.Array
    log_slot: jax.Array
    slot_exact: bool


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


def _log_indicator(match: jax.Array) -> jax.Array:
    return jnp.where(match, 0.0, -jnp.inf)


def target_propensities(
    policy: Any,
    data: LoggedData,
    key: jax.Array,
    *,
    n_samples: int = 512,
    max_enumerated: int = 1024,
    slot_marginals: bool = True,
) -> TargetPropensities:
    """Propensities of ``policy`` at the logged rankings (see the module docstring).

    Args:
      policy: a ``PLPolicy``, ``RegressionPolicy`` or ``TwoStagePolicy``.
      data: logged rounds.
      key: PRNG key (Monte Carlo position marginals of two-stage policies only).
      n_samples: first-stage samples per row for those.
      max_enumerated: enumerate first-stage prefixes up to this many instead.
      slot_marginals: False skips a two-stage policy's slot marginals beyond k (only IIPS
        reads them; they cost one completion per first-stage prefix and row) and returns
        NaN there.
    """
    from opl_rank.learners import PLPolicy, RegressionPolicy, TwoStagePolicy

    context, ranking = data.context, data.ranking
    n_slots = ranking.shape[-1]
    if not isinstance(policy, (PLPolicy, RegressionPolicy, TwoStagePolicy)):
        raise TypeError(f"policy must be a PLPolicy, RegressionPolicy or TwoStagePolicy, got {type(policy).__name__}")
    if policy.n_slots != n_slots:
        raise ValueError(f"policy ranks {policy.n_slots} slots but the logged rankings have L={n_slots}")
    if isinstance(policy, PLPolicy):
        logits = policy.logits(context)
        log_slot = jnp.log(jnp.maximum(pl.exact_slot_marginals(logits, ranking), 1e-38))
        return TargetPropensities(pl.prefix_log_probs(logits, ranking), log_slot, True)
    if isinstance(policy, RegressionPolicy):
        chosen = policy.sample(None, context)
        same = ranking == chosen
        return TargetPropensities(_log_indicator(jnp.cumprod(same, axis=-1) > 0), _log_indicator(same), True)
    k = policy.first_stage.n_slots
    logits = policy.first_stage.logits(context)
    head = pl.prefix_log_probs(logits, ranking[:, :k])  # [n, k]
    completed = policy.reward_model.complete(context, ranking[:, :k])
    tail_match = jnp.cumprod(completed[:, k:] == ranking[:, k:], axis=-1) > 0
    log_prefix = jnp.concatenate([head, head[:, -1:] + _log_indicator(tail_match)], axis=-1)
    # Slot marginals: exact PL below k; beyond k, sum over first-stage prefixes.
    below = pl.exact_slot_marginals(logits, ranking[:, :k])
    if not slot_marginals:
        unknown = jnp.full(ranking[:, k:].shape, jnp.nan, jnp.float32)
        return TargetPropensities(log_prefix, jnp.concatenate([jnp.log(jnp.maximum(below, 1e-38)), unknown], axis=-1), True)
    n_prefixes = math.perm(data.n_items, k)
    if n_prefixes <= max_enumerated:
        prefixes = jnp.broadcast_to(jnp.asarray(pl.all_rankings(data.n_items, k))[:, None, :], (n_prefixes,) + head.shape)
        weight = jnp.exp(pl.prefix_log_probs(jnp.broadcast_to(logits, (n_prefixes,) + logits.shape), prefixes)[..., -1])  # [P, n]
        exact = True
    else:
        prefixes = pl.sample_rankings(key, logits, k, n_samples=n_samples)  # [N, n, k]
        weight = jnp.full(prefixes.shape[:2], 1.0 / n_samples)
        exact = False
    tails = policy.reward_model.complete(context, prefixes)[..., k:]  # [P, n, L-k]
    beyond = jnp.einsum("pn,pnl->nl", weight, (tails == ranking[None, :, k:]).astype(jnp.float32))
    log_slot = jnp.log(jnp.maximum(jnp.concatenate([below, beyond], axis=-1), 1e-38))
    return TargetPropensities(log_prefix, log_slot, exact)


def model_values(policy: Any, reward_model: Any, context: jax.Array, key: jax.Array, *, n_samples: int = 256) -> jax.Array:
    """``E_{a ~ pi}[f_hat(x, a)]`` per row ``[n]``: exact for deterministic policies, a
    Monte Carlo mean over ``n_samples`` rankings for stochastic ones."""
    from opl_rank.learners import RegressionPolicy

    if isinstance(policy, RegressionPolicy):
        return reward_model.predict(context, policy.sample(None, context))
    keys = jax.random.split(key, n_samples)
    rankings = jax.vmap(lambda k: policy.sample(k, context))(keys)  # [N, n, L]
    return jnp.mean(reward_model.predict(context, rankings), axis=0)


def _ess(w: jax.Array) -> float:
    w = jnp.where(jnp.isfinite(w), w, 0.0)
    total = float(jnp.sum(w * w))
    return float(jnp.sum(w)) ** 2 / total if total > 0 else 0.0


def _round_terms(name, data, tp, f_logged, f_policy, k, max_log_weight):
    """``(numerator [n], denominator [n] or None, weights for diagnostics [n or n, L])``."""
    clip = lambda log_w: jnp.exp(jnp.minimum(log_w, max_log_weight))
    alpha = data.position_weight
    big_r = data.reward @ alpha
    w = clip(tp.log_prefix[:, -1] - data.log_pi0_prefix[:, -1])
    if name == "dm":
        return f_policy, None, jnp.ones_like(big_r)
    if name == "ips":
        return w * big_r, None, w
    if name == "snips":
        return w * big_r, w, w
    if name == "dr":
        return w * (big_r - f_logged) + f_policy, None, w
    if name == "rips":
        w_l = clip(tp.log_prefix - data.log_pi0_prefix)
        return (w_l * data.reward) @ alpha, None, w_l
    if name == "iips":
        w_l = clip(tp.log_slot - data.log_pi0_position_marginal)
        return (w_l * data.reward) @ alpha, None, w_l
    # topk
    w_k = jnp.ones_like(big_r) if k == 0 else clip(tp.log_prefix[:, k - 1] - data.log_pi0_prefix[:, k - 1])
    return w_k * (big_r - f_logged) + f_policy, None, w_k


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
      policy: a ``PLPolicy``, ``RegressionPolicy`` or ``TwoStagePolicy``.
      data: logged rounds (``iips`` needs ``log_pi0_position_marginal``).
      key: PRNG key (model values, Monte Carlo marginals, bootstrap).
      estimators: names from ``ESTIMATORS``.
      reward_model: a fitted :class:`~opl_rank.reward_models.RewardModel` (dm, dr, topk).
      k: topk's prefix length in ``[0, L]`` (default: a two-stage policy's own k).
      max_log_weight: clip on log importance weights (inf: none).
      ci: ``"bootstrap"`` (percentile) or ``"normal"``.
      n_bootstrap: resamples.
      level: confidence level in (0, 1).
      n_samples: Monte Carlo samples for model values / marginals.

    Returns:
      ``{name: OPEResult}``.
    """
    unknown = sorted(set(estimators) - set(ESTIMATORS))
    if unknown:
        raise ValueError(f"unknown estimator(s) {unknown}; known: {list(ESTIMATORS)}")
    if ci not in ("bootstrap", "normal"):
        raise ValueError(f"ci must be 'bootstrap' or 'normal', got {ci!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if reward_model is None and any(e in _NEEDS_MODEL for e in estimators):
        raise ValueError(f"estimators {[e for e in estimators if e in _NEEDS_MODEL]} need reward_model")
    if "iips" in estimators and data.log_pi0_position_marginal is None:
        raise ValueError("iips needs LoggedData.log_pi0_position_marginal (simulate with position_marginals='exact')")
    n_slots = data.ranking_length
    if "topk" in estimators:
        if k is None:
            k = getattr(getattr(policy, "first_stage", None), "n_slots", None)
        if not isinstance(k, int) or not 0 <= k <= n_slots:
            raise ValueError(f"topk needs k, an int in [0, L={n_slots}], got {k!r}")
    k_prop, k_model, k_boot = jax.random.split(key, 3)
    tp = target_propensities(policy, data, k_prop, n_samples=n_samples, slot_marginals="iips" in estimators)
    f_logged = f_policy = None
    if reward_model is not None:
        f_logged = reward_model.predict(data.context, data.ranking)
        f_policy = model_values(policy, reward_model, data.context, k_model, n_samples=n_samples)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    results = {}
    for i, name in enumerate(estimators):
        num, den, w = _round_terms(name, data, tp, f_logged, f_policy, k, max_log_weight)
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
        ess = float(n) if name == "dm" else min(_ess(col) for col in (w.T if w.ndim == 2 else w[None]))
        results[name] = OPEResult(name, value, stderr, low, high, ci, n, ess, float(jnp.max(w)))
    return results

