"""R-POD's two error sources, measured (R-POD Thm. 3.2 and Prop. 3.4; docs/maths.md §1.20).

R-POD(k) trades the reward model's bias below the top ``k`` against the variance of the top-k
importance weights. Two numbers say where a fit stands on that trade-off:

- **CPC violation** (bias): conditional pairwise correctness asks ``Delta_q(x, a, b) =
  Delta_f(x, a, b)`` for every pair of rankings ``a, b`` that share their top ``k``.
  [`cpc_violation`][cpc_violation] is ``E |Delta_q - Delta_f|`` over such pairs, with ``a ~ pi_0``
  and ``b`` the same top ``k`` with its bottom ``L - k`` redrawn from ``pi_0`` given that prefix
  (the rankings the logs show, and the ones R-POD's residual term compares), on the
  simulator's exact ``q`` (no noise). It is 0 at ``k = L`` for any ``f_hat``.
- **ESS of the top-k weights** (variance): [`ess_fraction`][ess_fraction] is Kish's effective sample
  size ``(sum w)^2 / sum w^2`` over ``n``, for ``w = pi_1st(a_{1:k} | x) / pi_0(a_{1:k} | x)``
  on the logged rounds: 1 for equal weights (and at ``k = 0``), near ``1 / n`` when one
  round carries the estimate.

Pure array functions; the environment's ``q`` and the fitted ``f_hat`` come in as arrays.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from opl_rank.pl import plackett_luce as pl

__all__ = ["shared_prefix_pairs", "cpc_violation", "ess_fraction", "log_prefix_weights"]


@functools.partial(jax.jit, static_argnames=("k", "n_slots", "n_pairs"))
def shared_prefix_pairs(
    key: jax.Array, logging_logits: jax.Array, k: int, n_slots: int, n_pairs: int
) -> tuple[jax.Array, jax.Array]:
    """Pairs of rankings that share their top ``k``: ``a ~ PL(logits)`` and ``b`` with
    ``b_{1:k} = a_{1:k}`` and ``b_{k+1:L}`` drawn from PL over the other items (``pi_0``'s
    conditional law given the prefix).

    Args:
      key: PRNG key.
      logging_logits: ``[m, D]`` float32 logits of ``pi_0`` per context.
      k: shared prefix length in ``[0, L]``.
      n_slots: ``L`` in ``[1, D]``.
      n_pairs: pairs per context ``P``.

    Returns:
      ``(a, b)``, int32 ``[P, m, L]`` each.
    """
    n_items = logging_logits.shape[-1]
    if not 1 <= n_slots <= n_items:
        raise ValueError(f"n_slots must be in [1, D={n_items}], got {n_slots}")
    if not 0 <= k <= n_slots:
        raise ValueError(f"k must be in [0, L={n_slots}], got {k}")
    k_a, k_b = jax.random.split(key)
    a = pl.sample_rankings(k_a, logging_logits, n_slots, n_samples=n_pairs)  # [P, m, L]
    if k == n_slots:
        return a, a
    items = jnp.arange(n_items).reshape((1,) * a.ndim + (n_items,))
    taken = jnp.any(a[..., :k, None] == items, axis=-2)  # [P, m, D]
    others = jnp.broadcast_to(jnp.logical_not(taken), a.shape[:-1] + (n_items,))
    tail = pl.sample_rankings(k_b, jnp.broadcast_to(logging_logits[None], others.shape), n_slots - k, where=others)
    return a, jnp.concatenate([a[..., :k], tail], axis=-1).astype(jnp.int32)


@jax.jit
def cpc_violation(q_a: jax.Array, q_b: jax.Array, f_a: jax.Array, f_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(E |Delta_q - Delta_f|, E |Delta_q|)`` over pairs sharing a top k.

    Args:
      q_a, q_b: ``[...]`` float32 true values ``q(x, a)``, ``q(x, b)`` (position-weighted sums).
      f_a, f_b: ``[...]`` float32 the reward model's ``f_hat(x, a)``, ``f_hat(x, b)``.

    Returns:
      The mean absolute violation of CPC and, as its scale, the mean absolute true
      difference (their ratio: the share of the differences that ``f_hat`` gets wrong).
    """
    delta_q = q_a - q_b
    return jnp.mean(jnp.abs(delta_q - (f_a - f_b))), jnp.mean(jnp.abs(delta_q))


@jax.jit
def ess_fraction(log_weights: jax.Array) -> jax.Array:
    """Kish's effective sample size over ``n``, ``(sum w)^2 / (n sum w^2)``, in log space.

    Args:
      log_weights: ``[n]`` float32 log importance weights (finite).

    Returns:
      ``[]`` float32 in ``[1/n, 1]``.
    """
    n = log_weights.shape[0]
    log_ess = 2.0 * jax.nn.logsumexp(log_weights) - jax.nn.logsumexp(2.0 * log_weights)
    return jnp.exp(log_ess) / n


def log_prefix_weights(log_pi_prefix: jax.Array, log_pi0_prefix: jax.Array, k: int) -> jax.Array:
    """``log w = log pi(a_{1:k} | x) - log pi_0(a_{1:k} | x)``: ``[n], [n, L] -> [n]`` (zeros at ``k = 0``).

    Args:
      log_pi_prefix: ``[n]`` the target's log-probability of each logged top ``k``.
      log_pi0_prefix: ``[n, L]`` ``LoggedData.log_pi0_prefix``.
      k: prefix length in ``[0, L]``.
    """
    n_slots = log_pi0_prefix.shape[-1]
    if not 0 <= k <= n_slots:
        raise ValueError(f"k must be in [0, L={n_slots}], got {k}")
    if k == 0:
        return jnp.zeros(log_pi0_prefix.shape[:1], jnp.float32)
    return log_pi_prefix - log_pi0_prefix[:, k - 1]
