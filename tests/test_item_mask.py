"""LoggedData.item_mask is honoured by propensities, estimators, OPE, learners and completion.

D=5 candidates of which each row shows 3 (all 10 subsets equally often), L=2 slots, four
contexts. The exact value of a target PL policy restricted to each row's candidates comes
from enumerating every ranking; OPE estimates must match it within 4 standard errors.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import LoggedData, make_key
from opl_rank.opl import ope
from opl_rank.opl.learners import LearnerConfig, fit
from opl_rank.opl.policies import PLPolicy, RegressionPolicy, TwoStagePolicy
from opl_rank.opl.reward_models import fit_reward_model
from opl_rank.optimization import TrainConfig
from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl

D, L, M, N = 5, 2, 4, 20_000
SUBSETS = np.array([[d in s for d in range(D)] for s in itertools.combinations(range(D), 3)])  # [10, D]
RANKINGS = jnp.asarray(pl.all_rankings(D, L))


class ContextTable:
    """Logits ``context @ params``: contexts are one-hot context ids, params ``[M, D]``."""

    def apply(self, params, context):
        return context @ params


def _setting():
    base = jax.random.normal(make_key(0), (M, D))  # expected reward of item d in context j
    logits0 = jax.random.normal(make_key(1), (M, D))  # logging policy
    target = 1.5 * jax.random.normal(make_key(2), (M, D))
    alpha = jnp.array([1.0, 0.6])
    k_ctx, k_mask, k_rank, k_noise = jax.random.split(make_key(3), 4)
    j = jax.random.randint(k_ctx, (N,), 0, M)
    mask = jnp.asarray(SUBSETS)[jax.random.randint(k_mask, (N,), 0, len(SUBSETS))]
    ranking = pl.sample_rankings(k_rank, logits0[j], L, where=mask)
    reward = jnp.take_along_axis(base[j], ranking, axis=-1) + 0.3 * jax.random.normal(k_noise, (N, L))
    data = LoggedData(
        context=jax.nn.one_hot(j, M),
        ranking=ranking,
        reward=reward,
        log_pi0_prefix=pl.prefix_log_probs(logits0[j], ranking, where=mask),
        position_weight=alpha,
        n_items=D,
        log_pi0_position_marginal=jnp.log(marginals.exact_slot_marginals(logits0[j], ranking, where=mask)),
        item_mask=mask,
    )
    # Exact V(pi) = mean over (context, candidate subset) of sum_a pi(a | x, subset) q(x, a).
    values = []
    for jj, subset in itertools.product(range(M), SUBSETS):
        probs = pl.enumerate_ranking_probs(target[jj], RANKINGS, where=jnp.asarray(subset))
        q = jnp.take_along_axis(jnp.broadcast_to(base[jj], (RANKINGS.shape[0], D)), RANKINGS, axis=-1) @ alpha
        values.append(float(jnp.sum(probs * q)))
    return data, PLPolicy(ContextTable(), target, L), float(np.mean(values))


@pytest.fixture(scope="module")
def setting():
    return _setting()


def test_logged_rankings_use_only_each_rows_candidates(setting):
    data, _, _ = setting
    shown = np.take_along_axis(np.asarray(data.item_mask), np.asarray(data.ranking), axis=-1)
    assert shown.all()


@pytest.mark.slow
def test_ope_matches_the_exact_masked_value(setting):
    data, policy, truth = setting
    model = fit_reward_model(data, make_key(4), config=TrainConfig(epochs=3, batch_size=512, learning_rate=5e-2))
    names = ("ips", "snips", "rips", "iips", "dr")
    got = ope.evaluate(policy, data, make_key(5), estimators=names, reward_model=model, ci="normal", n_samples=64)
    for name in names:
        assert abs(got[name].value - truth) < 4 * got[name].stderr + 1e-3, (name, got[name].value, truth)
    # Ignoring the mask (the bug this guards against) is far off.
    unmasked = ope.evaluate(policy, data.replace(item_mask=None), make_key(5), estimators=("ips",), ci="normal")["ips"]
    assert abs(unmasked.value - truth) > 10 * unmasked.stderr


@pytest.mark.slow
def test_policies_and_completion_never_rank_an_excluded_candidate(setting):
    data, policy, _ = setting
    rows = data.take(np.arange(500))
    model = fit_reward_model(rows, make_key(6), kind="pairwise", config=TrainConfig(epochs=2, batch_size=256))
    policies = [policy, RegressionPolicy(model), TwoStagePolicy(PLPolicy(ContextTable(), policy.params, 1), model)]
    for p in policies:
        a = np.asarray(p.sample(make_key(7), rows.context, where=rows.item_mask))
        assert np.take_along_axis(np.asarray(rows.item_mask), a, axis=-1).all(), type(p).__name__
        log_prob = np.asarray(p.log_prob(rows.context, jnp.asarray(a), where=rows.item_mask))
        assert np.all(np.isfinite(log_prob)), type(p).__name__


# one learner in the default suite; the others learn on masked logs in the extended set
@pytest.mark.parametrize(
    "method", ["ips", *(pytest.param(m, marks=pytest.mark.extended) for m in ("rips", "iips", "dr"))]
)
@pytest.mark.slow
def test_learners_train_on_masked_logs_and_beat_the_logging_policy(setting, method):
    data, _, _ = setting
    train = TrainConfig(epochs=4, batch_size=512, learning_rate=0.1)
    policy = fit(data, make_key(8), LearnerConfig(method, train=train, reward_train=train))
    est = ope.evaluate(policy, data, make_key(9), estimators=("snips",), ci="normal")["snips"]
    logged = float(jnp.mean(data.reward @ data.position_weight))
    assert est.value > logged + 4 * est.stderr and math.isfinite(est.value)
