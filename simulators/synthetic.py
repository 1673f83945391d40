"""The R-POD paper's synthetic ranking environment (Eqs. 14-15; docs/maths.md §1.25-1.26).

Contexts ``x ~ N(0, I_dx)``. Position-wise expected reward of ranking ``a``:

    q_l(x, a) = theta_{a_l}^T x + b_{a_l} + lambda * sum_{m != l} W(a_m, a_l),

realised per logged row and slot as ``base + 1{X_l <= lambda} * sum_{m != l} W(a_m, a_l)``
with ``X_l ~ U(0, 1)``, then ``r_l ~ N(q_l, sigma^2)``. All noise is drawn fresh for every
row, slot and call. The paper leaves ``b`` and ``W`` unspecified; our defaults are
``b_a ~ N(0, 1)`` and a symmetric ``W`` with ``N(0, interaction_scale^2)`` entries and a
zero diagonal. The logging policy is PL with logits ``(theta0_a^T x + b0_a) / tau``,
``theta0, b0 ~ U(0, 1)`` (Eq. 15), or any other logging policy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from opl_rank.data import LoggedData
from opl_rank.metrics import dcg_position_weights
from opl_rank.opl import completion
from opl_rank.pl import plackett_luce as pl
from simulators.logging_policies import PlackettLuceLinear, UniformLogging, as_logging_policy
from simulators.rollout import PolicyValue, evaluate_policy, rollout_logging_policy

__all__ = [
    "InteractionRewards",
    "SyntheticRewards",
    "SyntheticRewardModel",
    "SyntheticRankingEnv",
    "symmetric_interaction",
]


class InteractionRewards:
    """Position rewards ``q_l = base(x, a_l) + lambda * sum_{m != l} W(a_m, a_l)`` (Eq. 14).

    Shared by the synthetic and the semi-synthetic reward models, which differ only in the
    per-item base reward [`item_base`][item_base]. Subclasses are pytrees with the fields
    ``interaction [D, D]`` (symmetric, zero diagonal), ``lam []`` and ``sigma []``.
    """

    def item_base(self, context: jax.Array) -> jax.Array:
        """``[n, dx] -> [n, D]`` base reward of every item."""
        raise NotImplementedError

    def base_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``base(x, a_l)``: ``[n, dx], [n, L] -> [n, L]``."""
        return jnp.take_along_axis(self.item_base(context), rankings, axis=-1)

    def interaction_sum(self, rankings: jax.Array) -> jax.Array:
        """``sum_{m != l} W(a_m, a_l)``: ``[n, L] -> [n, L]`` (W has a zero diagonal)."""
        pair = self.interaction[rankings[..., :, None], rankings[..., None, :]]  # [n, L(m), L(l)]
        return jnp.sum(pair, axis=-2)

    def expected_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``q_l(x, a)``: ``[n, dx], [n, L] -> [n, L]``."""
        return self.base_reward(context, rankings) + self.lam * self.interaction_sum(rankings)

    def best_rankings(
        self,
        context: jax.Array,
        position_weight: jax.Array,
        *,
        n_items: int | None = None,
        max_enumerated: int = 2_000_000,
        beam_width: int = 64,
        interaction_t: jax.Array | None = None,
    ) -> tuple[jax.Array, str]:
        """``argmax_a sum_l alpha_l q_l(x, a)`` per context, and how it was found.

        Exact by enumeration while ``D!/(D-L)! <= max_enumerated``: the interaction part of
        every ranking's value is context-free, so values are one matrix product plus a
        constant per ranking. Beyond that, without interactions (``lambda = 0`` or ``W = 0``)
        exact by sorting: the L largest base rewards, the largest on the largest
        position weight (``"exact-sort"``, ``O(D)`` per context). Otherwise a beam search
        of width ``beam_width`` on the true q over all D items
        ([`opl_rank.opl.completion.best_rankings_beam`][opl_rank.opl.completion.best_rankings_beam], ``O(B D L)`` per context; a lower
        bound on V*, reported as ``"beam"``).

        Args:
          context: ``[n, dx]``.
          position_weight: ``[L]`` alpha.
          n_items: unused (``D`` is the base reward's width).
          max_enumerated: the switch-over.
          beam_width: partial rankings kept by the beam search.
          interaction_t: ``W^T`` when already at hand (repeated calls at large D: the beam
            search gathers rows of W and of W^T).

        Returns:
          ``(rankings [n, L] int32, "exact", "exact-sort" or "beam")``.
        """
        alpha = position_weight
        base = self.item_base(context)  # [n, D]
        n_items, n_slots = base.shape[-1], alpha.shape[0]
        n_rank = math.perm(n_items, n_slots)
        if n_rank <= max_enumerated:
            perms = jnp.asarray(pl.all_rankings(n_items, n_slots))  # [P, L]
            weights = jnp.einsum("l,pld->dp", alpha, jax.nn.one_hot(perms, n_items))  # [D, P]
            inter = self.lam * (self.interaction_sum(perms) @ alpha)  # [P]
            rows = max(1, min(context.shape[0], 2**24 // n_rank))
            best = jax.lax.map(lambda b: jnp.argmax(b @ weights + inter), base, batch_size=rows)  # per context
            return perms[best], "exact"
        if not _has_interactions(self.lam, self.interaction):
            # Rearrangement: the largest base rewards on the largest weights.
            top = jax.lax.top_k(base, n_slots)[1].astype(jnp.int32)  # [n, L], largest first
            slot_rank = jnp.argsort(
                jnp.argsort(-alpha, stable=True), stable=True
            )  # slot l gets the slot_rank[l]-th largest
            return top[:, slot_rank], "exact-sort"
        return completion.best_rankings_beam(
            base, self.interaction, alpha, beam_width=beam_width, scale=self.lam, v_t=interaction_t
        ), "beam"

    def sample_reward(self, key: jax.Array, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """Realised ``r_l``: ``[n, dx], [n, L] -> [n, L]``; fresh X_l and noise per call."""
        k_switch, k_noise = jax.random.split(key)
        switch = jax.random.uniform(k_switch, rankings.shape) <= self.lam  # 1{X_l <= lambda}
        mean = self.base_reward(context, rankings) + jnp.where(switch, self.interaction_sum(rankings), 0.0)
        return mean + self.sigma * jax.random.normal(k_noise, rankings.shape, jnp.float32)


class SyntheticRewards(InteractionRewards, struct.PyTreeNode):
    """Ground-truth rewards of the synthetic environment (a pytree: ``lambda`` and
    ``sigma`` are arrays, so new values do not recompile).

    Attributes:
      theta: ``[D, dx]`` item coefficients theta_a ~ N(0, I).
      bias: ``[D]`` item biases b_a.
      interaction: ``[D, D]`` W(a_m, a_l), symmetric, zero diagonal.
      lam: ``[]`` interaction strength lambda in [0, 1].
      sigma: ``[]`` reward noise standard deviation.
    """

    theta: jax.Array  # [D, dx]
    bias: jax.Array  # [D]
    interaction: jax.Array  # [D, D]
    lam: jax.Array  # []
    sigma: jax.Array  # []

    def item_base(self, context: jax.Array) -> jax.Array:
        """``theta_a^T x + b_a``: ``[n, dx] -> [n, D]``."""
        return context @ self.theta.T + self.bias[None, :]


def _has_interactions(lam: jax.Array, interaction: jax.Array) -> bool:
    """Whether ``lambda W`` has a non-zero entry (True when not concrete; the diagonal is zero
    by construction and never counts)."""
    try:
        return float(lam) != 0.0 and bool(jnp.any(interaction != 0))
    except jax.errors.ConcretizationTypeError:
        return True


def symmetric_interaction(key: jax.Array, n_items: int, scale: float) -> jax.Array:
    """``W``: ``[D, D]`` symmetric, zero diagonal, ``N(0, scale^2)`` entries."""
    w = jnp.triu(jax.random.normal(key, (n_items, n_items), jnp.float32) * scale, 1)
    return w + w.T


@dataclasses.dataclass(frozen=True)
class SyntheticRankingEnv:
    """Synthetic OPL-for-ranking environment with a logging policy.

    Build with [`create`][create]. ``D`` = ``n_items``, ``L`` = ``ranking_length``.

    Examples:
      >>> import jax
      >>> env = SyntheticRankingEnv.create(jax.random.key(0), n_items=6, ranking_length=3)
      >>> data = env.sample_logged_data(jax.random.key(1), 100)
      >>> data.ranking.shape, data.reward.shape
      ((100, 3), (100, 3))
    """

    reward_model: SyntheticRewards
    logging_policy: Callable[[jax.Array, jax.Array | None], jax.Array]
    position_weight: jax.Array  # [L]
    item_features: jax.Array  # [D, D]: one-hot item identities, passed to logging policies
    n_items: int
    ranking_length: int
    context_dim: int

    @classmethod
    def create(
        cls,
        key: jax.Array,
        *,
        n_items: int = 10,
        ranking_length: int = 5,
        context_dim: int = 5,
        lam: float = 0.5,
        sigma: float = 0.5,
        interaction_scale: float = 1.0,
        bias_scale: float = 1.0,
        position_weight: Any = None,
        logging_temperature: float = 1.0,
        logging_policy: Any = None,
    ) -> SyntheticRankingEnv:
        """Draw an environment.

        Args:
          key: PRNG key for theta, b, W and the default logging policy's parameters.
          n_items: ``D``, candidate items (>= 1).
          ranking_length: ``L`` in ``[1, D]``.
          context_dim: ``dx`` (the paper: 5).
          lam: interaction strength lambda in [0, 1].
          sigma: reward noise standard deviation (the paper: 0.5), >= 0.
          interaction_scale: standard deviation of W's entries (ours: 1).
          bias_scale: standard deviation of b_a (ours: 1).
          position_weight: ``[L]`` alpha, non-negative (default DCG 1/log2(l+1)).
          logging_temperature: tau of the default PL-linear logging policy (> 0).
          logging_policy: None (PL linear, U(0,1) coefficients, ``logging_temperature``),
            ``"uniform"``, or any callable ``(context [n, dx], item_features [D, D]) ->
            logits [n, D]``.

        Returns:
          The environment.
        """
        _check_int("context_dim", context_dim, 1)
        position_weight = check_environment_args(
            n_items,
            ranking_length,
            lam,
            logging_temperature,
            position_weight,
            sigma=sigma,
            interaction_scale=interaction_scale,
            bias_scale=bias_scale,
        )

        k_theta, k_bias, k_w, k_log = jax.random.split(key, 4)
        reward_model = SyntheticRewards(
            theta=jax.random.normal(k_theta, (n_items, context_dim), jnp.float32),
            bias=jax.random.normal(k_bias, (n_items,), jnp.float32) * bias_scale,
            interaction=symmetric_interaction(k_w, n_items, interaction_scale),
            lam=jnp.asarray(lam, jnp.float32),
            sigma=jnp.asarray(sigma, jnp.float32),
        )
        if logging_policy is None:
            logging_policy = PlackettLuceLinear.random(k_log, n_items, context_dim, logging_temperature)
        elif isinstance(logging_policy, str):
            if logging_policy != "uniform":
                raise ValueError(f"logging_policy must be None, 'uniform' or a callable, got {logging_policy!r}")
            logging_policy = UniformLogging(n_items)
        else:
            logging_policy = as_logging_policy(logging_policy, n_items)
        return cls(
            reward_model=reward_model,
            logging_policy=logging_policy,
            position_weight=position_weight,
            item_features=jnp.eye(n_items, dtype=jnp.float32),
            n_items=n_items,
            ranking_length=ranking_length,
            context_dim=context_dim,
        )

    # -- variations without redrawing parameters -----------------------------------------
    def with_lambda(self, lam: float) -> SyntheticRankingEnv:
        """The same items and logging policy with another interaction strength."""
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        return dataclasses.replace(self, reward_model=self.reward_model.replace(lam=jnp.asarray(lam, jnp.float32)))

    # -- sampling ------------------------------------------------------------------------
    def sample_contexts(self, key: jax.Array, n: int) -> jax.Array:
        """``x ~ N(0, I)``: float32 ``[n, dx]``."""
        return jax.random.normal(key, (n, self.context_dim), jnp.float32)

    def logging_logits(self, context: jax.Array) -> jax.Array:
        """The logging policy's PL logits ``[n, D]``."""
        return self.logging_policy(context, self.item_features)

    def sample_logged_data(
        self, key: jax.Array, n: int, *, position_marginals: str = "none", progress: Callable[[int], None] | None = None
    ) -> LoggedData:
        """Log ``n`` rounds of the logging policy.

        Args:
          key: PRNG key.
          n: rows.
          position_marginals: ``"exact"`` also stores ``log P_0(a_l = a_il | x)`` (for IIPS),
            computed exactly by the exponential-race quadrature; ``"none"`` skips it.
          progress: called with the rows done after each chunk (e.g. ``tqdm(total=n).update``).

        Returns:
          Validated [`LoggedData`][opl_rank.data.LoggedData].
        """
        arrays = rollout_logging_policy(
            key,
            n,
            sample_contexts=self.sample_contexts,
            logging_logits=self.logging_logits,
            reward_model=self.reward_model,
            n_items=self.n_items,
            n_slots=self.ranking_length,
            position_marginals=position_marginals,
            progress=progress,
        )
        return LoggedData(
            position_weight=self.position_weight,
            n_items=self.n_items,
            item_features=self.item_features,
            **{k: jnp.asarray(v) for k, v in arrays.items()},
        )

    # -- ground truth ----------------------------------------------------------------------
    def expected_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``q_l(x, a)``: ``[n, dx], [n, L] -> [n, L]``."""
        return self.reward_model.expected_reward(context, rankings)

    def policy_value(
        self, policy: Any, key: jax.Array, n_contexts: int = 100_000, *, progress: Callable[[int], None] | None = None
    ) -> PolicyValue:
        """Ground-truth ``V(pi)`` by Monte Carlo over fresh contexts (exact q, no noise).

        Args:
          policy: ``(key, context [n, dx]) -> rankings [n, L]`` or an object with ``sample``.
          key: PRNG key.
          n_contexts: contexts drawn.
          progress: called with the contexts done after each chunk (see
            [`sample_logged_data`][sample_logged_data]).
        """
        return evaluate_policy(
            policy,
            key,
            n_contexts,
            sample_contexts=self.sample_contexts,
            reward_model=self.reward_model,
            position_weight=self.position_weight,
            n_items=self.n_items,
            progress=progress,
        )

    def logging_policy_sampler(self) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """``(key, context) -> rankings``: samples the logging policy."""

        def sample(key: jax.Array, context: jax.Array) -> jax.Array:
            return pl.sample_rankings(key, self.logging_logits(context), self.ranking_length)

        return sample

    def logging_policy_value(
        self, key: jax.Array, n_contexts: int = 100_000, *, progress: Callable[[int], None] | None = None
    ) -> PolicyValue:
        """Ground-truth ``V(pi_0)`` of the logging policy."""
        return self.policy_value(self.logging_policy_sampler(), key, n_contexts, progress=progress)

    def best_rankings(
        self,
        context: jax.Array,
        *,
        max_enumerated: int = 2_000_000,
        beam_width: int = 64,
        interaction_t: jax.Array | None = None,
    ) -> tuple[jax.Array, str]:
        """``argmax_a sum_l alpha_l q_l(x, a)`` per context: the reward model's
        ``best_rankings`` (see [`InteractionRewards.best_rankings`][InteractionRewards.best_rankings]).

        Returns:
          ``(rankings [n, L] int32, how they were found)``.
        """
        return self.reward_model.best_rankings(
            context,
            self.position_weight,
            n_items=self.n_items,
            max_enumerated=max_enumerated,
            beam_width=beam_width,
            **({} if interaction_t is None else {"interaction_t": interaction_t}),
        )

    def optimal_value(
        self,
        key: jax.Array,
        n_contexts: int = 20_000,
        *,
        max_enumerated: int = 2_000_000,
        beam_width: int = 64,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[PolicyValue, str]:
        """``V* = E_x max_a sum_l alpha_l q_l(x, a)`` (see [`best_rankings`][best_rankings]; W^T is formed
        once for all the chunks of contexts)."""
        methods = set()
        extra = {}
        if (
            isinstance(self.reward_model, InteractionRewards)
            and math.perm(self.n_items, self.ranking_length) > max_enumerated
        ):
            extra["interaction_t"] = (
                jnp.transpose(self.reward_model.interaction) + 0.0
            )  # other reward models: as they are

        def best(key, context):
            rankings, method = self.reward_model.best_rankings(
                context,
                self.position_weight,
                n_items=self.n_items,
                max_enumerated=max_enumerated,
                beam_width=beam_width,
                **extra,
            )
            methods.add(method)
            return rankings

        value = self.policy_value(best, key, n_contexts, progress=progress)
        return value, methods.pop()


def check_environment_args(
    n_items: int, ranking_length: int, lam: float, logging_temperature: float, position_weight: Any, **scales: float
) -> jax.Array:
    """Validate what every environment takes (errors name the argument); returns the
    ``[L]`` float32 position weights (DCG when None)."""
    _check_int("n_items", n_items, 1)
    _check_int("ranking_length", ranking_length, 1)
    if ranking_length > n_items:
        raise ValueError(f"ranking_length={ranking_length} must be <= n_items={n_items}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    for name, value in scales.items():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    if not (math.isfinite(logging_temperature) and logging_temperature > 0):
        raise ValueError(f"logging_temperature must be > 0, got {logging_temperature}")
    if position_weight is None:
        position_weight = dcg_position_weights(ranking_length)
    position_weight = jnp.asarray(position_weight, jnp.float32)
    if position_weight.shape != (ranking_length,):
        raise ValueError(f"position_weight must have shape (L,) = ({ranking_length},), got {position_weight.shape}")
    if not bool(jnp.all(jnp.isfinite(position_weight))) or bool(jnp.any(position_weight < 0)):
        raise ValueError(f"position_weight must be finite and non-negative, got {position_weight.tolist()}")
    return position_weight


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


SyntheticRewardModel = SyntheticRewards  # its name before 0.2.0 (one release)
