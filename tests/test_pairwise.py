"""The unbiased pairwise loss against exact expectations over examination outcomes."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.ltr.pairwise import (
    correction_matrix,
    expected_distortion,
    pairwise_loss,
    unbiased_pairwise_loss,
)
from simulators.clicks import ClickModel

K = 5


def _examination_outcomes(model: ClickModel):
    """Every examination vector of a K-list with its probability."""
    theta = np.asarray(model.examination(), np.float64)
    if model.browsing == "independent":
        for e in itertools.product([0, 1], repeat=model.n_positions):
            e = np.array(e, bool)
            yield e, float(np.prod(np.where(e, theta, 1 - theta)))
    else:
        probs = np.asarray(model.last_examined_probs(), np.float64)
        for d, prob in enumerate(probs):  # d = 0 .. K
            yield np.arange(1, model.n_positions + 1) <= d, float(prob)


def _tiny_lists(n=3):
    rng = np.random.default_rng(0)
    scores = jnp.asarray(rng.normal(size=(n, K)) * 2, jnp.float32)
    relevant = jnp.asarray([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1], [1, 1, 1, 0, 0]][:n], bool)
    return scores, relevant


def _custom_family(f_i, f_j):  # non-zero l11 and l00: exercises the all-pairs path
    d = f_i - f_j
    return jnp.stack([0.3 * d**2, jax.nn.softplus(-d), jax.nn.softplus(d) + 0.1 * d, 0.5 * jnp.tanh(d)], axis=-1)


def test_correction_matrix_inverts_the_expected_distortion():
    p_i, p_j = jnp.array([0.9, 0.3, 1.0]), jnp.array([0.5, 0.2, 0.25])
    for p_ij in (p_i * p_j, jnp.minimum(p_i, p_j)):
        a = correction_matrix(p_i, p_j, p_ij)
        b = expected_distortion(p_i, p_j, p_ij)
        np.testing.assert_allclose(np.asarray(a @ b), np.broadcast_to(np.eye(4), (3, 4, 4)), atol=1e-5)
    with pytest.raises(ValueError, match="correction must be one of"):
        correction_matrix(p_i, p_j, p_i, correction="full")


@pytest.mark.slow
@pytest.mark.parametrize("browsing", ["independent", "continuous"])
@pytest.mark.parametrize("pair_loss", ["ranknet", "hinge", _custom_family], ids=["ranknet", "hinge", "custom"])
def test_expected_debiased_loss_equals_the_loss_on_true_relevance(browsing, pair_loss):
    """Exact: sum over every examination outcome of P(e) * loss(clicks = e * r)."""
    model = ClickModel(browsing, K, eta=1.0)
    scores, relevant = _tiny_lists()
    p, p_joint = model.examination(), model.joint_examination()
    truth = np.asarray(pairwise_loss(scores, relevant, pair_loss=pair_loss))
    outcomes = list(_examination_outcomes(model))
    n = scores.shape[0]
    # every outcome of every list as one batch: [outcomes * n, K]
    clicks = jnp.concatenate([relevant & jnp.asarray(e)[None, :] for e, _ in outcomes])
    tiled = jnp.tile(scores, (len(outcomes), 1))
    probs = np.array([prob for _, prob in outcomes])
    expected = {}
    for c in ("joint", "none", "individual"):
        losses = np.asarray(
            unbiased_pairwise_loss(tiled, clicks, p, p_joint, pair_loss=pair_loss, correction=c)
        ).reshape(len(outcomes), n)
        expected[c] = probs @ losses
    np.testing.assert_allclose(expected["joint"], truth, rtol=1e-4, atol=1e-4)
    # the naive click loss and the individual-only correction are biased here (the test can fail)
    assert np.max(np.abs(expected["none"] - truth)) > 0.1
    assert np.max(np.abs(expected["individual"] - truth)) > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("browsing", ["independent", "continuous"])
def test_expected_debiased_gradient_equals_the_true_gradient(browsing):
    model = ClickModel(browsing, K)
    scores, relevant = _tiny_lists()
    p, p_joint = model.examination(), model.joint_examination()
    true_grad = jax.grad(lambda s: jnp.sum(pairwise_loss(s, relevant)))(scores)
    outcomes = list(_examination_outcomes(model))
    clicks = jnp.stack([relevant & jnp.asarray(e)[None] for e, _ in outcomes])  # [O, n, K]
    probs = jnp.asarray([prob for _, prob in outcomes], jnp.float32)

    def expected_loss(s):  # sum_o P(o) * loss(clicks_o), differentiated once
        per_outcome = jax.vmap(lambda c: jnp.sum(unbiased_pairwise_loss(s, c, p, p_joint)))(clicks)
        return jnp.sum(probs * per_outcome)

    expected = np.asarray(jax.grad(expected_loss)(scores))
    np.testing.assert_allclose(expected, np.asarray(true_grad), atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("browsing", ["independent", "continuous"])
def test_monte_carlo_debiased_loss_within_four_standard_errors(browsing):
    model = ClickModel(browsing, K)
    scores, relevant = _tiny_lists(1)
    n = 40_000
    rel_prob = jnp.broadcast_to(relevant.astype(jnp.float32), (n, K)) * 0.8  # random relevance, P = 0.8 where labelled
    clicks, examined, rel = model.sample_clicks(make_key(0), rel_prob)
    assert np.all(np.asarray(clicks) == np.asarray(examined & rel))
    np.testing.assert_allclose(np.asarray(examined).mean(0), np.asarray(model.examination()), atol=0.015)
    tiled = jnp.broadcast_to(scores, (n, K))
    debiased = np.asarray(unbiased_pairwise_loss(tiled, clicks, model.examination(), model.joint_examination()))
    on_truth = np.asarray(pairwise_loss(tiled, rel))  # same relevance draws: paired
    diff = debiased - on_truth
    assert abs(diff.mean()) < 4 * diff.std(ddof=1) / np.sqrt(n)
    # the other browsing model's joint probabilities: biased (the joint term matters)
    other = ClickModel({"independent": "continuous", "continuous": "independent"}[browsing], K)
    wrong = np.asarray(unbiased_pairwise_loss(tiled, clicks, model.examination(), other.joint_examination())) - on_truth
    assert abs(wrong.mean()) > 6 * wrong.std(ddof=1) / np.sqrt(n)


@pytest.mark.slow
def test_clicked_rows_path_equals_all_pairs_and_respects_masks():
    model = ClickModel("continuous", K)
    rng = np.random.default_rng(1)
    scores = jnp.asarray(rng.normal(size=(64, K)), jnp.float32)
    clicks = jnp.asarray(rng.random((64, K)) < 0.4)
    mask = jnp.asarray(rng.random((64, K)) < 0.8)
    p, pj = model.examination(), model.joint_examination()
    ranknet_dense = lambda a, b: jnp.stack(
        [jnp.zeros_like(a - b), jax.nn.softplus(b - a), jax.nn.softplus(a - b), jnp.zeros_like(a - b)], -1
    )
    for correction in ("joint", "individual", "none"):
        fast = unbiased_pairwise_loss(scores, clicks, p, pj, where=mask, pair_loss="ranknet", correction=correction)
        dense = unbiased_pairwise_loss(
            scores, clicks, p, pj, where=mask, pair_loss=ranknet_dense, correction=correction
        )
        np.testing.assert_allclose(np.asarray(fast), np.asarray(dense), rtol=1e-5, atol=1e-5)
    capped = unbiased_pairwise_loss(scores, clicks & (jnp.cumsum(clicks, 1) <= 2), p, pj, where=mask, max_clicks=2)
    full = unbiased_pairwise_loss(scores, clicks & (jnp.cumsum(clicks, 1) <= 2), p, pj, where=mask)
    np.testing.assert_allclose(np.asarray(capped), np.asarray(full), rtol=1e-6)
    # masked-out items never contribute
    changed = scores.at[:, 0].set(jnp.where(mask[:, 0], scores[:, 0], 99.0))
    np.testing.assert_allclose(
        np.asarray(unbiased_pairwise_loss(changed, clicks, p, pj, where=mask)),
        np.asarray(unbiased_pairwise_loss(scores, clicks, p, pj, where=mask)),
        rtol=1e-6,
    )


def test_bad_inputs_are_clear_errors():
    scores, relevant = _tiny_lists()
    model = ClickModel("independent", K)
    p, pj = model.examination(), model.joint_examination()
    with pytest.raises(ValueError, match="clicks must have the scores' shape"):
        unbiased_pairwise_loss(scores, relevant[:, :3], p, pj)
    with pytest.raises(ValueError, match="examination probabilities must be in"):
        unbiased_pairwise_loss(scores, relevant, p.at[2].set(0.0), pj)
    with pytest.raises(ValueError, match="joint_examination"):
        unbiased_pairwise_loss(scores, relevant, p, pj.at[0, 1].set(1.5))
    with pytest.raises(ValueError, match="more than max_clicks=1"):
        unbiased_pairwise_loss(scores, relevant, p, pj, max_clicks=1)
    with pytest.raises(ValueError, match="pair_loss must be one of"):
        pairwise_loss(scores, relevant, pair_loss="lambdarank")
