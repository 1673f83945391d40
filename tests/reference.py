"""Slow, obviously correct NumPy/Python oracles (float64 loops over rankings and slots)."""

from __future__ import annotations

import itertools
import math

import numpy as np


def pl_prefix_probs(logits, ranking, mask=None) -> np.ndarray:
    """pi(a_{1:l}) for l = 1..L by the product formula, one ranking, float64."""
    logits = np.asarray(logits, np.float64)
    valid = np.isfinite(logits) if mask is None else (np.asarray(mask) & np.isfinite(logits))
    remaining = set(np.flatnonzero(valid).tolist())
    out, prob = [], 1.0
    for item in ranking:
        item = int(item)
        if item in remaining:
            top = max(logits[d] for d in remaining)
            z = sum(math.exp(logits[d] - top) for d in remaining)
            prob *= math.exp(logits[item] - top) / z
            remaining.remove(item)
        out.append(prob)
    return np.array(out)


def all_permutations(n_items: int, n_slots: int) -> list[tuple[int, ...]]:
    return list(itertools.permutations(range(n_items), n_slots))


def pl_position_marginals(logits, n_slots: int, mask=None) -> np.ndarray:
    """P(a_l = d) [L, D] by summing PL probabilities over every permutation of valid items."""
    logits = np.asarray(logits, np.float64)
    out = np.zeros((n_slots, logits.shape[-1]))
    valid = np.isfinite(logits) if mask is None else (np.asarray(mask) & np.isfinite(logits))
    for perm in itertools.permutations(np.flatnonzero(valid).tolist(), n_slots):
        p = pl_prefix_probs(logits, perm, mask)[-1]
        for l, d in enumerate(perm):
            out[l, d] += p
    return out


def synthetic_expected_reward(theta, bias, interaction, lam, x, ranking) -> np.ndarray:
    """q_l = theta_{a_l}.x + b_{a_l} + lam * sum_{m != l} W[a_m, a_l], one row."""
    out = []
    for l, a_l in enumerate(ranking):
        base = float(np.dot(theta[a_l], x) + bias[a_l])
        inter = sum(float(interaction[a_m, a_l]) for m, a_m in enumerate(ranking) if m != l)
        out.append(base + lam * inter)
    return np.array(out)


class ConstantLogits:
    """A scorer whose parameters are one logit vector shared by every context (PLPolicy's
    ``module`` for enumerated tiny problems)."""

    def apply(self, params, context):
        import jax.numpy as jnp

        return jnp.broadcast_to(params, (context.shape[0], params.shape[-1]))


def enumerated_logs(rankings, reward_fn, theta0, position_weight, **fields):
    """Every ranking once as a logged row (one shared context), its expected rewards as the
    rewards and the PL(theta0) prefix propensities: estimators linear in the rewards then have
    exact expectations as ``sum_a pi_0(a) value(a)``. ``fields`` adds LoggedData fields."""
    import jax.numpy as jnp

    from opl_rank import LoggedData
    from opl_rank.pl import plackett_luce as pl

    n_rows, n_items = rankings.shape[0], theta0.shape[-1]
    logits0 = jnp.broadcast_to(theta0, (n_rows, n_items))
    return LoggedData(
        context=jnp.zeros((n_rows, 1)),
        ranking=rankings,
        reward=reward_fn(rankings),
        log_pi0_prefix=pl.prefix_log_probs(logits0, rankings),
        position_weight=position_weight,
        n_items=n_items,
        **fields,
    )
