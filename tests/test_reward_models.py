"""Reward models: least-squares fits recover the truth; completions are exact argmaxes."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.opl.reward_models import fit_reward_model
from opl_rank.optimization import TrainConfig
from opl_rank.pl import plackett_luce as pl
from simulators import SyntheticRankingEnv

FAST = TrainConfig(epochs=25, batch_size=256, learning_rate=3e-2)


@pytest.fixture(scope="module")
def fitted():
    env = SyntheticRankingEnv.create(make_key(0), n_items=6, ranking_length=3, lam=1.0)
    data = env.sample_logged_data(make_key(1), 4000)
    models = {kind: fit_reward_model(data, make_key(2), kind=kind, config=FAST) for kind in ("additive", "pairwise")}
    x = env.sample_contexts(make_key(3), 300)
    return env, models, x


def _rmse(env, model, x):
    a = pl.sample_rankings(make_key(4), jnp.zeros((x.shape[0], 6)), 3)
    truth = env.expected_reward(x, a) @ env.position_weight
    return float(jnp.sqrt(jnp.mean((model.predict(x, a) - truth) ** 2))), float(truth.std())


@pytest.mark.slow
def test_pairwise_model_captures_interactions_the_additive_cannot(fitted):
    env, models, x = fitted
    pair_rmse, sd = _rmse(env, models["pairwise"], x)
    add_rmse, _ = _rmse(env, models["additive"], x)
    assert pair_rmse < 0.1 * sd  # well specified for the synthetic environment
    assert add_rmse > 3 * pair_rmse


def test_additive_model_is_accurate_without_interaction():
    env = SyntheticRankingEnv.create(make_key(5), n_items=6, ranking_length=3, lam=0.0)
    model = fit_reward_model(
        env.sample_logged_data(make_key(6), 4000), make_key(7), kind="additive", config=FAST, target="slots"
    )
    rmse, sd = _rmse(env, model, env.sample_contexts(make_key(8), 300))
    assert rmse < 0.1 * sd


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["additive", "pairwise"])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_completion_is_the_exact_argmax(fitted, kind, k):
    _, models, x = fitted
    model = models[kind]
    prefixes = pl.sample_rankings(make_key(9), jnp.zeros((x.shape[0], 6)), 3)[:, :k]
    completed = model.complete(x, prefixes)
    assert completed.shape == (x.shape[0], 3)
    np.testing.assert_array_equal(np.asarray(completed[:, :k]), np.asarray(prefixes))
    everything = jnp.asarray(pl.all_rankings(6, 3))
    values = jax.vmap(lambda r: model.predict(x, jnp.broadcast_to(r, (x.shape[0], 3))))(everything)  # [60, n]
    consistent = jnp.all(everything[:, None, :k] == prefixes[None], axis=-1)
    best = jnp.max(jnp.where(consistent, values, -jnp.inf), axis=0)
    np.testing.assert_allclose(np.asarray(model.predict(x, completed)), np.asarray(best), atol=1e-4)


@pytest.mark.parametrize("ties", [False, True])
def test_last_slot_completion_is_exact_enumeration(ties):
    # k = L - 1 skips enumeration (one tail item, no pair term): the same item, ties included.
    from opl_rank.opl import completion

    n_items, n_slots = 12, 4
    rng = np.random.default_rng(0)
    g = rng.normal(size=(2, 50, n_items)).astype(np.float32)
    v = completion.zero_diagonal(jnp.asarray(rng.normal(size=(n_items, n_items)), jnp.float32))
    if ties:
        g, v = np.round(g), jnp.zeros_like(v)  # many equal gains: the lowest index must win
    alpha = 1.0 / jnp.log2(jnp.arange(2, n_slots + 2, dtype=jnp.float32))
    prefixes = pl.sample_rankings(make_key(13), jnp.zeros((2, 50, n_items)), n_slots - 1)
    last = completion.complete_last_slot(jnp.asarray(g), v, alpha, prefixes)
    np.testing.assert_array_equal(
        np.asarray(last), np.asarray(completion.complete_exact(jnp.asarray(g), v, alpha, prefixes))
    )
    completed, method = completion.complete(jnp.asarray(g), v, alpha, prefixes)
    assert method == "exact"
    np.testing.assert_array_equal(np.asarray(completed[..., -1:]), np.asarray(last))


@pytest.mark.parametrize("ties", [False, True])
def test_two_item_tails_of_all_items_are_the_free_items_tails(ties, monkeypatch):
    # complete_exact's two ways to enumerate two-item tails (all items, masked; the free
    # items only) give the same tails, ties (the lexicographically first) and excluded
    # candidates included, and each tail is the argmax of f over every completion.
    from opl_rank import tuning
    from opl_rank.opl import completion

    n_items, n_slots, k = 10, 5, 3
    rng = np.random.default_rng(1)
    g = rng.normal(size=(4, 64, n_items)).astype(np.float32)
    v = rng.normal(size=(n_items, n_items)).astype(np.float32)
    if ties:
        g, v = np.round(g), np.round(v)
    g[:, :8, 7:] = -1e30  # excluded candidates, as a reward model's `where` gives them
    v = completion.zero_diagonal(jnp.asarray(v))
    alpha = 1.0 / jnp.log2(jnp.arange(2, n_slots + 2, dtype=jnp.float32))
    prefixes = pl.sample_rankings(make_key(15), jnp.zeros((4, 64, n_items)), k)
    all_items = np.asarray(completion.complete_exact(jnp.asarray(g), v, alpha, prefixes))
    monkeypatch.setattr(tuning, "ALL_ITEM_TAILS_RATIO", 0)
    np.testing.assert_array_equal(all_items, np.asarray(completion.complete_exact(jnp.asarray(g), v, alpha, prefixes)))
    # f of each prefix with every pair of other items, by brute force
    ranked = np.concatenate([np.asarray(prefixes), all_items], -1)
    alpha_np, v_np = np.asarray(alpha), np.asarray(v)

    def f(r):  # r: [L] one ranking; gx: [D]
        return sum(
            alpha_np[l] * (gx[r[l]] + sum(v_np[r[m], r[l]] for m in range(n_slots) if m != l)) for l in range(n_slots)
        )

    for s, i in [(0, 0), (1, 5), (2, 20), (3, 63)]:
        gx, p = g[s, i], list(np.asarray(prefixes)[s, i])
        best = max(
            f(p + [a, b]) for a in range(n_items) for b in range(n_items) if a != b and a not in p and b not in p
        )
        assert f(list(ranked[s, i])) == pytest.approx(best, rel=1e-5, abs=1e-4)


@pytest.mark.slow
def test_greedy_completion_is_valid_and_never_better_than_exact(fitted):
    _, models, x = fitted
    exact = models["pairwise"]
    greedy = dataclasses.replace(exact, max_enumerated=0, beam_width=1)
    empty = jnp.zeros((x.shape[0], 0), jnp.int32)
    g = np.asarray(greedy.complete(x, empty))
    assert all(len(set(row)) == 3 for row in g.tolist())
    assert np.all(np.asarray(greedy.predict(x, g)) <= np.asarray(exact.predict(x, exact.complete(x, empty))) + 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_exhaustive_beam_search_is_the_exact_argmax(fitted, k):
    # A beam as wide as the number of partial rankings keeps them all: it must find the
    # same values as exact enumeration (and a narrow beam must still give valid rankings).
    _, models, x = fitted
    exact = models["pairwise"]
    prefixes = pl.sample_rankings(make_key(12), jnp.zeros((x.shape[0], 6)), 3)[:, :k]
    wide = dataclasses.replace(exact, max_enumerated=0, beam_width=120)
    np.testing.assert_allclose(
        np.asarray(wide.predict(x, wide.complete(x, prefixes))),
        np.asarray(exact.predict(x, exact.complete(x, prefixes))),
        atol=1e-4,
    )
    narrow = np.asarray(dataclasses.replace(exact, max_enumerated=0, beam_width=3).complete(x, prefixes))
    assert all(len(set(row)) == 3 for row in narrow.tolist())
    np.testing.assert_array_equal(narrow[:, :k], np.asarray(prefixes))


@pytest.mark.parametrize("k", [1, 2])
def test_prefix_table_reads_each_prefix_best_completion(fitted, k):
    """R-POD's prefix table (opl.learners, pairwise f_hat): f_hat at the completion of every
    prefix of prefix_layout, read back for sampled prefixes [N, n, k], is the best value over
    every ranking that starts with that prefix (enumeration of all 6!/3! rankings)."""
    from opl_rank.opl import completion

    _, models, x = fitted
    model = models["pairwise"]
    layout, column = completion.prefix_layout(6, k)
    assert layout.shape == (math.perm(6, k), k) and len({tuple(p) for p in layout.tolist()}) == len(layout)
    np.testing.assert_array_equal(column[layout @ (6 ** np.arange(k - 1, -1, -1))], np.arange(len(layout)))
    all_prefixes = jnp.broadcast_to(jnp.asarray(layout)[:, None, :], (len(layout), x.shape[0], k))
    table = model.predict(x, model.complete(x, all_prefixes)).T  # [n, P]
    prefixes = pl.sample_rankings(make_key(14), jnp.zeros((x.shape[0], 6)), k, n_samples=4)  # [4, n, k]
    read = completion.prefix_table_values(table, prefixes, 6)
    assert read.shape == (4, x.shape[0])
    everything = jnp.asarray(pl.all_rankings(6, 3))
    values = jax.vmap(lambda r: model.predict(x, jnp.broadcast_to(r, (x.shape[0], 3))))(everything)  # [120, n]
    consistent = jnp.all(everything[:, None, None, :k] == prefixes[None], axis=-1)  # [120, 4, n]
    best = jnp.max(jnp.where(consistent, values[:, None, :], -jnp.inf), axis=0)
    np.testing.assert_allclose(np.asarray(read), np.asarray(best), atol=1e-4)


@pytest.mark.slow
def test_completion_over_sample_axes(fitted):
    _, models, x = fitted
    prefixes = pl.sample_rankings(make_key(10), jnp.zeros((x.shape[0], 6)), 1, n_samples=4)  # [4, n, 1]
    out = models["pairwise"].complete(x, prefixes)
    assert out.shape == (4, x.shape[0], 3)
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(models["pairwise"].complete(x, prefixes[1])))


def test_bad_arguments(fitted):
    env, _, _ = fitted
    data = env.sample_logged_data(make_key(11), 50)
    with pytest.raises(ValueError, match="kind must be one of"):
        fit_reward_model(data, make_key(0), kind="tree")
    with pytest.raises(ValueError, match="target must be"):
        fit_reward_model(data, make_key(0), target="mean")
