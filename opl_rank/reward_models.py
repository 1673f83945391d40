"""Reward models f_hat(x, a) (R-POD Eq. 12) and the second-stage completion (Eq. 13).

Two kinds, both giving per-slot values ``h_l(x, a)`` with ``f_hat = sum_l alpha_l h_l``:

  additive   ``h_l = g(x, a_l)``: an item-wise model; completion sorts the remaining items
             by ``g`` (optimal for non-increasing alpha).
  pairwise   ``h_l = g(x, a_l) + sum_{m != l} V(a_m, a_l)``: sees the whole ranking through
             learned pairwise item interactions (captures the synthetic environment's F);
             completion (:mod:`opl_rank.completion`) enumerates every completion when
             there are at most ``max_enumerated`` (512) of them and is a beam search
             (``beam_width`` 4; 1 is greedy) otherwise. With D = 10, L = 5 that is
             exact for k >= 2 and beam search for k <= 1.

Fitting is least squares on ``R = sum_l alpha_l r_l`` (Eq. 12; ``target="sum"``) or on each
slot's reward (``target="slots"``), with the shared loop of :mod:`opl_rank.optimization`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from opl_rank import completion
from opl_rank.completion import one_hot_sum, zero_diagonal
from opl_rank.data import LoggedData
from opl_rank.optimization import TrainConfig, minimize, minimize_replicas
from opl_rank.policies import make_scorer

__all__ = ["RewardModel", "fit_reward_model", "fit_reward_model_replicas", "REWARD_MODEL_KINDS"]

REWARD_MODEL_KINDS = ("additive", "pairwise")


class _SlotValues(nn.Module):
    """``(context [n, dx], rankings [.., n, K]) -> [.., n, K]`` per-slot values h_l."""

    n_items: int
    hidden: Sequence[int]
    pairwise: bool
    item_feature_dim: int | None = None  # items' features packed in the context (ItemFeatureScorer)

    def setup(self):
        self.item_head = make_scorer(self.n_items, self.hidden, self.item_feature_dim)
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
            g = g + one_hot_sum(rankings, self.n_items) @ zero_diagonal(self.interaction)
        return jnp.take_along_axis(g, rankings, axis=-1)



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
        g = jnp.broadcast_to(self.item_values(context), prefixes.shape[:-1] + (n_items,))
        if self.kind == "additive":
            taken = one_hot_sum(prefixes, n_items) > 0
            tail = jax.lax.top_k(jnp.where(taken, -jnp.inf, g), rest)[1].astype(prefixes.dtype)
            return jnp.concatenate([prefixes, tail], axis=-1)
        interaction = self.params["params"]["interaction"]
        return completion.complete(
            g, interaction, self.position_weight, prefixes, max_enumerated=self.max_enumerated, beam_width=self.beam_width
        )[0]


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
    item_feature_dim: int | None = None,
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
      item_feature_dim: ``F`` when the context packs the candidates' features (LETOR-style
        environments): g is then one MLP shared by every item
        (:class:`~opl_rank.policies.ItemFeatureScorer`). None: a per-item head on the context.

    Returns:
      A :class:`RewardModel`.
    """
    module = _reward_module(data, kind, hidden, target, item_feature_dim)
    k_init, k_fit = jax.random.split(key)
    params = module.init(k_init, data.context[:1], data.ranking[:1])
    params = minimize(_least_squares(module, target), params, data, k_fit, config, valid=valid).params
    return RewardModel(kind, module, params, data.position_weight, max_enumerated)


def fit_reward_model_replicas(
    datas: Sequence[LoggedData],
    keys: jax.Array,
    *,
    kind: str = "additive",
    hidden: Sequence[int] = (),
    target: str = "sum",
    config: TrainConfig = TrainConfig(epochs=60, batch_size=256, learning_rate=2e-2),
    max_enumerated: int = 512,
    item_feature_dim: int | None = None,
) -> list[RewardModel]:
    """:func:`fit_reward_model` on ``S`` data sets of equal shapes, vmapped into one loop.

    Args:
      datas: ``S`` logged data sets sharing shapes (e.g. one sweep cell's seeds).
      keys: ``[S]`` PRNG keys; model ``s`` matches ``fit_reward_model(datas[s], keys[s])``
        up to float rounding.
      kind, hidden, target, config, max_enumerated, item_feature_dim: as for
        :func:`fit_reward_model` (no early stopping).

    Returns:
      ``S`` :class:`RewardModel` s.
    """
    module = _reward_module(datas[0], kind, hidden, target, item_feature_dim)
    parts = jax.vmap(jax.random.split)(keys)
    contexts = jnp.stack([d.context[:1] for d in datas])
    rankings = jnp.stack([d.ranking[:1] for d in datas])
    params = jax.vmap(module.init)(parts[:, 0], contexts, rankings)
    params = minimize_replicas(_least_squares(module, target), params, datas, parts[:, 1], config).params
    return [
        RewardModel(kind, module, jax.tree.map(lambda x: x[s], params), d.position_weight, max_enumerated)
        for s, d in enumerate(datas)
    ]


def _reward_module(data: LoggedData, kind: str, hidden: Sequence[int], target: str, item_feature_dim: int | None) -> "_SlotValues":
    if kind not in REWARD_MODEL_KINDS:
        raise ValueError(f"kind must be one of {REWARD_MODEL_KINDS}, got {kind!r}")
    if target not in ("sum", "slots"):
        raise ValueError(f"target must be 'sum' or 'slots', got {target!r}")
    return _SlotValues(n_items=data.n_items, hidden=tuple(hidden), pairwise=(kind == "pairwise"), item_feature_dim=item_feature_dim)


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
