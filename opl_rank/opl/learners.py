"""Off-policy learners for ranking: ``fit(data, key, config) -> policy``.

Methods (R-POD paper, docs/maths.md §1.10-1.24):
  <estimator>   any policy-gradient estimator of the registry
                [`opl_rank.opl.estimators.OPL_ESTIMATORS`][opl_rank.opl.estimators.OPL_ESTIMATORS] that does not take R-POD's k
                (built in: ips, snips, dr, dm, iips, rips; and any a user registers): a PL
                policy over all L slots trained with that estimator's terms;
  regression    fit f_hat (Eq. 12), act by its argmax (Eq. 13); R-POD with k = 0;
  rpod          fit f_hat, build the second stage (argmax completion, Eq. 13), train a
                PL first stage over the top k with the ``topk`` terms (Eq. 9); k = L is dr;
  <learner>     any learner of [`LEARNERS`][LEARNERS] ([`register_learner`][register_learner]): a function
                ``(data, key, config, *, on_epoch) -> policy`` defined outside the package,
                fitted by [`fit`][fit] and [`fit_seeds`][fit_seeds] (one seed at a time) and swept
                like the built-in methods.
Estimators that need a reward model get f_hat at the logged rankings and a model term
``E_{a ~ pi}[f_hat]`` with a low-variance gradient: marginalize-all for an additive f_hat
over all L slots, sampled rankings with leave-one-out baselines otherwise.

[`fit`][fit] is one seed; the fitting itself ([`fit_arrays`][fit_arrays]) is a few compiled
stages of array programs ([`opl_rank.staging`][opl_rank.staging]), and [`fit_seeds`][fit_seeds]
runs the same stages ``jax.vmap``-ed over the seeds of data sets that share shapes. Every
fit trains through the one loop of [`opl_rank.optimization`][opl_rank.optimization]. Methods that
share an f_hat (the same settings and key) can fit it once: [`fit_reward`][fit_reward], then
``fit(..., reward_params=...)``.

Numerical guard: importance weights are clipped at ``max_log_weight = 50`` in log space by
default (e^50 ~ 5e21, far beyond any informative weight) so that extreme logging
propensities cannot overflow float32; set ``math.inf`` to disable.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank import tuning
from opl_rank.data import LoggedData, train_val_split
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.estimator_inputs import InputRequest, build, call_terms
from opl_rank.opl.estimators import estimate
from opl_rank.opl.policies import PLPolicy, RankingPolicy, RegressionPolicy, TwoStagePolicy, compiled_propensities
from opl_rank.opl.reward_models import REWARD_MODEL_KINDS, RewardModel, base_kind, reward_module, train_reward_params
from opl_rank.optimization import (
    EpochLoop,
    TrainConfig,
    TrainResult,
    check_finite,
    partitioner,
    run_loop,
)
from opl_rank.pl import marginals
from opl_rank.scorers import make_scorer
from opl_rank.staging import Packed, leading_rows, pack, stack, stage

__all__ = [
    "MODEL_METHODS",
    "LEARNERS",
    "Learner",
    "register_learner",
    "learning_methods",
    "needs_reward_model",
    "needs_position_marginals",
    "LearnerConfig",
    "ClippedWeightsWarning",
    "fit",
    "fit_seeds",
    "fit_arrays",
    "fit_reward",
    "fit_reward_seeds",
    "shares_reward_model",
]

EpochCallback = Callable[[str, int, dict[str, float]], None]  # (part, epoch, record): progress of a fit

MODEL_METHODS = ("regression", "rpod")  # methods that are not one registered estimator
SLOT_MARGINALS = ("auto", "exact", "sampled", "insertion")  # LearnerConfig.slot_marginals


@dataclasses.dataclass(frozen=True)
class Learner:
    """A learning method defined outside the package ([`register_learner`][register_learner]).

    Attributes:
      fit: ``(data, key, config, *, on_epoch=None) -> policy``: one seed's fit, ``config``
        the [`LearnerConfig`][LearnerConfig] naming this learner (it may fit a built-in method with
        ``dataclasses.replace(config, method=...)`` and wrap the result); ``on_epoch`` as
        for [`fit`][fit]. The policy follows [`RankingPolicy`][opl_rank.opl.policies.RankingPolicy].
      needs_reward_model: it fits an f_hat (a sweep then fits it once per reward-model kind).
      needs_position_marginals: it reads ``LoggedData.log_pi0_position_marginal``.
    """

    fit: Callable[..., RankingPolicy]
    needs_reward_model: bool = False
    needs_position_marginals: bool = False


LEARNERS: dict[str, Learner] = {}  # learners registered by name (register_learner)


def register_learner(
    name: str,
    fit_fn: Callable[..., RankingPolicy],
    *,
    needs_reward_model: bool = False,
    needs_position_marginals: bool = False,
    replace: bool = False,
) -> Learner:
    """Add a learning method: [`fit`][fit], [`fit_seeds`][fit_seeds], [`learning_methods`][learning_methods],
    [`LearnerConfig`][LearnerConfig] and the sweep then know ``name``.

    Args:
      name: the method's name (``LearnerConfig(name)``); not a registered estimator's nor
        one of ``MODEL_METHODS``.
      fit_fn: ``(data, key, config, *, on_epoch=None) -> policy`` ([`Learner.fit`][Learner.fit]).
      needs_reward_model: it fits an f_hat.
      needs_position_marginals: it reads the logged position marginals.
      replace: allow another learner to take a registered name.

    Returns:
      The registered [`Learner`][Learner].

    Raises:
      ValueError: an empty name, a name of an estimator or a built-in method, or one taken
        by another learner (unless ``replace``).
      TypeError: ``fit_fn`` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"learner name must be a non-empty string, got {name!r}")
    if name in MODEL_METHODS or name in opl_estimators.OPL_ESTIMATORS:
        raise ValueError(f"learner name {name!r} is a built-in method or a registered estimator")
    if not callable(fit_fn):
        raise TypeError(
            f"fit_fn must be callable (data, key, config, *, on_epoch=None) -> policy, got {type(fit_fn).__name__}"
        )
    entry = Learner(fit_fn, bool(needs_reward_model), bool(needs_position_marginals))
    if name in LEARNERS and not replace and LEARNERS[name] != entry:
        raise ValueError(f"learner {name!r} is already registered")
    LEARNERS[name] = entry
    return entry


def learning_methods() -> tuple[str, ...]:
    """Every method ``fit`` accepts now: the registry's estimators without k, then
    ``MODEL_METHODS``, then the registered learners ([`LEARNERS`][LEARNERS])."""
    names = [name for name, e in opl_estimators.OPL_ESTIMATORS.items() if not e.uses_k]
    return tuple(names) + MODEL_METHODS + tuple(name for name in LEARNERS if name not in names)


def needs_reward_model(method: str) -> bool:
    """Whether ``method`` fits an f_hat."""
    if method in LEARNERS:
        return LEARNERS[method].needs_reward_model
    return method in MODEL_METHODS or opl_estimators.get(method).needs_reward_model


def needs_position_marginals(method: str) -> bool:
    """Whether ``method`` reads the logged position marginals."""
    if method in LEARNERS:
        return LEARNERS[method].needs_position_marginals
    return method not in MODEL_METHODS and opl_estimators.get(method).needs_position_marginals


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """What to learn and how.

    Attributes:
      method: one of [`learning_methods`][learning_methods] (a registered estimator, ``regression``,
        ``rpod``, a registered learner).
      k: R-POD's top-k length in ``[0, L]`` (``rpod`` only).
      reward_model: f_hat's kind (methods with a reward model): ``"additive"``,
        ``"pairwise"``, or their Appendix-A two-step forms ``"additive-two-step"``,
        ``"pairwise-two-step"`` (fitted for the learner's k; they need rounds that share a
        context).
      policy_hidden: hidden sizes of the policy's scorer (``()``: linear logits).
      reward_hidden: hidden sizes of f_hat's item head.
      item_feature_dim: ``F`` when the context packs the D candidates' features
        (LETOR-style environments, ``context[:, :D*F]``): the policy and f_hat's item head
        are then one MLP shared by every item. None: a per-item head on the context.
      n_samples: sampled rankings per round for the model terms (and for sampled slot
        marginals).
      slot_marginals: how estimators that read position marginals (iips) get the policy's
        marginals of the logged items: ``"exact"`` (quadrature), ``"sampled"``
        (Rao-Blackwellised from sampled prefixes, unbiased in value and gradient),
        ``"insertion"`` (the logged item inserted into sampled orders of the other items:
        also unbiased, with far less variance per sample; docs/performance.md §15) or
        ``"auto"``: chosen by cost ([`opl_rank.pl.marginals.slot_marginal_method`][opl_rank.pl.marginals.slot_marginal_method]: exact
        for small D -- all D <= 10 with L <= 10 -- sampled prefixes from D = 16 at L = 10,
        40 at L = 5).
      slot_marginal_samples: sampled rankings per row for sampled slot marginals; None:
        ``n_samples`` for ``"sampled"``, 2 for ``"insertion"`` (leave-one-out baselines; with
        1 its baseline is the logged order).
      max_log_weight: clip on log importance weights (see the module docstring).
      train: optimisation of the policy.
      reward_train: optimisation of f_hat.
      valid_fraction: rows held out for early stopping (0: none; needs ``train.patience``).
      estimator_options: options of the estimator's inputs hook (its ``given``), e.g.
        ``{"behaviour": "neighbour-1"}`` for ``aips`` or ``{"fitting": "iw"}`` for
        ``cascade_dr``; stored as a tuple of pairs (arrays as nested tuples) so the config stays
        hashable.
    """

    method: str
    k: int | None = None
    reward_model: str = "additive"
    policy_hidden: tuple[int, ...] = ()
    reward_hidden: tuple[int, ...] = ()
    item_feature_dim: int | None = None
    n_samples: int = 8
    slot_marginals: str = "auto"
    slot_marginal_samples: int | None = None
    max_log_weight: float = 50.0
    train: TrainConfig = TrainConfig(epochs=30, batch_size=256, learning_rate=5e-2)
    reward_train: TrainConfig = TrainConfig(epochs=60, batch_size=256, learning_rate=2e-2)
    valid_fraction: float = 0.0
    estimator_options: Any = None

    def __post_init__(self) -> None:
        if self.estimator_options is not None:
            object.__setattr__(self, "estimator_options", _frozen_options(self.estimator_options))
        methods = learning_methods()
        if self.method not in methods:
            raise ValueError(f"method must be one of {methods}, got {self.method!r}")
        if self.method == "rpod" and (not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 0):
            raise ValueError(f"rpod needs k, an int in [0, L], got {self.k!r}")
        if self.method != "rpod" and self.k is not None:
            raise ValueError(f"k is only for method 'rpod', got k={self.k!r} with {self.method!r}")
        if self.reward_model not in REWARD_MODEL_KINDS:
            raise ValueError(f"reward_model must be one of {REWARD_MODEL_KINDS}, got {self.reward_model!r}")
        if not isinstance(self.n_samples, int) or self.n_samples < 2:
            raise ValueError(f"n_samples must be an int >= 2 (leave-one-out baselines), got {self.n_samples!r}")
        if self.slot_marginals not in SLOT_MARGINALS:
            raise ValueError(f"slot_marginals must be one of {SLOT_MARGINALS}, got {self.slot_marginals!r}")
        if self.slot_marginal_samples is not None and (
            not isinstance(self.slot_marginal_samples, int)
            or isinstance(self.slot_marginal_samples, bool)
            or self.slot_marginal_samples < (1 if self.slot_marginals == "insertion" else 2)
        ):
            raise ValueError(
                f"slot_marginal_samples must be None or an int >= 1 ('insertion') / >= 2 ('sampled'), "
                f"got {self.slot_marginal_samples!r}"
            )
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ValueError(f"valid_fraction must be in [0, 1), got {self.valid_fraction}")
        if self.item_feature_dim is not None and (
            not isinstance(self.item_feature_dim, int) or self.item_feature_dim < 1
        ):
            raise ValueError(f"item_feature_dim must be None or a positive int, got {self.item_feature_dim!r}")
        if not self.max_log_weight > 0:
            raise ValueError(f"max_log_weight must be > 0, got {self.max_log_weight}")

    def reward_model_options(self) -> dict[str, Any]:
        """The f_hat settings, as keyword arguments of ``fit_reward_model``."""
        return dict(
            kind=self.reward_model,
            hidden=self.reward_hidden,
            config=self.reward_train,
            item_feature_dim=self.item_feature_dim,
        )


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)) or (hasattr(value, "shape") and hasattr(value, "tolist")):
        return tuple(_frozen(v) for v in (value.tolist() if hasattr(value, "tolist") else value))
    return value


def _frozen_options(options: Any) -> tuple[tuple[str, Any], ...]:
    """``{name: value}`` (or pairs) as sorted pairs of hashable values."""
    pairs = options.items() if isinstance(options, Mapping) else options
    try:
        frozen = tuple(sorted((str(name), _frozen(value)) for name, value in pairs))
        hash(frozen)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"estimator_options must be a dict of hashable values or arrays, got {options!r:.200}"
        ) from err
    return frozen


class _Plan(NamedTuple):
    """What one fit builds, fixed by the config and the data's shapes (hashable)."""

    config: LearnerConfig
    estimator: str | None  # None: regression (no policy training)
    k: int  # slots of the trained first stage (L unless rpod)
    n_slots: int
    reward_module: Any  # None without f_hat
    policy_module: Any
    slot_marginal_samples: int = 0  # > 0: the policy's slot marginals are sampled (by cost)
    # Two-stage R-POD with an additive f_hat: each row's completion order (g's top L) is
    # computed once before the policy's epochs, not in every step (docs/performance.md §13).
    completion_order: bool = False
    # Two-stage R-POD with a pairwise f_hat, when it is cheaper: f_hat's value of every
    # possible top-k prefix's best completion, per row, computed once (``prefix_values``).
    prefix_table: bool = False


def _uses_prefix_table(data: LoggedData, config: LearnerConfig, k: int) -> bool:
    """Whether a pairwise R-POD fit completes all ``P = D!/(D-k)!`` prefixes per row once
    instead of ``n_samples`` sampled ones per row in every epoch: when ``P`` is at most the
    completions the epochs would run (an early-stopped run counted at ``4 * patience``
    epochs) and the ``[n, P]`` table fits ``tuning.PREFIX_TABLE_FLOATS``. A table's
    completion costs about 0.6 of one inside a step (docs/performance.md §20)."""
    n_prefixes = math.perm(data.n_items, k)
    train = config.train
    epochs = train.epochs if train.patience is None else min(train.epochs, 4 * train.patience)
    return (
        data.n_items**k <= 2**16
        and n_prefixes * data.n_rounds <= tuning.PREFIX_TABLE_FLOATS
        and n_prefixes <= config.n_samples * epochs
    )


def _plan(data: LoggedData, config: LearnerConfig) -> _Plan:
    n_slots = data.ranking_length
    if config.method == "rpod":
        assert config.k is not None  # LearnerConfig: rpod has an int k
        k = config.k
    else:
        k = 0 if config.method == "regression" else n_slots
    if k > n_slots:
        raise ValueError(f"k={k} must be in [0, L={n_slots}]")
    if needs_position_marginals(config.method) and data.log_pi0_position_marginal is None:
        raise ValueError(
            f"{config.method} needs LoggedData.log_pi0_position_marginal (simulate with position_marginals='exact')"
        )
    module = None
    if needs_reward_model(config.method):
        module = reward_module(data, config.reward_model, config.reward_hidden, "sum", config.item_feature_dim, k)
    estimator = None if k == 0 else ("topk" if config.method == "rpod" else config.method)
    policy_module = make_scorer(data.n_items, config.policy_hidden, config.item_feature_dim)
    samples = 0
    if estimator is not None and opl_estimators.get(estimator).needs_position_marginals:
        chosen = config.slot_marginals
        if chosen != "insertion":
            chosen = marginals.slot_marginal_method(data.n_items, k, config.n_samples, config.slot_marginals)
        if chosen != "exact":
            default = 2 if chosen == "insertion" else config.n_samples
            samples = default if config.slot_marginal_samples is None else config.slot_marginal_samples
    two_stage = module is not None and 0 < k < n_slots
    completion_order = two_stage and base_kind(config.reward_model) == "additive"
    prefix_table = two_stage and not completion_order and _uses_prefix_table(data, config, k)
    return _Plan(config, estimator, k, n_slots, module, policy_module, samples, completion_order, prefix_table)


@functools.lru_cache(maxsize=1024)
def _surrogate(plan: _Plan) -> Callable:
    """``(params, batch, key, reward_params) -> scalar``: minus the estimate.

    One function object per plan: refits with other data, seeds or reward-model
    parameters reuse the compiled training run.
    """
    config, k = plan.config, plan.k
    assert plan.estimator is not None  # a surrogate trains a policy: plans without one (regression) have none
    entry = opl_estimators.get(plan.estimator)

    def loss(params, batch: LoggedData | tuple[LoggedData, dict], key, reward_params):
        batch, extras = batch if isinstance(batch, tuple) else (batch, {})
        sampled_marginals = "insertion" if config.slot_marginals == "insertion" else "prefix"
        policy = PLPolicy(plan.policy_module, params, k, plan.slot_marginal_samples, sampled_marginals)
        k_marginals = jax.random.fold_in(key, 1) if plan.slot_marginal_samples else None  # other keys unchanged
        target = policy.propensities(batch, k_marginals, slot_marginals=entry.needs_position_marginals)
        reward_model = _reward_model(plan, reward_params, batch.position_weight) if entry.needs_reward_model else None
        request = InputRequest(
            policy,
            batch,
            key,
            reward_model,
            k if entry.uses_k else None,
            learning=True,
            n_samples=config.n_samples,
            given=dict(config.estimator_options) if config.estimator_options is not None else None,
            extras=extras,
        )
        model, inputs = build(entry, request)
        terms = call_terms(entry, target, batch, model=model, k=k, max_log_weight=config.max_log_weight, inputs=inputs)
        return -estimate(terms) * _overflow_guard(terms)

    return loss


# A batch whose loss terms add up to more than e^20 in magnitude is scaled down to e^20
# before it meets the optimiser: float32 Adam squares the gradient, and terms of 1e20 or
# more (weights near the clip e^50 times large rewards) overflow its second moment to inf
# and freeze those parameters for good. The scale is a positive constant per batch, so
# the step's direction is the estimator's; it only ever shrinks steps of such batches
# (a batch-dependent step size: the expectation over batches weights each batch's
# gradient by its scale). Ordinary batches (total below e^20) are untouched.
_MAX_LOG_TERMS = 20.0


def _overflow_guard(terms) -> jax.Array:
    """``min(1, e^20 / sum_i |contribution_i|)`` without gradient (see above)."""
    value = jnp.abs(jax.lax.stop_gradient(terms.value))
    total = jnp.sum(value) / (
        value.shape[0] if terms.normalizer is None else jnp.abs(jnp.sum(jax.lax.stop_gradient(terms.normalizer)))
    )
    log_total = jnp.log(jnp.maximum(total, 1e-30))
    return jax.lax.stop_gradient(jnp.exp(-jnp.maximum(log_total - _MAX_LOG_TERMS, 0.0)))


def _reward_model(plan: _Plan, params: Any, position_weight: jax.Array) -> RewardModel:
    return RewardModel(plan.config.reward_model, plan.reward_module, params, position_weight)


def fit_arrays(
    plan: _Plan,
    data: LoggedData | Packed,
    key: jax.Array,
    reward_params: Any = None,
    *,
    on_epoch: EpochCallback | None = None,
    batched: bool = False,
) -> dict[str, TrainResult | None]:
    """The fit as compiled stages of array programs, driven from the host.

    The steps -- hold out validation rows, train f_hat in chunks of epochs, compute the
    second stage's completion orders, train the policy in chunks -- are each one cached
    program ([`opl_rank.staging.stage`][opl_rank.staging.stage]) free of host callbacks, so
    they are compiled once and kept by the persistent compilation cache; progress is
    reported between chunks ([`opl_rank.optimization.run_loop`][opl_rank.optimization.run_loop]).

    Args:
      plan: what to fit (from the config and the data's shapes).
      data: logged rounds; with ``batched``, ``S`` seeds' rounds stacked as a
        [`opl_rank.staging.Packed`][opl_rank.staging.Packed].
      key: PRNG key (``[S]`` keys with ``batched``).
      reward_params: an f_hat fitted elsewhere (two-step kinds); None fits it here.
      on_epoch: ``(part, epoch, record)`` after every epoch, ``part`` ``"reward"`` or
        ``"policy"`` (progress only; results do not depend on it).
      batched: fit the ``S`` seeds at once (``jax.vmap`` of every stage).

    Returns:
      ``{"reward": TrainResult or None, "policy": TrainResult or None}`` with history arrays
      (``[S, ...]`` leaves with ``batched``).
    """
    config = plan.config
    devices = config.train.devices if config.train.devices is not None else config.reward_train.devices
    with partitioner(devices, key[0] if batched else key):  # stages fed by a data-parallel run's arrays
        return _fit_stages(plan, data, key, reward_params, on_epoch, batched)


def _fit_stages(
    plan: _Plan,
    data: LoggedData | Packed,
    key: jax.Array,
    reward_params: Any,
    on_epoch: EpochCallback | None,
    batched: bool,
) -> dict[str, TrainResult | None]:
    rows, valid, k_reward, k_init, k_fit = stage(_split_stage(plan.config.valid_fraction), batched)(pack(data), key)
    out: dict[str, TrainResult | None] = {"reward": None, "policy": None}
    progress = (lambda part: None) if on_epoch is None else (lambda part: functools.partial(on_epoch, part))
    if plan.reward_module is not None and reward_params is None:
        fitted_reward = _train_reward(plan, rows, k_reward, progress("reward"), batched)
        out["reward"] = fitted_reward
        reward_params = fitted_reward.params
    elif reward_params is not None:
        out["reward"] = TrainResult(reward_params, None)
    if plan.estimator is not None:
        loop = _policy_loop(plan, leading_rows(rows, batched))
        rows, valid, state = stage(_policy_start(plan, loop), batched)(rows, valid, reward_params, k_init, k_fit)
        state, history = run_loop(
            loop, state, rows, aux=reward_params, valid=valid, on_epoch=progress("policy"), batched=batched
        )
        out["policy"] = TrainResult(loop.result_params(state, valid is not None), history)
    return out


def _train_reward(plan: _Plan, rows: Packed, key: jax.Array, on_epoch: Any, batched: bool) -> TrainResult:
    assert plan.reward_module is not None  # only plans with an f_hat fit one
    return train_reward_params(
        plan.reward_module, "sum", rows, key, plan.config.reward_train, on_epoch=on_epoch, batched=batched
    )


def fit_reward(data: LoggedData, key: jax.Array, config: LearnerConfig) -> Any:
    """f_hat's parameters exactly as [`fit`][fit] with ``data``, ``key`` and ``config`` fits them,
    to pass as ``fit(..., reward_params=...)`` to every method that shares them: the same
    f_hat settings (``reward_model``, ``reward_hidden``, ``item_feature_dim``,
    ``reward_train``, ``valid_fraction``) and key. One-step kinds only (the two-step kinds
    depend on R-POD's k). A FloatingPointError if the fit diverged."""
    return _shared_reward(config, data, key, batched=False)


def fit_reward_seeds(datas: Sequence[LoggedData], keys: jax.Array, config: LearnerConfig) -> Any:
    """[`fit_reward`][fit_reward] for ``S`` data sets of equal shapes at once (vmapped, as
    [`fit_seeds`][fit_seeds] fits them): parameters with a leading seed axis ``[S, ...]``."""
    if len(datas) != keys.shape[0]:
        raise ValueError(f"keys must have shape [S={len(datas)}], got {keys.shape}")
    return _shared_reward(config, stack(datas), keys, batched=True, like=datas[0])


def _shared_reward(config: LearnerConfig, data: Any, key: jax.Array, *, batched: bool, like: Any = None) -> Any:
    if not shares_reward_model(config):
        raise ValueError(
            f"method {config.method!r} with reward_model {config.reward_model!r} fits no one-step f_hat "
            "of its own: nothing to share"
        )
    plan = _plan(data if like is None else like, config)
    rows, _, k_reward, _, _ = stage(_split_stage(config.valid_fraction), batched)(pack(data), key)
    fitted = _train_reward(plan, rows, k_reward, None, batched)
    history = fitted.history
    for s in range(history["active"].shape[0]) if batched else [None]:
        check_finite(history if s is None else {name: v[s] for name, v in history.items()}, "reward model")
    return fitted.params


def shares_reward_model(config: LearnerConfig) -> bool:
    """Whether ``config``'s method fits a one-step f_hat that [`fit_reward`][fit_reward] can fit
    for it (a built-in method with a reward model, not a two-step kind)."""
    return (
        config.method not in LEARNERS
        and needs_reward_model(config.method)
        and not config.reward_model.endswith("-two-step")
    )


def _check_shared_reward(plan: _Plan | None, reward_params: Any, method: str) -> None:
    if reward_params is None:
        return
    if plan is None:
        raise ValueError(f"reward_params is for the built-in methods, not the registered learner {method!r}")
    if not shares_reward_model(plan.config):
        raise ValueError(
            f"reward_params: {method!r} with reward_model {plan.config.reward_model!r} "
            "has no one-step f_hat to share (fit_reward's parameters are for methods that fit one)"
        )


@functools.lru_cache(maxsize=16)
def _split_stage(valid_fraction: float) -> Callable:
    """``(data, key) -> (rows, valid or None, k_reward, k_init, k_fit)``: the fit's keys and its
    held-out validation rows (as [`Packed`][opl_rank.staging.Packed] rows)."""

    def split(data: LoggedData, key: jax.Array):
        k_split, k_reward, k_init, k_fit = jax.random.split(key, 4)
        valid = None
        if valid_fraction > 0:
            data, valid = train_val_split(data, k_split, valid_fraction)
        return pack(data), pack(valid), k_reward, k_init, k_fit

    return split


def _policy_loop(plan: _Plan, n_rows: int) -> EpochLoop:
    return EpochLoop.of(_surrogate(plan), plan.config.train, n_rows)


@functools.lru_cache(maxsize=1024)
def _policy_start(plan: _Plan, loop: EpochLoop) -> Callable:
    """``(rows, valid, reward_params, k_init, k_fit) -> (rows, valid, state)``: the rows the
    policy trains on (with the completion orders of a two-stage R-POD with an additive
    f_hat, or its prefix table with a pairwise one, computed once here) and its initial
    training state."""

    def start(data: LoggedData, valid: LoggedData | None, reward_params: Any, k_init: jax.Array, k_fit: jax.Array):
        rows: LoggedData | tuple[LoggedData, dict[str, jax.Array]] = data
        valid_rows: LoggedData | tuple[LoggedData, dict[str, jax.Array]] | None = valid
        extras = {"completion_order": _completion_orders} if plan.completion_order else {}
        if plan.prefix_table:
            extras = {"prefix_values": _prefix_values}
        for name, compute in extras.items():
            rows = (data, {name: compute(plan, reward_params, data)})
            if valid is not None:
                valid_rows = (valid, {name: compute(plan, reward_params, valid)})
        state = loop.init(plan.policy_module.init(k_init, data.context[:1]), k_fit)
        return pack(rows), pack(valid_rows), state

    return start


def _completion_orders(plan: _Plan, reward_params: Any, data: LoggedData) -> jax.Array:
    """int32 ``[n, L]``: every row's completion order under the fitted additive f_hat."""
    reward_model = _reward_model(plan, reward_params, data.position_weight)
    rows = {"context": data.context, "item_mask": data.item_mask}
    return jax.lax.map(
        lambda r: reward_model.completion_order(r["context"], where=r["item_mask"]),
        rows,
        batch_size=min(tuning.COMPLETION_ORDER_ROWS, data.n_rounds),
    )


def _prefix_values(plan: _Plan, reward_params: Any, data: LoggedData) -> jax.Array:
    """float32 ``[n, P]``: f_hat at the best completion of each of the ``P`` top-k prefixes
    of [`prefix_layout`][opl_rank.opl.completion.prefix_layout], for every row."""
    reward_model = _reward_model(plan, reward_params, data.position_weight)
    return reward_model.prefix_table(reward_model.predict, data.context, plan.k, where=data.item_mask)


class ClippedWeightsWarning(RuntimeWarning):
    """Most logged rows' importance weights exceed ``max_log_weight`` under the learned policy."""


def _warn_if_clipped(plan: _Plan, policy: PLPolicy, data: LoggedData) -> None:
    """Warn when over half the rows' log-weights pass the clip: the weighted terms then carry
    (almost) no information about the policy (every weight is the same constant).
    ``policy``: the learned policy's ``pl_stage``, the PL part trained through the weights."""
    if plan.estimator is None:
        return
    k = plan.k if plan.config.method == "rpod" else plan.n_slots
    above = 0
    for start in range(0, data.n_rounds, tuning.CLIP_CHECK_ROWS):  # chunks: the logits are [rows, D]
        whole = start == 0 and data.n_rounds <= tuning.CLIP_CHECK_ROWS
        part = data if whole else data.take(slice(start, start + tuning.CLIP_CHECK_ROWS))
        # counted on the host (float32 as on the device): no op-by-op programs to load
        log_w = (
            np.asarray(compiled_propensities(policy, part).log_prefix)[:, k - 1]
            - np.asarray(part.log_pi0_prefix)[:, k - 1]
        )
        above += int(np.sum(log_w > plan.config.max_log_weight))
    share = above / data.n_rounds
    if share > 0.5:
        warnings.warn(
            f"{plan.config.method}: {share:.0%} of the logged rows have importance weights above "
            f"e^{plan.config.max_log_weight:g} (max_log_weight) under the learned policy; the estimate is dominated "
            "by clipping (check the logged propensities)",
            ClippedWeightsWarning,
            stacklevel=3,
        )


def _policy(
    plan: _Plan, fitted: dict[str, Any], position_weight: jax.Array
) -> PLPolicy | RegressionPolicy | TwoStagePolicy:
    method = plan.config.method
    for part in ("reward", "policy"):
        if fitted[part] is not None and fitted[part].history is not None:
            check_finite(fitted[part].history, f"{method}: {part} model")
    reward_model = None if fitted["reward"] is None else _reward_model(plan, fitted["reward"].params, position_weight)
    if plan.estimator is None:
        return RegressionPolicy(reward_model)
    first = PLPolicy(plan.policy_module, fitted["policy"].params, plan.k)
    if method != "rpod" or plan.k == plan.n_slots:
        return first
    return TwoStagePolicy(first, reward_model)


def _two_step(plan: _Plan) -> bool:
    return plan.reward_module is not None and plan.config.reward_model.endswith("-two-step")


def fit(
    data: LoggedData,
    key: jax.Array,
    config: LearnerConfig,
    *,
    on_epoch: EpochCallback | None = None,
    reward_params: Any = None,
) -> RankingPolicy:
    """Learn a ranking policy from logged data.

    Args:
      data: logged rounds with a fixed action set (``n_items`` items, contexts ``[n, dx]``).
      key: PRNG key.
      config: [`LearnerConfig`][LearnerConfig].
      on_epoch: ``(part, epoch, record)`` called on the host for every epoch that ran, after
        each compiled chunk of epochs (``tuning.CHUNK_STEPS``), ``part`` being ``"reward"``
        (f_hat) or ``"policy"`` (progress; results do not depend on it).
      reward_params: f_hat's parameters from [`fit_reward`][fit_reward] with this ``data``,
        ``key`` and the config's f_hat settings: the fit then skips fitting f_hat and returns
        exactly what it would have returned (several methods sharing one f_hat fit it once).

    Returns:
      A [`PLPolicy`][opl_rank.opl.policies.PLPolicy] (estimator methods, rpod with k = L),
      [`RegressionPolicy`][opl_rank.opl.policies.RegressionPolicy] (regression, rpod with k = 0),
      [`TwoStagePolicy`][opl_rank.opl.policies.TwoStagePolicy] (rpod with 0 < k < L), or what a
      registered learner returns.
    """
    if config.method in LEARNERS:
        _check_shared_reward(None, reward_params, config.method)
        return _fit_registered(data, key, config, on_epoch)
    plan = _plan(data, config)
    _check_shared_reward(plan, reward_params, config.method)
    if _two_step(plan):  # Appendix A pairs are found on the host: f_hat is fitted outside
        from opl_rank.opl.reward_models import fit_reward_model

        k_split, k_reward, _, _ = jax.random.split(key, 4)
        part = data if config.valid_fraction == 0 else train_val_split(data, k_split, config.valid_fraction)[0]
        reward_params = fit_reward_model(part, k_reward, **config.reward_model_options(), two_step_k=plan.k).params
    fitted = jax.block_until_ready(fit_arrays(plan, data, key, reward_params, on_epoch=on_epoch))
    policy = _policy(plan, fitted, data.position_weight)
    if plan.estimator is not None:
        stage = policy.pl_stage
        assert stage is not None  # a policy trained by an estimator has a PL part
        _warn_if_clipped(plan, stage, data)
    return policy


def _fit_registered(
    data: LoggedData, key: jax.Array, config: LearnerConfig, on_epoch: EpochCallback | None
) -> RankingPolicy:
    """One seed of a registered learner ([`LEARNERS`][LEARNERS])."""
    entry = LEARNERS[config.method]
    if entry.needs_position_marginals and data.log_pi0_position_marginal is None:
        raise ValueError(
            f"{config.method} needs LoggedData.log_pi0_position_marginal (simulate with position_marginals='exact')"
        )
    return entry.fit(data, key, config, on_epoch=on_epoch)


def fit_seeds(
    datas: Sequence[LoggedData],
    keys: jax.Array,
    config: LearnerConfig,
    *,
    on_epoch: EpochCallback | None = None,
    reward_params: Any = None,
) -> list[RankingPolicy]:
    """[`fit`][fit] on ``S`` data sets that share shapes (one sweep cell's seeds), every stage of
    [`fit_arrays`][fit_arrays] ``jax.vmap``-ed over the seeds (what an accelerator wants).

    Policy ``s`` matches ``fit(datas[s], keys[s], config)`` up to float rounding. Two-step
    reward models (pair sets found on the host) and registered learners ([`LEARNERS`][LEARNERS]:
    not known to be vmappable) fit one by one.

    Args:
      datas: ``S`` logged data sets of equal shapes (``n``, ``L``, ``D``, optional fields).
      keys: ``[S]`` PRNG keys.
      config: [`LearnerConfig`][LearnerConfig].
      on_epoch: as for [`fit`][fit]; under the vmap it is called for each seed's epoch
        (``S`` calls per epoch).
      reward_params: the ``S`` seeds' f_hat parameters stacked ``[S, ...]``, from
        [`fit_reward_seeds`][fit_reward_seeds] (as for [`fit`][fit]).

    Returns:
      ``S`` policies, as [`fit`][fit] returns them.
    """
    if len(datas) != keys.shape[0]:
        raise ValueError(f"keys must have shape [S={len(datas)}], got {keys.shape}")
    if config.method in LEARNERS:
        _check_shared_reward(None, reward_params, config.method)
        return [_fit_registered(d, k, config, on_epoch) for d, k in zip(datas, keys)]
    plan = _plan(datas[0], config)
    _check_shared_reward(plan, reward_params, config.method)
    if _two_step(plan):
        return [fit(d, k, config, on_epoch=on_epoch) for d, k in zip(datas, keys)]
    fitted = jax.block_until_ready(fit_arrays(plan, stack(datas), keys, reward_params, on_epoch=on_epoch, batched=True))
    return [_policy(plan, jax.tree.map(lambda x: x[s], fitted), d.position_weight) for s, d in enumerate(datas)]
