"""The unbiased pairwise loss of the pairwise-debiasing paper (docs/maths.md §3.3-3.5).

A pairwise loss sums, over item pairs ``(i, j)`` of a list, four functions of the two
scores picked by the pair's type ``s(b_i, b_j)`` (one-hot over (1,1), (1,0), (0,1), (0,0)):
``l(f_i, f_j)^T s(b_i, b_j)``. Computed from clicks ``c = e * r`` it is biased by the
examination ``e``. With ``p_i``, ``p_j`` the examination probabilities of the pair's ranks
and ``p_ij`` their joint examination probability, the matrix

    A = [[a_ij,                 0,       0,       0],
         [a_i - a_ij,           a_i,     0,       0],
         [a_j - a_ij,           0,       a_j,     0],
         [1 - a_i - a_j + a_ij, 1 - a_i, 1 - a_j, 1]],   a_i = 1/p_i, a_ij = 1/p_ij,

the inverse of ``E[B(e_i, e_j)]``, gives ``E[A s(c_i, c_j)] = s(r_i, r_j)``: the loss
``sum_pairs l^T A s(c)`` equals the loss on the true relevance in expectation.

Lists are given in rank order: ``scores[:, k]`` is the model's score of the item shown at
rank ``k + 1``, so examination probabilities are per rank (``[K]``, ``[K, K]``) or per list.
For families with ``l11 = l00 = 0`` and ``l01(x, y) = l10(y, x)`` (RankNet, hinge) only pairs
with a clicked item contribute: [`unbiased_pairwise_loss`][unbiased_pairwise_loss] then works on the clicked
rows only, ``O(C * K)`` per list with ``C = max_clicks``, instead of all ``K^2`` pairs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = [
    "PAIR_LOSSES",
    "CORRECTIONS",
    "pair_types",
    "correction_matrix",
    "expected_distortion",
    "pairwise_loss",
    "unbiased_pairwise_loss",
]

PairLoss = Callable[[jax.Array, jax.Array], jax.Array]  # (f_i, f_j) -> [..., 4] (l11, l10, l01, l00)


def _ranknet(f_i: jax.Array, f_j: jax.Array) -> jax.Array:
    zero = jnp.zeros_like(f_i - f_j)
    return jnp.stack([zero, jax.nn.softplus(f_j - f_i), jax.nn.softplus(f_i - f_j), zero], axis=-1)


def _hinge(f_i: jax.Array, f_j: jax.Array) -> jax.Array:
    zero = jnp.zeros_like(f_i - f_j)
    return jnp.stack([zero, jax.nn.relu(1.0 - (f_i - f_j)), jax.nn.relu(1.0 - (f_j - f_i)), zero], axis=-1)


# Built-in families; all have l11 = l00 = 0 and l01(x, y) = l10(y, x) (the clicked-rows path).
PAIR_LOSSES: dict[str, PairLoss] = {"ranknet": _ranknet, "hinge": _hinge}
CORRECTIONS = ("joint", "individual", "none")


def pair_types(b_i: jax.Array, b_j: jax.Array) -> jax.Array:
    """``s(b_i, b_j)``: one-hot ``[..., 4]`` over (1,1), (1,0), (0,1), (0,0)."""
    b_i, b_j = jnp.asarray(b_i, bool), jnp.asarray(b_j, bool)
    return jnp.stack([b_i & b_j, b_i & ~b_j, ~b_i & b_j, ~b_i & ~b_j], axis=-1).astype(jnp.float32)


def expected_distortion(p_i: jax.Array, p_j: jax.Array, p_ij: jax.Array) -> jax.Array:
    """``E[B(e_i, e_j)]``: ``[..., 4, 4]``; entry ``(t1, t2)`` is the probability that a pair of
    relevance type ``t2`` shows as click type ``t1``."""
    p_i, p_j, p_ij = jnp.broadcast_arrays(*(jnp.asarray(p, jnp.float32) for p in (p_i, p_j, p_ij)))
    zero, one = jnp.zeros_like(p_i), jnp.ones_like(p_i)
    rows = [
        [p_ij, zero, zero, zero],
        [p_i - p_ij, p_i, zero, zero],
        [p_j - p_ij, zero, p_j, zero],
        [1 - p_i - p_j + p_ij, 1 - p_i, 1 - p_j, one],
    ]
    return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def correction_matrix(p_i: jax.Array, p_j: jax.Array, p_ij: jax.Array, correction: str = "joint") -> jax.Array:
    """``A``: ``[..., 4, 4]`` from examination probabilities (no matrix inversion).

    ``correction``: ``"joint"`` (the paper's A, unbiased), ``"individual"`` (inverse
    propensity on the clicked item of a (1,0) / (0,1) pair only -- clicked-clicked pairs
    dropped, Unbiased-LambdaMART style; biased), ``"none"`` (the identity: the naive click loss).
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    p_i, p_j, p_ij = jnp.broadcast_arrays(*(jnp.asarray(p, jnp.float32) for p in (p_i, p_j, p_ij)))
    if correction == "none":
        return jnp.broadcast_to(jnp.eye(4, dtype=jnp.float32), p_i.shape + (4, 4))
    a_i, a_j, a_ij = 1.0 / p_i, 1.0 / p_j, 1.0 / p_ij
    zero, one = jnp.zeros_like(a_i), jnp.ones_like(a_i)
    first = [a_ij, a_i - a_ij, a_j - a_ij, 1 - a_i - a_j + a_ij]
    if correction == "individual":
        first = [zero, zero, zero, zero]
    rows = [
        [first[0], zero, zero, zero],
        [first[1], a_i, zero, zero],
        [first[2], zero, a_j, zero],
        [first[3], 1 - a_i, 1 - a_j, one],
    ]
    return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def _family(pair_loss: str | PairLoss) -> tuple[PairLoss, bool]:
    """The family's function and whether it is a built-in zero-tie family."""
    if callable(pair_loss):
        return pair_loss, False
    if pair_loss not in PAIR_LOSSES:
        raise ValueError(f"pair_loss must be one of {sorted(PAIR_LOSSES)} or a callable, got {pair_loss!r}")
    return PAIR_LOSSES[pair_loss], True


def _upper_pairs(mask: jax.Array) -> jax.Array:
    """``[n, K, K]`` True for pairs ``i < j`` of real items."""
    k = mask.shape[-1]
    upper = jnp.triu(jnp.ones((k, k), bool), 1)
    return upper[None] & mask[:, :, None] & mask[:, None, :]


def _check(scores: jax.Array, labels: jax.Array, mask: jax.Array | None) -> jax.Array:
    if scores.ndim != 2:
        raise ValueError(f"scores must be [n, K], got shape {scores.shape}")
    if labels.shape != scores.shape:
        raise ValueError(f"labels/clicks must have the scores' shape {scores.shape}, got {labels.shape}")
    if mask is None:
        return jnp.ones(scores.shape, bool)
    if mask.shape != scores.shape:
        raise ValueError(f"mask must have the scores' shape {scores.shape}, got {mask.shape}")
    return jnp.asarray(mask, bool)


def pairwise_loss(
    scores: jax.Array, labels: jax.Array, *, where: jax.Array | None = None, pair_loss: str | PairLoss = "ranknet"
) -> jax.Array:
    """``sum_{i < j} l(f_i, f_j)^T s(b_i, b_j)`` per list (no debiasing).

    Args:
      scores: ``[n, K]`` model scores.
      labels: ``[n, K]`` binary labels (true relevance, or clicks for the naive loss).
      where: ``[n, K]`` bool, True for real items (default all).
      pair_loss: a name in [`PAIR_LOSSES`][PAIR_LOSSES] or ``(f_i, f_j) -> [..., 4]``.

    Returns:
      ``[n]`` float32 per-list losses.
    """
    mask = _check(scores, labels, where)
    fn, _ = _family(pair_loss)
    terms = fn(scores[:, :, None], scores[:, None, :])  # [n, K, K, 4]
    s = pair_types(labels[:, :, None], labels[:, None, :])
    return jnp.sum(jnp.where(_upper_pairs(mask), jnp.sum(terms * s, axis=-1), 0.0), axis=(1, 2))


def unbiased_pairwise_loss(
    scores: jax.Array,
    clicks: jax.Array,
    examination: jax.Array,
    joint_examination: jax.Array,
    *,
    where: jax.Array | None = None,
    pair_loss: str | PairLoss = "ranknet",
    correction: str = "joint",
    max_clicks: int | None = None,
) -> jax.Array:
    """``sum_{i < j} l(f_i, f_j)^T A_ij s(c_i, c_j)`` per list (the paper's Eq. 10).

    Args:
      scores: ``[n, K]`` model scores of the items in rank order.
      clicks: ``[n, K]`` binary clicks.
      examination: ``[K]`` or ``[n, K]`` examination probabilities p_i in (0, 1].
      joint_examination: ``[K, K]`` or ``[n, K, K]`` p_ij in (0, 1] (diagonal unused).
      where: ``[n, K]`` bool, True for real items (default all).
      pair_loss: a name in [`PAIR_LOSSES`][PAIR_LOSSES] (clicked-rows path) or a callable
        ``(f_i, f_j) -> [..., 4]`` (all ``K^2`` pairs).
      correction: see [`correction_matrix`][correction_matrix].
      max_clicks: clicked-rows path only: at most this many clicks per list are read
        (static; default ``K``, always exact). Lists with more clicks must not occur:
        checked when the arrays are concrete.

    Returns:
      ``[n]`` float32 per-list losses; their mean over lists is unbiased for the mean of
      [`pairwise_loss`][pairwise_loss] on the true relevance (``correction="joint"``).
    """
    mask = _check(scores, clicks, where)
    n, k = scores.shape
    p = jnp.broadcast_to(jnp.asarray(examination, jnp.float32), (n, k))
    p_joint = jnp.broadcast_to(jnp.asarray(joint_examination, jnp.float32), (n, k, k))
    clicks = jnp.asarray(clicks, bool) & mask
    if not isinstance(p, jax.core.Tracer):
        _check_probabilities(p, p_joint, mask)
        if max_clicks is not None and int(jnp.max(jnp.sum(clicks, axis=1))) > max_clicks:
            raise ValueError(
                f"a list has {int(jnp.max(jnp.sum(clicks, axis=1)))} clicks, more than max_clicks={max_clicks}"
            )
    fn, zero_ties = _family(pair_loss)
    if not zero_ties:  # any family: every pair
        a = correction_matrix(p[:, :, None], p[:, None, :], p_joint, correction)  # [n, K, K, 4, 4]
        terms = fn(scores[:, :, None], scores[:, None, :])  # [n, K, K, 4]
        s = pair_types(clicks[:, :, None], clicks[:, None, :])
        per_pair = jnp.einsum("nijt,nijtu,niju->nij", terms, a, s)
        return jnp.sum(jnp.where(_upper_pairs(mask), per_pair, 0.0), axis=(1, 2))
    return _clicked_rows_loss(scores, clicks, p, p_joint, mask, fn, correction, max_clicks or k)


def _check_probabilities(p: jax.Array, p_joint: jax.Array, mask: jax.Array) -> None:
    real = mask[:, :, None] & mask[:, None, :]
    if not bool(jnp.all(jnp.where(mask, (p > 0) & (p <= 1), True))):
        raise ValueError("examination probabilities must be in (0, 1] for every real item")
    if not bool(jnp.all(jnp.where(real, (p_joint > 0) & (p_joint <= 1), True))):
        raise ValueError("joint_examination probabilities must be in (0, 1] for every pair of real items")


@functools.partial(jax.jit, static_argnames=("fn", "correction", "max_clicks"))
def _clicked_rows_loss(scores, clicks, p, p_joint, mask, fn, correction, max_clicks):
    """Pairs with at least one click, as rows ``i`` (clicked) x columns ``j`` (any other).

    With ``l11 = l00 = 0`` and ``l01(x, y) = l10(y, x)``, a clicked-clicked pair's term
    ``(a_i - a_ij) l10(f_i, f_j) + (a_j - a_ij) l01(f_i, f_j)`` splits into one term per
    ordered pair, and a clicked / non-clicked pair's term is ``a_i l10(f_i, f_j)``.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    n, k = scores.shape
    rows = jnp.argsort(~clicks, axis=1, stable=True)[:, :max_clicks]  # clicked ranks first: [n, C]
    row_clicked = jnp.take_along_axis(clicks, rows, axis=1)  # [n, C]
    f_row = jnp.take_along_axis(scores, rows, axis=1)
    l10 = fn(f_row[:, :, None], scores[:, None, :])[..., 1]  # [n, C, K]
    a_row = 1.0 / jnp.take_along_axis(p, rows, axis=1)  # [n, C]
    a_pair = 1.0 / jnp.take_along_axis(p_joint, rows[:, :, None], axis=1)  # [n, C, K]
    col_clicked = clicks[:, None, :]
    if correction == "joint":
        weight = jnp.where(col_clicked, a_row[:, :, None] - a_pair, a_row[:, :, None])
    elif correction == "individual":
        weight = jnp.where(col_clicked, 0.0, a_row[:, :, None])
    else:
        weight = jnp.where(col_clicked, 0.0, 1.0)
    keep = row_clicked[:, :, None] & mask[:, None, :] & (rows[:, :, None] != jnp.arange(k)[None, None, :])
    return jnp.sum(jnp.where(keep, weight * l10, 0.0), axis=(1, 2))
