"""A fourth ranking policy defined outside opl_rank, in one file: epsilon-greedy.

With probability ``epsilon`` a uniformly random ranking of the candidates, else a base
policy's greedy ranking. Its propensities are exact: for a ranking ``a`` of ``D``
candidates and a prefix length ``l``,

    pi(a_{1:l} | x) = (1 - eps) 1[a_{1:l} = g_{1:l}(x)] + eps (D - l)! / D!

(``g`` the base's greedy ranking), and its position marginals
``P(a_l = i | x) = (1 - eps) 1[g_l(x) = i] + eps / D``, so every estimator (iips included)
evaluates it. Importing this module registers

  * the class for :func:`opl_rank.io.persistence.save_policy` / ``load_policy``
    (``"class": "EpsilonGreedyPolicy"``; the base policy is a nested saved spec), and
  * the learner ``"eps-greedy"`` (:func:`opl_rank.opl.learners.register_learner`): fit the
    regression policy (f_hat's argmax) of the config and explore with :data:`EPSILON`.

Nothing else in the package changes: ``opl_rank.fit``, ``opl_rank.opl.ope.evaluate``, the
saved-policy files and a sweep (``plugins: [tests.plugins.epsilon_greedy]``) all take it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from opl_rank.data import LoggedData
from opl_rank.io.persistence import register_policy_class
from opl_rank.opl import learners
from opl_rank.opl.estimators import Propensities
from opl_rank.opl.policies import PolicyParts, greedy_rankings
from opl_rank.pl import plackett_luce as pl

EPSILON = 0.1  # the "eps-greedy" learner's exploration probability


def _log(p: float) -> float:
    return math.log(p) if p > 0 else -math.inf


@register_policy_class
@functools.partial(jax.tree_util.register_dataclass, data_fields=["base"], meta_fields=["epsilon", "n_items"])
@dataclasses.dataclass(frozen=True)
class EpsilonGreedyPolicy:
    """A mixture: ``epsilon`` of a uniform random ranking, ``1 - epsilon`` of ``base``'s greedy one.

    Attributes:
      base: a policy with a ``greedy`` ranking (or a deterministic one), ``n_slots = L``.
      epsilon: the exploration probability in ``[0, 1]``.
      n_items: D, the candidates (each row's ``where`` may exclude some).
    """

    base: Any
    epsilon: float
    n_items: int
    deterministic = False
    spec_name = "EpsilonGreedyPolicy"
    pl_stage = None

    def __post_init__(self) -> None:
        if (
            not isinstance(self.epsilon, (int, float))
            or isinstance(self.epsilon, bool)
            or not 0.0 <= self.epsilon <= 1.0
        ):
            raise ValueError(f"epsilon must be a number in [0, 1], got {self.epsilon!r}")
        if not isinstance(self.n_items, int) or self.n_items < 1:
            raise ValueError(f"n_items must be a positive int, got {self.n_items!r}")

    @property
    def n_slots(self) -> int:
        return self.base.n_slots

    @property
    def jit_propensities(self) -> bool:
        """Compiled whole when the base is (its greedy ranking is all it reads)."""
        return bool(getattr(self.base, "jit_propensities", False))

    @property
    def jit_sample(self) -> bool:
        """``sample`` compiled whole when the base's is (``compiled_sample``)."""
        return bool(getattr(self.base, "jit_sample", False))

    def greedy(self, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """The base's greedy ranking (the mode while ``epsilon < 1``): ``[n, dx] -> [n, L]`` int32."""
        return greedy_rankings(self.base, context, where=where).astype(jnp.int32)

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """``[n, dx] -> [n, L]`` int32: per row, uniform with probability ``epsilon``, else greedy."""
        k_coin, k_uniform = jax.random.split(key)
        n = context.shape[0]
        uniform = pl.sample_rankings(k_uniform, jnp.zeros((n, self.n_items), jnp.float32), self.n_slots, where=where)
        explore = jax.random.uniform(k_coin, (n,)) < self.epsilon
        return jnp.where(explore[:, None], uniform.astype(jnp.int32), self.greedy(context, where=where))

    def _log_prefix(self, context: jax.Array, rankings: jax.Array, where: jax.Array | None) -> jax.Array:
        """``[n, dx], [n, L] -> [n, L]``: ``log pi(a_{1:l} | x)``."""
        match = jnp.cumprod(rankings == self.greedy(context, where=where), axis=-1) > 0  # [n, L]
        n_slots = rankings.shape[-1]
        # log D!/(D-l)! of the row's D candidates: sum_{j<l} log(D - j)
        log_perm = jnp.cumsum(
            jnp.log(self._n_candidates(context, where)[:, None] - jnp.arange(n_slots, dtype=jnp.float32)[None, :]),
            axis=-1,
        )
        greedy_part = jnp.where(match, _log(1.0 - self.epsilon), -jnp.inf)
        return jnp.logaddexp(greedy_part, _log(self.epsilon) - log_perm).astype(jnp.float32)

    def _n_candidates(self, context: jax.Array, where: jax.Array | None) -> jax.Array:
        """``[n]`` float32: each row's number of candidates."""
        if where is None:
            return jnp.full((context.shape[0],), float(self.n_items), jnp.float32)
        return jnp.sum(where, axis=-1).astype(jnp.float32)

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return self._log_prefix(context, rankings, where)[:, -1]

    def propensities(
        self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False
    ) -> Propensities:
        """Exact prefix probabilities ``[n, L]`` and, on request, position marginals ``[n, L]``
        of the logged rankings (``key`` unused)."""
        log_prefix = self._log_prefix(data.context, data.ranking, data.item_mask)
        log_slot = None
        if slot_marginals:
            same = data.ranking == self.greedy(data.context, where=data.item_mask)
            uniform = self.epsilon / self._n_candidates(data.context, data.item_mask)[:, None]  # [n, 1]
            log_slot = jnp.log(jnp.where(same, 1.0 - self.epsilon, 0.0) + uniform).astype(jnp.float32)
        return Propensities(log_prefix, log_slot)

    def to_spec(self, writer: Any) -> PolicyParts:
        """The base as a nested saved policy, and epsilon and D."""
        base = writer.policy(self.base)
        spec = {"base": base.spec, "epsilon": float(self.epsilon), "n_items": int(self.n_items)}
        return PolicyParts(spec, {"base": base.arrays}, int(self.n_items), base.context_dim, base.k)

    @classmethod
    def from_spec(cls, spec: dict, arrays: Any, reader: Any) -> EpsilonGreedyPolicy:
        base = reader.policy(spec["base"], reader.part(arrays, "base"))
        return cls(base, float(spec["epsilon"]), int(spec["n_items"]))


def fit_epsilon_greedy(
    data: LoggedData, key: jax.Array, config: learners.LearnerConfig, *, on_epoch: Any = None
) -> EpsilonGreedyPolicy:
    """The ``"eps-greedy"`` learner: the config's regression policy (f_hat of
    ``config.reward_model``), exploring with probability :data:`EPSILON`."""
    base = learners.fit(data, key, dataclasses.replace(config, method="regression"), on_epoch=on_epoch)
    return EpsilonGreedyPolicy(base, EPSILON, data.n_items)


learners.register_learner("eps-greedy", fit_epsilon_greedy, needs_reward_model=True)
