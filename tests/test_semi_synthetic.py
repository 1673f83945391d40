"""The semi-synthetic environment on the real Yahoo! LTR sample (shipped in simulators/data)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.opl.learners import LearnerConfig, fit
from opl_rank.optimization import TrainConfig
from simulators import datasets
from simulators.letor import load_letor
from simulators.semi_synthetic import SemiSyntheticEnv

YAHOO = datasets.path("yahoo_sample")


@pytest.fixture(scope="module")
def letor():
    return load_letor(YAHOO, n_features=300)


@pytest.fixture(scope="module")
def env(letor):
    return SemiSyntheticEnv.create(
        make_key(0),
        letor,
        n_items=10,
        ranking_length=3,
        lam=0.5,
        logging_policy="random_forest",
        forest_options={"n_estimators": 30},
    )


def test_queries_documents_and_rewards_follow_the_paper(letor, env):
    counts = letor.mask.sum(1)
    assert env.n_queries == int((counts >= 10).sum()) and env.skipped_queries == int((counts < 10).sum()) == 20
    assert env.context_dim == 10 * 300 + 1 and env.n_features == 300
    base = np.asarray(env.reward_model.base_table)
    eta = base - env.labels / 4.0
    assert abs(eta.std() - 0.05) < 0.005 and abs(eta.mean()) < 0.005  # eta ~ N(0, 0.05^2)
    # every query's sampled documents are real documents of that query, with their labels
    q = 7
    row = np.asarray(env.contexts[q, :-1]).reshape(10, 300)
    original = letor.features[np.flatnonzero(counts >= 10)[q]]
    for d in range(10):
        matches = np.flatnonzero(np.all(original == row[d], axis=1))
        assert matches.size >= 1
        assert env.labels[q, d] in letor.labels[np.flatnonzero(counts >= 10)[q], matches]
    plain = env.with_lambda(0.0)  # no interaction switch: the residual is the noise alone
    data = plain.sample_logged_data(make_key(1), 4000)
    residual = np.asarray(data.reward) - np.asarray(plain.expected_reward(data.context, data.ranking))
    assert abs(residual.std() - 0.05) < 0.003 and abs(residual.mean()) < 0.003  # sigma = 0.05


@pytest.mark.slow
def test_random_forest_logging_prefers_relevant_documents(env, letor):
    uniform = SemiSyntheticEnv.create(
        make_key(0), letor, n_items=10, ranking_length=3, lam=0.5, logging_policy="uniform"
    )
    v_forest = env.logging_policy_value(make_key(2), 20_000)
    v_uniform = uniform.logging_policy_value(make_key(2), 20_000)
    v_star, method = env.optimal_value(make_key(3), 20_000)
    assert method == "exact"  # 10 * 9 * 8 rankings
    assert v_uniform.value < v_forest.value - 4 * np.hypot(v_uniform.stderr, v_forest.stderr)
    assert v_forest.value < v_star.value
    colder = SemiSyntheticEnv.create(
        make_key(0),
        letor,
        n_items=10,
        ranking_length=3,
        lam=0.5,
        logging_temperature=0.2,
        forest_options={"n_estimators": 30},
    )
    assert colder.logging_policy_value(make_key(2), 20_000).value > v_forest.value


@pytest.mark.slow
@pytest.mark.extended
def test_learners_use_item_features_and_beat_the_logging_policy(env):
    data = env.sample_logged_data(make_key(4), 2000)
    v0 = env.logging_policy_value(make_key(5), 20_000)
    train = TrainConfig(epochs=8, batch_size=256, learning_rate=0.05)
    for method, extra in (("regression", {}), ("rpod", {"k": 1}), ("ips", {})):
        config = LearnerConfig(method, item_feature_dim=300, train=train, reward_train=train, **extra)
        value = env.policy_value(fit(data, make_key(6), config), make_key(5), 20_000)
        assert value.value > v0.value + 4 * np.hypot(value.stderr, v0.stderr), method


def test_bad_inputs_are_clear_errors(letor):
    with pytest.raises(ValueError, match="no query of .* has n_items=40 documents"):
        SemiSyntheticEnv.create(make_key(0), letor, n_items=40)
    with pytest.raises(ValueError, match="logging_policy must be one of"):
        SemiSyntheticEnv.create(make_key(0), letor, logging_policy="lambdamart")
    with pytest.raises(ValueError, match="forest_fraction"):
        SemiSyntheticEnv.create(make_key(0), letor, forest_fraction=0.0)
    with pytest.raises(ValueError, match="ranking_length=11 must be <= n_items=10"):
        SemiSyntheticEnv.create(make_key(0), letor, ranking_length=11)


def test_user_logging_policy_reads_the_documents_features(letor):
    def first_feature(context, item_features):
        return np.asarray(context)[:, :-1].reshape(len(context), 10, 300)[:, :, 0] * 5.0

    env = SemiSyntheticEnv.create(make_key(0), letor, n_items=10, ranking_length=3, logging_policy=first_feature)
    data = env.sample_logged_data(make_key(1), 500)
    assert env.logging_name == "first_feature"
    feats = np.asarray(data.context[:, :-1]).reshape(500, 10, 300)[:, :, 0]
    top = np.take_along_axis(feats, np.asarray(data.ranking[:, :1]), axis=1)[:, 0]
    assert top.mean() > feats.mean()  # the logging policy favours high first features
    assert bool(jnp.all(jnp.isfinite(data.log_pi0_prefix)))


def test_shared_prefix_pairs_group_by_context_and_prefix():
    from opl_rank.data import LoggedData
    from opl_rank.metrics import dcg_position_weights
    from opl_rank.opl.reward_models import shared_prefix_pairs

    context = jnp.asarray([[0.0], [1.0], [0.0], [0.0], [1.0], [2.0]])
    ranking = jnp.asarray([[0, 1], [0, 2], [0, 2], [1, 0], [0, 1], [0, 1]], jnp.int32)
    data = LoggedData(
        context=context,
        ranking=ranking,
        reward=jnp.zeros((6, 2)),
        log_pi0_prefix=jnp.full((6, 2), -1.0),
        position_weight=dcg_position_weights(2),
        n_items=3,
    )
    pairs = {tuple(sorted(p)) for p in zip(*shared_prefix_pairs(data, 1))}
    assert pairs == {(0, 2), (1, 4)}  # same context and first item; row 3 (other first item) and 5 alone
    by_context = {tuple(sorted(p)) for p in zip(*shared_prefix_pairs(data, 0))}  # k = 0: context only
    assert len(by_context) == 3 and (1, 4) in by_context  # rows {0, 2, 3} chain into 2 pairs, {1, 4} one


@pytest.mark.slow
@pytest.mark.extended
def test_two_step_reward_model_learns_within_prefix_differences(env):
    from opl_rank.opl.reward_models import fit_reward_model

    lam1 = env.with_lambda(1.0)
    data = lam1.sample_logged_data(make_key(7), 2500)
    config = TrainConfig(epochs=15, batch_size=256, learning_rate=0.03)
    model = fit_reward_model(
        data, make_key(8), kind="pairwise-two-step", config=config, item_feature_dim=300, two_step_k=1
    )
    x = lam1.sample_contexts(make_key(9), 2000)
    first = jax.random.randint(make_key(10), (2000,), 0, 10)

    def with_first(key):  # random rankings that start with the same item
        u = jax.random.uniform(key, (2000, 10)).at[jnp.arange(2000), first].set(2.0)
        return jnp.argsort(-u, axis=1)[:, :3].astype(jnp.int32)

    a, b = with_first(make_key(11)), with_first(make_key(12))
    alpha = lam1.position_weight
    true_diff = np.asarray((lam1.expected_reward(x, a) - lam1.expected_reward(x, b)) @ alpha)
    fitted_diff = np.asarray(model.predict(x, a) - model.predict(x, b))
    assert np.corrcoef(true_diff, fitted_diff)[0, 1] > 0.9
    completed = model.complete(x, a[:, :1])  # the second stage from the k = 1 prefix
    assert np.all(np.asarray(completed[:, 0]) == np.asarray(first))
    with pytest.raises(ValueError, match="completes prefixes of length >= 1"):
        model.complete(x, a[:, :0])


def test_two_step_needs_repeated_contexts():
    from opl_rank.opl.reward_models import fit_reward_model
    from simulators import SyntheticRankingEnv

    env = SyntheticRankingEnv.create(make_key(0), n_items=5, ranking_length=3)
    data = env.sample_logged_data(make_key(1), 500)
    with pytest.raises(ValueError, match="share a context and a top-1 prefix; none do"):
        fit_reward_model(data, make_key(2), kind="additive-two-step", two_step_k=1)
    with pytest.raises(ValueError, match="needs two_step_k"):
        fit_reward_model(data, make_key(2), kind="pairwise-two-step")
