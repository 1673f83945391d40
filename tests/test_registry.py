"""One registry: an estimator defined outside the package runs through fit, OPE and a sweep."""

import csv
import math

import numpy as np
import pytest

import opl_rank
from opl_rank import make_key
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.learners import LearnerConfig, fit, learning_methods
from opl_rank.optimization import TrainConfig
from simulators import SyntheticRankingEnv


@pytest.fixture(scope="module")
def plugin():
    import tests.plugins.clipped_snips  # noqa: F401  (registers "capped_snips")

    return "capped_snips"


def test_registry_lists_the_built_in_estimators_and_rejects_duplicates():
    assert {"dm", "ips", "snips", "dr", "iips", "rips", "topk"} <= set(opl_estimators.OPL_ESTIMATORS)
    assert opl_rank.ESTIMATORS is opl_estimators.OPL_ESTIMATORS
    with pytest.raises(ValueError, match="already registered"):
        opl_estimators.register("ips", opl_estimators.Estimator(opl_estimators.snips_terms))
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        opl_estimators.get("nope")
    assert "topk" not in learning_methods() and {"ips", "regression", "rpod"} <= set(learning_methods())


def test_an_outside_estimator_learns_and_evaluates(plugin):
    env = SyntheticRankingEnv.create(make_key(0), n_items=5, ranking_length=3, lam=0.0)
    data = env.sample_logged_data(make_key(1), 3000)
    config = LearnerConfig(plugin, train=TrainConfig(epochs=10, batch_size=256, learning_rate=5e-2))
    policy = fit(data, make_key(2), config)
    v0 = env.logging_policy_value(make_key(3), 20_000)
    value = env.policy_value(policy, make_key(3), 20_000)
    assert value.value > v0.value + 4 * math.hypot(value.stderr, v0.stderr)
    # OPE with the same registry entry: the self-normalised ratio of capped weights.
    got = opl_rank.evaluate(policy, data, make_key(4), estimators=(plugin, "snips"), ci="normal")
    log_w = np.asarray(policy.log_prob(data.context, data.ranking) - data.log_pi0_prefix[:, -1], np.float64)
    w = np.minimum(np.exp(log_w), 20.0)
    big_r = np.asarray(data.reward @ data.position_weight, np.float64)
    assert got[plugin].value == pytest.approx(np.sum(w * big_r) / np.sum(w), rel=1e-4)
    assert 0 < got[plugin].ess <= data.n_rounds and got[plugin].max_weight <= 20.0 + 1e-3
    assert got[plugin].ci_low < got[plugin].value < got[plugin].ci_high


@pytest.mark.extended
def test_an_outside_estimator_runs_in_a_sweep(plugin, tmp_path):
    from experiments.cli import main

    out = tmp_path / "sweep"
    args = [
        "sweep",
        "--config",
        "experiments/configs/synthetic_opl_small.yaml",
        "--set",
        "plugins=tests.plugins.clipped_snips",
        "--set",
        f"methods=ips,{plugin}",
        "--set",
        "n_items=5",
        "--set",
        "ranking_length=3",
        "--set",
        "lam=0.0",
        "--set",
        "n=500",
        "--set",
        "seeds=0",
        "--set",
        "eval_contexts=2000",
        "--set",
        "policy_epochs=3",
        "--set",
        "ks=0,1",
        "--set",
        f"output_dir={out}",
    ]
    assert main(args) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["ips", plugin] and np.isfinite(float(rows[1]["V"]))
    assert rows[1]["reward_model"] == "-"


@pytest.mark.extended
def test_an_outside_environment_is_swept(tmp_path):
    """A simulator written outside the package, registered by a plugin module, runs in a sweep."""
    from experiments.cli import main
    from simulators import environments

    out = tmp_path / "toy"
    args = [
        "sweep",
        "--config",
        "experiments/configs/synthetic_opl_small.yaml",
        "--set",
        "plugins=tests.plugins.toy_environment",
        "--set",
        "simulator=toy",
        "--set",
        "logging_policy=uniform",
        "--set",
        "methods=ips,regression",
        "--set",
        "reward_models=additive",
        "--set",
        "n_items=4",
        "--set",
        "ranking_length=2",
        "--set",
        "lam=0.0",
        "--set",
        "n=400",
        "--set",
        "seeds=0",
        "--set",
        "eval_contexts=2000",
        "--set",
        "policy_epochs=3",
        "--set",
        "ks=0,1",
        "--set",
        "reward_epochs=30",
        "--set",
        f"output_dir={out}",
    ]
    assert main(args) == 0
    assert isinstance(
        environments.create(
            "toy", make_key(0), n_items=4, ranking_length=2, lam=0.0, tau=1.0, logging_policy="uniform"
        ),
        environments.Environment,
    )
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["ips", "regression"] and {r["simulator"] for r in rows} == {"toy"}
    for r in rows:
        assert float(r["V0"]) < float(r["V_star"]) and float(r["V"]) <= float(r["V_star"]) + 4 * float(r["V_se"])
    assert float(rows[1]["normalized_gain"]) > 0.1  # the regression argmax learns (30 steps only)
    assert main(["report", str(out)]) == 0  # the report reads any environment's table


def test_click_rewards_have_a_best_ranking_in_the_synthetic_environment():
    """The best ranking is the reward model's job: a ClickRewards gets V* exactly."""
    import dataclasses

    from simulators import SyntheticRankingEnv
    from simulators.clicks import ClickModel, ClickRewards

    env = SyntheticRankingEnv.create(make_key(0), n_items=5, ranking_length=3, lam=0.5)
    clicks = dataclasses.replace(env, reward_model=ClickRewards(env.reward_model, ClickModel("independent", 3)))
    v_star, method = clicks.optimal_value(make_key(1), 2000)
    v0 = clicks.logging_policy_value(make_key(1), 2000)
    assert method == "exact" and v_star.value > v0.value
    x = clicks.sample_contexts(make_key(2), 8)
    best, _ = clicks.best_rankings(x)
    value = lambda a: clicks.expected_reward(x, a) @ clicks.position_weight
    from opl_rank.pl import plackett_luce as pl

    for a in pl.all_rankings(5, 3)[::7]:  # no ranking beats the chosen one in any context
        assert np.all(np.asarray(value(best)) >= np.asarray(value(np.broadcast_to(a, (8, 3)))) - 1e-6)


@pytest.fixture(scope="module")
def slot_plugin():
    import tests.plugins.cascade_dm  # noqa: F401  (registers "cascade_dm": a per-slot estimator with its own inputs)

    return "cascade_dm"


def test_a_per_slot_estimator_with_its_own_inputs_learns_and_evaluates(slot_plugin):
    """The plugin's hook builds the target's choice distribution [n, L, D] and f_hat's item
    values [n, D]; fit and ope.evaluate call it with no edit to the package."""
    from opl_rank.opl.reward_models import fit_reward_model

    env = SyntheticRankingEnv.create(make_key(0), n_items=5, ranking_length=3, lam=0.0)
    data = env.sample_logged_data(make_key(1), 3000)
    train = TrainConfig(epochs=10, batch_size=256, learning_rate=5e-2)
    policy = fit(data, make_key(2), LearnerConfig(slot_plugin, train=train, reward_train=train))
    v0 = env.logging_policy_value(make_key(3), 20_000)
    value = env.policy_value(policy, make_key(3), 20_000)
    assert value.value > v0.value + 4 * math.hypot(value.stderr, v0.stderr)
    f_hat = fit_reward_model(data, make_key(5), kind="additive", config=train)
    got = opl_rank.evaluate(
        policy, data, make_key(4), estimators=(slot_plugin, "dm"), reward_model=f_hat, ci="normal", n_samples=512
    )
    # Both estimate E_{a ~ pi}[f_hat(x, a)]: the plugin slot by slot along the logged prefixes.
    assert got[slot_plugin].value == pytest.approx(got["dm"].value, abs=4 * got[slot_plugin].stderr + 0.02)


@pytest.mark.extended
def test_a_per_slot_estimator_runs_in_a_sweep(slot_plugin, tmp_path):
    from experiments.cli import main

    out = tmp_path / "sweep"
    sets = {
        "plugins": "tests.plugins.cascade_dm",
        "methods": f"rips,cascade_dr,{slot_plugin}",
        "reward_models": "additive",
        "n_items": "5",
        "ranking_length": "3",
        "lam": "0.0",
        "n": "500",
        "seeds": "0",
        "eval_contexts": "2000",
        "policy_epochs": "3",
        "ks": "0,1",
        "reward_epochs": "3",
        "output_dir": str(out),
    }
    args = ["sweep", "--config", "experiments/configs/synthetic_opl_small.yaml"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["rips", "cascade_dr", slot_plugin]
    assert all(np.isfinite(float(r["V"])) for r in rows)
