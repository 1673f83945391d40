"""Short Plackett-Luce prefixes from many samples at once: one inverse-CDF table per row.

The Gumbel sampler ([`opl_rank.pl.plackett_luce.sample_rankings`][opl_rank.pl.plackett_luce.sample_rankings]) draws ``N x D`` random
numbers per row for ``N`` rankings, and the prefixes' log-probabilities form ``N x D``
normalisers. When the prefix is short (``K`` slots, ``K`` much smaller than ``D``) both can
be shared by the ``N`` samples of a row: ``O(D)`` work per row plus ``O(N K^2 log D)``
per sample set, instead of ``O(N D)`` (docs/maths.md §1.6, docs/performance.md §13).

The split that keeps it exact in float32 at any logit scale: the row's ``K`` largest
logits (the *head*) are handled one by one, the other ``D - K`` items (the *tail*) by
one cumulative sum of ``exp(s - max_tail)``. Removing placed head items never subtracts
(their masses are simply left out); removing placed tail items subtracts at most ``K - 1``
tail masses from the tail's total, and since at every slot ``l <= K`` some head item
(each at least as heavy as any tail item) is still unplaced, the remaining normaliser
keeps a relative error within ``D`` float32 roundings -- the order of any float32 sum
over ``D`` items. Sampling draws the category (an unplaced head item or the tail) and
the position inside the tail from two separate uniforms, so a light tail is sampled as
precisely as a heavy one.

Pure, jit-able functions on arrays; leading axes are batch. Masks follow
[`opl_rank.pl.plackett_luce`][opl_rank.pl.plackett_luce]: invalid items are never drawn before a valid one and
fill trailing slots as padding (log-probability 0).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from opl_rank import tuning
from opl_rank.pl.plackett_luce import cumsum_slots, valid_items

__all__ = ["sample_prefixes", "shared_slot_log_probs", "prefix_sampler"]

_NEG_INF = -jnp.inf
# The prefix sampler pays O(D) per row plus O(N K^2 log D) per row's samples; the Gumbel
# sampler O(N D) random numbers and O(N K D) selection, and its log-probabilities N x D
# normalisers. Which wins where is measured in docs/performance.md §13; the thresholds
# are tuning.PREFIX_SAMPLER_MIN_ITEMS and tuning.PREFIX_SAMPLER_MAX_SLOTS.


def prefix_sampler(n_items: int, n_slots: int, method: str = "auto") -> str:
    """``"inverse_cdf"`` (this module) or ``"gumbel"``: which sampler draws ``n_slots``-long
    prefixes from ``n_items`` items. ``"auto"`` picks by cost (see above)."""
    if method in ("inverse_cdf", "gumbel"):
        return method
    if method != "auto":
        raise ValueError(f"method must be 'auto', 'inverse_cdf' or 'gumbel', got {method!r}")
    fast = n_items >= tuning.PREFIX_SAMPLER_MIN_ITEMS and n_slots <= tuning.PREFIX_SAMPLER_MAX_SLOTS
    return "inverse_cdf" if fast else "gumbel"


def _cumsum_items(x: jax.Array) -> jax.Array:
    """Inclusive cumulative sum over the last (item) axis, blocked into small triangular
    matrix products (XLA's CPU cumsum over a long axis is a slow reduce-window)."""
    n = x.shape[-1]
    block = next((b for b in range(32, 15, -1) if n % b == 0), 32) if n > 32 else n  # no padding when one divides D
    pad = (-n) % block
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    blocks = xp.reshape(xp.shape[:-1] + ((n + pad) // block, block))
    upper = jnp.triu(jnp.ones((block, block), x.dtype))
    within = jnp.matmul(blocks, upper, precision=jax.lax.Precision.HIGHEST)
    totals = within[..., -1]
    n_blocks = totals.shape[-1]
    strict = jnp.triu(jnp.ones((n_blocks, n_blocks), x.dtype), 1)
    offsets = jnp.matmul(totals, strict, precision=jax.lax.Precision.HIGHEST)
    return (within + offsets[..., None]).reshape(xp.shape)[..., :n]


def _head_tail(logits: jax.Array, valid: jax.Array, n_slots: int):
    """The row's ``K`` largest valid logits and its tail.

    Returns:
      head ``[.., K]`` int32 item indices (invalid items last when fewer than ``K`` are
      valid); in_tail bool ``[.., D]``; tail_max ``[..]`` (``-inf`` for an empty tail),
      without gradient.
    """
    masked = jnp.where(valid, logits, _NEG_INF)
    _, head = jax.lax.top_k(jax.lax.stop_gradient(masked), n_slots)
    head = head.astype(jnp.int32)
    items = jnp.arange(logits.shape[-1], dtype=jnp.int32).reshape((1,) * head.ndim + (-1,))
    in_head = jnp.any(head[..., :, None] == items, axis=-2)
    in_tail = valid & ~in_head
    tail_max = jax.lax.stop_gradient(jnp.max(jnp.where(in_tail, logits, _NEG_INF), axis=-1))
    return head, in_tail, tail_max


def _tail_weights(logits, in_tail, tail_max):
    """``exp(s_d - max_tail)`` on tail items, 0 elsewhere: ``[.., D]``, each in (0, 1]."""
    shift = jnp.where(jnp.isfinite(tail_max), tail_max, 0.0)[..., None]
    return jnp.where(in_tail, jnp.exp(jnp.where(in_tail, logits - shift, 0.0)), 0.0)


def _gather_rows(table: jax.Array, idx: jax.Array) -> jax.Array:
    """``table [.., D]``, int ``idx [N, .., m]`` -> ``[N, .., m]``: ``table[.., idx]`` per row,
    without broadcasting the table to ``N`` copies."""
    n_items = table.shape[-1]
    rows = table.size // n_items
    offset = (jnp.arange(rows, dtype=jnp.int32) * n_items).reshape((1,) + table.shape[:-1] + (1,))
    return jnp.take(table.reshape(-1), idx + offset, mode="clip")


def _materialised(x: jax.Array) -> jax.Array:
    """``x`` (finite floats), computed once into a buffer. XLA on CPU fuses elementwise
    producers -- here the random-bit rounds -- into *every* consumer and recomputes them
    there (optimization_barrier is expanded before fusion); a reduction is a fusion root, so
    ``max(x, lowest)`` over a stacked pair is not. Exact: it returns ``x`` unchanged."""
    lowest = jnp.full_like(x, -jnp.finfo(x.dtype).max)
    return jnp.max(jnp.stack([x, lowest], axis=-1), axis=-1)


def _sort_small(keys: list[jax.Array], *values: list[jax.Array]) -> tuple[list[jax.Array], ...]:
    """Sort a handful of ``[..]`` arrays by ``keys``, carrying ``values`` along, by
    compare-and-swap passes (an argsort over 2-3 entries costs more than the sampler)."""
    sorted_keys, sorted_values = list(keys), [list(v) for v in values]
    for end in range(len(sorted_keys) - 1, 0, -1):
        for i in range(end):
            swap = sorted_keys[i] > sorted_keys[i + 1]
            for column in [sorted_keys] + sorted_values:
                column[i], column[i + 1] = (
                    jnp.where(swap, column[i + 1], column[i]),
                    jnp.where(swap, column[i], column[i + 1]),
                )
    return sorted_keys, *sorted_values


def _search(cumulative: jax.Array, target: jax.Array) -> jax.Array:
    """Branch-free search: ``#{d : cumulative[.., d] <= target[n, ..]}``: a compare-and-count
    over a coarse grid, then a binary search inside the grid cell (each of its dependent
    gathers is a separate kernel on CPU).

    ``cumulative`` ``[.., D]`` non-decreasing, ``target`` ``[N, ..]``; int32 ``[N, ..]``.
    """
    n_items = cumulative.shape[-1]
    pos = jnp.zeros(target.shape, jnp.int32)
    step = 1 << (n_items.bit_length() - 1)
    coarse = 8 if n_items < 512 else 32  # measured best at D = 100 and D = 1000 (§13)
    if n_items >= 4 * coarse:
        # The first levels at once: count the entries of every coarse-th position at or
        # below the target (a strided slice of the row, compared without a gather).
        grid = cumulative[..., coarse - 1 :: coarse]  # [.., D // coarse]
        pos = coarse * jnp.sum(grid[None] <= target[..., None], axis=-1, dtype=jnp.int32)
        step = coarse // 2
    while step:
        cand = pos + step
        ok = cand <= n_items
        below = _gather_rows(cumulative, (jnp.minimum(cand, n_items) - 1)[..., None])[..., 0] <= target
        pos = jnp.where(ok & below, cand, pos)
        step >>= 1
    return pos


@functools.partial(jax.jit, static_argnames=("n_slots", "n_samples"))
def sample_prefixes(
    key: jax.Array,
    logits: jax.Array,
    n_slots: int,
    n_samples: int,
    *,
    where: jax.Array | None = None,
) -> jax.Array:
    """``N`` PL prefixes of length ``K`` per row, exact in distribution (see module doc).

    Args:
      key: PRNG key.
      logits: ``[.., D]`` float32 scores (not differentiated).
      n_slots: ``K`` in ``[1, D]``.
      n_samples: ``N >= 1``.
      where: optional bool ``[.., D]`` mask of real items.

    Returns:
      int32 ``[N, .., K]`` item indices, best first (the layout of
      ``sample_rankings(..., n_samples=N)``).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> y = sample_prefixes(jax.random.key(0), jnp.zeros((2, 40)), 3, 5)
      >>> y.shape, bool(jnp.all(y[..., 0] != y[..., 1]))
      ((5, 2, 3), True)
    """
    n_items = logits.shape[-1]
    if not 1 <= n_slots <= n_items:
        raise ValueError(f"n_slots must be in [1, D={n_items}], got {n_slots}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    logits = jax.lax.stop_gradient(logits.astype(jnp.float32))
    valid = valid_items(logits, where)
    head, in_tail, tail_max = _head_tail(logits, valid, n_slots)
    weights = _tail_weights(logits, in_tail, tail_max)
    cumulative = _cumsum_items(weights)  # [.., D], read by every search
    tail_total = cumulative[..., -1]
    head_valid = jnp.take_along_axis(valid, head, axis=-1)
    head_logit = jnp.where(head_valid, jnp.take_along_axis(logits, head, axis=-1), _NEG_INF)
    top = jnp.where(head_valid[..., 0], head_logit[..., 0], 0.0)  # the row's largest logit
    head_mass = jnp.exp(head_logit - top[..., None])  # [.., K], 0 for invalid
    tail_scale = jnp.exp(jnp.where(jnp.isfinite(tail_max), tail_max - top, _NEG_INF))  # tail mass unit

    shape = (n_samples,) + logits.shape[:-1]
    uniforms = _materialised(jax.random.uniform(key, shape + (n_slots, 2), dtype=jnp.float32))
    slot_ids = jnp.arange(n_slots, dtype=jnp.int32).reshape((1,) * len(shape) + (n_slots,))
    # Per earlier slot, [N, ..]: the item, and a placed tail item's cumulative weight and
    # weight, read once when it is drawn (0 for head items).
    placed: list[jax.Array] = []
    placed_q: list[jax.Array] = []
    placed_w: list[jax.Array] = []
    head_left = jnp.ones(shape + (n_slots,), bool)
    for slot in range(n_slots):
        removed_total = sum(placed_w, jnp.zeros(shape, jnp.float32))
        tail_left = jnp.maximum(tail_total[None] - removed_total, 0.0)  # [N, ..], in tail units
        masses = jnp.concatenate(
            [jnp.where(head_left, head_mass[None], 0.0), (tail_scale[None] * tail_left)[..., None]], axis=-1
        )  # [N, .., K+1]
        cum = cumsum_slots(masses)
        target = uniforms[..., slot, 0] * cum[..., -1]
        category = jnp.minimum(jnp.sum(cum <= target[..., None], axis=-1), n_slots)  # K: the tail
        # Inside the tail: the first item whose cumulative weight, less the placed tail
        # items' weights up to it, exceeds v. Walk the placed tail items in item order and
        # skip each one that lies before the target.
        v = uniforms[..., slot, 1] * tail_left
        extra = jnp.zeros(shape, jnp.float32)
        if placed:
            order = [jnp.where(w > 0, e, n_items) for e, w in zip(placed, placed_w)]
            keys, qs, ws = _sort_small(order, placed_q, placed_w)
            go_on = jnp.ones(shape, bool)
            for m in range(slot):
                q_r, w_r = qs[m], ws[m]
                skip = go_on & (keys[m] < n_items) & (q_r - (extra + w_r) <= v)
                extra = jnp.where(skip, extra + w_r, extra)
                go_on = skip
        tail_pick = _search(cumulative, _materialised(v + extra))  # [N, ..]; D when rounding ran past the end
        tail_ok = tail_pick < n_items  # a zero-weight (head, invalid) item is never found
        for e in placed:
            tail_ok &= tail_pick != e
        # The first unplaced head item: the fallback for a tail draw that rounding pushed
        # past the end, and the padding item once every valid item is placed.
        # At slot 0 every head item is left: the argmax of that all-True constant would be
        # folded by XLA at compile time (20 s at [2000, 100, 4]), so it is written out.
        first_left = jnp.zeros(shape, jnp.int32) if slot == 0 else jnp.argmax(head_left, axis=-1)
        first_left_item = jnp.sum(jnp.where(slot_ids == first_left[..., None], head[None], 0), axis=-1)
        head_choice = jnp.sum(jnp.where(slot_ids == category[..., None], head[None], 0), axis=-1)
        from_tail = (category == n_slots) & tail_ok
        item = jnp.where(category < n_slots, head_choice, jnp.where(tail_ok, tail_pick, first_left_item))
        at = jnp.minimum(tail_pick, n_items - 1)[..., None]
        placed.append(item)
        placed_q.append(jnp.where(from_tail, _gather_rows(cumulative, at)[..., 0], 0.0))
        placed_w.append(jnp.where(from_tail, _gather_rows(weights, at)[..., 0], 0.0))
        head_left = head_left & (head[None] != item[..., None])
    return jnp.stack(placed, axis=-1)


@jax.jit
def shared_slot_log_probs(logits: jax.Array, prefixes: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """Per-slot log PL factors of ``N`` prefixes per row with normalisers shared by the row.

    Equal to ``slot_log_probs(broadcast(logits), prefixes)`` (values and gradients) at
    ``O(D + N K^2)`` per row instead of ``O(N (D + K^2))``: ``Z_l`` = the unplaced head
    items' masses plus the tail's total less its placed items (see module doc).

    Args:
      logits: ``[.., D]`` scores (differentiated).
      prefixes: int ``[N, .., K]`` prefixes, ``K <= D``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      float32 ``[N, .., K]``, ``<= 0``; 0 at padding slots.
    """
    logits = logits.astype(jnp.float32)
    prefixes = prefixes.astype(jnp.int32)
    n_slots = prefixes.shape[-1]
    valid = valid_items(logits, where)
    head, in_tail, tail_max = _head_tail(logits, valid, n_slots)
    shape = prefixes.shape[:-1]
    weights = _tail_weights(logits, in_tail, tail_max)
    shift = jnp.where(jnp.isfinite(tail_max), tail_max, 0.0)
    tail_total = jnp.sum(weights, axis=-1)
    head_valid = jnp.take_along_axis(valid, head, axis=-1)
    head_logit = jnp.where(head_valid, jnp.take_along_axis(logits, head, axis=-1), _NEG_INF)  # [.., K]
    y_logit = _gather_rows(logits, prefixes)  # [N, .., K]
    y_valid = _gather_rows(valid, prefixes)
    y_tail = _gather_rows(in_tail, prefixes)
    y_weight = jnp.where(y_tail, _gather_rows(weights, prefixes), 0.0)
    is_head = prefixes[..., :, None] == head[None, ..., None, :]  # [N, .., K(slot), K(head)]
    out = []
    removed = jnp.zeros(shape, jnp.float32)
    head_left = jnp.ones(shape + (n_slots,), bool)
    n_valid = jnp.sum(valid, axis=-1)
    for slot in range(n_slots):
        left = tail_total[None] - removed  # the tail less its placed items, in tail units
        log_left = jnp.where(left > 0, shift[None] + jnp.log(jnp.where(left > 0, left, 1.0)), _NEG_INF)
        terms = jnp.concatenate([jnp.where(head_left, head_logit[None], _NEG_INF), log_left[..., None]], axis=-1)
        ref = jax.lax.stop_gradient(jnp.max(terms, axis=-1, keepdims=True))
        ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
        log_z = ref[..., 0] + jnp.log(jnp.sum(jnp.exp(terms - ref), axis=-1))
        factor = jnp.minimum(jnp.where(y_valid[..., slot], y_logit[..., slot], 0.0) - log_z, 0.0)
        padding = slot >= n_valid[None]  # every valid item already placed
        out.append(jnp.where(y_valid[..., slot], factor, jnp.where(padding, 0.0, _NEG_INF)))
        removed = removed + y_weight[..., slot]
        head_left = head_left & ~is_head[..., slot, :]
    return jnp.stack(out, axis=-1)
