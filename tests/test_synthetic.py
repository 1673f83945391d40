"""The synthetic environment against float64 loops, enumeration and its own ground truth."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.pl import plackett_luce as pl
from simulators import SyntheticRankingEnv, rollout
from tests import reference as ref


@pytest.fixture(scope="module")
def env():
    return SyntheticRankingEnv.create(make_key(1), n_items=5, ranking_length=3, lam=0.5)


def test_logged_propensities_equal_exact_pl_probabilities(env):
    data = env.sample_logged_data(make_key(2), 300, position_marginals="exact")
    logits = np.asarray(env.logging_logits(data.context), np.float64)
    for i in range(0, 300, 10):
        ranking = np.asarray(data.ranking[i])
        want_prefix = ref.pl_prefix_probs(logits[i], ranking)
        np.testing.assert_allclose(np.exp(np.asarray(data.log_pi0_prefix[i])), want_prefix, rtol=1e-4)
        marg = ref.pl_position_marginals(logits[i], 3)
        want_marg = marg[np.arange(3), ranking]
        np.testing.assert_allclose(
            np.exp(np.asarray(data.log_pi0_position_marginal[i])), want_marg, rtol=1e-4, atol=1e-6
        )


@pytest.mark.slow
def test_expected_reward_matches_float64_loop(env):
    x = env.sample_contexts(make_key(3), 20)
    rankings = pl.sample_rankings(make_key(4), jnp.zeros((20, 5)), 3)
    got = np.asarray(env.expected_reward(x, rankings))
    rm = env.reward_model
    theta, bias, w = (np.asarray(a, np.float64) for a in (rm.theta, rm.bias, rm.interaction))
    for i in range(20):
        want = ref.synthetic_expected_reward(theta, bias, w, 0.5, np.asarray(x[i], np.float64), np.asarray(rankings[i]))
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.diag(w), 0.0)
    np.testing.assert_array_equal(w, w.T)


def test_mean_logged_reward_matches_ground_truth_logging_value(env):
    data = env.sample_logged_data(make_key(5), 40_000)
    s = data.summary()
    truth = env.logging_policy_value(make_key(6), 100_000)
    se = np.hypot(s["se_weighted_reward"], truth.stderr)
    assert abs(s["mean_weighted_reward"] - truth.value) < 4 * se


@pytest.mark.slow
def test_logging_value_equals_enumerated_expectation(env):
    # V(pi0) = E_x sum_a pi0(a|x) sum_l alpha_l q_l(x, a): enumerate a, Monte Carlo over x.
    x = env.sample_contexts(make_key(7), 20_000)
    rankings = jnp.asarray(pl.all_rankings(5, 3))  # [60, 3]
    probs = pl.enumerate_ranking_probs(env.logging_logits(x), rankings)  # [n, 60]
    q = jax.vmap(lambda xi: env.expected_reward(jnp.broadcast_to(xi, (60, 5)), rankings) @ env.position_weight)(x)
    per_context = np.asarray(jnp.sum(probs * q, axis=-1), np.float64)
    exact = per_context.mean()
    exact_se = per_context.std(ddof=1) / np.sqrt(per_context.size)
    truth = env.logging_policy_value(make_key(8), 100_000)
    assert abs(exact - truth.value) < 4 * np.hypot(exact_se, truth.stderr)


@pytest.mark.slow
def test_noise_is_independent_across_slots_rows_and_calls():
    env = SyntheticRankingEnv.create(make_key(9), n_items=6, ranking_length=4, lam=0.0, sigma=0.5)
    rm = env.reward_model
    n = 20_000
    x = env.sample_contexts(make_key(10), n)
    a = pl.sample_rankings(make_key(11), env.logging_logits(x), 4)
    q = np.asarray(env.expected_reward(x, a))
    e1 = np.asarray(rm.sample_reward(make_key(12), x, a)) - q
    e2 = np.asarray(rm.sample_reward(make_key(13), x, a)) - q
    bound = 4 / np.sqrt(n)
    assert abs(e1.std() - 0.5) < 0.01
    corr_slots = np.corrcoef(e1.T)[np.triu_indices(4, 1)]
    assert np.all(np.abs(corr_slots) < bound), corr_slots
    assert abs(np.corrcoef(e1[:-1, 0], e1[1:, 0])[0, 1]) < bound  # neighbouring rows
    assert abs(np.corrcoef(e1.ravel(), e2.ravel())[0, 1]) < 4 / np.sqrt(e1.size)  # two calls


def test_interaction_switches_are_bernoulli_lambda_and_independent():
    env = SyntheticRankingEnv.create(make_key(14), n_items=6, ranking_length=4, lam=0.3, sigma=0.0)
    rm = env.reward_model
    n = 20_000
    x = env.sample_contexts(make_key(15), n)
    a = pl.sample_rankings(make_key(16), env.logging_logits(x), 4)
    base = np.asarray(rm.base_reward(x, a))
    inter = np.asarray(rm.interaction_sum(a))
    r = np.asarray(rm.sample_reward(make_key(17), x, a))
    ok = np.abs(inter) > 1e-3
    switch = (r - base)[ok] / inter[ok]
    assert np.all((np.abs(switch) < 1e-3) | (np.abs(switch - 1) < 1e-3))  # exactly 0 or 1
    on = np.round((r - base) / np.where(ok, inter, 1.0)) * ok
    assert abs(on[ok].mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / ok.sum())
    assert abs(np.corrcoef(on[:, 0], on[:, 1])[0, 1]) < 4 / np.sqrt(n)


def test_uniform_logging_propensities_are_exact():
    env = SyntheticRankingEnv.create(make_key(18), n_items=7, ranking_length=3, logging_policy="uniform")
    data = env.sample_logged_data(make_key(19), 50)
    want = np.log(np.cumprod([1 / 7, 1 / 6, 1 / 5]))
    np.testing.assert_allclose(np.asarray(data.log_pi0_prefix), np.broadcast_to(want, (50, 3)), rtol=1e-5)


def test_user_callable_logging_policy_numpy():
    def favour_item_zero(context, items):
        logits = np.zeros((context.shape[0], items.shape[0]))
        logits[:, 0] = 50.0
        return logits

    env = SyntheticRankingEnv.create(make_key(20), n_items=5, ranking_length=2, logging_policy=favour_item_zero)
    data = env.sample_logged_data(make_key(21), 200)
    assert np.all(np.asarray(data.ranking[:, 0]) == 0)
    np.testing.assert_allclose(np.asarray(data.log_pi0_prefix[:, 0]), 0.0, atol=1e-6)


@pytest.mark.parametrize(
    "fn,error,message",
    [
        (lambda c, i: np.zeros((c.shape[0], 3)), ValueError, r"shape \(\d+, 3\); expected \[n, D\]"),
        (lambda c, i: np.full((c.shape[0], 5), np.nan), ValueError, "NaN"),
        (lambda c, i: np.full((c.shape[0], 5), -np.inf), ValueError, "excluded every item"),
        (lambda c, i: 1 / 0, RuntimeError, "ZeroDivisionError"),
    ],
)
def test_bad_user_logging_policy_gives_clear_error(fn, error, message):
    env = SyntheticRankingEnv.create(make_key(22), n_items=5, ranking_length=2, logging_policy=fn)
    with pytest.raises(error, match=message):
        env.sample_logged_data(make_key(23), 10)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(lam=1.5), "lam must be in"),
        (dict(ranking_length=11), "ranking_length=11 must be <= n_items=10"),
        (dict(sigma=-1.0), "sigma"),
        (dict(logging_temperature=0.0), "logging_temperature"),
        (dict(position_weight=[1.0, 0.5]), "position_weight must have shape"),
        (dict(position_weight=[1.0, -0.5, 0.1, 0.1, 0.1]), "non-negative"),
        (dict(n_items=0), "n_items"),
        (dict(logging_policy="greedy"), "logging_policy"),
    ],
)
def test_environment_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SyntheticRankingEnv.create(make_key(0), **kwargs)


def test_sampling_is_reproducible_and_keys_matter(env):
    a = env.sample_logged_data(make_key(30), 100)
    b = env.sample_logged_data(make_key(30), 100)
    c = env.sample_logged_data(make_key(31), 100)
    np.testing.assert_array_equal(np.asarray(a.reward), np.asarray(b.reward))
    assert not np.array_equal(np.asarray(a.reward), np.asarray(c.reward))
    with pytest.raises(ValueError, match="position_marginals"):
        env.sample_logged_data(make_key(30), 10, position_marginals="approx")
    with pytest.raises(ValueError, match="n must be a positive int"):
        env.sample_logged_data(make_key(30), 0)


def test_new_lambda_does_not_recompile(env):
    env.sample_logged_data(make_key(40), 64)
    before = rollout._logged_chunk._cache_size()
    for lam in (0.0, 0.25, 1.0):
        env.with_lambda(lam).sample_logged_data(make_key(41), 64)
    assert rollout._logged_chunk._cache_size() == before


def test_policy_value_of_a_deterministic_policy_and_bad_policies(env):
    # The best ranking under lambda = 0 sorts items by base reward: it beats the logger.
    env0 = env.with_lambda(0.0)
    rm = env0.reward_model

    def sort_by_base(key, context):
        return jax.lax.top_k(context @ rm.theta.T + rm.bias[None, :], 3)[1]

    best = env0.policy_value(sort_by_base, make_key(42), 20_000)
    logger = env0.logging_policy_value(make_key(43), 20_000)
    assert best.value > logger.value + 4 * np.hypot(best.stderr, logger.stderr)
    # ... and equals the enumerated optimum per context.
    x = env0.sample_contexts(make_key(44), 200)
    rankings = jnp.asarray(pl.all_rankings(5, 3))
    q = jax.vmap(lambda xi: env0.expected_reward(jnp.broadcast_to(xi, (60, 5)), rankings) @ env0.position_weight)(x)
    chosen = env0.expected_reward(x, sort_by_base(None, x)) @ env0.position_weight
    np.testing.assert_allclose(np.asarray(chosen), np.asarray(q.max(-1)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        env0.policy_value(lambda k, c: jnp.zeros((c.shape[0], 2), jnp.int32), make_key(45), 100)
    with pytest.raises(ValueError, match="repeats"):
        env0.policy_value(lambda k, c: jnp.zeros((c.shape[0], 3), jnp.int32), make_key(45), 100)
    with pytest.raises(TypeError, match="callable"):
        env0.policy_value(42, make_key(45), 100)


@pytest.mark.slow
def test_best_rankings_are_the_argmax_of_the_true_expected_reward():
    env = SyntheticRankingEnv.create(make_key(30), n_items=6, ranking_length=3, lam=1.0)
    x = env.sample_contexts(make_key(31), 200)
    everything = jnp.asarray(pl.all_rankings(6, 3))  # [120, 3]
    values = jax.vmap(lambda r: env.expected_reward(x, jnp.broadcast_to(r, (200, 3))) @ env.position_weight)(everything)
    best_value = np.asarray(jnp.max(values, axis=0))
    value_of = lambda rankings: np.asarray(env.expected_reward(x, rankings) @ env.position_weight)
    exact, method = env.best_rankings(x)
    assert method == "exact"
    np.testing.assert_allclose(value_of(exact), best_value, atol=1e-4)
    # The beam search (used when rankings are too many to enumerate) is exact when it keeps
    # every partial ranking, and a lower bound otherwise.
    wide, method = env.best_rankings(x, max_enumerated=0, beam_width=120)
    assert method == "beam"
    np.testing.assert_allclose(value_of(wide), best_value, atol=1e-4)
    greedy, _ = env.best_rankings(x, max_enumerated=0, beam_width=1)
    assert np.all(value_of(greedy) <= best_value + 1e-4)
    assert np.mean(value_of(greedy) < best_value - 1e-4) > 0.01  # greedy alone is not exact here


def test_scaled_beam_search_is_the_beam_search_and_sorting_is_exact_without_interactions():
    """V* beyond enumeration: the O(B D L) beam search finds the rankings of the
    O(B D^2 L) one; with lambda = 0 the best ranking is the top-L base rewards, sorted."""
    from opl_rank.opl import completion

    env = SyntheticRankingEnv.create(make_key(50), n_items=30, ranking_length=4, lam=0.7)
    x = env.sample_contexts(make_key(51), 64)
    base = env.reward_model.item_base(x)
    v = env.reward_model.lam * env.reward_model.interaction
    old = completion.complete(
        base, v, env.position_weight, jnp.zeros((64, 0), jnp.int32), max_enumerated=0, beam_width=8
    )[0]
    new, method = env.best_rankings(x, max_enumerated=0, beam_width=8)
    assert method == "beam"
    value_of = lambda r: np.asarray(env.expected_reward(x, r) @ env.position_weight)
    np.testing.assert_allclose(value_of(new), value_of(old), rtol=1e-6, atol=1e-5)
    small = SyntheticRankingEnv.create(make_key(52), n_items=6, ranking_length=3, lam=0.0)
    xs = small.sample_contexts(make_key(53), 50)
    from simulators.environments import best_rankings_by_enumeration

    # without interactions the optimum is sorted, at any size; enumeration finds the same
    exact = best_rankings_by_enumeration(small.expected_reward, xs, small.position_weight, 6)
    for limit in (2_000_000, 0):
        by_sort, method = small.best_rankings(xs, max_enumerated=limit)
        assert method == "exact-sort"
        np.testing.assert_array_equal(np.asarray(by_sort), np.asarray(exact))
    value_small = lambda r: np.asarray(small.expected_reward(xs, r) @ small.position_weight)
    np.testing.assert_allclose(value_small(by_sort), value_small(exact), atol=1e-5)


def test_progress_callback_counts_every_row(capsys):
    env = SyntheticRankingEnv.create(make_key(60), n_items=5, ranking_length=3)
    quiet = env.sample_logged_data(make_key(61), 300)
    done: list[int] = []
    counted = env.sample_logged_data(make_key(61), 300, progress=done.append)
    assert sum(done) == 300 and capsys.readouterr().err == ""  # the library draws nothing itself
    np.testing.assert_array_equal(np.asarray(quiet.ranking), np.asarray(counted.ranking))  # results do not depend on it
    done.clear()
    env.policy_value(env.logging_policy_sampler(), make_key(62), 500, progress=done.append)
    assert sum(done) == 500
