"""Exposure-based ranking losses (Oosterhuis, "exposure-based RL to rank", section 3.2).

Every loss is a function of an exposure vector ``E [.., D]``, where ``E_d`` is the
expected position weight of document ``d`` under a ranking policy (Eq. 4), so it composes
with any exposure estimator (exact marginals, Monte-Carlo, the exposure-based policy
gradient): the losses only see arrays. The last axis is documents (``D``), leading axes
are batch (queries); each loss returns one value per query, ``[..]`` float32. Average over
queries yourself (Eq. 7: ``mean_q L(E_q, rho_q)``).

Masks: ``where`` is an optional bool ``[.., D]`` array, True for real documents. Masked
entries are ignored entirely (their values may be anything, even NaN) and a loss on a row
equals the loss on that row with the masked documents dropped. ``D`` in the ``2/(D^2-D)``
normalisation is the number of valid documents of the row.

Degenerate rows never give NaN: rows with fewer than two valid documents (no pairs) give 0
for the pairwise losses; rows whose relevance (resp. target exposure) sums to 0 give 0 for
the KL losses; all-masked rows give 0 everywhere. Gradients w.r.t. ``exposure`` are finite,
including at ``E_d = 0`` (documents outside the top-K of a deterministic policy).

Relevance (and target exposure) is assumed non-negative.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = [
    "relevance_loss",
    "frac_fair_loss",
    "prod_fair_loss",
    "kl_fair_loss",
    "kl_distill_loss",
]

_DEFAULT_EPS = 1e-6


def _prepare(x: jax.Array, y: jax.Array, where: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """float32 ``x, y`` broadcast to a common ``[.., D]`` with masked entries set to 0,
    and the bool mask (all True when ``where`` is None)."""
    x = jnp.asarray(x).astype(jnp.float32)
    y = jnp.asarray(y).astype(jnp.float32)
    if where is None:
        x, y = jnp.broadcast_arrays(x, y)
        mask = jnp.ones(x.shape, dtype=bool)
    else:
        x, y, mask = jnp.broadcast_arrays(x, y, jnp.asarray(where).astype(bool))
    zero = jnp.zeros((), jnp.float32)
    return jnp.where(mask, x, zero), jnp.where(mask, y, zero), mask


def _pair_normaliser(mask: jax.Array) -> jax.Array:
    """``2 / (D^2 - D)`` per row (``[..]`` float32), ``0`` when ``D < 2`` (no pairs)."""
    n = jnp.sum(mask, axis=-1, dtype=jnp.float32)
    pairs = n * n - n
    has_pairs = pairs > 0.0
    return jnp.where(has_pairs, 2.0 / jnp.where(has_pairs, pairs, 1.0), 0.0)


def _normalise(x: jax.Array) -> jax.Array:
    """Eq. 10: ``x / ||x||_1`` along the last axis (``x >= 0``); all-zero rows stay 0."""
    total = jnp.sum(x, axis=-1, keepdims=True)
    positive = total > 0.0
    return jnp.where(positive, x / jnp.where(positive, total, 1.0), 0.0)


def _kl(target: jax.Array, exposure: jax.Array, mask: jax.Array, eps: float) -> jax.Array:
    """``-sum_i p_i log((q_i + eps) / (p_i + eps))`` with ``p, q`` the Eq. 10 normalisations
    of ``target`` and ``exposure``; terms with ``p_i = 0`` are 0 (``0 log 0 = 0``)."""
    p = _normalise(target)
    q = _normalise(exposure)
    support = jnp.logical_and(mask, p > 0.0)
    one = jnp.ones((), jnp.float32)
    # eps keeps log finite (and its gradient <= 1/eps) where q_i = 0; it is added to p too
    # so that the loss is 0 at q = p (up to float32 rounding). Off the support the log
    # arguments are set to 1, so no log(0) is ever formed (finite gradients).
    log_q = jnp.log(jnp.where(support, q + eps, one))
    log_p = jnp.log(jnp.where(support, p + eps, one))
    log_ratio = log_q - log_p
    return -jnp.sum(jnp.where(support, p * log_ratio, 0.0), axis=-1)


@jax.jit
def relevance_loss(exposure: jax.Array, relevance: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """Traditional relevance loss, the negative utility ``-rho^T E``.

    Eq. 7: ``L_rel(E, rho) = -sum_d rho_d E_d`` (Eq. 6 is the utility ``U``).

    Args:
      exposure: ``[.., D]`` exposures E.
      relevance: ``[.., D]`` relevances rho.
      where: optional bool ``[.., D]``, True for real documents.

    Returns:
      float32 ``[..]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> float(relevance_loss(jnp.array([1.0, 0.5, 0.0]), jnp.array([1.0, 2.0, 3.0])))
      -2.0
    """
    expo, rho, _ = _prepare(exposure, relevance, where)
    return -jnp.sum(expo * rho, axis=-1)


@functools.partial(jax.jit, static_argnames=("eps",))
def frac_fair_loss(
    exposure: jax.Array,
    relevance: jax.Array,
    *,
    where: jax.Array | None = None,
    eps: float = _DEFAULT_EPS,
) -> jax.Array:
    """Pairwise disparity of exposure-to-relevance ratios.

    Eq. 8: ``L_frac-fair = 2/(D^2-D) sum_{i<j} (E_i/rho_i - E_j/rho_j)^2``.

    Zero relevance makes Eq. 8 undefined; here ``eps`` is added to every relevance,
    ``r_i = E_i / (rho_i + eps)`` (the loss is continuous in ``rho`` and finite). A
    zero-relevance document that receives exposure therefore has a huge ratio and
    dominates the loss (``~ E^2 / eps^2``), pushing its exposure to 0, which is the
    ``rho -> 0`` limit of Eq. 8. Raise ``eps`` to soften this, or use
    [`prod_fair_loss`][prod_fair_loss], which needs no division. With ``eps = 0`` and all
    ``rho > 0`` this is exactly Eq. 8.

    The pairwise sum is computed in O(D) and without cancellation as
    ``sum_{i<j} (r_i - r_j)^2 = D sum_i (r_i - mean(r))^2``, so the loss is
    ``2/(D-1) sum_i (r_i - mean(r))^2``. Rows with ``D < 2`` valid documents give 0.

    Args:
      exposure: ``[.., D]`` exposures E.
      relevance: ``[.., D]`` relevances rho ``>= 0``.
      where: optional bool ``[.., D]``, True for real documents.
      eps: added to ``rho`` in the denominator (static).

    Returns:
      float32 ``[..]``, ``>= 0``.

    Examples:
      >>> import jax.numpy as jnp
      >>> # ratios 1, 0.5, 0: pairs (0.5^2 + 1^2 + 0.5^2) * 2/6 = 0.5
      >>> round(float(frac_fair_loss(jnp.array([1.0, 1.0, 0.0]), jnp.array([1.0, 2.0, 3.0]))), 4)
      0.5
    """
    expo, rho, mask = _prepare(exposure, relevance, where)
    ratio = jnp.where(mask, expo / jnp.where(mask, rho + eps, 1.0), 0.0)
    n = jnp.sum(mask, axis=-1, keepdims=True, dtype=jnp.float32)
    mean = jnp.sum(ratio, axis=-1, keepdims=True) / jnp.maximum(n, 1.0)
    centred = jnp.where(mask, ratio - mean, 0.0)
    pair_sum = n[..., 0] * jnp.sum(centred * centred, axis=-1)
    return _pair_normaliser(mask) * pair_sum


@jax.jit
def prod_fair_loss(exposure: jax.Array, relevance: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """Pairwise disparity of cross products of exposure and relevance (division-free).

    Eq. 9: ``L_prod-fair = 2/(D^2-D) sum_{i<j} (E_i rho_j - E_j rho_i)^2``.

    The pairwise sum is computed in O(D). Lagrange's identity
    ``sum_{i<j} (a_i b_j - a_j b_i)^2 = |a|^2 |b|^2 - (a.b)^2`` cancels catastrophically
    near the optimum ``E ~ rho`` (float32 relative errors of 1e-2 .. 1e2 at
    realistic magnitudes), so the equivalent projection form is used:
    ``|rho|^2 |E - (rho.E / |rho|^2) rho|^2`` (the squared residual is summed,
    never differenced), which is as accurate as the O(D^2) double sum. Rows with
    ``D < 2`` valid documents or with all ``rho = 0`` give 0.

    Args:
      exposure: ``[.., D]`` exposures E.
      relevance: ``[.., D]`` relevances rho.
      where: optional bool ``[.., D]``, True for real documents.

    Returns:
      float32 ``[..]``, ``>= 0``.

    Examples:
      >>> import jax.numpy as jnp
      >>> # pairs: (1*2 - 0*1)^2 = 4, (1*3 - 0*1)^2 = 9, (0*3 - 0*2)^2 = 0; * 2/6
      >>> round(float(prod_fair_loss(jnp.array([1.0, 0.0, 0.0]), jnp.array([1.0, 2.0, 3.0]))), 4)
      4.3333
    """
    expo, rho, mask = _prepare(exposure, relevance, where)
    rho_sq = jnp.sum(rho * rho, axis=-1, keepdims=True)
    has_rho = rho_sq > 0.0
    coef = jnp.sum(rho * expo, axis=-1, keepdims=True) / jnp.where(has_rho, rho_sq, 1.0)
    residual = expo - coef * rho  # masked entries: 0 - c * 0 = 0
    pair_sum = jnp.where(has_rho, rho_sq, 0.0)[..., 0] * jnp.sum(residual * residual, axis=-1)
    return _pair_normaliser(mask) * pair_sum


@functools.partial(jax.jit, static_argnames=("eps",))
def kl_fair_loss(
    exposure: jax.Array,
    relevance: jax.Array,
    *,
    where: jax.Array | None = None,
    eps: float = _DEFAULT_EPS,
) -> jax.Array:
    """KL divergence from the normalised relevance to the normalised exposure.

    Eq. 11 with Eq. 10 (``E' = E/||E||_1``, ``rho' = rho/||rho||_1``):
    ``L_KL-fair = -sum_i rho'_i log(E'_i / rho'_i)``.

    Terms with ``rho'_i = 0`` contribute 0 (``0 log 0 = 0``). ``eps`` is added inside
    the log to both normalised vectors, ``log((E'_i + eps) / (rho'_i + eps))``, so the
    loss and its gradient w.r.t. ``exposure`` stay finite where ``E_i = 0`` (the log's
    derivative is at most ``1/eps``), and the loss is 0 at ``E' = rho'`` (up to
    float32 rounding). It is invariant to scaling ``exposure`` or ``relevance`` by a
    positive constant. Rows whose relevance sums to 0 give 0; an all-zero exposure row is
    treated as ``E' = 0`` (finite loss ``~ -log eps``, zero gradient).

    Args:
      exposure: ``[.., D]`` exposures E ``>= 0``.
      relevance: ``[.., D]`` relevances rho ``>= 0``.
      where: optional bool ``[.., D]``, True for real documents.
      eps: smoothing inside the log (static).

    Returns:
      float32 ``[..]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> expo, rho = jnp.array([3.0, 1.0, 0.5]), jnp.array([1.0, 1.0, 0.0])
      >>> # rho' = (1/2, 1/2, 0), E' = (2/3, 2/9, 1/9): 0.5 log(3/4) + 0.5 log(9/4)
      >>> round(float(kl_fair_loss(expo, rho, eps=0.0)), 4)
      0.2616
    """
    expo, rho, mask = _prepare(exposure, relevance, where)
    return _kl(rho, expo, mask, eps)


@functools.partial(jax.jit, static_argnames=("eps",))
def kl_distill_loss(
    exposure: jax.Array,
    target_exposure: jax.Array,
    *,
    where: jax.Array | None = None,
    eps: float = _DEFAULT_EPS,
) -> jax.Array:
    """KL divergence from a target (teacher) exposure distribution to the exposure.

    Eq. 12 with Eq. 10: ``L_KL-distill = -sum_i E*'_i log(E'_i / E*'_i)``.

    Same conventions as [`kl_fair_loss`][kl_fair_loss] with ``rho`` replaced by ``E*``:
    documents with zero target exposure (e.g. outside the teacher's top-K) contribute 0,
    ``eps`` smooths the log, the loss is 0 when ``exposure`` is proportional to
    ``target_exposure``, and rows whose target sums to 0 give 0.

    Args:
      exposure: ``[.., D]`` exposures E ``>= 0``.
      target_exposure: ``[.., D]`` target exposures E* ``>= 0``.
      where: optional bool ``[.., D]``, True for real documents.
      eps: smoothing inside the log (static).

    Returns:
      float32 ``[..]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> target = jnp.array([1.0, 0.63, 0.5, 0.0])
      >>> abs(round(float(kl_distill_loss(2.0 * target, target)), 6))  # proportional: 0
      0.0
      >>> round(float(kl_distill_loss(jnp.array([1.0, 1.0, 1.0, 1.0]), target)), 4)
      0.3308
    """
    expo, target, mask = _prepare(exposure, target_exposure, where)
    return _kl(target, expo, mask, eps)
