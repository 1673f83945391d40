"""Off-policy evaluation against the simulator's ground truth, for PL, deterministic and
two-stage target policies."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key, tuning
from opl_rank.opl import ope
from opl_rank.opl.policies import PLPolicy, RegressionPolicy, TwoStagePolicy
from opl_rank.opl.reward_models import fit_reward_model
from opl_rank.optimization import TrainConfig
from opl_rank.scorers import ActionScorer
from simulators import SyntheticRankingEnv

D, L = 5, 3


@pytest.fixture(scope="module")
def setting():
    # lambda = 0: rewards are independent across slots, so every importance estimator
    # (IPS, SNIPS, RIPS, IIPS) and DR is unbiased for every target policy.
    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, lam=0.0, logging_temperature=2.0)
    data = env.sample_logged_data(make_key(1), 12000, position_marginals="exact")
    model = fit_reward_model(
        data, make_key(2), kind="pairwise", config=TrainConfig(epochs=8, batch_size=256, learning_rate=3e-2)
    )
    module = ActionScorer(n_items=D)
    params = jax.tree.map(lambda p: 0.6 * p, module.init(make_key(3), data.context[:1]))
    policies = {
        "pl": PLPolicy(module, params, L),
        "regression": RegressionPolicy(model),
        "two_stage": TwoStagePolicy(PLPolicy(module, params, 1), model),
    }
    truth = {name: env.policy_value(p, make_key(4), 100_000) for name, p in policies.items()}
    return env, data, model, policies, truth


@pytest.mark.slow
@pytest.mark.parametrize("policy_name", ["pl", "regression", "two_stage"])
def test_estimates_are_unbiased_within_4_standard_errors(setting, policy_name):
    _, data, model, policies, truth = setting
    names = ("ips", "snips", "dr", "iips", "rips")
    got = ope.evaluate(
        policies[policy_name], data, make_key(5), estimators=names, reward_model=model, ci="normal", n_samples=64
    )
    want = truth[policy_name]
    for name in names:
        r = got[name]
        se = math.sqrt(r.stderr**2 + want.stderr**2)
        assert abs(r.value - want.value) < 4 * se, (policy_name, name, r.value, want.value, se)
        assert 0 < r.ess <= data.n_rounds and r.ci_low < r.value < r.ci_high
    assert got["ips"].value != got["snips"].value != got["rips"].value


@pytest.mark.slow
def test_topk_is_dr_at_kL_and_dm_plus_mean_residual_at_k0(setting):
    _, data, model, policies, _ = setting
    policy = policies["pl"]
    residual = float(jnp.mean(data.reward @ data.position_weight - model.predict(data.context, data.ranking)))
    for k, same_as, offset in ((0, "dm", residual), (L, "dr", 0.0)):
        got = ope.evaluate(
            policy, data, make_key(6), estimators=("topk", same_as), reward_model=model, k=k, ci="normal"
        )
        assert got["topk"].value == pytest.approx(got[same_as].value + offset, abs=1e-4)


@pytest.mark.slow
def test_two_stage_position_marginals_enumerated_equal_monte_carlo(setting):
    _, data, _, policies, _ = setting
    sub = data.take(np.arange(400))
    two_stage = policies["two_stage"]
    exact = two_stage.propensities(sub, make_key(7), slot_marginals=True)
    sampled = dataclasses.replace(two_stage, n_samples=4000, max_enumerated=0)
    mc = sampled.propensities(sub, make_key(7), slot_marginals=True)
    assert not np.array_equal(np.asarray(mc.log_slot), np.asarray(exact.log_slot))  # really sampled
    with pytest.raises(ValueError, match="need a PRNG key"):
        sampled.propensities(sub, None, slot_marginals=True)
    np.testing.assert_allclose(np.exp(np.asarray(mc.log_slot)), np.exp(np.asarray(exact.log_slot)), atol=0.03)
    # Prefix propensities: the first stage's PL, then the completion indicator.
    p = np.exp(np.asarray(exact.log_prefix))
    assert np.all(p[:, 1:] <= p[:, :-1] + 1e-6) and np.any(p[:, -1] == 0) and np.any(p[:, -1] > 0)


def test_bootstrap_and_normal_intervals_agree(setting):
    _, data, _, policies, _ = setting
    boot = ope.evaluate(policies["pl"], data, make_key(8), estimators=("ips", "snips"), n_bootstrap=400)
    normal = ope.evaluate(policies["pl"], data, make_key(8), estimators=("ips", "snips"), ci="normal")
    for name in ("ips", "snips"):
        b, n = boot[name], normal[name]
        assert b.value == n.value and b.ci_low < b.value < b.ci_high
        assert (b.ci_high - b.ci_low) == pytest.approx(n.ci_high - n.ci_low, rel=0.25)


def test_bad_arguments(setting):
    env, data, model, policies, _ = setting
    with pytest.raises(ValueError, match="unknown estimator"):
        ope.evaluate(policies["pl"], data, make_key(0), estimators=("magic",))
    with pytest.raises(ValueError, match="need reward_model"):
        ope.evaluate(policies["pl"], data, make_key(0), estimators=("dr",))
    with pytest.raises(ValueError, match="topk needs k"):
        ope.evaluate(policies["pl"], data, make_key(0), estimators=("topk",), reward_model=model)
    with pytest.raises(ValueError, match="iips needs"):
        ope.evaluate(
            policies["pl"], dataclasses.replace(data, log_pi0_position_marginal=None), make_key(0), estimators=("iips",)
        )
    with pytest.raises(TypeError, match="policy must be a RankingPolicy"):
        ope.evaluate(object(), data, make_key(0), estimators=("ips",))


@pytest.mark.slow
def test_select_k_returns_the_best_estimate_and_validates(setting):
    from opl_rank.opl.learners import LearnerConfig
    from opl_rank.opl.select_k import select_k

    _, data, _, _, _ = setting
    fast = TrainConfig(epochs=2, batch_size=512, learning_rate=5e-2)
    config = LearnerConfig("rpod", k=0, reward_model="pairwise", train=fast, reward_train=fast)
    chosen = select_k(data.take(np.arange(800)), make_key(9), config, ks=(0, 1), estimator="dr")
    assert [row["k"] for row in chosen.table] == [0, 1] and set(chosen.policies) == {0, 1}
    assert chosen.k == max(chosen.table, key=lambda row: row["value"])["k"]
    with pytest.raises(ValueError, match="needs an 'rpod'"):
        select_k(data, make_key(0), LearnerConfig("ips"))
    with pytest.raises(ValueError, match="unknown estimator 'magic'"):
        select_k(data, make_key(0), config, estimator="magic")
    with pytest.raises(ValueError, match="ks must be ints"):
        select_k(data, make_key(0), config, ks=(0, 7))


def test_select_k_warns_once_per_selection_for_degenerate_weights(setting, monkeypatch):
    """One warning for the selection, naming every k whose hold-out estimate has degenerate
    weights, instead of one per k from ope.evaluate; the table and the choice are unchanged."""
    import warnings

    from opl_rank.opl.learners import LearnerConfig
    from opl_rank.opl.select_k import select_k

    _, data, _, _, _ = setting
    fast = TrainConfig(epochs=2, batch_size=512, learning_rate=5e-2)
    config = LearnerConfig("rpod", k=0, reward_model="additive", train=fast, reward_train=fast)
    rows = data.take(np.arange(600))
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        plain = select_k(rows, make_key(3), config, ks=(0, 1), estimator="dr")
    assert not [w for w in quiet if issubclass(w.category, ope.DegenerateWeightsWarning)]
    monkeypatch.setattr(ope, "DEGENERATE_ESS_FRACTION", 2.0)  # every estimate counts as degenerate
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flagged = select_k(rows, make_key(3), config, ks=(0, 1), estimator="dr")
    messages = [str(w.message) for w in caught if issubclass(w.category, ope.DegenerateWeightsWarning)]
    assert len(messages) == 1 and messages[0].startswith("select_k: estimator 'dr'"), messages
    assert "k = 0, 1" in messages[0] and "180 hold-out rounds" in messages[0]
    assert flagged.k == plain.k and flagged.table == plain.table


@pytest.mark.slow
def test_select_k_fits_f_hat_once_and_matches_separate_fits(setting, monkeypatch):
    """The candidates share one f_hat fit (not one per k) and are bit for bit the policies
    that separate fits on the same training split return."""
    from opl_rank.data import train_val_split
    from opl_rank.opl import learners
    from opl_rank.opl.learners import LearnerConfig, fit
    from opl_rank.opl.select_k import select_k

    _, data, _, _, _ = setting
    data = data.take(np.arange(600))
    fast = TrainConfig(epochs=2, batch_size=256, learning_rate=5e-2)
    config = LearnerConfig("rpod", k=0, reward_model="pairwise", train=fast, reward_train=fast)
    reward_fits = []
    train_reward = learners._train_reward
    monkeypatch.setattr(learners, "_train_reward", lambda *a: reward_fits.append(1) or train_reward(*a))
    chosen = select_k(data, make_key(4), config, ks=(0, 1, 2), estimator="ips")
    assert len(reward_fits) == 1  # one f_hat for the three candidates (each fit used to fit its own)
    k_split, _, k_fit, _ = jax.random.split(make_key(4), 4)
    train, _ = train_val_split(data, k_split, 0.3)
    for k in (0, 1, 2):
        alone = fit(train, k_fit, dataclasses.replace(config, k=k))
        shared_leaves = jax.tree.leaves(chosen.policies[k].reward_model.params)
        alone_leaves = jax.tree.leaves(alone.reward_model.params)
        if k > 0:
            shared_leaves += jax.tree.leaves(chosen.policies[k].pl_stage.params)
            alone_leaves += jax.tree.leaves(alone.pl_stage.params)
        for a, b in zip(shared_leaves, alone_leaves, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(reward_fits) == 4  # the separate fits each fitted one


# ------------------------------------------------------------- degenerate-weights warning


@pytest.fixture(scope="module")
def small_logs():
    from opl_rank.opl import estimators as oe

    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, lam=0.0, logging_temperature=2.0)
    data = env.sample_logged_data(make_key(1), 500, position_marginals="exact")
    module = ActionScorer(n_items=D)
    params = module.init(make_key(3), data.context[:1])
    sharp = PLPolicy(module, jax.tree.map(lambda p: 1e4 * p, params), L)  # near-deterministic target
    mild = PLPolicy(module, jax.tree.map(lambda p: 0.5 * p, params), L)
    weight = np.asarray(oe.get("ips").terms(sharp.propensities(data, make_key(2)), data).weight)
    return data, sharp, mild, weight


def _evaluate_recording(policy, data, estimators):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = ope.evaluate(policy, data, make_key(5), estimators=estimators, ci="normal")
    return results, [w for w in caught if issubclass(w.category, ope.DegenerateWeightsWarning)]


def test_all_zero_importance_weights_warn(small_logs):
    data, sharp, _, weight = small_logs
    unmatched = np.flatnonzero(weight < 1e-6)  # the target never ranks these rows' logged rankings
    assert unmatched.size > 400
    results, caught = _evaluate_recording(sharp, data.take(unmatched), ("ips", "rips"))
    # no weight mass: not estimable (NaN numbers and the reason), never a value of 0
    assert results["ips"].ess == 0.0 and not results["ips"].estimable and math.isnan(results["ips"].value)
    assert "all importance weights are 0" in results["ips"].reason
    messages = [str(w.message) for w in caught]
    assert any("'ips'" in m and "effective sample size 0" in m and "not estimable" in m for m in messages), messages
    assert issubclass(ope.DegenerateWeightsWarning, RuntimeWarning)


def test_one_dominating_weight_warns_without_changing_values(small_logs):
    data, sharp, _, weight = small_logs
    rows = np.concatenate([np.flatnonzero(weight < 1e-6)[:300], np.flatnonzero(weight > 1e-3)[:1]])
    sub = data.take(rows)
    prefix = np.asarray(sub.log_pi0_prefix).copy()
    prefix[-1] += -60.0 - prefix[-1, -1]  # pi_0 of that ranking ~1e-26: one weight dominates
    sub = sub.replace(log_pi0_prefix=jnp.asarray(prefix))
    results, caught = _evaluate_recording(sharp, sub, ("ips", "snips"))
    # one round carries all the weight (ESS ~1 < MIN_ESS): not estimable
    assert results["ips"].ess < ope.MIN_ESS and not results["ips"].estimable and math.isnan(results["ips"].value)
    assert results["ips"].max_weight > 1e20 and "one round carries nearly all the weight" in results["ips"].reason
    assert {str(w.message).split("'")[1] for w in caught} == {"ips", "snips"}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet = ope.evaluate(sharp, sub, make_key(5), estimators=("ips", "snips"), ci="normal")
    assert quiet == results  # the warning changes no returned value


def test_healthy_weights_do_not_warn(small_logs):
    data, _, mild, _ = small_logs
    _, caught = _evaluate_recording(mild, data, ("ips", "snips", "iips", "rips"))
    assert caught == []


def test_memory_bounding_chunks_do_not_change_results(setting, monkeypatch):
    """Two-stage slot marginals run over chunks of rows, model values over batches of
    samples (bounded memory at any n): tiny chunks give the same numbers as one piece."""

    _, data, model, policies, _ = setting
    sub = data.take(np.arange(56))  # 8 chunks of 7 rows: one chunk shape to compile
    two_stage = policies["two_stage"]
    whole = two_stage.propensities(sub, make_key(8), slot_marginals=True)
    values = ope.model_values(two_stage, model, sub.context, make_key(9), n_samples=32, n_items=D)
    monkeypatch.setattr(tuning, "POLICY_CHUNK_FLOATS", 7 * 5 * (D + L))  # 7 rows per chunk (5 prefixes)
    monkeypatch.setattr(tuning, "OPE_BATCH_FLOATS", 3 * 56 * D)  # 3 samples per batch
    chunked = two_stage.propensities(sub, make_key(8), slot_marginals=True)
    np.testing.assert_allclose(np.asarray(chunked.log_slot), np.asarray(whole.log_slot), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(chunked.log_prefix), np.asarray(whole.log_prefix))
    batched = ope.model_values(two_stage, model, sub.context, make_key(9), n_samples=32, n_items=D)
    np.testing.assert_allclose(np.asarray(batched), np.asarray(values), rtol=1e-5)
    monkeypatch.setattr(tuning, "POLICY_CHUNK_FLOATS", 7 * 16 * (D + L))  # 7 rows per chunk (16 samples)
    sampled = dataclasses.replace(
        two_stage, n_samples=16, max_enumerated=0
    )  # Monte Carlo, chunked: still a probability
    mc = np.exp(np.asarray(sampled.propensities(sub, make_key(8), slot_marginals=True).log_slot))
    assert np.all((mc >= 0) & (mc <= 1 + 1e-6))


@pytest.mark.extended
def test_policies_are_pytrees_and_compiled_propensities_equal_the_plain_ones(setting):
    """OPE compiles propensities and model values of this library's policies as whole
    programs (policies are pytrees: parameters are leaves, modules and sizes static); the
    numbers must be the plain, op-by-op ones."""
    from opl_rank.opl.policies import compiled_propensities

    _, data, model, policies, _ = setting
    sub = data.take(np.arange(200))
    for name, policy in policies.items():
        leaves, treedef = jax.tree.flatten(policy)
        assert leaves and all(isinstance(x, jax.Array) for x in leaves), name
        rebuilt = jax.tree.unflatten(treedef, leaves)
        assert type(rebuilt) is type(policy) and rebuilt.n_slots == policy.n_slots
        plain = policy.propensities(sub, make_key(8), slot_marginals=True)
        compiled = compiled_propensities(policy, sub, make_key(8), slot_marginals=True)
        np.testing.assert_allclose(np.asarray(compiled.log_prefix), np.asarray(plain.log_prefix), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(compiled.log_slot), np.asarray(plain.log_slot), rtol=1e-5, atol=1e-6)
        with jax.disable_jit():  # model values: the compiled program against op-by-op
            slow = ope.model_values(policy, model, sub.context, make_key(9), n_samples=8, n_items=D)
        fast = ope.model_values(policy, model, sub.context, make_key(9), n_samples=8, n_items=D)
        np.testing.assert_allclose(np.asarray(fast), np.asarray(slow), rtol=1e-4, atol=1e-5)
    # a whole policy passes through jax.jit: its log-probabilities equal the direct call
    pl_policy = policies["pl"]
    jitted = jax.jit(lambda p, x, r: p.log_prob(x, r))(pl_policy, sub.context, sub.ranking)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(pl_policy.log_prob(sub.context, sub.ranking)), rtol=1e-5)
