"""Adaptive IPS against exact enumeration, IIPS / RIPS / IPS, and its own sampled estimates.

AIPS is linear in the rewards, so its expectation over the logs is exact without sampling:
the logged rows are all D!/(D-L)! rankings with their expected rewards, weighted by the
logging policy's probabilities.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import LoggedData, make_key
from opl_rank.opl import aips, ope
from opl_rank.opl import estimators as oe
from opl_rank.opl.estimator_inputs import InputRequest
from opl_rank.opl.policies import PLPolicy
from opl_rank.pl import plackett_luce as pl
from tests.reference import ConstantLogits, enumerated_logs

D, L = 5, 4
RANKINGS = jnp.asarray(pl.all_rankings(D, L))  # [120, L]
ALPHA = jnp.array([1.0, 0.7, 0.5, 0.3])
BUILT_IN = ("independent", "cascade", "standard", "neighbour-1", "top-1", "top-2")


_SCORER = ConstantLogits()


@functools.cache
def _logits():
    theta0 = jax.random.normal(make_key(1), (D,)) * 0.6  # logging
    theta = jax.random.normal(make_key(2), (D,)) * 1.1  # target
    return theta0, theta


def _set_probs_brute(logits, ranking, c):
    """P(a'_t = a_t for t in S_l) by summing over all rankings: [n, L] (float64)."""
    probs = np.exp(
        np.asarray(
            pl.prefix_log_probs(logits[:, None, :], jnp.broadcast_to(RANKINGS, (logits.shape[0],) + RANKINGS.shape))[
                ..., -1
            ],
            np.float64,
        )
    )
    perms, ranking = np.asarray(RANKINGS), np.asarray(ranking)
    c = np.broadcast_to(c, (ranking.shape[0], L, L))
    out = np.zeros(ranking.shape)
    for i in range(ranking.shape[0]):
        for l in range(L):
            slots = np.flatnonzero(c[i, l])
            match = np.all(perms[:, slots] == ranking[i, slots], axis=1)
            out[i, l] = probs[i][match].sum()
    return out


def _neighbour_rewards(rankings):
    """E[r_l | a] reading the items at slots l-1, l, l+1 (the neighbour-1 behaviour): [P, L]."""
    rel = jnp.linspace(0.1, 0.9, D)[rankings]
    pad = jnp.zeros_like(rel[:, :1])
    above = jnp.concatenate([pad, rel[:, :-1]], axis=1)
    below = jnp.concatenate([rel[:, 1:], pad], axis=1)
    return rel * (1.0 - 0.6 * above) + 0.5 * below * rel


def _all_rows(reward_fn, theta0, *, logits=True, marginals=True):
    logits0 = jnp.broadcast_to(theta0, (RANKINGS.shape[0], D))
    marginal = _set_probs_brute(logits0, RANKINGS, np.eye(L, dtype=bool))
    return enumerated_logs(
        RANKINGS,
        reward_fn,
        theta0,
        ALPHA,
        log_pi0_position_marginal=jnp.log(jnp.asarray(marginal, jnp.float32)) if marginals else None,
        logging_logits=logits0 if logits else None,
    )


def _aips_values(theta, data, behaviour, **options):
    request = InputRequest(PLPolicy(_SCORER, theta, L), data, make_key(7), given={"behaviour": behaviour, **options})
    return aips.aips_terms(None, data, inputs=aips.aips_inputs(request))


def _pi0(theta0):
    return np.exp(
        np.asarray(pl.prefix_log_probs(jnp.broadcast_to(theta0, (RANKINGS.shape[0], D)), RANKINGS)[:, -1], np.float64)
    )


# ---------------------------------------------------------------------------------------
# Behaviours
# ---------------------------------------------------------------------------------------
def test_behaviour_matrices():
    assert aips.behaviour_matrix("independent", 3).astype(int).tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert aips.behaviour_matrix("cascade", 3).astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert aips.behaviour_matrix("standard", 2).all() and aips.behaviour_matrix("symmetric", 2).all()
    assert aips.behaviour_matrix("top-1", 3).astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    assert (aips.behaviour_matrix("neighbour", 4) == aips.behaviour_matrix("neighbour-1", 4)).all()
    assert aips.behaviour_matrix("neighbour-2", 4).astype(int)[0].tolist() == [1, 1, 1, 0]


@pytest.mark.parametrize(
    "behaviour, match",
    [
        ("nope", "behaviour must be one of"),
        ("top", "behaviour must be one of"),
        (np.ones((3, 3)), r"behaviour must be \[L, L\]"),
        (np.zeros((L, L)), "unit diagonal"),
        (np.full((L, L), 2), "0/1"),
        (np.ones((7, L, L)), "rows"),
    ],
)
def test_bad_behaviours_name_the_argument(behaviour, match):
    with pytest.raises(ValueError, match=match):
        aips.check_behaviour(behaviour, L, 5)


# ---------------------------------------------------------------------------------------
# Set probabilities
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BUILT_IN)
def test_set_probabilities_exact_and_sampled_against_enumeration(name):
    logits = jax.random.normal(make_key(3), (6, D)) * 1.5
    ranking = pl.sample_rankings(make_key(4), logits, L)
    c = aips.behaviour_matrix(name, L)
    want = _set_probs_brute(logits, ranking, c)
    exact = np.exp(np.asarray(aips.set_log_probs(logits, ranking, c, method="exact"), np.float64))
    np.testing.assert_allclose(exact, want, rtol=2e-5, atol=1e-7)
    sampled = np.exp(
        np.asarray(
            aips.set_log_probs(logits, ranking, c, method="sampled", key=make_key(5), n_samples=20000), np.float64
        )
    )
    np.testing.assert_allclose(sampled, want, rtol=0.03, atol=2e-3)


def test_per_row_behaviours_and_gradients():
    """A different random behaviour per row; exact gradients equal the enumeration's, and the
    sampled (magic-box) gradient is unbiased."""
    logits = jax.random.normal(make_key(8), (5, D))
    ranking = pl.sample_rankings(make_key(9), logits, L)
    c = np.asarray(jax.random.bernoulli(make_key(10), 0.4, (5, L, L))) | np.eye(L, dtype=bool)[None]
    want = _set_probs_brute(logits, ranking, c)
    got = np.exp(np.asarray(aips.set_log_probs(logits, ranking, c), np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)

    weights = jnp.linspace(0.5, 1.5, L)[None, :]
    perms = jnp.broadcast_to(RANKINGS, (5,) + RANKINGS.shape)
    slots_match = jnp.all(
        jnp.where(jnp.asarray(c)[:, None], perms[:, :, None, :] == ranking[:, None, None, :], True), -1
    )

    def brute(z):  # sum_l weight_l P(S_l) from the PL probabilities of all rankings
        probs = jnp.exp(pl.prefix_log_probs(z[:, None, :], perms)[..., -1])  # [n, P]
        return jnp.sum(jnp.sum(probs[:, :, None] * slots_match.astype(jnp.float32), axis=1) * weights)

    def exact(z):
        return jnp.sum(jnp.exp(aips.set_log_probs(z, ranking, c, method="exact")) * weights)

    def sampled(z, key):
        return jnp.sum(jnp.exp(aips.set_log_probs(z, ranking, c, method="sampled", key=key, n_samples=4000)) * weights)

    g_true = jax.jit(jax.grad(brute))(logits)
    np.testing.assert_allclose(jax.jit(jax.grad(exact))(logits), g_true, rtol=1e-4, atol=1e-6)
    # one compiled program for the 8 keys (op by op, each draw re-dispatched every primitive)
    grads = jax.jit(jax.vmap(jax.grad(sampled), in_axes=(None, 0)))(logits, jax.random.split(make_key(11), 8))
    mean, se = jnp.mean(grads, 0), jnp.std(grads, 0, ddof=1) / np.sqrt(8)
    assert bool(jnp.all(jnp.abs(mean - g_true) <= 5 * se + 2e-3)), (mean, g_true)


def test_no_nan_at_large_logit_scales():
    logits = jax.random.normal(make_key(12), (4, D)) * 80.0
    ranking = pl.sample_rankings(make_key(13), -logits, L)  # unlikely rankings: underflowing probabilities
    c = aips.behaviour_matrix("neighbour-1", L)
    for method in ("exact", "sampled"):
        f = lambda z: jnp.sum(jnp.maximum(aips.set_log_probs(z, ranking, c, method=method, key=make_key(14)), -1e4))
        assert not bool(jnp.any(jnp.isnan(aips.set_log_probs(logits, ranking, c, method=method, key=make_key(14)))))
        assert bool(jnp.all(jnp.isfinite(jax.jit(jax.grad(f))(logits))))  # one program, not op by op


# ---------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("behaviour, other", [("independent", "iips"), ("cascade", "rips"), ("standard", "ips")])
def test_built_in_behaviours_are_iips_rips_ips(behaviour, other):
    theta0, theta = _logits()
    data = _all_rows(_neighbour_rewards, theta0)

    def value(th, name):
        policy = PLPolicy(_SCORER, th, L)
        if name == "aips":
            return oe.estimate(_aips_values(th, data, behaviour))
        target = policy.propensities(data, slot_marginals=name == "iips")
        return oe.estimate(oe.get(name).terms(target, data))

    np.testing.assert_allclose(value(theta, "aips"), value(theta, other), rtol=2e-6)
    np.testing.assert_allclose(jax.grad(value)(theta, "aips"), jax.grad(value)(theta, other), rtol=2e-5, atol=1e-7)


def _expectation_and_truth(reward_fn, behaviour):
    theta0, theta = _logits()
    data = _all_rows(reward_fn, theta0)
    per_round = np.asarray(_aips_values(theta, data, behaviour).value, np.float64)
    expected = float(np.sum(_pi0(theta0) * per_round))
    truth = float(np.sum(_pi0(theta) * (np.asarray(reward_fn(RANKINGS), np.float64) @ np.asarray(ALPHA, np.float64))))
    variance = float(np.sum(_pi0(theta0) * per_round**2) - expected**2)
    return expected, truth, variance


def test_unbiased_under_a_matching_non_prefix_behaviour():
    """Neighbour rewards: AIPS(neighbour-1) and AIPS(standard) = IPS are unbiased, exactly;
    cascade (RIPS) and independent (IIPS) are biased; neighbour-1's variance is below IPS's."""
    expected, truth, var_neighbour = _expectation_and_truth(_neighbour_rewards, "neighbour-1")
    np.testing.assert_allclose(expected, truth, rtol=1e-5)
    expected_ips, _, var_ips = _expectation_and_truth(_neighbour_rewards, "standard")
    np.testing.assert_allclose(expected_ips, truth, rtol=1e-5)
    assert var_neighbour < 0.8 * var_ips, (var_neighbour, var_ips)
    for biased in ("cascade", "independent"):
        assert abs(_expectation_and_truth(_neighbour_rewards, biased)[0] - truth) > 0.01


def test_unbiased_with_a_per_context_behaviour():
    """Rows whose rewards follow different behaviours (context 0: independent, context 1:
    neighbour-1): AIPS with that per-context matrix, given as a function of the context."""
    theta0, theta = _logits()
    rows = []
    for flag, reward_fn in ((0.0, lambda r: jnp.linspace(0.1, 0.9, D)[r]), (1.0, _neighbour_rewards)):
        data = _all_rows(reward_fn, theta0)
        rows.append(data.replace(context=jnp.full((RANKINGS.shape[0], 1), flag)))
    data = LoggedData(
        **{name: jnp.concatenate([getattr(r, name) for r in rows]) for name in rows[0].row_fields()},
        position_weight=ALPHA,
        n_items=D,
    )
    independent, neighbour = (jnp.asarray(aips.behaviour_matrix(b, L)) for b in ("independent", "neighbour-1"))

    def behaviour(context):
        return jnp.where(context[:, :1, None] > 0.5, neighbour[None], independent[None])

    per_round = np.asarray(_aips_values(theta, data, behaviour).value, np.float64)
    P = RANKINGS.shape[0]
    expected = sum(float(np.sum(_pi0(theta0) * per_round[i * P : (i + 1) * P])) for i in range(2))
    truth = sum(
        float(np.sum(_pi0(theta) * (np.asarray(r.reward, np.float64) @ np.asarray(ALPHA, np.float64)))) for r in rows
    )
    np.testing.assert_allclose(expected, truth, rtol=1e-5)


def test_ope_evaluate_with_aips_and_its_inputs():
    theta0, theta = _logits()
    data = _all_rows(_neighbour_rewards, theta0)
    policy = PLPolicy(_SCORER, theta, L)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = ope.evaluate(
            policy, data, make_key(20), estimators=("aips", "rips"), inputs={"aips": {"behaviour": "cascade"}}
        )
    np.testing.assert_allclose(float(result["aips"].value), float(result["rips"].value), rtol=1e-5)
    given = aips.aips_inputs(InputRequest(policy, data, make_key(1), given={"behaviour": "neighbour-1"}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = ope.evaluate(
            policy,
            data,
            make_key(20),
            estimators=("aips",),
            inputs={"aips": {"log_target": given.log_target, "log_logging": given.log_logging}},
        )
    np.testing.assert_allclose(
        float(again["aips"].value), float(np.mean(_aips_values(theta, data, "neighbour-1").value)), rtol=1e-5
    )


def test_deterministic_target_uses_indicators():
    theta0, _ = _logits()
    data = _all_rows(_neighbour_rewards, theta0)

    class _Fixed:
        deterministic = True
        n_slots = L

        def sample(self, key, context, *, where=None):
            return jnp.broadcast_to(RANKINGS[17], (context.shape[0], L))

    inputs = aips.aips_inputs(InputRequest(_Fixed(), data, make_key(1), given={"behaviour": "neighbour-1"}))
    c = aips.behaviour_matrix("neighbour-1", L)
    agree = np.asarray(RANKINGS) == np.asarray(RANKINGS[17])
    want = np.array([[agree[i, c[l]].all() for l in range(L)] for i in range(RANKINGS.shape[0])])
    np.testing.assert_array_equal(np.isfinite(np.asarray(inputs.log_target)), want)


def test_what_the_logs_must_carry():
    theta0, theta = _logits()
    policy = PLPolicy(_SCORER, theta, L)
    no_logits = _all_rows(_neighbour_rewards, theta0, logits=False)
    with pytest.raises(ValueError, match="logging_logits"):
        aips.aips_inputs(InputRequest(policy, no_logits, make_key(1), given={"behaviour": "neighbour-1"}))
    aips.aips_inputs(InputRequest(policy, no_logits, make_key(1), given={"behaviour": "cascade"}))  # prefixes: fine
    bare = _all_rows(_neighbour_rewards, theta0, logits=False, marginals=False)
    with pytest.raises(ValueError, match="log_pi0_position_marginal"):
        aips.aips_inputs(InputRequest(policy, bare, make_key(1), given={"behaviour": "independent"}))
    with pytest.raises(ValueError, match="keys among"):
        aips.aips_inputs(InputRequest(policy, bare, make_key(1), given={"behavior": "cascade"}))
    with pytest.raises(ValueError, match=r"log_target must have shape \[n, L\]"):
        aips.aips_inputs(InputRequest(policy, bare, make_key(1), given={"log_target": np.zeros((3, L))}))
    with pytest.raises(ValueError, match="logging_logits"):
        no_logits.replace(logging_logits=jnp.zeros((3, D)))  # validated: [n, D]


def test_sampled_aips_is_close_to_exact_in_ope():
    theta0, theta = _logits()
    data = _all_rows(_neighbour_rewards, theta0)
    exact = float(jnp.mean(_aips_values(theta, data, "neighbour-1", method="exact").value))
    # 250 draws per row and set: within 1e-3 of the enumeration here (2000: 7e-5; 18 s at the
    # test suite's LLVM level 0 against 3 s)
    sampled = float(jnp.mean(_aips_values(theta, data, "neighbour-1", method="sampled", n_samples=250).value))
    np.testing.assert_allclose(sampled, exact, rtol=0.01)


# ---------------------------------------------------------------------------------------
# Choosing c
# ---------------------------------------------------------------------------------------
def test_select_behaviour_returns_the_least_estimated_mse():
    from simulators.synthetic import SyntheticRankingEnv

    env = SyntheticRankingEnv.create(make_key(30), n_items=6, ranking_length=3, lam=0.0, reward_structure="independent")
    data = env.sample_logged_data(make_key(31), 3000, position_marginals="exact", logging_logits=True)
    policy = PLPolicy(_SCORER, jnp.asarray(env.logging_logits(data.context[:1])[0] * 1.3), 3)
    choice = aips.select_behaviour(policy, data, make_key(32), split_quantiles=())
    assert choice.behaviour == min(choice.mse, key=choice.mse.get)
    assert choice.behaviour == "independent"  # independent rewards: the smallest sets win
    assert choice.matrix.shape == (3, 3) and choice.split is None


# ---------------------------------------------------------------------------------------
# As a learner
# ---------------------------------------------------------------------------------------
@pytest.mark.extended
@pytest.mark.slow
def test_aips_learner_beats_logging():
    from opl_rank.opl.learners import LearnerConfig, fit
    from simulators.synthetic import SyntheticRankingEnv

    env = SyntheticRankingEnv.create(make_key(40), n_items=8, ranking_length=4, lam=0.5, reward_structure="neighbour")
    data = env.sample_logged_data(make_key(41), 2000, position_marginals="exact", logging_logits=True)
    config = LearnerConfig("aips", estimator_options={"behaviour": "neighbour-1"})
    assert config.estimator_options == (("behaviour", "neighbour-1"),)
    policy = fit(data, make_key(42), config)
    v0 = env.logging_policy_value(make_key(43), 20_000).value
    value = env.policy_value(policy, make_key(43), 20_000).value
    assert value > v0 + 0.3, (value, v0)


@pytest.mark.extended
def test_a_sweep_runs_aips_with_its_estimator_options(tmp_path):
    """estimator_options reach LearnerConfig in a sweep; non-prefix behaviours get the logging
    logits they need; a config without the key keeps its resolved form (and hash)."""
    import csv

    import yaml

    from experiments.cli import main
    from experiments.sweep_config import load_sweep, resolved_config

    out = tmp_path / "sweep"
    config = yaml.safe_load(open("experiments/configs/synthetic_opl_small.yaml"))
    config.update(
        methods=["rips", "aips"],
        estimator_options={"aips": {"behaviour": "neighbour-1"}},
        n_items=[5],
        ranking_length=[3],
        lam=[0.0],
        n=[400],
        seeds=[0],
        eval_contexts=2000,
        policy_epochs=2,
        output_dir=str(out),
        reward_models=["additive"],
        ks=[0, 1],
    )
    path = tmp_path / "aips.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["sweep", "--config", str(path), "--quiet"]) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["rips", "aips"] and np.isfinite(float(rows[1]["V"]))
    sweep = load_sweep(str(path), {})
    assert resolved_config(sweep)["estimator_options"] == {"aips": {"behaviour": "neighbour-1"}}
    assert "estimator_options" not in resolved_config(load_sweep("experiments/configs/synthetic_opl_small.yaml", {}))
    config["estimator_options"] = {"dr": {"behaviour": "cascade"}}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="estimator_options.dr"):
        load_sweep(str(path), {})


def test_cascade_needs_only_the_prefix_propensities():
    """The default behaviour (cascade) runs on logs with neither marginals nor logits -- the
    simulators' default -- and is RIPS there; L = 1 needs nothing more either."""
    theta0, theta = _logits()
    bare = _all_rows(_neighbour_rewards, theta0, logits=False, marginals=False)
    policy = PLPolicy(_SCORER, theta, L)
    got = aips.aips_inputs(InputRequest(policy, bare, make_key(1)))  # default behaviour
    np.testing.assert_allclose(got.log_target, policy.propensities(bare).log_prefix, rtol=1e-6)
    np.testing.assert_allclose(got.log_logging, bare.log_pi0_prefix, rtol=1e-6)
    one = bare.replace(
        ranking=bare.ranking[:, :1],
        reward=bare.reward[:, :1],
        log_pi0_prefix=bare.log_pi0_prefix[:, :1],
        position_weight=ALPHA[:1],
    )
    for name in ("independent", "standard"):
        value = aips.aips_inputs(InputRequest(PLPolicy(_SCORER, theta, 1), one, make_key(1), given={"behaviour": name}))
        np.testing.assert_allclose(value.log_logging, one.log_pi0_prefix, rtol=1e-6)


@pytest.mark.parametrize(
    "options, match",
    [({"n_samples": 0}, "n_samples must be a positive int"), ({"method": "fast"}, "method must be one of")],
)
def test_bad_options_name_the_option(options, match):
    theta0, theta = _logits()
    data = _all_rows(_neighbour_rewards, theta0)
    with pytest.raises(ValueError, match=match):
        aips.aips_inputs(InputRequest(PLPolicy(_SCORER, theta, L), data, make_key(1), given=options))
