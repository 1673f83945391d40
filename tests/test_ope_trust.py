"""OPE results say when they cannot be trusted (opl_rank.opl.ope's module doc): an
importance-weighted estimator with no usable weight mass is not estimable (NaN numbers and a
reason, never ``0 +- 0`` or a bare NaN), a model-based one whose weights carry no correction
is model only, and a bootstrap that cannot form an interval says so. In Python, in the text
table of ``opl-rank evaluate`` and in its JSON."""

import json
import math
import warnings

import jax
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.opl import estimators as oe
from opl_rank.opl import ope
from opl_rank.opl.policies import PLPolicy, RegressionPolicy, greedy_rankings
from opl_rank.opl.reward_models import fit_reward_model
from opl_rank.optimization import TrainConfig
from opl_rank.scorers import ActionScorer
from simulators import SyntheticRankingEnv

D, L, N = 5, 3, 600
IMPORTANCE = ("ips", "snips", "rips", "iips")
ALL = ("dm", "ips", "snips", "dr", "iips", "rips", "topk")


@pytest.fixture(scope="module")
def setting():
    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, lam=0.0, logging_temperature=2.0)
    data = env.sample_logged_data(make_key(1), N, position_marginals="exact")
    model = fit_reward_model(
        data, make_key(2), kind="additive", config=TrainConfig(epochs=2, batch_size=128, learning_rate=3e-2)
    )
    policy = RegressionPolicy(model)  # deterministic: what `fit --k auto` returns when it picks k = 0
    target = np.asarray(greedy_rankings(policy, data.context))
    logged = np.asarray(data.ranking)
    off = np.flatnonzero(np.all(target != logged, axis=1))  # no slot of the logged ranking is the target's
    on = np.flatnonzero(np.all(target == logged, axis=1))  # the logged ranking is the target's
    assert off.size > 200 and on.size >= 4, (off.size, on.size)
    return data, model, policy, off, on


def _evaluate(policy, data, model, estimators, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = ope.evaluate(policy, data, make_key(5), estimators=estimators, reward_model=model, **options)
    return results, [str(w.message) for w in caught if issubclass(w.category, ope.DegenerateWeightsWarning)]


@pytest.mark.parametrize("ci", ["normal", "bootstrap"])
def test_deterministic_target_off_the_logged_support_is_not_estimable(setting, ci):
    data, model, policy, off, _ = setting
    results, caught = _evaluate(policy, data.take(off), model, IMPORTANCE, ci=ci, n_bootstrap=100)
    for name in IMPORTANCE:
        r = results[name]
        assert not r.estimable and not r.model_only and r.caveat is None, r
        assert "no weight mass" in r.reason and "all importance weights are 0" in r.reason, r.reason
        for number in (r.value, r.stderr, r.ci_low, r.ci_high):  # never 0 +- 0: arithmetic carries NaN on
            assert math.isnan(number), r
        assert r.ess == 0.0 and r.max_weight == 0.0 and r.n == off.size
        assert str(r) == f"{name} not estimable: {r.reason}" and "nan" not in str(r)
        assert any(f"estimator {name!r}" in m and "not estimable" in m for m in caught), caught
    assert math.isnan(results["ips"].value + 1.0)


def test_model_based_estimates_off_the_support_are_model_only(setting):
    data, model, policy, off, _ = setting
    results, caught = _evaluate(policy, data.take(off), model, ("dm", "dr", "topk"), k=1, ci="normal", n_samples=8)
    for name in ("dm", "dr", "topk"):
        r = results[name]
        assert r.estimable and r.model_only and r.reason is None, r
        assert "model only" in r.caveat and "excludes the reward model's bias" in r.caveat, r.caveat
        assert r.ci_low < r.value < r.ci_high and "model only" in str(r)
    for name in ("dr", "topk"):  # their correction has no weight mass: they are dm
        assert "no weight mass" in results[name].caveat
        assert results[name].value == pytest.approx(results["dm"].value, abs=1e-5)
        assert any(f"estimator {name!r}" in m and "reward model alone" in m for m in caught), caught
    topk0, _ = _evaluate(policy, data.take(off), model, ("topk",), k=0, ci="normal", n_samples=8)
    assert topk0["topk"].model_only and topk0["topk"].ess == off.size and "k=0" in topk0["topk"].caveat


def test_deterministic_target_on_the_support_for_some_rows_is_estimable(setting):
    data, model, policy, off, on = setting
    sub = data.take(np.concatenate([off[:300], on]))
    results, _ = _evaluate(policy, sub, model, ("ips", "snips", "rips", "dr"), ci="normal", n_samples=8)
    for name in ("ips", "snips", "rips", "dr"):
        r = results[name]
        assert r.estimable and r.reason is None and not r.model_only, r
        assert math.isfinite(r.value) and r.ci_low < r.value < r.ci_high
        assert r.ess >= ope.MIN_ESS
    # the ips formula: mean over rounds of w R, w = 1 / pi_0 on the matching rows, 0 elsewhere
    match = np.all(np.asarray(sub.ranking) == np.asarray(greedy_rankings(policy, sub.context)), axis=1)
    w = np.where(match, np.exp(-np.asarray(sub.log_pi0_prefix[:, -1], np.float64)), 0.0)
    reward = np.asarray(sub.reward, np.float64) @ np.asarray(sub.position_weight, np.float64)
    assert results["ips"].value == pytest.approx(np.mean(w * reward), rel=1e-5)
    assert results["snips"].value == pytest.approx(np.sum(w * reward) / np.sum(w), rel=1e-5)
    assert results["ips"].ess == pytest.approx(np.sum(w) ** 2 / np.sum(w * w), rel=1e-6)


def test_one_round_carrying_all_the_weight_is_not_estimable(setting):
    data, model, policy, off, on = setting
    sub = data.take(np.concatenate([off[:300], on[:1]]))
    results, _ = _evaluate(policy, sub, model, ("ips", "snips", "dr"), ci="normal", n_samples=8)
    for name in ("ips", "snips"):
        r = results[name]
        assert not r.estimable and math.isnan(r.value) and r.ess == pytest.approx(1.0)
        assert r.reason.startswith("effective sample size 1.000 of 301 (< 1.5)"), r.reason
    assert (
        results["dr"].estimable and results["dr"].model_only and "effective sample size 1.000" in results["dr"].caveat
    )


def test_bootstrap_that_cannot_form_an_interval_says_so(setting):
    data, model, policy, off, on = setting
    sub = data.take(np.concatenate([off[:300], on[:2]]))  # a resample misses both rows w.p. ~e^-2: 0 / 0
    results, _ = _evaluate(policy, sub, model, ("ips", "snips"), ci="bootstrap", n_bootstrap=200)
    snips, ips = results["snips"], results["ips"]
    assert snips.estimable and snips.ci_method == "normal" and "resamples had no weight mass" in snips.caveat
    assert all(math.isfinite(v) for v in (snips.value, snips.ci_low, snips.ci_high))
    assert ips.estimable and ips.ci_method == "bootstrap" and "bootstrap" not in (ips.caveat or "")
    assert math.isfinite(ips.ci_low) and math.isfinite(ips.ci_high)


def test_stochastic_target_keeps_its_numbers(setting):
    """A PL target with healthy weights: the estimator formulas, no verdict, no warning."""
    data, _, _, _, _ = setting
    module = ActionScorer(n_items=D)
    policy = PLPolicy(module, jax.tree.map(lambda p: 0.5 * p, module.init(make_key(3), data.context[:1])), L)
    normal, caught = _evaluate(policy, data, None, IMPORTANCE, ci="normal")
    boot, _ = _evaluate(policy, data, None, IMPORTANCE, ci="bootstrap", n_bootstrap=200)
    assert caught == []
    k_prop, _, k_boot = jax.random.split(make_key(5), 3)
    target = policy.propensities(data, k_prop, slot_marginals=True)
    z = 1.959963984540054
    for i, name in enumerate(IMPORTANCE):
        r, b = normal[name], boot[name]
        assert r.estimable and not r.model_only and r.reason is None and r.caveat is None, r
        terms = oe.get(name).terms(target, data)
        num = np.asarray(terms.value, np.float64)
        if terms.normalizer is None:
            value, se = num.mean(), num.std(ddof=1) / math.sqrt(N)
            den = None
        else:
            den = np.asarray(terms.normalizer, np.float64)
            value = num.sum() / den.sum()
            se = (num - value * den).std(ddof=1) / (math.sqrt(N) * den.mean())
        assert r.value == pytest.approx(value, rel=1e-4) and r.stderr == pytest.approx(se, rel=1e-3)
        assert r.ci_low == pytest.approx(r.value - z * r.stderr) and r.ci_high == pytest.approx(r.value + z * r.stderr)
        draws = ope._bootstrap(
            terms.value, terms.normalizer, jax.random.fold_in(k_boot, i), 200
        )  # the percentile interval of the same resamples
        low, high = np.quantile(np.asarray(draws), [0.025, 0.975])
        assert b.ci_method == "bootstrap" and b.value == r.value and b.caveat is None
        assert b.ci_low == pytest.approx(low, rel=1e-4, abs=1e-5) and b.ci_high == pytest.approx(high, rel=1e-4)


def test_select_k_never_picks_a_candidate_that_is_not_estimable(setting, monkeypatch):
    from opl_rank.opl import select_k as sk
    from opl_rank.opl.learners import LearnerConfig

    data, *_ = setting
    verdicts = {0: None, 1: 2.5}  # k=0 not estimable (NaN), k=1 estimable

    def fake_evaluate(policy, holdout, key, *, estimators, **options):
        value = verdicts[policy]
        name = estimators[0]
        if value is None:
            return {
                name: ope.OPEResult(name, math.nan, math.nan, math.nan, math.nan, "normal", 10, 0.0, 0.0, False, "x")
            }
        return {name: ope.OPEResult(name, value, 0.1, value - 0.2, value + 0.2, "normal", 10, 10.0, 1.0)}

    monkeypatch.setattr(sk, "fit_reward", lambda train, key, config: None)  # the shared f_hat: not needed here
    monkeypatch.setattr(sk, "fit", lambda train, key, config, reward_params=None: config.k)
    monkeypatch.setattr(ope, "evaluate", fake_evaluate)
    config = LearnerConfig("rpod", k=0)
    chosen = sk.select_k(data, make_key(0), config, ks=(0, 1), estimator="ips")
    assert chosen.k == 1 and [row["estimable"] for row in chosen.table] == [False, True]
    verdicts[1] = None
    with pytest.raises(ValueError, match="'ips' cannot estimate any candidate's value.*k=0: x; k=1: x"):
        sk.select_k(data, make_key(0), config, ks=(0, 1), estimator="ips")


@pytest.mark.slow
def test_evaluate_command_reports_not_estimable_and_model_only(setting, tmp_path, capsys):
    from experiments.byo_logs import format_evaluation
    from experiments.cli import main
    from opl_rank.io.persistence import save_policy

    data, _, policy, off, _ = setting
    save_policy(policy, tmp_path / "policy")
    data.take(off).to_parquet(tmp_path / "logs.parquet")
    args = ["evaluate", "--policy", str(tmp_path / "policy"), "--data", str(tmp_path / "logs.parquet")]
    assert main([*args, "--n-samples", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    estimates = report["estimates"]
    assert list(estimates) == list(ALL)
    for name in IMPORTANCE:
        e = estimates[name]
        assert e["estimable"] is False and "no weight mass" in e["reason"], e
        assert e["value"] is None and e["stderr"] is None and e["ci_low"] is None and e["ci_high"] is None
    for name in ("dm", "dr", "topk"):  # topk at the policy's k = 0
        e = estimates[name]
        assert e["estimable"] is True and e["model_only"] is True and e["reason"] is None, e
        assert e["ci_low"] <= e["value"] <= e["ci_high"] and "excludes the reward model's bias" in e["caveat"]
    table = format_evaluation(report)
    lines = {line.split()[0]: line for line in table.splitlines() if line.split() and line.split()[0] in ALL}
    for name in IMPORTANCE:
        assert lines[name].split(None, 1)[1] == f"not estimable: {estimates[name]['reason']}", table  # no numbers
    for name in ("dm", "dr", "topk"):
        assert "model only (" in lines[name], table
    assert "(3) topk: model only: k=0" in table and "warning:" not in table, table
    assert main([*args, "--n-samples", "8"]) == 0  # the printed table is format_evaluation's
    assert capsys.readouterr().out.strip() == table
