"""Ranking policies: each samples rankings and owns its propensities.

Every policy follows :class:`RankingPolicy`: ``sample`` rankings, ``log_prob`` of a
ranking, and ``propensities`` of logged rankings (prefix log-probabilities and, on
request, position marginals) in the form the estimators of
:mod:`opl_rank.opl.estimators` read. OPE and the learners never ask which class a policy is.

  PLPolicy          Plackett-Luce over a scorer's logits (exact prefix probabilities and
                    position marginals, differentiable in the parameters).
  RegressionPolicy  deterministic: the argmax of a reward model f_hat (Eq. 13).
  TwoStagePolicy    R-POD's policy: PL over the top k, then the f_hat-argmax completion.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl
from opl_rank.data import LoggedData
from opl_rank.opl.estimators import Propensities
from opl_rank import tuning

__all__ = ["RankingPolicy", "PLPolicy", "RegressionPolicy", "TwoStagePolicy", "MIN_MARGINAL", "greedy_rankings"]

# Floor of a position marginal before its log: the quadrature's absolute error is ~1e-7,
# so a logged item's marginal is never rounded to an impossible 0.
MIN_MARGINAL = 1e-30


@runtime_checkable
class RankingPolicy(Protocol):
    """What every ranking policy offers."""

    n_slots: int
    deterministic: bool

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """``[n, dx] -> [n, L]`` int32 rankings of the candidates ``where`` (bool ``[n, D]``) allows."""

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """``[n, dx], [n, L] -> [n]`` log pi(a | x) (``-inf`` off a deterministic policy's support)."""

    def propensities(self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False) -> Propensities:
        """Log-propensities of ``data.ranking`` (``log_slot`` only when ``slot_marginals``)."""


def _log_indicator(match: jax.Array) -> jax.Array:
    return jnp.where(match, 0.0, -jnp.inf)


def _log_marginal(marginal: jax.Array) -> jax.Array:
    return jnp.log(jnp.maximum(marginal, MIN_MARGINAL))


def _pytree(data_fields: list[str], meta_fields: list[str]):
    """Register a frozen dataclass as a pytree: its arrays (parameters) are leaves, the rest
    (modules, sizes) static -- so policies pass through ``jax.jit``/``jax.vmap`` whole."""
    return functools.partial(jax.tree_util.register_dataclass, data_fields=data_fields, meta_fields=meta_fields)


@_pytree(["params"], ["module", "n_slots", "slot_marginal_samples", "slot_marginal_estimator"])
@dataclasses.dataclass(frozen=True)
class PLPolicy:
    """Plackett-Luce over the logits of a scorer (``[n, dx] -> [n, D]``, :mod:`opl_rank.scorers`).

    Attributes:
      module: the flax scorer.
      params: its parameters.
      n_slots: rankings' length (``k`` for an R-POD first stage).
      slot_marginal_samples: 0 (default): exact slot marginals; ``N >= 2``: their
        Rao-Blackwellised estimate from ``N`` sampled rankings, unbiased in value and
        gradient (:func:`~opl_rank.pl.marginals.sampled_slot_marginals`; ``propensities``
        then needs a key). The learners choose by cost
        (:func:`~opl_rank.pl.marginals.slot_marginal_method`).
      slot_marginal_estimator: with samples, ``"prefix"`` (default; averages over sampled
        prefixes) or ``"insertion"`` (the logged item inserted into the others' sampled
        order, :func:`~opl_rank.pl.marginals.insertion_slot_marginals`, with the logged order
        as baseline at ``N = 1`` and leave-one-out baselines from ``N = 2``).
    """

    module: Any
    params: Any
    n_slots: int
    slot_marginal_samples: int = 0
    slot_marginal_estimator: str = "prefix"
    deterministic = False

    def logits(self, context: jax.Array) -> jax.Array:
        """``[n, dx] -> [n, D]``."""
        return self.module.apply(self.params, context)

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return pl.sample_rankings(key, self.logits(context), self.n_slots, where=where)

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return pl.prefix_log_probs(self.logits(context), rankings[..., : self.n_slots], where=where)[..., -1]

    def propensities(self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False) -> Propensities:
        """Exact PL propensities of the logged rankings' first ``n_slots`` slots.

        ``log_prefix [n, n_slots]``; ``log_slot [n, n_slots]`` from the exact position
        marginals (:func:`~opl_rank.pl.marginals.exact_slot_marginals`), or with
        ``slot_marginal_samples`` their unbiased estimate from sampled rankings drawn with
        ``key``. Both are differentiable in ``params``; ``data.item_mask`` excludes candidates.
        """
        logits = self.logits(data.context)
        ranking = data.ranking[..., : self.n_slots]
        log_prefix = pl.prefix_log_probs(logits, ranking, where=data.item_mask)
        log_slot = None
        if slot_marginals and self.slot_marginal_samples:
            if key is None:
                raise ValueError("sampled slot marginals (slot_marginal_samples > 0) need a PRNG key")
            n = self.slot_marginal_samples
            if self.slot_marginal_estimator == "prefix":
                estimate = marginals.sampled_slot_marginals(key, logits, ranking, n, where=data.item_mask)
            elif self.slot_marginal_estimator == "insertion":
                estimate = marginals.insertion_slot_marginals(key, logits, ranking, n, where=data.item_mask)
            else:
                raise ValueError(f"slot_marginal_estimator must be 'prefix' or 'insertion', got {self.slot_marginal_estimator!r}")
            log_slot = _log_marginal(estimate)
        elif slot_marginals:
            log_slot = _log_marginal(marginals.exact_slot_marginals(logits, ranking, where=data.item_mask))
        return Propensities(log_prefix, log_slot)


@_pytree(["reward_model"], [])
@dataclasses.dataclass(frozen=True)
class RegressionPolicy:
    """Deterministic: the argmax of f_hat (Eq. 13 from an empty prefix)."""

    reward_model: Any
    deterministic = True

    @property
    def n_slots(self) -> int:
        return self.reward_model.n_slots

    def sample(self, key: jax.Array | None, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        empty = jnp.zeros((context.shape[0], 0), jnp.int32)
        return self.reward_model.complete(context, empty, where=where)

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        same = jnp.all(self.sample(None, context, where=where) == rankings, axis=-1)
        return jnp.where(same, 0.0, -jnp.inf)

    def propensities(self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False) -> Propensities:
        """Indicators: ``log pi(a_{1:l}) = 0`` while the logged prefix is the argmax's, else ``-inf``."""
        same = data.ranking == self.sample(None, data.context, where=data.item_mask)
        log_slot = _log_indicator(same) if slot_marginals else None
        return Propensities(_log_indicator(jnp.cumprod(same, axis=-1) > 0), log_slot)


@_pytree(["first_stage", "reward_model"], ["n_samples", "max_enumerated"])
@dataclasses.dataclass(frozen=True)
class TwoStagePolicy:
    """R-POD's policy: PL over the top k, then the f_hat-argmax completion.

    Attributes:
      first_stage: a :class:`PLPolicy` with ``n_slots = k``.
      reward_model: the fitted f_hat whose ``complete`` is the second stage.
      n_samples: first-stage samples per row for Monte Carlo slot marginals beyond k.
      max_enumerated: enumerate first-stage prefixes exactly up to this many instead.
    """

    first_stage: PLPolicy
    reward_model: Any
    n_samples: int = 512
    max_enumerated: int = 1024
    deterministic = False

    @property
    def n_slots(self) -> int:
        return self.reward_model.n_slots

    @property
    def k(self) -> int:
        return self.first_stage.n_slots

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return self.reward_model.complete(context, self.first_stage.sample(key, context, where=where), where=where)

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        completed = self.reward_model.complete(context, rankings[..., : self.k], where=where)
        same = jnp.all(completed == rankings, axis=-1)
        return jnp.where(same, self.first_stage.log_prob(context, rankings, where=where), -jnp.inf)

    def propensities(self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False) -> Propensities:
        """PL prefix probabilities up to k times the indicator that the second stage
        completes the logged prefix the logged way.

        Slot marginals: exact PL below k; beyond k, a sum over first-stage prefixes --
        exact by enumeration when there are at most ``max_enumerated``, else a Monte Carlo
        mean over ``n_samples`` prefixes drawn with ``key``.
        """
        log_prefix, first_log_slot, logits = _two_stage_head(self, data, slot_marginals)
        if not slot_marginals:
            return Propensities(log_prefix)
        k, context, ranking, where = self.k, data.context, data.ranking, data.item_mask
        n_prefixes = math.perm(data.n_items, k)
        enumerate_prefixes = n_prefixes <= self.max_enumerated
        if not enumerate_prefixes and key is None:
            raise ValueError("Monte Carlo slot marginals of a two-stage policy need a PRNG key")
        # Rows in chunks: the prefixes' completions are [P, rows, L] (P up to max_enumerated
        # or n_samples) with [P, rows, D] intermediates, ~10 GB at n = 1e4 in one piece.
        n = ranking.shape[0]
        per_row = (n_prefixes if enumerate_prefixes else self.n_samples) * (data.n_items + self.n_slots)
        rows = int(max(1, min(n, tuning.POLICY_CHUNK_FLOATS // per_row)))
        starts = range(0, n, rows)
        keys = [key] * len(starts) if enumerate_prefixes or len(starts) == 1 else list(jax.random.split(key, len(starts)))
        beyond = jnp.concatenate([
            _beyond_k_marginals(
                self, context[s : s + rows], ranking[s : s + rows], logits[s : s + rows],
                None if where is None else where[s : s + rows], chunk_key, n_prefixes if enumerate_prefixes else 0,
            )
            for s, chunk_key in zip(starts, keys)
        ], axis=0)
        return Propensities(log_prefix, jnp.concatenate([first_log_slot, _log_marginal(beyond)], axis=-1))

    def _beyond_k_marginals(self, context, ranking, logits, where, key, n_prefixes):
        """``P(slot l holds ranking[:, l])`` for ``l >= k``: ``[m, L - k]``, over all
        ``n_prefixes`` first-stage prefixes (0: a mean over ``n_samples`` sampled ones)."""
        k = self.k
        if n_prefixes:
            n_items = logits.shape[-1]
            prefixes = jnp.broadcast_to(jnp.asarray(pl.all_rankings(n_items, k))[:, None, :], (n_prefixes, ranking.shape[0], k))
            mask = None if where is None else jnp.broadcast_to(where, (n_prefixes,) + where.shape)
            weight = jnp.exp(pl.prefix_log_probs(jnp.broadcast_to(logits, (n_prefixes,) + logits.shape), prefixes, where=mask)[..., -1])
        else:
            prefixes = pl.sample_rankings(key, logits, k, where=where, n_samples=self.n_samples)  # [N, m, k]
            weight = jnp.full(prefixes.shape[:2], 1.0 / self.n_samples)
        tails = self.reward_model.complete(context, prefixes, where=where)[..., k:]  # [P, m, L-k]
        return jnp.einsum("pn,pnl->nl", weight, (tails == ranking[None, :, k:]).astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("slot_marginals",))
def _two_stage_head(policy: TwoStagePolicy, data: LoggedData, slot_marginals: bool):
    """A two-stage policy's ``log_prefix [n, L]``, its first stage's ``log_slot [n, k]`` (or
    None) and logits ``[n, D]``, as one compiled program."""
    k, ranking = policy.k, data.ranking
    first = policy.first_stage.propensities(data, slot_marginals=slot_marginals)
    head = first.log_prefix  # [n, k]
    completed = policy.reward_model.complete(data.context, ranking[:, :k], where=data.item_mask)
    tail_match = jnp.cumprod(completed[:, k:] == ranking[:, k:], axis=-1) > 0
    log_prefix = jnp.concatenate([head, head[:, -1:] + _log_indicator(tail_match)], axis=-1)
    return log_prefix, first.log_slot, policy.first_stage.logits(data.context)


# One compiled program per chunk shape (the chunks' loop stays on the host: bounded memory).
_beyond_k_marginals = jax.jit(TwoStagePolicy._beyond_k_marginals, static_argnames=("n_prefixes",))


@functools.partial(jax.jit, static_argnames=("slot_marginals",))
def _compiled_propensities(policy, data, key, slot_marginals):
    return policy.propensities(data, key, slot_marginals=slot_marginals)


def compiled_propensities(policy: RankingPolicy, data: LoggedData, key: jax.Array | None = None, *,
                          slot_marginals: bool = False) -> Propensities:
    """``policy.propensities(data, key, slot_marginals=...)``, compiled as one program for
    this module's PL and regression policies (same numbers; a few hundred fewer op-by-op
    compilations when OPE or a check meets new shapes). A two-stage policy compiles its own
    pieces; any other policy runs as it is."""
    if isinstance(policy, (PLPolicy, RegressionPolicy)):
        return _compiled_propensities(policy, data, key, slot_marginals)
    return policy.propensities(data, key, slot_marginals=slot_marginals)


def greedy_rankings(policy: Any, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """The most probable ranking of each row, without sampling: ``[n, dx] -> [n, L]`` int32.

    A PLPolicy ranks its top ``n_slots`` items by logit (the PL mode); a TwoStagePolicy
    completes its first stage's greedy top k with f_hat (Eq. 13); a deterministic policy
    (RegressionPolicy) is its own ranking. ``where`` (bool ``[n, D]``) excludes candidates.
    """
    if isinstance(policy, PLPolicy):
        logits = policy.logits(context)
        if where is not None:
            logits = jnp.where(where, logits, -jnp.inf)
        return jax.lax.top_k(logits, policy.n_slots)[1].astype(jnp.int32)
    if isinstance(policy, TwoStagePolicy):
        head = greedy_rankings(policy.first_stage, context, where=where)
        return policy.reward_model.complete(context, head, where=where).astype(jnp.int32)
    if getattr(policy, "deterministic", False):
        return policy.sample(None, context, where=where)
    raise TypeError(f"greedy_rankings knows PLPolicy, TwoStagePolicy and deterministic policies, got {type(policy).__name__}")
