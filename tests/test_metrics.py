"""DCG/NDCG@k and position weights against hand-computed values and scikit-learn."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import metrics
from opl_rank.metrics import dcg_at_k, dcg_position_weights, dcg_weights, ndcg_at_k, precision_weights


def _ref_dcg(scores, labels, k, gain="exp2"):
    """Python oracle: stable sort by -score (ties by index), gains, 1/log2(rank + 1)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    g = (lambda l: 2.0**l - 1.0) if gain == "exp2" else (lambda l: float(l))
    return sum(g(labels[d]) / math.log2(r + 2) for r, d in enumerate(order[:k]))


def _ref_ndcg(scores, labels, k, gain="exp2"):
    ideal = _ref_dcg(list(labels), labels, k, gain)
    return 0.0 if ideal == 0 else _ref_dcg(scores, labels, k, gain) / ideal


def test_position_weights():
    assert dcg_weights is dcg_position_weights
    w = np.asarray(dcg_weights(4))
    assert w.dtype == np.float32
    np.testing.assert_allclose(w, [1.0, 1 / math.log2(3), 0.5, 1 / math.log2(5)], rtol=1e-6)
    p = np.asarray(precision_weights(5))
    assert p.dtype == np.float32 and p.shape == (5,)
    np.testing.assert_allclose(p, 0.2)
    with pytest.raises(ValueError):
        precision_weights(0)


def test_hand_computed_dcg_and_ndcg():
    scores = jnp.array([0.1, 0.9, 0.4, 0.7])
    labels = jnp.array([2, 0, 3, 1])
    # ranking: doc1 (0), doc3 (1), doc2 (3), doc0 (2)
    dcg3 = 0.0 / 1.0 + 1.0 / math.log2(3) + 7.0 / 2.0
    ideal3 = 7.0 / 1.0 + 3.0 / math.log2(3) + 1.0 / 2.0
    assert float(dcg_at_k(scores, labels, 3)) == pytest.approx(dcg3, rel=1e-6)
    assert float(ndcg_at_k(scores, labels, 3)) == pytest.approx(dcg3 / ideal3, rel=1e-6)
    lin_dcg2 = 0.0 + 1.0 / math.log2(3)
    lin_ideal2 = 3.0 + 2.0 / math.log2(3)
    assert float(dcg_at_k(scores, labels, 2, gain="linear")) == pytest.approx(lin_dcg2, rel=1e-6)
    assert float(ndcg_at_k(scores, labels, 2, gain="linear")) == pytest.approx(lin_dcg2 / lin_ideal2, rel=1e-6)
    with pytest.raises(ValueError):
        ndcg_at_k(scores, labels, 2, gain="log")
    with pytest.raises(ValueError):
        ndcg_at_k(scores, labels, 0)


def test_perfect_ranking_is_one_and_reversed_is_less():
    labels = jnp.array([0, 3, 1, 2, 4, 0])
    perfect = labels.astype(jnp.float32)
    for k in (1, 3, 10):
        assert float(ndcg_at_k(perfect, labels, k)) == pytest.approx(1.0, abs=1e-6)
    assert float(ndcg_at_k(-perfect, labels, 3)) < 1.0
    assert float(ndcg_at_k(-perfect, labels, 3)) == pytest.approx(
        _ref_ndcg([-float(x) for x in perfect], [int(x) for x in labels], 3), rel=1e-6
    )


def test_zero_labels_and_all_masked_give_zero_without_nan():
    scores = jnp.array([[0.3, 0.1, 0.2], [0.3, 0.1, 0.2]])
    labels = jnp.array([[0, 0, 0], [1, 2, 0]])
    where = jnp.array([[True, True, True], [False, False, False]])
    out = np.asarray(ndcg_at_k(scores, labels, 2, where=where))
    np.testing.assert_array_equal(out, [0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(dcg_at_k(scores, labels, 2, where=where)), [0.0, 0.0])


def test_masked_docs_are_ignored():
    scores = np.array([0.2, 5.0, 0.7, 9.0, 0.1, 0.5], np.float32)  # masked docs score highest
    labels = np.array([1, 4, 2, 4, 0, 3])
    mask = np.array([True, False, True, False, True, True])
    for k in (2, 6):
        for f in (dcg_at_k, ndcg_at_k):
            masked = f(jnp.asarray(scores), jnp.asarray(labels), k, where=jnp.asarray(mask))
            dropped = f(jnp.asarray(scores[mask]), jnp.asarray(labels[mask]), k)
            assert float(masked) == pytest.approx(float(dropped), rel=1e-6)
    # masked docs go last even when a real doc scores -inf
    scores_inf = jnp.array([-jnp.inf, 1.0, 0.0])
    got = dcg_at_k(scores_inf, jnp.array([3, 5, 0]), 2, where=jnp.array([True, False, True]))
    assert float(got) == pytest.approx(0.0 + 7.0 / math.log2(3), rel=1e-6)


def test_k_larger_than_number_of_docs():
    scores, labels = jnp.array([0.3, 0.9, 0.5]), jnp.array([2, 1, 0])
    expected = _ref_dcg([0.3, 0.9, 0.5], [2, 1, 0], 3)
    assert float(dcg_at_k(scores, labels, 50)) == pytest.approx(expected, rel=1e-6)
    where = jnp.array([True, True, False])
    assert float(ndcg_at_k(scores, labels, 10, where=where)) == pytest.approx(
        _ref_ndcg([0.3, 0.9], [2, 1], 10), rel=1e-6
    )


def test_ties_are_broken_by_index():
    labels = [0, 2, 1, 3]
    got = dcg_at_k(jnp.zeros(4), jnp.array(labels), 4)
    expected = sum((2.0**l - 1) / math.log2(r + 2) for r, l in enumerate(labels))
    assert float(got) == pytest.approx(expected, rel=1e-6)
    # -0.0 and 0.0 tie too
    got = dcg_at_k(jnp.array([0.0, -0.0, 0.0]), jnp.array([0, 1, 2]), 1)
    assert float(got) == 0.0


def test_batched_matches_per_row_and_reference():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(2, 3, 8)).astype(np.float32)
    labels = rng.integers(0, 5, (2, 3, 8))
    batched = np.asarray(
        jax.jit(ndcg_at_k, static_argnames=("k", "gain"))(jnp.asarray(scores), jnp.asarray(labels), k=5)
    )
    assert batched.shape == (2, 3) and batched.dtype == np.float32
    for b in range(2):
        for q in range(3):
            ref = _ref_ndcg(scores[b, q].tolist(), labels[b, q].tolist(), 5)
            assert batched[b, q] == pytest.approx(ref, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("k", [1, 10, 40])
def test_agrees_with_sklearn_ndcg_score(k):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(k)
    scores = rng.normal(size=(20, 30))  # continuous scores: no ties
    labels = rng.integers(0, 5, (20, 30))
    labels[0] = 0  # an all-irrelevant query: both give 0
    scores32, labels_j = jnp.asarray(scores, jnp.float32), jnp.asarray(labels)
    ours = np.asarray(ndcg_at_k(scores32, labels_j, k, gain="linear"))
    theirs = [sklearn_metrics.ndcg_score(labels[i : i + 1], scores[i : i + 1], k=k) for i in range(20)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    if k == 10:  # exp2 gains are sklearn with y_true = 2^label - 1
        ours_exp2 = np.asarray(ndcg_at_k(scores32, labels_j, k))
        theirs_exp2 = sklearn_metrics.ndcg_score(2.0**labels - 1.0, scores, k=k)
        assert float(np.mean(ours_exp2)) == pytest.approx(theirs_exp2, rel=1e-5)


def test_average_precision_agrees_with_sklearn_and_respects_masks():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(3)
    scores = rng.normal(size=(40, 12)).astype(np.float32)
    labels = rng.integers(0, 5, size=(40, 12))
    labels[0] = 0  # no relevant document: 0, not NaN
    ap = np.asarray(metrics.average_precision(jnp.asarray(scores), jnp.asarray(labels), threshold=2))
    for q in range(1, 40):
        relevant = labels[q] >= 2
        expected = average_precision_score(relevant, scores[q]) if relevant.any() else 0.0
        assert abs(ap[q] - expected) < 1e-5, q
    assert ap[0] == 0.0
    where = rng.random((40, 12)) < 0.7
    masked = np.asarray(metrics.average_precision(jnp.asarray(scores), jnp.asarray(labels), where=jnp.asarray(where)))
    for q in range(40):
        rel = labels[q][where[q]] >= 1
        expected = average_precision_score(rel, scores[q][where[q]]) if rel.any() else 0.0
        assert abs(masked[q] - expected) < 1e-5, q
