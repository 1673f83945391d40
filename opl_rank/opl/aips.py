"""Adaptive IPS (AIPS; Kiyohara et al., KDD 2023), registered as ``aips``.

A behaviour model ``c`` is an ``L x L`` 0/1 matrix (or one per context): slot ``l``'s reward
depends on the items at the slots ``S_l = {l' : c[l, l'] = 1}`` (always ``l`` itself). With
``Phi_l(a, c) = {(l', a_l') : l' in S_l}``::

    V_aips = sum_l alpha_l r_l pi(Phi_l | x) / pi_0(Phi_l | x)

where ``pi(Phi | x)`` is the probability that a ranking drawn from ``pi`` holds the logged
items at those slots. It is unbiased whenever the true behaviour's sets are inside ``c``'s,
and its variance falls as the sets shrink: ``c`` = independent is IIPS, cascade is RIPS,
standard (all ones) is IPS.

**Set probabilities** ([`set_log_probs`][set_log_probs]). Under Plackett-Luce:

* a prefix-shaped set ``S_l = {1..m}`` is the prefix probability (exact);
* a single slot ``S_l = {l}`` is the position marginal (exact quadrature, or the policy's
  sampled marginals where the learner chose them);
* any other set (``neighbour-1``: ``{l-1, l, l+1}``; ``top-m``: ``{1..m} + {l}``) sums over
  the items that fill the gap slots before its last slot: exactly, by enumerating those
  fills while ``sum_g D!/(D-g)!`` (``g`` gap slots) is at most ``max_enumerated``; otherwise
  by sequential importance sampling (the gap slots drawn from the policy restricted to the
  items the set does not need, each weighted by that restriction's mass: unbiased for the
  probability and, as a magic box, for its gradient).

A deterministic target (``RegressionPolicy``) has indicator probabilities; any other policy
with ``sample`` gets the Monte Carlo frequency of agreeing on ``S_l`` (unbiased).

**What the logs must carry.** For the logging policy: ``log_pi0_prefix`` (always there) for
prefix sets, ``log_pi0_position_marginal`` for single-slot sets (``position_marginals="exact"``
in the simulators), and ``logging_logits`` ``[n, D]`` (``sample_logged_data(...,
logging_logits=True)``) for any other set -- or ``inputs={"aips": {"log_logging": [n, L]}}``.
Where the sets need sampling, pi_0's probability is estimated too, with ``logging_samples``
draws: unbiased for the probability, so its reciprocal is biased by O(1/logging_samples)
(enumeration avoids this; it is exact for ``D = 10, L = 5`` with any built-in behaviour).

**Options** (``ope.evaluate(..., inputs={"aips": {...}})``; for a learner
``LearnerConfig("aips", estimator_options={...})``): ``behaviour`` (a name of
[`BEHAVIOURS`][BEHAVIOURS] such as ``"cascade"``, ``"neighbour-1"``, ``"top-2"``; an ``[L, L]``
or ``[n, L, L]`` 0/1 array; or ``context [n, dx] -> [n, L, L]``; default ``"cascade"``),
``method`` (``"auto"``, ``"exact"``, ``"sampled"``), ``n_samples``, ``logging_samples``,
``max_enumerated``, ``log_target`` / ``log_logging`` (``[n, L]``, given probabilities).
[`select_behaviour`][select_behaviour] picks ``c`` from the logs alone.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank.data import LoggedData
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.estimator_inputs import InputRequest
from opl_rank.opl.estimators import Estimator, ModelTerms, Propensities, Terms, importance_weight
from opl_rank.opl.policies import PLPolicy, _log_indicator, _log_marginal
from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl

__all__ = [
    "BEHAVIOURS",
    "AIPSInputs",
    "behaviour_matrix",
    "check_behaviour",
    "set_log_probs",
    "aips_terms",
    "aips_inputs",
    "select_behaviour",
    "BehaviourChoice",
]

sg = jax.lax.stop_gradient

BEHAVIOURS = ("independent", "cascade", "standard", "neighbour-m", "top-m")
METHODS = ("auto", "exact", "sampled")
_OPTIONS = (
    "behaviour",
    "method",
    "n_samples",
    "logging_samples",
    "max_enumerated",
    "log_target",
    "log_logging",
)
_LEARNING_MAX_ENUMERATED = 100  # "auto" when learning: sampled beyond this many gap fills per set
_ENUMERATION_FLOATS = 2**24  # floats of one chunk of the exact gap enumeration ([rows, L, P, L, D])


# ---------------------------------------------------------------------------------------
# Behaviour models
# ---------------------------------------------------------------------------------------
def behaviour_matrix(name: str, n_slots: int) -> np.ndarray:
    """A built-in behaviour as a bool ``[L, L]`` matrix (``c[l, l']``: slot l reads slot l').

    ``"independent"`` (identity), ``"cascade"`` (``l' <= l``), ``"standard"`` (all ones),
    ``"neighbour-m"`` (``|l - l'| <= m``; ``"neighbour"`` is ``m = 1``), ``"top-m"`` (the
    top ``m`` slots and ``l`` itself); ``"symmetric"`` is ``"standard"`` (the synthetic
    environment's name for it).

    Examples:
      >>> behaviour_matrix("neighbour-1", 3).astype(int).tolist()
      [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
    """
    slots = np.arange(n_slots)
    row, col = slots[:, None], slots[None, :]
    if name == "independent":
        return row == col
    if name == "cascade":
        return col <= row
    if name in ("standard", "symmetric"):
        return np.ones((n_slots, n_slots), bool)
    match = re.fullmatch(r"(neighbour|neighbor|top)(?:-(\d+))?", name) if isinstance(name, str) else None
    if match is None or (match.group(1) == "top" and match.group(2) is None):
        raise ValueError(f"behaviour must be one of {BEHAVIOURS} (e.g. 'neighbour-1', 'top-2'), got {name!r}")
    m = int(match.group(2) or 1)
    if match.group(1) == "top":
        return (col < m) | (row == col)
    return np.abs(row - col) <= m


def check_behaviour(behaviour: Any, n_slots: int, n_rows: int | None = None) -> Any:
    """A behaviour as a bool ``[L, L]`` or ``[n, L, L]`` array (NumPy when concrete).

    Raises:
      ValueError: naming ``behaviour``: an unknown name, a wrong shape, values other than
        0/1, or a zero on the diagonal (slot l always depends on its own item).
    """
    if isinstance(behaviour, str):
        return behaviour_matrix(behaviour, n_slots)
    if isinstance(behaviour, jax.core.Tracer):
        if behaviour.shape not in ((n_slots, n_slots), (n_rows, n_slots, n_slots)):
            raise ValueError(f"behaviour must be [L, L] or [n, L, L] with L={n_slots}, got {behaviour.shape}")
        return behaviour.astype(bool) | jnp.eye(n_slots, dtype=bool)  # traced: the diagonal is forced
    c = np.asarray(behaviour)
    if c.shape != (n_slots, n_slots) and not (c.ndim == 3 and c.shape[1:] == (n_slots, n_slots)):
        raise ValueError(f"behaviour must be [L, L] or [n, L, L] with L={n_slots}, got shape {c.shape}")
    if n_rows is not None and c.ndim == 3 and c.shape[0] != n_rows:
        raise ValueError(f"behaviour has {c.shape[0]} rows, the data {n_rows}")
    if c.dtype != bool and not np.isin(c, (0, 1)).all():
        raise ValueError("behaviour must hold 0/1 values")
    c = c.astype(bool)
    if not np.diagonal(c, axis1=-2, axis2=-1).all():
        raise ValueError("behaviour needs a unit diagonal: slot l's reward depends on its own item (c[l, l] = 1)")
    return c


def _kinds(c: Any) -> tuple[Any, Any, Any]:
    """``(last, is_prefix, is_single)`` per set ``[.., L]``: its last slot, whether it is
    ``{1..last}``, whether it is ``{l}`` alone."""
    xp = np if isinstance(c, np.ndarray) else jnp
    n_slots = c.shape[-1]
    slots = xp.arange(n_slots).reshape((1,) * (c.ndim - 1) + (n_slots,))
    last = xp.max(xp.where(c, slots, -1), axis=-1)
    is_prefix = xp.sum(c, axis=-1) == last + 1
    is_single = (xp.sum(c, axis=-1) == 1) & ~is_prefix  # {1} is a prefix: no marginal needed
    return last, is_prefix, is_single


def _rows(c: Any, n: int) -> Any:
    """A behaviour as ``[n, L, L]`` (NumPy when concrete)."""
    if c.ndim == 3:
        return c
    if isinstance(c, np.ndarray):
        return np.broadcast_to(c, (n,) + c.shape)
    return jnp.broadcast_to(c, (n,) + c.shape)


def _gap_counts(c: np.ndarray) -> list[int]:
    """The gap counts (empty slots before a set's last slot) of the sets that are neither a
    prefix nor a single slot."""
    last, is_prefix, is_single = _kinds(c)
    gaps = last + 1 - np.sum(c, axis=-1)
    return sorted({int(g) for g in np.unique(gaps[~is_prefix & ~is_single])})


# ---------------------------------------------------------------------------------------
# Probabilities of item sets under Plackett-Luce
# ---------------------------------------------------------------------------------------
def set_log_probs(
    logits: jax.Array,
    ranking: jax.Array,
    behaviour: Any,
    *,
    log_prefix: jax.Array | None = None,
    log_slot: jax.Array | None = None,
    where: jax.Array | None = None,
    method: str = "auto",
    key: jax.Array | None = None,
    n_samples: int = 32,
    max_enumerated: int = 6000,
) -> jax.Array:
    """``log P_{a' ~ PL(logits)}(a'_t = a_t for t in S_l)`` for every slot's set: ``[n, L]``.

    Args:
      logits: ``[n, D]`` PL logits (differentiable).
      ranking: ``[n, L]`` int the logged rankings ``a``.
      behaviour: bool ``[L, L]`` or ``[n, L, L]`` (``c[l, t]``: ``t in S_l``).
      log_prefix: ``[n, L]`` ``log pi(a_{1:l})`` if at hand (else computed).
      log_slot: ``[n, L]`` ``log P(a_l at l)`` for single-slot sets (else the exact marginals).
      where: optional bool ``[n, D]`` candidate mask.
      method: ``"exact"`` (enumerate the gap fills), ``"sampled"`` (sequential importance
        sampling), ``"auto"`` (exact while the enumeration has at most ``max_enumerated``
        fills per set).
      key: PRNG key (sampled).
      n_samples: draws per row and set (sampled).
      max_enumerated: the switch-over of ``"auto"``.

    Returns:
      float32 ``[n, L]`` (``-inf`` where the set is impossible).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    n, n_slots = ranking.shape
    c_rows = _rows(check_behaviour(behaviour, n_slots, n), n)
    args = (logits, ranking, log_prefix, log_slot, where, key)
    if isinstance(c_rows, np.ndarray) and not any(isinstance(a, jax.core.Tracer) for a in args):
        # eager callers (OPE): one compiled program per behaviour and shape
        return _compiled_set_log_probs(*args, _Static(c_rows), method, n_samples, max_enumerated)
    return _set_log_probs(*args, c_rows, method, n_samples, max_enumerated)


class _Static:
    """A concrete behaviour as a static (hashable) jit argument."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = np.ascontiguousarray(value)
        self._key = (self.value.shape, self.value.tobytes())

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self._key == other._key


def _set_log_probs(logits, ranking, log_prefix, log_slot, where, key, c_rows, method, n_samples, max_enumerated):
    """[`set_log_probs`][set_log_probs] for a checked ``[n, L, L]`` behaviour."""
    n, n_slots = ranking.shape
    n_items = logits.shape[-1]
    logits = logits.astype(jnp.float32)
    if log_prefix is None:
        log_prefix = pl.prefix_log_probs(logits, ranking, where=where)
    last, is_prefix, is_single = _kinds(c_rows)  # [n, L]
    out = jnp.take_along_axis(log_prefix, jnp.asarray(last, jnp.int32), axis=1)
    concrete = isinstance(c_rows, np.ndarray)
    if not concrete or is_single.any():
        if log_slot is None:
            log_slot = _log_marginal(marginals.exact_slot_marginals(logits, ranking, where=where))
        out = jnp.where(jnp.asarray(is_single), log_slot, out)
    gaps = _gap_counts(c_rows) if concrete else list(range(1, max(n_slots - 1, 1)))
    gaps = [g for g in gaps if g >= 1]
    if not gaps:
        return out
    other = jnp.asarray(~is_prefix & ~is_single)
    cost = sum(math.perm(n_items, g) for g in gaps)
    if method == "exact" or (method == "auto" and cost <= max_enumerated):
        gapped = _enumerated_set_log_probs(logits, ranking, c_rows, gaps, where)
    else:
        if key is None:
            raise ValueError("method='sampled' (or 'auto' beyond max_enumerated) needs key=, a PRNG key")
        gapped = _sampled_set_log_probs(key, logits, ranking, jnp.asarray(c_rows), n_samples, where)
    return jnp.where(other, gapped, out)


@functools.partial(jax.jit, static_argnums=(6, 7, 8, 9))
def _compiled_set_log_probs(
    logits, ranking, log_prefix, log_slot, where, key, behaviour, method, n_samples, max_enumerated
):
    return _set_log_probs(
        logits, ranking, log_prefix, log_slot, where, key, behaviour.value, method, n_samples, max_enumerated
    )


def _sequence_log_prob(logits: jax.Array, valid: jax.Array, items: jax.Array, upto: jax.Array) -> jax.Array:
    """``log pi(items_{1..upto+1})`` of distinct items: ``[D], [D], [.., L], [..] -> [..]``.

    One-hot sums instead of gathers: their gradient is a product, not a scatter-add (slow on CPU).
    """
    n_items = logits.shape[-1]
    one_hot = jax.nn.one_hot(items, n_items, dtype=jnp.bool_)  # [.., L, D]
    lead = (1,) * (one_hot.ndim - 1)
    logits, valid = logits.reshape(lead + (n_items,)), valid.reshape(lead + (n_items,))
    placed = jnp.cumsum(one_hot, axis=-2, dtype=jnp.int32) - one_hot.astype(jnp.int32)  # items before slot t
    avail = valid & (placed == 0)
    denom = pl.safe_logsumexp(jnp.where(avail, logits, -jnp.inf), axis=-1)  # [.., L]
    chosen = jnp.sum(jnp.where(one_hot, logits, 0.0), axis=-1)
    ok = jnp.any(one_hot & valid, axis=-1) & jnp.isfinite(denom)
    factor = jnp.where(ok, jnp.minimum(chosen - jnp.where(ok, denom, 0.0), 0.0), -jnp.inf)  # log-probs <= 0
    slots = jnp.arange(items.shape[-1]).reshape((1,) * (items.ndim - 1) + (items.shape[-1],))
    return jnp.sum(jnp.where(slots <= upto[..., None], factor, 0.0), axis=-1)


def _enumerated_set_log_probs(logits, ranking, c, gaps, where):
    """Exact gapped-set probabilities by enumerating the gap fills: ``[n, L]`` (``-inf`` at
    sets that are not gapped).

    Only the (row, slot) pairs whose set has ``g`` gaps are enumerated with the ``D!/(D-g)!``
    fills of ``g`` slots (every pair when the behaviour is traced)."""
    n, n_slots = ranking.shape
    n_items = logits.shape[-1]
    valid = pl.valid_items(logits, where)  # [n, D]
    concrete = isinstance(c, np.ndarray)
    xp = np if concrete else jnp
    last = _kinds(c)[0]  # [n, L]
    gap_slot = ~c & (xp.arange(n_slots)[None, None, :] < last[..., None])  # [n, L(set), L(t)]
    gap_index = xp.cumsum(gap_slot, axis=-1) - 1  # the fill entry at a gap slot
    n_gaps = xp.sum(gap_slot, axis=-1)  # [n, L]
    _, is_prefix, is_single = _kinds(c)
    other = ~is_prefix & ~is_single
    result = jnp.full((n, n_slots), -jnp.inf, jnp.float32)
    for g in gaps:
        fills = jnp.asarray(pl.all_rankings(n_items, g))  # [P, g]
        if concrete:
            rows, slots = (jnp.asarray(i, jnp.int32) for i in np.nonzero(other & (n_gaps == g)))
        else:
            rows = jnp.repeat(jnp.arange(n, dtype=jnp.int32), n_slots)
            slots = jnp.tile(jnp.arange(n_slots, dtype=jnp.int32), n)
        if rows.shape[0] == 0:
            continue

        def one_pair(args, fills=fills, g=g):
            row_logits, row_valid, row_ranking, row_c, row_gap, row_index, row_last = args
            logged = jax.nn.one_hot(row_ranking, n_items, dtype=jnp.bool_)  # [L(t), D]
            needed = jnp.any(row_c[:, None] & logged, axis=0)  # [D]: the items the set fixes
            ok = ~jnp.any(needed[fills], axis=-1) & jnp.all(row_valid[fills], axis=-1)  # [P]
            items = jnp.where(row_gap[None, :], fills[:, jnp.clip(row_index, 0, g - 1)], row_ranking[None, :])
            lp = _sequence_log_prob(row_logits, row_valid, items, jnp.broadcast_to(row_last, ok.shape))
            return pl.safe_logsumexp(jnp.where(ok, lp, -jnp.inf), axis=-1)

        pair = (
            logits[rows],
            valid[rows],
            ranking[rows],
            jnp.asarray(c)[rows, slots],
            jnp.asarray(gap_slot)[rows, slots],
            jnp.asarray(gap_index, jnp.int32)[rows, slots],
            jnp.asarray(last, jnp.int32)[rows, slots],
        )
        per_pair = fills.shape[0] * n_slots * n_items
        batch = int(max(1, min(rows.shape[0], _ENUMERATION_FLOATS // per_pair)))
        value = jax.lax.map(one_pair, pair, batch_size=batch)  # [pairs]
        if concrete:
            result = result.at[rows, slots].set(value)
        else:
            result = jnp.where(jnp.asarray(n_gaps) == g, value.reshape(n, n_slots), result)
    return result


def _sampled_set_log_probs(key, logits, ranking, c, n_samples, where):
    """Gapped-set probabilities by sequential importance sampling: ``[n, L]``, unbiased in
    value (``log`` of an unbiased mean) and, through a magic box, in gradient.

    Slot by slot (a scan): a slot of the set places the logged item (weight: its PL
    probability); a gap slot before the set's last draws from the policy restricted to the
    items the set does not fix (weight: that restriction's mass; the draw's score enters the
    magic box)."""
    n, n_slots = ranking.shape
    n_items = logits.shape[-1]
    c = jnp.asarray(c)
    valid = pl.valid_items(logits, where)[:, None, None, :]  # [n, 1, 1, D]
    s = jnp.where(valid, logits[:, None, None, :], -jnp.inf)  # [n, 1, 1, D]
    last = _kinds(c)[0]  # [n, L]
    logged = jax.nn.one_hot(ranking, n_items, dtype=jnp.bool_)  # [n, L(t), D]
    # fixed_after[:, l, t]: the items the set of slot l fixes at slots after t
    fixed_items = c[..., None] & logged[:, None, :, :]  # [n, L(set), L(t), D]
    after = jnp.flip(jnp.cumsum(jnp.flip(fixed_items, 2), axis=2, dtype=jnp.int32), 2)
    fixed_after = after - fixed_items.astype(jnp.int32) > 0

    def step(carry, t):
        placed, log_w, log_q = carry
        avail = ~placed & valid  # [n, L, N, D]
        log_avail = pl.safe_logsumexp(jnp.where(avail, s, -jnp.inf), axis=-1)
        finite_avail = jnp.where(jnp.isfinite(log_avail), log_avail, 0.0)
        in_set = jnp.take(c, t, axis=2)[..., None]  # [n, L, 1]
        required = jnp.take(fixed_after, t, axis=2)[:, :, None, :]  # [n, L, 1, D]
        allowed = avail & ~required
        log_allowed = pl.safe_logsumexp(jnp.where(allowed, s, -jnp.inf), axis=-1)
        item_t = jnp.take(ranking, t, axis=1)  # [n]
        fixed = jnp.sum(jnp.where(jax.nn.one_hot(item_t, n_items, dtype=jnp.bool_)[:, None, None, :], s, 0.0), -1)
        active = t <= last[..., None]  # [n, L, 1]
        gap = active & ~in_set
        log_w = log_w + jnp.where(active & in_set, fixed - finite_avail, 0.0)
        log_w = log_w + jnp.where(gap, log_allowed - finite_avail, 0.0)
        # drawn flat: threefry at a rank-4 shape compiled for 16 s here (flat: 0.3 s)
        gumbel = jax.random.gumbel(jax.random.fold_in(key, t), (math.prod(avail.shape),), jnp.float32)
        gumbel = gumbel.reshape(avail.shape)
        draw = jnp.argmax(jnp.where(allowed, sg(s) + gumbel, -jnp.inf), axis=-1)  # [n, L, N]
        drawn = jax.nn.one_hot(draw, n_items, dtype=jnp.bool_)
        drawn_s = jnp.sum(jnp.where(drawn, s, 0.0), axis=-1)
        log_q = log_q + jnp.where(gap, drawn_s - jnp.where(jnp.isfinite(log_allowed), log_allowed, 0.0), 0.0)
        item = jnp.where(in_set, item_t[:, None, None], draw)
        return (placed | jax.nn.one_hot(item, n_items, dtype=jnp.bool_), log_w, log_q), None

    zeros = jnp.zeros((n, n_slots, n_samples), jnp.float32)
    placed = jnp.zeros((n, n_slots, n_samples, n_items), jnp.bool_)
    (_, log_w, log_q), _ = jax.lax.scan(step, (placed, zeros, zeros), jnp.arange(n_slots))
    # log of the mean weight, the weight a magic box carrying the drawn fills' score (log space:
    # no 0 * inf gradient where the probabilities underflow)
    box = jnp.where(jnp.isfinite(log_q), log_q - sg(log_q), 0.0)  # no -inf - -inf
    return pl.safe_logsumexp(log_w + box, axis=-1) - jnp.log(jnp.float32(n_samples))


# ---------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------
class AIPSInputs(NamedTuple):
    """What ``aips`` reads.

    Attributes:
      log_target: ``[n, L]`` ``log pi(Phi_l(a, c) | x)`` (a magic box when learning).
      log_logging: ``[n, L]`` ``log pi_0(Phi_l(a, c) | x)``.
    """

    log_target: jax.Array
    log_logging: jax.Array


def aips_terms(
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
    inputs: AIPSInputs | None = None,
) -> Terms:
    """AIPS per round: ``sum_l alpha_l r_l w_l``, ``w_l = pi(Phi_l) / pi_0(Phi_l)``; gradient
    ``sum_l alpha_l r_l w_l grad log pi(Phi_l)``. ``value [n]``, ``weight [n, L]``."""
    if inputs is None:
        raise ValueError("aips needs inputs=AIPSInputs(log_target, log_logging) (built by its inputs hook)")
    w = importance_weight(inputs.log_target, inputs.log_logging, max_log_weight)
    slot = opl_estimators.boxed(w, batch.reward * batch.position_weight[None, :], inputs.log_target)
    return Terms(jnp.sum(slot, axis=-1), w)


def _options(given: Any) -> Mapping[str, Any]:
    given = {} if given is None else given
    if not isinstance(given, Mapping) or set(given) - set(_OPTIONS):
        raise ValueError(f"inputs for aips must be a dict with keys among {list(_OPTIONS)}, got {given!r:.200}")
    for name in ("n_samples", "logging_samples", "max_enumerated"):
        value = given.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"aips option {name} must be a positive int, got {value!r}")
    if given.get("method", "auto") not in METHODS:
        raise ValueError(f"aips option method must be one of {METHODS}, got {given.get('method')!r}")
    return given


def _resolve_behaviour(behaviour: Any, batch: LoggedData) -> Any:
    if callable(behaviour):
        behaviour = behaviour(batch.context)
    return check_behaviour(behaviour, batch.ranking.shape[1], batch.ranking.shape[0])


def _given_log_probs(given: Mapping[str, Any], name: str, batch: LoggedData) -> jax.Array | None:
    if given.get(name) is None:
        return None
    value = jnp.asarray(given[name], jnp.float32)
    if value.shape != batch.ranking.shape:
        raise ValueError(f"{name} must have shape [n, L]={list(batch.ranking.shape)}, got {list(value.shape)}")
    return value


def _target_log_probs(request: InputRequest, c: Any, options: Mapping[str, Any]) -> jax.Array:
    policy, batch = request.policy, request.batch
    key = jax.random.fold_in(request.key, 3)
    c_rows = jnp.asarray(_rows(c, batch.ranking.shape[0]))
    n_slots = batch.ranking.shape[1]
    if getattr(policy, "n_slots", n_slots) != n_slots:
        raise ValueError(
            f"aips needs a target ranking all L={n_slots} slots, got a policy with n_slots={policy.n_slots}"
        )
    if getattr(policy, "deterministic", False):  # indicators: it agrees with the logs on S_l or not
        ranking = policy.sample(None, batch.context, where=batch.item_mask)
        agree = ranking == batch.ranking  # [n, L(t)]
        hit = jnp.all(jnp.where(c_rows, agree[:, None, :], True), axis=-1)
        return _log_indicator(hit)
    is_pl = isinstance(policy, PLPolicy) or getattr(policy, "pl_stage", None) is policy
    if is_pl and policy.n_slots == batch.ranking.shape[1]:  # Plackett-Luce over all L slots
        single = bool(_kinds(c)[2].any()) if isinstance(c, np.ndarray) else True
        props = policy.propensities(batch, jax.random.fold_in(key, 1), slot_marginals=single)
        return set_log_probs(
            policy.logits(batch.context),
            batch.ranking,
            c,
            log_prefix=props.log_prefix,
            log_slot=props.log_slot,
            where=batch.item_mask,
            method=options.get("method", "auto"),
            key=key,
            n_samples=options.get("n_samples", 32),
            # learning: the enumeration's gradient costs ~7x a sampled one (0.17 s vs 0.025 s
            # per 256-row step at D=10, L=5, neighbour-1): enumerate only tiny gap sets
            max_enumerated=options.get("max_enumerated", _LEARNING_MAX_ENUMERATED if request.learning else 6000),
        )
    if request.learning:
        raise ValueError("aips learns Plackett-Luce policies over all L slots")
    n_draws = int(options.get("n_samples", 256))
    draws = jax.vmap(lambda k: policy.sample(k, batch.context, where=batch.item_mask))(
        jax.random.split(key, n_draws)
    )  # [N, n, L]
    agree = draws == batch.ranking[None]
    hit = jnp.all(jnp.where(c_rows[None], agree[:, :, None, :], True), axis=-1)  # [N, n, L]
    return jnp.log(jnp.mean(hit.astype(jnp.float32), axis=0))


def _logging_log_probs(request: InputRequest, c: Any, options: Mapping[str, Any]) -> jax.Array:
    batch = request.batch
    concrete = isinstance(c, np.ndarray)
    c = _rows(c, batch.ranking.shape[0])
    last, is_prefix, is_single = _kinds(c)
    needs_single = bool(is_single.any()) if concrete else True
    needs_other = bool((~is_prefix & ~is_single).any()) if concrete else True
    if needs_other and batch.logging_logits is None:
        raise ValueError(
            "aips with this behaviour needs the logging policy's probability of non-prefix item sets: "
            "LoggedData.logging_logits [n, D] (simulate with logging_logits=True) or "
            "inputs={'aips': {'log_logging': [n, L]}}"
        )
    if needs_single and batch.log_pi0_position_marginal is None and batch.logging_logits is None:
        raise ValueError(
            "aips with single-slot sets (e.g. 'independent') needs LoggedData.log_pi0_position_marginal "
            "(simulate with position_marginals='exact') or logging_logits"
        )
    if batch.logging_logits is None:  # prefixes and single slots only
        out = jnp.take_along_axis(batch.log_pi0_prefix, jnp.asarray(last, jnp.int32), axis=1)
        if needs_single:
            assert batch.log_pi0_position_marginal is not None  # checked above
            out = jnp.where(jnp.asarray(is_single), batch.log_pi0_position_marginal, out)
        return out
    return sg(
        set_log_probs(
            batch.logging_logits,
            batch.ranking,
            c,
            log_prefix=batch.log_pi0_prefix,
            log_slot=batch.log_pi0_position_marginal,
            where=batch.item_mask,
            method=options.get("method", "auto"),
            key=jax.random.fold_in(request.key, 4),
            n_samples=options.get("logging_samples", 4 * int(options.get("n_samples", 32))),
            max_enumerated=options.get("max_enumerated", 6000),
        )
    )


def aips_inputs(request: InputRequest) -> AIPSInputs:
    """``aips``'s inputs hook: the target's and the logging policy's probabilities of each
    slot's set ``Phi_l`` under the behaviour ``options["behaviour"]`` (default cascade)."""
    options = _options(request.given)
    c = _resolve_behaviour(options.get("behaviour", "cascade"), request.batch)
    log_target = _given_log_probs(options, "log_target", request.batch)
    if log_target is None:
        log_target = _target_log_probs(request, c, options)
    log_logging = _given_log_probs(options, "log_logging", request.batch)
    if log_logging is None:
        log_logging = _logging_log_probs(request, c, options)
    return AIPSInputs(log_target, log_logging)


opl_estimators.register("aips", Estimator(aips_terms, inputs=aips_inputs))


# ---------------------------------------------------------------------------------------
# Choosing c from the logs
# ---------------------------------------------------------------------------------------
class BehaviourChoice(NamedTuple):
    """What [`select_behaviour`][select_behaviour] found.

    Attributes:
      behaviour: the chosen name (``leaves``: per leaf) and its ``[L, L]`` matrix.
      matrix: bool ``[L, L]`` (one leaf) or a callable ``context -> [n, L, L]`` (a split).
      mse: ``{candidate: estimated MSE}`` over all rows.
      split: ``(feature, threshold)`` or None.
      leaves: the chosen candidate below and above the split, or None.
    """

    behaviour: str
    matrix: Any
    mse: dict[str, float]
    split: tuple[int, float] | None
    leaves: tuple[str, str] | None


def _row_terms(policy: Any, data: LoggedData, key: jax.Array, behaviour: Any, options: Mapping[str, Any]) -> np.ndarray:
    request = InputRequest(policy, data, key, given={**options, "behaviour": behaviour})
    inputs = aips_inputs(request)
    return np.asarray(aips_terms(None, data, inputs=inputs).value, np.float64)  # type: ignore[arg-type]


def _leaf_mse(terms: np.ndarray, reference: np.ndarray, rows: np.ndarray, n: int) -> float:
    """Estimated MSE of one leaf's share ``(1/n) sum_{i in rows} terms_i`` of the estimate:
    its variance plus its squared bias against the reference, debiased by the variance of the
    difference (and floored at 0)."""
    m = int(rows.sum())
    if m < 2:
        return 0.0
    t, d = terms[rows], terms[rows] - reference[rows]
    variance = m * t.var(ddof=1) / n**2
    bias = d.sum() / n
    return float(variance + max(bias**2 - m * d.var(ddof=1) / n**2, 0.0))


def select_behaviour(
    policy: Any,
    data: LoggedData,
    key: jax.Array,
    *,
    candidates: tuple[str, ...] = ("independent", "neighbour-1", "cascade", "standard"),
    reference: str = "standard",
    split_quantiles: tuple[float, ...] = (0.25, 0.5, 0.75),
    min_leaf: int = 200,
    options: Mapping[str, Any] | None = None,
) -> BehaviourChoice:
    """Choose AIPS's behaviour ``c`` from the logs alone, by estimated MSE.

    For each candidate the per-round AIPS terms give its variance; its bias is estimated
    against the ``reference`` behaviour's terms (default ``"standard"``: IPS, unbiased under
    any behaviour), as the squared mean difference minus that difference's variance (floored
    at 0). The candidate of least estimated MSE wins; then one split of the contexts
    (feature ``j`` at one of ``split_quantiles``, leaves of at least ``min_leaf`` rows) with a
    candidate per leaf replaces it when its summed estimated MSE is lower (the paper's
    context-adaptive tree, one level deep; its tree used the simulator's true value for the
    bias term, ours does not).

    Returns:
      A [`BehaviourChoice`][BehaviourChoice]; ``choice.matrix`` goes to
      ``inputs={"aips": {"behaviour": choice.matrix}}``.
    """
    options = dict(options or {})
    n, n_slots = data.ranking.shape
    names = tuple(dict.fromkeys((*candidates, reference)))
    terms = {name: _row_terms(policy, data, key, name, options) for name in names}
    ref = terms[reference]
    everyone = np.ones(n, bool)
    mse = {name: _leaf_mse(terms[name], ref, everyone, n) for name in candidates}
    best = min(candidates, key=lambda name: mse[name])
    context = np.asarray(data.context)
    split: tuple[int, float] | None = None
    leaves: tuple[str, str] | None = None
    best_total = mse[best]
    for j in range(context.shape[1]):
        for q in split_quantiles:
            threshold = float(np.quantile(context[:, j], q))
            below = context[:, j] <= threshold
            if min(below.sum(), (~below).sum()) < min_leaf:
                continue
            lo = min(candidates, key=lambda name: _leaf_mse(terms[name], ref, below, n))
            hi = min(candidates, key=lambda name: _leaf_mse(terms[name], ref, ~below, n))
            total = _leaf_mse(terms[lo], ref, below, n) + _leaf_mse(terms[hi], ref, ~below, n)
            if lo != hi and total < best_total:
                split, leaves, best_total = (j, threshold), (lo, hi), total
    if split is None or leaves is None:
        return BehaviourChoice(best, behaviour_matrix(best, n_slots), mse, None, None)
    j, threshold = split
    lo_c, hi_c = (jnp.asarray(behaviour_matrix(name, n_slots)) for name in leaves)

    def matrix(context: jax.Array) -> jax.Array:
        below = (context[:, j] <= threshold)[:, None, None]
        return jnp.where(below, lo_c[None], hi_c[None])

    return BehaviourChoice(f"split(x{j}<={threshold:.3g}: {leaves[0]}, else {leaves[1]})", matrix, mse, split, leaves)
