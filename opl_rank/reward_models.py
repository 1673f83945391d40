"""Reward models f_hat(x, a) (R-POD Eq. 12) and the second-stage completion (Eq. 13).

Two kinds, both giving per-slot values ``h_l(x, a)`` with ``f_hat = sum_l alpha_l h_l``:

  additive   ``h_l = g(x, a_l)``: an item-wise model; completion sorts the remaining items
             by ``g`` (optimal for non-increasing alpha).
  pairwise   ``h_l = g(x, a_l) + sum_{m != l} V(a_m, a_l)``: sees the whole ranking through
             learned pairwise item interactions (captures the synthetic environment's F);
             completion enumerates every completion when there are at most
             ``max_enumerated`` of them, and is greedy slot by slot otherwise.

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
        values = jnp.take_along_axis(g, rankings, axis=-1)
        if self.pairwise:
            v = self.interaction * (1.0 - jnp.eye(self.n_items, dtype=jnp.float32))
            pair = v[rankings[..., :, None], rankings[..., None, :]]  # [.., K(m), K(l)]
            values = values + jnp.sum(pair, axis=-2)
        return values


@dataclasses.dataclass(frozen=True)
class RewardModel:
    """A fitted f_hat. Pure-array methods; jit-able through ``params``."""

    kind: str
    module: _SlotValues
    params: Any
    position_weight: jax.Array  # [L]
    max_enumerated: int = 512

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
          of completions is at most ``max_enumerated``, greedy otherwise).
        """
        k = prefixes.shape[-1]
        n_items = self.module.n_items
        rest = self.n_slots - k
        if rest == 0:
            return prefixes
        taken = jnp.any(prefixes[..., :, None] == jnp.arange(n_items).reshape((1,) * prefixes.ndim + (n_items,)), axis=-2)
        if self.kind == "additive":
            g = jnp.broadcast_to(self.item_values(context), taken.shape)
            tail = jax.lax.top_k(jnp.where(taken, -jnp.inf, g), rest)[1].astype(prefixes.dtype)
            return jnp.concatenate([prefixes, tail], axis=-1)
        if math.perm(n_items - k, rest) <= self.max_enumerated:
            return self._complete_enumerate(context, prefixes, taken)
        return self._complete_greedy(context, prefixes, taken)

    def _complete_enumerate(self, context, prefixes, taken):
        k = prefixes.shape[-1]
        n_items = self.module.n_items
        rest = self.n_slots - k
        # Completions are drawn from the ranks of the free items (the same count for all).
        free_rank = np.array(list(itertools.permutations(range(n_items - k), rest)), np.int32)  # [C, rest]
        free_items = jnp.argsort(taken, axis=-1, stable=True)[..., : n_items - k].astype(prefixes.dtype)  # [.., n, D-k]
        tails = free_items[..., jnp.asarray(free_rank)]  # [.., n, C, rest]
        heads = jnp.broadcast_to(prefixes[..., None, :], tails.shape[:-1] + (k,))
        candidates = jnp.concatenate([heads, tails], axis=-1)  # [.., n, C, L]
        cand = jnp.moveaxis(candidates, -2, 0)  # [C, .., n, L]
        scores = self.predict(context, cand)  # [C, .., n]
        best = jnp.argmax(scores, axis=0)  # [.., n]
        return jnp.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]

    def _complete_greedy(self, context, prefixes, taken):
        alpha = self.position_weight
        g = jnp.broadcast_to(self.item_values(context), taken.shape)  # [.., n, D]
        v = self.params["params"]["interaction"] * (1.0 - jnp.eye(self.module.n_items, dtype=jnp.float32))
        ranking = prefixes
        for slot in range(prefixes.shape[-1], self.n_slots):
            # Gain of item d at this slot given the items placed so far (later items ignored).
            placed_alpha = alpha[:slot].reshape((1,) * (ranking.ndim - 1) + (slot,))
            into_d = jnp.sum(v[ranking], axis=-2)  # sum_m V(a_m, d): [.., n, D]
            out_of_d = jnp.moveaxis(v[:, ranking], 0, -1)  # V(d, a_m): [.., n, slot, D]
            from_d = jnp.sum(out_of_d * placed_alpha[..., None], axis=-2)  # sum_m alpha_m V(d, a_m)
            gain = alpha[slot] * (g + into_d) + from_d
            best = jnp.argmax(jnp.where(taken, -jnp.inf, gain), axis=-1).astype(ranking.dtype)
            ranking = jnp.concatenate([ranking, best[..., None]], axis=-1)
            taken = jnp.logical_or(taken, jax.nn.one_hot(best, self.module.n_items, dtype=bool))
        return ranking


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
