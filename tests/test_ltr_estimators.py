"""Every PL gradient estimator against the exact gradient of the exact expected utility.

Exact utility: U = sum_k theta_k sum_d P(y_k = d) rho_d, with exact position marginals
(cross-checked against enumeration); its jax.grad is the exact policy gradient. Each
estimator's mean gradient over M independent keys must be within 4 standard errors of it,
coordinate by coordinate, where the paper says it is unbiased, and far from it where the
paper says it is biased (the published Eq. 33 with baselines, Appendix A).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.pl import gradients as le
from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl
from tests import reference as ref

N_KEYS = 2000
N_SAMPLES = 8


def exact_utility(logits, relevance, theta, where=None):
    marg = marginals.exact_position_marginals(logits, theta.shape[0], where=where)  # [.., K, D]
    return jnp.einsum("k,...kd,...d->...", theta, marg, relevance)


def _problem(n_items, n_slots, seed, signed=False):
    k_logits, k_rel = jax.random.split(make_key(seed))
    logits = jax.random.normal(k_logits, (2, n_items))
    rel = jax.random.uniform(k_rel, (2, n_items), minval=-2.0 if signed else 0.0, maxval=4.0)
    theta = 1.0 / jnp.log2(jnp.arange(2, n_slots + 2, dtype=jnp.float32))
    return logits, rel, theta


def _gradients(estimator, logits, rel, theta, **kwargs):
    keys = jax.random.split(make_key(1234), N_KEYS)

    def one(key):
        return jax.grad(lambda s: estimator(s, rel, theta, key, N_SAMPLES, **kwargs).sum())(logits)

    return np.asarray(jax.vmap(one)(keys), np.float64)


def _z_scores(grads, exact):
    mean = grads.mean(0)
    se = grads.std(0, ddof=1) / np.sqrt(grads.shape[0])
    return np.abs(mean - np.asarray(exact)) / (se + 1e-7)


def test_exact_utility_matches_enumeration():
    logits, rel, theta = _problem(5, 3, 0)
    want = [
        sum(
            ref.pl_prefix_probs(np.asarray(logits[q]), perm)[-1]
            * sum(float(theta[k]) * float(rel[q, d]) for k, d in enumerate(perm))
            for perm in ref.all_permutations(5, 3)
        )
        for q in range(2)
    ]
    np.testing.assert_allclose(exact_utility(logits, rel, theta), want, rtol=1e-5)


UNBIASED = [
    (name, baseline)
    for name in ("standard", "placement", "marginalize_first", "marginalize_all", "exposure")
    for baseline in (True, False)
] + [("exposure_original", False)]


@pytest.mark.parametrize("n_items,n_slots", [(5, 3), (6, 4)])
@pytest.mark.parametrize("name,baseline", UNBIASED)
def test_estimator_is_unbiased(name, baseline, n_items, n_slots):
    logits, rel, theta = _problem(n_items, n_slots, seed=n_items, signed=name.startswith("exposure"))
    exact = jax.grad(lambda s: exact_utility(s, rel, theta).sum())(logits)
    grads = _gradients(le.GRADIENT_ESTIMATORS[name], logits, rel, theta, baseline=baseline)
    assert np.all(np.isfinite(grads))
    assert _z_scores(grads, exact).max() < 4.0


def test_original_exposure_estimator_is_biased_with_baselines():
    """Appendix A: Eq. 33 subtracts b_d per placement, but sum_k P(y_k = d) < 1."""
    logits, rel, theta = _problem(5, 3, seed=5)
    exact = jax.grad(lambda s: exact_utility(s, rel, theta).sum())(logits)
    original = _z_scores(
        _gradients(le.GRADIENT_ESTIMATORS["exposure_original"], logits, rel, theta, baseline=True), exact
    )
    corrected = _z_scores(_gradients(le.GRADIENT_ESTIMATORS["exposure"], logits, rel, theta, baseline=True), exact)
    assert original.max() > 20.0
    assert corrected.max() < 4.0


@pytest.mark.slow
def test_exposure_values_and_jacobian_match_exact_exposure():
    logits, _, theta = _problem(6, 3, seed=3)
    where = jnp.array([[True] * 6, [True, True, False, True, True, True]])
    exact_exposure = lambda s: jnp.einsum("k,...kd->...d", theta, marginals.exact_position_marginals(s, 3, where=where))
    keys = jax.random.split(make_key(77), N_KEYS)
    values = np.asarray(jax.vmap(lambda k: le.exposure(logits, theta, k, N_SAMPLES, where=where))(keys))
    want = np.asarray(exact_exposure(logits))
    assert np.all(np.abs(values.mean(0) - want) <= 4 * values.std(0) / np.sqrt(N_KEYS) + 1e-6)
    np.testing.assert_allclose(values.sum(-1), float(theta.sum()), rtol=1e-5)  # exposure is conserved
    assert np.all(values[:, 1, 2] == 0.0)  # masked document gets none
    # The Jacobian row of document d is the gradient of its exposure.
    jac = jax.vmap(lambda k: jax.jacrev(lambda s: le.exposure(s, theta, k, N_SAMPLES, where=where)[0, 4])(logits))(keys)
    exact_jac = jax.grad(lambda s: exact_exposure(s)[0, 4])(logits)
    assert _z_scores(np.asarray(jac, np.float64), exact_jac).max() < 4.0


def test_marginalization_reduces_variance():
    logits, rel, theta = _problem(6, 4, seed=11)
    spread = {
        name: _gradients(le.GRADIENT_ESTIMATORS[name], logits, rel, theta, baseline=True).std(0).mean()
        for name in ("standard", "placement", "marginalize_all")
    }
    assert spread["marginalize_all"] < spread["placement"] < spread["standard"]


def test_plrank3_is_unbiased_in_float64():
    logits, rel, theta = _problem(5, 3, seed=21)
    exact = jax.grad(lambda s: exact_utility(s, rel, theta).sum())(logits)
    with jax.enable_x64(True):
        l64, r64, t64 = (jnp.asarray(np.asarray(a), jnp.float64) for a in (logits, rel, theta))
        grads = _gradients(le.plrank3_utility, l64, r64, t64)
        assert grads.dtype == np.float64
    assert _z_scores(grads, exact).max() < 4.0


def test_plrank3_float32_is_finite_at_logits_1e3():
    """Formerly documented a failure (unnormalised e^f gave non-finite gradients here in
    float32); the denominators are now in log space, so value and gradient are finite."""
    logits = jnp.array([[1e3, -1e3, 5e2, 0.0, -5e2]], jnp.float32)
    rel = jnp.array([[1.0, 2.0, 0.0, 3.0, 1.0]], jnp.float32)
    theta = jnp.array([1.0, 0.6, 0.5], jnp.float32)
    value, g = jax.value_and_grad(lambda s: le.plrank3_utility(s, rel, theta, make_key(0), 8).sum())(logits)
    assert bool(jnp.isfinite(value)) and bool(jnp.all(jnp.isfinite(g)))


def _plrank3_reference(logits, rel, theta, rankings):
    """Eq. 21 in float64, one sample and one document at a time: ``denom_k`` is the
    log-sum-exp of the documents still unplaced (never a difference of sums)."""
    logits, rel, theta = (np.asarray(a, np.float64) for a in (logits, rel, theta))
    rankings = np.asarray(rankings)
    n_samples, n_slots = rankings.shape[0], rankings.shape[-1]
    value = np.zeros(logits.shape[:-1])
    grad = np.zeros(logits.shape)
    for q in np.ndindex(*logits.shape[:-1]):
        f, rho = logits[q], rel[q]
        for i in range(n_samples):
            y = [int(d) for d in rankings[(i,) + q]]
            left = list(range(f.shape[0]))
            log_den = []
            for d in y:
                log_den.append(np.logaddexp.reduce(f[left]))
                left.remove(d)
            reward = theta * rho[y]
            pr = np.append(np.cumsum(reward[::-1])[::-1], 0.0)  # PR_k, PR_K = 0
            value[q] += reward.sum() / n_samples
            for d in range(f.shape[0]):
                r = y.index(d) if d in y else n_slots - 1
                g = pr[r + 1] if d in y else 0.0
                g += sum(np.exp(f[d] - log_den[x]) * (rho[d] * theta[x] - pr[x]) for x in range(r + 1))
                grad[q + (d,)] += g / n_samples
    return value, grad


@pytest.mark.slow
@pytest.mark.parametrize("gap", [0.0, 17.0, 20.0, 100.0, 1e3])
def test_plrank3_float32_matches_a_float64_reference_at_large_logit_gaps(gap):
    """The published denominators ``sum(e^f) - cumsum(e^f)`` cancel in float32: no correct
    digits at a logit gap of 17, NaN from about 20. In log space they stay accurate."""
    logits = jnp.array([[gap, 0.0, 0.5, -0.5, 1.0, -1.0], [0.3 * gap, -0.2 * gap, gap, 0.0, -gap, 0.1]], jnp.float32)
    rel = jnp.array([[1.0, 2.0, 0.0, 3.0, 1.0, 0.5], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]], jnp.float32)
    theta = jnp.array([1.0, 0.6, 0.5], jnp.float32)
    # fixed rankings (the top-gap document first and elsewhere), all of D valid
    rankings = jnp.array([[[0, 4, 2], [1, 3, 5]], [[0, 1, 2], [2, 0, 5]], [[4, 0, 3], [2, 5, 3]]], jnp.int32)
    valid = jnp.ones(logits.shape, bool)
    value = le._plrank3(logits, rel, theta, rankings, valid)
    grad = jax.grad(lambda s: le._plrank3(s, rel, theta, rankings, valid).sum())(logits)
    want_value, want_grad = _plrank3_reference(logits, rel, theta, rankings)
    assert bool(jnp.all(jnp.isfinite(grad)))
    np.testing.assert_allclose(np.asarray(value), want_value, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-6 * np.abs(want_grad).max())
    # and through the public function (sampled rankings): finite, and float32 == float64
    g32 = jax.grad(lambda s: le.plrank3_utility(s, rel, theta, make_key(0), 8).sum())(logits)
    with jax.enable_x64(True):
        g64 = jax.grad(
            lambda s: le.plrank3_utility(s, rel.astype(jnp.float64), theta.astype(jnp.float64), make_key(0), 8).sum()
        )(jnp.asarray(np.asarray(logits), jnp.float64))
        g64 = np.asarray(g64)
    assert np.all(np.isfinite(g64)) and bool(jnp.all(jnp.isfinite(g32)))
    if gap <= 20.0:  # identical samples in both precisions (the top items are not near-ties)
        np.testing.assert_allclose(np.asarray(g32), g64, rtol=1e-3, atol=1e-5 * np.abs(g64).max())


def test_plrank3_masked_and_minus_inf_documents_at_large_gaps():
    logits = jnp.array([[1e3, -1e3, 5e2, 0.0, -5e2, 1e3], [3.0, 1e3, -jnp.inf, 2.0, 0.0, 0.0]], jnp.float32)
    where = jnp.array([[True] * 6, [True, True, True, True, False, False]])
    rel = jnp.array([[1.0, 2.0, 0.0, 3.0, 1.0, 4.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]], jnp.float32)
    theta = jnp.array([1.0, 0.6, 0.5, 0.4], jnp.float32)
    value, g = jax.value_and_grad(lambda s: le.plrank3_utility(s, rel, theta, make_key(0), 8, where=where).sum())(
        logits
    )
    assert bool(jnp.isfinite(value)) and bool(jnp.all(jnp.isfinite(g)))
    np.testing.assert_array_equal(np.asarray(g)[1, [2, 4, 5]], 0.0)  # -inf or masked: no gradient


def _marginalize_all_reference(logits, rel, theta, rankings, valid, baseline):
    """Marginalize-all's value and gradient in float64, one sample at a time: every slot's
    placement probabilities from a log-sum-exp over the items still available, and the
    closed-form gradient ``sum_k pi_k(j) (theta_k (rho_j - E_k) - C_k) + C_{r_j} [j placed]``."""
    from scipy.special import logsumexp

    logits, rel, theta = (np.asarray(a, np.float64) for a in (logits, rel, theta))
    rankings, valid = np.asarray(rankings), np.asarray(valid)
    n_samples, n_queries, n_slots = rankings.shape
    value, grad = np.zeros(n_queries), np.zeros(logits.shape)
    for q in range(n_queries):
        s, rho = logits[q], np.where(valid[q], rel[q], 0.0)
        place = np.zeros((n_samples, n_slots, s.shape[0]))
        for n in range(n_samples):
            available = valid[q].copy()
            for k, y in enumerate(rankings[n, q]):
                if not available.any():
                    break  # padding slots: all items placed
                place[n, k] = np.where(
                    available, np.exp(np.where(available, s, -np.inf) - logsumexp(s[available])), 0.0
                )
                available[y] = False
        expected, total = place @ rho, place.sum(-1)  # [N, K]
        value[q] = np.mean(expected @ theta)
        b = (expected.sum(0) - expected) / (n_samples - 1) if baseline else 0.0 * expected
        c = theta * (expected - b * total)
        after = np.cumsum(c[:, ::-1], axis=1)[:, ::-1] - c
        per = np.einsum("nkd,nkd->nd", place, theta[None, :, None] * (rho - expected[..., None]) - after[..., None])
        for n in range(n_samples):
            for k, y in enumerate(rankings[n, q]):
                per[n, y] += after[n, k] if total[n, k] > 0 else 0.0
        grad[q] = per.mean(0)
    return value, grad


@functools.partial(jax.jit, static_argnames="baseline")
def _marginalize_all_value_and_grad(logits, rel, theta, rankings, valid, baseline):
    """Per-query values and the gradient of their sum (one compilation per shape)."""
    per_query = le._marginalize_all(logits, rel, theta, rankings, valid, baseline)
    grad = jax.grad(lambda s: le._marginalize_all(s, rel, theta, rankings, valid, baseline).sum())(logits)
    return per_query, grad


@pytest.mark.parametrize("scale", [0.3, 3.0, 100.0, 1e3])
@pytest.mark.parametrize("n_items,n_slots,masked", [(6, 4, False), (6, 4, True), (5, 5, True), (30, 10, True)])
def test_marginalize_all_matches_a_float64_reference(scale, n_items, n_slots, masked):
    """The O(D + K^2)-per-sample value and closed-form gradient against float64, with masks,
    padding slots (fewer valid items than K) and logit gaps up to 1e3: absolute errors at
    float32 rounding of O(1) terms, and no residue where the true gradient is ~0."""
    k_logits, k_rel, k_mask, k_rank = jax.random.split(make_key(int(scale * 10) + n_items), 4)
    logits = scale * jax.random.normal(k_logits, (3, n_items))
    rel = jax.random.uniform(k_rel, (3, n_items), minval=-1.0, maxval=4.0)
    valid = jnp.ones((3, n_items), bool)
    if masked:
        valid = (jax.random.uniform(k_mask, (3, n_items)) > 0.3).at[:, 0].set(True).at[2, 1:].set(False)
    theta = 1.0 / jnp.log2(jnp.arange(2, n_slots + 2, dtype=jnp.float32))
    rankings = pl.sample_rankings(k_rank, logits, n_slots, where=valid, n_samples=N_SAMPLES)
    rel = jnp.where(valid, rel, 0.0)
    for baseline in (True, False):
        per_query, grad = _marginalize_all_value_and_grad(logits, rel, theta, rankings, valid, baseline)
        want_value, want_grad = _marginalize_all_reference(logits, rel, theta, rankings, valid, baseline)
        np.testing.assert_allclose(np.asarray(per_query), want_value, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=3e-6)
        np.testing.assert_array_equal(np.asarray(grad)[~np.asarray(valid)], 0.0)


@pytest.mark.parametrize("name", [n for n in le.GRADIENT_ESTIMATORS if n != "plrank3"])
def test_no_nan_or_inf_at_logits_1e3(name):
    logits = jnp.array([[1e3, -1e3, 5e2, 0.0, -5e2, 1e3], [3.0, 1e3, -1e3, 2.0, 0.0, 0.0]], jnp.float32)
    where = jnp.array([[True] * 6, [True, True, True, True, False, False]])
    rel = jnp.array([[1.0, 2.0, 0.0, 3.0, 1.0, 4.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]], jnp.float32)
    theta = jnp.array([1.0, 0.6, 0.5], jnp.float32)
    fn = lambda s: le.GRADIENT_ESTIMATORS[name](s, rel, theta, make_key(0), 8, where=where).sum()
    value, grad = jax.value_and_grad(fn)(logits)
    assert bool(jnp.isfinite(value)) and bool(jnp.all(jnp.isfinite(grad)))


@pytest.mark.slow
def test_masked_documents_get_no_gradient_and_fewer_docs_than_k():
    logits, rel, theta = _problem(5, 4, seed=31)
    where = jnp.array([[True, True, False, True, False], [True, False, False, False, True]])  # 2 valid < K
    for name, est in le.GRADIENT_ESTIMATORS.items():
        g = jax.grad(lambda s: est(s, rel, theta, make_key(3), 8, where=where).sum())(logits)
        assert bool(jnp.all(jnp.isfinite(g))), name
        np.testing.assert_array_equal(np.asarray(g)[~np.asarray(where)], 0.0, err_msg=name)


@pytest.mark.slow
def test_value_is_the_utility_estimate():
    logits, rel, theta = _problem(5, 3, seed=41)
    exact = np.asarray(exact_utility(logits, rel, theta))
    for name, est in le.GRADIENT_ESTIMATORS.items():
        values = np.asarray(
            jax.vmap(lambda k: est(logits, rel, theta, k, N_SAMPLES))(jax.random.split(make_key(5), 500))
        )
        se = values.std(0) / np.sqrt(500)
        assert np.all(np.abs(values.mean(0) - exact) <= 4 * se + 1e-5), name


@pytest.mark.slow
def test_sampled_policy_gradient_with_a_ranking_level_reward():
    """A reward that does not decompose: 1 if documents 0 and 1 are both in the top-2."""
    logits, _, _ = _problem(4, 2, seed=51)
    rankings = jnp.asarray(pl.all_rankings(4, 2))
    hit = jnp.asarray([float(set(r.tolist()) == {0, 1}) for r in np.asarray(rankings)])
    exact_value = lambda s: jnp.sum(pl.enumerate_ranking_probs(s, rankings) * hit[None, :], axis=-1)
    reward_fn = lambda r: jnp.logical_and(jnp.any(r == 0, axis=-1), jnp.any(r == 1, axis=-1)).astype(jnp.float32)
    keys = jax.random.split(make_key(9), N_KEYS)
    grads = jax.vmap(lambda k: jax.grad(lambda s: le.sampled_policy_gradient(s, reward_fn, 2, k, 8).sum())(logits))(
        keys
    )
    assert _z_scores(np.asarray(grads, np.float64), jax.grad(lambda s: exact_value(s).sum())(logits)).max() < 4.0


def test_input_errors():
    theta = jnp.ones(3)
    with pytest.raises(ValueError, match="n_samples must be >= 2"):
        le.placement_utility(jnp.zeros(5), jnp.ones(5), theta, make_key(0), 1)
    with pytest.raises(ValueError, match="K = 6 must be in"):
        le.standard_utility(jnp.zeros(5), jnp.ones(5), jnp.ones(6), make_key(0), 4)
    with pytest.raises(ValueError, match="position_weight must be"):
        le.exposure(jnp.zeros(5), jnp.ones((2, 2)), make_key(0), 4)
