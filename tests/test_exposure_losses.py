"""Exposure-based losses (Eqs. 7-12) against hand-written closed forms and float64 oracles."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank.ltr.exposure_losses import (
    frac_fair_loss,
    kl_distill_loss,
    kl_fair_loss,
    prod_fair_loss,
    relevance_loss,
)

ALL_LOSSES = [relevance_loss, frac_fair_loss, prod_fair_loss, kl_fair_loss, kl_distill_loss]
DCG4 = [1.0, 1.0 / math.log2(3.0), 0.5, 1.0 / math.log2(5.0)]


def _f32(x):
    return jnp.asarray(np.asarray(x, np.float32))


@functools.cache
def _compiled_value_and_grad(loss, eps):
    def total(theta, other, where):
        kwargs = {} if eps is None else {"eps": eps}
        rows = loss(theta, other, where=where, **kwargs)
        return jnp.sum(rows), rows

    return jax.jit(jax.value_and_grad(total, has_aux=True))


def _value_and_grad(loss, theta, other, *, where=None, eps=None):
    """Per-row losses and d(sum of losses)/d(exposure), one compiled function per loss."""
    (_, rows), grad = _compiled_value_and_grad(loss, eps)(theta, other, where)
    return np.asarray(rows), np.asarray(grad)


# -- float64 O(D^2) oracles ----------------------------------------------------------------
def _pairs_frac(theta, rho):
    d = len(theta)
    r = [t / p for t, p in zip(theta, rho)]
    total = sum((r[i] - r[j]) ** 2 for i in range(d) for j in range(i + 1, d))
    return 2.0 / (d * d - d) * total


def _pairs_prod(theta, rho):
    d = len(theta)
    total = sum((theta[i] * rho[j] - theta[j] * rho[i]) ** 2 for i in range(d) for j in range(i + 1, d))
    return 2.0 / (d * d - d) * total


def _kl(p, q):
    """-sum p' log(q'/p') with 0 log 0 = 0, plain Python floats."""
    sp, sq = sum(p), sum(q)
    return -sum(pi / sp * math.log((qi / sq) / (pi / sp)) for pi, qi in zip(p, q) if pi > 0)


# -- closed forms, 3-4 documents -----------------------------------------------------------
def test_relevance_loss_closed_form():
    theta, rho = DCG4, [0.2, 1.0, 0.5, 0.7]
    expected = -(0.2 * 1.0 + 1.0 / math.log2(3.0) + 0.5 * 0.5 + 0.7 / math.log2(5.0))
    assert float(relevance_loss(_f32(theta), _f32(rho))) == pytest.approx(expected, rel=1e-6)
    # int relevance labels are accepted (cast to float32)
    int_labels = jnp.array([1, 2, 3])
    assert float(relevance_loss(_f32([1.0, 0.5, 0.25]), int_labels)) == pytest.approx(-2.75)


def test_frac_fair_closed_form():
    theta, rho = [0.9, 0.6, 0.3], [1.0, 2.0, 0.5]
    # ratios 0.9, 0.3, 0.6: (0.6^2 + 0.3^2 + 0.3^2) * 2 / (9 - 3)
    expected = (0.6**2 + 0.3**2 + 0.3**2) * 2.0 / 6.0
    assert expected == pytest.approx(_pairs_frac(theta, rho))
    got = float(frac_fair_loss(_f32(theta), _f32(rho), eps=0.0))
    assert got == pytest.approx(expected, rel=1e-5)
    # the default eps only perturbs it at the eps level
    assert float(frac_fair_loss(_f32(theta), _f32(rho))) == pytest.approx(expected, rel=1e-4)


def test_frac_fair_zero_relevance_adds_eps_to_rho():
    theta, rho, eps = [0.5, 0.3, 0.2], [1.0, 0.0, 2.0], 1e-2
    expected = _pairs_frac(theta, [r + eps for r in rho])
    got = frac_fair_loss(_f32(theta), _f32(rho), eps=eps)
    assert float(got) == pytest.approx(expected, rel=1e-5)
    # default eps: finite (huge, dominated by the exposed zero-relevance doc), finite grads
    loss, grad = _value_and_grad(frac_fair_loss, _f32(theta), _f32(rho))
    assert np.isfinite(float(loss)) and float(loss) > 1e9
    assert np.all(np.isfinite(np.asarray(grad)))
    # a zero-relevance doc without exposure has ratio 0 whatever eps is (rho -> 0 limit)
    theta0 = [0.5, 0.0, 0.2]
    expected0 = (0.5**2 + 0.4**2 + 0.1**2) * 2.0 / 6.0  # ratios 0.5, 0, 0.1
    got0 = frac_fair_loss(_f32(theta0), _f32(rho))
    assert float(got0) == pytest.approx(expected0, rel=1e-5)
    got0 = frac_fair_loss(_f32(theta0), _f32(rho), eps=eps)
    assert float(got0) == pytest.approx(_pairs_frac(theta0, [r + eps for r in rho]), rel=1e-5)


def test_prod_fair_closed_form():
    theta, rho = [0.9, 0.6, 0.3, 0.0], [1.0, 2.0, 0.5, 3.0]
    # pairs (i, j): theta_i rho_j - theta_j rho_i
    diffs = [
        0.9 * 2.0 - 0.6 * 1.0,  # (0, 1) = 1.2
        0.9 * 0.5 - 0.3 * 1.0,  # (0, 2) = 0.15
        0.9 * 3.0 - 0.0 * 1.0,  # (0, 3) = 2.7
        0.6 * 0.5 - 0.3 * 2.0,  # (1, 2) = -0.3
        0.6 * 3.0 - 0.0 * 2.0,  # (1, 3) = 1.8
        0.3 * 3.0 - 0.0 * 0.5,  # (2, 3) = 0.9
    ]
    expected = 2.0 / (16 - 4) * sum(x * x for x in diffs)
    assert expected == pytest.approx(_pairs_prod(theta, rho))
    assert float(prod_fair_loss(_f32(theta), _f32(rho))) == pytest.approx(expected, rel=1e-5)


def test_kl_fair_closed_form_with_zero_relevance_doc():
    theta, rho = [0.5, 0.3, 0.2], [2.0, 0.0, 1.0]
    # rho' = (2/3, 0, 1/3), theta' = (0.5, 0.3, 0.2); the zero-relevance doc contributes 0
    expected = -(2 / 3) * math.log(0.5 / (2 / 3)) - (1 / 3) * math.log(0.2 / (1 / 3))
    assert expected == pytest.approx(_kl(rho, theta))
    assert float(kl_fair_loss(_f32(theta), _f32(rho), eps=0.0)) == pytest.approx(expected, rel=1e-5)
    assert float(kl_fair_loss(_f32(theta), _f32(rho))) == pytest.approx(expected, abs=1e-5)
    loss, grad = _value_and_grad(kl_fair_loss, _f32(theta), _f32(rho), eps=0.0)
    # analytic gradient at eps = 0: -rho'_i / theta_i + 1 / sum(theta)
    expected_grad = [-(2 / 3) / 0.5 + 1.0, 1.0, -(1 / 3) / 0.2 + 1.0]
    np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=1e-5)


def test_kl_distill_closed_form_and_zero_at_target():
    target = [1.0, 1.0 / math.log2(3.0), 0.5, 0.0]  # teacher's top-3 of 4 docs
    theta = [0.4, 0.3, 0.2, 0.1]
    expected = _kl(target, theta)
    got = kl_distill_loss(_f32(theta), _f32(target), eps=0.0)
    assert float(got) == pytest.approx(expected, rel=1e-5)
    # 0 up to float32 rounding (XLA may fuse the two normalisations differently)
    assert abs(float(kl_distill_loss(_f32(target), _f32(target)))) < 1e-6
    assert abs(float(kl_distill_loss(_f32(target), _f32(target), eps=0.0))) < 1e-6
    assert abs(float(kl_distill_loss(_f32(np.array(target) * 5.0), _f32(target)))) < 1e-6


def test_losses_at_their_optimum():
    rho = _f32([3.0, 1.0, 0.5, 2.0])
    theta = rho * 0.25  # exposure proportional to relevance: all fairness losses vanish
    assert abs(float(frac_fair_loss(theta, rho, eps=0.0))) < 1e-10
    assert abs(float(prod_fair_loss(theta, rho))) < 1e-10
    assert abs(float(kl_fair_loss(theta, rho))) < 1e-6


# -- pairwise sums: O(D) forms against the O(D^2) double sum --------------------------------
def _quadratic_prod(theta, rho):
    """The O(D^2) double sum of Eq. 9, vectorised, in the inputs' dtype; and the pair diffs."""
    diff = theta[..., :, None] * rho[..., None, :] - theta[..., None, :] * rho[..., :, None]
    d = theta.shape[-1]
    upper = np.triu(np.ones((d, d), bool), 1)
    return (diff * diff * upper).sum(axis=(-2, -1)) * (2.0 / (d * d - d)), diff


@pytest.mark.parametrize("noise", [1.0, 1e-2, 1e-4])
@pytest.mark.parametrize("n_docs", [10, 300])
def test_prod_fair_matches_quadratic_form_at_realistic_magnitudes(n_docs, noise):
    """LETOR-like relevance (labels/4) and exposures ~ DCG weights, from far to very close to
    the optimum theta ~ rho, where Lagrange's identity |a|^2|b|^2 - (a.b)^2 cancels in
    float32 (relative errors up to ~1e2 at noise 1e-4); the projection form does not."""
    rng = np.random.default_rng(n_docs)
    rho = (rng.integers(0, 5, (4, n_docs)) / 4.0).astype(np.float32)
    theta = (0.3 * rho + noise * 0.3 * rng.random((4, n_docs))).astype(np.float32)
    got, grad = _value_and_grad(prod_fair_loss, _f32(theta), _f32(rho))
    quad32, _ = _quadratic_prod(theta, rho)  # float32 O(D^2) form
    r64 = rho.astype(np.float64)
    exact, diff = _quadratic_prod(theta.astype(np.float64), r64)
    np.testing.assert_allclose(got, exact, rtol=1e-3)
    np.testing.assert_allclose(quad32, exact, rtol=1e-3)
    # gradient: d/dtheta_i = 2/(D^2-D) * 2 sum_j (theta_i rho_j - theta_j rho_i) rho_j
    exact_grad = 4.0 / (n_docs**2 - n_docs) * np.einsum("bij,bj->bi", diff, r64)
    scale = np.max(np.abs(exact_grad), axis=-1, keepdims=True)
    np.testing.assert_allclose(grad / scale, exact_grad / scale, atol=1e-3)


def test_frac_fair_matches_quadratic_form():
    rng = np.random.default_rng(1)
    theta = rng.random((3, 50)).astype(np.float32)
    rho = (0.1 + rng.random((3, 50))).astype(np.float32)
    got = np.asarray(frac_fair_loss(_f32(theta), _f32(rho), eps=0.0))
    expected = [_pairs_frac(t.astype(np.float64), r.astype(np.float64)) for t, r in zip(theta, rho)]
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# -- invariances -------------------------------------------------------------------------
def _random_inputs(rng, shape):
    theta = rng.random(shape).astype(np.float32)
    theta[..., -2:] = 0.0  # some docs outside the top-K
    rho = rng.integers(0, 3, shape).astype(np.float32) * 0.5
    return theta, rho


@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_batch_dims_agree_with_per_row_calls(loss):
    theta, rho = _random_inputs(np.random.default_rng(2), (2, 3, 6))
    mask = np.random.default_rng(3).random((2, 3, 6)) < 0.8
    batched = np.asarray(loss(_f32(theta), _f32(rho), where=jnp.asarray(mask)))
    assert batched.shape == (2, 3)
    for b in range(2):
        for q in range(3):
            row = loss(_f32(theta[b, q]), _f32(rho[b, q]), where=jnp.asarray(mask[b, q]))
            assert float(row) == pytest.approx(float(batched[b, q]), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_masked_docs_equal_dropping_them(loss):
    theta, rho = _random_inputs(np.random.default_rng(4), (7,))
    rho[0] = 1.0  # keep some relevance on the kept docs
    mask = np.array([True, False, True, True, False, True, False])
    padded_theta, padded_rho = theta.copy(), rho.copy()
    padded_theta[~mask] = np.nan  # masked values are never read
    padded_rho[~mask] = 123.0
    masked, grad = _value_and_grad(loss, _f32(padded_theta), _f32(padded_rho), where=mask)
    dropped = loss(_f32(theta[mask]), _f32(rho[mask]))
    assert float(masked) == pytest.approx(float(dropped), rel=1e-5, abs=1e-7)
    assert np.all(np.isfinite(np.asarray(grad)))
    assert np.all(np.asarray(grad)[~mask] == 0.0)


@pytest.mark.parametrize("loss", [kl_fair_loss, kl_distill_loss])
def test_kl_losses_are_scale_invariant(loss):
    theta, rho = _random_inputs(np.random.default_rng(5), (3, 8))
    rho[:, 0] = 1.0
    base = np.asarray(loss(_f32(theta), _f32(rho)))
    np.testing.assert_allclose(np.asarray(loss(_f32(theta * 7.5), _f32(rho))), base, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(loss(_f32(theta), _f32(rho * 0.03))), base, rtol=1e-5)


# -- finiteness: zeros, degenerate rows, gradients -----------------------------------------
@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_finite_values_and_grads_with_zero_exposures_and_degenerate_rows(loss):
    theta = _f32(
        [
            [1.0, 0.63, 0.5, 0.0, 0.0],  # deterministic top-3: zero exposures
            [0.0, 0.0, 0.0, 0.0, 0.0],  # all-zero exposure
            [0.3, 0.2, 0.1, 0.0, 0.0],  # zero relevance row
            [0.3, 0.2, 0.1, 0.4, 0.5],  # all masked
            [0.3, 0.2, 0.1, 0.4, 0.5],  # one valid doc: no pairs
        ]
    )
    rho = _f32(
        [
            [0.0, 1.0, 0.5, 1.0, 0.0],
            [1.0, 0.5, 0.0, 0.0, 1.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            [1.0, 1.0, 1.0, 1.0, 1.0],
            [1.0, 1.0, 1.0, 1.0, 1.0],
        ]
    )
    mask = np.ones((5, 5), bool)
    mask[3] = False
    mask[4, 1:] = False
    per_row, grad = _value_and_grad(loss, theta, rho, where=mask)
    assert np.all(np.isfinite(per_row))
    assert np.all(np.isfinite(np.asarray(grad)))
    assert per_row[3] == 0.0  # all masked
    if loss in (frac_fair_loss, prod_fair_loss):
        assert per_row[4] == 0.0  # a single valid doc: no pairs
    if loss in (kl_fair_loss, kl_distill_loss):
        assert abs(per_row[4]) < 1e-6  # a single doc: both normalise to (1,)
    if loss is not frac_fair_loss:
        assert per_row[2] == 0.0  # zero relevance / zero target


def test_losses_jit_and_grad_compose_over_a_batch():
    theta, rho = _random_inputs(np.random.default_rng(6), (4, 10))

    @jax.jit
    def total(t):
        return sum(jnp.mean(f(t, _f32(rho))) for f in ALL_LOSSES)

    grad = jax.grad(total)(_f32(theta))
    assert grad.shape == (4, 10) and np.all(np.isfinite(np.asarray(grad)))
