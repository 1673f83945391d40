"""Ranking policies: each samples rankings and owns its propensities.

Every policy follows [`RankingPolicy`][RankingPolicy]: ``sample`` rankings, ``log_prob`` of a
ranking, and ``propensities`` of logged rankings (prefix log-probabilities and, on
request, position marginals) in the form the estimators of
[`opl_rank.opl.estimators`][opl_rank.opl.estimators] read; optionally its ``greedy`` ranking, whether its
propensities compile whole, and its saved spec. OPE, the learners, saving and the
``opl-rank rank`` command never ask which class a policy is, so a fourth policy is one
class in one file (``tests/plugins/epsilon_greedy.py`` is one).

  PLPolicy          Plackett-Luce over a scorer's logits (exact prefix probabilities and
                    position marginals, differentiable in the parameters).
  RegressionPolicy  deterministic: the argmax of a reward model f_hat (Eq. 13).
  TwoStagePolicy    R-POD's policy: PL over the top k, then the f_hat-argmax completion.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from opl_rank import tuning
from opl_rank.data import LoggedData
from opl_rank.opl.estimators import Propensities
from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl
from opl_rank.program_cache import cached_jit

__all__ = [
    "RankingPolicy",
    "PolicyParts",
    "PLPolicy",
    "RegressionPolicy",
    "TwoStagePolicy",
    "MIN_MARGINAL",
    "greedy_rankings",
    "compiled_propensities",
    "compiled_sample",
]

# Floor of a position marginal before its log: the quadrature's absolute error is ~1e-7,
# so a logged item's marginal is never rounded to an impossible 0.
MIN_MARGINAL = 1e-30


@runtime_checkable
class RankingPolicy(Protocol):
    """What every ranking policy offers: what a fourth policy implements.

    Required (all that OPE and the estimators read; ``isinstance(p, RankingPolicy)``
    checks these five)::

      n_slots: int         L, the length of its rankings
      deterministic: bool  True when ``sample`` ignores its key (one ranking per context)
      sample(key, context [n, dx], *, where=None) -> [n, L] int32
      log_prob(context [n, dx], rankings [n, L], *, where=None) -> [n]
      propensities(data, key=None, *, slot_marginals=False) -> Propensities
          log_prefix [n, L] (``log pi(a_{1:l} | x)`` of the logged rankings' prefixes) and,
          when ``slot_marginals``, log_slot [n, L] (``log P_pi(a_l at slot l | x)``, for
          iips; a policy that cannot compute them raises a ValueError saying so)

    ``where`` is an optional bool ``[n, D]``: the candidates each row may rank.

    Optional (callers look them up on the policy and fall back as said)::

      choice_probs(data) -> [n, L, D]
          ``pi(d | x, a_{1:l-1})`` at each logged prefix (per-slot estimators such as
          cascade_dr; exact wherever the logged prefix is on the policy's support);
          absent: such an estimator needs it given (``ope.evaluate(inputs=...)``)

      greedy(context [n, dx], *, where=None) -> [n, L] int32
          its most probable ranking ([`greedy_rankings`][greedy_rankings], ``opl-rank rank``);
          absent: a deterministic policy's ``sample``, else a TypeError
      jit_propensities: bool
          True when the policy is a pytree whose ``propensities`` compile as one
          program ([`compiled_propensities`][compiled_propensities]); absent: False (run as it is)
      jit_sample: bool
          True when the policy is a pytree whose ``sample`` compiles as one program
          ([`compiled_sample`][compiled_sample]: the ground-truth rollouts);
          absent: False (run as it is)
      pl_stage
          the Plackett-Luce part a learner trained through importance weights (whose
          log-weights ``max_log_weight`` clips), or None
      spec_name: str, to_spec(writer) -> PolicyParts, from_spec(spec, arrays, reader)
          saving and loading (a classmethod ``from_spec``): register the class with
          [`opl_rank.io.persistence.register_policy_class`][opl_rank.io.persistence.register_policy_class]; ``writer`` and
          ``reader`` save and rebuild nested parts (policies, scorers, reward models)
    """

    deterministic: bool

    @property
    def n_slots(self) -> int:
        """L, the length of its rankings (a field or a property of the policy)."""

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """``[n, dx] -> [n, L]`` int32 rankings of the candidates ``where`` (bool ``[n, D]``) allows."""

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """``[n, dx], [n, L] -> [n]`` log pi(a | x) (``-inf`` off a deterministic policy's support)."""

    def propensities(
        self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False
    ) -> Propensities:
        """Log-propensities of ``data.ranking`` (``log_slot`` only when ``slot_marginals``)."""


class PolicyParts(NamedTuple):
    """What a policy's ``to_spec`` returns for [`opl_rank.io.persistence.save_policy`][opl_rank.io.persistence.save_policy].

    Attributes:
      spec: JSON-able fields (the saver adds ``"class"``: the registered spec name, first).
      arrays: a pytree (nested dicts) of NumPy arrays, stored in ``params.msgpack``.
      n_items: D.
      context_dim: dx, the number of context columns the policy reads.
      k: the saved ``"k"``: the length of the prefix the policy samples (L for PL, 0 for a
        deterministic policy, R-POD's k for a two-stage one).
    """

    spec: dict
    arrays: Any
    n_items: int
    context_dim: int
    k: int


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
    """Plackett-Luce over the logits of a scorer (``[n, dx] -> [n, D]``, [`opl_rank.scorers`][opl_rank.scorers]).

    Attributes:
      module: the flax scorer.
      params: its parameters.
      n_slots: rankings' length (``k`` for an R-POD first stage).
      slot_marginal_samples: 0 (default): exact slot marginals; ``N >= 2``: their
        Rao-Blackwellised estimate from ``N`` sampled rankings, unbiased in value and
        gradient ([`sampled_slot_marginals`][opl_rank.pl.marginals.sampled_slot_marginals]; ``propensities``
        then needs a key). The learners choose by cost
        ([`slot_marginal_method`][opl_rank.pl.marginals.slot_marginal_method]).
      slot_marginal_estimator: with samples, ``"prefix"`` (default; averages over sampled
        prefixes) or ``"insertion"`` (the logged item inserted into the others' sampled
        order, [`insertion_slot_marginals`][opl_rank.pl.marginals.insertion_slot_marginals], with the logged order
        as baseline at ``N = 1`` and leave-one-out baselines from ``N = 2``).
    """

    module: Any
    params: Any
    n_slots: int
    slot_marginal_samples: int = 0
    slot_marginal_estimator: str = "prefix"
    deterministic = False
    jit_propensities = True
    jit_sample = True
    spec_name = "PLPolicy"

    @property
    def pl_stage(self) -> PLPolicy:
        return self

    def logits(self, context: jax.Array) -> jax.Array:
        """``[n, dx] -> [n, D]``."""
        return self.module.apply(self.params, context)

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return pl.sample_rankings(key, self.logits(context), self.n_slots, where=where)

    def greedy(self, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """The PL mode: the top ``n_slots`` items by logit, ``[n, dx] -> [n, n_slots]`` int32."""
        logits = self.logits(context)
        if where is not None:
            logits = jnp.where(where, logits, -jnp.inf)
        return jax.lax.top_k(logits, self.n_slots)[1].astype(jnp.int32)

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return pl.prefix_log_probs(self.logits(context), rankings[..., : self.n_slots], where=where)[..., -1]

    def propensities(
        self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False
    ) -> Propensities:
        """Exact PL propensities of the logged rankings' first ``n_slots`` slots.

        ``log_prefix [n, n_slots]``; ``log_slot [n, n_slots]`` from the exact position
        marginals ([`exact_slot_marginals`][opl_rank.pl.marginals.exact_slot_marginals]), or with
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
                raise ValueError(
                    f"slot_marginal_estimator must be 'prefix' or 'insertion', got {self.slot_marginal_estimator!r}"
                )
            log_slot = _log_marginal(estimate)
        elif slot_marginals:
            log_slot = _log_marginal(marginals.exact_slot_marginals(logits, ranking, where=data.item_mask))
        return Propensities(log_prefix, log_slot)

    def choice_probs(self, data: LoggedData) -> jax.Array:
        """``pi(d | x, a_{1:l-1})`` along the logged rankings: ``[n, n_slots, D]`` (the masked
        softmax of the remaining candidates, exact and differentiable in ``params``)."""
        logits = self.logits(data.context)
        return jnp.exp(pl.placement_log_probs(logits, data.ranking[..., : self.n_slots], where=data.item_mask))

    def to_spec(self, writer: Any) -> PolicyParts:
        """``{"scorer": ..., "n_slots": L}`` and the scorer's parameters."""
        scorer, context_dim = writer.scorer(self.module, self.params["params"])
        spec = {"scorer": scorer, "n_slots": int(self.n_slots)}
        return PolicyParts(
            spec, {"scorer": writer.arrays(self.params)}, scorer["n_items"], context_dim, int(self.n_slots)
        )

    @classmethod
    def from_spec(cls, spec: dict, arrays: Any, reader: Any) -> PLPolicy:
        module, params = reader.scorer(spec["scorer"], reader.part(arrays, "scorer"))
        return cls(module, params, int(spec["n_slots"]))


@_pytree(["reward_model"], [])
@dataclasses.dataclass(frozen=True)
class RegressionPolicy:
    """Deterministic: the argmax of f_hat (Eq. 13 from an empty prefix)."""

    reward_model: Any
    deterministic = True
    jit_propensities = True
    jit_sample = True
    spec_name = "RegressionPolicy"
    pl_stage = None

    @property
    def n_slots(self) -> int:
        return self.reward_model.n_slots

    def sample(self, key: jax.Array | None, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        empty = jnp.zeros((context.shape[0], 0), jnp.int32)
        return self.reward_model.complete(context, empty, where=where)

    def greedy(self, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """Its one ranking per context: ``[n, dx] -> [n, L]`` int32."""
        return self.sample(None, context, where=where)

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        same = jnp.all(self.sample(None, context, where=where) == rankings, axis=-1)
        return jnp.where(same, 0.0, -jnp.inf)

    def propensities(
        self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False
    ) -> Propensities:
        """Indicators: ``log pi(a_{1:l}) = 0`` while the logged prefix is the argmax's, else ``-inf``."""
        same = data.ranking == self.sample(None, data.context, where=data.item_mask)
        log_slot = _log_indicator(same) if slot_marginals else None
        return Propensities(_log_indicator(jnp.cumprod(same, axis=-1) > 0), log_slot)

    def choice_probs(self, data: LoggedData) -> jax.Array:
        """Its next choice as a one-hot ``[n, L, D]``: exact wherever the logged prefix is its own
        (elsewhere ``pi(a_{1:l-1}) = 0``, so estimators weight those rows by 0)."""
        ranking = self.sample(None, data.context, where=data.item_mask)
        return pl.one_hot_rankings(ranking, data.n_items).astype(jnp.float32)

    def to_spec(self, writer: Any) -> PolicyParts:
        """``{"reward_model": ...}`` and f_hat's arrays."""
        model, arrays, context_dim = writer.reward_model(self.reward_model)
        return PolicyParts(
            {"reward_model": model}, {"reward_model": arrays}, model["module"]["n_items"], context_dim, 0
        )

    @classmethod
    def from_spec(cls, spec: dict, arrays: Any, reader: Any) -> RegressionPolicy:
        return cls(reader.reward_model(spec["reward_model"], reader.part(arrays, "reward_model")))


@_pytree(["first_stage", "reward_model"], ["n_samples", "max_enumerated"])
@dataclasses.dataclass(frozen=True)
class TwoStagePolicy:
    """R-POD's policy: PL over the top k, then the f_hat-argmax completion.

    Attributes:
      first_stage: a [`PLPolicy`][PLPolicy] with ``n_slots = k``.
      reward_model: the fitted f_hat whose ``complete`` is the second stage.
      n_samples: first-stage samples per row for Monte Carlo slot marginals beyond k.
      max_enumerated: enumerate first-stage prefixes exactly up to this many instead.
    """

    first_stage: PLPolicy
    reward_model: Any
    n_samples: int = 512
    max_enumerated: int = 1024
    deterministic = False
    jit_propensities = False  # compiles its own pieces (rows in chunks: bounded memory)
    jit_sample = True  # callers pass bounded chunks of contexts
    spec_name = "TwoStagePolicy"

    @property
    def n_slots(self) -> int:
        return self.reward_model.n_slots

    @property
    def k(self) -> int:
        return self.first_stage.n_slots

    @property
    def n_items(self) -> int:
        """D, the candidates f_hat scores."""
        return int(self.reward_model.module.n_items)

    @property
    def pl_stage(self) -> PLPolicy:
        return self.first_stage

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return self.reward_model.complete(context, self.sample_prefix(key, context, where=where), where=where)

    def sample_prefix(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """The first stage's top k, ``[n, k]``: what [`sample`][sample] completes (same key, same prefixes)."""
        return self.first_stage.sample(key, context, where=where)

    def prefix_values(
        self,
        value_fn: Callable[[jax.Array, jax.Array], jax.Array],
        context: jax.Array,
        *,
        where: jax.Array | None = None,
    ) -> jax.Array:
        """``value_fn(context, ranking)`` of every top-k prefix's completion, per row: ``[n, P]``
        (``P = D!/(D-k)!``, columns as in [`opl_rank.opl.completion.prefix_layout`][opl_rank.opl.completion.prefix_layout]).

        With it the mean of ``value_fn`` over many samples reads one table instead of
        completing every sampled prefix (``value_fn``: ``([1, dx], int [P, 1, L]) -> [P, 1]``)."""
        return self.reward_model.prefix_table(value_fn, context, self.k, where=where)

    def greedy(self, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """The first stage's greedy top k completed by f_hat (Eq. 13): ``[n, dx] -> [n, L]`` int32."""
        head = self.first_stage.greedy(context, where=where)
        return self.reward_model.complete(context, head, where=where).astype(jnp.int32)

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        completed = self.reward_model.complete(context, rankings[..., : self.k], where=where)
        same = jnp.all(completed == rankings, axis=-1)
        return jnp.where(same, self.first_stage.log_prob(context, rankings, where=where), -jnp.inf)

    def propensities(
        self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False
    ) -> Propensities:
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
        if enumerate_prefixes or len(starts) == 1:
            keys = [key] * len(starts)
        else:
            assert key is not None  # checked above: Monte Carlo marginals need a key
            keys = list(jax.random.split(key, len(starts)))
        beyond = jnp.concatenate(
            [
                _beyond_k_marginals(
                    self,
                    context[s : s + rows],
                    ranking[s : s + rows],
                    logits[s : s + rows],
                    None if where is None else where[s : s + rows],
                    chunk_key,
                    n_prefixes if enumerate_prefixes else 0,
                )
                for s, chunk_key in zip(starts, keys)
            ],
            axis=0,
        )
        return Propensities(log_prefix, jnp.concatenate([first_log_slot, _log_marginal(beyond)], axis=-1))

    def choice_probs(self, data: LoggedData) -> jax.Array:
        """``pi(d | x, a_{1:l-1})`` along the logged rankings ``[n, L, D]``: the first stage's
        softmax for ``l <= k``, then the completion of the logged top k as a one-hot (exact
        wherever the logged prefix is on the policy's support; elsewhere its weight is 0)."""
        head = self.first_stage.choice_probs(data)  # [n, k, D]
        completed = self.reward_model.complete(data.context, data.ranking[:, : self.k], where=data.item_mask)
        tail = pl.one_hot_rankings(completed[:, self.k :], data.n_items).astype(jnp.float32)
        return jnp.concatenate([head, tail], axis=1)

    def to_spec(self, writer: Any) -> PolicyParts:
        """The first stage's spec (a saved PLPolicy), f_hat's, and the marginals' settings."""
        if type(self.first_stage) is not PLPolicy:
            raise TypeError(
                f"save_policy: a TwoStagePolicy's first stage must be a PLPolicy, got {type(self.first_stage).__name__}"
            )
        first = writer.policy(self.first_stage)
        model, model_arrays, _ = writer.reward_model(self.reward_model)
        spec = {
            "first_stage": first.spec,
            "reward_model": model,
            "n_samples": int(self.n_samples),
            "max_enumerated": int(self.max_enumerated),
        }
        arrays = {"first_stage": first.arrays, "reward_model": model_arrays}
        return PolicyParts(spec, arrays, first.n_items, first.context_dim, first.k)

    @classmethod
    def from_spec(cls, spec: dict, arrays: Any, reader: Any) -> TwoStagePolicy:
        first = reader.policy(spec["first_stage"], reader.part(arrays, "first_stage"))
        model = reader.reward_model(spec["reward_model"], reader.part(arrays, "reward_model"))
        return cls(first, model, n_samples=int(spec["n_samples"]), max_enumerated=int(spec["max_enumerated"]))

    def _beyond_k_marginals(self, context, ranking, logits, where, key, n_prefixes):
        """``P(slot l holds ranking[:, l])`` for ``l >= k``: ``[m, L - k]``, over all
        ``n_prefixes`` first-stage prefixes (0: a mean over ``n_samples`` sampled ones)."""
        k = self.k
        if n_prefixes:
            n_items = logits.shape[-1]
            prefixes = jnp.broadcast_to(
                jnp.asarray(pl.all_rankings(n_items, k))[:, None, :], (n_prefixes, ranking.shape[0], k)
            )
            mask = None if where is None else jnp.broadcast_to(where, (n_prefixes,) + where.shape)
            weight = jnp.exp(
                pl.prefix_log_probs(jnp.broadcast_to(logits, (n_prefixes,) + logits.shape), prefixes, where=mask)[
                    ..., -1
                ]
            )
        else:
            prefixes = pl.sample_rankings(key, logits, k, where=where, n_samples=self.n_samples)  # [N, m, k]
            weight = jnp.full(prefixes.shape[:2], 1.0 / self.n_samples)
        tails = self.reward_model.complete(context, prefixes, where=where)[..., k:]  # [P, m, L-k]
        return jnp.einsum("pn,pnl->nl", weight, (tails == ranking[None, :, k:]).astype(jnp.float32))


@cached_jit(static_argnames=("slot_marginals",), xla_defaults=True)
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


@cached_jit(static_argnames=("slot_marginals",))
def _compiled_propensities(policy, data, key, slot_marginals):
    return policy.propensities(data, key, slot_marginals=slot_marginals)


def compiled_propensities(
    policy: RankingPolicy, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False
) -> Propensities:
    """``policy.propensities(data, key, slot_marginals=...)``, compiled as one program when the
    policy says it may be (``policy.jit_propensities``: this module's PL and regression
    policies; same numbers, a few hundred fewer op-by-op compilations when OPE or a check
    meets new shapes). A two-stage policy compiles its own pieces; a policy without the
    attribute runs as it is."""
    if getattr(policy, "jit_propensities", False):
        return _compiled_propensities(policy, data, key, slot_marginals)
    return policy.propensities(data, key, slot_marginals=slot_marginals)


@cached_jit
def _compiled_sample(policy, key, context, where):
    return policy.sample(key, context, where=where)


def compiled_sample(
    policy: RankingPolicy, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None
) -> jax.Array:
    """``policy.sample(key, context, where=where)``, compiled as one program when the policy says
    it may be (``policy.jit_sample``: this module's policies). The same rankings; a two-stage
    policy's f_hat completion otherwise runs op by op, each op its own small program to
    compile or load (a hundred and more per fitted policy). A policy without the attribute
    runs as it is.

    Args:
      policy: a [`RankingPolicy`][RankingPolicy].
      key: PRNG key (a deterministic policy ignores it).
      context: ``[n, dx]``.
      where: optional bool ``[n, D]``, the candidates each row may rank.

    Returns:
      ``[n, L]`` int32 rankings.
    """
    if getattr(policy, "jit_sample", False):
        return _compiled_sample(policy, key, context, where)
    return policy.sample(key, context, where=where)


def greedy_rankings(policy: Any, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
    """The most probable ranking of each row, without sampling: ``[n, dx] -> [n, L]`` int32.

    ``policy.greedy(context, where=where)``: a PLPolicy ranks its top ``n_slots`` items by
    logit (the PL mode); a TwoStagePolicy completes its first stage's greedy top k with
    f_hat (Eq. 13); a RegressionPolicy is its own ranking. A policy without ``greedy``
    that is ``deterministic`` is its own ranking too. ``where`` (bool ``[n, D]``) excludes
    candidates.

    Raises:
      TypeError: ``policy`` has no ``greedy`` method and is not deterministic.
    """
    greedy = getattr(policy, "greedy", None)
    if callable(greedy):
        return greedy(context, where=where)
    if getattr(policy, "deterministic", False):
        return policy.sample(None, context, where=where)
    raise TypeError(
        f"greedy_rankings needs a policy with a greedy(context, *, where=None) method or a deterministic "
        f"one (PLPolicy, TwoStagePolicy, RegressionPolicy have it), got {type(policy).__name__}"
    )
