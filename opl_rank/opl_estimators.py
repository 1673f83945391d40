"""Off-policy policy-gradient estimators for ranking (R-POD paper, NOTES section 1).

Each ``*_terms`` function returns per-round terms ``[n]`` in "magic box" form: their values
are the per-round off-policy value estimates (their mean is the OPE estimate) and the
gradient of their mean with respect to ``logits`` is the estimator's policy gradient.
Logged inputs come from :class:`opl_rank.data.LoggedData`; ``logits [n, D]`` are the target
(or R-POD first-stage) PL policy's logits at the logged contexts.

  ips_terms    ranking-level weights w = pi(a|x)/pi_0(a|x)
  dr_terms     IPS on R - f_hat(x, a) plus the model term E_{a ~ pi}[f_hat(x, a)]
  iips_terms   position-marginal weights P_pi(a_l at l)/P_0(a_l at l) (independence)
  rips_terms   prefix weights pi(a_{1:l})/pi_0(a_{1:l}) (cascade)
  rpod_terms   R-POD(k), Eq. 9: top-k weights on R - f_hat, plus the second-stage model term

Model terms ("E_{a ~ pi}[f_hat]" whose gradient is the model-based part) are built with the
exposure paper's estimators: :func:`additive_model_value` (marginalize-all, for
f_hat = sum_l alpha_l g(x, a_l)) or :func:`ranking_model_value` (sampled rankings with
leave-one-out baselines, for any f_hat). Importance weights can be clipped at
``max_log_weight`` in log space; clipped weights still multiply the score function.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from opl_rank import ltr_estimators
from opl_rank.ltr_estimators import magic_box
from opl_rank import plackett_luce as pl

__all__ = [
    "ips_terms",
    "dr_terms",
    "iips_terms",
    "rips_terms",
    "rpod_terms",
    "additive_model_value",
    "ranking_model_value",
    "weighted_reward",
]

sg = jax.lax.stop_gradient


def weighted_reward(reward: jax.Array, position_weight: jax.Array) -> jax.Array:
    """``R = sum_l alpha_l r_l``: ``[n, L], [L] -> [n]``."""
    return reward @ position_weight


def _weight(log_pi: jax.Array, log_pi0: jax.Array, max_log_weight: float) -> jax.Array:
    """``exp(min(log pi - log pi_0, max_log_weight))`` without gradient."""
    return sg(jnp.exp(jnp.minimum(log_pi - log_pi0, max_log_weight)))


def ips_terms(logits, ranking, reward, log_pi0_prefix, position_weight, *, where=None, max_log_weight=jnp.inf):
    """Per-round IPS: ``w(x, a) R``, gradient ``w R grad log pi(a | x)``.

    Args:
      logits: ``[n, D]`` target policy logits.
      ranking: int ``[n, L]`` logged rankings.
      reward: ``[n, L]`` slot rewards.
      log_pi0_prefix: ``[n, L]`` logging prefix log-propensities (the last is the ranking's).
      position_weight: ``[L]`` alpha.
      where: optional bool ``[n, D]`` mask.
      max_log_weight: clip on ``log w``.

    Returns:
      ``[n]`` float32.
    """
    log_pi = pl.prefix_log_probs(logits, ranking, where=where)[..., -1]
    w = _weight(log_pi, log_pi0_prefix[..., -1], max_log_weight)
    r = weighted_reward(reward, position_weight)
    return magic_box(w * r, w * r * log_pi)


def rips_terms(logits, ranking, reward, log_pi0_prefix, position_weight, *, where=None, max_log_weight=jnp.inf):
    """Per-round RIPS: ``sum_l alpha_l w_{1:l} r_l``, gradient with ``grad log pi(a_{1:l})``.

    Args and Returns as :func:`ips_terms`.
    """
    log_pi = pl.prefix_log_probs(logits, ranking, where=where)  # [n, L]
    w = _weight(log_pi, log_pi0_prefix, max_log_weight)
    terms = w * reward * position_weight[None, :]
    return magic_box(jnp.sum(terms, axis=-1), jnp.sum(terms * log_pi, axis=-1))


def iips_terms(logits, ranking, reward, log_pi0_position_marginal, position_weight, *, where=None, max_log_weight=jnp.inf):
    """Per-round IIPS: ``sum_l alpha_l r_l P_pi(a_l at l) / P_0(a_l at l)``.

    The target policy's position marginals of the logged items are exact
    (:func:`plackett_luce.exact_slot_marginals`, differentiable), so the gradient
    ``sum_l alpha_l w_l r_l grad log P_pi(a_l at l)`` has no sampling noise.

    Args:
      logits: ``[n, D]``.
      ranking: int ``[n, L]``.
      reward: ``[n, L]``.
      log_pi0_position_marginal: ``[n, L]`` ``log P_0(a_l = a_il | x)``.
      position_weight: ``[L]``.
      where: optional bool ``[n, D]`` mask.
      max_log_weight: clip on ``log w_l``.

    Returns:
      ``[n]`` float32.
    """
    marginal = pl.exact_slot_marginals(logits, ranking, where=where)  # P_pi(rank(a_l) = l)
    log_marginal = jnp.log(jnp.maximum(marginal, 1e-30))
    w = _weight(log_marginal, log_pi0_position_marginal, max_log_weight)
    terms = w * reward * position_weight[None, :]
    return magic_box(jnp.sum(terms, axis=-1), jnp.sum(terms * log_marginal, axis=-1))


def additive_model_value(logits, item_value, position_weight, key, n_samples, *, where=None, baseline=True):
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
    return ltr_estimators.marginalize_all_utility(
        logits, item_value, position_weight, key, n_samples, where=where, baseline=baseline
    )


def ranking_model_value(logits, value_fn, n_slots, key, n_samples, *, where=None, baseline=True):
    """``E_{a_{1:K} ~ pi}[f(a_{1:K})]`` for any ``value_fn(rankings [N, n, K]) -> [N, n]``.

    Score-function gradient with leave-one-out baselines over the ``N`` samples.

    Returns:
      ``[n]``.
    """
    return ltr_estimators.sampled_policy_gradient(
        logits, value_fn, n_slots, key, n_samples, where=where, baseline=baseline
    )


def dr_terms(logits, ranking, reward, log_pi0_prefix, position_weight, f_hat_logged, model_value, *, where=None, max_log_weight=jnp.inf):
    """Per-round DR: ``w (R - f_hat(x, a)) + E_{a ~ pi}[f_hat(x, a)]``.

    Args:
      logits, ranking, reward, log_pi0_prefix, position_weight, where, max_log_weight: as
        :func:`ips_terms`.
      f_hat_logged: ``[n]`` f_hat(x_i, a_i) at the logged rankings.
      model_value: ``[n]`` magic-box ``E_{a ~ pi}[f_hat]`` from :func:`additive_model_value`
        or :func:`ranking_model_value` (its gradient is the model part of DR).

    Returns:
      ``[n]``.
    """
    log_pi = pl.prefix_log_probs(logits, ranking, where=where)[..., -1]
    w = _weight(log_pi, log_pi0_prefix[..., -1], max_log_weight)
    residual = weighted_reward(reward, position_weight) - sg(f_hat_logged)
    return magic_box(w * residual, w * residual * log_pi) + model_value


def rpod_terms(logits, ranking, reward, log_pi0_prefix, position_weight, k, f_hat_logged, second_stage_value, *, where=None, max_log_weight=jnp.inf):
    """Per-round R-POD(k) (Eq. 9): ``w(x, a_{1:k}) (R - f_hat(x, a)) + E_{a_{1:k} ~ pi1st}[f_hat2nd]``.

    ``w(x, a_{1:k}) = pi1st(a_{1:k}|x) / pi_0(a_{1:k}|x)`` (1 at ``k = 0``). At ``k = L`` this
    is DR; at ``k = 0`` the first term has no gradient and R-POD reduces to regression.

    Args:
      logits: ``[n, D]`` first-stage PL logits.
      ranking, reward, log_pi0_prefix, position_weight, where, max_log_weight: as
        :func:`ips_terms`.
      k: Python int in ``[0, L]``.
      f_hat_logged: ``[n]`` f_hat(x_i, a_i).
      second_stage_value: ``[n]`` magic-box ``E_{a_{1:k} ~ pi1st}[f_hat(x, a_{1:k} completed by
        the second stage)]`` (e.g. :func:`ranking_model_value`).

    Returns:
      ``[n]``.
    """
    n_slots = ranking.shape[-1]
    if not isinstance(k, int) or not 0 <= k <= n_slots:
        raise ValueError(f"k must be an int in [0, L={n_slots}], got {k!r}")
    residual = weighted_reward(reward, position_weight) - sg(f_hat_logged)
    if k == 0:
        return sg(residual) + second_stage_value  # w = 1 and no first-stage score function
    log_pi = pl.prefix_log_probs(logits, ranking[..., :k], where=where)[..., -1]
    w = _weight(log_pi, log_pi0_prefix[..., k - 1], max_log_weight)
    return magic_box(w * residual, w * residual * log_pi) + second_stage_value
