"""Reward models f_hat(x, a) (R-POD Eq. 12) and the second-stage completion (Eq. 13).

Two kinds, both giving per-slot values ``h_l(x, a)`` with ``f_hat = sum_l alpha_l h_l``:

  additive   ``h_l = g(x, a_l)``: an item-wise model; completion sorts the remaining items
             by ``g`` (optimal for non-increasing alpha).
  pairwise   ``h_l = g(x, a_l) + sum_{m != l} V(a_m, a_l)``: sees the whole ranking through
             learned pairwise item interactions (captures the synthetic environment's F);
             completion enumerates every completion when there are at most
             ``max_enumerated`` (512) of them -- scored by two matrix products -- and
             is a beam search (``beam_width`` 4; 1 is greedy) otherwise. With D = 10,
             L = 5 that is exact for k >= 2 and beam search for k <= 1.

Fitting is least squares on ``R = sum_l alpha_l r_l`` (Eq. 12; ``target="sum"``) or on each
slot's reward (``target="slots"``), with the shared loop of :mod:`opl_rank.optimization`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from opl_rank.data import LoggedData
from opl_rank.optimization import TrainConfig, minimize
from opl_rank.policies import ActionScorer

__all__ = ["RewardModel", "fit_reward_model", "REWARD_MODEL_KINDS"]

REWARD_MODEL_KINDS = ("additive", "pairwise")


class _SlotValues(nn.Module):
    """``(context [n, dx], rankings [.., n, K]) -> [.., n, K]`` per-slot values h_l."""

    n_items: int
    hidden: Sequence[int]
    pairwise: bool

    def setup(self):
        self.item_head = ActionScorer(n_items=self.n_items, hidden=tuple(self.hidden))
        if self.pairwise:
            self.interaction = self.param("interaction", nn.initializers.zeros, (self.n_items, self.n_items))

    def item_values(self, context: jax.Array) -> jax.Array:
        """``g(x, d)``: ``[n, dx] -> [n, D]``."""
        return self.item_head(context)

    def __call__(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        g = self.item_head(context)  # [n, D]
        g = jnp.broadcast_to(g, rankings.shape[:-1] + g.shape[-1:])
        if self.pairwise:
            # sum_{m != l} V(a_m, a_l) = (placed @ V)[a_l] with V's diagonal zeroed: one
            # small matmul instead of an [.., K, K] gather.
            g = g + _one_hot_sum(rankings, self.n_items) @ _zero_diagonal(self.interaction)
        return jnp.take_along_axis(g, rankings, axis=-1)


def _zero_diagonal(v: jax.Array) -> jax.Array:
    return v * (1.0 - jnp.eye(v.shape[-1], dtype=v.dtype))


def _one_hot_sum(items: jax.Array, n_items: int, weights: jax.Array | None = None) -> jax.Array:
    """``sum_m w_m e_{items_m}``: int ``[.., K]`` (and ``[K]`` weights) -> float32 ``[.., D]``."""
    one_hot = jax.nn.one_hot(items, n_items, dtype=jnp.float32)  # [.., K, D]
    if weights is None:
        return jnp.sum(one_hot, axis=-2)
    return jnp.einsum("...kd,k->...d", one_hot, weights)


@dataclasses.dataclass(frozen=True)
class RewardModel:
    """A fitted f_hat. Pure-array methods; jit-able through ``params``."""

    kind: str
    module: _SlotValues
    params: Any
    position_weight: jax.Array  # [L]
    max_enumerated: int = 512
    beam_width: int = 4

    @property
    def n_slots(self) -> int:
        return int(self.position_weight.shape[0])

    def slot_values(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``h_l(x, a)``: ``[n, dx], [.., n, K<=L] -> [.., n, K]``."""
        return self.module.apply(self.params, context, rankings)

    def predict(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``f_hat(x, a) = sum_l alpha_l h_l``: ``[n, dx], [.., n, L] -> [.., n]``."""
        return self.slot_values(context, rankings) @ self.position_weight

    def item_values(self, context: jax.Array) -> jax.Array:
        """``g(x, d)`` ``[n, D]`` (the whole model when ``kind == "additive"``)."""
        return self.module.apply(self.params, context, method=_SlotValues.item_values)

    def complete(self, context: jax.Array, prefixes: jax.Array) -> jax.Array:
        """Second stage (Eq. 13): the best completion of each prefix under f_hat.

        Args:
          context: ``[n, dx]``.
          prefixes: int ``[.., n, k]`` with ``0 <= k <= L``.

        Returns:
          int ``[.., n, L]``: the prefix followed by ``argmax_{a'} f_hat(x, (prefix, a'))``
          (exact for ``additive``; for ``pairwise`` exact by enumeration when the number
          of completions is at most ``max_enumerated``, beam search otherwise).
        """
        k = prefixes.shape[-1]
        n_items = self.module.n_items
        rest = self.n_slots - k
        if rest == 0:
            return prefixes
        placed = _one_hot_sum(prefixes, n_items)  # [.., n, D] 0/1
        g = jnp.broadcast_to(self.item_values(context), placed.shape)
        if self.kind == "additive":
            tail = jax.lax.top_k(jnp.where(placed > 0, -jnp.inf, g), rest)[1].astype(prefixes.dtype)
            return jnp.concatenate([prefixes, tail], axis=-1)
        weighted = _one_hot_sum(prefixes, n_items, self.position_weight[:k])
        if math.perm(n_items - k, rest) <= self.max_enumerated:
            tail = self._complete_enumerate(g, placed, weighted, k)
        else:
            tail = self._complete_beam(g, placed, weighted, k)
        return jnp.concatenate([prefixes, tail.astype(prefixes.dtype)], axis=-1)

    def _slot_gains(self, g, placed, weighted, first_slot, n_slots):
        """What each item adds at each of ``n_slots`` slots from ``first_slot`` on.

        For a tail ``t`` after prefix ``p`` (length k), ``f_hat = const(p) + sum_j U[t_j, j]
        + sum_{j != j'} alpha_{k+j} V(t_j', t_j)`` with ``U[d, j] = alpha_{k+j} (g(d) +
        sum_m V(p_m, d)) + sum_m alpha_m V(d, p_m)``.

        Args:
          g: ``[.., D]`` item values.
          placed: ``[.., D]`` ``sum_m e_{p_m}``; weighted: ``[.., D]`` ``sum_m alpha_m e_{p_m}``.

        Returns:
          ``U``: ``[.., D, n_slots]``.
        """
        v = _zero_diagonal(self.params["params"]["interaction"])
        tail_alpha = self.position_weight[first_slot : first_slot + n_slots].reshape((1,) * g.ndim + (n_slots,))
        return (g + placed @ v)[..., None] * tail_alpha + (weighted @ v.T)[..., None]

    def _complete_enumerate(self, g, placed, weighted, k):
        """Exact: every completion scored by matrix products, by :meth:`_slot_gains`'s
        decomposition. Returns the tails ``[.., n, L - k]``."""
        n_items = self.module.n_items
        rest = self.n_slots - k
        n_free = n_items - k
        # Completions as ranks among the free items: the same patterns for every prefix.
        patterns = np.array(list(itertools.permutations(range(n_free), rest)), np.int32)  # [C, rest]
        rows = np.arange(len(patterns))[:, None]
        unary = np.zeros((len(patterns), n_free, rest), np.float32)
        unary[rows, patterns, np.arange(rest)[None, :]] = 1.0
        pair = np.zeros((len(patterns), n_free, n_free, rest), np.float32)  # (c, from, to, slot of "to")
        for j in range(rest):
            for j2 in range(rest):
                if j != j2:
                    pair[rows[:, 0], patterns[:, j2], patterns[:, j], j] = 1.0
        pair_alpha = jnp.asarray(pair) @ self.position_weight[k:]  # [C, F, F]

        # free[.., f, d] = 1 if d is the f-th free item (one-hot, no sort).
        is_free = 1.0 - placed
        rank = jnp.cumsum(is_free, axis=-1) - 1.0
        slot_ids = jnp.arange(n_free, dtype=jnp.float32).reshape((1,) * (rank.ndim - 1) + (n_free, 1))
        free = is_free[..., None, :] * (rank[..., None, :] == slot_ids).astype(jnp.float32)
        v = _zero_diagonal(self.params["params"]["interaction"])
        gains_free = free @ self._slot_gains(g, placed, weighted, k, rest)  # [.., n, F, rest]
        v_free = free @ v @ jnp.swapaxes(free, -1, -2)  # [.., n, F, F]
        scores = jnp.einsum("...fj,cfj->...c", gains_free, jnp.asarray(unary)) + jnp.einsum(
            "...ab,cab->...c", v_free, pair_alpha
        )
        free_items = jnp.round(free @ jnp.arange(n_items, dtype=jnp.float32)).astype(jnp.int32)  # [.., n, F]
        best = jnp.asarray(patterns)[jnp.argmax(scores, axis=-1)]  # [.., n, rest]
        return jnp.take_along_axis(free_items, best, axis=-1)

    def _complete_beam(self, g, placed, weighted, k):
        """Beam search slot by slot: keep the ``beam_width`` best partial rankings, scored
        exactly by the f_hat of the partial ranking (later slots not yet placed).
        Returns the tails ``[.., n, L - k]``."""
        n_items = self.module.n_items
        alpha = self.position_weight
        g, placed, weighted = g[..., None, :], placed[..., None, :], weighted[..., None, :]  # [.., n, B=1, D]
        tails = jnp.zeros(placed.shape[:-1] + (0,), jnp.int32)  # [.., n, B, s]
        score = jnp.zeros(placed.shape[:-1], jnp.float32)  # relative to the prefix's value
        for slot in range(k, self.n_slots):
            gain = self._slot_gains(g, placed, weighted, slot, 1)[..., 0]  # [.., n, B, D]
            total = jnp.where(placed > 0, -jnp.inf, score[..., None] + gain)
            width = min(self.beam_width, total.shape[-2] * (n_items - slot))
            score, flat = jax.lax.top_k(total.reshape(total.shape[:-2] + (-1,)), width)
            parent, item = flat // n_items, flat % n_items
            keep = lambda a: jnp.take_along_axis(a, parent[..., None], axis=-2)
            added = jax.nn.one_hot(item, n_items, dtype=jnp.float32)
            placed, weighted = keep(placed) + added, keep(weighted) + alpha[slot] * added
            tails = jnp.concatenate([keep(tails), item[..., None].astype(jnp.int32)], axis=-1)
        return tails[..., 0, :]  # top_k sorts: the best beam first


def fit_reward_model(
    data: LoggedData,
    key: jax.Array,
    *,
    kind: str = "additive",
    hidden: Sequence[int] = (),
    target: str = "sum",
    config: TrainConfig = TrainConfig(epochs=60, batch_size=256, learning_rate=2e-2),
    valid: LoggedData | None = None,
    max_enumerated: int = 512,
) -> RewardModel:
    """Fit f_hat by least squares (Eq. 12).

    Args:
      data: logged rounds (``context [n, dx]``, fixed action set of ``D = n_items``).
      key: PRNG key.
      kind: ``"additive"`` or ``"pairwise"`` (see the module docstring).
      hidden: hidden sizes of the item head g (``()``: linear in x, well specified for the
        synthetic environment's base reward).
      target: ``"sum"``: ``(R - f_hat)^2`` with ``R = sum_l alpha_l r_l`` (Eq. 12);
        ``"slots"``: ``sum_l (r_l - h_l)^2``.
      config: optimisation settings.
      valid: optional validation rows (early stopping when ``config.patience`` is set).
      max_enumerated: completions enumerated exactly up to this many (pairwise kind).

    Returns:
      A :class:`RewardModel`.
    """
    if kind not in REWARD_MODEL_KINDS:
        raise ValueError(f"kind must be one of {REWARD_MODEL_KINDS}, got {kind!r}")
    if target not in ("sum", "slots"):
        raise ValueError(f"target must be 'sum' or 'slots', got {target!r}")
    module = _SlotValues(n_items=data.n_items, hidden=tuple(hidden), pairwise=(kind == "pairwise"))
    k_init, k_fit = jax.random.split(key)
    params = module.init(k_init, data.context[:1], data.ranking[:1])
    params = minimize(_least_squares(module, target), params, data, k_fit, config, valid=valid).params
    return RewardModel(kind, module, params, data.position_weight, max_enumerated)


@functools.lru_cache(maxsize=64)
def _least_squares(module: _SlotValues, target: str):
    """Eq. 12's loss for one model shape (one function object: compiled once, reused)."""

    def loss(params, batch, key, aux):
        alpha = batch.position_weight
        h = module.apply(params, batch.context, batch.ranking)
        if target == "sum":
            return jnp.mean((batch.reward @ alpha - h @ alpha) ** 2)
        return jnp.mean(jnp.sum((batch.reward - h) ** 2, axis=-1))

    return loss
