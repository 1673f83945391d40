"""Best completions of ranking prefixes under a pairwise-interaction value (R-POD Eq. 13).

The value of a ranking ``a`` (length L) is

    f(a) = sum_l alpha_l [ g(a_l) + sum_{m != l} V(a_m, a_l) ]

with item values ``g`` ``[.., n, D]``, a zero-diagonal interaction ``V`` ``[D, D]`` and
position weights ``alpha`` ``[L]``. It is both the pairwise reward model f_hat and the
synthetic environment's true expected reward (``g = theta_a^T x + b_a``, the item coefficients ``theta``, ``V = lambda W``), so
the second stage and the environment's optimum V* share this code.

For a prefix ``p`` (length k) and a tail ``t``, ``f = const(p) + sum_j U[t_j, j] +
sum_{j != j'} alpha_{k+j} V(t_j', t_j)`` with ``U[d, j] = alpha_{k+j} (g(d) + sum_m
V(p_m, d)) + sum_m alpha_m V(d, p_m)`` ([`slot_gains`][slot_gains]). Exact completion scores all
``(D-k)!/(D-L)!`` tails by two matrix products; beyond ``max_enumerated`` tails a beam
search keeps the ``beam_width`` best partial rankings (1 = greedy).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank import tuning
from opl_rank.reductions import first_argmax

__all__ = [
    "slot_gains",
    "complete_exact",
    "complete_beam",
    "complete_last_slot",
    "complete",
    "best_rankings_beam",
    "one_hot_sum",
    "zero_diagonal",
    "prefix_layout",
    "prefix_table",
    "prefix_table_values",
]


def zero_diagonal(v: jax.Array) -> jax.Array:
    """``[D, D]`` with the diagonal set to 0."""
    return v * (1.0 - jnp.eye(v.shape[-1], dtype=v.dtype))


def one_hot_sum(items: jax.Array, n_items: int, weights: jax.Array | None = None) -> jax.Array:
    """``sum_m w_m e_{items_m}``: int ``[.., K]`` (and ``[K]`` weights) -> float32 ``[.., D]``."""
    one_hot = jax.nn.one_hot(items, n_items, dtype=jnp.float32)  # [.., K, D]
    if weights is None:
        return jnp.sum(one_hot, axis=-2)
    return jnp.einsum("...kd,k->...d", one_hot, weights)


def slot_gains(
    g: jax.Array, v: jax.Array, alpha: jax.Array, placed: jax.Array, weighted: jax.Array, first_slot: int, n_slots: int
) -> jax.Array:
    """``U``: what each item adds at each of ``n_slots`` slots from ``first_slot`` on.

    Args:
      g: ``[.., D]`` item values.
      v: ``[D, D]`` zero-diagonal interaction.
      alpha: ``[L]`` position weights.
      placed: ``[.., D]`` ``sum_m e_{p_m}`` of the prefix.
      weighted: ``[.., D]`` ``sum_m alpha_m e_{p_m}``.
      first_slot: a Python int.
      n_slots: a Python int.

    Returns:
      ``[.., D, n_slots]``.
    """
    tail_alpha = alpha[first_slot : first_slot + n_slots].reshape((1,) * g.ndim + (n_slots,))
    return (g + placed @ v)[..., None] * tail_alpha + (weighted @ v.T)[..., None]


def complete_exact(g: jax.Array, v: jax.Array, alpha: jax.Array, prefixes: jax.Array) -> jax.Array:
    """The argmax tail of every prefix by enumeration: ``[.., n, D], [D, D], [L], int [.., n, k]
    -> int32 [.., n, L - k]`` (the first best tail in lexicographic order of its items).

    Tails of the free items (``(D-k)!/(D-L)!``, ``O((D-k)^2)`` each) need ``V`` restricted to
    each prefix's free items first: small batched matrix products. Two-item tails instead
    enumerate pairs of any items (``D (D-1)``), read each one's value by gathers, mask those
    holding a prefix item, and share ``V``'s part of a tail's value across rows and prefixes:
    the same tails and ties, ~3x faster at D = 10, k = 3 (docs/performance.md §30), while at
    most ``tuning.ALL_ITEM_TAILS_RATIO`` times as many tails. Longer tails keep the free items
    (there all items' tails measured slower)."""
    n_items = g.shape[-1]
    k = prefixes.shape[-1]
    rest = alpha.shape[0] - k
    if rest == 2 and math.perm(n_items, rest) <= tuning.ALL_ITEM_TAILS_RATIO * math.perm(n_items - k, rest):
        return _complete_exact_all_items(g, v, alpha, prefixes)
    n_free = n_items - k
    # Tails as ranks among the free items: the same patterns for every prefix.
    patterns = np.array(list(itertools.permutations(range(n_free), rest)), np.int32)  # [C, rest]
    rows = np.arange(len(patterns))
    unary = np.zeros((len(patterns), n_free, rest), np.float32)
    unary[rows[:, None], patterns, np.arange(rest)[None, :]] = 1.0
    pair = np.zeros((len(patterns), n_free, n_free, rest), np.float32)  # (c, from, to, slot of "to")
    for j in range(rest):
        for j2 in range(rest):
            if j != j2:
                pair[rows, patterns[:, j2], patterns[:, j], j] = 1.0
    pair_alpha = jnp.asarray(pair) @ alpha[k:]  # [C, F, F]

    placed = one_hot_sum(prefixes, n_items)
    weighted = one_hot_sum(prefixes, n_items, alpha[:k])
    # free[.., f, d] = 1 if d is the f-th free item (one-hot, no sort or gather).
    is_free = 1.0 - placed
    rank = jnp.cumsum(is_free, axis=-1) - 1.0
    slot_ids = jnp.arange(n_free, dtype=jnp.float32).reshape((1,) * (rank.ndim - 1) + (n_free, 1))
    free = is_free[..., None, :] * (rank[..., None, :] == slot_ids).astype(jnp.float32)  # [.., n, F, D]
    gains_free = free @ slot_gains(g, v, alpha, placed, weighted, k, rest)  # [.., n, F, rest]
    v_free = free @ v @ jnp.swapaxes(free, -1, -2)  # [.., n, F, F]
    scores = jnp.einsum("...fj,cfj->...c", gains_free, jnp.asarray(unary)) + jnp.einsum(
        "...ab,cab->...c", v_free, pair_alpha
    )
    free_items = jnp.round(free @ jnp.arange(n_items, dtype=jnp.float32)).astype(jnp.int32)  # [.., n, F]
    best = jnp.asarray(patterns)[first_argmax(scores)]  # [.., n, rest]
    return jnp.take_along_axis(free_items, best, axis=-1)


def _complete_exact_all_items(g: jax.Array, v: jax.Array, alpha: jax.Array, prefixes: jax.Array) -> jax.Array:
    """[`complete_exact`][complete_exact] over tails of all ``D`` items, those holding a prefix item masked."""
    n_items = g.shape[-1]
    k = prefixes.shape[-1]
    rest = alpha.shape[0] - k
    tails = np.array(list(itertools.permutations(range(n_items), rest)), np.int32)  # [C, rest], lexicographic
    # sum_{j != j'} alpha_{k+j} V(t_j', t_j): the same for every row and prefix
    pair = jnp.zeros(len(tails), v.dtype)
    for j in range(rest):
        for j2 in range(rest):
            if j != j2:
                pair = pair + v[tails[:, j2], tails[:, j]] * alpha[k + j]
    pair = pair.reshape((-1,) + (1,) * (g.ndim - 1))  # [C, 1..]
    placed = one_hot_sum(prefixes, n_items)
    weighted = one_hot_sum(prefixes, n_items, alpha[:k])
    # tails on the leading axis: where XLA's gathers put them (a trailing axis costs transposes)
    gains = jnp.moveaxis(slot_gains(g, v, alpha, placed, weighted, k, rest), -2, 0)  # [D, .., n, rest]
    scores = sum(gains[tails[:, j], ..., j] for j in range(rest)) + pair  # [C, .., n]
    taken = sum(jnp.moveaxis(placed, -1, 0)[tails[:, j]] for j in range(rest)) > 0.5  # holds a prefix item
    return jnp.asarray(tails)[first_argmax(jnp.where(taken, -jnp.inf, scores), axis=0)]


def complete_last_slot(g: jax.Array, v: jax.Array, alpha: jax.Array, prefixes: jax.Array) -> jax.Array:
    """The best last item after ``L - 1`` placed ones: ``[.., n, D], [D, D], [L], int [.., n, L-1]
    -> int32 [.., n, 1]``, the free item of largest ``U`` (the lowest index on a tie, as
    [`complete_exact`][complete_exact]). ``O(D^2)`` per prefix: a lone tail item has no pair
    term, so nothing of [`complete_exact`][complete_exact]'s ``O(D^3)`` is needed."""
    n_items = g.shape[-1]
    k = prefixes.shape[-1]
    placed = one_hot_sum(prefixes, n_items)
    weighted = one_hot_sum(prefixes, n_items, alpha[:k])
    gain = slot_gains(g, v, alpha, placed, weighted, k, 1)[..., 0]  # [.., n, D]
    return jnp.argmax(jnp.where(placed > 0, -jnp.inf, gain), axis=-1).astype(jnp.int32)[..., None]


def complete_beam(g: jax.Array, v: jax.Array, alpha: jax.Array, prefixes: jax.Array, beam_width: int) -> jax.Array:
    """Beam search slot by slot, partial rankings scored exactly by their own f (later
    slots not yet placed): same shapes as [`complete_exact`][complete_exact]."""
    n_items = g.shape[-1]
    k = prefixes.shape[-1]
    placed = one_hot_sum(prefixes, n_items)[..., None, :]  # [.., n, B=1, D]
    weighted = one_hot_sum(prefixes, n_items, alpha[:k])[..., None, :]
    g = g[..., None, :]
    tails = jnp.zeros(placed.shape[:-1] + (0,), jnp.int32)  # [.., n, B, s]
    score = jnp.zeros(placed.shape[:-1], jnp.float32)  # relative to the prefix's value
    for slot in range(k, alpha.shape[0]):
        gain = slot_gains(g, v, alpha, placed, weighted, slot, 1)[..., 0]  # [.., n, B, D]
        total = jnp.where(placed > 0, -jnp.inf, score[..., None] + gain)
        width = min(beam_width, total.shape[-2] * (n_items - slot))
        score, flat = jax.lax.top_k(total.reshape(total.shape[:-2] + (-1,)), width)
        parent, item = flat // n_items, flat % n_items
        keep = lambda a: jnp.take_along_axis(a, parent[..., None], axis=-2)
        added = jax.nn.one_hot(item, n_items, dtype=jnp.float32)
        placed, weighted = keep(placed) + added, keep(weighted) + alpha[slot] * added
        tails = jnp.concatenate([keep(tails), item[..., None].astype(jnp.int32)], axis=-1)
    return tails[..., 0, :]  # top_k sorts: the best beam first


def _beam_rows(g, v, v_t, scale, alpha, beam_width: int) -> jax.Array:
    """[`complete_beam`][complete_beam] from an empty prefix for ``[n, D]`` rows with ``V = scale v``,
    in ``O(B D L)`` per row: each beam carries ``sum_m V[p_m, :]`` and ``sum_m alpha_m V[:, p_m]``
    (rows of ``v`` and ``v^T`` gathered as items are placed) instead of multiplying its one-hot
    prefix by ``V`` (``O(B D^2)`` per slot). ``V``'s diagonal never counts: it only meets
    items already placed, which are excluded."""
    n, n_items = g.shape
    score = jnp.zeros((n, 1), jnp.float32)
    into = jnp.zeros((n, 1, n_items), jnp.float32)  # sum_m V[p_m, d]
    out_of = jnp.zeros((n, 1, n_items), jnp.float32)  # sum_m alpha_m V[d, p_m]
    taken = jnp.zeros((n, 1, n_items), bool)
    tails = jnp.zeros((n, 1, 0), jnp.int32)
    keep = jax.vmap(lambda rows, index: rows[index])  # whole rows, not element by element
    for slot in range(alpha.shape[0]):
        total = jnp.where(taken, -jnp.inf, score[..., None] + (g[:, None, :] + into) * alpha[slot] + out_of)
        width = min(beam_width, total.shape[1] * (n_items - slot))
        score, flat = jax.lax.top_k(total.reshape(n, -1), width)
        parent, item = flat // n_items, flat % n_items
        into = keep(into, parent) + scale * v[item]
        out_of = keep(out_of, parent) + (scale * alpha[slot]) * v_t[item]
        taken = keep(taken, parent) | (item[..., None] == jnp.arange(n_items)[None, None, :])
        tails = jnp.concatenate([keep(tails, parent), item[..., None].astype(jnp.int32)], axis=-1)
    return tails[:, 0, :]  # top_k sorts: the best beam first


@functools.partial(jax.jit, static_argnames=("beam_width",))
def _beam_batches(rows, v, v_t, scale, alpha, beam_width: int) -> jax.Array:
    """[`_beam_rows`][_beam_rows] over ``[batches, batch, D]`` rows, one batch at a time."""
    return jax.lax.map(lambda part: _beam_rows(part, v, v_t, scale, alpha, beam_width), rows)


def best_rankings_beam(
    g: jax.Array,
    v: jax.Array | np.ndarray,
    alpha: jax.Array | np.ndarray,
    *,
    beam_width: int = 64,
    scale: float | jax.Array = 1.0,
    v_t: jax.Array | np.ndarray | None = None,
    max_floats: int = 2**22,
) -> jax.Array:
    """The beam search of [`complete_beam`][complete_beam] from an empty prefix, for many items.

    The same search and the same rankings (up to float rounding) at ``O(B D L)`` per row
    instead of ``O(B D^2 L)``; rows go through in batches of about ``max_floats / (B D)``.
    Nothing of size ``D^2`` is formed when ``v_t`` is given.

    Args:
      g: ``[n, D]`` item values.
      v: ``[D, D]`` interaction (its diagonal is ignored); the search uses ``scale * v``.
      alpha: ``[L]`` position weights.
      beam_width: partial rankings kept.
      scale: a scalar multiplying ``v`` (e.g. ``lambda``).
      v_t: ``v``'s transpose when already at hand (repeated calls; ``v`` itself when
        symmetric); formed here otherwise.
      max_floats: the per-batch budget of beam state.

    Returns:
      int32 ``[n, L]``.
    """
    v = jnp.asarray(v, jnp.float32)
    v_t = jnp.transpose(v) + 0.0 if v_t is None else jnp.asarray(v_t, jnp.float32)  # rows, not strided columns
    n, n_items = g.shape
    batch = max(1, min(n, max_floats // (beam_width * n_items)))
    pad = -n % batch
    rows = jnp.concatenate([g, jnp.repeat(g[-1:], pad, axis=0)]) if pad else g
    out = _beam_batches(
        rows.reshape(-1, batch, n_items),
        v,
        v_t,
        jnp.asarray(scale, jnp.float32),
        jnp.asarray(alpha, jnp.float32),
        beam_width=beam_width,
    )
    return out.reshape(-1, alpha.shape[0])[:n]


def complete(
    g: jax.Array, v: jax.Array, alpha: jax.Array, prefixes: jax.Array, *, max_enumerated: int = 512, beam_width: int = 4
) -> tuple[jax.Array, str]:
    """Prefixes followed by their best tails, and ``"exact"`` or ``"beam"``.

    Args:
      g: ``[.., n, D]`` item values.
      v: ``[D, D]`` interaction (its diagonal is ignored).
      alpha: ``[L]`` position weights.
      prefixes: int ``[.., n, k]``, ``0 <= k <= L``.
      max_enumerated: enumerate when there are at most this many tails.
      beam_width: beam search otherwise.

    Returns:
      ``(int [.., n, L], method)``.
    """
    n_items, n_slots, k = g.shape[-1], alpha.shape[0], prefixes.shape[-1]
    if k == n_slots:
        return prefixes, "exact"
    v = zero_diagonal(v)
    if k == n_slots - 1:  # one slot left: its best item is U's argmax, no tails to enumerate
        return jnp.concatenate(
            [prefixes, complete_last_slot(g, v, alpha, prefixes).astype(prefixes.dtype)], -1
        ), "exact"
    if math.perm(n_items - k, n_slots - k) <= max_enumerated:
        tails, method = complete_exact(g, v, alpha, prefixes), "exact"
    else:
        tails, method = complete_beam(g, v, alpha, prefixes, beam_width), "beam"
    return jnp.concatenate([prefixes, tails.astype(prefixes.dtype)], axis=-1), method


@functools.lru_cache(maxsize=64)
def prefix_layout(n_items: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every prefix of ``k`` distinct items, and each one's column in a per-row table.

    Returns:
      ``(prefixes, column)``: int32 ``[P, k]`` with ``P = D!/(D-k)!`` (lexicographic order),
      and int32 ``[D^k]``: the column of the prefix whose base-``D`` digits are ``a_1..a_k``
      (0 for a tuple that repeats an item, which a PL policy never samples).
    """
    prefixes = np.array(list(itertools.permutations(range(n_items), k)), np.int32).reshape(-1, k)
    column = np.zeros(n_items**k, np.int32)
    column[prefixes @ (n_items ** np.arange(k - 1, -1, -1))] = np.arange(len(prefixes), dtype=np.int32)
    return prefixes, column


def prefix_table_values(table: jax.Array, prefixes: jax.Array, n_items: int) -> jax.Array:
    """Per-row values of prefixes, read from a table: ``[n, P], int [.., n, k] -> [.., n]``.

    ``table[i, p]`` belongs to row ``i`` and the ``p``-th prefix of [`prefix_layout`][prefix_layout].
    """
    k = prefixes.shape[-1]
    digits = jnp.asarray(n_items ** np.arange(k - 1, -1, -1), prefixes.dtype).reshape((1,) * (prefixes.ndim - 1) + (k,))
    columns = jnp.asarray(prefix_layout(n_items, k)[1])[jnp.sum(prefixes * digits, axis=-1)]  # [.., n]
    n = columns.shape[-1]
    flat = columns.reshape(-1, n).T  # [n, S]: rows first, as the table
    return jnp.take_along_axis(table, flat, axis=1).T.reshape(columns.shape)


def prefix_table(
    value_of: Callable[[jax.Array, jax.Array, jax.Array | None], jax.Array],
    context: jax.Array,
    where: jax.Array | None,
    n_items: int,
    k: int,
    floats_per_prefix: int,
) -> jax.Array:
    """Every row's value of every top-``k`` prefix: float32 ``[n, P]``, columns as in [`prefix_layout`][prefix_layout].

    Args:
      value_of: ``(context [1, dx], prefixes int [P, 1, k], where [1, D] | None) -> [P]``: one row's values.
      context: ``[n, dx]``.
      where: bool ``[n, D]`` candidates, or None.
      n_items: D.
      k: prefix length.
      floats_per_prefix: intermediates per prefix of ``value_of`` (sizes the chunks of rows,
        ``tuning.PREFIX_TABLE_CHUNK_FLOATS`` floats each).
    """
    prefixes = jnp.asarray(prefix_layout(n_items, k)[0])[:, None, :]  # [P, 1, k]

    def row_values(row):
        return value_of(row["context"][None], prefixes, None if row["where"] is None else row["where"][None])

    per_row = prefixes.shape[0] * floats_per_prefix
    rows = {"context": context, "where": where}
    return jax.lax.map(
        row_values, rows, batch_size=max(1, min(context.shape[0], tuning.PREFIX_TABLE_CHUNK_FLOATS // per_row))
    )
