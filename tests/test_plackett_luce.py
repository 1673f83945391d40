"""Plackett-Luce core against exact answers (enumeration, float64 loops, closed forms)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from opl_rank import make_key
from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl
from tests import reference as ref


def _logits(key, shape, scale=1.0):
    return jax.random.normal(key, shape, jnp.float32) * scale


# -- sampling ------------------------------------------------------------------------------
def _ranking_frequencies(samples, n_items):
    codes = np.zeros(samples.shape[0], np.int64)
    for l in range(samples.shape[1]):
        codes = codes * n_items + samples[:, l]
    return codes


def _chi_square_pvalue(samples, logits, n_items, n_slots):
    perms = ref.all_permutations(n_items, n_slots)
    probs = np.array([ref.pl_prefix_probs(logits, p)[-1] for p in perms])
    perm_codes = _ranking_frequencies(np.array(perms), n_items)
    counts = np.bincount(_ranking_frequencies(samples, n_items), minlength=n_items**n_slots)
    observed = counts[perm_codes]
    assert observed.sum() == samples.shape[0], "a sample was not a valid L-permutation"
    return stats.chisquare(observed, probs * samples.shape[0] / probs.sum()).pvalue


@pytest.mark.parametrize("n_items", [5, 20])  # the argmax loop (D <= 16) and lax.top_k
def test_sampling_frequencies_match_exact_pl_probabilities(key, n_items):
    n_slots = 3 if n_items == 5 else 2
    logits = np.asarray(_logits(key, (n_items,), 1.0))
    samples = np.asarray(
        pl.sample_rankings(jax.random.fold_in(key, 1), jnp.asarray(logits), n_slots, n_samples=100_000)
    )
    assert samples.shape == (100_000, n_slots) and samples.dtype == np.int32
    assert _chi_square_pvalue(samples, logits, n_items, n_slots) > 1e-3
    # The test has power: the same samples reject slightly different logits.
    wrong = logits.copy()
    wrong[0] += 0.25
    assert _chi_square_pvalue(samples, wrong, n_items, n_slots) < 1e-6


@pytest.mark.parametrize("n_items", [2, 10, 16])
def test_one_slot_samples_are_the_first_slot_of_longer_ones(key, n_items):
    # One slot takes the chained argmax (reductions.first_argmax_short), two or more the
    # argmax loop: the same Gumbel draws must give the same first item, masks and ties included.
    logits = np.round(np.asarray(_logits(key, (3, 50, n_items), 2.0)))  # ties among logits
    where = np.array(jax.random.bernoulli(jax.random.fold_in(key, 2), 0.7, logits.shape))
    where[..., 0] = True
    for mask in (None, jnp.asarray(where)):
        one = pl.sample_rankings(jax.random.fold_in(key, 3), jnp.asarray(logits), 1, where=mask, n_samples=4)
        two = pl.sample_rankings(jax.random.fold_in(key, 3), jnp.asarray(logits), 2, where=mask, n_samples=4)
        np.testing.assert_array_equal(np.asarray(one)[..., 0], np.asarray(two)[..., 0])
        if mask is not None:
            assert np.take_along_axis(np.broadcast_to(where, (4,) + where.shape), np.asarray(one), -1).all()


def test_sampling_works_with_threefry_and_philox_keys():
    logits = jnp.zeros(6)
    for key in (jax.random.PRNGKey(0), make_key(0, "threefry2x32"), make_key(0)):
        r = np.asarray(pl.sample_rankings(key, logits, 4, n_samples=10))
        assert r.shape == (10, 4)
        assert all(len(set(row)) == 4 for row in r.tolist())


def test_masked_items_are_never_sampled_before_valid_ones(key):
    logits = jnp.array([[5.0, 0.0, 3.0, 1.0, 9.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    where = jnp.array([[True, False, True, True, False], [True, True, False, False, False]])
    r = np.asarray(pl.sample_rankings(key, logits, 3, where=where, n_samples=2000))
    assert set(r[:, 0, :].ravel().tolist()) <= {0, 2, 3}
    # Row 2 has two valid items: they fill slots 1-2, a padding item fills slot 3.
    assert set(r[:, 1, :2].ravel().tolist()) <= {0, 1}
    assert set(r[:, 1, 2].tolist()) <= {2, 3, 4}
    assert all(len(set(row)) == 3 for row in r.reshape(-1, 3).tolist())


def test_sample_rankings_rejects_bad_length(key):
    with pytest.raises(ValueError, match="n_slots"):
        pl.sample_rankings(key, jnp.zeros(4), 5)


# -- probabilities of rankings -------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0])
def test_prefix_log_probs_equal_enumeration(key, scale):
    logits = _logits(key, (5,), scale)
    rankings = pl.all_rankings(5, 3)
    got = np.exp(np.asarray(pl.prefix_log_probs(jnp.broadcast_to(logits, (60, 5)), jnp.asarray(rankings))))
    want = np.stack([ref.pl_prefix_probs(np.asarray(logits), r) for r in rankings])
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(got[:, -1].sum(), 1.0, atol=1e-5)


def test_prefix_log_probs_closed_form():
    # logits (1, 2, 3), ranking (2, 0): e^3/(e+e^2+e^3), then e^1/(e+e^2).
    lp = np.asarray(pl.prefix_log_probs(jnp.array([1.0, 2.0, 3.0]), jnp.array([2, 0])))
    first = 3 - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    np.testing.assert_allclose(lp, [first, first + 1 - math.log(math.exp(1) + math.exp(2))], rtol=1e-6)


def test_full_ranking_log_prob_matches_plackett_luce_likelihood_of_rax_form(key):
    # Full ranking: log pi = sum_l s_l - logsumexp(s_{l:}) in ranked order (ListMLE form).
    logits = _logits(key, (6,), 2.0)
    ranking = jnp.array([3, 1, 5, 0, 2, 4])
    s = np.asarray(logits, np.float64)[np.asarray(ranking)]
    want = sum(s[l] - np.log(np.exp(s[l:]).sum()) for l in range(6))
    np.testing.assert_allclose(float(pl.prefix_log_probs(logits, ranking)[-1]), want, rtol=1e-5)


def test_masked_item_equals_dropping_it(key):
    logits = _logits(key, (6,))
    where = jnp.array([True, True, False, True, True, True])
    rankings = jnp.array([[0, 1, 3], [5, 4, 3], [3, 0, 5]])
    got = pl.prefix_log_probs(jnp.broadcast_to(logits, (3, 6)), rankings, where=jnp.broadcast_to(where, (3, 6)))
    kept = np.array([0, 1, 3, 4, 5])
    relabel = {int(d): i for i, d in enumerate(kept)}
    sub = jnp.asarray(np.asarray(logits)[kept])
    sub_rankings = jnp.array([[relabel[int(d)] for d in row] for row in np.asarray(rankings)])
    want = pl.prefix_log_probs(jnp.broadcast_to(sub, (3, 5)), sub_rankings)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_placement_probabilities_are_conditional_pl(key):
    logits = _logits(key, (7,), 2.0)
    ranking = jnp.array([4, 0, 6, 2])
    place = np.exp(np.asarray(pl.placement_log_probs(logits, ranking)))
    assert place.shape == (4, 7)
    np.testing.assert_allclose(place.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(place[0], np.asarray(jax.nn.softmax(logits)), atol=1e-6)
    for l in range(1, 4):
        assert np.all(place[l, np.asarray(ranking[:l])] == 0.0)
    # The placed item's placement probability is the slot factor.
    slot = np.exp(np.asarray(pl.slot_log_probs(logits, ranking)))
    np.testing.assert_allclose(place[np.arange(4), np.asarray(ranking)], slot, rtol=1e-5)


# -- numerical robustness --------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e2, 1e4])
def test_no_nan_or_inf_at_large_logit_scales(key, scale):
    logits = _logits(key, (3, 8), scale)
    where = jnp.array([[True] * 8, [True, False] * 4, [True, True, False, False, False, False, False, False]])
    rankings = pl.sample_rankings(key, logits, 4, where=where)
    checks = {
        "prefix": pl.prefix_log_probs(logits, rankings, where=where),
        "placement": jnp.exp(pl.placement_log_probs(logits, rankings, where=where)),
        "exact marginals": marginals.exact_position_marginals(logits, 4, where=where),
        "estimated marginals": marginals.estimate_position_marginals(key, logits, 4, 16, where=where),
    }
    for name, value in checks.items():
        assert bool(jnp.all(jnp.isfinite(value))), name
    grads = {
        "prefix": jax.grad(lambda s: pl.prefix_log_probs(s, rankings, where=where).sum())(logits),
        "placement": jax.grad(lambda s: jnp.exp(pl.placement_log_probs(s, rankings, where=where)).sum())(logits),
        "exact marginals": jax.grad(lambda s: (marginals.exact_position_marginals(s, 4, where=where) ** 2).sum())(
            logits
        ),
    }
    for name, value in grads.items():
        assert bool(jnp.all(jnp.isfinite(value))), f"gradient of {name}"
    # Probabilities stay probabilities.
    assert bool(jnp.all(checks["prefix"] <= 0.0))
    np.testing.assert_allclose(jnp.sum(checks["exact marginals"][0], -1), 1.0, atol=1e-5)


def test_precision_at_large_logits_with_ties():
    # Items 0,1 tie far above 2,3 which tie far above 4,5: every probability is 1/2 or 1.
    logits = jnp.array([1e4, 1e4, 0.0, 0.0, -1e4, -1e4])
    lp = np.exp(np.asarray(pl.prefix_log_probs(logits, jnp.array([1, 0, 3, 2]))))
    np.testing.assert_allclose(lp, [0.5, 0.5, 0.25, 0.25], rtol=1e-6)
    marg = np.asarray(marginals.exact_position_marginals(logits, 4))
    np.testing.assert_allclose(
        marg[:, :4], [[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5]], atol=1e-6
    )


def test_neg_inf_logits_and_all_masked_rows_stay_finite(key):
    logits = jnp.array([[0.0, -jnp.inf, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    where = jnp.array([[True, True, True, True], [False, False, False, False]])
    rankings = pl.sample_rankings(key, logits, 3, where=where)
    assert 1 not in np.asarray(rankings[0]).tolist()
    lp = pl.prefix_log_probs(logits, rankings, where=where)
    assert bool(jnp.all(jnp.isfinite(lp)))
    np.testing.assert_array_equal(np.asarray(lp[1]), 0.0)  # nothing valid: all padding
    g = jax.grad(lambda s: pl.prefix_log_probs(s, rankings, where=where).sum())(logits)
    assert bool(jnp.all(jnp.isfinite(g)))
    assert bool(jnp.all(jnp.isfinite(marginals.exact_position_marginals(logits, 3, where=where))))


# -- shapes and transformations --------------------------------------------------------------
def test_batch_dims_and_vmap_agree(key):
    logits = _logits(key, (2, 3, 6))
    rankings = pl.sample_rankings(key, logits, 3)
    assert rankings.shape == (2, 3, 3)
    batched = pl.prefix_log_probs(logits, rankings)
    mapped = jax.vmap(jax.vmap(pl.prefix_log_probs))(logits, rankings)
    np.testing.assert_allclose(batched, mapped, atol=1e-6)
    jitted = jax.jit(pl.placement_log_probs)(logits, rankings)
    np.testing.assert_allclose(jitted, pl.placement_log_probs(logits, rankings), atol=1e-6)


def test_all_rankings_enumerates_l_permutations():
    r = pl.all_rankings(5, 3)
    assert r.shape == (60, 3)
    assert len({tuple(row) for row in r.tolist()}) == 60
    assert all(len(set(row)) == 3 for row in r.tolist())
    with pytest.raises(ValueError, match="too many"):
        pl.all_rankings(30, 10)
    with pytest.raises(ValueError, match="n_slots"):
        pl.all_rankings(3, 4)


# -- sums over the sample axis ---------------------------------------------------------------
@pytest.mark.parametrize("n_samples", [1, 2, 8, 65])  # 65: past the unrolled chain
def test_sample_axis_sums_and_tiling_match_jnp(key, n_samples):
    x = _logits(key, (n_samples, 3, 7))
    np.testing.assert_allclose(pl.sum_samples(x), jnp.sum(x, axis=0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pl.mean_samples(x), jnp.mean(x, axis=0), rtol=1e-6, atol=1e-7)
    w = _logits(jax.random.fold_in(key, 1), (3, 7))
    weight = _logits(jax.random.fold_in(key, 2), (n_samples, 3, 7))
    tiled = pl.tile_samples(w, n_samples)
    assert tiled.shape == (n_samples, 3, 7)
    np.testing.assert_array_equal(tiled, jnp.broadcast_to(w, tiled.shape))
    want = jax.grad(lambda v: jnp.sum(jnp.sin(jnp.broadcast_to(v, tiled.shape)) * weight))(w)
    got = jax.grad(lambda v: jnp.sum(jnp.sin(pl.tile_samples(v, n_samples)) * weight))(w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
