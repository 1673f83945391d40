"""Cascade-DR against exact enumeration, RIPS, and obp's SlateCascadeDoublyRobust.

The estimator is linear in the rewards, so its expectation over the logs is exact without
sampling: the logged rows are all D!/(D-L)! rankings with their expected rewards, weighted
by the logging policy's probabilities. That gives the exact bias (0 under cascade rewards
for any Q, the predicted RIPS-like bias otherwise), the exact variance over rankings, and
the exact expected gradient.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import LoggedData, make_key
from opl_rank.opl import cascade_dr as cdr
from opl_rank.opl import estimators as oe
from opl_rank.opl import ope
from opl_rank.opl.policies import PLPolicy
from opl_rank.pl import plackett_luce as pl
from tests.reference import ConstantLogits, enumerated_logs

D, L = 5, 3
RANKINGS = jnp.asarray(pl.all_rankings(D, L))  # [60, L]
ALPHA = jnp.array([1.0, 0.7, 0.4])
REL = jnp.array([0.9, 0.2, 0.6, 0.35, 0.1])


def _cascade_rewards(rankings):
    """E[r_l | a]: a cascade click model (slot l depends on a_{1:l} only): [P, L]."""
    rel = REL[rankings]
    survive = jnp.cumprod(1.0 - rel, axis=-1)
    return rel * jnp.concatenate([jnp.ones_like(rel[:, :1]), survive[:, :-1]], axis=-1)


def _below_rewards(rankings):
    """E[r_l | a] that reads the item below slot l too (not cascade): [P, L]."""
    rel = REL[rankings]
    below = jnp.concatenate([rel[:, 1:], jnp.zeros_like(rel[:, :1])], axis=-1)
    return rel + 0.8 * below


@functools.cache
def _logits():
    theta0 = jax.random.normal(make_key(1), (D,)) * 0.5  # logging
    theta = jax.random.normal(make_key(2), (D,)) * 1.2  # target
    return theta0, theta


def _all_rows(reward_fn, theta0):
    return enumerated_logs(RANKINGS, reward_fn, theta0, ALPHA)


def _target(theta, data):
    logits = jnp.broadcast_to(theta, (data.ranking.shape[0], D))
    return (
        oe.Propensities(pl.prefix_log_probs(logits, data.ranking)),
        jnp.exp(pl.placement_log_probs(logits, data.ranking)),
    )


def _arbitrary_q(rankings):
    """Any function of (slot, ordered prefix, item): [P, L, D]."""
    slot = jnp.arange(L, dtype=jnp.float32)[None, :, None]
    item = jnp.arange(D, dtype=jnp.float32)[None, None, :]
    codes = jnp.cumsum(jnp.concatenate([jnp.zeros_like(rankings[:, :1]), rankings[:, :-1] * 3 + 1], axis=1), axis=1)
    return jnp.sin(1.3 * item + 0.7 * slot + 2.1 * codes[:, :, None].astype(jnp.float32)) * 0.5


def _true_q(theta, reward_fn):
    """The exact Q_l(a_{1:l-1}, d) under the target, by enumeration: [P, L, D]."""
    probs = np.exp(np.asarray(pl.prefix_log_probs(jnp.broadcast_to(theta, RANKINGS.shape[:1] + (D,)), RANKINGS)))
    togo = np.cumsum(np.asarray(reward_fn(RANKINGS) * ALPHA[None, :])[:, ::-1], axis=1)[:, ::-1]  # [P, L]
    ranks = np.asarray(RANKINGS)
    q = np.zeros((len(ranks), L, D))
    for i, a in enumerate(ranks):
        for slot in range(L):
            for d in range(D):
                if d in a[:slot]:
                    continue
                rows = [j for j, b in enumerate(ranks) if tuple(b[:slot]) == tuple(a[:slot]) and b[slot] == d]
                p = probs[rows, -1] / probs[rows, slot]  # pi(b_{l+1:L} | b_{1:l})
                q[i, slot, d] = float(np.sum(p * togo[rows, slot]))
    return jnp.asarray(q, jnp.float32)


def _exact_value(theta, reward_fn):
    probs = pl.enumerate_ranking_probs(theta, RANKINGS)
    return float(jnp.sum(probs * (reward_fn(RANKINGS) @ ALPHA)))


def _moments(theta, reward_fn, q, name="cascade_dr"):
    theta0, _ = _logits()
    data = _all_rows(reward_fn, theta0)
    target, choice = _target(theta, data)
    if name == "cascade_dr":
        value = cdr.cascade_dr_terms(target, data, inputs=cdr.CascadeInputs(q, choice)).value
    else:
        value = oe.get(name).terms(target, data).value
    p0 = np.exp(np.asarray(data.log_pi0_prefix[:, -1], np.float64))
    value = np.asarray(value, np.float64)
    mean = float(np.sum(p0 * value))
    return mean, float(np.sum(p0 * (value - mean) ** 2))


def test_q_zero_is_rips_exactly_in_value_and_gradient():
    theta0, theta = _logits()
    data = _all_rows(_cascade_rewards, theta0)

    def estimate(th, name):
        target, choice = _target(th, data)
        if name == "rips":
            return oe.rips_terms(target, data).value
        return cdr.cascade_dr_terms(target, data, inputs=cdr.CascadeInputs(jnp.zeros_like(choice), choice)).value

    np.testing.assert_array_equal(np.asarray(estimate(theta, "cdr")), np.asarray(estimate(theta, "rips")))
    grads = [jax.grad(lambda th, n=n: jnp.mean(estimate(th, n)))(theta) for n in ("cdr", "rips")]
    np.testing.assert_array_equal(np.asarray(grads[0]), np.asarray(grads[1]))


@pytest.mark.parametrize("q_name", ["arbitrary", "true"])
def test_unbiased_for_any_q_under_cascade_rewards(q_name):
    _, theta = _logits()
    q = _arbitrary_q(RANKINGS) if q_name == "arbitrary" else _true_q(theta, _cascade_rewards)
    mean, _ = _moments(theta, _cascade_rewards, q)
    assert mean == pytest.approx(_exact_value(theta, _cascade_rewards), rel=1e-5, abs=1e-6)


def test_without_cascade_rewards_the_expectation_is_the_predicted_biased_value():
    """sum_l E_{a_{1:l} ~ pi, a_{l+1:L} ~ pi_0(. | a_{1:l})}[alpha_l r_l]: RIPS's, for any Q."""
    theta0, theta = _logits()
    lp = np.asarray(pl.prefix_log_probs(jnp.broadcast_to(theta, (RANKINGS.shape[0], D)), RANKINGS), np.float64)
    lp0 = np.asarray(pl.prefix_log_probs(jnp.broadcast_to(theta0, (RANKINGS.shape[0], D)), RANKINGS), np.float64)
    mix = np.exp(lp + lp0[:, -1:] - lp0)  # pi(a_{1:l}) pi_0(a_{l+1:L} | a_{1:l})
    predicted = float(np.sum(mix * np.asarray(_below_rewards(RANKINGS) * ALPHA[None, :], np.float64)))
    mean, _ = _moments(theta, _below_rewards, _arbitrary_q(RANKINGS))
    assert mean == pytest.approx(predicted, rel=1e-5)
    assert abs(predicted - _exact_value(theta, _below_rewards)) > 0.01  # the bias is real here


def test_a_good_q_has_far_less_variance_than_rips_under_cascade_rewards():
    _, theta = _logits()
    _, var_cdr = _moments(theta, _cascade_rewards, _true_q(theta, _cascade_rewards))
    _, var_rips = _moments(theta, _cascade_rewards, None, name="rips")
    assert var_cdr < 0.05 * var_rips  # exact variances over rankings (deterministic rewards)


def test_expected_gradient_is_the_policy_gradient_under_cascade_rewards():
    theta0, theta = _logits()
    data = _all_rows(_cascade_rewards, theta0)
    p0 = jnp.exp(data.log_pi0_prefix[:, -1])
    q = _arbitrary_q(RANKINGS)  # a constant Q: the gradient of the expectation is unbiased

    def expected(th):
        target, choice = _target(th, data)
        return jnp.sum(p0 * cdr.cascade_dr_terms(target, data, inputs=cdr.CascadeInputs(q, choice)).value)

    def true_value(th):
        return jnp.sum(pl.enumerate_ranking_probs(th, RANKINGS) * (_cascade_rewards(RANKINGS) @ ALPHA))

    np.testing.assert_allclose(jax.grad(expected)(theta), jax.grad(true_value)(theta), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------
# obp
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_items,n_slots,structure", [(6, 3, "cascade_additive"), (5, 4, "standard_decay")])
def test_equals_obp_slate_cascade_doubly_robust_given_q(n_items, n_slots, structure):
    obp_dataset = pytest.importorskip("obp.dataset")
    obp_ope = pytest.importorskip("obp.ope")
    from opl_rank.io.obp import from_obp_slate

    dataset = obp_dataset.SyntheticSlateBanditDataset(
        n_unique_action=n_items,
        len_list=n_slots,
        dim_context=2,
        reward_type="continuous",
        reward_structure=structure,
        is_factorizable=False,
        random_state=11,
    )
    feedback = dataset.obtain_batch_bandit_feedback(n_rounds=200, return_pscore_item_position=False)
    rng = np.random.default_rng(3)
    eval_logits = rng.normal(size=(200, n_items))
    _, _, eval_cascade = dataset.obtain_pscore_given_evaluation_policy_logit(
        feedback["action"], eval_logits, return_pscore_item_position=False
    )
    action_dist = dataset.calc_evaluation_policy_action_dist(feedback["action"], eval_logits)
    q_hat = rng.normal(size=(200 * n_slots * n_items,))
    want = obp_ope.SlateCascadeDoublyRobust(len_list=n_slots, n_unique_action=n_items).estimate_policy_value(
        slate_id=feedback["slate_id"],
        action=feedback["action"],
        reward=feedback["reward"],
        position=feedback["position"],
        pscore_cascade=feedback["pscore_cascade"],
        evaluation_policy_pscore_cascade=eval_cascade,
        q_hat=q_hat,
        evaluation_policy_action_dist=action_dist,
    )
    data = from_obp_slate(feedback)
    np.testing.assert_array_equal(np.asarray(data.position_weight), 1.0)
    target = oe.Propensities(jnp.log(jnp.asarray(eval_cascade, jnp.float32).reshape(200, n_slots)))
    inputs = cdr.CascadeInputs(
        jnp.asarray(q_hat, jnp.float32).reshape(200, n_slots, n_items),
        jnp.asarray(action_dist, jnp.float32).reshape(200, n_slots, n_items),
    )
    ours = float(oe.estimate(cdr.cascade_dr_terms(target, data, inputs=inputs)))
    assert ours == pytest.approx(want, rel=1e-5, abs=1e-5)


# ---------------------------------------------------------------------------------------
# Q fit and OPE
# ---------------------------------------------------------------------------------------
def _sampled_logs(n, key, reward_fn=_cascade_rewards, noise=0.1):
    theta0, _ = _logits()
    k_rank, k_noise = jax.random.split(key)
    logits0 = jnp.broadcast_to(theta0, (n, D))
    ranking = pl.sample_rankings(k_rank, logits0, L)
    reward = reward_fn(ranking) + noise * jax.random.normal(k_noise, (n, L))
    return LoggedData(
        context=jax.random.normal(jax.random.fold_in(key, 7), (n, 2)),
        ranking=ranking,
        reward=reward,
        log_pi0_prefix=pl.prefix_log_probs(logits0, ranking),
        position_weight=ALPHA,
        n_items=D,
    )


_SCORER = ConstantLogits()


def _target_policy():
    return PLPolicy(_SCORER, _logits()[1], L)


def test_fitted_q_is_the_true_q_where_the_features_can_express_it():
    """Independent rewards r_l = REL[a_l] (a function of the item alone): each Q_l is linear in
    [e_d, m] (the expected rewards to go of the remaining items), so the ridge fit recovers it."""
    policy = _target_policy()
    data = _sampled_logs(4000, make_key(5), reward_fn=lambda a: REL[a], noise=0.0)
    choice = policy.choice_probs(data)
    q = cdr.fit_q(data, choice, make_key(1), ridge=1e-3, folds=1)
    want = _true_q(_logits()[1], lambda a: REL[a])  # on enumerated rows: compare at matching prefixes
    index = {tuple(map(int, r)): i for i, r in enumerate(np.asarray(RANKINGS))}
    rows = np.array([index[tuple(map(int, r))] for r in np.asarray(data.ranking)])
    held = np.asarray(want)[rows]
    valid = held != 0.0
    np.testing.assert_allclose(np.asarray(q)[valid], held[valid], atol=0.02)


def test_ope_cascade_dr_fits_its_q_and_beats_rips_in_spread():
    """Over 30 logged data sets under cascade rewards: both near the truth, Cascade-DR with a
    far smaller spread than RIPS (its fitted Q removes most of RIPS's variance)."""
    policy = _target_policy()
    truth = _exact_value(_logits()[1], _cascade_rewards)
    values = {"cascade_dr": [], "rips": []}
    for seed in range(30):
        data = _sampled_logs(500, make_key(100 + seed))
        results = ope.evaluate(policy, data, make_key(seed), estimators=("cascade_dr", "rips"), ci="normal")
        for name in values:
            values[name].append(results[name].value)
    cdr_values, rips_values = np.array(values["cascade_dr"]), np.array(values["rips"])
    assert abs(cdr_values.mean() - truth) < 4 * cdr_values.std(ddof=1) / np.sqrt(30) + 0.01
    assert cdr_values.std() < 0.6 * rips_values.std()


def test_given_q_and_bad_inputs():
    policy = _target_policy()
    data = _sampled_logs(64, make_key(9))
    zero = {"q": np.zeros((64, L, D))}
    both = ope.evaluate(policy, data, make_key(0), estimators=("cascade_dr", "rips"), inputs={"cascade_dr": zero})
    assert both["cascade_dr"].value == pytest.approx(both["rips"].value, rel=1e-6)
    with pytest.raises(ValueError, match=r"q must have shape \[n, L, D\]"):
        ope.evaluate(policy, data, make_key(0), estimators=("cascade_dr",), inputs={"cascade_dr": {"q": np.zeros(3)}})
    with pytest.raises(ValueError, match="fitting must be one of"):
        ope.evaluate(policy, data, make_key(0), estimators=("cascade_dr",), inputs={"cascade_dr": {"fitting": "x"}})
    with pytest.raises(ValueError, match="keys among"):
        ope.evaluate(policy, data, make_key(0), estimators=("cascade_dr",), inputs={"cascade_dr": {"Q": 1}})
    with pytest.raises(ValueError, match="not in estimators"):
        ope.evaluate(policy, data, make_key(0), estimators=("rips",), inputs={"cascade_dr": zero})

    class NoChoices:  # a policy without choice_probs
        n_slots, deterministic = L, False
        sample, log_prob = policy.sample, policy.log_prob

        def propensities(self, data, key=None, *, slot_marginals=False):
            return policy.propensities(data)

    with pytest.raises(ValueError, match="no choice_probs"):
        ope.evaluate(NoChoices(), data, make_key(0), estimators=("cascade_dr",))
    given = {"choice_probs": np.asarray(policy.choice_probs(data))}
    result = ope.evaluate(NoChoices(), data, make_key(0), estimators=("cascade_dr",), inputs={"cascade_dr": given})
    assert np.isfinite(result["cascade_dr"].value)


def test_iw_fitting_runs_and_stays_close():
    policy = _target_policy()
    truth = _exact_value(_logits()[1], _cascade_rewards)
    data = _sampled_logs(3000, make_key(21))
    res = ope.evaluate(
        policy, data, make_key(1), estimators=("cascade_dr",), inputs={"cascade_dr": {"fitting": "iw"}}, ci="normal"
    )["cascade_dr"]
    assert abs(res.value - truth) < 4 * res.stderr + 0.01


# ---------------------------------------------------------------------------------------
# As a learner
# ---------------------------------------------------------------------------------------
def test_as_a_learner_q_follows_the_policy_and_carries_no_gradient():
    """Inside the loss (learning=True) the hook refits Q on the minibatch under the current
    policy; the policy gradient treats that Q as a constant."""
    from opl_rank.opl.estimator_inputs import InputRequest

    data = _sampled_logs(256, make_key(31))
    key = make_key(32)

    def inputs(theta):
        return cdr.cascade_inputs(InputRequest(PLPolicy(_SCORER, theta, L), data, key, learning=True))

    _, theta = _logits()
    got = inputs(theta)
    want = cdr.fit_q(data, PLPolicy(_SCORER, theta, L).choice_probs(data), jax.random.fold_in(key, 2))
    np.testing.assert_array_equal(np.asarray(got.q), np.asarray(want))
    assert float(jnp.max(jnp.abs(inputs(-theta).q - got.q))) > 1e-3  # another policy, another Q

    def loss(th, frozen=None):
        policy = PLPolicy(_SCORER, th, L)
        own = inputs(th)
        own = own if frozen is None else own._replace(q=frozen)
        return -oe.estimate(cdr.cascade_dr_terms(policy.propensities(data), data, inputs=own))

    np.testing.assert_allclose(jax.grad(loss)(theta), jax.grad(lambda th: loss(th, got.q))(theta), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.extended
def test_the_cascade_dr_learner_beats_the_logging_policy():
    import math

    from opl_rank.opl.learners import LearnerConfig, fit
    from opl_rank.optimization import TrainConfig
    from simulators import SyntheticRankingEnv

    env = SyntheticRankingEnv.create(make_key(0), n_items=5, ranking_length=3, lam=0.5)
    data = env.sample_logged_data(make_key(1), 3000)
    policy = fit(data, make_key(3), LearnerConfig("cascade_dr", train=TrainConfig(epochs=15, learning_rate=5e-2)))
    v0 = env.logging_policy_value(make_key(2), 20_000)
    value = env.policy_value(policy, make_key(4), 20_000)
    assert value.value > v0.value + 4 * math.hypot(value.stderr, v0.stderr)


@pytest.mark.parametrize("bilinear", [True, False])
def test_normal_equations_equal_the_explicit_designs(bilinear):
    """fit_q's Gram and right-hand side, built from per-item one-hot sums, equal Phi^T W Phi
    and Phi^T W y of the explicit design [1, x, e_d, x (x) e_d, m]."""
    n, dx, n_items = 300, 3, 6
    k1, k2, k3, k4, k5 = jax.random.split(make_key(50), 5)
    context = jax.random.normal(k1, (n, dx))
    item = jax.random.randint(k2, (n,), 0, n_items)
    prefix = jax.random.bernoulli(k3, 0.3, (n, n_items)).astype(jnp.float32)
    target = jax.random.normal(k4, (n,))
    weight = jax.random.uniform(k5, (n,))
    one_hot = jax.nn.one_hot(item, n_items, dtype=jnp.float32)
    parts = [jnp.ones((n, 1)), context, one_hot]
    if bilinear:
        parts.append((context[:, :, None] * one_hot[:, None, :]).reshape(n, -1))
    design = np.asarray(jnp.concatenate(parts + [prefix], axis=1), np.float64)
    gram, rhs = cdr._normal_equations(context, one_hot, prefix, target, weight, bilinear)
    w = np.asarray(weight, np.float64)[:, None]
    np.testing.assert_allclose(np.asarray(gram), design.T @ (design * w), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(rhs), (design * w).T @ np.asarray(target, np.float64), rtol=1e-4, atol=1e-4)
