"""Position marginals (exponential-race quadrature, Rao-Blackwellised estimate) against
enumeration and float64 oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import marginals
from opl_rank import plackett_luce as pl
from tests import reference as ref


def _logits(key, shape, scale=1.0):
    return jax.random.normal(key, shape, jnp.float32) * scale


@pytest.mark.slow
@pytest.mark.parametrize("n_items,n_slots", [(5, 3), (6, 4)])
def test_exact_position_marginals_equal_enumeration(key, n_items, n_slots):
    for i, scale in enumerate([0.3, 1.0, 3.0, 10.0]):
        logits = _logits(jax.random.fold_in(key, i), (n_items,), scale)
        want = ref.pl_position_marginals(np.asarray(logits), n_slots)
        got = np.asarray(marginals.exact_position_marginals(logits, n_slots))
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(np.asarray(pl.enumerate_position_marginals(logits, n_slots)), want, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("n_items,n_slots", [(5, 3), (40, 2)])  # unrolled DP (custom VJP) and scan
def test_exact_position_marginal_gradients_equal_enumeration(key, n_items, n_slots):
    # The quadrature's Poisson-binomial DP has a hand-written reverse pass: check it
    # against autodiff of the enumerated marginals (small D) or central differences.
    logits = _logits(key, (n_items,), 1.5)
    cot = jax.random.normal(jax.random.fold_in(key, 1), (n_slots, n_items))
    got = jax.grad(lambda s: jnp.sum(cot * marginals.exact_position_marginals(s, n_slots)))(logits)
    if n_items <= 6:
        want = jax.grad(lambda s: jnp.sum(cot * pl.enumerate_position_marginals(s, n_slots)))(logits)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
    else:
        f = lambda s: float(jnp.sum(cot * marginals.exact_position_marginals(s, n_slots)))
        for d in (0, 7, 39):
            e = jnp.zeros(n_items).at[d].set(1e-2)
            numeric = (f(logits + e) - f(logits - e)) / 2e-2
            assert abs(float(got[d]) - numeric) < 2e-3, (d, float(got[d]), numeric)
    items = jnp.array([3, 0, 1])
    cot_items = cot[:, :3].T
    got_items = jax.grad(lambda s: jnp.sum(cot_items * marginals.exact_ranked_item_marginals(s, items, n_slots)))(logits)
    want_items = jax.grad(lambda s: jnp.sum(cot_items * marginals.exact_position_marginals(s, n_slots)[:, items].T))(logits)
    np.testing.assert_allclose(np.asarray(got_items), np.asarray(want_items), atol=2e-5)


@pytest.mark.slow
def test_exact_slot_marginals_are_the_diagonal_of_the_ranked_item_table(key):
    logits = _logits(key, (7, 9), 2.0)
    rankings = pl.sample_rankings(jax.random.fold_in(key, 1), logits, 4)
    table = marginals.exact_ranked_item_marginals(logits, rankings, 4)  # [7, 4, 4]
    want = jnp.diagonal(table, axis1=-2, axis2=-1)
    np.testing.assert_allclose(np.asarray(marginals.exact_slot_marginals(logits, rankings)), np.asarray(want), atol=1e-6)
    loss = lambda f: lambda s: jnp.sum(jnp.log(f(s)))
    g_slot = jax.grad(loss(lambda s: marginals.exact_slot_marginals(s, rankings)))(logits)
    g_table = jax.grad(loss(lambda s: jnp.diagonal(marginals.exact_ranked_item_marginals(s, rankings, 4), axis1=-2, axis2=-1)))(logits)
    np.testing.assert_allclose(np.asarray(g_slot), np.asarray(g_table), atol=1e-4)


def test_exact_position_marginals_with_mask(key):
    logits = _logits(key, (6,), 2.0)
    where = jnp.array([True, False, True, True, False, True])
    got = np.asarray(marginals.exact_position_marginals(logits, 3, where=where))
    want = ref.pl_position_marginals(np.asarray(logits), 3, mask=np.asarray(where))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.all(got[:, ~np.asarray(where)] == 0.0)


def test_estimated_position_marginals_within_002_and_exact_at_position_one(key):
    logits = _logits(key, (5,), 1.0)
    exact = ref.pl_position_marginals(np.asarray(logits), 3)
    est = np.asarray(marginals.estimate_position_marginals(jax.random.fold_in(key, 7), logits, 3, 1000))
    assert np.abs(est - exact).max() < 0.02
    np.testing.assert_allclose(est[0], exact[0], atol=1e-6)
    np.testing.assert_allclose(est.sum(-1), 1.0, atol=1e-5)


def test_estimated_position_marginals_unbiased_within_their_standard_error(key):
    """Many rows: every entry within 4.5 standard errors (its own per-sample spread), and
    a lower error than counting placements (Rao-Blackwellisation)."""
    logits = _logits(key, (6, 6), 1.5)
    n = 2000
    k = jax.random.fold_in(key, 3)
    samples = pl.sample_rankings(k, logits, 4, n_samples=n)
    per_sample = np.exp(np.asarray(pl.placement_log_probs(jnp.broadcast_to(logits, (n, 6, 6)), samples)))
    est = np.asarray(marginals.estimate_position_marginals(k, logits, 4, n))
    np.testing.assert_allclose(est, per_sample.mean(0), atol=1e-4)  # same samples (float32 mean)
    exact = np.stack([ref.pl_position_marginals(row, 4) for row in np.asarray(logits)])
    se = per_sample.std(0) / np.sqrt(n)
    assert np.all(np.abs(est - exact) <= 4.5 * se + 1e-6)
    counts = np.asarray(jax.nn.one_hot(samples, 6)).mean(0)
    assert ((est - exact) ** 2).mean() < 0.5 * ((counts - exact) ** 2).mean()


def test_position_marginals_reports_the_method(key):
    logits = _logits(key, (5,))
    exact = marginals.position_marginals(logits, 3)
    assert exact.method == "exact-quadrature" and exact.n_samples == 0
    est = marginals.position_marginals(logits, 3, key=key, n_samples=50, max_exact_cost=0)
    assert est.method == "estimated-rao-blackwell" and est.n_samples == 50
    with pytest.raises(ValueError, match="key is required"):
        marginals.position_marginals(logits, 3, method="estimate")
    with pytest.raises(ValueError, match="method"):
        marginals.position_marginals(logits, 3, method="magic")


def test_ranked_item_marginals_are_the_rows_of_the_full_table(key):
    logits = _logits(key, (3, 7), 2.0)
    items = jnp.array([[0, 6, 2], [1, 1, 5], [4, 3, 0]])
    got = marginals.exact_ranked_item_marginals(logits, items, 4)
    full = marginals.exact_position_marginals(logits, 4)  # [3, L, D]
    want = jnp.take_along_axis(jnp.swapaxes(full, -1, -2), items[..., None], axis=-2)
    np.testing.assert_allclose(got, want, atol=1e-6)
