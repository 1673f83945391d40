"""Click models: examination probabilities, sampling, swap interventions, environments."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from simulators import SyntheticRankingEnv
from simulators.clicks import (
    ClickModel,
    ClickRewards,
    joint_examination_from_swaps,
    relevance_probability,
    simulate_swap_intervention,
)


@pytest.mark.parametrize("browsing", ["independent", "continuous"])
def test_sampled_examination_matches_individual_and_joint_probabilities(browsing):
    model = ClickModel(browsing, 6, eta=1.0)
    n = 60_000
    e = np.asarray(model.sample_examination(make_key(0), n), np.float64)
    joint = e.T @ e / n
    se = np.sqrt(joint * (1 - joint) / n) + 1e-9
    truth = np.asarray(model.joint_examination(), np.float64)
    assert np.all(np.abs(joint - truth) < 4.5 * se + 1e-4)
    np.testing.assert_allclose(np.diag(truth), 1.0 / np.arange(1, 7), rtol=1e-6)
    if browsing == "continuous":  # examined ranks are a prefix: e_k >= e_{k+1}
        assert np.all(e[:, :-1] >= e[:, 1:])
        np.testing.assert_allclose(float(jnp.sum(model.last_examined_probs())), 1.0, atol=1e-6)


def test_click_model_errors_and_relevance_probability():
    with pytest.raises(ValueError, match="browsing must be one of"):
        ClickModel("cascade", 5)
    with pytest.raises(ValueError, match="n_positions"):
        ClickModel("independent", 0)
    with pytest.raises(ValueError, match="eta"):
        ClickModel("independent", 5, eta=-1.0)
    with pytest.raises(ValueError, match=r"relevance_prob must be \[n, K=5\]"):
        ClickModel("independent", 5).sample_clicks(make_key(0), jnp.zeros((3, 4)))
    np.testing.assert_allclose(
        np.asarray(relevance_probability(jnp.arange(5))), [0, 1 / 15, 3 / 15, 7 / 15, 1.0], rtol=1e-6
    )


@pytest.mark.parametrize("browsing", ["independent", "continuous"])
def test_swap_intervention_recovers_joint_examination(browsing):
    model = ClickModel(browsing, 8)
    rng = np.random.default_rng(0)
    relevance = jnp.asarray(rng.uniform(0.3, 0.9, size=(200_000, 8)), jnp.float32)
    estimate, se = simulate_swap_intervention(make_key(1), model, relevance, 3, 6)
    truth = float(model.joint_examination()[2, 5])
    assert abs(estimate - truth) < 4 * se, (estimate, truth, se)
    assert se < 0.2 * truth
    # the other browsing model's joint probability is far off: the estimate distinguishes them
    other = ClickModel({"independent": "continuous", "continuous": "independent"}[browsing], 8)
    assert abs(estimate - float(other.joint_examination()[2, 5])) > 4 * se
    with pytest.raises(ValueError, match="need 2 < k1 < k2"):
        simulate_swap_intervention(make_key(1), model, relevance, 2, 6)
    with pytest.raises(ValueError, match="no request had both swapped items clicked"):
        joint_examination_from_swaps(jnp.ones(5, bool), jnp.zeros(5, bool), 0.5)


@pytest.mark.slow
def test_click_rewards_as_an_environments_reward_model():
    env = SyntheticRankingEnv.create(make_key(0), n_items=6, ranking_length=3, bias_scale=0.3)
    clicks = ClickRewards(env.reward_model, ClickModel("continuous", 3))
    clicked_env = dataclasses.replace(env, reward_model=clicks)
    data = clicked_env.sample_logged_data(make_key(1), 8000)
    reward = np.asarray(data.reward)
    assert set(np.unique(reward)) <= {0.0, 1.0}
    expected = np.asarray(clicks.expected_reward(data.context, data.ranking))
    # mean click per slot = theta(l) * mean relevance probability (within 4 SE)
    se = reward.std(0) / np.sqrt(len(reward))
    assert np.all(np.abs(reward.mean(0) - expected.mean(0)) < 4 * se)
    assert reward[:, 0].mean() > reward[:, 2].mean()  # position bias
    value = clicked_env.policy_value(clicked_env.logging_policy_sampler(), make_key(2), 2000)
    assert 0.0 < value.value < float(jnp.sum(env.position_weight))
    with pytest.raises(ValueError, match="covers 2 positions"):
        ClickRewards(env.reward_model, ClickModel("continuous", 2)).expected_reward(data.context, data.ranking)
