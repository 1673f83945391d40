"""Ranking metrics (DCG@k, NDCG@k, average precision) of deterministic rankings, and position weights.

Pure, jit-able JAX functions. The last axis of ``scores``/``labels`` is documents (``D``),
leading axes are batch (queries); metrics return one value per query, ``[..]`` float32.
``where`` is an optional bool ``[.., D]`` mask, True for real documents: masked documents
are ranked after every real one and have zero gain, so a metric on a row equals the metric
on that row with the masked documents dropped. Labels are assumed non-negative.
``dcg_at_k`` and ``ndcg_at_k`` share one function compiled per (shapes, ``k``, ``gain``);
inside ``jit`` pass ``k`` and ``gain`` as static Python values.

Position weights ``alpha_k`` (``[K]`` float32, position ``k = 1..K`` first) plug into the
exposure estimators and the exposure-based losses (Eq. 4 of the exposure-based RL paper).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = [
    "dcg_position_weights",
    "dcg_weights",
    "precision_weights",
    "dcg_at_k",
    "ndcg_at_k",
    "average_precision",
]


def dcg_position_weights(n_slots: int) -> jax.Array:
    """DCG position weights ``alpha_l = 1 / log2(l + 1)``, ``l = 1..L``.

    Returns:
      float32 ``[L]``.

    Examples:
      >>> [round(float(a), 4) for a in dcg_position_weights(3)]
      [1.0, 0.6309, 0.5]
    """
    return 1.0 / jnp.log2(jnp.arange(2, n_slots + 2, dtype=jnp.float32))


#: DCG position weights ``1 / log2(l + 1)``, ``l = 1..k`` (float32 ``[k]``); the same
#: function as [`dcg_position_weights`][dcg_position_weights].
dcg_weights = dcg_position_weights

_GAINS = ("exp2", "linear")


def precision_weights(k: int) -> jax.Array:
    """Precision@k position weights ``alpha_l = 1/k`` for ``l = 1..k``.

    With these weights ``sum_l alpha_l rho_{y_l}`` is precision@k of ranking ``y`` for
    binary relevance ``rho`` (and Eq. 6's ``rho^T E`` its expectation).

    Args:
      k: number of positions (``>= 1``).

    Returns:
      float32 ``[k]``.

    Examples:
      >>> [float(w) for w in precision_weights(4)]
      [0.25, 0.25, 0.25, 0.25]
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return jnp.full((k,), 1.0 / k, dtype=jnp.float32)


def _gains(labels: jax.Array, gain: str) -> jax.Array:
    labels = jnp.asarray(labels).astype(jnp.float32)
    if gain == "exp2":
        return jnp.exp2(labels) - 1.0
    if gain == "linear":
        return labels
    raise ValueError(f"gain must be one of {_GAINS}, got {gain!r}")


def _cutoff(scores: jax.Array, labels: jax.Array, k: int) -> int:
    """``min(k, D)`` (validated), so that every ``k >= D`` shares one compiled function."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return min(int(k), jnp.broadcast_shapes(jnp.shape(scores), jnp.shape(labels))[-1])


def _row_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """``sum_l x[.., l] w[l]`` with the 1-D ``w`` reshaped to ``x``'s rank (no promotion)."""
    return jnp.sum(x * w.reshape((1,) * (x.ndim - 1) + w.shape), axis=-1)


@functools.partial(jax.jit, static_argnames=("k", "gain"))
def _dcg_and_ndcg(
    scores: jax.Array, labels: jax.Array, k: int, where: jax.Array | None, gain: str
) -> tuple[jax.Array, jax.Array]:
    """``(DCG@k, NDCG@k)``, each float32 ``[..]`` (one compiled function for both)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scores = jnp.asarray(scores).astype(jnp.float32)
    gains = _gains(labels, gain)
    if where is None:
        scores, gains = jnp.broadcast_arrays(scores, gains)
        valid = jnp.ones(scores.shape, dtype=bool)
    else:
        scores, gains, valid = jnp.broadcast_arrays(scores, gains, jnp.asarray(where).astype(bool))
    gains = jnp.where(valid, gains, 0.0)
    n_docs = scores.shape[-1]
    kk = min(k, n_docs)
    # Sort keys, lexicographic: real documents first, then score descending (NaN as -inf,
    # -0.0 == 0.0), then document index ascending (deterministic tie-break).
    neg = -jnp.where(jnp.isnan(scores), -jnp.inf, scores)
    neg = jnp.where(neg == 0.0, 0.0, neg)
    index = jnp.broadcast_to(jnp.arange(n_docs, dtype=jnp.int32), scores.shape)
    _, _, _, ranked_gains = jax.lax.sort(
        (jnp.logical_not(valid).astype(jnp.int32), neg, index, gains),
        dimension=scores.ndim - 1,
        num_keys=3,
    )
    discount = dcg_position_weights(kk)
    dcg = _row_dot(ranked_gains[..., :kk], discount)
    ideal_gains, _ = jax.lax.top_k(gains, kk)
    ideal = _row_dot(ideal_gains, discount)
    positive = ideal > 0.0
    return dcg, jnp.where(positive, dcg / jnp.where(positive, ideal, 1.0), 0.0)


def dcg_at_k(
    scores: jax.Array,
    labels: jax.Array,
    k: int,
    *,
    where: jax.Array | None = None,
    gain: str = "exp2",
) -> jax.Array:
    """DCG@k of the deterministic ranking that sorts ``scores`` in descending order.

    ``DCG@k = sum_{r=1}^{min(k, D)} g(label_{y_r}) / log2(r + 1)`` with gain
    ``g(l) = 2^l - 1`` (``gain="exp2"``, the LETOR convention) or ``g(l) = l``
    (``gain="linear"``, scikit-learn's ``dcg_score``), i.e. the DCG position weights
    ([`dcg_weights`][dcg_weights], the ``alpha_k`` of Eq. 2) applied to the ranked gains.

    Ranking: masked documents are placed after all real ones; equal scores are broken by
    document index (lower index ranked first); NaN scores rank as ``-inf``. ``k`` may
    exceed the number of (valid) documents: the sum then stops at the last document.

    Args:
      scores: ``[.., D]`` ranking scores (higher = ranked higher).
      labels: ``[.., D]`` relevance labels ``>= 0`` (int or float).
      k: cutoff (static, ``>= 1``).
      where: optional bool ``[.., D]``, True for real documents.
      gain: ``"exp2"`` or ``"linear"`` (static).

    Returns:
      float32 ``[..]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> # ranking = docs (1, 0, 2): gains 3, 1, 0 -> 3/1 + 1/log2(3)
      >>> round(float(dcg_at_k(jnp.array([0.5, 0.9, 0.1]), jnp.array([1, 2, 0]), 3)), 4)
      3.6309
    """
    dcg, _ = _dcg_and_ndcg(scores, labels, _cutoff(scores, labels, k), where, gain)
    return dcg


def ndcg_at_k(
    scores: jax.Array,
    labels: jax.Array,
    k: int,
    *,
    where: jax.Array | None = None,
    gain: str = "exp2",
) -> jax.Array:
    """NDCG@k: DCG@k of the ``scores`` ranking divided by the ideal DCG@k.

    ``NDCG@k = DCG@k(scores) / DCG@k(labels)`` (the ideal ranking sorts by label); see
    [`dcg_at_k`][dcg_at_k] for the gains, the discount and the tie-break. Queries whose ideal
    DCG@k is 0 (all labels 0, or no valid documents) get NDCG = 0, as in scikit-learn's
    ``ndcg_score``; the result is never NaN. Values lie in ``[0, 1]``.

    Args:
      scores: ``[.., D]`` ranking scores (higher = ranked higher).
      labels: ``[.., D]`` relevance labels ``>= 0`` (int or float).
      k: cutoff (static, ``>= 1``).
      where: optional bool ``[.., D]``, True for real documents.
      gain: ``"exp2"`` or ``"linear"`` (static).

    Returns:
      float32 ``[..]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> labels = jnp.array([1, 2, 0])
      >>> float(ndcg_at_k(jnp.array([2.0, 3.0, 1.0]), labels, 3))
      1.0
      >>> float(ndcg_at_k(jnp.array([1.0, 2.0, 3.0]), jnp.zeros(3), 3))
      0.0
    """
    _, ndcg = _dcg_and_ndcg(scores, labels, _cutoff(scores, labels, k), where, gain)
    return ndcg


@functools.partial(jax.jit, static_argnames=("threshold",))
def average_precision(
    scores: jax.Array, labels: jax.Array, *, where: jax.Array | None = None, threshold: float = 1.0
) -> jax.Array:
    """Average precision of the ``scores`` ranking (MAP is its mean over queries).

    ``AP = (1 / R) sum_k 1{doc at k relevant} * precision@k`` over the whole list, a
    document being relevant when its label is ``>= threshold`` (default 1: any non-zero
    grade, as LightGBM's ``map``); ``R`` is the number of relevant real documents. Queries
    without relevant documents get 0. Ties break by document index, as in [`dcg_at_k`][dcg_at_k].

    Args:
      scores: ``[.., D]``.
      labels: ``[.., D]`` graded labels.
      where: optional bool ``[.., D]``, True for real documents.
      threshold: relevance threshold on the label (static).

    Returns:
      float32 ``[..]`` in [0, 1].

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(average_precision(jnp.array([3.0, 2.0, 1.0]), jnp.array([1, 0, 1]))), 4)  # (1/1 + 2/3) / 2
      0.8333
    """
    scores = jnp.asarray(scores).astype(jnp.float32)
    relevant = jnp.asarray(labels).astype(jnp.float32) >= jnp.float32(threshold)
    if where is None:
        scores, relevant = jnp.broadcast_arrays(scores, relevant)
        valid = jnp.ones(scores.shape, dtype=bool)
    else:
        scores, relevant, valid = jnp.broadcast_arrays(scores, relevant, jnp.asarray(where).astype(bool))
    relevant = relevant & valid
    n_docs = scores.shape[-1]
    neg = -jnp.where(jnp.isnan(scores), -jnp.inf, scores)
    neg = jnp.where(neg == 0.0, 0.0, neg)
    index = jnp.broadcast_to(jnp.arange(n_docs, dtype=jnp.int32), scores.shape)
    _, _, _, ranked = jax.lax.sort(
        (jnp.logical_not(valid).astype(jnp.int32), neg, index, relevant.astype(jnp.float32)),
        dimension=scores.ndim - 1,
        num_keys=3,
    )
    hits = jnp.cumsum(ranked, axis=-1)
    precision = hits / jnp.arange(1, n_docs + 1, dtype=jnp.float32).reshape((1,) * (scores.ndim - 1) + (n_docs,))
    total = jnp.sum(ranked, axis=-1)
    return jnp.where(total > 0, jnp.sum(precision * ranked, axis=-1) / jnp.maximum(total, 1.0), 0.0)
