"""No silent numerical failure: importance-weighted learners stay finite and learn at extreme
propensities and reward scales, and a non-finite parameter or optimiser state is an error."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.opl import learners
from opl_rank.opl.learners import LearnerConfig, fit
from opl_rank.optimization import TrainConfig
from opl_rank.scorers import make_scorer
from simulators import SyntheticRankingEnv


def _beats(env, policy, key=3, n=5000):
    v0 = env.logging_policy_value(make_key(key), n)
    v = env.policy_value(policy, make_key(key), n)
    return v.value > v0.value + 4 * math.hypot(v.stderr, v0.stderr)


@pytest.mark.extended
@pytest.mark.slow
def test_ips_at_d1000_l10_moves_every_parameter_and_beats_the_logging_policy():
    env = SyntheticRankingEnv.create(make_key(0), n_items=1000, ranking_length=10)
    data = env.sample_logged_data(make_key(1), 20_000)
    assert float(data.log_pi0_prefix[:, -1].min()) < -70  # the regime where Adam used to freeze
    config = LearnerConfig("ips", train=TrainConfig(epochs=5, batch_size=1024, learning_rate=0.05))
    policy = fit(data, make_key(2), config)
    init = make_scorer(1000).init(jax.random.split(make_key(2), 4)[2], data.context[:1])
    frozen = sum(
        int(np.sum(np.asarray(a) == np.asarray(b)))
        for a, b in zip(jax.tree.leaves(policy.params), jax.tree.leaves(init))
    )
    assert frozen == 0
    assert _beats(env, policy)


def _extreme(data, log_pi0_last, reward_scale):
    """The same rankings with logged propensities ``exp(log_pi0_last)`` and scaled rewards."""
    n, n_slots = data.ranking.shape
    prefix = jnp.broadcast_to(jnp.linspace(log_pi0_last / n_slots, log_pi0_last, n_slots), (n, n_slots))
    return data.replace(log_pi0_prefix=prefix.astype(jnp.float32), reward=data.reward * reward_scale)


@pytest.mark.slow
@pytest.mark.parametrize("log_pi0,reward_scale", [(math.log(1e-30), 1.0), (-200.0, 1.0), (-200.0, 1e6), (-5.0, 1e6)])
@pytest.mark.parametrize("method", ["ips", "rips", "dr"])
def test_extreme_propensities_and_rewards_stay_finite_and_learn(method, log_pi0, reward_scale):
    env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5)
    data = _extreme(env.sample_logged_data(make_key(1), 4000), log_pi0, reward_scale)
    train = TrainConfig(epochs=8, batch_size=256, learning_rate=0.05)
    policy = fit(data, make_key(2), LearnerConfig(method, train=train, reward_train=train))
    x = env.sample_contexts(make_key(4), 100)
    assert bool(jnp.all(jnp.isfinite(policy.logits(x))))
    if method == "dr" and log_pi0 == -200.0:
        # Every weight exceeds the clip e^50: DR's weighted term is a residual gradient with
        # equal weights, which carries no signal. It must stay finite, and say so (below).
        return
    assert _beats(env, policy)


@pytest.mark.slow
def test_a_fit_whose_weights_are_mostly_clipped_warns():
    env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5)
    data = _extreme(env.sample_logged_data(make_key(1), 2000), -200.0, 1.0)
    train = TrainConfig(epochs=2, batch_size=256, learning_rate=0.05)
    with pytest.warns(learners.ClippedWeightsWarning, match=r"dr: .* of the logged rows"):
        fit(data, make_key(2), LearnerConfig("dr", train=train, reward_train=train))


@pytest.mark.slow
def test_a_frozen_optimiser_is_an_error_naming_method_and_step(monkeypatch):
    """Without the loss guard, Adam's second moment overflows: the fit fails loudly."""
    monkeypatch.setattr(learners, "_MAX_LOG_TERMS", 1e4)
    learners._surrogate.cache_clear()
    try:
        env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5)
        data = _extreme(env.sample_logged_data(make_key(1), 2000), -200.0, 1e6)
        train = TrainConfig(epochs=3, batch_size=256, learning_rate=0.05)
        with pytest.raises(FloatingPointError, match=r"ips: policy .*non-finite at epoch \d+, step \d+"):
            fit(data, make_key(2), LearnerConfig("ips", train=train))
    finally:
        learners._surrogate.cache_clear()
