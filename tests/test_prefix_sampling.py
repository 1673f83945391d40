"""The shared inverse-CDF prefix sampler and its shared normalisers against exact answers:
chi-square against enumerated PL prefix probabilities, float64 marginals, the per-sample
normalisers of plackett_luce (values and gradients), and an estimator's mean gradient
against the exact gradient of an enumerated expectation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from opl_rank import make_key
from opl_rank.pl import gradients as le
from opl_rank.pl import plackett_luce as pl
from opl_rank.pl import prefix_sampling as ps
from tests import reference as ref


def _codes(samples, n_items):
    codes = np.zeros(samples.shape[0], np.int64)
    for l in range(samples.shape[1]):
        codes = codes * n_items + samples[:, l]
    return codes


def _chi_square_pvalue(samples, logits, n_slots, mask=None):
    n_items = logits.shape[-1]
    valid = np.flatnonzero(np.ones(n_items, bool) if mask is None else mask)
    perms = ref.all_permutations(len(valid), min(n_slots, len(valid)))
    perms = [tuple(valid[list(p)]) for p in perms]
    probs = np.array([ref.pl_prefix_probs(logits, p, mask)[-1] for p in perms])
    counts = np.bincount(_codes(samples[:, : len(perms[0])], n_items), minlength=n_items ** len(perms[0]))
    observed = counts[_codes(np.array(perms), n_items)]
    assert observed.sum() == samples.shape[0], "a sample was not a valid prefix"
    return stats.chisquare(observed, probs * samples.shape[0] / probs.sum()).pvalue


def _draw(logits, n_slots, n, seed=0, where=None):
    rows = 100
    batch = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (rows, logits.shape[-1]))
    mask = None if where is None else jnp.broadcast_to(jnp.asarray(where), batch.shape)
    y = ps.sample_prefixes(make_key(seed), batch, n_slots, n // rows, where=mask)
    return np.asarray(y).reshape(-1, n_slots)


@pytest.mark.parametrize("n_items,n_slots,scale", [(5, 3, 1.0), (6, 4, 1.5), (7, 2, 4.0)])
def test_prefix_frequencies_match_exact_pl_probabilities(n_items, n_slots, scale):
    logits = np.asarray(jax.random.normal(make_key(n_items), (n_items,))) * scale
    samples = _draw(logits, n_slots, 200_000)
    assert _chi_square_pvalue(samples, logits, n_slots) > 1e-3
    # The test has power: the same samples reject slightly different logits.
    wrong = logits.copy()
    wrong[0] += 0.25
    assert _chi_square_pvalue(samples, wrong, n_slots) < 1e-6


def test_slot_marginals_match_float64_at_forty_items():
    """A real tail (36 items) and every way through it: removal of placed tail items."""
    logits = np.asarray(jax.random.normal(make_key(3), (40,))) * 1.5
    logits[5] = logits.max() - 0.1  # a heavy tail item next to the head
    samples = _draw(logits, 3, 200_000, seed=1)
    assert all(len(set(r)) == 3 for r in samples[:2000].tolist())
    # Exact slot marginals by summing over the first two slots (40 * 39 prefixes, float64).
    p = np.exp(logits - logits.max())
    first = p / p.sum()
    second = np.zeros(40)
    third = np.zeros(40)
    for a in range(40):
        rest = p.copy()
        rest[a] = 0.0
        p_b = rest / rest.sum()
        second += first[a] * p_b
        for b in range(40):
            if b == a:
                continue
            rest2 = rest.copy()
            rest2[b] = 0.0
            third += first[a] * p_b[b] * rest2 / rest2.sum()
    for slot, exact in enumerate((first, second, third)):
        freq = np.bincount(samples[:, slot], minlength=40) / len(samples)
        se = np.sqrt(exact * (1 - exact) / len(samples)) + 1e-12
        assert np.max(np.abs(freq - exact) / se) < 5.0, slot


def test_masks_padding_and_peaked_rows():
    logits = jnp.array([[5.0, 0.0, 3.0, 1.0, 9.0] + [0.0] * 35, [0.0] * 40, [300.0] + [0.0] * 38 + [-300.0]])
    where = jnp.ones((3, 40), bool).at[0, 4].set(False).at[1, 2:].set(False)
    y = np.asarray(ps.sample_prefixes(make_key(0), logits, 3, 500, where=where))
    assert all(len(set(r)) == 3 for r in y.reshape(-1, 3).tolist())  # no item twice
    assert 4 not in set(y[:, 0].ravel().tolist())  # a masked item is never drawn in row 1
    assert set(y[:, 1, :2].ravel().tolist()) == {0, 1}  # row 2: its two real items ...
    assert not np.any(np.asarray(where)[1, y[:, 1, 2]])  # ... then a padding item
    assert set(y[:, 2, 0].tolist()) == {0}  # row 3: the dominant item first, then the rest
    lp = ps.shared_slot_log_probs(logits, jnp.asarray(y), where=where)
    want = pl.slot_log_probs(
        jnp.broadcast_to(logits, (500, 3, 40)), jnp.asarray(y), where=jnp.broadcast_to(where, (500, 3, 40))
    )
    np.testing.assert_allclose(lp, want, atol=2e-5)
    assert np.all(np.asarray(lp)[:, 1, 2] == 0.0)  # padding has probability 1


@pytest.mark.parametrize("scale", [1.0, 30.0, 1e3, 1e4])
@pytest.mark.parametrize("n_items,n_slots", [(5, 3), (40, 2), (100, 4)])
def test_shared_normalisers_equal_the_per_sample_ones(n_items, n_slots, scale):
    """Values and gradients of the shared-normaliser form equal slot_log_probs' per-sample
    logit-difference form, and stay finite, at any logit scale."""
    k_logits, k_draw = jax.random.split(make_key(n_items))
    logits = jax.random.normal(k_logits, (3, n_items)) * scale
    y = ps.sample_prefixes(k_draw, logits, n_slots, 6)
    weights = jnp.arange(1.0, n_slots + 1.0).reshape(1, 1, n_slots)

    def shared(s):
        return jnp.sum(ps.shared_slot_log_probs(s, y) * weights)

    def per_sample(s):
        return jnp.sum(pl.slot_log_probs(jnp.broadcast_to(s, (6,) + s.shape), y) * weights)

    value, grad = jax.value_and_grad(shared)(logits)
    want_value, want_grad = jax.value_and_grad(per_sample)(logits)
    assert np.isfinite(float(value)) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5)


def test_score_function_gradient_through_the_prefix_sampler_is_unbiased():
    """``sampled_policy_gradient`` at D = 40, K = 2 routes through this sampler; its mean
    gradient over keys matches the exact gradient of the enumerated expectation."""
    assert ps.prefix_sampler(40, 2) == "inverse_cdf"
    logits = jax.random.normal(make_key(7), (2, 40))
    item_reward = jax.random.uniform(make_key(8), (40,))
    rankings = jnp.asarray(pl.all_rankings(40, 2))  # 1560 prefixes

    def reward_fn(r):  # a reward of the whole prefix (no per-item decomposition)
        return item_reward[r[..., 0]] + 0.5 * item_reward[r[..., 1]] * (r[..., 0] % 3 == 0).astype(jnp.float32)

    value = reward_fn(rankings)

    def exact(s):
        return jnp.sum(pl.enumerate_ranking_probs(s, rankings) * value[None, :])

    keys = jax.random.split(make_key(9), 2000)
    grads = jax.vmap(lambda k: jax.grad(lambda s: le.sampled_policy_gradient(s, reward_fn, 2, k, 8).sum())(logits))(
        keys
    )
    grads = np.asarray(grads, np.float64)
    z = np.abs(grads.mean(0) - np.asarray(jax.grad(exact)(logits))) / (
        grads.std(0, ddof=1) / np.sqrt(len(grads)) + 1e-7
    )
    assert z.max() < 4.5


def test_sampler_choice_and_input_errors():
    assert ps.prefix_sampler(100, 3) == "inverse_cdf"
    assert ps.prefix_sampler(10, 3) == "gumbel"  # few items: N x D Gumbel numbers are cheap
    assert ps.prefix_sampler(100, 10) == "gumbel"  # long prefixes: the per-slot work grows as K^2
    assert ps.prefix_sampler(10, 3, "inverse_cdf") == "inverse_cdf"
    with pytest.raises(ValueError, match="method"):
        ps.prefix_sampler(10, 3, "fast")
    with pytest.raises(ValueError, match="n_slots"):
        ps.sample_prefixes(make_key(0), jnp.zeros(4), 5, 2)
    with pytest.raises(ValueError, match="n_samples"):
        ps.sample_prefixes(make_key(0), jnp.zeros(4), 2, 0)


@pytest.mark.parametrize("name", ["standard", "placement", "marginalize_first", "marginalize_all", "exposure"])
def test_ltr_estimators_on_the_prefix_sampler_are_unbiased(name):
    """D = 20, K = 3 (the table sampler and shared normalisers, with a masked item): each
    estimator's mean gradient over keys against the exact gradient of the exact utility
    (position marginals by the exponential-race quadrature)."""
    from opl_rank.pl import marginals

    assert ps.prefix_sampler(20, 3) == "inverse_cdf"
    k_logits, k_rel = jax.random.split(make_key(21))
    logits = jax.random.normal(k_logits, (2, 20))
    rel = jax.random.uniform(k_rel, (2, 20), minval=-1.0, maxval=4.0)
    where = jnp.ones((2, 20), bool).at[1, 3].set(False)
    theta = 1.0 / jnp.log2(jnp.arange(2, 5, dtype=jnp.float32))

    def exact(s):
        marg = marginals.exact_position_marginals(s, 3, where=where)  # [2, K, D]
        return jnp.einsum("k,qkd,qd->", theta, marg, rel)

    keys = jax.random.split(make_key(1234), 2000)
    estimator = le.GRADIENT_ESTIMATORS[name]
    grads = jax.vmap(lambda k: jax.grad(lambda s: estimator(s, rel, theta, k, 8, where=where).sum())(logits))(keys)
    grads = np.asarray(grads, np.float64)
    assert np.all(np.isfinite(grads))
    se = grads.std(0, ddof=1) / np.sqrt(len(grads))
    z = np.abs(grads.mean(0) - np.asarray(jax.grad(exact)(logits), np.float64)) / (se + 1e-7)
    assert z.max() < 4.5


@pytest.mark.parametrize("n_items", [1, 7, 31, 32, 33, 100, 511, 512, 1000])
def test_search_counts_entries_at_or_below_the_target(n_items):
    table = jnp.sort(jax.random.uniform(make_key(n_items), (3, n_items)), axis=-1)
    table = table.at[:, n_items // 2 :].set(table[:, n_items // 2 : n_items // 2 + 1])  # ties
    targets = jnp.concatenate(
        [
            jax.random.uniform(make_key(1), (5, 3)) * 1.1 - 0.05,
            table[None, :, 0],
            table[None, :, n_items // 2],
            table[None, :, -1],
        ]
    )
    want = np.sum(np.asarray(table)[None] <= np.asarray(targets)[..., None], axis=-1)
    np.testing.assert_array_equal(ps._search(table, targets), want)
