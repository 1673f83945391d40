"""Reward models f_hat(x, a) (R-POD Eq. 12) and the second-stage completion (Eq. 13).

Two kinds, both giving per-slot values ``h_l(x, a)`` with ``f_hat = sum_l alpha_l h_l``:

  additive   ``h_l = g(x, a_l)``: an item-wise model; completion sorts the remaining items
             by ``g`` (optimal for non-increasing alpha).
  pairwise   ``h_l = g(x, a_l) + sum_{m != l} V(a_m, a_l)``: sees the whole ranking through
             learned pairwise item interactions (captures the synthetic environment's F);
             completion ([`opl_rank.opl.completion`][opl_rank.opl.completion]) enumerates every completion when
             there are at most ``max_enumerated`` (512) of them and is a beam search
             (``beam_width`` 4; 1 is greedy) otherwise. With D = 10, L = 5 that is
             exact for k >= 2 and beam search for k <= 1.

Fitting is least squares on ``R = sum_l alpha_l r_l`` (Eq. 12; ``target="sum"``) or on each
slot's reward (``target="slots"``), with the shared loop of [`opl_rank.optimization`][opl_rank.optimization].

``additive-two-step`` / ``pairwise-two-step``: the paper's Appendix A regression for R-POD
with top-k length ``k``. Step 1 fits the model above, ``h``, on differences of observed
values between logged rounds with the same context and the same top-k prefix,
``(R_i - R_j) - (h(x, a_i) - h(x, a_j))``, which only ranking-internal effects below the
prefix can explain (conditional pairwise correctness is what R-POD needs from f_hat).
Step 2 fits ``g(x, a_{1:k}) = sum_{l <= k} alpha_l u(x, a_l) + c`` on the residuals
``R - h(x, a)`` with ``h`` frozen. ``f_hat = g + h``; the second stage completes length-k
prefixes by ``h`` alone (``g`` is constant there). It needs rounds that share a context --
LETOR queries repeat in the semi-synthetic environment; the synthetic contexts never do.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from opl_rank.data import LoggedData
from opl_rank.opl import completion
from opl_rank.opl.completion import one_hot_sum, zero_diagonal
from opl_rank.optimization import (
    EpochLoop,
    TrainConfig,
    TrainResult,
    TrainState,
    check_finite,
    minimize,
    run_loop,
)
from opl_rank.pl.plackett_luce import cumsum_slots
from opl_rank.scorers import make_scorer
from opl_rank.staging import Packed, leading_rows, stage

__all__ = [
    "RewardModel",
    "fit_reward_model",
    "reward_module",
    "train_reward_params",
    "shared_prefix_pairs",
    "base_kind",
    "REWARD_MODEL_KINDS",
]

_TWO_STEP = "-two-step"
# f_hat's item value of an excluded candidate (finite: the completion's sums stay finite).
_EXCLUDED_VALUE = -1e9
REWARD_MODEL_KINDS = ("additive", "pairwise", "additive" + _TWO_STEP, "pairwise" + _TWO_STEP)


def base_kind(kind: str) -> str:
    """``"pairwise-two-step" -> "pairwise"``: the form of h (and of the completion)."""
    return kind.removesuffix(_TWO_STEP)


class _SlotValues(nn.Module):
    """``(context [n, dx], rankings [.., n, K]) -> [.., n, K]`` per-slot values h_l."""

    n_items: int
    hidden: Sequence[int]
    pairwise: bool
    item_feature_dim: int | None = None  # items' features packed in the context (ItemFeatureScorer)
    prefix_slots: int = -1  # two-step: g's slots (k) plus an offset c; -1: a one-step model

    def setup(self):
        self.item_head = make_scorer(self.n_items, self.hidden, self.item_feature_dim)
        if self.pairwise:
            self.interaction = self.param("interaction", nn.initializers.zeros, (self.n_items, self.n_items))
        if self.prefix_slots >= 0:
            self.offset = self.param("offset", nn.initializers.zeros, ())
        if self.prefix_slots > 0:
            self.prefix_head = make_scorer(self.n_items, self.hidden, self.item_feature_dim)

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
        values = jnp.take_along_axis(g, rankings, axis=-1)
        if self.prefix_slots < 0:
            return values
        m = min(self.prefix_slots, rankings.shape[-1])  # rankings start at slot 1
        if m > 0:
            u = jnp.broadcast_to(self.prefix_head(context), rankings.shape[:-1] + (self.n_items,))
            values = values.at[..., :m].add(jnp.take_along_axis(u, rankings[..., :m], axis=-1))
        return values.at[..., 0].add(self.offset)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["params", "position_weight"],
    meta_fields=["kind", "module", "max_enumerated", "beam_width"],
)  # a pytree: jit-able whole
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
        # flax types apply's result as Any | (output, state); without mutable= it is the output
        return cast(jax.Array, self.module.apply(self.params, context, rankings))

    def predict(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``f_hat(x, a) = sum_l alpha_l h_l``: ``[n, dx], [.., n, L] -> [.., n]``."""
        return self.slot_values(context, rankings) @ self.position_weight

    def item_values(self, context: jax.Array) -> jax.Array:
        """``g(x, d)`` ``[n, D]`` (the whole model when ``kind == "additive"``)."""
        return cast(jax.Array, self.module.apply(self.params, context, method=_SlotValues.item_values))  # as above

    def _candidate_values(self, context: jax.Array, where: jax.Array | None) -> jax.Array:
        g = self.item_values(context)
        return g if where is None else jnp.where(where, g, _EXCLUDED_VALUE)  # excluded ones lose to every real one

    def completion_order(self, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        """int32 ``[n, L]``: each row's top-``L`` items by ``g`` (additive kinds), best first.

        It does not depend on the prefix: a fit computes it once per logged row and passes
        it to [`complete`][complete] (``order=``) instead of a top-``L`` over ``D`` every step.
        """
        if base_kind(self.kind) != "additive":
            raise ValueError(f"completion_order is for additive reward models, not {self.kind!r}")
        g = self._candidate_values(context, where)
        return jax.lax.top_k(g, min(self.n_slots, g.shape[-1]))[1].astype(jnp.int32)

    def complete(
        self, context: jax.Array, prefixes: jax.Array, *, where: jax.Array | None = None, order: jax.Array | None = None
    ) -> jax.Array:
        """Second stage (Eq. 13): the best completion of each prefix under f_hat.

        Args:
          context: ``[n, dx]``.
          prefixes: int ``[.., n, k]`` with ``0 <= k <= L``.
          where: optional bool ``[n, D]``: only these candidates complete a prefix (while a
            row has enough of them).
          order: optional int ``[n, L]`` from [`completion_order`][completion_order] (additive kinds).

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
        if k < self.module.prefix_slots:
            raise ValueError(
                f"a two-step f_hat fitted for k={self.module.prefix_slots} completes prefixes of length "
                f">= {self.module.prefix_slots}, got {k}"
            )
        if base_kind(self.kind) == "additive":
            # The best tail is the first L - k items of g's top L that the prefix does not
            # hold: one top-L per row, shared by every prefix, instead of a top-k over D per
            # prefix (the same items in the same order).
            if order is None:
                order = self.completion_order(context, where=where)
            order = jnp.broadcast_to(order.astype(prefixes.dtype), prefixes.shape[:-1] + order.shape[-1:])
            free = ~jnp.any(order[..., :, None] == prefixes[..., None, :], axis=-1)  # [.., n, L]
            position = cumsum_slots(free.astype(jnp.int32)) - 1  # rank among the free ones
            picks = free[..., :, None] & (
                position[..., :, None]
                == jnp.arange(rest, dtype=jnp.int32).reshape((1,) * (prefixes.ndim - 1) + (1, rest))
            )  # [.., n, L, rest]
            tail = jnp.sum(jnp.where(picks, order[..., :, None], 0), axis=-2).astype(prefixes.dtype)
            return jnp.concatenate([prefixes, tail], axis=-1)
        g = self._candidate_values(context, where)
        g = jnp.broadcast_to(g, prefixes.shape[:-1] + (n_items,))
        interaction = self.params["params"]["interaction"]
        return completion.complete(
            g,
            interaction,
            self.position_weight,
            prefixes,
            max_enumerated=self.max_enumerated,
            beam_width=self.beam_width,
        )[0]

    def prefix_table(
        self,
        value_fn: Callable[[jax.Array, jax.Array], jax.Array],
        context: jax.Array,
        k: int,
        *,
        where: jax.Array | None = None,
    ) -> jax.Array:
        """``value_fn`` of each top-k prefix followed by its [`complete`][complete] tail, per row: float32 ``[n, P]``
        (``P = D!/(D-k)!``, columns as in [`opl_rank.opl.completion.prefix_layout`][opl_rank.opl.completion.prefix_layout]).

        ``value_fn(context [1, dx], rankings int [P, 1, L]) -> [P, 1]`` (e.g. a reward model's
        ``predict``). A mean over many sampled prefixes then reads this table instead of
        completing each sample."""
        n_items = self.module.n_items
        n_tails = math.perm(n_items - k, self.n_slots - k)
        per_prefix = min(n_tails, self.max_enumerated) * n_items

        def value_of(row_context, prefixes, row_where):
            return value_fn(row_context, self.complete(row_context, prefixes, where=row_where))[:, 0]

        return completion.prefix_table(value_of, context, where, n_items, k, per_prefix)


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
    two_step_k: int | None = None,
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
        ([`ItemFeatureScorer`][opl_rank.scorers.ItemFeatureScorer]). None: a per-item head on the context.
      two_step_k: R-POD's k for the two-step kinds (ignored by the others).

    Returns:
      A [`RewardModel`][RewardModel].
    """
    module = reward_module(data, kind, hidden, target, item_feature_dim, two_step_k)
    if module.prefix_slots >= 0:
        k_init, k_fit = jax.random.split(key)
        params = module.init(k_init, data.context[:1], data.ranking[:1])
        params = _fit_two_step(module, params, data, k_fit, config, target)
    else:
        result = train_reward_params(module, target, data, key, config, valid=valid)
        check_finite(result.history, f"reward model {kind!r}")
        params = result.params
    return RewardModel(kind, module, params, data.position_weight, max_enumerated)


def train_reward_params(
    module: _SlotValues,
    target: str,
    data: LoggedData | Packed,
    key: jax.Array,
    config: TrainConfig,
    *,
    valid: LoggedData | Packed | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    batched: bool = False,
) -> TrainResult:
    """Initialise and fit a one-step f_hat's parameters: compiled stages driven from the host
    ([`opl_rank.optimization.run_loop`][opl_rank.optimization.run_loop]); the history holds
    ``[epochs_run]`` arrays (fewer than ``epochs`` after early stopping).

    Args:
      module, target: the model ([`reward_module`][reward_module]) and its loss target.
      data: logged rounds; ``S`` seeds' rounds stacked as a
        [`opl_rank.staging.Packed`][opl_rank.staging.Packed] with ``batched``.
      key: PRNG key (``[S]`` keys with ``batched``).
      config: optimisation settings.
      valid: validation rows (early stopping with ``config.patience``).
      on_epoch: ``(epoch, record)`` on the host after every epoch (progress only).
      batched: fit the ``S`` seeds at once (``jax.vmap``).
    """
    loop = reward_loop(module, target, config, leading_rows(data, batched))
    state = stage(_reward_start(module, loop), batched)(data, key)
    state, history = run_loop(loop, state, data, valid=valid, on_epoch=on_epoch, batched=batched)
    return TrainResult(loop.result_params(state, valid is not None), history)


def reward_loop(module: _SlotValues, target: str, config: TrainConfig, n_rows: int) -> EpochLoop:
    """The [`EpochLoop`][opl_rank.optimization.EpochLoop] of a one-step f_hat's fit on ``n_rows`` rows."""
    return EpochLoop.of(_least_squares(module, target), config, n_rows)


@functools.lru_cache(maxsize=1024)
def _reward_start(module: _SlotValues, loop: EpochLoop) -> Callable[[LoggedData, jax.Array], TrainState]:
    """``(data, key) -> state``: f_hat's initial parameters and training state (one function
    object per model and loop: one compiled program)."""

    def start(data: LoggedData, key: jax.Array) -> TrainState:
        k_init, k_fit = jax.random.split(key)
        return loop.init(module.init(k_init, data.context[:1], data.ranking[:1]), k_fit)

    return start


def reward_module(
    data: LoggedData,
    kind: str,
    hidden: Sequence[int],
    target: str,
    item_feature_dim: int | None,
    two_step_k: int | None,
) -> _SlotValues:
    if kind not in REWARD_MODEL_KINDS:
        raise ValueError(f"kind must be one of {REWARD_MODEL_KINDS}, got {kind!r}")
    if target not in ("sum", "slots"):
        raise ValueError(f"target must be 'sum' or 'slots', got {target!r}")
    prefix_slots = -1
    if kind.endswith(_TWO_STEP):
        if not isinstance(two_step_k, int) or not 0 <= two_step_k <= data.ranking_length:
            raise ValueError(
                f"kind {kind!r} needs two_step_k, R-POD's k in [0, L={data.ranking_length}], got {two_step_k!r}"
            )
        if target != "sum":
            raise ValueError("two-step reward models fit target='sum' only")
        prefix_slots = two_step_k
    return _SlotValues(
        n_items=data.n_items,
        hidden=tuple(hidden),
        pairwise=(base_kind(kind) == "pairwise"),
        item_feature_dim=item_feature_dim,
        prefix_slots=prefix_slots,
    )


def shared_prefix_pairs(data: LoggedData, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of logged rounds with the same context and the same top-k prefix.

    Rounds are grouped by (context, ``ranking[:k]``); within a group of m rounds, m - 1
    pairs chain consecutive rounds (O(n) pairs, each round in at most two).

    Returns:
      ``(i, j)``: int ``[P]`` row indices.
    """
    rows = np.concatenate([np.asarray(data.context, np.float64), np.asarray(data.ranking[:, :k], np.float64)], axis=1)
    _, group = np.unique(rows, axis=0, return_inverse=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")
    same = group[order][1:] == group[order][:-1]
    return order[:-1][same], order[1:][same]


def _fit_two_step(
    module: _SlotValues, params: Any, data: LoggedData, key: jax.Array, config: TrainConfig, target: str
) -> Any:
    """Appendix A: h on within-group differences, then g on the residuals (h frozen).

    At k = L rounds sharing the whole ranking differ only by noise: step 1 has nothing to
    learn and is skipped (f_hat is then g, an additive model over every slot).
    """
    k_pairs, k_rest = jax.random.split(key)
    if module.prefix_slots == data.ranking_length:
        return minimize(_residuals(module), params, data, k_rest, config).params
    i, j = shared_prefix_pairs(data, module.prefix_slots)
    if len(i) == 0:
        raise ValueError(
            f"a two-step f_hat needs logged rounds that share a context and a top-{module.prefix_slots} prefix; "
            "none do (semi-synthetic LETOR queries repeat, the synthetic environment's contexts never do)"
        )
    alpha = data.position_weight
    value = np.asarray(data.reward) @ np.asarray(alpha)
    pairs = {
        "context": data.context[i],
        "ranking_i": data.ranking[i],
        "ranking_j": data.ranking[j],
        "difference": jnp.asarray(value[i] - value[j], jnp.float32),
    }
    params = minimize(_pair_differences(module), params, pairs, k_pairs, config, aux=alpha).params
    return minimize(_residuals(module), params, data, k_rest, config).params


@functools.lru_cache(maxsize=64)
def _pair_differences(module: _SlotValues):
    """Step 1: ``(R_i - R_j) - (f(x, a_i) - f(x, a_j))`` squared; g cancels within a pair."""

    def loss(params, batch, key, alpha):
        f_i = module.apply(params, batch["context"], batch["ranking_i"]) @ alpha
        f_j = module.apply(params, batch["context"], batch["ranking_j"]) @ alpha
        return jnp.mean((batch["difference"] - (f_i - f_j)) ** 2)

    return loss


@functools.lru_cache(maxsize=64)
def _residuals(module: _SlotValues):
    """Step 2: least squares on R with h frozen (only g's head and offset move)."""

    def loss(params, batch, key, aux):
        inner = {
            name: (value if name in ("prefix_head", "offset") else jax.lax.stop_gradient(value))
            for name, value in params["params"].items()
        }
        f = module.apply({"params": inner}, batch.context, batch.ranking) @ batch.position_weight
        return jnp.mean((batch.reward @ batch.position_weight - f) ** 2)

    return loss


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
