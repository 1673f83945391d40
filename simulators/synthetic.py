"""The R-POD paper's synthetic ranking environment (Eqs. 14-15; docs/maths.md §1.25-1.26).

Contexts ``x ~ N(0, I_dx)``. Position-wise expected reward of ranking ``a``:

    q_l(x, a) = theta_{a_l}^T x + b_{a_l} + lambda * sum_{m != l} W(a_m, a_l),

realised per logged row and slot as ``base + 1{X_l <= lambda} * sum_{m != l} W(a_m, a_l)``
with ``X_l ~ U(0, 1)``, then ``r_l ~ N(q_l, sigma^2)``. All noise is drawn fresh for every
row, slot and call. The paper leaves ``b`` and ``W`` unspecified; our defaults are
``b_a ~ N(0, 1)`` and a symmetric ``W`` with ``N(0, interaction_scale^2)`` entries and a
zero diagonal. The logging policy is PL with logits ``(theta0_a^T x + b0_a) / tau``,
``theta0, b0 ~ U(0, 1)`` (Eq. 15), or any other logging policy.

Beyond the paper, a *reward structure* says which slots' items enter slot ``l``'s
interaction sum: a behaviour matrix ``c [L, L]`` (the AIPS convention: ``c[l, l'] = 1`` iff
slot ``l``'s reward depends on the item at slot ``l'``, unit diagonal), and then
``q_l = base(x, a_l) + lambda * sum_{m != l, c[l, m] = 1} W(a_m, a_l)``. Built in:
``"symmetric"`` (all ones, the paper's model and the default), ``"independent"`` (identity),
``"cascade"`` (``l' <= l``), ``"neighbour"`` (``|l - l'| <= 1``) and ``"context"`` (one of
the four others per context, by the quartile of ``x[0]``); or any 0/1 ``[L, L]`` array.
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
from opl_rank.reductions import first_argmax
from simulators.logging_policies import PlackettLuceLinear, UniformLogging, as_logging_policy
from simulators.rollout import PolicyValue, evaluate_policy, rollout_logging_policy

__all__ = [
    "REWARD_STRUCTURES",
    "CONTEXT_BEHAVIOURS",
    "CONTEXT_CUTS",
    "InteractionRewards",
    "SyntheticRewards",
    "SyntheticRewardModel",
    "SyntheticRankingEnv",
    "symmetric_interaction",
    "structure_mask",
    "reward_structure_masks",
    "masked_interaction_sum",
]

REWARD_STRUCTURES = ("symmetric", "independent", "cascade", "neighbour", "context")
# "context": the behaviour of x is CONTEXT_BEHAVIOURS[#{cuts <= x[0]}]; the cuts are the
# standard normal quartiles, so with x ~ N(0, I) each behaviour covers a quarter of contexts.
CONTEXT_BEHAVIOURS = ("independent", "cascade", "neighbour", "symmetric")
CONTEXT_CUTS = (-0.6744897501960817, 0.0, 0.6744897501960817)


class InteractionRewards:
    """Position rewards ``q_l = base(x, a_l) + lambda * sum_{m != l, c[l, m] = 1} W(a_m, a_l)``
    (Eq. 14, with a reward structure ``c``).

    Shared by the synthetic and the semi-synthetic reward models, which differ only in the
    per-item base reward [`item_base`][item_base]. Subclasses are pytrees with the fields
    ``interaction [D, D]`` (symmetric, zero diagonal), ``lam []`` and ``sigma []``, and
    optionally ``behaviour_masks [B, L, L]`` with ``behaviour_cuts [B - 1]`` (the reward
    structure: context ``x`` has behaviour ``behaviour_masks[#{cuts <= x[0]}]``). Without
    them (None, the class defaults) every slot depends on every slot: the paper's model,
    on the code path it always had.
    """

    # Class-level defaults, not fields: a subclass that takes a reward structure declares
    # them as pytree fields (SyntheticRewards); the semi-synthetic model stays symmetric.
    behaviour_masks: jax.Array | None = None  # [B, L, L] float32 0/1, or None: all ones
    behaviour_cuts: jax.Array | None = None  # [B - 1] float32 thresholds on x[0]

    def item_base(self, context: jax.Array) -> jax.Array:
        """``[n, dx] -> [n, D]`` base reward of every item."""
        raise NotImplementedError

    def base_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``base(x, a_l)``: ``[n, dx], [n, L] -> [n, L]``."""
        return jnp.take_along_axis(self.item_base(context), rankings, axis=-1)

    def behaviour_index(self, context: jax.Array) -> jax.Array:
        """Which of the ``B`` behaviours each context has: ``[n, dx] -> [n]`` int32 (all 0
        for a fixed structure: no cuts)."""
        if self.behaviour_cuts is None:
            return jnp.zeros(context.shape[:1], jnp.int32)
        return jnp.sum(context[:, :1] >= self.behaviour_cuts[None, :], axis=-1, dtype=jnp.int32)

    def behaviour(self, context: jax.Array, n_slots: int | None = None) -> jax.Array:
        """The true behaviour matrix ``c`` of every context: ``[n, dx] -> [n, L, L]`` int32
        (``c[l, l'] = 1`` iff slot l's reward depends on the item at slot l').

        Args:
          context: ``[n, dx]``.
          n_slots: ``L``; needed only without stored masks (the symmetric model, all ones).
        """
        if self.behaviour_masks is None:
            if n_slots is None:
                raise ValueError("behaviour of the symmetric reward structure needs n_slots (L)")
            return jnp.ones((context.shape[0], n_slots, n_slots), jnp.int32)
        return self.behaviour_masks[self.behaviour_index(context)].astype(jnp.int32)

    def interaction_sum(self, rankings: jax.Array, context: jax.Array | None = None) -> jax.Array:
        """``sum_{m != l, c[l, m] = 1} W(a_m, a_l)``: ``[n, L] -> [n, L]`` (W has a zero diagonal).

        ``context [n, dx]`` is needed only by a context-dependent structure."""
        if self.behaviour_masks is None:  # symmetric: the paper's model, its code path as it was
            pair = self.interaction[rankings[..., :, None], rankings[..., None, :]]  # [n, L(m), L(l)]
            return jnp.sum(pair, axis=-2)
        if self.behaviour_masks.shape[0] == 1:  # a fixed structure: the same c for every row
            masks = self.behaviour_masks
        elif context is None:
            raise ValueError("interaction_sum of a context-dependent reward structure needs the context")
        else:
            masks = self.behaviour_masks[self.behaviour_index(context)]  # [n, L, L]
        return masked_interaction_sum(self.interaction, rankings, masks)

    def expected_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``q_l(x, a)``: ``[n, dx], [n, L] -> [n, L]``."""
        return self.base_reward(context, rankings) + self.lam * self.interaction_sum(rankings, context)

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

        Without interactions (``lambda = 0``, ``W = 0`` or the ``"independent"`` structure)
        exact by sorting: the L largest base rewards, the largest on the largest position
        weight (``"exact-sort"``, ``O(D)`` per context, whatever D). Otherwise exact by
        enumeration while ``D!/(D-L)! <= max_enumerated``: for a fixed reward structure the
        interaction part of every ranking's value is context-free, so values are one matrix
        product plus a constant per ranking (a context-dependent structure: one constant per
        behaviour, each context adding its own). Beyond that, for the symmetric structure, a
        beam search of width ``beam_width`` on the true q over all D items
        ([`opl_rank.opl.completion.best_rankings_beam`][opl_rank.opl.completion.best_rankings_beam], ``O(B D L)`` per context; a lower
        bound on V*, reported as ``"beam"``); any other structure is a ValueError (the beam
        search scores every pair of placed items, so it is not the optimum of a masked sum).

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
        n_items, n_slots = self.interaction.shape[-1], alpha.shape[0]
        n_rank = math.perm(n_items, n_slots)
        if not _has_interactions(self.lam, self.interaction, self.behaviour_masks):
            # Rearrangement: the largest base rewards on the largest weights (the enumeration's
            # ranking, at O(D) instead of O(D!/(D-L)!) per context).
            top = jax.lax.top_k(self.item_base(context), n_slots)[1].astype(jnp.int32)  # [n, L], largest first
            slot_rank = jnp.argsort(
                jnp.argsort(-alpha, stable=True), stable=True
            )  # slot l gets the slot_rank[l]-th largest
            return top[:, slot_rank], "exact-sort"
        if n_rank <= max_enumerated:
            return _best_by_enumeration(self, context, alpha), "exact"
        base = self.item_base(context)  # [n, D]
        if self.behaviour_masks is not None:
            raise ValueError(
                f"the optimum under a reward structure other than symmetric or independent needs enumeration: "
                f"D!/(D-L)! = {n_rank} rankings exceed max_enumerated={max_enumerated} (D={n_items}, L={n_slots})"
            )
        return completion.best_rankings_beam(
            base, self.interaction, alpha, beam_width=beam_width, scale=self.lam, v_t=interaction_t
        ), "beam"

    def sample_reward(self, key: jax.Array, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """Realised ``r_l``: ``[n, dx], [n, L] -> [n, L]``; fresh X_l and noise per call."""
        k_switch, k_noise = jax.random.split(key)
        switch = jax.random.uniform(k_switch, rankings.shape) <= self.lam  # 1{X_l <= lambda}
        inter = self.interaction_sum(rankings, context)
        mean = self.base_reward(context, rankings) + jnp.where(switch, inter, 0.0)
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
      behaviour_masks: ``[B, L, L]`` float32 behaviour matrices of the reward structure
        (see [`reward_structure_masks`][reward_structure_masks]), or None: symmetric.
      behaviour_cuts: ``[B - 1]`` float32 thresholds on ``x[0]`` choosing the behaviour,
        or None (one behaviour).
    """

    theta: jax.Array  # [D, dx]
    bias: jax.Array  # [D]
    interaction: jax.Array  # [D, D]
    lam: jax.Array  # []
    sigma: jax.Array  # []
    behaviour_masks: jax.Array | None = None  # [B, L, L]; None: symmetric (the paper's model)
    behaviour_cuts: jax.Array | None = None  # [B - 1]

    def item_base(self, context: jax.Array) -> jax.Array:
        """``theta_a^T x + b_a``: ``[n, dx] -> [n, D]``."""
        return context @ self.theta.T + self.bias[None, :]


@jax.jit
def _best_by_enumeration(reward_model: InteractionRewards, context: jax.Array, alpha: jax.Array) -> jax.Array:
    """``argmax_a sum_l alpha_l q_l(x, a)`` over all ``D!/(D-L)!`` rankings, as one program:
    ``[n, dx], [L] -> [n, L]`` int32. The interaction part of a ranking's value is context-free
    (one constant per ranking, or per behaviour and ranking), so values are a matrix product
    plus a constant, taken over contexts in batches of about 2^20 values (4 MB, within the
    CPU's cache: D = 10, L = 5, 20,000 contexts in 0.36 s against 1.5 s with batches of 2^24 and
    ``jnp.argmax``, docs/performance.md §30)."""
    base = reward_model.item_base(context)  # [n, D]
    n_items, n_slots = base.shape[-1], alpha.shape[0]
    n_rank = math.perm(n_items, n_slots)
    perms = jnp.asarray(pl.all_rankings(n_items, n_slots))  # [P, L]
    weights = jnp.einsum("l,pld->dp", alpha, jax.nn.one_hot(perms, n_items))  # [D, P]
    rows = max(1, min(context.shape[0], 2**20 // n_rank))
    if reward_model.behaviour_masks is None:
        inter = reward_model.lam * (reward_model.interaction_sum(perms) @ alpha)  # [P]
        best = jax.lax.map(lambda b: first_argmax(b @ weights + inter), base, batch_size=rows)  # per context
        return perms[best]
    inters = reward_model.lam * jnp.stack(  # [B, P]: every ranking's interaction value under each behaviour
        [masked_interaction_sum(reward_model.interaction, perms, m[None]) @ alpha for m in reward_model.behaviour_masks]
    )
    best = jax.lax.map(
        lambda bi: first_argmax(bi[0] @ weights + inters[bi[1]]),
        (base, reward_model.behaviour_index(context)),
        batch_size=rows,
    )
    return perms[best]


def _has_interactions(lam: jax.Array, interaction: jax.Array, masks: jax.Array | None = None) -> bool:
    """Whether ``lambda W`` has a non-zero entry that some slot's reward reads (True when not
    concrete; the diagonals of W and of the masks never count)."""
    try:
        if masks is not None:
            off_diagonal = masks * (1.0 - jnp.eye(masks.shape[-1], dtype=jnp.float32))[None, :, :]
            if not bool(jnp.any(off_diagonal != 0)):
                return False
        return float(lam) != 0.0 and bool(jnp.any(interaction != 0))
    except jax.errors.ConcretizationTypeError:
        return True


def masked_interaction_sum(interaction: jax.Array, rankings: jax.Array, masks: jax.Array) -> jax.Array:
    """``sum_{m != l, c[l, m] = 1} W(a_m, a_l)``: ``[D, D], [n, L], [n or 1, L, L] -> [n, L]``.

    ``masks`` are behaviour matrices ``c`` (row l: the slots slot l depends on); W's zero
    diagonal drops ``m = l``."""
    pair = interaction[rankings[..., :, None], rankings[..., None, :]]  # [n, L(m), L(l)]
    return jnp.sum(pair * jnp.swapaxes(masks, -1, -2), axis=-2)  # c[l, m] laid out as [m, l]


def structure_mask(name: str, n_slots: int) -> np.ndarray:
    """The behaviour matrix ``c`` of a fixed built-in structure: ``[L, L]`` int32."""
    slot = np.arange(n_slots)
    if name == "symmetric":
        return np.ones((n_slots, n_slots), np.int32)
    if name == "independent":
        return np.eye(n_slots, dtype=np.int32)
    if name == "cascade":  # slot l reads the items above it (and its own)
        return (slot[None, :] <= slot[:, None]).astype(np.int32)
    if name == "neighbour":
        return (np.abs(slot[:, None] - slot[None, :]) <= 1).astype(np.int32)
    fixed = [n for n in REWARD_STRUCTURES if n != "context"]
    raise ValueError(f"reward_structure: no fixed structure {name!r}; fixed ones: {fixed}")


def reward_structure_masks(structure: Any, n_slots: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Validate a ``reward_structure`` and give what the reward pytree stores.

    Args:
      structure: a name of ``REWARD_STRUCTURES`` or a 0/1 ``[L, L]``
        array with a unit diagonal.
      n_slots: ``L``.

    Returns:
      ``(behaviour_masks [B, L, L] float32, behaviour_cuts [B - 1] float32)``; ``(None,
      None)`` for the symmetric structure (an all-ones array included), which keeps the
      paper's code path; ``cuts`` None for a fixed structure.
    """
    if isinstance(structure, str):
        if structure not in REWARD_STRUCTURES:
            raise ValueError(
                f"reward_structure must be one of {list(REWARD_STRUCTURES)} or a 0/1 [L, L] array, got {structure!r}"
            )
        if structure == "context":
            masks = np.stack([structure_mask(name, n_slots) for name in CONTEXT_BEHAVIOURS])
            return masks.astype(np.float32), np.asarray(CONTEXT_CUTS, np.float32)
        mask = structure_mask(structure, n_slots)
    else:
        try:
            mask = np.asarray(structure, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                f"reward_structure must be a name in {list(REWARD_STRUCTURES)} or a 0/1 [L, L] array, got {structure!r}"
            ) from None
        if mask.shape != (n_slots, n_slots):
            raise ValueError(f"reward_structure must have shape [L, L] = ({n_slots}, {n_slots}), got {mask.shape}")
        if not np.all((mask == 0) | (mask == 1)):
            raise ValueError(f"reward_structure must hold only 0 and 1, got {mask.tolist()}")
        if not np.all(np.diag(mask) == 1):
            raise ValueError(
                f"reward_structure must have a unit diagonal (slot l depends on its item), got {mask.tolist()}"
            )
    if np.all(mask == 1):  # symmetric: no masks, the paper's exact code path
        return None, None
    return mask.astype(np.float32)[None, :, :], None


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
        reward_structure: Any = "symmetric",
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
          reward_structure: which slots' items enter slot l's interaction sum: one of
            ``REWARD_STRUCTURES`` (``"symmetric"``, the paper's model;
            ``"independent"``; ``"cascade"``; ``"neighbour"``; ``"context"``) or a 0/1
            ``[L, L]`` behaviour matrix with a unit diagonal (see the module docstring).
            It draws nothing: the same key gives the same theta, b, W for every structure.

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
        masks, cuts = reward_structure_masks(reward_structure, ranking_length)

        k_theta, k_bias, k_w, k_log = jax.random.split(key, 4)
        reward_model = SyntheticRewards(
            theta=jax.random.normal(k_theta, (n_items, context_dim), jnp.float32),
            bias=jax.random.normal(k_bias, (n_items,), jnp.float32) * bias_scale,
            interaction=symmetric_interaction(k_w, n_items, interaction_scale),
            lam=jnp.asarray(lam, jnp.float32),
            sigma=jnp.asarray(sigma, jnp.float32),
            behaviour_masks=None if masks is None else jnp.asarray(masks),
            behaviour_cuts=None if cuts is None else jnp.asarray(cuts),
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
        self,
        key: jax.Array,
        n: int,
        *,
        position_marginals: str = "none",
        progress: Callable[[int], None] | None = None,
        logging_logits: bool = False,
    ) -> LoggedData:
        """Log ``n`` rounds of the logging policy.

        Args:
          key: PRNG key.
          n: rows.
          position_marginals: ``"exact"`` also stores ``log P_0(a_l = a_il | x)`` (for IIPS),
            computed exactly by the exponential-race quadrature; ``"none"`` skips it.
          progress: called with the rows done after each chunk (e.g. ``tqdm(total=n).update``).
          logging_logits: also store the logging policy's logits ``[n, D]``
            (``LoggedData.logging_logits``: what ``aips`` needs for non-prefix item sets).

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
            store_logits=logging_logits,
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

    def behaviour(self, context: jax.Array) -> jax.Array:
        """The true behaviour matrix of every context (the reward structure; what an
        adaptive-IPS estimator takes as its true behaviour): ``[n, dx] -> [n, L, L]`` int32,
        ``c[l, l'] = 1`` iff slot l's reward depends on the item at slot l'."""
        return self.reward_model.behaviour(context, n_slots=self.ranking_length)

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
    weights = np.asarray(position_weight)  # checked on the host: no op-by-op programs to load
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError(f"position_weight must be finite and non-negative, got {position_weight.tolist()}")
    return position_weight


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


SyntheticRewardModel = SyntheticRewards  # its name before 0.2.0 (one release)
