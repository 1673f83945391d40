"""Plackett-Luce position marginals ``P(a_l = d | x)``: exact by exponential-race quadrature,
or estimated from sampled rankings.

The position marginal is the probability that item ``d`` lands in slot ``l`` of a PL
ranking; IIPS needs it for the logged items (docs/maths.md §1.13). It has no closed form,
and enumerating rankings costs ``D! / (D - L)!`` terms
([`opl_rank.pl.plackett_luce.enumerate_position_marginals`][opl_rank.pl.plackett_luce.enumerate_position_marginals], the tests' reference).

Exact (docs/maths.md §1.8): PL is an exponential race, so with ``r_j = exp(s_j - s_d)``

    P(rank(d) = k) = int_0^inf exp(-v) PB_{k-1}( {1 - exp(-r_j v)}_{j != d} ) dv,

``PB`` the Poisson-binomial pmf of the other items finishing first, truncated at ``L``
entries. The integral is a trapezoid rule in ``log v`` with ``QUADRATURE_NODES = 48`` nodes,
exact to about ``4e-7`` at logit scales 0.1 to ``1e4``; only logit differences appear. The
Poisson-binomial recursion has a hand-written reverse pass (a custom VJP): everything is
differentiable, without autodiff's unfused backward of the recursion (~25x the forward pass
on CPU).

Cost per row (``Q = 48``): ``O(Q D^2 L)`` for every item and slot
([`exact_position_marginals`][exact_position_marginals]), ``O(Q L^2 D)`` for the ``L`` logged items only
([`exact_ranked_item_marginals`][exact_ranked_item_marginals]; [`exact_slot_marginals`][exact_slot_marginals], each logged item's own
slot only, ~``(L + 1) / 2L`` of that, batched over rows with one reverse pass per slot: 8x / 2x
faster in value / gradient than the same rule vmapped row by row at D = 10, docs/performance.md §33). Above 32 items [`exact_slot_marginals`][exact_slot_marginals] puts the
logged items on one shared grid, ``O(Q' (K L + L^3) + D N)`` per row (docs/maths.md §1.8,
"logged items only"). Timings and the measured alternatives: docs/performance.md §4, §11.

Estimated (docs/maths.md §1.9): [`estimate_position_marginals`][estimate_position_marginals] averages the placement
probabilities of ``N`` sampled prefixes (Rao-Blackwellised, unbiased, exact at ``l = 1``),
``O(N L D)`` per row. [`position_marginals`][position_marginals] chooses the exact quadrature while it is
affordable and the estimate otherwise, and says which it used. For the logged items' own
slots, [`sampled_slot_marginals`][sampled_slot_marginals] is the same estimate with an unbiased gradient
(``O(N (D + L^2))`` per row); the learners choose between it and the exact quadrature by
cost ([`slot_marginal_method`][slot_marginal_method]).

Shapes and masks follow [`opl_rank.pl.plackett_luce`][opl_rank.pl.plackett_luce]: the last axis of ``logits`` is items
(``D``), ``where`` an optional bool ``[.., D]`` mask; results are float32 ``[.., L, D]``
(``[.., M, L]`` and ``[.., L]`` for the ranked-item and slot variants).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank import tuning
from opl_rank.pl import prefix_sampling
from opl_rank.pl.plackett_luce import (
    cumsum_slots,
    mean_samples,
    placement_log_probs,
    sample_rankings,
    slot_log_probs,
    slot_log_probs_and_rest,
    sum_samples,
    tile_samples,
    valid_items,
)

__all__ = [
    "PositionMarginals",
    "QUADRATURE_NODES",
    "estimate_position_marginals",
    "exact_position_marginals",
    "exact_ranked_item_marginals",
    "exact_slot_marginals",
    "insertion_slot_marginals",
    "position_marginals",
    "sampled_slot_marginals",
    "slot_marginal_cost",
    "slot_marginal_method",
]


class PositionMarginals(NamedTuple):
    """Position-marginal probabilities with the method that produced them."""

    probs: jax.Array  # [.., L, D] float32, P(a_l = d | x)
    method: str  # "exact-quadrature", "exact-enumeration" or "estimated-rao-blackwell"
    n_samples: int  # samples used (0 for exact methods)


@functools.partial(jax.jit, static_argnames=("n_slots", "n_samples"))
def estimate_position_marginals(
    key: jax.Array,
    logits: jax.Array,
    n_slots: int,
    n_samples: int,
    *,
    where: jax.Array | None = None,
) -> jax.Array:
    """Rao-Blackwellised estimate of ``P(a_l = d)`` from sampled prefixes.

    ``P_hat(a_l = d) = (1/N) sum_n pi(d | y^(n)_{1:l-1})`` (marginalization over sampled
    prefixes, exposure paper Sec. 4): unbiased, exact at ``l = 1``, and 5-500x lower MSE
    than counting placements. The dense form is used because the scatter-add rewrite
    cancels catastrophically in float32 at large logit gaps.

    Args:
      key: PRNG key.
      logits: ``[.., D]`` scores.
      n_slots: ``L``.
      n_samples: ``N`` sampled rankings per row.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., L, D]``.
    """
    samples = sample_rankings(key, logits, n_slots, where=where, n_samples=n_samples)
    log_place = placement_log_probs(
        tile_samples(logits, n_samples),
        samples,
        where=None if where is None else jnp.broadcast_to(where, (n_samples,) + where.shape),
    )
    return mean_samples(jnp.exp(log_place))


# Quadrature in log(v) for the exponential-race integral; the integrand
# e^{-v} v PB(v) is analytic in log v, so the trapezoid rule converges geometrically.
# Its strip of analyticity has half-width pi/2, so a step of 0.47 leaves an error near
# exp(-2 pi (pi/2) / 0.47) ~ 1e-9; the tails beyond [-18, 4] hold < 2e-8 of the mass.
# Measured against enumeration: max error 4e-7 at logit scales 0.1..1e4 (D=6, L=4).
_QUAD_LOG_V_MIN = -18.0
_QUAD_LOG_V_MAX = 4.0  # e^{-e^4} ~ 2e-24
QUADRATURE_NODES = 48


def _shift_down(a: jax.Array) -> jax.Array:
    """``out[k] = a[k - 1]``, ``out[0] = 0`` along the first axis."""
    return jnp.concatenate([jnp.zeros_like(a[:1]), a[:-1]], axis=0)


def _shift_up(a: jax.Array) -> jax.Array:
    """``out[k] = a[k + 1]``, last = 0."""
    return jnp.concatenate([a[1:], jnp.zeros_like(a[:1])], axis=0)


def _pb_forward(stay, done, n_slots):
    """The pmf after all items and before each item (``states[j]``: before item ``j``).

    Up to ``tuning.MARGINALS_UNROLL_MAX_ITEMS`` items: unrolled, one array per pmf entry -- a chain of
    elementwise ops that XLA fuses into one loop (a rolled scan is several times slower on
    CPU); beyond: a scan over items.
    """
    n_items = stay.shape[0]
    if n_items <= tuning.MARGINALS_UNROLL_MAX_ITEMS:
        pmf = [jnp.ones_like(stay[0])] + [jnp.zeros_like(stay[0])] * (n_slots - 1)
        states = []
        for j in range(n_items):
            states.append(pmf)
            pmf = [pmf[0] * stay[j]] + [pmf[k] * stay[j] + pmf[k - 1] * done[j] for k in range(1, n_slots)]
        return jnp.stack(pmf), states

    def add_item(pmf, sd):
        s, d = sd
        return pmf * s[None, :] + _shift_down(pmf) * d[None, :], pmf

    pmf0 = jnp.zeros((n_slots,) + stay.shape[1:], jnp.float32).at[0].set(1.0)
    return jax.lax.scan(add_item, pmf0, (stay, done))  # [L, Q], states [D, L, Q]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _truncated_poisson_binomial(stay: jax.Array, done: jax.Array, n_slots: int) -> jax.Array:
    """``P(exactly k of the items are done)`` for ``k < L``: ``[D, Q], [D, Q] -> [L, Q]``.

    A hand-written reverse pass (the same recursion run backwards) replaces autodiff,
    whose backward of the unrolled chain does not fuse on CPU and ran ~25x slower than the
    forward pass.
    """
    return _pb_forward(stay, done, n_slots)[0]


def _pb_fwd(stay, done, n_slots):
    pmf, states = _pb_forward(stay, done, n_slots)
    return pmf, (stay, done, states)


def _pb_bwd(n_slots, residuals, g):
    # pmf' = pmf * s_j + shift_down(pmf) * d_j, so with adj = dLoss/dpmf':
    # dLoss/ds_j = sum_k adj_k pmf_k, dLoss/dd_j = sum_k adj_k pmf_{k-1},
    # dLoss/dpmf_k = adj_k s_j + adj_{k+1} d_j.
    stay, done, states = residuals
    if isinstance(states, list):  # unrolled
        adj = [g[k] for k in range(n_slots)]
        d_stay, d_done = [], []
        for j in reversed(range(stay.shape[0])):
            before = states[j]
            d_stay.append(sum(adj[k] * before[k] for k in range(n_slots)))
            d_done.append(
                sum(adj[k] * before[k - 1] for k in range(1, n_slots)) if n_slots > 1 else jnp.zeros_like(stay[j])
            )
            adj = [adj[k] * stay[j] + (adj[k + 1] * done[j] if k + 1 < n_slots else 0.0) for k in range(n_slots)]
        return jnp.stack(d_stay[::-1]), jnp.stack(d_done[::-1])

    def back_item(adj, inputs):
        s, d, before = inputs
        grads = (jnp.sum(adj * before, axis=0), jnp.sum(adj * _shift_down(before), axis=0))
        return adj * s[None, :] + _shift_up(adj) * d[None, :], grads

    _, (d_stay, d_done) = jax.lax.scan(back_item, g, (stay, done, states), reverse=True)
    return d_stay, d_done


_truncated_poisson_binomial.defvjp(_pb_fwd, _pb_bwd)


def _race_rank_probs(log_ratio: jax.Array, other_valid: jax.Array, n_slots: int) -> jax.Array:
    """``P(rank(d) = k)`` for one item ``d`` from the exponential race.

    With ``v = w_d t``: ``P(rank(d)=k) = int_0^inf e^{-v} PB_{k-1}({1 - e^{-r_j v}}) dv``,
    ``r_j = w_j / w_d``, PB the Poisson-binomial pmf of the other items finishing first.
    Rescaling by ``w_d`` keeps the integrand's support at ``v ~ 1`` for every item, so it
    is exact (to float32 rounding) at any logit scale.

    Args:
      log_ratio: ``[D]`` ``s_j - s_d`` (entries with ``other_valid`` False are ignored).
      other_valid: bool ``[D]`` valid items other than ``d``.
      n_slots: ``L``.

    Returns:
      float32 ``[L]``.
    """
    log_v = jnp.linspace(_QUAD_LOG_V_MIN, _QUAD_LOG_V_MAX, QUADRATURE_NODES, dtype=jnp.float32)
    step = (_QUAD_LOG_V_MAX - _QUAD_LOG_V_MIN) / (QUADRATURE_NODES - 1)
    # log(r_j v): clip avoids inf - inf; exp(-exp(60)) is 0 and exp(-exp(-60)) is 1.
    log_rate = jnp.clip(log_ratio[:, None] + log_v[None, :], -60.0, 60.0)  # [D, Q]
    rate = jnp.exp(log_rate)
    stay = jnp.where(other_valid[:, None], jnp.exp(-rate), 1.0)  # P(j not finished yet)
    done = jnp.where(other_valid[:, None], -jnp.expm1(-rate), 0.0)

    pmf = _truncated_poisson_binomial(stay, done, n_slots)  # [L, Q]
    weight = jnp.exp(log_v - jnp.exp(log_v)) * step  # v e^{-v} d(log v)
    return jnp.sum(pmf * weight[None, :], axis=-1)


@functools.partial(jax.jit, static_argnames=("n_slots",))
def exact_ranked_item_marginals(
    logits: jax.Array, items: jax.Array, n_slots: int, *, where: jax.Array | None = None
) -> jax.Array:
    """Exact ``P(rank(items[m]) = l)`` for a few items, by exponential-race quadrature.

    Costs O(Q * M * D * L) per row (Q = 48 nodes), so for logged rankings (``M = L``
    items) it is far cheaper than all ``D`` items or than enumerating permutations.

    Args:
      logits: ``[.., D]`` scores.
      items: int ``[.., M]`` item indices.
      n_slots: ``L``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., M, L]``: row ``m`` is the rank distribution of ``items[.., m]`` over
      the first ``L`` slots (0 for invalid items).
    """
    logits = logits.astype(jnp.float32)
    valid = valid_items(logits, where)
    n_items = logits.shape[-1]
    batch = logits.shape[:-1]
    flat_logits = logits.reshape((-1, n_items))
    flat_valid = valid.reshape((-1, n_items))
    flat_items = items.astype(jnp.int32).reshape((-1, items.shape[-1]))

    per_row = jax.vmap(_item_rank_probs, in_axes=(None, None, 0, None))
    out = jax.vmap(per_row, in_axes=(0, 0, 0, None))(flat_logits, flat_valid, flat_items, n_slots)
    return out.reshape(batch + (items.shape[-1], n_slots))


def _item_rank_probs(row_logits: jax.Array, row_valid: jax.Array, d: jax.Array, n_slots: int) -> jax.Array:
    """``P(rank(d) = l)``, ``l < n_slots``, for one row: ``[D], [D], int [] -> [n_slots]``."""
    is_d = jnp.arange(row_logits.shape[-1]) == d  # a mask, not an index: its gradient is no scatter
    d_valid = jnp.any(jnp.logical_and(is_d, row_valid))
    s_d_safe = jnp.sum(jnp.where(jnp.logical_and(is_d, row_valid), row_logits, 0.0))
    others = jnp.logical_and(row_valid, jnp.logical_not(is_d))
    log_ratio = jnp.where(others, row_logits - s_d_safe, 0.0)
    probs = _race_rank_probs(log_ratio, others, n_slots)
    return jnp.where(d_valid, jnp.clip(probs, 0.0, 1.0), 0.0)


@jax.jit
def exact_slot_marginals(logits: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """Exact ``P(a_l = rankings[.., l])``: each ranked item's probability of its own slot.

    What IIPS needs. Up to ``tuning.MARGINALS_UNROLL_MAX_ITEMS`` (32) items: the per-item quadrature (slot
    ``l`` only needs the first ``l`` entries of the Poisson-binomial recursion, ~``(L + 1) /
    2L`` of [`exact_ranked_item_marginals`][exact_ranked_item_marginals]). Above: the shared-grid quadrature
    (docs/maths.md §1.8, "logged items only"): one Poisson-binomial table of the items
    outside the ranking serves all ``L`` ranked items, ``O(Q' (K L + D N))`` per row instead
    of ``O(Q L^2 D)``; rows whose logits spread too far for its grid fall back, per call, to
    a wider grid and then to the per-item quadrature. Differentiable either way.

    Args:
      logits: ``[.., D]``.
      rankings: int ``[.., L]``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., L]``.
    """
    logits = logits.astype(jnp.float32)
    valid = valid_items(logits, where)
    n_items, n_slots = logits.shape[-1], rankings.shape[-1]
    flat_logits = logits.reshape((-1, n_items))
    flat_valid = valid.reshape((-1, n_items))
    flat_rankings = rankings.astype(jnp.int32).reshape((-1, n_slots))
    if n_items <= tuning.MARGINALS_UNROLL_MAX_ITEMS or flat_logits.shape[0] == 0:
        out = _per_item_slot_marginals(flat_logits, flat_valid, flat_rankings)
    else:
        out = _large_slot_marginals(flat_logits, flat_valid, flat_rankings)
    return out.reshape(rankings.shape)


def _slot_marginal_branches(logits, valid, rankings):
    """The grid tier of a call and its branches ``(logits) -> [n, L]`` (shared grids, then
    the per-item quadrature)."""
    outside = _outside_ranking(logits, valid, rankings)
    top = _top_outside(outside, rankings.shape[-1])
    tier = _shared_grid_tier(logits, valid, rankings, top)
    branches = [
        functools.partial(_shared_grid_slot_marginals, valid=valid, rankings=rankings, n_nodes=q)
        for q in _SHARED_GRID_NODES
    ]
    return tier, top, branches + [lambda s: _per_item_slot_marginals(s, valid, rankings)]


@jax.custom_vjp
def _large_slot_marginals(logits, valid, rankings):
    """The tiered quadrature for ``D > tuning.MARGINALS_UNROLL_MAX_ITEMS``; its reverse pass differentiates
    only the branch that ran (a differentiated ``switch`` would carry every branch's
    residuals, the per-item quadrature's ``[D, L, Q]`` tables among them)."""
    tier, top, branches = _slot_marginal_branches(logits, valid, rankings)
    branches = [functools.partial(b, top=top) for b in branches[:-1]] + branches[-1:]
    return jax.lax.switch(tier, branches, logits)


def _large_fwd(logits, valid, rankings):
    return _large_slot_marginals(logits, valid, rankings), (logits, valid, rankings)


def _large_bwd(residuals, g):
    logits, valid, rankings = residuals
    tier, _, branches = _slot_marginal_branches(logits, valid, rankings)
    pullbacks = [lambda s, g, b=b: jax.vjp(b, s)[1](g)[0] for b in branches]
    return jax.lax.switch(tier, pullbacks, logits, g), None, None


_large_slot_marginals.defvjp(_large_fwd, _large_bwd)


def _per_item_slot_marginals(logits: jax.Array, valid: jax.Array, rankings: jax.Array) -> jax.Array:
    """``[n, D], [n, D], int [n, L] -> [n, L]``: each slot's item by its own quadrature
    (batched over rows, [`_own_slot_probability`][_own_slot_probability], up to
    ``tuning.MARGINALS_UNROLL_MAX_ITEMS`` items; per row otherwise)."""
    n_items = logits.shape[-1]
    per_slot = []
    for l in range(rankings.shape[-1]):
        if n_items > tuning.MARGINALS_UNROLL_MAX_ITEMS:
            per_slot.append(
                jax.vmap(_item_rank_probs, in_axes=(0, 0, 0, None))(logits, valid, rankings[:, l], l + 1)[:, l]
            )
            continue
        is_d = rankings[:, l : l + 1] == jnp.arange(n_items, dtype=rankings.dtype)[None, :]  # a mask: no scatter
        d_valid = jnp.any(jnp.logical_and(is_d, valid), axis=-1)
        s_d = jnp.sum(jnp.where(jnp.logical_and(is_d, valid), logits, 0.0), axis=-1, keepdims=True)
        others = jnp.logical_and(valid, jnp.logical_not(is_d))
        probs = _own_slot_probability(jnp.where(others, logits - s_d, 0.0), others, l)
        per_slot.append(jnp.where(d_valid, jnp.clip(probs, 0.0, 1.0), 0.0))
    return jnp.stack(per_slot, axis=-1)


# --- Each logged item's own slot, batched over rows (docs/performance.md §33) ------------------
# The per-item rule of `_race_rank_probs` written for [n, D, Q] arrays with one reverse pass for
# the whole slot: the nodes' rates factor as r_j v_q (one exp per row and item, not per node),
# 1 - e^-rate comes from e^-rate or a short series instead of expm1, and the reverse pass reduces
# over the nodes once. Under `jax.vmap` per row the same recursion ran as ~300 small fusions.
_LOG_V = np.linspace(_QUAD_LOG_V_MIN, _QUAD_LOG_V_MAX, QUADRATURE_NODES)
_V = np.exp(_LOG_V).astype(np.float32)
_V_WEIGHT = (np.exp(_LOG_V - np.exp(_LOG_V)) * (_QUAD_LOG_V_MAX - _QUAD_LOG_V_MIN) / (QUADRATURE_NODES - 1)).astype(
    np.float32
)  # v e^{-v} d(log v)
_LOG_RATIO_MAX = 80.0  # e^80 e^4 is finite in float32; e^-rate is then 0, its gradient 0
_SERIES_MAX_RATE = 0.5  # below: 1 - e^-x by its Taylor series (11 terms, relative error < 1e-10)


def _one_minus_exp(rate: jax.Array, stay: jax.Array) -> jax.Array:
    """``1 - e^{-rate}`` given ``stay = e^{-rate}``, accurate in relative terms at any rate."""
    small = rate < _SERIES_MAX_RATE
    x = jnp.where(small, rate, 0.0)
    series = jnp.float32((-1.0) ** 12 / math.factorial(11))
    for i in range(10, 0, -1):
        series = series * x + (-1.0) ** (i + 1) / math.factorial(i)
    return jnp.where(small, x * series, 1.0 - stay)


def _own_slot_race(log_ratio: jax.Array, others: jax.Array):
    """Rates ``r_j v_q`` and ``P(j (not) finished by v_q)``: ``[n, D] -> [n, D, Q]`` each (the
    item itself and invalid items never finish), and where the rate's gradient flows."""
    live = jnp.logical_and(others, jnp.abs(log_ratio) < _LOG_RATIO_MAX)[:, :, None]
    rate = jnp.exp(jnp.clip(log_ratio, -_LOG_RATIO_MAX, _LOG_RATIO_MAX))[:, :, None] * _V[None, None, :]
    stay = jnp.exp(-rate)
    done = _one_minus_exp(rate, stay)
    keep = others[:, :, None]
    return rate, jnp.where(keep, stay, 1.0), jnp.where(keep, done, 0.0), live


def _own_slot_states(stay: jax.Array, done: jax.Array, slot: int):
    """The Poisson-binomial recursion over the items, unrolled (entries ``0..slot``, each
    ``[n, Q]``): the entry ``slot`` after all items and the entries before each item."""
    pmf = [jnp.ones_like(stay[:, 0])] + [jnp.zeros_like(stay[:, 0])] * slot
    states = []
    for j in range(stay.shape[1]):
        states.append(pmf)
        s, d = stay[:, j], done[:, j]
        pmf = [pmf[0] * s] + [pmf[k] * s + pmf[k - 1] * d for k in range(1, slot + 1)]
    return pmf[slot], states


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _own_slot_probability(log_ratio: jax.Array, others: jax.Array, slot: int) -> jax.Array:
    """``P(rank(d) = slot)`` from ``s_j - s_d`` (``[n, D]``, ``others``: the valid items but
    ``d``): ``[n]``."""
    _, stay, done, _ = _own_slot_race(log_ratio, others)
    return jnp.sum(_own_slot_states(stay, done, slot)[0] * _V_WEIGHT[None, :], axis=-1)


def _own_slot_fwd(log_ratio, others, slot):
    rate, stay, done, live = _own_slot_race(log_ratio, others)
    top, states = _own_slot_states(stay, done, slot)
    return jnp.sum(top * _V_WEIGHT[None, :], axis=-1), (rate, stay, done, live, states)


def _own_slot_bwd(slot, residuals, g):
    # As in _pb_bwd, with adj = dLoss/dpmf after item j: dLoss/dstay_j = sum_k adj_k pmf_k,
    # dLoss/ddone_j = sum_k adj_k pmf_{k-1}; d stay/d rate = -stay, d done/d rate = stay and
    # d rate/d log_ratio = rate.
    rate, stay, done, live, states = residuals
    adj = [jnp.zeros_like(stay[:, 0])] * slot + [g[:, None] * _V_WEIGHT[None, :]]
    per_item = []
    for j in reversed(range(stay.shape[1])):
        before, s, d = states[j], stay[:, j], done[:, j]
        d_stay = sum(adj[k] * before[k] for k in range(slot + 1))
        d_done = sum(adj[k] * before[k - 1] for k in range(1, slot + 1)) if slot else 0.0
        per_item.append(jnp.where(live[:, j], s * (d_done - d_stay) * rate[:, j], 0.0))
        adj = [adj[k] * s + (adj[k + 1] * d if k < slot else 0.0) for k in range(slot + 1)]
    return jnp.sum(jnp.stack(per_item[::-1], axis=1), axis=-1), None  # one reduction over the nodes


_own_slot_probability.defvjp(_own_slot_fwd, _own_slot_bwd)


# --- The shared-grid quadrature of the logged items' own-slot marginals -----------------
# (docs/maths.md §1.8, "logged items only"; timings: docs/performance.md §11.)
# All ranked items of a row share one grid in log t (t the race's time, not each item's
# rescaled v = w_d t): a trapezoid rule is equally accurate at any offset, so item d's nodes
# are the shared ones shifted by s_d. Then the Poisson-binomial table of the items outside
# the ranking is computed once per row. Of those, the K with the largest logits go through
# the recursion; the rest, each finishing with probability <= 1/2 at every node that is
# kept, enter through the power sums sum_j x_j^r (x_j = e^{w_j t} - 1 <= 1) of
# log prod_j (1 + x_j z), formed from the moments sum_j w_j^n by a Taylor series with
# positive terms, and Newton's identities. Nodes where the (K+1)-th item has finished with
# probability > 1/2 are dropped: there fewer than L of the top K have finished with
# probability < L C(K, L-1) 2^-K <= 1e-8. The other ranked items multiply in last, by
# prefix and suffix products. A finer step than the per-item rule's: at large D the
# integrand's strip of analyticity narrows and the 48-node rule's error grows to ~1e-3
# (relative) at slot 10; this step keeps it near 1e-5.
_SHARED_STEP = (_QUAD_LOG_V_MAX - _QUAD_LOG_V_MIN) / 63
_SHARED_GRID_NODES = (80, 256)  # grid sizes tried in turn, then the per-item quadrature
_LOG_LN2 = math.log(math.log(2.0))
_LOG_30 = math.log(30.0)  # L e^-30 bounds what lies beyond the L-th other item's w t = 30
_DROPPED_NODE_MASS = 1e-8


@functools.cache
def _recursed_items(n_slots: int) -> int:
    """``K``: items in the recursion, so that ``L C(K, L-1) 2^-K <= 1e-8``."""
    k = max(n_slots, 1)
    while n_slots * math.comb(k, n_slots - 1) * 2.0**-k > _DROPPED_NODE_MASS:
        k += 1
    return k


@functools.cache
def _power_series(n_slots: int) -> np.ndarray:
    """``A[r - 1, n - 1]``: the coefficient of ``y^n`` in ``(e^y - 1)^r``, ``r < L``, with
    enough terms for a relative error below ``1e-9`` at ``y = ln 2``: ``[L - 1, N]``."""
    n_max = 8 * n_slots + 40
    base = np.array([0.0] + [1.0 / math.factorial(n) for n in range(1, n_max)])
    power, rows, terms_needed = np.eye(1, n_max)[0], [], 2
    for _ in range(1, n_slots):
        power = np.convolve(power, base)[:n_max]
        terms = power * math.log(2.0) ** np.arange(n_max)
        tail = np.cumsum(terms[::-1])[::-1] / terms.sum()
        terms_needed = max(terms_needed, int(np.argmax(tail < 1e-9)))
        rows.append(power)
    return np.array(rows, np.float64).reshape(n_slots - 1, n_max)[:, 1:terms_needed].astype(np.float32)


def _ranked_logits(logits, valid, rankings):
    """The ranked items' logits, validity, and the row's largest ranked logit (no gradient)."""
    r_valid = jnp.take_along_axis(valid, rankings, axis=-1)
    r_logit = jnp.where(r_valid, jnp.take_along_axis(logits, rankings, axis=-1), 0.0)
    s_hi = jnp.max(jnp.where(r_valid, r_logit, -jnp.inf), axis=-1, keepdims=True)
    return r_logit, r_valid, jax.lax.stop_gradient(jnp.where(jnp.isfinite(s_hi), s_hi, 0.0))


def _outside_ranking(logits, valid, rankings):
    """Logits of the valid items outside the ranking (``-inf`` elsewhere): ``[n, D]``."""
    in_ranking = jnp.any(
        rankings[:, :, None] == jnp.arange(logits.shape[-1], dtype=rankings.dtype)[None, None, :], axis=1
    )
    return jnp.where(jnp.logical_and(valid, jnp.logical_not(in_ranking)), logits, -jnp.inf)


def _shared_grid_tier(logits, valid, rankings, top) -> jax.Array:
    """Index of the first grid of ``_SHARED_GRID_NODES`` that covers every row of the call
    (``len(_SHARED_GRID_NODES)``: none does, or a valid item is ranked twice).

    Item d needs ``log t`` up to ``4 - s_d`` (``v = e^4``), but no row needs nodes beyond
    ``log 30 - s_(L)`` (the L-th largest logit outside the ranking: every item then has L
    others that finished with probability > 1 - e^-30) or beyond the dropped nodes.
    """
    n_slots = rankings.shape[-1]
    r_logit, r_valid, s_hi = _ranked_logits(logits, valid, rankings)
    s_lo = jnp.min(jnp.where(r_valid, r_logit, jnp.inf), axis=-1)
    k = top.shape[-1]  # the K largest logits outside the ranking
    s_l = jnp.max(jnp.where(jnp.arange(k)[None, :] == min(n_slots, k) - 1, top, -jnp.inf), axis=-1)
    needed = jnp.minimum(4.0 - s_lo, _LOG_30 - s_l)
    if logits.shape[-1] > k:
        needed = jnp.minimum(needed, _LOG_LN2 - jnp.min(top, axis=-1))
    first = -18.0 - s_hi[:, 0]  # log t at node 0
    span = jnp.where(jnp.any(r_valid, axis=-1), needed - first, 0.0)
    same = rankings[:, :, None] == rankings[:, None, :]
    twice = jnp.any(same & ~jnp.eye(n_slots, dtype=bool)[None] & r_valid[:, :, None])
    fits = [jnp.all(span <= _SHARED_STEP * (q - 1)) for q in _SHARED_GRID_NODES]
    tier = jnp.argmax(jnp.array(fits + [True]))
    return jnp.where(twice, len(_SHARED_GRID_NODES), tier)


def _mul_linear(poly, stay, done):
    """``poly * (stay + done z)`` truncated to ``len(poly)`` coefficients (a list of arrays)."""
    return [poly[0] * stay] + [poly[k] * stay + poly[k - 1] * done for k in range(1, len(poly))]


def _top_outside(outside: jax.Array, n_slots: int) -> jax.Array:
    """The ``K`` largest logits outside the ranking, largest first: ``[n, K]``."""
    return jax.lax.top_k(outside, min(_recursed_items(n_slots), outside.shape[-1]))[0]


def _shared_grid_slot_marginals(logits, valid, rankings, n_nodes, top=None):
    """``[n, D], [n, D], int [n, L] -> [n, L]`` on a grid of ``n_nodes`` shared nodes
    (``top``: [`_top_outside`][_top_outside], when already at hand; it is used whole, as a slice of
    ``top_k``'s output makes XLA replace its TopK kernel by a full sort)."""
    n, n_items = logits.shape
    n_slots = rankings.shape[-1]
    outside = _outside_ranking(logits, valid, rankings)
    if top is None:
        top = _top_outside(outside, n_slots)
    r_logit, r_valid, s_hi = _ranked_logits(logits, valid, rankings)
    node = _SHARED_STEP * jnp.arange(n_nodes, dtype=jnp.float32)  # log t + 18 + s_hi
    mid = 0.5 * _SHARED_STEP * (n_nodes - 1)  # rates w_j t_m = e^{s_j - 18 - s_hi + mid} e^{node_m - mid}: both finite
    e_node = jnp.exp(node - mid)
    k = top.shape[-1]
    table = [jnp.ones((n, n_nodes), jnp.float32)] + [jnp.zeros((n, n_nodes), jnp.float32)] * (n_slots - 1)
    kept = jnp.ones((n, n_nodes), bool)
    if n_items > k:  # the rest: moments, power sums, Newton's identities
        s_min = jax.lax.stop_gradient(jnp.min(top, axis=-1, keepdims=True))  # every rest item lies at or below
        has_rest = jnp.isfinite(s_min)
        s_ref = jnp.where(has_rest, s_min, 0.0)
        below = jnp.where(outside < s_min, outside - s_ref, -jnp.inf)  # strictly below; the ties next
        ties = jnp.sum(outside == s_min, axis=-1, keepdims=True) - jnp.sum(top == s_min, axis=-1, keepdims=True)
        ties = jnp.where(has_rest, ties, 0).astype(jnp.float32)
        log_tp = jnp.minimum(s_ref - 18.0 - s_hi + node[None, :], _LOG_LN2)  # log(w_ref t), t' <= ln 2 where kept
        kept = jnp.logical_or(~has_rest, s_ref - 18.0 - s_hi + node[None, :] <= _LOG_LN2)
        p0 = jnp.exp(-jnp.exp(log_tp) * (jnp.sum(jnp.exp(below), axis=-1, keepdims=True) + ties))
        if n_slots > 1:
            series = jnp.asarray(_power_series(n_slots))  # [L-1, N]
            powers = jnp.arange(1, series.shape[1] + 1, dtype=jnp.float32)
            moments = jnp.sum(jnp.exp(below[:, :, None] * powers[None, None, :]), axis=1) + ties  # [n, N]
            power_sums = jnp.einsum(
                "rqn,rn,kn->rqk", jnp.exp(log_tp[:, :, None] * powers[None, None, :]), moments, series
            )
            elementary = [jnp.ones((n, n_nodes), jnp.float32)]  # e_k of the x_j (Newton's identities)
            for j in range(1, n_slots):
                elementary.append(
                    jnp.asarray(
                        sum(
                            (1.0 if r % 2 else -1.0) * power_sums[..., r - 1] * elementary[j - r]
                            for r in range(1, j + 1)
                        )
                        / j
                    )
                )
            table = [p0 * e for e in elementary]
        else:
            table = [p0]
        table, kept = jax.lax.optimization_barrier((table, kept))  # materialised once, not refused per use

    def add_items(pmf, scale):  # one item: pmf * (stay + done z)
        rate = scale[:, None] * e_node[None, :]
        stay, done = jnp.exp(-rate), -jnp.expm1(-rate)
        shifted = jnp.concatenate([jnp.zeros_like(pmf[:1]), pmf[:-1]], axis=0)
        return pmf * stay[None] + shifted * done[None], None

    scale = jnp.exp(top - 18.0 - s_hi + mid)  # 0 for -inf
    pmfs, _ = jax.lax.scan(add_items, jnp.stack(table), scale.T)
    pmfs = jax.lax.optimization_barrier(jnp.where(kept[None], pmfs, 0.0))

    rate = (
        jnp.where(r_valid, jnp.exp(r_logit - 18.0 - s_hi + mid), 0.0)[:, :, None] * e_node[None, None, :]
    )  # [n, L, Q]
    stay, done = jax.lax.optimization_barrier((jnp.exp(-rate), -jnp.expm1(-rate)))
    prefix = [list(pmfs)]  # prefix[l]: the table times the ranked items before slot l
    for j in range(n_slots - 1):
        prefix.append(list(jax.lax.optimization_barrier(jnp.stack(_mul_linear(prefix[-1], stay[:, j], done[:, j])))))
    suffix = [[jnp.ones((n, n_nodes), jnp.float32)]]  # suffix[i]: ranked items after slot L-1-i
    for j in range(n_slots - 1, 0, -1):
        grown = suffix[-1] + [jnp.zeros((n, n_nodes), jnp.float32)]
        suffix.append(_mul_linear(grown, stay[:, j], done[:, j])[:n_slots])
    log_v = (r_logit - 18.0 - s_hi)[:, :, None] + node[None, None, :]  # each ranked item's own log v
    weight = _SHARED_STEP * jnp.exp(log_v - jnp.exp(log_v))
    out = []
    for l in range(n_slots):
        after = suffix[n_slots - 1 - l]  # items after slot l
        coefficient = sum(prefix[l][i] * after[l - i] for i in range(l + 1) if l - i < len(after))
        out.append(jnp.sum(weight[:, l] * coefficient, axis=-1))
    return jnp.where(r_valid, jnp.clip(jnp.stack(out, axis=-1), 0.0, 1.0), 0.0)


@functools.partial(jax.jit, static_argnames=("n_samples", "baseline"))
def sampled_slot_marginals(
    key: jax.Array,
    logits: jax.Array,
    rankings: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """Rao-Blackwellised estimate of ``P(a_l = rankings[.., l])``, unbiased in value and gradient.

    ``P_hat_l = (1/N) sum_n pi(a_l | y^(n)_{1:l-1})`` over ``N`` sampled rankings ``y^(n)``
    (docs/maths.md §1.9): exact at ``l = 1``, ``O(N (D + L^2))`` per row. Its value is the
    estimate; its gradient is the unbiased ``(1/N) sum_n [grad pi(a_l | y^(n)) + (pi(a_l |
    y^(n)) - b_n) grad log pi(y^(n)_{1:l-1})]`` (the samples depend on the logits too, so the
    pathwise part alone would be biased), with leave-one-out baselines ``b_n`` over the
    samples (``baseline=True``, ``N >= 2``). Linear estimators of the marginal (IIPS)
    stay unbiased in value and gradient with it in place of the exact marginal.

    Args:
      key: PRNG key.
      logits: ``[.., D]`` scores.
      rankings: int ``[.., L]``.
      n_samples: ``N``.
      where: optional bool ``[.., D]`` mask.
      baseline: leave-one-out baselines in the score term.

    Returns:
      float32 ``[.., L]`` (a "magic box": see above).
    """
    if n_samples < (2 if baseline else 1):
        raise ValueError(f"n_samples must be >= {2 if baseline else 1}, got {n_samples}")
    sg = jax.lax.stop_gradient
    logits = logits.astype(jnp.float32)
    rankings = rankings.astype(jnp.int32)
    n_slots = rankings.shape[-1]
    valid = valid_items(logits, where)
    shape = (n_samples,) + logits.shape
    many = tile_samples(logits, n_samples)
    if prefix_sampling.prefix_sampler(logits.shape[-1], n_slots) == "inverse_cdf":
        # Short rankings of many items: one inverse-CDF table and shared normalisers per row
        # (docs/maths.md §1.6); the same distribution as the Gumbel draw below.
        samples = prefix_sampling.sample_prefixes(key, sg(logits), n_slots, n_samples, where=where)
        slot_lp = prefix_sampling.shared_slot_log_probs(logits, samples, where=where)
    else:
        samples = sample_rankings(key, sg(logits), n_slots, where=where, n_samples=n_samples)  # [N, .., L]
        many_where = None if where is None else jnp.broadcast_to(where, shape)
        slot_lp = slot_log_probs(many, samples, where=many_where)  # [N, .., L] log pi(y_l | y_{1:l-1})
    sampled_valid = jnp.take_along_axis(jnp.broadcast_to(valid, shape), samples, axis=-1)
    sampled_logit = jnp.where(sampled_valid, jnp.take_along_axis(many, samples, axis=-1), 0.0)
    ranked_valid = jnp.take_along_axis(valid, rankings, axis=-1)
    ranked_logit = jnp.where(ranked_valid, jnp.take_along_axis(logits, rankings, axis=-1), 0.0)
    # log pi(a_l | y_{1:l-1}) = (s_{a_l} - s_{y_l}) + log pi(y_l | y_{1:l-1}): logit differences
    # and the precise slot factor (as placement_log_probs), -inf where a_l is already placed.
    earlier = jnp.tril(jnp.ones((n_slots, n_slots), bool), -1)  # [l, m]: m < l
    earlier = earlier.reshape((1,) * (samples.ndim - 1) + earlier.shape)
    placed = jnp.any((samples[..., None, :] == rankings[None, ..., :, None]) & earlier, axis=-1)  # [N, .., L]
    available = ranked_valid[None] & sampled_valid & ~placed
    log_place = jnp.where(available, ranked_logit[None] - sampled_logit + slot_lp, -jnp.inf)
    place = jnp.exp(jnp.minimum(log_place, 0.0))  # [N, .., L]
    before = cumsum_slots(slot_lp) - slot_lp  # log pi(y_{1:l-1})
    b = (sum_samples(place)[None] - place) / (n_samples - 1) if baseline else 0.0
    score = sg(place - b) * (before - sg(before))  # value 0, gradient (place - b) grad log pi(y_{1:l-1})
    return mean_samples(place + score)


INSERTION_BASELINES = ("auto", "logged", "leave-one-out", "none")


@functools.partial(jax.jit, static_argnames=("n_samples", "baseline"))
def insertion_slot_marginals(
    key: jax.Array,
    logits: jax.Array,
    rankings: jax.Array,
    n_samples: int = 1,
    *,
    where: jax.Array | None = None,
    baseline: str = "auto",
) -> jax.Array:
    """``P(a_l = rankings[.., l])`` estimated by inserting the item into the others' order.

    Removing item ``a`` from a PL ranking leaves a PL ranking ``y'`` of the other items, and
    given ``y'`` the slot of ``a`` is exact: ``P(a at l | y') = prod_{j<l} (1 - pi'_j) pi'_l``
    with ``pi'_j = w_a / (Z'_j + w_a)``, ``Z'_j`` the weight of the others not in
    ``y'_{1:j-1}`` (docs/maths.md §1.9, "Inserting the item"). One sampled ranking serves
    every logged item: drop the item from it. Unbiased in value and gradient, exact at
    ``l = 1``. The gradient's score term ``(P_hat - b) grad log pi_{-a}(y'_{1:l-1})`` takes as
    baseline ``b``:

    - ``"logged"``: the same insertion into the *logged* ranking's order of the others --
      independent of the sample, so unbiased with ``N = 1``;
    - ``"leave-one-out"``: the other samples' mean (``N >= 2``);
    - ``"none"``;
    - ``"auto"`` (default): ``"logged"`` at ``N = 1``, ``"leave-one-out"`` from ``N = 2``.

    Its variance and time against [`sampled_slot_marginals`][sampled_slot_marginals] are measured in
    docs/performance.md §15 (a fraction of the variance at a fraction of the time; ``N = 2``
    with leave-one-out baselines is the learners' choice). ``O(N (D + L^2))`` per row: the
    sample's own normalisers ``Z_j`` (from logit differences, as
    [`slot_log_probs`][opl_rank.pl.plackett_luce.slot_log_probs]) give every ``Z'_j``.

    Args:
      key: PRNG key.
      logits: ``[.., D]`` scores.
      rankings: int ``[.., L]``.
      n_samples: ``N`` sampled rankings per row.
      where: optional bool ``[.., D]`` mask.
      baseline: ``"auto"``, ``"logged"``, ``"leave-one-out"`` or ``"none"``.

    Returns:
      float32 ``[.., L]`` (a magic box), 0 at padding slots.
    """
    if baseline not in INSERTION_BASELINES:
        raise ValueError(f"baseline must be one of {INSERTION_BASELINES}, got {baseline!r}")
    if baseline == "auto":
        baseline = "logged" if n_samples == 1 else "leave-one-out"
    if n_samples < (2 if baseline == "leave-one-out" else 1):
        raise ValueError(
            f"n_samples must be >= {2 if baseline == 'leave-one-out' else 1} with baseline={baseline!r}, got {n_samples}"
        )
    sg = jax.lax.stop_gradient
    neg = -jnp.inf
    logits = logits.astype(jnp.float32)
    rankings = rankings.astype(jnp.int32)
    batch, n_slots = rankings.shape[:-1], rankings.shape[-1]
    samples = sample_rankings(key, sg(logits), n_slots, where=where, n_samples=n_samples)  # [N, .., L]
    if baseline == "logged":  # the logged order goes through the same formula, as one more "sample"
        samples = jnp.concatenate([samples, rankings[None]], axis=0)
    n_orders = samples.shape[0]
    shape = (n_orders,) + logits.shape
    valid = valid_items(logits, where)
    many = tile_samples(logits, n_orders)
    sampled_valid = jnp.take_along_axis(jnp.broadcast_to(valid, shape), samples, axis=-1)
    s_y = jnp.where(sampled_valid, jnp.take_along_axis(many, samples, axis=-1), 0.0)
    # The sample's slot factors log(w_{y_j} / Z_j) and its outside weight log Z_L.
    lp_y, log_out = slot_log_probs_and_rest(
        many, samples, where=None if where is None else jnp.broadcast_to(where, shape)
    )
    a_valid = jnp.take_along_axis(valid, rankings, axis=-1)
    s_a = jnp.where(a_valid, jnp.take_along_axis(logits, rankings, axis=-1), 0.0)  # [.., L(l)]
    # From here on the rows are the last axis ([N, L(l), L(j), rows]): XLA on CPU vectorises
    # along the minor axis, and the slot axes (10-11 long) vectorise badly (an IIPS step at
    # D = 100, L = 10, 1024 rows: 14 against 17 ms; docs/performance.md §16).
    rows = lambda x, lead: jnp.moveaxis(x.reshape(x.shape[:lead] + (-1, n_slots)), lead, -1)
    samples, s_y, lp_y, sampled_valid = (rows(x, 1) for x in (samples, s_y, lp_y, sampled_valid))  # [N, L, R]
    s_a, a_valid, logged = (rows(x, 0) for x in (s_a, a_valid, rankings))  # [L, R]
    log_out = log_out.reshape(n_orders, 1, -1)  # [N, 1, R]
    slots = jnp.arange(n_slots, dtype=jnp.int32)
    l_axis, j_axis = slots[None, :, None, None], slots[None, None, :, None]  # [1, L(l), 1, 1], [1, 1, L(j), 1]
    # p: where the logged item a_l sits in each order ([N, L(l), R]; L: not in its top L).
    pos = jnp.min(jnp.where(samples[:, None] == logged[None, :, None], j_axis, n_slots), axis=2)  # [N, L(l), R]
    # q[l, j] = log(w_a / Z_j) for j = 0..L: logit differences first, then the slot factor.
    q_ranked = (s_a[None, :, None] - s_y[:, None]) + lp_y[:, None]  # [N, L(l), L(j), R]
    q_out = s_a[None] - jnp.where(jnp.isfinite(log_out), log_out, 0.0)  # [N, L(l), R]
    q = jnp.concatenate([q_ranked, q_out[:, :, None]], axis=2)  # [N, L(l), L + 1(j), R]
    stage_ok = jnp.concatenate([sampled_valid, jnp.isfinite(log_out)], axis=1)[:, None]  # [N, 1, L + 1, R]
    # Stage j < p still holds a: Z'_j + w_a = Z_j, pi'_j = e^{q_j}. From p on, a is out of the
    # order: Z'_j = Z_{j+1}, pi'_j = sigmoid(q_{j+1}). One expm1 and one log per entry (XLA's
    # CPU log1p is ~10x slower than log): before p, log(1 - pi') = log(-expm1(q)); after,
    # softplus(q') = max(q', 0) + log(2 + expm1(-|q'|)).
    before = pos[:, :, None] > j_axis  # [N, L(l), L(j), R]
    ok = jnp.where(before, stage_ok[:, :, :-1], stage_ok[:, :, 1:])
    q_here = jnp.where(before & ok, jnp.minimum(q[:, :, :-1], -1e-37), -1.0)  # < 0 (the floor: rounding)
    q_next = jnp.where(~before & ok, q[:, :, 1:], 0.0)
    e = jnp.expm1(jnp.where(before, q_here, -jnp.abs(q_next)))
    log_e = jnp.log(jnp.where(before, -e, e + 2.0))
    softplus = jnp.maximum(q_next, 0.0) + log_e
    skip = jnp.where(ok, jnp.where(before, log_e, -softplus), neg)  # log(1 - pi'_j)
    chosen = jnp.where(ok, jnp.where(before, q_here, q_next - softplus), 0.0)  # log pi'_j
    earlier = j_axis < l_axis  # [1, L(l), L(j), 1]: j < l
    log_place = jnp.sum(jnp.where(earlier, skip, 0.0), axis=2) + jnp.sum(
        jnp.where(j_axis == l_axis, chosen, 0.0), axis=2
    )
    # log pi_{-a}(y'_{1:l-1}) = sum_{j<l} log(w_{y'_j} / Z'_j): before p, the sample's factor over
    # (1 - pi'_j); after, the next slot's factor.
    lp_next = jnp.concatenate([lp_y[:, 1:], jnp.zeros_like(lp_y[:, :1])], axis=1)
    skip_finite = jnp.isfinite(skip)
    lp_others = jnp.where(before, lp_y[:, None] - jnp.where(skip_finite, skip, 0.0), lp_next[:, None])
    log_prefix = jnp.sum(jnp.where(earlier & skip_finite, lp_others, 0.0), axis=2)  # [N, L(l), R]
    place = jnp.where(a_valid[None], jnp.exp(jnp.minimum(log_place, 0.0)), 0.0)
    b: jax.Array | float
    if baseline == "logged":
        b, place, log_prefix = place[-1:], place[:-1], log_prefix[:-1]
    elif baseline == "leave-one-out":
        b = (sum_samples(place)[None] - place) / (n_samples - 1)
    else:
        b = 0.0
    score = sg(place - b) * (log_prefix - sg(log_prefix))
    return jnp.moveaxis(mean_samples(place + score), -1, 0).reshape(batch + (n_slots,))


# Cost per row of the logged items' own-slot marginals, in multiply-add equivalents of one
# value-and-gradient pass (a transcendental counted as 8), fitted to the times measured on
# the 2-core machines (docs/performance.md §11); slot_marginal_method compares them.
def slot_marginal_cost(n_items: int, n_slots: int, method: str, n_samples: int = 8) -> float:
    """Estimated value-and-gradient cost per row of ``"exact"`` or ``"sampled"`` marginals."""
    if method == "sampled":
        return n_samples * (12.0 * n_items + 6.0 * n_slots * n_slots)
    if method != "exact":
        raise ValueError(f"method must be 'exact' or 'sampled', got {method!r}")
    if n_items <= tuning.MARGINALS_UNROLL_MAX_ITEMS:
        return 3.0 * QUADRATURE_NODES * n_items * n_slots * (n_slots + 1) / 2
    k = min(_recursed_items(n_slots), n_items)
    return 3.0 * _SHARED_GRID_NODES[0] * (k * (2 * n_slots + 16) + 3 * n_slots * n_slots) + 60.0 * n_items


def slot_marginal_method(
    n_items: int,
    n_slots: int,
    n_samples: int = 8,
    method: str = "auto",
    *,
    max_exact_cost: float = 1e5,
    exact_preference: float = 4.0,
) -> str:
    """``"exact"`` or ``"sampled"``: what to use for the logged items' own-slot marginals.

    ``"auto"`` keeps the exact quadrature (no sampling noise) while its cost per row
    ([`slot_marginal_cost`][slot_marginal_cost]) is below ``max_exact_cost`` -- every ``D <= 10`` with
    ``L <= 10``, the paper's grids -- or below ``exact_preference`` times the ``n_samples``
    Rao-Blackwellised estimate's, and samples otherwise (``D >= 16`` at ``L = 10``,
    ``D >= 40`` at ``L = 5``). ``"exact"`` and ``"sampled"`` are returned as they are.
    """
    if method in ("exact", "sampled"):
        return method
    if method != "auto":
        raise ValueError(f"method must be 'auto', 'exact' or 'sampled', got {method!r}")
    exact = slot_marginal_cost(n_items, n_slots, "exact")
    sampled = slot_marginal_cost(n_items, n_slots, "sampled", n_samples)
    return "exact" if exact <= max(max_exact_cost, exact_preference * sampled) else "sampled"


@functools.partial(jax.jit, static_argnames=("n_slots",))
def exact_position_marginals(logits: jax.Array, n_slots: int, *, where: jax.Array | None = None) -> jax.Array:
    """Exact ``P(a_l = d)`` for every slot and item (exponential-race quadrature).

    Args:
      logits: ``[.., D]`` scores.
      n_slots: ``L``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., L, D]``; exact to about 1e-6, differentiable.

    Examples:
      >>> import jax.numpy as jnp
      >>> p = exact_position_marginals(jnp.zeros(4), 2)
      >>> bool(jnp.allclose(p, 0.25, atol=1e-5))
      True
    """
    n_items = logits.shape[-1]
    items = jnp.broadcast_to(jnp.arange(n_items, dtype=jnp.int32), logits.shape)
    per_item = exact_ranked_item_marginals(logits, items, n_slots, where=where)
    return jnp.swapaxes(per_item, -1, -2)


def position_marginals(
    logits: jax.Array,
    n_slots: int,
    *,
    key: jax.Array | None = None,
    n_samples: int = 1000,
    method: str = "auto",
    where: jax.Array | None = None,
    max_exact_cost: float = 2e8,
) -> PositionMarginals:
    """Position marginals ``P(a_l = d)``, exact where affordable, estimated otherwise.

    ``method="auto"`` uses the exact quadrature while its cost ``Q * D^2 * L`` per row
    (times rows) stays below ``max_exact_cost`` and the estimator otherwise; the returned
    ``method`` field says which was used.

    Args:
      logits: ``[.., D]`` scores.
      n_slots: ``L``.
      key: PRNG key, required when the estimator is used.
      n_samples: samples for the estimator.
      method: ``"auto"``, ``"exact"`` or ``"estimate"``.
      where: optional bool ``[.., D]`` mask.
      max_exact_cost: the ``auto`` switch-over, in multiply-adds.

    Returns:
      [`PositionMarginals`][PositionMarginals] with ``probs`` ``[.., L, D]``.
    """
    if method not in ("auto", "exact", "estimate"):
        raise ValueError(f"method must be 'auto', 'exact' or 'estimate', got {method!r}")
    n_items = logits.shape[-1]
    rows = math.prod(logits.shape[:-1])
    if method == "auto":
        cost = rows * QUADRATURE_NODES * n_items * n_items * n_slots
        method = "exact" if cost <= max_exact_cost else "estimate"
    if method == "exact":
        return PositionMarginals(exact_position_marginals(logits, n_slots, where=where), "exact-quadrature", 0)
    if key is None:
        raise ValueError("key is required to estimate position marginals")
    probs = estimate_position_marginals(key, logits, n_slots, n_samples, where=where)
    return PositionMarginals(probs, "estimated-rao-blackwell", n_samples)
