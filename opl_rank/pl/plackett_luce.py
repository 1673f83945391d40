"""Plackett-Luce (PL) ranking math: sampling, prefix log-probabilities, placement
probabilities, and exact enumeration for tiny problems. Position marginals
``P(a_l = d)`` are in [`opl_rank.pl.marginals`][opl_rank.pl.marginals].

Pure, jit-able JAX functions on arrays. The last axis of ``logits`` is items (``D``),
the last axis of ``rankings`` is slots (``L``, best first); any leading axes are batch.
All PL math is done in float32 log space and stays finite at any logit scale.

Masks: ``where`` is a bool ``[.., D]`` array, True for real items. An item is *valid* when
``where`` is True and its logit is not ``-inf``. Invalid items are never sampled before a
valid one. When a row has fewer valid items than ``L``, the trailing slots hold invalid
(padding) items; such a slot contributes probability 1 (log-probability 0) to the prefix
probability, and its placement row is all ``-inf``.

PL model with scores s (docs/maths.md §1.4):
    pi(a | x) = prod_{l=1..L} exp(s(a_l)) / sum_{d not in a_{1:l-1}} exp(s(d)).
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank import tuning
from opl_rank.reductions import first_argmax_short

__all__ = [
    "valid_items",
    "one_hot_rankings",
    "sum_samples",
    "mean_samples",
    "tile_samples",
    "safe_logsumexp",
    "sample_rankings",
    "slot_log_probs",
    "slot_log_probs_and_rest",
    "prefix_log_probs",
    "placement_log_probs",
    "all_rankings",
    "enumerate_ranking_probs",
    "enumerate_position_marginals",
]

_NEG_INF = -jnp.inf


# ----------------------------------------------------------------------------------------
# Small numerically safe helpers
# ----------------------------------------------------------------------------------------
def valid_items(logits: jax.Array, where: jax.Array | None = None) -> jax.Array:
    """Bool ``[.., D]``: item is real (``where``) and has a logit above ``-inf``."""
    valid = logits > _NEG_INF
    if where is not None:
        valid = jnp.logical_and(valid, where)
    return valid


def safe_logsumexp(x: jax.Array, axis: int = -1) -> jax.Array:
    """``logsumexp`` that returns ``-inf`` (with zero, not NaN, gradients) when all inputs
    along ``axis`` are ``-inf``.

    Args:
      x: float array; ``-inf`` entries are ignored.
      axis: the axis reduced.

    Returns:
      ``x`` with ``axis`` removed.
    """
    m = jnp.max(x, axis=axis, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    s = jnp.sum(jnp.exp(x - m), axis=axis)
    pos = s > 0
    s_safe = jnp.where(pos, s, 1.0)
    return jnp.where(pos, jnp.log(s_safe) + jnp.squeeze(m, axis), _NEG_INF)


def _safe_logaddexp(a: jax.Array, b: jax.Array) -> jax.Array:
    """``logaddexp`` with ``-inf`` (and zero gradients) when both inputs are ``-inf``."""
    m = jnp.maximum(a, b)
    m_safe = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    s = jnp.exp(a - m_safe) + jnp.exp(b - m_safe)
    pos = s > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, s, 1.0)) + m_safe, _NEG_INF)


def cumsum_slots(x: jax.Array) -> jax.Array:
    """``jnp.cumsum(x, axis=-1)`` for a short last (slot) axis."""
    if x.shape[-1] > tuning.UNROLLED_CUMSUM_MAX or x.shape[-1] == 0:
        return jnp.cumsum(x, axis=-1)
    out = [x[..., 0]]
    for l in range(1, x.shape[-1]):
        out.append(out[-1] + x[..., l])
    return jnp.stack(out, axis=-1)


# XLA on CPU reduces over a leading axis much slower than it adds the slices one by one
# (docs/performance.md §14): sums over the sample axis -- including the reverse pass of
# broadcasting a row's logits to its N samples -- are unrolled chains of adds, up to
# tuning.UNROLLED_SAMPLES_MAX samples.


def sum_samples(x: jax.Array) -> jax.Array:
    """``jnp.sum(x, axis=0)`` over a short leading (sample) axis, as a chain of adds."""
    if x.shape[0] > tuning.UNROLLED_SAMPLES_MAX or x.shape[0] == 0:
        return jnp.sum(x, axis=0)
    return functools.reduce(lambda a, b: a + b, [x[i] for i in range(x.shape[0])])


def mean_samples(x: jax.Array) -> jax.Array:
    """``jnp.mean(x, axis=0)`` over a short leading (sample) axis (see [`sum_samples`][sum_samples])."""
    return sum_samples(x) / x.shape[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def tile_samples(x: jax.Array, n_samples: int) -> jax.Array:
    """``[..] -> [N, ..]``: ``jnp.broadcast_to(x, (N,) + x.shape)``, whose gradient sums the
    ``N`` cotangents with [`sum_samples`][sum_samples] instead of a reduction over the leading axis."""
    return jnp.broadcast_to(x, (n_samples,) + x.shape)


def _tile_samples_fwd(x, n_samples):
    return tile_samples(x, n_samples), None


def _tile_samples_bwd(n_samples, _, cotangent):
    return (sum_samples(cotangent),)


tile_samples.defvjp(_tile_samples_fwd, _tile_samples_bwd)


def one_hot_rankings(rankings: jax.Array, n_items: int) -> jax.Array:
    """Bool ``[.., L, D]``: ``out[.., l, d] = rankings[.., l] == d``."""
    items = jnp.arange(n_items, dtype=rankings.dtype).reshape((1,) * rankings.ndim + (n_items,))
    return rankings[..., :, None] == items


# ----------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------
def _top_l_indices(scores: jax.Array, n_slots: int) -> jax.Array:
    """Indices of the ``n_slots`` largest entries along the last axis, largest first."""
    n_items = scores.shape[-1]
    if n_items > tuning.ARGMAX_LOOP_MAX_D:
        return jax.lax.top_k(scores, n_slots)[1].astype(jnp.int32)
    if n_slots == 1:  # the same index by elementwise chains (docs/performance.md §31)
        return first_argmax_short(scores)[..., None]
    out = []
    taken = jnp.zeros(scores.shape, dtype=bool)
    items = jnp.arange(n_items, dtype=jnp.int32).reshape((1,) * (scores.ndim - 1) + (n_items,))
    for _ in range(n_slots):
        idx = jnp.argmax(jnp.where(taken, _NEG_INF, scores), axis=-1).astype(jnp.int32)
        out.append(idx)
        taken = jnp.logical_or(taken, idx[..., None] == items)
    return jnp.stack(out, axis=-1)


@functools.partial(jax.jit, static_argnames=("n_slots", "n_samples"))
def sample_rankings(
    key: jax.Array,
    logits: jax.Array,
    n_slots: int,
    *,
    where: jax.Array | None = None,
    n_samples: int | None = None,
) -> jax.Array:
    """Sample PL rankings of length ``n_slots`` with the Gumbel top-L trick.

    Adding i.i.d. Gumbel(0, 1) noise to the logits and taking the ``L`` largest gives an
    exact PL sample (the exponential-race form of PL).

    Args:
      key: a PRNG key (``opl_rank.make_key`` gives a fast philox key).
      logits: ``[.., D]`` float32 scores.
      n_slots: ``L``, a Python int in ``[1, D]``.
      where: optional bool ``[.., D]`` mask of real items.
      n_samples: if given, ``N`` independent rankings per row, stacked in front.

    Returns:
      int32 ``[.., L]`` (or ``[N, .., L]`` with ``n_samples``) item indices, best first.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> r = sample_rankings(jax.random.key(0), jnp.array([9.0, 0.0, -9.0]), 2)
      >>> r.shape, r.dtype
      ((2,), dtype('int32'))
    """
    n_items = logits.shape[-1]
    if not 1 <= n_slots <= n_items:
        raise ValueError(f"n_slots must be in [1, D={n_items}], got {n_slots}")
    shape = logits.shape if n_samples is None else (n_samples,) + logits.shape
    gumbel = jax.random.gumbel(key, shape, dtype=jnp.float32)
    valid = jnp.broadcast_to(valid_items(logits, where), shape)
    logits = jnp.broadcast_to(logits.astype(jnp.float32), shape)
    # Invalid items get the most negative finite score so that they fill trailing slots
    # without ever being chosen twice (the argmax loop marks taken items with -inf).
    scores = jnp.where(valid, logits + gumbel, -jnp.finfo(jnp.float32).max)
    return _top_l_indices(scores, n_slots)


# ----------------------------------------------------------------------------------------
# Probabilities of given rankings
# ----------------------------------------------------------------------------------------
@jax.jit
def slot_log_probs(logits: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """Per-slot log PL factors ``log pi(a_l | a_{1:l-1}) = s_{a_l} - log Z_l``.

    ``log Z_l - s_{a_l} = log( sum_{m >= l} e^{s_{a_m} - s_{a_l}}
    + sum_{d never ranked} e^{s_d - s_{a_l}} )`` is formed from logit *differences* only:
    O(D + L^2) per row, no subtraction of probabilities, and full float32 relative
    precision at any logit scale (a plain ``s - logsumexp`` loses ~1e-3 at logits of 1e4).

    Args:
      logits: ``[.., D]`` scores.
      rankings: int ``[.., L]``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., L]``, ``<= 0``; 0 at padding slots (an invalid item after every valid
      one is placed), ``-inf`` where an invalid item is ranked while a valid one remains.
    """
    return slot_log_probs_and_rest(logits, rankings, where=where)[0]


def slot_log_probs_and_rest(
    logits: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """[`slot_log_probs`][slot_log_probs] and ``log sum_{d never ranked} e^{s_d}`` (``[..]``, ``-inf``
    when every valid item is ranked), which it computes on the way."""
    logits = logits.astype(jnp.float32)
    rankings = rankings.astype(jnp.int32)
    valid = valid_items(logits, where)
    ranked = jnp.take_along_axis(logits, rankings, axis=-1)
    slot_valid = jnp.take_along_axis(valid, rankings, axis=-1)
    ranked = jnp.where(slot_valid, ranked, _NEG_INF)
    ranked_safe = jnp.where(slot_valid, ranked, 0.0)
    n_slots = rankings.shape[-1]
    # Items ranked at or below slot l, relative to a_l: [.., L(l), L(m)].
    later = jnp.arange(n_slots)[None, :] >= jnp.arange(n_slots)[:, None]
    rel = jnp.where(later, ranked[..., None, :] - ranked_safe[..., :, None], _NEG_INF)
    ranked_term = safe_logsumexp(rel, axis=-1)  # >= 0 at valid slots (m = l gives 0)
    # Items never ranked: max_rest - s_l + log sum e^{s_d - max_rest}.
    never = jnp.logical_and(valid, ~jnp.any(one_hot_rankings(rankings, logits.shape[-1]), axis=-2))
    rest = jnp.where(never, logits, _NEG_INF)
    rest_max = jnp.max(rest, axis=-1, keepdims=True)
    has_rest = jnp.isfinite(rest_max)
    rest_max_safe = jax.lax.stop_gradient(jnp.where(has_rest, rest_max, 0.0))
    rest_log_sum = safe_logsumexp(rest - rest_max_safe, axis=-1)[..., None]
    rest_term = jnp.where(has_rest, rest_max_safe - ranked_safe + rest_log_sum, _NEG_INF)
    log_z_minus_s = _safe_logaddexp(ranked_term, rest_term)
    # An invalid item is padding (probability 1) only once every valid item is placed;
    # ranked while a valid one is still available it is impossible (probability 0).
    placed = slot_valid.astype(jnp.int32)
    padding = cumsum_slots(placed) - placed >= jnp.sum(valid.astype(jnp.int32), axis=-1, keepdims=True)
    invalid = jnp.where(padding, 0.0, _NEG_INF)
    slot_lp = jnp.where(slot_valid, jnp.minimum(-jnp.where(slot_valid, log_z_minus_s, 0.0), 0.0), invalid)
    return slot_lp, jnp.where(has_rest[..., 0], rest_max_safe[..., 0] + rest_log_sum[..., 0], _NEG_INF)


def prefix_log_probs(logits: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """Prefix log-probabilities ``log pi(a_{1:l} | x)`` for every ``l``.

    Args:
      logits: ``[.., D]`` scores.
      rankings: int ``[.., L]``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., L]``, non-increasing along slots; the last entry is the log-probability
      of the whole ranking.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = prefix_log_probs(jnp.zeros(3), jnp.array([2, 0]))
      >>> [round(float(v), 4) for v in jnp.exp(lp)]   # 1/3, then 1/3 * 1/2
      [0.3333, 0.1667]
    """
    return cumsum_slots(slot_log_probs(logits, rankings, where=where))


@jax.jit
def placement_log_probs(logits: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """Placement log-probabilities ``log pi(d | a_{1:l-1})`` for every slot and item.

    Formed as ``(s_d - s_{a_l}) + log pi(a_l | a_{1:l-1})``: logit differences plus the
    precise slot factor of [`slot_log_probs`][slot_log_probs].

    Args:
      logits: ``[.., D]`` scores.
      rankings: int ``[.., L]`` (the prefixes; slot ``l`` conditions on ``a_{1:l-1}``).
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., L, D]``; ``-inf`` for items already placed or invalid. Each row
      ``exp(out[.., l, :])`` sums to 1 while valid items remain.
    """
    logits = logits.astype(jnp.float32)
    rankings = rankings.astype(jnp.int32)
    valid = valid_items(logits, where)
    one_hot = one_hot_rankings(rankings, logits.shape[-1])
    # placed_before[.., l, d]: d is among a_{1:l-1}, i.e. its first slot is before l (a
    # min over slots: a cumulative sum becomes a slow reduce-window on CPU).
    n_slots = rankings.shape[-1]
    slots = jnp.arange(n_slots, dtype=jnp.int32).reshape((1,) * (rankings.ndim - 1) + (n_slots, 1))
    first_slot = jnp.min(jnp.where(one_hot, slots, n_slots), axis=-2)  # [.., D]; L: never placed
    placed_before = first_slot[..., None, :] < slots
    available = jnp.logical_and(valid[..., None, :], ~placed_before)  # [.., L, D]
    slot_valid = jnp.take_along_axis(valid, rankings, axis=-1)
    ranked = jnp.where(slot_valid, jnp.take_along_axis(logits, rankings, axis=-1), 0.0)
    factor = slot_log_probs(logits, rankings, where=where)
    logits_safe = jnp.where(valid, logits, 0.0)[..., None, :]
    out = logits_safe - ranked[..., :, None] + factor[..., :, None]
    # A padding slot (an invalid item ranked) has an all -inf row, as documented above.
    available = jnp.logical_and(available, slot_valid[..., None])
    return jnp.where(available, jnp.minimum(out, 0.0), _NEG_INF)


# ----------------------------------------------------------------------------------------
# Exact enumeration (tiny problems, tests)
# ----------------------------------------------------------------------------------------
_MAX_ENUMERATION = 200_000


def all_rankings(n_items: int, n_slots: int) -> np.ndarray:
    """Every ``L``-permutation of ``D`` items, in lexicographic order.

    Args:
      n_items: ``D``.
      n_slots: ``L``.

    Returns:
      int32 ``[D!/(D-L)!, L]``.

    Examples:
      >>> all_rankings(3, 2).shape
      (6, 2)
    """
    if not 1 <= n_slots <= n_items:
        raise ValueError(f"n_slots must be in [1, n_items={n_items}], got {n_slots}")
    count = math.perm(n_items, n_slots)
    if count > _MAX_ENUMERATION:
        raise ValueError(
            f"{count} rankings of length {n_slots} from {n_items} items: too many to enumerate "
            f"(limit {_MAX_ENUMERATION}); use the exact quadrature or the estimator"
        )
    perms = itertools.permutations(range(n_items), n_slots)
    return np.fromiter(itertools.chain.from_iterable(perms), np.int32, count * n_slots).reshape(count, n_slots)


@jax.jit
def enumerate_ranking_probs(logits: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """PL probability of each enumerated ranking.

    Args:
      logits: ``[.., D]`` scores.
      rankings: int ``[P, L]`` (from [`all_rankings`][all_rankings]).
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., P]``; sums to 1 over ``P`` when every row has ``>= L`` valid items.
    """
    batch = logits.shape[:-1]
    expanded = jnp.broadcast_to(logits[..., None, :], batch + (rankings.shape[0], logits.shape[-1]))
    ranks = jnp.broadcast_to(rankings, batch + rankings.shape)
    mask = None if where is None else jnp.broadcast_to(where[..., None, :], expanded.shape)
    return jnp.exp(prefix_log_probs(expanded, ranks, where=mask)[..., -1])


def enumerate_position_marginals(logits: jax.Array, n_slots: int, *, where: jax.Array | None = None) -> jax.Array:
    """Exact ``P(a_l = d)`` by enumerating every ranking (tiny ``D`` only): the reference
    for [`opl_rank.pl.marginals.exact_position_marginals`][opl_rank.pl.marginals.exact_position_marginals].

    Args:
      logits: ``[.., D]`` scores.
      n_slots: ``L``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[.., L, D]``.
    """
    n_items = logits.shape[-1]
    rankings = jnp.asarray(all_rankings(n_items, n_slots))
    probs = enumerate_ranking_probs(logits, rankings, where=where)  # [.., P]
    one_hot = jax.nn.one_hot(rankings, n_items, dtype=jnp.float32)  # [P, L, D]
    return jnp.einsum("...p,pld->...ld", probs, one_hot)
