"""Position marginals (exponential-race quadrature, Rao-Blackwellised estimate) against
enumeration and float64 oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl
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
    got_items = jax.grad(lambda s: jnp.sum(cot_items * marginals.exact_ranked_item_marginals(s, items, n_slots)))(
        logits
    )
    want_items = jax.grad(lambda s: jnp.sum(cot_items * marginals.exact_position_marginals(s, n_slots)[:, items].T))(
        logits
    )
    np.testing.assert_allclose(np.asarray(got_items), np.asarray(want_items), atol=2e-5)


@pytest.mark.slow
def test_exact_slot_marginals_are_the_diagonal_of_the_ranked_item_table(key):
    logits = _logits(key, (7, 9), 2.0)
    rankings = pl.sample_rankings(jax.random.fold_in(key, 1), logits, 4)
    table = marginals.exact_ranked_item_marginals(logits, rankings, 4)  # [7, 4, 4]
    want = jnp.diagonal(table, axis1=-2, axis2=-1)
    np.testing.assert_allclose(
        np.asarray(marginals.exact_slot_marginals(logits, rankings)), np.asarray(want), atol=1e-6
    )
    loss = lambda f: lambda s: jnp.sum(jnp.log(f(s)))
    g_slot = jax.grad(loss(lambda s: marginals.exact_slot_marginals(s, rankings)))(logits)
    g_table = jax.grad(
        loss(lambda s: jnp.diagonal(marginals.exact_ranked_item_marginals(s, rankings, 4), axis1=-2, axis2=-1))
    )(logits)
    np.testing.assert_allclose(np.asarray(g_slot), np.asarray(g_table), atol=1e-4)


@pytest.mark.parametrize("scale", [0.5, 3.0, 30.0])
def test_exact_slot_marginals_equal_enumeration_in_value_and_gradient(key, scale):
    """The batched own-slot quadrature (D <= 32, its own reverse pass) against the enumerated
    marginals of 5 items, length 3: likely and unlikely rankings, a masked item, logits up to
    30x apart (to 2e-8 absolute, the mass below the first node; no NaN in the gradient)."""
    n_items, n_slots = 5, 3
    logits = _logits(jax.random.fold_in(key, 7), (6, n_items), scale)
    where = jnp.ones((6, n_items), bool).at[0, 4].set(False).at[3, 1].set(False)
    sampled = pl.sample_rankings(jax.random.fold_in(key, 8), logits, n_slots, where=where)
    uniform = pl.sample_rankings(jax.random.fold_in(key, 9), jnp.zeros_like(logits), n_slots, where=where)
    rankings = jnp.concatenate([sampled[:3], uniform[3:]])  # three likely, three arbitrary
    cot = jax.random.normal(jax.random.fold_in(key, 10), rankings.shape)

    def enumerated(s):
        table = pl.enumerate_position_marginals(s, n_slots, where=where)  # [n, L, D]
        return jnp.take_along_axis(table, rankings[:, :, None], axis=-1)[..., 0]

    got = marginals.exact_slot_marginals(logits, rankings, where=where)
    np.testing.assert_allclose(np.asarray(got), np.asarray(enumerated(logits)), atol=1e-6)
    oracle = np.array(  # float64 enumeration: relative accuracy where the marginal is tiny
        [
            ref.pl_position_marginals(np.asarray(logits[i]), n_slots, np.asarray(where[i]))[
                np.arange(n_slots), np.asarray(rankings[i])
            ]
            for i in range(6)
        ]
    )
    np.testing.assert_allclose(np.asarray(got), oracle, rtol=2e-5, atol=2e-8)  # the nodes start at v = e^-18
    loss = lambda f: lambda s: jnp.sum(cot * f(s))
    g = jax.grad(loss(lambda s: marginals.exact_slot_marginals(s, rankings, where=where)))(logits)
    want = jax.grad(loss(enumerated))(logits)
    assert bool(jnp.all(jnp.isfinite(g)))
    np.testing.assert_allclose(np.asarray(g), np.asarray(want), atol=2e-5)


def test_one_minus_exp_is_accurate_in_relative_terms_at_every_rate():
    """The quadrature's ``P(j finished by v) = 1 - e^-rate`` without expm1: a series below
    ``_SERIES_MAX_RATE`` (no cancellation at small rates), ``1 - e^-rate`` above."""
    rate = np.concatenate([np.logspace(-30, 2, 2000), [0.0, 0.4999999, 0.5, 0.5000001]]).astype(np.float32)
    stay = jnp.exp(-jnp.asarray(rate))
    got = np.asarray(marginals._one_minus_exp(jnp.asarray(rate), stay), np.float64)
    np.testing.assert_allclose(got, -np.expm1(-rate.astype(np.float64)), rtol=3e-7, atol=0.0)


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


def _race_marginal_float64(logits, item, slot, n_slots):
    """Oracle for one item's slot marginal: the race integral by a 3000-node float64 rule."""
    s = np.asarray(logits, np.float64)
    others = np.array([j for j in range(s.size) if j != item and np.isfinite(s[j])])
    log_v = np.linspace(-45.0, 5.0, 3000)
    v = np.exp(log_v)
    rate = np.exp(s[others] - s[item])[:, None] * v[None, :]
    stay, done = np.exp(-rate), -np.expm1(-rate)
    pmf = np.zeros((n_slots, v.size))
    pmf[0] = 1.0
    for j in range(others.size):
        pmf[1:] = pmf[1:] * stay[j] + pmf[:-1] * done[j]
        pmf[0] *= stay[j]
    return float(np.sum((log_v[1] - log_v[0]) * v * np.exp(-v) * pmf[slot]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "n_items,n_slots,scale",
    [
        # 20-30 s each: with the scale checks in the extended set (the default suite checks the
        # shared grid against the per-item rule at D = 50)
        pytest.param(40, 6, 1.0, marks=pytest.mark.extended),
        pytest.param(120, 10, 1.0, marks=pytest.mark.extended),
        pytest.param(70, 5, 10.0, marks=pytest.mark.extended),
    ],
)
def test_shared_grid_slot_marginals_equal_a_float64_oracle(key, n_items, n_slots, scale):
    """Above 32 items the logged items share one quadrature grid (the items outside the
    ranking: recursion for the largest, moments beyond); at scale 10 the logits spread too
    far for the first grid and the wider one (or the per-item rule) takes over."""
    logits = _logits(key, (3, n_items), scale)
    where = jnp.ones((3, n_items), bool).at[1, :5].set(False)
    rankings = pl.sample_rankings(jax.random.fold_in(key, 1), logits, n_slots, where=where)
    got = np.asarray(marginals.exact_slot_marginals(logits, rankings, where=where))
    masked = np.where(np.asarray(where), np.asarray(logits), -np.inf)
    want = np.array(
        [[_race_marginal_float64(masked[i], int(rankings[i, l]), l, n_slots) for l in range(n_slots)] for i in range(3)]
    )
    np.testing.assert_allclose(got, want, rtol=5e-5, atol=2e-7)
    # The same function as the per-item rule (up to that rule's coarser step), gradients too.
    valid = jnp.asarray(where)
    per_item = marginals._per_item_slot_marginals(logits, valid, rankings)
    np.testing.assert_allclose(got, np.asarray(per_item), rtol=2e-3, atol=1e-5)
    cot = jax.random.normal(jax.random.fold_in(key, 2), rankings.shape)
    g_new = jax.grad(lambda s: jnp.sum(cot * marginals.exact_slot_marginals(s, rankings, where=where)))(logits)
    g_old = jax.grad(lambda s: jnp.sum(cot * marginals._per_item_slot_marginals(s, valid, rankings)))(logits)
    np.testing.assert_allclose(np.asarray(g_new), np.asarray(g_old), atol=2e-3 * float(jnp.abs(g_old).max()))


def test_shared_grid_falls_back_for_repeated_items_and_wide_spreads(key):
    logits = _logits(key, (2, 50), 1.0)
    rankings = jnp.array([[3, 7, 3, 9], [1, 2, 4, 8]])  # row 0 repeats an item: per-item rule
    valid = jnp.ones((2, 50), bool)
    outside = marginals._outside_ranking(logits, valid, rankings)
    top = marginals._top_outside(outside, 4)
    assert int(marginals._shared_grid_tier(logits, valid, rankings, top)) == len(marginals._SHARED_GRID_NODES)
    np.testing.assert_allclose(
        np.asarray(marginals.exact_slot_marginals(logits, rankings)),
        np.asarray(marginals._per_item_slot_marginals(logits, valid, rankings)),
        atol=1e-7,
    )
    wide = logits.at[0, 7].add(30.0)  # one logged item far above the rest: the 256-node grid
    rankings = rankings.at[0, 2].set(11)
    top = marginals._top_outside(marginals._outside_ranking(wide, valid, rankings), 4)
    assert int(marginals._shared_grid_tier(wide, valid, rankings, top)) == 1
    assert bool(jnp.all(jnp.isfinite(marginals.exact_slot_marginals(wide, rankings))))


SLOT_ESTIMATORS = {  # (key, logits, rankings, where) -> estimate
    "prefix": lambda k, s, r, where=None: marginals.sampled_slot_marginals(k, s, r, 4, where=where),
    "insertion": lambda k, s, r, where=None: marginals.insertion_slot_marginals(k, s, r, 1, where=where),
    "insertion-loo": lambda k, s, r, where=None: marginals.insertion_slot_marginals(
        k, s, r, 2, where=where, baseline="leave-one-out"
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("estimator", sorted(SLOT_ESTIMATORS))
@pytest.mark.parametrize("n_items", [5, 20])  # Gumbel top-L and the inverse-CDF table (D >= 16)
def test_sampled_slot_marginals_unbiased_in_value_and_gradient(key, n_items, estimator):
    """The estimates of the logged items' own-slot marginals that the learners use at
    large D (sampled prefixes, and the item inserted into the others' order): the mean over
    many draws equals the enumerated marginal, and the mean of the gradient the exact
    gradient, within 4 standard errors (and slot 1 is exact). Row 1 has a masked item, row 2
    only 3 valid items for its 3 slots."""
    n_slots, n_draws = 3, 6000
    logits = _logits(key, (4, n_items), 1.2)
    where = jnp.ones((4, n_items), bool).at[1, 4].set(False)
    where = where.at[2, 3:].set(False)
    rankings = pl.sample_rankings(jax.random.fold_in(key, 1), logits, n_slots, where=where)
    enumerated = pl.enumerate_position_marginals(logits, n_slots, where=where)  # [4, L, D]
    want = np.asarray(jnp.take_along_axis(enumerated, rankings[:, :, None], axis=-1)[..., 0], np.float64)
    cot = jax.random.normal(jax.random.fold_in(key, 2), rankings.shape)
    exact_grad = np.asarray(
        jax.grad(lambda s: jnp.sum(cot * marginals.exact_slot_marginals(s, rankings, where=where)))(logits)
    )

    def draw(k):
        value_of = lambda s: SLOT_ESTIMATORS[estimator](k, s, rankings, where=where)
        return value_of(logits), jax.grad(lambda s: jnp.sum(cot * value_of(s)))(logits)

    values, grads = jax.jit(jax.vmap(draw))(jax.random.split(jax.random.fold_in(key, 3), n_draws))
    values, grads = np.asarray(values, np.float64), np.asarray(grads, np.float64)
    np.testing.assert_allclose(values[:, :, 0], np.broadcast_to(want[:, 0], values[:, :, 0].shape), atol=1e-6)
    for got, exact in ((values, want), (grads, exact_grad)):
        se = got.std(0, ddof=1) / np.sqrt(n_draws)
        assert np.all(np.abs(got.mean(0) - exact) <= 4.0 * se + 2e-6), np.abs(got.mean(0) - exact) / (se + 1e-12)


def test_insertion_estimate_keeps_any_leading_batch_shape(key):
    # The estimator flattens the rows internally; [2, 3] rows give the [6] rows' answer.
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8))
    rankings = jnp.argsort(-logits, axis=-1)[..., :4]
    shaped = marginals.insertion_slot_marginals(key, logits, rankings, 2)
    flat = marginals.insertion_slot_marginals(key, logits.reshape(6, 8), rankings.reshape(6, 4), 2)
    assert shaped.shape == (2, 3, 4)
    np.testing.assert_array_equal(np.asarray(shaped).reshape(6, 4), np.asarray(flat))


def test_insertion_estimate_has_lower_variance_than_sampled_prefixes(key):
    """Inserting the logged item into the others' order conditions on more than a sampled
    prefix does: at D = 30, L = 6 one sample with the logged-order baseline has a lower
    variance of the value and of the gradient than 8 sampled prefixes (docs/performance.md
    §15 measures 1/14 and 1/4 at D = 100, L = 10)."""
    n_items, n_slots, n_draws = 30, 6, 300
    logits = _logits(key, (8, n_items), 1.5)
    rankings = pl.sample_rankings(jax.random.fold_in(key, 1), 0.5 * logits, n_slots)
    cot = jax.random.normal(jax.random.fold_in(key, 2), rankings.shape)
    settings = {
        "prefix": lambda k, s: marginals.sampled_slot_marginals(k, s, rankings, 8),
        "insertion": lambda k, s: marginals.insertion_slot_marginals(k, s, rankings, 1),
    }
    spread = {}
    for name, estimate in settings.items():

        def draw(k):
            return estimate(k, logits), jax.grad(lambda s: jnp.sum(cot * estimate(k, s)))(logits)

        values, grads = jax.jit(jax.vmap(draw))(jax.random.split(jax.random.fold_in(key, 3), n_draws))
        spread[name] = (float(jnp.mean(jnp.var(values, 0))), float(jnp.mean(jnp.var(grads, 0))))
    assert spread["insertion"][0] < spread["prefix"][0] / 3, spread
    assert spread["insertion"][1] < spread["prefix"][1], spread
    with pytest.raises(ValueError, match="baseline"):
        marginals.insertion_slot_marginals(key, logits, rankings, 2, baseline="mean")
    with pytest.raises(ValueError, match="n_samples"):
        marginals.insertion_slot_marginals(key, logits, rankings, 1, baseline="leave-one-out")


@pytest.mark.parametrize("scale", [1.0, 30.0, 1e3])
def test_insertion_estimate_is_finite_and_exact_where_the_policy_is_nearly_deterministic(key, scale):
    """At large logit scales every sum is of positive terms shifted by its own largest
    logit: no NaN or inf in value or gradient, and at scale 1e3 (a deterministic policy) the
    estimate equals the exact marginals (0 or 1) whatever the draw."""
    n_items, n_slots = 40, 10
    logits = _logits(key, (6, n_items), scale)
    where = jnp.ones((6, n_items), bool).at[0, :35].set(False)  # row 0: 5 valid items, 10 slots
    rankings = jnp.concatenate(
        [
            pl.sample_rankings(jax.random.fold_in(key, 1), logits[:3] / scale, n_slots, where=where[:3]),
            pl.sample_rankings(jax.random.fold_in(key, 4), logits[3:], n_slots, where=where[3:]),  # the policy's own
        ]
    )
    cot = jax.random.normal(jax.random.fold_in(key, 2), rankings.shape)
    value_of = lambda s: marginals.insertion_slot_marginals(jax.random.fold_in(key, 3), s, rankings, 2, where=where)
    value, grad = jax.value_and_grad(lambda s: jnp.sum(cot * value_of(s)))(logits)
    assert np.isfinite(float(value)) and bool(jnp.all(jnp.isfinite(grad)))
    got = value_of(logits)
    assert bool(jnp.all((got >= -1e-6) & (got <= 1 + 1e-6)))
    if scale >= 1e3:
        want = marginals.exact_slot_marginals(logits, rankings, where=where)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_slot_marginal_method_is_chosen_by_cost():
    assert marginals.slot_marginal_method(5, 3) == "exact"  # the paper's grids: exact
    assert marginals.slot_marginal_method(10, 5) == "exact"
    assert marginals.slot_marginal_method(100, 10) == "sampled"
    assert marginals.slot_marginal_method(100, 10, method="exact") == "exact"
    assert marginals.slot_marginal_cost(100, 10, "exact") > marginals.slot_marginal_cost(100, 10, "sampled")
    with pytest.raises(ValueError, match="method"):
        marginals.slot_marginal_method(5, 3, method="magic")
