"""Policy-gradient estimators for Plackett-Luce rankers (exposure paper, Secs. 3.5-5, App. A).

Each estimator is a function of ``logits [.., D]`` returning a value whose ``jax.grad``
is that estimator's gradient (the "magic box": the value is the stop-gradient estimate,
the gradient comes from a surrogate). Utilities are ``U(pi) = E_y sum_k theta_k rho_{y_k}``
with ``theta`` the ``[K]`` position weights and ``rho`` per-document rewards (relevance);
exposure is ``theta_d = E_y[theta_{rank(d)}]`` (Eq. 4), a ``[.., D]`` vector whose Jacobian
is the exposure estimator.

All of them sample ``N`` top-K rankings per query with [`plackett_luce.sample_rankings`][plackett_luce.sample_rankings]
and use the shared prefix/placement functions of [`opl_rank.pl.plackett_luce`][opl_rank.pl.plackett_luce] (float32, log
space, masks). Leave-one-out baselines (Eq. 20) are over the ``N`` samples of a query and
are on by default (``baseline=False`` turns them off). Samples are drawn from the
stop-gradient logits; gradients flow only through the log-probabilities.

Estimators (gradient of the expected utility):
  standard_utility            Eq. 23: complete rankings as actions.
  placement_utility           Eq. 25: rankings as placement trajectories.
  marginalize_first_utility   Eq. 27: exact first position, sampled rest.
  marginalize_all_utility     Eq. 30: every position marginalized over sampled prefixes.
  exposure                    Eqs. 32-33 (``corrected=False``: the published Eq. 33,
                              biased with baselines) or App. A Eqs. 36-39 / Figure 8
                              (``corrected=True``, default: a (K+1)-th "not placed" outcome).
  exposure_utility            Eq. 35: rho . exposure.
  plrank3_utility             Eq. 21: PL-Rank-3 custom gradient (baseline method; its
                              denominators are kept in log space, so it stays finite and
                              accurate in float32 at any logit gap).
  sampled_policy_gradient     the score-function estimator for any ranking-level reward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from opl_rank.pl import plackett_luce as pl
from opl_rank.pl import prefix_sampling

__all__ = [
    "GRADIENT_ESTIMATORS",
    "ESTIMATORS",
    "standard_utility",
    "placement_utility",
    "marginalize_first_utility",
    "marginalize_all_utility",
    "exposure",
    "exposure_utility",
    "plrank3_utility",
    "sampled_policy_gradient",
    "leave_one_out_mean",
    "magic_box",
]

sg = jax.lax.stop_gradient


def magic_box(value: jax.Array, surrogate: jax.Array) -> jax.Array:
    """Value of ``value`` (exactly), gradient of ``surrogate``: ``sg(v) + (s - sg(s))``."""
    return sg(value) + (surrogate - sg(surrogate))


def leave_one_out_mean(x: jax.Array) -> jax.Array:
    """``b_i = 1/(N-1) sum_{j != i} x_j`` over the leading (sample) axis (Eq. 20).

    Args:
      x: ``[N, ..]`` with ``N >= 2``.

    Returns:
      ``[N, ..]``, without gradient.
    """
    n = x.shape[0]
    total = pl.sum_samples(x)[None]
    return sg((total - x) / (n - 1))


class _Samples:
    """Sampled top-K rankings with their log-probabilities (differentiable in logits)."""

    def __init__(self, logits, key, n_slots, n_samples, where):
        batch = logits.shape
        self.n_samples = n_samples
        self.row_logits, self.row_where = logits.astype(jnp.float32), where
        self.logits = pl.tile_samples(logits.astype(jnp.float32), n_samples)
        self.where = None if where is None else jnp.broadcast_to(where, (n_samples,) + batch)
        # Short prefixes from many items: one inverse-CDF table per row, shared by the N
        # samples, also for their log-probabilities (docs/performance.md §13).
        self.shared = prefix_sampling.prefix_sampler(batch[-1], n_slots) == "inverse_cdf"
        if self.shared:
            self.rankings = prefix_sampling.sample_prefixes(key, sg(logits), n_slots, n_samples, where=where)
        else:
            self.rankings = pl.sample_rankings(key, sg(logits), n_slots, where=where, n_samples=n_samples)
        valid = pl.valid_items(self.logits, self.where)
        self.slot_valid = jnp.take_along_axis(valid, self.rankings, axis=-1)  # [N, .., K]
        self.valid = valid  # [N, .., D]

    def log_prefix(self) -> jax.Array:
        """``[N, .., K]`` log pi(y_{1:k})."""
        if self.shared:
            return pl.cumsum_slots(
                prefix_sampling.shared_slot_log_probs(self.row_logits, self.rankings, where=self.row_where)
            )
        return pl.prefix_log_probs(self.logits, self.rankings, where=self.where)

    def log_prefix_before(self) -> jax.Array:
        """``[N, .., K]`` log pi(y_{1:k-1}) (0 at k = 1)."""
        lp = self.log_prefix()
        return jnp.concatenate([jnp.zeros_like(lp[..., :1]), lp[..., :-1]], axis=-1)

    def log_placement(self) -> jax.Array:
        """``[N, .., K, D]`` log pi(d | y_{1:k-1}); ``-inf`` exactly where d is unavailable."""
        return pl.placement_log_probs(self.logits, self.rankings, where=self.where)

    def placement(self) -> jax.Array:
        """``[N, .., K, D]`` pi(d | y_{1:k-1})."""
        return jnp.exp(self.log_placement())

    def ranked(self, per_item: jax.Array) -> jax.Array:
        """``[.., D] -> [N, .., K]`` values of the ranked documents (0 at padding slots)."""
        per_item = jnp.broadcast_to(per_item.astype(jnp.float32), self.logits.shape)
        return jnp.where(self.slot_valid, jnp.take_along_axis(per_item, self.rankings, axis=-1), 0.0)


def _check(position_weight: jax.Array, n_items: int, n_samples: int, baseline: bool) -> int:
    if position_weight.ndim != 1:
        raise ValueError(f"position_weight must be [K], got shape {position_weight.shape}")
    n_slots = position_weight.shape[0]
    if not 1 <= n_slots <= n_items:
        raise ValueError(f"len(position_weight) = K = {n_slots} must be in [1, D = {n_items}]")
    if n_samples < (2 if baseline else 1):
        raise ValueError(
            f"n_samples must be >= {2 if baseline else 1} (leave-one-out baselines need 2), got {n_samples}"
        )
    return n_slots


def _expand(theta: jax.Array, like: jax.Array) -> jax.Array:
    """``[K] -> [1, .., 1, K]`` with the rank of ``like``."""
    return theta.astype(jnp.float32).reshape((1,) * (like.ndim - 1) + theta.shape)


_DOC = """
    Args:
      logits: ``[.., D]`` float32 scores of the PL policy.
      relevance: ``[.., D]`` per-document rewards rho.
      position_weight: ``[K]`` theta (e.g. top-K DCG weights); ``K`` is the sampled length.
      key: PRNG key.
      n_samples: ``N`` sampled rankings per query (``>= 2`` with baselines).
      where: optional bool ``[.., D]`` mask of real documents.
      baseline: leave-one-out baseline corrections (Eq. 20-style) on or off.

    Returns:
      ``[..]`` float32 utility estimate per query; its gradient is the estimator's.
"""


def _with_doc(fn):
    fn.__doc__ = fn.__doc__ + _DOC
    return fn


@functools.partial(jax.jit, static_argnames=("n_samples", "baseline"))
@_with_doc
def standard_utility(
    logits: jax.Array,
    relevance: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """Standard policy gradient, complete rankings as actions (Eq. 23)."""
    n_slots = _check(position_weight, logits.shape[-1], n_samples, baseline)
    s = _Samples(logits, key, n_slots, n_samples, where)
    utility = jnp.sum(s.ranked(relevance) * _expand(position_weight, s.rankings), axis=-1)  # [N, ..]
    advantage = utility - leave_one_out_mean(utility) if baseline else utility
    surrogate = pl.mean_samples(sg(advantage) * s.log_prefix()[..., -1])
    return magic_box(pl.mean_samples(utility), surrogate)


@functools.partial(jax.jit, static_argnames=("n_samples", "baseline"))
@_with_doc
def placement_utility(
    logits: jax.Array,
    relevance: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """Placement-trajectory policy gradient (Eq. 25): theta_k (rho_{y_k} - b_k) on log pi(y_{1:k})."""
    n_slots = _check(position_weight, logits.shape[-1], n_samples, baseline)
    s = _Samples(logits, key, n_slots, n_samples, where)
    theta = _expand(position_weight, s.rankings)
    rho = s.ranked(relevance)  # [N, .., K]
    advantage = rho - leave_one_out_mean(rho) if baseline else rho
    surrogate = pl.mean_samples(jnp.sum(sg(theta * advantage) * s.log_prefix(), axis=-1))
    return magic_box(pl.mean_samples(jnp.sum(theta * rho, axis=-1)), surrogate)


@functools.partial(jax.jit, static_argnames=("n_samples", "baseline"))
@_with_doc
def marginalize_first_utility(
    logits: jax.Array,
    relevance: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """Marginalize-first (Eq. 27): the first position exactly, placements after it sampled."""
    n_slots = _check(position_weight, logits.shape[-1], n_samples, baseline)
    s = _Samples(logits, key, n_slots, n_samples, where)
    theta = _expand(position_weight, s.rankings)
    rel = jnp.where(s.valid[0], relevance.astype(jnp.float32), 0.0)
    first = s.placement()[0, ..., 0, :]  # [.., D] pi(d | empty), identical for every sample
    # The b'_0 correction of Eq. 27 changes nothing: sum_d grad pi(d | empty) = 0.
    first_value = position_weight[0] * jnp.sum(first * rel, axis=-1)
    rho = s.ranked(relevance)[..., 1:]
    advantage = rho - leave_one_out_mean(rho) if baseline else rho
    rest_theta = theta[..., 1:]
    surrogate_rest = pl.mean_samples(jnp.sum(sg(rest_theta * advantage) * s.log_prefix()[..., 1:], axis=-1))
    rest_value = pl.mean_samples(jnp.sum(rest_theta * rho, axis=-1))
    return magic_box(first_value + rest_value, first_value + surrogate_rest)


@functools.partial(jax.jit, static_argnames=("n_samples", "baseline"))
@_with_doc
def marginalize_all_utility(
    logits: jax.Array,
    relevance: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """Marginalize-all (Eq. 30): every position's reward marginalized over its sampled prefix.

    The value and the gradient are formed in closed form (a custom reverse pass; the same
    estimator as differentiating the surrogate): for item j,
    ``(1/N) sum_n [sum_k pi_nk(j) (theta_k (rho_j - E_nk) - C_nk) + sum_k C_nk 1{y_nk = j}]``
    with ``E_nk = sum_d pi_nk(d) rho_d``, ``C_nk = sum_{k' > k} theta_k' (E_nk' - b_nk')``
    and ``b`` the leave-one-out baselines. ``pi_nk(d)`` factors into the item's probability
    at its last available slot times a ``[K, K]`` table per sample, so the work is
    ``O(D + K^2)`` per sample, never the ``[N, .., K, D]`` placement probabilities
    (docs/maths.md §2.6; timings: docs/performance.md §14)."""
    n_slots = _check(position_weight, logits.shape[-1], n_samples, baseline)
    s = _Samples(logits, key, n_slots, n_samples, where)
    rel = jnp.where(s.valid[0], relevance.astype(jnp.float32), 0.0)  # [.., D]
    return _marginalize_all(
        logits.astype(jnp.float32), rel, position_weight.astype(jnp.float32), s.rankings, s.valid[0], baseline
    )


def _at_ranked(per_item: jax.Array, rankings: jax.Array):
    """``.at[]`` of ``per_item [N, .., D]`` (flattened to rows) at each row's ranked items
    ``rankings [N, .., K]``: a scatter of ``N K`` entries per row, not a ``[.., K, D]`` one-hot."""
    flat = per_item.reshape(-1, per_item.shape[-1])
    return flat.at[jnp.arange(flat.shape[0])[:, None], rankings.reshape(-1, rankings.shape[-1])]


def _marginalize_all_parts(logits, rel, theta, rankings, valid):
    """The marginalize-all quantities in ``O(D + K^2)`` per sample, without ``[N, .., K, D]``.

    With ``log Z_k`` the log-normaliser of slot ``k`` (``s_{y_k} - log pi(y_k | y_{1:k-1})``),
    an item available at slot ``k`` has ``pi_k(d) = e^{s_d - log Z_k}``. Item ``d``'s last
    available slot is its own slot ``r_d`` if it is placed and ``K - 1`` if not, and
    ``pi_k(d) = pi_{r_d}(d) G[r_d, k]`` with ``G[r, k] = e^{log Z_r - log Z_k}`` (``k <= r``).
    Both factors are ``<= 1`` and formed from logit differences and slot factors (as
    [`plackett_luce.placement_log_probs`][plackett_luce.placement_log_probs] does), so nothing overflows or cancels at any
    logit scale.

    Returns:
      ``factor`` ``[N, .., K]`` log pi_k(y_k); ``prob`` its exp (0 at padding slots); ``gain`` ``[N, .., K, K]`` G; ``rest`` ``[N, .., D]``
      pi_{K-1}(d) for items never placed (0 otherwise); ``ranked_rel`` ``[N, .., K]``;
      ``expected`` ``[N, .., K]`` E_k = sum_d pi_k(d) rho_d; ``total`` ``[N, .., K]``
      sum_d pi_k(d) (1 at real slots, 0 at padding); ``before`` ``[N, .., K]``
      log pi(y_{1:k-1}).
    """
    shape = (rankings.shape[0],) + logits.shape
    many, where = jnp.broadcast_to(logits, shape), jnp.broadcast_to(valid, shape)
    factor = pl.slot_log_probs(many, rankings, where=where)  # [N, .., K]
    slot_valid = jnp.take_along_axis(where, rankings, axis=-1)
    ranked = jnp.where(slot_valid, jnp.take_along_axis(many, rankings, axis=-1), 0.0)
    ranked_rel = jnp.where(slot_valid, jnp.take_along_axis(jnp.broadcast_to(rel, shape), rankings, axis=-1), 0.0)
    n_slots = rankings.shape[-1]
    slots = jnp.arange(n_slots)
    # log Z_r - log Z_k = (s_{y_r} - s_{y_k}) - f_r + f_k for k <= r, both real slots.
    tri = (slots[:, None] >= slots[None, :]).reshape((1,) * (rankings.ndim - 1) + (n_slots, n_slots))
    lower = tri & slot_valid[..., :, None] & slot_valid[..., None, :]
    log_gain = (ranked[..., :, None] - ranked[..., None, :]) - factor[..., :, None] + factor[..., None, :]
    gain = jnp.where(lower, jnp.exp(jnp.minimum(jnp.where(lower, log_gain, 0.0), 0.0)), 0.0)  # [N, .., K(r), K(k)]
    prob = jnp.where(slot_valid, jnp.exp(factor), 0.0)
    placed = _at_ranked(jnp.zeros(shape, bool), rankings).set(True).reshape(shape)
    never = where & ~placed
    last = n_slots - 1
    log_rest = (many - ranked[..., last:]) + factor[..., last:]
    rest = jnp.where(never & slot_valid[..., last:], jnp.exp(jnp.minimum(jnp.where(never, log_rest, 0.0), 0.0)), 0.0)
    rest_rel = jnp.sum(rest * rel[None], axis=-1)  # [N, ..]
    rest_mass = jnp.sum(rest, axis=-1)
    # E_k: ranked items at slots m >= k (pi_k(y_m) = pi_m(y_m) G[m, k]) plus the never-placed.
    expected = jnp.sum((prob * ranked_rel)[..., :, None] * gain, axis=-2) + gain[..., last, :] * rest_rel[..., None]
    total = jnp.sum(prob[..., :, None] * gain, axis=-2) + gain[..., last, :] * rest_mass[..., None]
    before = pl.cumsum_slots(factor)
    before = jnp.concatenate([jnp.zeros_like(before[..., :1]), before[..., :-1]], axis=-1)
    return factor, prob, gain, rest, ranked_rel, expected, total, before


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _marginalize_all(logits, rel, theta, rankings, valid, baseline):
    expected = _marginalize_all_parts(logits, rel, theta, rankings, valid)[5]
    return pl.mean_samples(jnp.sum(_expand(theta, expected) * expected, axis=-1))


def _marginalize_all_fwd(logits, rel, theta, rankings, valid, baseline):
    parts = _marginalize_all_parts(logits, rel, theta, rankings, valid)
    expected = parts[5]
    value = pl.mean_samples(jnp.sum(_expand(theta, expected) * expected, axis=-1))
    return value, (rel, theta, rankings) + parts


def _marginalize_all_bwd(baseline, residuals, g):
    """Per item ``j``: ``sum_{k <= r_j} pi_k(j) (theta_k (rho_j - E_k) - C_k) + C_{r_j} [j placed]``
    with ``pi_k(j) = pi_{r_j}(j) G[r_j, k]`` (docs/maths.md §2.6)."""
    rel, theta, rankings, factor, prob, gain, rest, ranked_rel, expected, total, before = residuals
    log_prob = jnp.where(prob > 0.0, factor, 0.0)
    n_samples, n_slots = rankings.shape[0], rankings.shape[-1]
    b = leave_one_out_mean(expected) if baseline else jnp.zeros_like(expected)
    th = _expand(theta, expected)
    advantage = expected - b * total  # sum_d (rho_d - b) pi(d | prefix)
    c = th * advantage
    after = jnp.cumsum(c[..., ::-1], axis=-1)[..., ::-1] - c  # C_k = sum_{k' > k} c_k'
    # Ranked items: sum_k G[r, k] (theta_k (rho_{y_r} - E_k) - C_k), formed per (r, k) so
    # that a deterministic slot (G the identity, pi = 1, E_r = rho_{y_r}) gives exactly 0,
    # and pi_r C_r - C_r as -expm1(log pi_r) C_r: no float32 residue of O(1) terms where
    # the true gradient is tiny.
    diag = jnp.eye(n_slots, dtype=bool).reshape((1,) * (rankings.ndim - 1) + (n_slots, n_slots))
    per_slot = th[..., None, :] * (ranked_rel[..., :, None] - expected[..., None, :]) - jnp.where(
        diag, 0.0, after[..., None, :]
    )
    on_ranked = prob * jnp.sum(gain * per_slot, axis=-1) - jnp.expm1(log_prob) * after  # [N, .., K]
    on_ranked = jnp.where(prob > 0.0, on_ranked, 0.0)
    # Never-placed items (r = K - 1): the per-slot sums A and B serve them all.
    a_sum = jnp.sum(gain[..., -1, :] * th, axis=-1, keepdims=True)  # [N, .., 1]
    b_sum = jnp.sum(gain[..., -1, :] * (th * expected + after), axis=-1, keepdims=True)
    per_item = rest * (rel[None] * a_sum - b_sum)
    per_item = _at_ranked(per_item, rankings).add(on_ranked.reshape(-1, n_slots)).reshape(per_item.shape)
    d_logits = g[..., None] * pl.mean_samples(per_item)
    # position_weight: the surrogate's sum_d (rho_d - b) (pi + pi log pi(y_{1:k-1})) per slot
    d_theta = (
        jnp.sum(g[None, ..., None] * advantage * (1.0 + before), axis=tuple(range(advantage.ndim - 1))) / n_samples
    )
    return d_logits, jnp.zeros_like(rel), d_theta, None, None


_marginalize_all.defvjp(_marginalize_all_fwd, _marginalize_all_bwd)


@functools.partial(jax.jit, static_argnames=("n_samples", "baseline", "corrected"))
def exposure(
    logits: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
    corrected: bool = True,
) -> jax.Array:
    """Estimated exposure ``theta_d = E_y[theta_{rank(d)}]`` (Eq. 32) with the exposure-based
    gradient estimator as its Jacobian.

    ``corrected=True`` (default) is the estimator of Appendix A (Eqs. 36-39, Figure 8):
    a (K+1)-th outcome "d not placed" with weight 0 receives the baseline correction
    ``-b_d``, which makes the baseline-corrected estimator unbiased. ``corrected=False`` is
    the published Eq. 33 (Figure 2), biased when ``baseline=True`` (Appendix A); without
    baselines the two are identical and unbiased.

    Args:
      logits: ``[.., D]`` float32 scores.
      position_weight: ``[K]`` theta.
      key: PRNG key.
      n_samples: ``N`` (``>= 2`` with baselines).
      where: optional bool ``[.., D]`` mask.
      baseline: leave-one-out baselines ``b_d`` estimating each document's exposure.
      corrected: Appendix A's correction (default) or the original Eq. 33.

    Returns:
      ``[.., D]`` float32 exposure estimate (0 for masked documents).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> theta = jnp.array([1.0, 0.5])
      >>> e = exposure(jnp.zeros(4), theta, jax.random.key(0), 8)
      >>> round(float(e.sum()), 5)   # total exposure is sum_k theta_k
      1.5
    """
    n_slots = _check(position_weight, logits.shape[-1], n_samples, baseline)
    s = _Samples(logits, key, n_slots, n_samples, where)
    log_place = s.log_placement()  # [N, .., K, D]
    place = jnp.exp(log_place)
    log_before = s.log_prefix_before()  # [N, .., K]
    theta = position_weight.astype(jnp.float32)
    if corrected:
        # Outcome K+1: d not placed at K given y_{1:K-1}, for d still available there
        # (valid and not in y_{1:K-1}: exactly where the last log-placement is finite).
        last = log_place[..., -1, :]
        available = jnp.isfinite(last)
        out = jnp.where(available, -jnp.expm1(jnp.where(available, last, 0.0)), 0.0)  # 1 - pi, precisely
        place = jnp.concatenate([place, out[..., None, :]], axis=-2)  # [N, .., K+1, D]
        log_before = jnp.concatenate([log_before, log_before[..., -1:]], axis=-1)
        theta = jnp.concatenate([theta, jnp.zeros((1,), jnp.float32)])
    theta_b = _expand(theta, place[..., 0])[..., None]  # [1, .., K(+1), 1]
    per_sample = jnp.sum(place * theta_b, axis=-2)  # [N, .., D]
    b = leave_one_out_mean(per_sample)[..., None, :] if baseline else 0.0
    score = place + sg(place) * log_before[..., None]
    surrogate = pl.mean_samples(jnp.sum(sg(theta_b - b) * score, axis=-2))
    return magic_box(pl.mean_samples(per_sample), surrogate)


def exposure_utility(
    logits: jax.Array,
    relevance: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
    corrected: bool = True,
) -> jax.Array:
    """Exposure-based utility (Eq. 35): ``sum_d rho_d theta_d`` with the exposure estimator."""
    expo = exposure(logits, position_weight, key, n_samples, where=where, baseline=baseline, corrected=corrected)
    rel = relevance.astype(jnp.float32)
    if where is not None:
        rel = jnp.where(where, rel, 0.0)
    return jnp.sum(rel * expo, axis=-1)


exposure_utility.__doc__ = (exposure_utility.__doc__ or "") + _DOC.replace(
    "      baseline: leave-one-out baseline corrections (Eq. 20-style) on or off.",
    "      baseline: leave-one-out baselines on or off.\n      corrected: Appendix A's correction (default) or the original Eq. 33.",
)


# ---------------------------------------------------------------------------------------
# PL-Rank-3 (Eq. 21): a custom gradient, kept as the baseline method
# ---------------------------------------------------------------------------------------
@jax.custom_vjp
def _plrank3(logits, relevance, position_weight, rankings, valid):
    rho = jnp.where(valid, relevance, 0.0)
    ranked = jnp.take_along_axis(jnp.broadcast_to(rho, (rankings.shape[0],) + rho.shape), rankings, axis=-1)
    return pl.mean_samples(jnp.sum(ranked * position_weight.reshape((1,) * (rankings.ndim - 1) + (-1,)), axis=-1))


def _plrank3_fwd(logits, relevance, position_weight, rankings, valid):
    return _plrank3(logits, relevance, position_weight, rankings, valid), (
        logits,
        relevance,
        position_weight,
        rankings,
        valid,
    )


def _plrank3_bwd(res, cotangent):
    """Eq. 21 with every ``e^{f(d)} / sum e^f`` formed in log space.

    ``denom_k`` (the PL mass of the documents not in ``y_{1:k-1}``) is kept as its log,
    ``log_den_k = logsumexp`` over the ranked documents at slots ``>= k`` joined with the
    never-placed ones -- a sum of positive terms, never the difference
    ``sum(e^f) - cumsum(e^f)``, which cancels in float32 once a placed document outweighs
    the rest by ``e^17`` (and gives 0/0 = NaN from a logit gap of about 20). Then, for a
    document at (capped) rank ``r``,
    ``e^{f(d)} DR_r = e^{f(d) - log_den_r} sum_{x <= r} theta_x e^{log_den_r - log_den_x}``
    and likewise ``RI`` with ``PR_x``: every exponent is ``<= 0`` (``log_den`` does not
    increase along slots and ``d`` is still unplaced at ``r``), so nothing overflows or
    cancels at any logit scale.
    """
    logits, relevance, theta, rankings, valid = res
    n_samples, n_items, n_slots = rankings.shape[0], logits.shape[-1], rankings.shape[-1]
    dtype = logits.dtype
    neg_inf = jnp.asarray(-jnp.inf, dtype)
    f = jnp.where(valid, logits, neg_inf)  # [.., D]; -inf for documents never sampled
    rho = jnp.where(valid, relevance, 0.0).astype(dtype)
    f_n = jnp.broadcast_to(f, (n_samples,) + f.shape)  # [N, .., D]
    ranked_f = jnp.take_along_axis(f_n, rankings, axis=-1)  # [N, .., K]
    slot_valid = ranked_f > neg_inf  # valid documents come first; padding slots after
    ranked_rho = jnp.take_along_axis(jnp.broadcast_to(rho, f_n.shape), rankings, axis=-1)
    theta_k = theta.astype(dtype).reshape((1,) * (rankings.ndim - 1) + (n_slots,))
    reward = jnp.where(slot_valid, theta_k * ranked_rho, 0.0)
    pr = jnp.cumsum(reward[..., ::-1], axis=-1)[..., ::-1]  # PR_k = sum_{x >= k} theta_x rho_{y_x}
    # Per document: rank r (0-based), capped at K-1 for documents outside the top K.
    one_hot = pl.one_hot_rankings(rankings, n_items)  # [N, .., K, D]
    in_top = jnp.any(one_hot & slot_valid[..., None], axis=-2)  # [N, .., D]
    rank0 = jnp.where(in_top, jnp.argmax(one_hot, axis=-2).astype(jnp.int32), n_slots - 1)
    # log_den_k = log sum of e^f over documents not in y_{1:k-1}.
    never = jnp.logical_and(valid[None], ~in_top)  # [N, .., D]
    log_rest = pl.safe_logsumexp(jnp.where(never, f_n, neg_inf), axis=-1)  # [N, ..]
    slot = jnp.arange(n_slots)
    lead = (1,) * (rankings.ndim - 1)
    later = (slot[None, :] >= slot[:, None]).reshape(lead + (n_slots, n_slots))  # [.., K (k), K (m)]: m >= k
    suffix = jnp.where(later, ranked_f[..., None, :], neg_inf)  # [N, .., K, K]
    rest = jnp.broadcast_to(log_rest[..., None, None], suffix.shape[:-1] + (1,))
    log_den = pl.safe_logsumexp(jnp.concatenate([suffix, rest], axis=-1), axis=-1)  # [N, .., K]
    log_den_safe = jnp.where(slot_valid, log_den, 0.0)
    # E[k, x] = denom_k / denom_x for x <= k (both real slots), else 0; entries <= 1.
    upto = jnp.swapaxes(later, -1, -2)  # [.., K (k), K (x)]: x <= k
    pair_ok = upto & slot_valid[..., :, None] & slot_valid[..., None, :]
    ratio = jnp.exp(jnp.where(pair_ok, log_den_safe[..., :, None] - log_den_safe[..., None, :], neg_inf))
    dr_scaled = jnp.sum(ratio * theta_k[..., None, :], axis=-1)  # denom_k DR_k
    ri_scaled = jnp.sum(ratio * pr[..., None, :], axis=-1)  # denom_k RI_k
    # e^{f(d)} / denom_{r_d}: d is unplaced before slot r_d, so this is <= 1.
    log_den_d = jnp.take_along_axis(log_den_safe, rank0, axis=-1)
    share = jnp.exp(jnp.where(valid[None], f_n - log_den_d, neg_inf))
    pr_after = jnp.concatenate([pr[..., 1:], jnp.zeros_like(pr[..., :1])], axis=-1)  # PR_{r+1}
    pr_d = jnp.where(in_top, jnp.take_along_axis(pr_after, rank0, axis=-1), 0.0)
    ri_d = jnp.take_along_axis(ri_scaled, rank0, axis=-1)
    dr_d = jnp.take_along_axis(dr_scaled, rank0, axis=-1)
    grad = pr_d + share * (rho[None] * dr_d - ri_d)
    grad = jnp.where(jnp.broadcast_to(valid, grad.shape), grad, 0.0)
    return (cotangent[..., None] * pl.mean_samples(grad), None, None, None, None)


_plrank3.defvjp(_plrank3_fwd, _plrank3_bwd)


@functools.partial(jax.jit, static_argnames=("n_samples",))
def plrank3_utility(
    logits: jax.Array,
    relevance: jax.Array,
    position_weight: jax.Array,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
) -> jax.Array:
    """PL-Rank-3 (Eq. 21; Oosterhuis 2022): utility estimate with a custom gradient.

    ``grad_d = (1/N) sum_i PR_{y,d} + e^{f(d)} (rho_d DR_{y,d} - RI_{y,d})`` with suffix
    rewards ``PR`` and the sums ``RI``, ``DR`` over ``1 / denom_k``, ``denom_k`` the PL mass
    of the documents not yet placed. Works in the dtype of ``logits`` (float64 with x64
    enabled). Computed as published with unnormalised ``e^f`` and
    ``denom_k = sum(e^f) - cumsum(e^f)``, the subtraction cancels in float32 once a placed
    document outweighs the rest by ``e^17`` (logit gap 17: no correct digits; from a gap
    of about 20: ``0 / 0 = NaN``) -- a cancellation, well before ``e^f`` overflows near
    88. Here ``log denom_k`` is a log-sum-exp over the unplaced documents and every
    ``e^{f(d)} / denom_k`` is formed in log space, so the gradient stays finite and
    accurate at logit gaps up to 1e3 and beyond. No baseline corrections. Gradients
    w.r.t. ``relevance`` and ``position_weight`` are 0.

    Args:
      logits: ``[.., D]`` scores (float32 or float64).
      relevance: ``[.., D]`` rho.
      position_weight: ``[K]`` theta.
      key: PRNG key.
      n_samples: ``N``.
      where: optional bool ``[.., D]`` mask.

    Returns:
      ``[..]`` utility estimate per query.
    """
    n_slots = _check(position_weight, logits.shape[-1], n_samples, False)
    rankings = pl.sample_rankings(key, sg(logits), n_slots, where=where, n_samples=n_samples)
    valid = pl.valid_items(logits, where)
    return _plrank3(logits, relevance.astype(logits.dtype), position_weight.astype(logits.dtype), rankings, valid)


# ---------------------------------------------------------------------------------------
# Any ranking-level reward
# ---------------------------------------------------------------------------------------
def sampled_policy_gradient(
    logits: jax.Array,
    reward_fn: Callable[[jax.Array], jax.Array],
    n_slots: int,
    key: jax.Array,
    n_samples: int,
    *,
    where: jax.Array | None = None,
    baseline: bool = True,
) -> jax.Array:
    """Score-function estimator for a reward of whole (top-K) rankings.

    ``grad ~ (1/N) sum_i (R(y^(i)) - b_i) grad log pi(y^(i)_{1:K})`` with leave-one-out
    baselines. Use it when the reward does not decompose over documents (e.g. R-POD's
    second-stage completion value); the marginalizing estimators need per-document rewards.

    Args:
      logits: ``[.., D]`` scores.
      reward_fn: ``rankings [N, .., K] -> rewards [N, ..]`` (not differentiated).
      n_slots: ``K``.
      key: PRNG key.
      n_samples: ``N``.
      where: optional bool ``[.., D]`` mask.
      baseline: leave-one-out baselines on or off.

    Returns:
      ``[..]`` mean sampled reward per query; its gradient is the estimator's.
    """
    if n_samples < (2 if baseline else 1):
        raise ValueError(f"n_samples must be >= {2 if baseline else 1}, got {n_samples}")
    s = _Samples(logits, key, n_slots, n_samples, where)
    reward = sg(jnp.asarray(reward_fn(s.rankings), jnp.float32))
    if reward.shape != s.rankings.shape[:-1]:
        raise ValueError(f"reward_fn returned shape {reward.shape}; expected {s.rankings.shape[:-1]}")
    advantage = reward - leave_one_out_mean(reward) if baseline else reward
    surrogate = pl.mean_samples(advantage * s.log_prefix()[..., -1])
    return magic_box(pl.mean_samples(reward), surrogate)


GRADIENT_ESTIMATORS: dict[str, Callable[..., jax.Array]] = {
    "standard": standard_utility,
    "placement": placement_utility,
    "marginalize_first": marginalize_first_utility,
    "marginalize_all": marginalize_all_utility,
    "exposure": exposure_utility,
    "exposure_original": functools.partial(exposure_utility, corrected=False),
    "plrank3": plrank3_utility,
}
"""Utility estimators by name: ``fn(logits, relevance, position_weight, key, n_samples,
*, where=None[, baseline=True]) -> [..]``."""

ESTIMATORS = GRADIENT_ESTIMATORS  # the name before 0.2.0 (one release; the same dict)
