"""Full-information LTR training: gains, config validation, learning on planted data."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key, metrics
from opl_rank.ltr.training import LTRConfig, RankingQueries, ideal_normalized_gains, train_ltr


def _planted(n_queries, seed, n_docs=12, n_features=6):
    """Labels 0-4 from a hidden linear score of the features: a linear scorer can rank them."""
    rng = np.random.default_rng(seed)
    feats = rng.normal(size=(n_queries, n_docs, n_features)).astype(np.float32)
    w = np.linspace(1.0, -0.5, n_features).astype(np.float32)
    score = feats @ w
    labels = np.clip(np.round(score + 1.5), 0, 4).astype(np.float32)
    mask = np.ones((n_queries, n_docs), bool)
    mask[:, -3:] = rng.random((n_queries, 3)) < 0.5  # some padded documents
    labels = np.where(mask, labels, 0.0)
    return RankingQueries(feats, labels, mask)


def test_ideal_normalized_gains_make_utility_ndcg():
    labels = jnp.array([[3.0, 0.0, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    mask = jnp.array([[True, True, True, False], [True, True, True, True]])
    rho = ideal_normalized_gains(labels, mask, 2)
    # The ideal top-2 (docs 0 then 2) has utility sum_k theta_k rho_{y_k} = 1.
    theta = metrics.dcg_weights(2)
    np.testing.assert_allclose(float(theta[0] * rho[0, 0] + theta[1] * rho[0, 2]), 1.0, rtol=1e-6)
    assert float(rho[0, 3]) == 0.0  # masked
    np.testing.assert_array_equal(np.asarray(rho[1]), 0.0)  # no relevant document: no NaN


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(estimator="magic"), "estimator must be one of"),
        (dict(loss="fun"), "loss must be one of"),
        (dict(loss="kl_fair", estimator="placement"), "needs an exposure estimator"),
        (dict(epochs=0), "epochs must be a positive int"),
        (dict(n_samples=1), "n_samples >= 2"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(hidden=(8, 0)), "hidden"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LTRConfig(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["exposure", "plrank3", "placement"])
def test_training_learns_a_planted_ranking(estimator):
    train, valid = _planted(96, 0), _planted(32, 1)
    cfg = LTRConfig(
        hidden=(16,), learning_rate=0.01, batch_queries=32, epochs=15, estimator=estimator, n_samples=8, cutoff=5
    )
    history = train_ltr(train, valid, make_key(0), cfg).history
    assert len(history) == 15
    first, last = history[0]["valid_ndcg@5"], history[-1]["valid_ndcg@5"]
    assert np.isfinite([r["train_loss"] for r in history]).all()
    assert last > first + 0.05 and last > 0.8


@pytest.mark.slow
def test_fairness_loss_decreases():
    train, valid = _planted(64, 2), _planted(32, 3)
    cfg = LTRConfig(
        hidden=(16,),
        learning_rate=0.01,
        batch_queries=32,
        epochs=12,
        estimator="exposure",
        loss="kl_fair",
        n_samples=8,
        cutoff=5,
    )
    history = train_ltr(train, valid, make_key(1), cfg).history
    assert history[-1]["valid_loss"] < history[0]["valid_loss"]


def test_cutoff_larger_than_query_size_is_rejected():
    data = _planted(8, 4, n_docs=4)
    with pytest.raises(ValueError, match="cutoff K=5 exceeds"):
        train_ltr(data, data, make_key(0), dataclasses.replace(LTRConfig(hidden=(4,), epochs=1, n_samples=2), cutoff=5))
