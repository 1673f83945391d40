"""A fourth policy is one file: epsilon-greedy (tests/plugins/epsilon_greedy.py), defined
outside the package, is fitted, saved, loaded, evaluated and swept through the protocol."""

import csv
import itertools
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

import opl_rank
import tests.plugins.epsilon_greedy as plugin  # registers "EpsilonGreedyPolicy" and "eps-greedy"
from opl_rank import make_key
from opl_rank.data import LoggedData
from opl_rank.io.persistence import (
    EditedPolicyWarning,
    load_policy,
    read_policy_spec,
    register_policy_class,
    save_policy,
)
from opl_rank.opl import learners, ope
from opl_rank.opl.learners import LearnerConfig
from opl_rank.opl.policies import RankingPolicy, compiled_propensities, greedy_rankings
from opl_rank.opl.reward_models import fit_reward_model
from opl_rank.optimization import TrainConfig
from simulators import SyntheticRankingEnv

D, L = 4, 2
FAST = dict(
    train=TrainConfig(epochs=3, batch_size=128, learning_rate=5e-2),
    reward_train=TrainConfig(epochs=20, batch_size=128, learning_rate=5e-2),
)


@pytest.fixture(scope="module")
def setting():
    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, lam=0.0)
    data = env.sample_logged_data(make_key(1), 300, position_marginals="exact")
    policy = opl_rank.fit(data, make_key(2), LearnerConfig("eps-greedy", **FAST))
    return env, data, policy


def _enumerated(policy, context, where=None):
    """``[P, L]`` rankings of the allowed items and ``[m, P]`` probabilities of the mixture,
    from its definition (not from the policy's propensities)."""
    allowed = list(range(D)) if where is None else [i for i in range(D) if where[i]]
    rankings = np.array(list(itertools.permutations(allowed, L)), np.int32)
    greedy = np.asarray(
        greedy_rankings(
            policy.base,
            context,
            where=None if where is None else jnp.broadcast_to(jnp.asarray(where), (context.shape[0], D)),
        )
    )
    same = np.all(rankings[None, :, :] == greedy[:, None, :], axis=-1)
    probs = (1 - policy.epsilon) * same + policy.epsilon / len(rankings)
    return rankings, probs


def _rows(context, rankings, where=None):
    """LoggedData with every (context, ranking) pair as a row (rewards and logging terms are dummies)."""
    m, p = context.shape[0], rankings.shape[0]
    mask = None if where is None else np.broadcast_to(np.asarray(where), (m * p, D))
    return LoggedData(
        context=jnp.repeat(context, p, axis=0),
        ranking=jnp.asarray(np.tile(rankings, (m, 1))),
        reward=jnp.zeros((m * p, L), jnp.float32),
        log_pi0_prefix=jnp.full((m * p, L), -1.0, jnp.float32),
        position_weight=jnp.ones((L,), jnp.float32),
        n_items=D,
        log_pi0_position_marginal=jnp.full((m * p, L), -1.0, jnp.float32),
        item_mask=None if mask is None else jnp.asarray(mask),
    )


def test_the_plugin_is_registered_and_follows_the_protocol(setting):
    _, _, policy = setting
    assert "eps-greedy" in learners.learning_methods() and learners.needs_reward_model("eps-greedy")
    assert not learners.needs_position_marginals("eps-greedy")
    assert isinstance(policy, plugin.EpsilonGreedyPolicy) and isinstance(policy, RankingPolicy)
    assert type(policy.base) is opl_rank.RegressionPolicy and policy.epsilon == plugin.EPSILON
    assert policy.jit_propensities and policy.jit_sample and policy.n_slots == L
    with pytest.raises(ValueError, match="already registered"):
        learners.register_learner("eps-greedy", lambda data, key, config, *, on_epoch=None: None)
    with pytest.raises(ValueError, match="built-in method or a registered estimator"):
        learners.register_learner("ips", plugin.fit_epsilon_greedy)
    learners.register_learner("eps-greedy", plugin.fit_epsilon_greedy, needs_reward_model=True)  # the same: fine
    with pytest.raises(ValueError, match="'EpsilonGreedyPolicy' is already registered"):
        register_policy_class(type("EpsilonGreedyPolicy", (plugin.EpsilonGreedyPolicy,), {}))
    with pytest.raises(TypeError, match="greedy_rankings needs a policy with a greedy"):
        greedy_rankings(object(), jnp.zeros((1, 5), jnp.float32))


def test_fit_save_load_gives_the_same_policy(setting, tmp_path):
    _, data, policy = setting
    save_policy(policy, tmp_path / "p", config=LearnerConfig("eps-greedy", **FAST))
    loaded = load_policy(tmp_path / "p")
    assert type(loaded) is type(policy) and loaded.epsilon == policy.epsilon and type(loaded.base) is type(policy.base)
    context = data.context[:64]
    assert np.array_equal(np.asarray(greedy_rankings(loaded, context)), np.asarray(greedy_rankings(policy, context)))
    key = make_key(3)
    assert np.array_equal(np.asarray(loaded.sample(key, context)), np.asarray(policy.sample(key, context)))
    got, want = loaded.propensities(data, slot_marginals=True), policy.propensities(data, slot_marginals=True)
    np.testing.assert_array_equal(np.asarray(got.log_prefix), np.asarray(want.log_prefix))
    np.testing.assert_array_equal(np.asarray(got.log_slot), np.asarray(want.log_slot))
    spec = read_policy_spec(tmp_path / "p")
    assert spec["policy"]["class"] == "EpsilonGreedyPolicy" and spec["policy"]["class_module"] == plugin.__name__
    assert spec["policy"]["base"]["class"] == "RegressionPolicy" and spec["policy"]["epsilon"] == plugin.EPSILON
    assert (spec["n_items"], spec["n_slots"], spec["k"], spec["context_dim"]) == (D, L, 0, data.context.shape[1])
    assert spec["config"]["method"] == "eps-greedy"
    # An unknown class names the module that saved it (the edit itself is trusted here: an
    # edited spec is otherwise refused before its class is looked up).
    document = json.loads((tmp_path / "p" / "policy.json").read_text())
    document["policy"]["class"] = "Nope"
    (tmp_path / "p" / "policy.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"policy.json: was edited after saving: 'policy' differs"):
        load_policy(tmp_path / "p")
    with (
        pytest.warns(EditedPolicyWarning, match="'policy' differs"),
        pytest.raises(
            ValueError,
            match=r"unknown policy class 'Nope' \(known: PLPolicy, RegressionPolicy, "
            r"TwoStagePolicy, .*EpsilonGreedyPolicy.*'tests.plugins.epsilon_greedy'",
        ),
    ):
        load_policy(tmp_path / "p", trust_edited_spec=True)


@pytest.mark.parametrize("masked", [False, True])
def test_propensities_are_exact_against_enumeration(setting, masked):
    _, data, policy = setting
    context = data.context[:6]
    where = None if not masked else np.array([True, False, True, True])
    rankings, probs = _enumerated(policy, context, where)  # [P, L], [m, P]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    rows = _rows(context, rankings, where)
    got = compiled_propensities(policy, rows, slot_marginals=True)
    plain = policy.propensities(rows, slot_marginals=True)
    np.testing.assert_allclose(np.asarray(got.log_prefix), np.asarray(plain.log_prefix), rtol=1e-6)
    assert got.log_prefix.dtype == jnp.float32 and got.log_slot.dtype == jnp.float32
    prefix = np.exp(np.asarray(got.log_prefix, np.float64)).reshape(len(context), len(rankings), L)
    slot = np.exp(np.asarray(got.log_slot, np.float64)).reshape(len(context), len(rankings), L)
    for l in range(L):  # pi(a_{1:l}) and P(a_l = item): sums of the enumerated probabilities
        same_prefix = np.all(rankings[:, None, : l + 1] == rankings[None, :, : l + 1], axis=-1)  # [P, P]
        same_item = rankings[:, None, l] == rankings[None, :, l]
        np.testing.assert_allclose(prefix[:, :, l], probs @ same_prefix.T, atol=1e-5)
        np.testing.assert_allclose(slot[:, :, l], probs @ same_item.T, atol=1e-5)
    log_prob = policy.log_prob(rows.context, rows.ranking, where=rows.item_mask)
    np.testing.assert_allclose(np.exp(np.asarray(log_prob)), probs.reshape(-1), atol=1e-5)
    # greedy: the most probable ranking; samples follow the mixture
    greedy = np.asarray(
        greedy_rankings(
            policy, context, where=None if where is None else jnp.broadcast_to(jnp.asarray(where), (len(context), D))
        )
    )
    assert np.array_equal(greedy, rankings[np.argmax(probs, axis=1)])
    many = jnp.repeat(context, 2000, axis=0)
    mask = None if where is None else jnp.broadcast_to(jnp.asarray(where), (many.shape[0], D))
    drawn = np.asarray(policy.sample(make_key(4), many, where=mask)).reshape(len(context), 2000, 1, L)
    freq = np.mean(np.all(drawn == rankings[None, None], axis=-1), axis=1)  # [m, P]
    assert np.abs(freq - probs).max() < 0.03


def test_evaluate_and_the_true_value(setting):
    env, data, policy = setting
    model = fit_reward_model(data, make_key(5), config=FAST["reward_train"])
    got = ope.evaluate(
        policy,
        data,
        make_key(6),
        estimators=("ips", "snips", "iips", "rips", "dm", "dr"),
        reward_model=model,
        ci="normal",
    )
    log_w = np.asarray(policy.log_prob(data.context, data.ranking) - data.log_pi0_prefix[:, -1], np.float64)
    big_r = np.asarray(data.reward @ data.position_weight, np.float64)
    assert got["ips"].value == pytest.approx(np.mean(np.exp(log_w) * big_r), rel=1e-4)
    # the true value by enumeration over every ranking, against the Monte Carlo rollout
    x = env.sample_contexts(make_key(7), 500)
    rankings, probs = _enumerated(policy, x)
    rows = _rows(x, rankings)
    pi = np.exp(np.asarray(policy.log_prob(rows.context, rows.ranking), np.float64)).reshape(probs.shape)
    np.testing.assert_allclose(pi, probs, atol=1e-5)
    values = np.asarray(env.expected_reward(rows.context, rows.ranking) @ env.position_weight, np.float64)
    exact = float(np.mean(np.sum(probs * values.reshape(probs.shape), axis=1)))
    many = jnp.repeat(x, 40, axis=0)  # the same contexts, 40 sampled rankings each
    sampled = np.asarray(env.expected_reward(many, policy.sample(make_key(8), many)) @ env.position_weight, np.float64)
    assert abs(sampled.mean() - exact) < 4 * sampled.std() / math.sqrt(sampled.size)
    rollout = env.policy_value(policy, make_key(8), 20_000)  # the simulator's ground truth (fresh contexts)
    for name, result in got.items():
        assert math.isfinite(result.value) and math.isfinite(result.stderr), name
    assert abs(got["ips"].value - rollout.value) < 4 * got["ips"].stderr + 4 * rollout.stderr


def test_fit_seeds_loops_over_a_plugin_learner(setting):
    _, data, policy = setting
    config = LearnerConfig("eps-greedy", **FAST)
    fitted = learners.fit_seeds([data, data], jnp.stack([make_key(2), make_key(9)]), config)
    assert all(isinstance(p, plugin.EpsilonGreedyPolicy) for p in fitted)
    context = data.context[:32]
    assert np.array_equal(np.asarray(fitted[0].greedy(context)), np.asarray(policy.greedy(context)))


@pytest.mark.extended  # a sweep of the plugin learner (end to end)
def test_the_plugin_learner_is_swept(tmp_path):
    from experiments.opl_sweep import OPLSweep, run_sweep

    sweep = OPLSweep(
        n_items=(5,),
        ranking_length=(3,),
        tau=(1.0,),
        lam=(0.0,),
        n=(300,),
        seeds=(0,),
        methods=("eps-greedy", "ips"),
        reward_models=("additive",),
        ks=(0,),
        eval_contexts=2000,
        policy_epochs=2,
        reward_epochs=5,
        plugins=("tests.plugins.epsilon_greedy",),
        output_dir=str(tmp_path / "sweep"),
    )
    summary = run_sweep(sweep, echo=lambda line: None)
    with open(summary["results"]) as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["reward_model"]) for r in rows] == [("eps-greedy", "additive"), ("ips", "-")]
    assert all(math.isfinite(float(r["V"])) and float(r["V_se"]) > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.extended
def test_the_command_line_fits_evaluates_and_ranks_with_a_plugin(tmp_path):
    """``--plugin`` imports the module in a fresh process: its learner fits, its saved policy
    class loads for evaluate and rank."""
    import os
    import subprocess
    import sys

    import pandas as pd

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cli = [sys.executable, "-m", "experiments.cli"]
    plugin_args = ["--plugin", "tests.plugins.epsilon_greedy"]

    def run(*args):
        done = subprocess.run([*cli, *args], cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    logs, policy_dir = str(tmp_path / "logs.npz"), str(tmp_path / "policy")
    run("simulate", "-D", "4", "-L", "2", "--n", "300", "--value-contexts", "200", "--out", logs, "--json", "-q")
    fitted = run(
        "fit",
        *plugin_args,
        "--data",
        logs,
        "--method",
        "eps-greedy",
        "--epochs",
        "2",
        "--reward-epochs",
        "5",
        "--out",
        policy_dir,
        "--json",
        "-q",
    )
    assert fitted["policy"] == "EpsilonGreedyPolicy"
    report = run("evaluate", *plugin_args, "--policy", policy_dir, "--data", logs, "--json")
    assert math.isfinite(report["estimates"]["ips"]["value"])
    data = LoggedData.load(logs)
    pd.DataFrame({"id": np.arange(5), "context": list(np.asarray(data.context[:5]))}).to_parquet(tmp_path / "c.parquet")
    run(
        "rank",
        *plugin_args,
        "--policy",
        policy_dir,
        "--contexts",
        str(tmp_path / "c.parquet"),
        "--out",
        str(tmp_path / "r.parquet"),
        "--json",
    )
    ranked = pd.read_parquet(tmp_path / "r.parquet")
    expected = np.asarray(load_policy(policy_dir).greedy(data.context[:5]))
    assert np.asarray(ranked["ranking"].tolist()).tolist() == expected.tolist()
    missing = subprocess.run(
        [*cli, "evaluate", "--policy", policy_dir, "--data", logs],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2 and "EpsilonGreedyPolicy" in missing.stderr
