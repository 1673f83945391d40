"""Off-policy estimators for rankings, and the one registry that OPE and the learners read.

Every estimator is a per-round ``terms`` function shaped like a rax loss::

    terms(target, batch, *, model=None, k=None, max_log_weight=inf) -> Terms

``target`` ([`Propensities`][Propensities]) holds the target policy's log-propensities of the
logged rankings -- the policy computes them ([`opl_rank.opl.policies`][opl_rank.opl.policies]); ``batch`` is a
[`LoggedData`][opl_rank.data.LoggedData]; ``model`` ([`ModelTerms`][ModelTerms]) holds f_hat at the
logged rankings and ``E_{a ~ pi}[f_hat(x, a)]`` for estimators that need a reward model.
The returned [`Terms.value`][Terms.value] ``[n]`` are in "magic box" form: their values are the
per-round estimates (the estimate is their mean, or ``sum(value) / sum(normalizer)`` for a
self-normalised estimator) and, when ``target`` depends on a policy's parameters, the
gradient of that estimate is the estimator's policy gradient (docs/maths.md §2.2; the estimators: §1.10-1.19).

Registered estimators (``R = sum_l alpha_l r_l``, ``w = pi(a | x) / pi_0(a | x)``):

  dm      E_{a ~ pi}[f_hat(x, a)]                           (reward model)
  ips     w R
  snips   w R / mean(w)                                     (self-normalised)
  dr      w (R - f_hat(x, a)) + E_{a ~ pi}[f_hat(x, a)]     (reward model)
  iips    sum_l alpha_l r_l P_pi(a_l at l) / P_0(a_l at l)  (position marginals)
  rips    sum_l alpha_l r_l pi(a_{1:l}) / pi_0(a_{1:l})
  topk    w_k (R - f_hat(x, a)) + E_{a ~ pi}[f_hat(x, a)],  w_k = pi(a_{1:k}) / pi_0(a_{1:k})
          -- R-POD's decomposition (Eq. 9): k = L is dr, k = 0 is dm plus the logged residual.

Add one with [`register`][register] (an estimator that reads more than the propensities and
f_hat builds its own inputs: ``Estimator(inputs=...)``, [`opl_rank.opl.estimator_inputs`][opl_rank.opl.estimator_inputs]); the learners ([`opl_rank.opl.learners.fit`][opl_rank.opl.learners.fit]), OPE
([`opl_rank.opl.ope.evaluate`][opl_rank.opl.ope.evaluate]), ``select_k`` and the sweep all find it by name.

Importance weights are formed in log space and clipped at ``max_log_weight`` before the
exponential; clipped weights still multiply the score function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from opl_rank.data import LoggedData
from opl_rank.pl import gradients
from opl_rank.pl.gradients import magic_box

__all__ = [
    "Propensities",
    "ModelTerms",
    "Terms",
    "Estimator",
    "OPL_ESTIMATORS",
    "ESTIMATORS",
    "register",
    "get",
    "estimate",
    "importance_weight",
    "weighted_reward",
    "boxed",
    "dm_terms",
    "ips_terms",
    "snips_terms",
    "dr_terms",
    "iips_terms",
    "rips_terms",
    "topk_terms",
    "additive_model_value",
    "ranking_model_value",
]

sg = jax.lax.stop_gradient


class Propensities(NamedTuple):
    """A target policy's log-propensities of the logged rankings.

    Attributes:
      log_prefix: ``[n, K]`` ``log pi(a_{1:l} | x)`` for ``l = 1..K`` (``K = L`` for a full
        policy, ``k`` for an R-POD first stage; ``-inf`` off a deterministic support).
      log_slot: optional ``[n, L]`` ``log P_pi(a_l at slot l | x)`` (IIPS).
    """

    log_prefix: jax.Array
    log_slot: jax.Array | None = None


class ModelTerms(NamedTuple):
    """A reward model's values for the estimators that need one.

    Attributes:
      logged: ``[n]`` ``f_hat(x_i, a_i)`` at the logged rankings.
      policy: ``[n]`` ``E_{a ~ pi}[f_hat(x_i, a)]`` (a magic box whose gradient is the model
        part of the policy gradient when learning; a plain mean in OPE).
    """

    logged: jax.Array
    policy: jax.Array


class Terms(NamedTuple):
    """Per-round terms of one estimator.

    Attributes:
      value: ``[n]`` per-round values (magic box).
      weight: ``[n]`` or ``[n, L]`` importance weights, for diagnostics (ESS, largest weight).
      normalizer: optional ``[n]``: the estimate is ``sum(value) / sum(normalizer)``.
    """

    value: jax.Array
    weight: jax.Array
    normalizer: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Estimator:
    """A registry entry.

    Attributes:
      terms: ``(target, batch, *, model, k, max_log_weight) -> Terms``.
      needs_reward_model: reads ``model`` (dm, dr, topk).
      needs_position_marginals: reads ``target.log_slot`` and the logged
        ``log_pi0_position_marginal`` (iips).
      uses_k: reads R-POD's ``k`` (topk).
      inputs: optional ``(request) -> pytree``: builds what ``terms`` reads beyond the
        propensities and the f_hat terms, from an
        [`InputRequest`][opl_rank.opl.estimator_inputs.InputRequest] (the policy, the batch, a
        key, the reward model, k, learning or evaluation, what the caller gave); ``terms``
        then gets it as ``inputs=`` ([`opl_rank.opl.estimator_inputs`][opl_rank.opl.estimator_inputs]).
      model_based: where its weights have no usable mass its estimate rests on a model
        (OPE then reports it as ``model_only`` instead of not estimable); true for every
        entry with ``needs_reward_model``.
    """

    terms: Callable[..., Terms]
    needs_reward_model: bool = False
    needs_position_marginals: bool = False
    uses_k: bool = False
    inputs: Callable[..., Any] | None = None
    model_based: bool = False

    def __post_init__(self) -> None:
        if self.needs_reward_model:
            object.__setattr__(self, "model_based", True)


OPL_ESTIMATORS: dict[str, Estimator] = {}
"""The off-policy estimators by name ([`register`][register] adds one)."""
ESTIMATORS = OPL_ESTIMATORS  # the name before 0.2.0 (one release; the same dict)


def register(name: str, estimator: Estimator, *, replace: bool = False) -> Estimator:
    """Add ``estimator`` under ``name`` (an error if taken, unless ``replace``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"estimator name must be a non-empty string, got {name!r}")
    if not isinstance(estimator, Estimator):
        raise TypeError(f"estimator must be an opl_rank.opl.estimators.Estimator, got {type(estimator).__name__}")
    if name in OPL_ESTIMATORS and not replace and OPL_ESTIMATORS[name] != estimator:
        raise ValueError(f"estimator {name!r} is already registered")
    OPL_ESTIMATORS[name] = estimator
    return estimator


def get(name: str) -> Estimator:
    """The registered estimator ``name`` (a ValueError lists the known names)."""
    try:
        return OPL_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; registered: {sorted(OPL_ESTIMATORS)}") from None


def estimate(terms: Terms) -> jax.Array:
    """The estimate from per-round terms: their mean, or the self-normalised ratio."""
    if terms.normalizer is None:
        return jnp.mean(terms.value)
    return jnp.sum(terms.value) / jnp.sum(sg(terms.normalizer))


# ---------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------
def weighted_reward(reward: jax.Array, position_weight: jax.Array) -> jax.Array:
    """``R = sum_l alpha_l r_l``: ``[n, L], [L] -> [n]``."""
    return reward @ position_weight


def importance_weight(log_pi: jax.Array, log_pi0: jax.Array, max_log_weight: float = jnp.inf) -> jax.Array:
    """``exp(min(log pi - log pi_0, max_log_weight))`` without gradient: any shape."""
    return sg(jnp.exp(jnp.minimum(log_pi - log_pi0, max_log_weight)))


def boxed(weight: jax.Array, value: jax.Array, log_pi: jax.Array) -> jax.Array:
    """``weight * value`` with gradient ``weight * value * grad log_pi``.

    Where the weight is 0 (a deterministic target off its support, ``log_pi = -inf``) the
    score term is dropped instead of forming ``0 * -inf``.
    """
    safe_log_pi = jnp.where(weight > 0, log_pi, 0.0)
    return magic_box(weight * value, weight * value * safe_log_pi)


def _check_prefix(target: Propensities, batch: LoggedData, name: str) -> None:
    if target.log_prefix.shape[-1] != batch.ranking.shape[-1]:
        raise ValueError(
            f"{name} needs the target's propensities of all L={batch.ranking.shape[-1]} slots, "
            f"got log_prefix with {target.log_prefix.shape[-1]}"
        )


def _needs_model(model: ModelTerms | None, name: str) -> ModelTerms:
    if model is None:
        raise ValueError(f"{name} needs a reward model's values (model=ModelTerms(logged, policy))")
    return model


# ---------------------------------------------------------------------------------------
# The estimators
# ---------------------------------------------------------------------------------------
def dm_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
) -> Terms:
    """Direct method: ``E_{a ~ pi}[f_hat(x, a)]`` per round (no importance weights)."""
    model = _needs_model(model, "dm")
    return Terms(model.policy, jnp.ones_like(model.policy))


def ips_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
) -> Terms:
    """IPS: ``w R`` with ranking-level ``w``; gradient ``w R grad log pi(a | x)``.

    Args:
      target: [`Propensities`][Propensities] (``log_prefix [n, L]``).
      batch: [`LoggedData`][opl_rank.data.LoggedData].
      model: unused.
      k: unused.
      max_log_weight: clip on ``log w``.

    Returns:
      [`Terms`][Terms] with ``value [n]`` and ``weight [n]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from opl_rank.data import LoggedData
      >>> batch = LoggedData(context=jnp.zeros((2, 1)), ranking=jnp.array([[0, 1], [1, 0]]),
      ...                    reward=jnp.array([[1.0, 0.0], [0.0, 1.0]]),
      ...                    log_pi0_prefix=jnp.log(jnp.array([[0.5, 0.25], [0.5, 0.25]])),
      ...                    position_weight=jnp.array([1.0, 0.5]), n_items=2)
      >>> target = Propensities(jnp.log(jnp.array([[1.0, 1.0], [0.01, 0.01]])))
      >>> [round(float(v), 3) for v in ips_terms(target, batch).value]  # w = 4, 0.04
      [4.0, 0.02]
    """
    _check_prefix(target, batch, "ips")
    log_pi = target.log_prefix[..., -1]
    w = importance_weight(log_pi, batch.log_pi0_prefix[..., -1], max_log_weight)
    return Terms(boxed(w, weighted_reward(batch.reward, batch.position_weight), log_pi), w)


def snips_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
) -> Terms:
    """Self-normalised IPS: ``sum_i w_i R_i / sum_i w_i`` (``normalizer = w``)."""
    terms = ips_terms(target, batch, max_log_weight=max_log_weight)
    return terms._replace(normalizer=terms.weight)


def rips_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
) -> Terms:
    """RIPS (cascade): ``sum_l alpha_l w_{1:l} r_l``, gradient with ``grad log pi(a_{1:l})``."""
    _check_prefix(target, batch, "rips")
    w = importance_weight(target.log_prefix, batch.log_pi0_prefix, max_log_weight)  # [n, L]
    slot = boxed(w, batch.reward * batch.position_weight[None, :], target.log_prefix)
    return Terms(jnp.sum(slot, axis=-1), w)


def iips_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
) -> Terms:
    """IIPS (independence): ``sum_l alpha_l r_l P_pi(a_l at l) / P_0(a_l at l)``.

    With a PL target the position marginals are exact and differentiable
    ([`opl_rank.pl.marginals.exact_slot_marginals`][opl_rank.pl.marginals.exact_slot_marginals]), so the gradient
    ``sum_l alpha_l w_l r_l grad log P_pi(a_l at l)`` has no sampling noise.
    """
    if target.log_slot is None:
        raise ValueError("iips needs the target's slot marginals (Propensities.log_slot)")
    if batch.log_pi0_position_marginal is None:
        raise ValueError("iips needs LoggedData.log_pi0_position_marginal (simulate with position_marginals='exact')")
    w = importance_weight(target.log_slot, batch.log_pi0_position_marginal, max_log_weight)  # [n, L]
    slot = boxed(w, batch.reward * batch.position_weight[None, :], target.log_slot)
    return Terms(jnp.sum(slot, axis=-1), w)


def topk_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
) -> Terms:
    """R-POD(k) (Eq. 9): ``w(x, a_{1:k}) (R - f_hat(x, a)) + E_{a ~ pi}[f_hat(x, a)]``.

    ``w(x, a_{1:k}) = pi(a_{1:k} | x) / pi_0(a_{1:k} | x)`` (1 at ``k = 0``, where the first
    term has no gradient and R-POD reduces to regression). At ``k = L`` this is DR.

    Args:
      target: [`Propensities`][Propensities] with at least ``k`` prefix columns.
      batch: [`LoggedData`][opl_rank.data.LoggedData].
      model: [`ModelTerms`][ModelTerms] (``policy`` is the second stage's value when learning).
      k: Python int in ``[0, L]``.
      max_log_weight: clip on ``log w``.
    """
    n_slots = batch.ranking.shape[-1]
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n_slots:
        raise ValueError(f"k must be an int in [0, L={n_slots}], got {k!r}")
    model = _needs_model(model, "topk")
    residual = weighted_reward(batch.reward, batch.position_weight) - sg(model.logged)
    if k == 0:
        return Terms(sg(residual) + model.policy, jnp.ones_like(residual))
    if target.log_prefix.shape[-1] < k:
        raise ValueError(f"topk with k={k} needs {k} prefix propensities, got {target.log_prefix.shape[-1]}")
    log_pi = target.log_prefix[..., k - 1]
    w = importance_weight(log_pi, batch.log_pi0_prefix[..., k - 1], max_log_weight)
    return Terms(boxed(w, residual, log_pi) + model.policy, w)


def dr_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
) -> Terms:
    """DR: ``w (R - f_hat(x, a)) + E_{a ~ pi}[f_hat(x, a)]`` (``topk`` at ``k = L``)."""
    _check_prefix(target, batch, "dr")
    return topk_terms(target, batch, model=model, k=batch.ranking.shape[-1], max_log_weight=max_log_weight)


for _name, _entry in {
    "dm": Estimator(dm_terms, needs_reward_model=True),
    "ips": Estimator(ips_terms),
    "snips": Estimator(snips_terms),
    "dr": Estimator(dr_terms, needs_reward_model=True),
    "iips": Estimator(iips_terms, needs_position_marginals=True),
    "rips": Estimator(rips_terms),
    "topk": Estimator(topk_terms, needs_reward_model=True, uses_k=True),
}.items():
    register(_name, _entry)


# ---------------------------------------------------------------------------------------
# Model terms E_{a ~ pi}[f_hat] with low-variance gradients (exposure paper)
# ---------------------------------------------------------------------------------------
def additive_model_value(
    logits: jax.Array,
    item_value: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """``E_{a ~ pi}[sum_l alpha_l g(x, a_l)]`` by marginalize-all (exposure paper Eq. 30).

    Args:
      logits: ``[n, D]``.
      item_value: ``[n, D]`` g(x, d).
      position_weight: ``[L]`` alpha.
      key: PRNG key.
      n_samples: sampled prefixes per round.
      where: optional mask.
      baseline: leave-one-out baselines.

    Returns:
      ``[n]``: value = the estimate, gradient = the marginalize-all policy gradient.
    """
    return gradients.marginalize_all_utility(
        logits, item_value, position_weight, key, n_samples, where=where, baseline=baseline
    )


def ranking_model_value(
    logits: jax.Array,
    value_fn: Callable[[jax.Array], jax.Array],
    n_slots: int,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """``E_{a_{1:K} ~ pi}[f(a_{1:K})]`` for any ``value_fn(rankings [N, n, K]) -> [N, n]``.

    Score-function gradient with leave-one-out baselines over the ``N`` samples.

    Returns:
      ``[n]``.
    """
    return gradients.sampled_policy_gradient(logits, value_fn, n_slots, key, n_samples, where=where, baseline=baseline)
