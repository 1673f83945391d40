"""Off-policy learners for ranking: ``fit(data, key, config) -> policy``.

Methods (R-POD paper, NOTES section 1):
  ips, iips, rips   a PL policy trained with the estimator of the same name;
  dr                R-POD with k = L (top-k weights become ranking weights): IPS on
                    R - f_hat plus the model term E_{a ~ pi}[f_hat];
  regression        fit f_hat (Eq. 12), act by its argmax (Eq. 13); R-POD with k = 0;
  rpod              fit f_hat, build the second stage (argmax completion, Eq. 13), train a
                    PL first stage over the top k with Eq. 9.
Every policy-gradient method runs through the one loop of :mod:`opl_rank.optimization`.

Numerical guard: importance weights are clipped at ``max_log_weight = 50`` in log space by
default (e^50 ~ 5e21, far beyond any informative weight) so that extreme logging
propensities cannot overflow float32; set ``math.inf`` to disable.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp

from opl_rank import opl_estimators as oe
from opl_rank import plackett_luce as pl
from opl_rank.data import LoggedData, train_val_split
from opl_rank.optimization import TrainConfig, minimize, minimize_replicas
from opl_rank.policies import make_scorer
from opl_rank.reward_models import REWARD_MODEL_KINDS, RewardModel, fit_reward_model, fit_reward_model_replicas

__all__ = [
    "METHODS",
    "LearnerConfig",
    "RankingPolicy",
    "PLPolicy",
    "RegressionPolicy",
    "TwoStagePolicy",
    "fit",
    "fit_replicas",
]

METHODS = ("ips", "dr", "iips", "rips", "regression", "rpod")


class RankingPolicy(Protocol):
    """What every learned policy offers."""

    n_slots: int

    def sample(self, key: jax.Array, context: jax.Array) -> jax.Array:
        """``[n, dx] -> [n, L]`` int32 rankings."""

    def log_prob(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``[n, dx], [n, L] -> [n]`` log pi(a | x) (``-inf`` off a deterministic policy's support)."""


@dataclasses.dataclass(frozen=True)
class PLPolicy:
    """Plackett-Luce over the logits of a scorer (``[n, dx] -> [n, D]``, see :mod:`opl_rank.policies`)."""

    module: Any
    params: Any
    n_slots: int

    def logits(self, context: jax.Array) -> jax.Array:
        """``[n, dx] -> [n, D]``."""
        return self.module.apply(self.params, context)

    def sample(self, key: jax.Array, context: jax.Array) -> jax.Array:
        return pl.sample_rankings(key, self.logits(context), self.n_slots)

    def log_prob(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        return pl.prefix_log_probs(self.logits(context), rankings[..., : self.n_slots])[..., -1]


@dataclasses.dataclass(frozen=True)
class RegressionPolicy:
    """Deterministic: the argmax of f_hat (Eq. 13 from an empty prefix)."""

    reward_model: RewardModel

    @property
    def n_slots(self) -> int:
        return self.reward_model.n_slots

    def sample(self, key: jax.Array, context: jax.Array) -> jax.Array:
        empty = jnp.zeros((context.shape[0], 0), jnp.int32)
        return self.reward_model.complete(context, empty)

    def log_prob(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        same = jnp.all(self.sample(None, context) == rankings, axis=-1)
        return jnp.where(same, 0.0, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class TwoStagePolicy:
    """R-POD's policy: PL over the top k, then the f_hat-argmax completion."""

    first_stage: PLPolicy  # n_slots = k
    reward_model: RewardModel

    @property
    def n_slots(self) -> int:
        return self.reward_model.n_slots

    def sample(self, key: jax.Array, context: jax.Array) -> jax.Array:
        return self.reward_model.complete(context, self.first_stage.sample(key, context))

    def log_prob(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        k = self.first_stage.n_slots
        completed = self.reward_model.complete(context, rankings[..., :k])
        same = jnp.all(completed == rankings, axis=-1)
        return jnp.where(same, self.first_stage.log_prob(context, rankings), -jnp.inf)


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """What to learn and how.

    Attributes:
      method: one of ``METHODS``.
      k: R-POD's top-k length in ``[0, L]`` (``rpod`` only).
      reward_model: f_hat's kind (dr, regression, rpod): ``"additive"``, ``"pairwise"``, or
        their Appendix-A two-step forms ``"additive-two-step"``, ``"pairwise-two-step"``
        (fitted for the learner's k; they need rounds that share a context).
      policy_hidden: hidden sizes of the policy's scorer (``()``: linear logits).
      reward_hidden: hidden sizes of f_hat's item head.
      item_feature_dim: ``F`` when the context packs the D candidates' features
        (LETOR-style environments, ``context[:, :D*F]``): the policy and f_hat's item head
        are then one MLP shared by every item. None: a per-item head on the context.
      n_samples: sampled rankings per round for the model terms of dr/rpod.
      max_log_weight: clip on log importance weights (see the module docstring).
      train: optimisation of the policy.
      reward_train: optimisation of f_hat.
      valid_fraction: rows held out for early stopping (0: none; needs ``train.patience``).
    """

    method: str
    k: int | None = None
    reward_model: str = "additive"
    policy_hidden: tuple[int, ...] = ()
    reward_hidden: tuple[int, ...] = ()
    item_feature_dim: int | None = None
    n_samples: int = 8
    max_log_weight: float = 50.0
    train: TrainConfig = TrainConfig(epochs=30, batch_size=256, learning_rate=5e-2)
    reward_train: TrainConfig = TrainConfig(epochs=60, batch_size=256, learning_rate=2e-2)
    valid_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.method == "rpod" and (not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 0):
            raise ValueError(f"rpod needs k, an int in [0, L], got {self.k!r}")
        if self.method != "rpod" and self.k is not None:
            raise ValueError(f"k is only for method 'rpod', got k={self.k!r} with {self.method!r}")
        if self.reward_model not in REWARD_MODEL_KINDS:
            raise ValueError(f"reward_model must be one of {REWARD_MODEL_KINDS}, got {self.reward_model!r}")
        if not isinstance(self.n_samples, int) or self.n_samples < 2:
            raise ValueError(f"n_samples must be an int >= 2 (leave-one-out baselines), got {self.n_samples!r}")
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ValueError(f"valid_fraction must be in [0, 1), got {self.valid_fraction}")
        if self.item_feature_dim is not None and (not isinstance(self.item_feature_dim, int) or self.item_feature_dim < 1):
            raise ValueError(f"item_feature_dim must be None or a positive int, got {self.item_feature_dim!r}")
        if not self.max_log_weight > 0:
            raise ValueError(f"max_log_weight must be > 0, got {self.max_log_weight}")


def reward_model_options(config: LearnerConfig) -> dict[str, Any]:
    """The f_hat settings of a learner config, as keyword arguments of ``fit_reward_model``."""
    return dict(kind=config.reward_model, hidden=config.reward_hidden, config=config.reward_train,
                item_feature_dim=config.item_feature_dim)


@functools.lru_cache(maxsize=128)
def _surrogate(config: LearnerConfig, module: Any, reward_spec: tuple | None, k: int) -> Callable:
    """``(params, batch, key, reward_params) -> scalar`` loss: minus the mean per-round terms.

    One function object per (config, shapes): refits with other data, seeds or reward-model
    parameters reuse the compiled training epoch.
    """
    clip = config.max_log_weight

    def terms(params, batch: LoggedData, key, reward_params):
        logits = module.apply(params, batch.context)
        args = (logits, batch.ranking, batch.reward)
        if config.method == "ips":
            return oe.ips_terms(*args, batch.log_pi0_prefix, batch.position_weight, max_log_weight=clip)
        if config.method == "rips":
            return oe.rips_terms(*args, batch.log_pi0_prefix, batch.position_weight, max_log_weight=clip)
        if config.method == "iips":
            return oe.iips_terms(*args, batch.log_pi0_position_marginal, batch.position_weight, max_log_weight=clip)
        # dr (k = L) and rpod
        kind, reward_module, max_enumerated, beam_width = reward_spec
        reward_model = RewardModel(kind, reward_module, reward_params, batch.position_weight, max_enumerated, beam_width)
        f_logged = reward_model.predict(batch.context, batch.ranking)
        n_slots = batch.ranking.shape[-1]
        if k == n_slots and kind == "additive":
            model = oe.additive_model_value(logits, reward_model.item_values(batch.context), batch.position_weight, key, config.n_samples)
        else:
            value_fn = lambda prefixes: reward_model.predict(batch.context, reward_model.complete(batch.context, prefixes))
            model = oe.ranking_model_value(logits, value_fn, k, key, config.n_samples)
        return oe.rpod_terms(*args, batch.log_pi0_prefix, batch.position_weight, k, f_logged, model, max_log_weight=clip)

    return lambda params, batch, key, reward_params: -jnp.mean(terms(params, batch, key, reward_params))


def fit(data: LoggedData, key: jax.Array, config: LearnerConfig) -> RankingPolicy:
    """Learn a ranking policy from logged data.

    Args:
      data: logged rounds with a fixed action set (``n_items`` items, contexts ``[n, dx]``).
      key: PRNG key.
      config: :class:`LearnerConfig`.

    Returns:
      A :class:`PLPolicy` (ips, iips, rips, dr), :class:`RegressionPolicy` (regression,
      rpod with k = 0) or :class:`TwoStagePolicy` (rpod with 0 < k < L; k = L gives the
      DR policy, a :class:`PLPolicy`).
    """
    return _fit([data], key, config, replicated=False)[0]


def fit_replicas(datas: Sequence[LoggedData], keys: jax.Array, config: LearnerConfig) -> list[RankingPolicy]:
    """:func:`fit` on ``S`` data sets that share shapes (one sweep cell's seeds), vmapped.

    Every reward model and policy of the ``S`` fits trains in one vmapped loop. Policy
    ``s`` matches ``fit(datas[s], keys[s], config)`` up to float rounding (~1e-5 in the
    parameters). With ``config.valid_fraction > 0`` (early stopping) the fits run one by one.

    Args:
      datas: ``S`` logged data sets of equal shapes (``n``, ``L``, ``D``, optional fields).
      keys: ``[S]`` PRNG keys.
      config: :class:`LearnerConfig`.

    Returns:
      ``S`` policies, as :func:`fit` returns them.
    """
    if len(datas) != keys.shape[0]:
        raise ValueError(f"keys must have shape [S={len(datas)}], got {keys.shape}")
    if config.valid_fraction > 0:
        return [fit(d, k, config) for d, k in zip(datas, keys)]
    return _fit(datas, keys, config, replicated=True)


def _fit(datas: Sequence[LoggedData], key: jax.Array, config: LearnerConfig, replicated: bool) -> list[RankingPolicy]:
    """The steps of :func:`fit`; ``replicated``: ``key`` is ``[S]`` and every step is vmapped."""
    data = datas[0]
    n_slots = data.ranking_length
    k = {"dr": n_slots, "rpod": config.k, "regression": 0}.get(config.method, n_slots)
    if k > n_slots:
        raise ValueError(f"k={k} must be in [0, L={n_slots}]")
    if config.method == "iips" and data.log_pi0_position_marginal is None:
        raise ValueError("iips needs LoggedData.log_pi0_position_marginal (simulate with position_marginals='exact')")
    keys = jax.vmap(lambda k: jax.random.split(k, 4))(key) if replicated else jax.random.split(key, 4)[None]
    k_split, k_reward, k_init, k_fit = (keys[:, i] for i in range(4))
    valid = None
    if config.valid_fraction > 0:  # single fits only (fit_replicas loops)
        data, valid = train_val_split(data, k_split[0], config.valid_fraction)
        datas = [data]
    reward_models: list[RewardModel | None] = [None] * len(datas)
    if config.method in ("dr", "regression", "rpod"):
        options = dict(reward_model_options(config), two_step_k=k)
        if replicated:
            reward_models = fit_reward_model_replicas(datas, k_reward, **options)
        else:
            reward_models = [fit_reward_model(data, k_reward[0], **options)]
        if k == 0:
            return [RegressionPolicy(model) for model in reward_models]
    module = make_scorer(data.n_items, config.policy_hidden, config.item_feature_dim)
    reward_model = reward_models[0]
    reward_spec = None
    if reward_model is not None:
        reward_spec = (reward_model.kind, reward_model.module, reward_model.max_enumerated, reward_model.beam_width)
    loss = _surrogate(config, module, reward_spec, k)
    if replicated:
        params = jax.vmap(module.init)(k_init, jnp.stack([d.context[:1] for d in datas]))
        aux = None if reward_model is None else jax.tree.map(lambda *x: jnp.stack(x), *[m.params for m in reward_models])
        params = minimize_replicas(loss, params, datas, k_fit, config.train, aux=aux).params
        replica_params = [jax.tree.map(lambda x: x[s], params) for s in range(len(datas))]
    else:
        params = module.init(k_init[0], data.context[:1])
        aux = None if reward_model is None else reward_model.params
        replica_params = [minimize(loss, params, data, k_fit[0], config.train, aux=aux, valid=valid).params]
    policies: list[RankingPolicy] = []
    for params, model in zip(replica_params, reward_models):
        first = PLPolicy(module, params, k)
        policies.append(first if config.method == "dr" or k == n_slots or model is None else TwoStagePolicy(first, model))
    return policies
