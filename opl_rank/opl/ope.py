"""Off-policy evaluation of ranking policies from logged data.

Any estimator of the registry [`opl_rank.opl.estimators.OPL_ESTIMATORS`][opl_rank.opl.estimators.OPL_ESTIMATORS] (dm, ips, snips,
dr, iips, rips, topk, and any a user registers) estimates ``V(pi)`` as the mean of its
per-round terms (or their self-normalised ratio). The policy supplies its own
propensities ([`opl_rank.opl.policies`][opl_rank.opl.policies]); estimators that need a reward model get
``f_hat`` at the logged rankings and ``E_{a ~ pi}[f_hat(x, a)]`` ([`model_values`][model_values]).
Confidence intervals: normal approximation (delta method for ratios) or a percentile
bootstrap vmapped over resampling keys. Diagnostics: effective sample size
``(sum w)^2 / sum w^2`` of the estimator's weights (the smallest over slots for per-slot
weights) and the largest weight; a [`DegenerateWeightsWarning`][DegenerateWeightsWarning] when the ESS is
below 1% of n or the weights are not finite.

When a result can be trusted ([`OPEResult`][OPEResult]'s ``estimable``, ``reason``, ``model_only``,
``caveat``):

* **Not estimable** -- an importance-weighted estimator (ips, snips, rips, iips, ...) whose
  weights have no usable mass: all 0 (at some slot, for per-slot weights: a deterministic
  target off the logged rankings), an ESS below [`MIN_ESS`][MIN_ESS] (= 1.5: one round
  carries nearly all the weight; of two rounds, one has over 3.7 times the other's weight),
  or weights that are not finite. Its ``value``, ``stderr``, ``ci_low`` and ``ci_high`` are
  NaN (never a 0 that arithmetic would carry on with) and ``reason`` says why.
* **Model only** -- an estimate that rests on the reward model alone: dm always, topk at
  ``k = 0`` (no importance weights; the logged residual corrects the model's mean error on
  the logged rankings only), and dr / topk whose weighted correction has no usable mass (the
  same rule as above). Its interval is the reward model's own sampling interval: it excludes
  the model's bias. ``model_only`` is true and ``caveat`` says why.
* **Unreliable** -- estimable, but the ESS is below 1% of n
  (``DEGENERATE_ESS_FRACTION``): ``caveat`` says so (and the warning is emitted).
* A bootstrap that cannot form an interval (resamples with no weight mass give ``0 / 0``)
  is replaced by the normal (delta-method) interval: ``ci_method`` is then ``"normal"`` and
  ``caveat`` says why.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank.data import LoggedData
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.estimator_inputs import InputRequest, build, call_terms, model_terms, model_values
from opl_rank.opl.policies import RankingPolicy, compiled_propensities
from opl_rank.program_cache import cached_jit

__all__ = [
    "OPEResult",
    "DegenerateWeightsWarning",
    "degenerate",
    "model_values",
    "evaluate",
    "MIN_ESS",
    "DEGENERATE_ESS_FRACTION",
]

DEGENERATE_ESS_FRACTION = 0.01  # warn (and add a caveat) when ESS < 1% of n
MIN_ESS = 1.5
"""Below this effective sample size an importance-weighted estimate is not estimable (one
round carries nearly all the weight: its standard error and interval mean nothing), and a
dr / topk correction is no correction (the estimate is the reward model's alone)."""


class DegenerateWeightsWarning(RuntimeWarning):
    """[`evaluate`][evaluate]: an estimator's importance weights are degenerate -- their
    effective sample size is below 1% of n (e.g. all weights 0, or one weight dominating)
    or not finite -- so its estimate (and interval) should not be trusted."""


def degenerate(result: OPEResult) -> bool:
    """Whether a result's importance weights are degenerate: ESS not finite or below
    ``DEGENERATE_ESS_FRACTION`` of its rounds, or the estimate not estimable."""
    return not math.isfinite(result.ess) or result.ess < DEGENERATE_ESS_FRACTION * result.n or not result.estimable


@dataclasses.dataclass(frozen=True)
class OPEResult:
    """One estimate with its uncertainty, weight diagnostics and whether to trust it.

    Attributes:
      estimator: the estimator's name.
      value: the estimate; NaN when not ``estimable``.
      stderr: its standard error (normal approximation; delta method for ratios); NaN when
        not ``estimable``.
      ci_low: the interval's lower end; NaN when not ``estimable``.
      ci_high: the interval's upper end; NaN when not ``estimable``.
      ci_method: ``"bootstrap"`` or ``"normal"`` (the method actually used: ``"normal"``
        when a bootstrap could not form an interval, see ``caveat``).
      n: rounds.
      ess: effective sample size ``(sum w)^2 / sum w^2`` of the estimator's importance
        weights (the smallest over slots for per-slot weights; n for dm).
      max_weight: the largest importance weight.
      estimable: false when the weights have no usable mass (all 0, ESS below
        [`MIN_ESS`][MIN_ESS], or not finite): the numbers above are then NaN.
      reason: why not ``estimable`` (None when estimable).
      model_only: the estimate rests on the reward model alone (dm; topk at k = 0; dr /
        topk whose weighted correction has no usable mass): its interval is the model's
        sampling interval and excludes the model's bias.
      caveat: what to know about an estimable result (model only, an ESS below 1% of n,
        a bootstrap replaced by the normal interval), or None.
    """

    estimator: str
    value: float
    stderr: float
    ci_low: float
    ci_high: float
    ci_method: str
    n: int
    ess: float
    max_weight: float
    estimable: bool = True
    reason: str | None = None
    model_only: bool = False
    caveat: str | None = None

    def summary(self, digits: int = 3) -> str:
        """``"5.551 [5.052, 5.909]"`` (plus ``"; caveat"``), or ``"not estimable: reason"``."""
        if not self.estimable:
            return f"not estimable: {self.reason}"
        text = f"{self.value:.{digits}f} [{self.ci_low:.{digits}f}, {self.ci_high:.{digits}f}]"
        return f"{text}; {self.caveat}" if self.caveat else text

    def __str__(self) -> str:
        return f"{self.estimator} {self.summary()}"


@cached_jit(static_argnames=("entry", "k", "max_log_weight"), xla_defaults=True)
def _terms(entry: opl_estimators.Estimator, target, data, model, k, max_log_weight, inputs) -> opl_estimators.Terms:
    """An estimator's per-round terms as one compiled program (registry entries are jit-able:
    the learners train through them; the entry itself is the cache key)."""
    return call_terms(entry, target, data, model=model, k=k, max_log_weight=max_log_weight, inputs=inputs)


def _column_ess(w: np.ndarray) -> np.ndarray:
    """ESS ``(sum w)^2 / sum w^2`` of each column of ``[n, C]`` (float64: no overflow of
    ``w^2`` at large weights; 0 for a column of zeros)."""
    total = np.sum(w * w, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, np.sum(w, axis=0) ** 2 / np.where(total > 0, total, 1.0), 0.0)


def _slots(columns: np.ndarray) -> str:
    """``"slot 3"``, ``"slots 3-5"``, ``"slots 1, 3"`` (1-based)."""
    idx = [int(c) + 1 for c in columns]
    if len(idx) == 1:
        return f"slot {idx[0]}"
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"slots {idx[0]}-{idx[-1]}"
    return "slots " + ", ".join(str(i) for i in idx)


class _Trust(NamedTuple):
    ess: float
    estimable: bool = True
    reason: str | None = None
    model_only: bool = False
    caveat: str | None = None


def _trust(entry: opl_estimators.Estimator, w: jax.Array, n: int, k: int | None) -> _Trust:
    """Whether an estimator's result can be trusted, from its weights (the module doc's rules)."""
    cols = np.asarray(w, np.float64)
    cols = cols[:, None] if cols.ndim == 1 else cols
    per_slot = cols.shape[1] > 1
    ess_cols = _column_ess(np.where(np.isfinite(cols), cols, 0.0))
    worst = int(np.argmin(ess_cols))
    ess = float(ess_cols[worst])
    if not np.all(np.isfinite(cols)):
        return _Trust(ess, False, "importance weights are not finite (inf or NaN; clip them with max_log_weight)")
    if entry.terms is opl_estimators.dm_terms:
        return _Trust(ess, model_only=True, caveat="model only: the interval excludes the reward model's bias")
    if entry.terms is opl_estimators.topk_terms and k == 0:
        caveat = (
            "model only: k=0, no importance weights (the residual corrects the model on the logged rankings "
            "only); the interval excludes the reward model's bias at the target's rankings"
        )
        return _Trust(ess, model_only=True, caveat=caveat)
    no_mass = np.flatnonzero(~np.any(cols > 0, axis=0))
    if no_mass.size:
        at = f" at {_slots(no_mass)}" if 0 < no_mass.size < cols.shape[1] else ""
        problem = f"no weight mass{at}: all importance weights are 0 (a deterministic target off the logged rankings)"
    elif ess < MIN_ESS:
        at = f" at {_slots(np.array([worst]))}" if per_slot else ""
        problem = f"effective sample size {ess:.3f} of {n}{at} (< {MIN_ESS:g}): one round carries nearly all the weight"
    elif ess < DEGENERATE_ESS_FRACTION * n:
        at = f" at {_slots(np.array([worst]))}" if per_slot else ""
        return _Trust(
            ess, caveat=f"unreliable: effective sample size {ess:.4g} of {n}{at} (< {DEGENERATE_ESS_FRACTION:.0%} of n)"
        )
    else:
        return _Trust(ess)
    if entry.model_based:  # dr / topk / cascade_dr: the weights carry the correction of the model's bias
        caveat = f"model only: the correction has {problem}; the interval excludes the reward model's bias"
        return _Trust(ess, model_only=True, caveat=caveat)
    return _Trust(ess, False, problem)


@cached_jit(static_argnames=("n_bootstrap", "batch"), xla_defaults=True)  # compiled once per shape, not once per call
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
    inputs: Mapping[str, Any] | None = None,
    warn_degenerate: bool = True,
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
      inputs: per estimator, what to give its own inputs hook instead of letting it build
        them (``{"cascade_dr": {"q": array [n, L, D]}}``: a fitted Q;
        [`opl_rank.opl.estimator_inputs.InputRequest`][opl_rank.opl.estimator_inputs.InputRequest]'s ``given``).
      warn_degenerate: warn (a [`DegenerateWeightsWarning`][DegenerateWeightsWarning]) for each result
        with degenerate weights; a caller that reports them itself (``select_k``: one warning per
        selection) passes False. The results say the same either way.

    Returns:
      ``{name: OPEResult}``. A result that cannot be trusted says so (module doc): not
      ``estimable`` (NaN numbers and a ``reason``: no usable weight mass, ESS below
      [`MIN_ESS`][MIN_ESS]), ``model_only`` (the interval excludes the reward model's bias), or a
      ``caveat`` (ESS below 1% of n; a bootstrap replaced by the normal interval).
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
    inputs = dict(inputs or {})
    unknown = sorted(set(inputs) - set(entries))
    if unknown:
        raise ValueError(f"inputs names estimator(s) {unknown} that are not in estimators={list(entries)}")
    request = InputRequest(policy, data, k_model, reward_model, k, learning=False, n_samples=n_samples)
    model = model_terms(request) if reward_model is not None else None  # once, for every estimator
    built = {}
    for i, (name, entry) in enumerate(entries.items()):
        own = dataclasses.replace(request, key=jax.random.fold_in(k_model, i + 1), given=inputs.get(name))
        built[name] = build(entry, own, model=model)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    results = {}
    for i, (name, entry) in enumerate(entries.items()):
        entry_model, entry_inputs = built[name]
        terms = _terms(entry, target, data, entry_model, k if entry.uses_k else None, max_log_weight, entry_inputs)
        num, den, w = terms.value, terms.normalizer, terms.weight
        n = num.shape[0]
        max_weight = float(jnp.max(w))
        ess, estimable, reason, model_only, caveat = _trust(entry, w, n, k)
        method = ci
        if estimable and n < 2:
            estimable, reason, model_only, caveat = False, "one round gives no standard error", False, None
        if not estimable:
            value = stderr = low = high = math.nan
        else:
            if den is None:
                value = float(jnp.mean(num))
                stderr = float(jnp.std(num, ddof=1) / math.sqrt(n))
            else:  # ratio estimator: delta-method standard error
                ratio = jnp.sum(num) / jnp.sum(den)
                value = float(ratio)
                stderr = float(jnp.std(num - ratio * den, ddof=1) / (math.sqrt(n) * jnp.mean(den)))
            low, high = value - z * stderr, value + z * stderr
            if ci == "bootstrap":
                draws = _bootstrap(num, den, jax.random.fold_in(k_boot, i), n_bootstrap)
                bad = int(jnp.sum(~jnp.isfinite(draws)))
                if bad == 0:
                    low, high = (float(q) for q in jnp.quantile(draws, jnp.array([0.5 - level / 2, 0.5 + level / 2])))
                else:  # resamples without weight mass (0 / 0): no percentile interval
                    method = "normal"
                    note = (
                        f"bootstrap: {bad} of {n_bootstrap} resamples had no weight mass (0/0), "
                        "so the interval is the normal (delta-method) one"
                    )
                    caveat = f"{caveat}; {note}" if caveat else note
            if not all(math.isfinite(v) for v in (value, stderr, low, high)):
                reason = f"the estimate or its interval is not finite (value {value:.4g}, stderr {stderr:.4g})"
                estimable, model_only, caveat = False, False, None
                value = stderr = low = high = math.nan
        results[name] = OPEResult(
            name, value, stderr, low, high, method, n, ess, max_weight, estimable, reason, model_only, caveat
        )
        if warn_degenerate and degenerate(results[name]):
            if not estimable:
                verdict = f"it is reported as not estimable: {reason}"
            elif model_only:
                verdict = f"its estimate {value:.4g} rests on the reward model alone (model_only)"
            else:
                verdict = f"its estimate {value:.4g} is not reliable"
            warnings.warn(
                DegenerateWeightsWarning(
                    f"ope.evaluate: estimator {name!r} has degenerate importance weights: effective sample "
                    f"size {ess:.4g} of n={n} (below {DEGENERATE_ESS_FRACTION:.0%} of n, or not finite; "
                    f"largest weight {max_weight:.4g}); {verdict}"
                ),
                stacklevel=2,
            )
    return results
