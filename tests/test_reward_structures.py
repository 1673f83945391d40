"""Reward structures of the synthetic environment: which slots' items enter slot l's
interaction sum (a behaviour matrix c, c[l, l'] = 1 iff slot l depends on the item at l'),
against float64 loops, brute-force argmaxes and the symmetric model it extends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.pl import plackett_luce as pl
from simulators import SyntheticRankingEnv, environments, rollout
from simulators.synthetic import CONTEXT_BEHAVIOURS, REWARD_STRUCTURES

D, L = 5, 3
QUARTILES = (-0.6744897501960817, 0.0, 0.6744897501960817)  # of N(0, 1)
USER = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 1]])  # a user's structure: not one of the built-ins
STRUCTURES = ("symmetric", "independent", "cascade", "neighbour", "context", "user")


def _reference_c(name, n_slots=L):
    """c [L, L] of a fixed structure, written out by the definition."""
    c = np.zeros((n_slots, n_slots), np.int64)
    for l in range(n_slots):
        for m in range(n_slots):
            c[l, m] = {
                "symmetric": 1,
                "independent": int(l == m),
                "cascade": int(m <= l),
                "neighbour": int(abs(l - m) <= 1),
            }[name]
    return c


def _reference_behaviours(name, x):
    """c of every context: ``[n, L, L]`` (``"context"``: by the quartile of x[0])."""
    x = np.asarray(x, np.float64)
    if name == "user":
        return np.stack([USER] * len(x))
    if name != "context":
        return np.stack([_reference_c(name)] * len(x))
    quartile = [sum(x0 >= q for q in QUARTILES) for x0 in x[:, 0]]
    return np.stack([_reference_c(CONTEXT_BEHAVIOURS[k]) for k in quartile])


def _env(name, lam=0.5, seed=1, **kwargs):
    structure = USER if name == "user" else name
    return SyntheticRankingEnv.create(
        make_key(seed), n_items=D, ranking_length=L, lam=lam, reward_structure=structure, **kwargs
    )


def _loop_q(env, x, rankings, c):
    """q_l = theta_{a_l}.x + b_{a_l} + lam * sum_{m != l, c[l, m] = 1} W(a_m, a_l), float64 loops."""
    rm = env.reward_model
    theta, bias, w = (np.asarray(a, np.float64) for a in (rm.theta, rm.bias, rm.interaction))
    lam = float(rm.lam)
    x, rankings = np.asarray(x, np.float64), np.asarray(rankings)
    q = np.zeros(rankings.shape)
    for i, ranking in enumerate(rankings):
        for l, a_l in enumerate(ranking):
            inter = sum(w[a_m, a_l] for m, a_m in enumerate(ranking) if m != l and c[i, l, m] == 1)
            q[i, l] = theta[a_l] @ x[i] + bias[a_l] + lam * inter
    return q


def _contexts(env, n=64, seed=3):
    return env.sample_contexts(make_key(seed), n)


def _rankings(n, seed=4):
    return pl.sample_rankings(make_key(seed), jnp.zeros((n, D), jnp.float32), L)


@pytest.mark.parametrize("name", STRUCTURES)
def test_expected_reward_equals_the_per_slot_loop(name):
    env = _env(name)
    x, rankings = _contexts(env), _rankings(64)
    want = _loop_q(env, x, rankings, _reference_behaviours(name, x))
    np.testing.assert_allclose(np.asarray(env.expected_reward(x, rankings)), want, rtol=1e-5, atol=1e-5)
    if name != "symmetric":  # the structure matters: the full sum is another reward
        full = _loop_q(env, x, rankings, np.ones((64, L, L)))
        assert np.max(np.abs(full - want)) > 1e-2


@pytest.mark.parametrize("name", ["symmetric", "independent", "cascade", "neighbour", "context"])
def test_behaviour_returns_the_true_c(name):
    env = _env(name)
    x = _contexts(env, 200)
    got = env.behaviour(x)
    assert got.dtype == jnp.int32 and got.shape == (200, L, L)
    np.testing.assert_array_equal(np.asarray(got), _reference_behaviours(name, x))
    np.testing.assert_array_equal(np.asarray(env.reward_model.behaviour(x, L)), np.asarray(got))


def test_context_structure_gives_each_behaviour_a_quarter_of_contexts():
    env = _env("context")
    x = _contexts(env, 4000, seed=9)
    c = np.asarray(env.behaviour(x))
    shares = [np.mean(np.all(c == _reference_c(name)[None, :, :], axis=(1, 2))) for name in CONTEXT_BEHAVIOURS]
    assert sum(shares) == pytest.approx(1.0)
    np.testing.assert_allclose(shares, 0.25, atol=0.03)  # SE 0.007 per share


def test_cascade_slot_never_reads_the_items_below_it():
    env = _env("cascade", lam=1.0)
    x, rankings = _contexts(env, 32), np.asarray(_rankings(32))
    q = np.asarray(env.expected_reward(x, jnp.asarray(rankings)))
    for j in range(L):
        changed = rankings.copy()
        for i, ranking in enumerate(rankings):  # slot j gets an item the ranking does not hold
            changed[i, j] = np.setdiff1d(np.arange(D), ranking)[0]
        q_changed = np.asarray(env.expected_reward(x, jnp.asarray(changed)))
        np.testing.assert_array_equal(q_changed[:, :j], q[:, :j])  # slots above j: untouched
        if j < L - 1:  # slots below j read it
            assert np.all(np.any(q_changed[:, j + 1 :] != q[:, j + 1 :], axis=1))


def test_neighbour_slot_never_reads_non_adjacent_items():
    env = SyntheticRankingEnv.create(make_key(2), n_items=6, ranking_length=4, lam=1.0, reward_structure="neighbour")
    x = env.sample_contexts(make_key(3), 32)
    rankings = np.asarray(pl.sample_rankings(make_key(4), jnp.zeros((32, 6), jnp.float32), 4))
    q = np.asarray(env.expected_reward(x, jnp.asarray(rankings)))
    for j in range(4):
        changed = rankings.copy()
        for i, ranking in enumerate(rankings):
            changed[i, j] = np.setdiff1d(np.arange(6), ranking)[0]
        q_changed = np.asarray(env.expected_reward(x, jnp.asarray(changed)))
        far = [l for l in range(4) if abs(l - j) > 1]
        near = [l for l in range(4) if abs(l - j) == 1]
        np.testing.assert_array_equal(q_changed[:, far], q[:, far])
        assert np.all(np.any(q_changed[:, near] != q[:, near], axis=1))


def test_independent_is_lambda_zero():
    independent, symmetric = _env("independent", lam=0.7), _env("symmetric", lam=0.7)
    x, rankings = _contexts(independent), _rankings(64)
    np.testing.assert_array_equal(
        np.asarray(independent.expected_reward(x, rankings)),
        np.asarray(symmetric.with_lambda(0.0).expected_reward(x, rankings)),
    )
    np.testing.assert_array_equal(
        np.asarray(independent.expected_reward(x, rankings)),
        np.asarray(independent.reward_model.base_reward(x, rankings)),
    )
    # Realised rewards too: the switch has nothing to switch on.
    k = make_key(5)
    np.testing.assert_array_equal(
        np.asarray(independent.reward_model.sample_reward(k, x, rankings)),
        np.asarray(symmetric.with_lambda(0.0).reward_model.sample_reward(k, x, rankings)),
    )


def test_symmetric_is_the_default_environment_bit_for_bit():
    default = SyntheticRankingEnv.create(make_key(1), n_items=D, ranking_length=L, lam=0.5)
    for structure in ("symmetric", np.ones((L, L), np.int32)):
        env = SyntheticRankingEnv.create(make_key(1), n_items=D, ranking_length=L, lam=0.5, reward_structure=structure)
        assert env.reward_model.behaviour_masks is None and env.reward_model.behaviour_cuts is None
        assert jax.tree.structure(env.reward_model) == jax.tree.structure(default.reward_model)
        for a, b in zip(jax.tree.leaves(env.reward_model), jax.tree.leaves(default.reward_model)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        a, b = env.sample_logged_data(make_key(2), 300), default.sample_logged_data(make_key(2), 300)
        for field in ("context", "ranking", "reward", "log_pi0_prefix"):
            np.testing.assert_array_equal(np.asarray(getattr(a, field)), np.asarray(getattr(b, field)))
        x = _contexts(env)
        np.testing.assert_array_equal(np.asarray(env.best_rankings(x)[0]), np.asarray(default.best_rankings(x)[0]))


def test_other_structures_share_theta_b_and_w_with_the_default():
    default = _env("symmetric")
    for name in STRUCTURES[1:]:
        rm = _env(name).reward_model
        for field in ("theta", "bias", "interaction", "lam", "sigma"):
            np.testing.assert_array_equal(
                np.asarray(getattr(rm, field)), np.asarray(getattr(default.reward_model, field))
            )


@pytest.mark.parametrize("name", STRUCTURES)
def test_mean_sampled_reward_is_the_expected_reward(name):
    env = _env(name, lam=0.6)
    x0 = jnp.asarray([[-1.5, 0, 0, 0, 0], [-0.3, 0, 0, 0, 0], [0.3, 0, 0, 0, 0], [1.5, 0, 0, 0, 0]], jnp.float32)
    x0 = x0 + 0.5 * env.sample_contexts(make_key(6), 4) * jnp.asarray([0, 1, 1, 1, 1], jnp.float32)[None, :]
    r0 = _rankings(4, seed=7)
    reps = 20_000
    x, rankings = jnp.repeat(x0, reps, axis=0), jnp.repeat(r0, reps, axis=0)  # every quartile of x[0]
    draws = np.asarray(env.reward_model.sample_reward(make_key(8), x, rankings), np.float64).reshape(4, reps, L)
    want = np.asarray(env.expected_reward(x0, r0), np.float64)
    se = draws.std(axis=1, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(draws.mean(axis=1) - want) < 4.5 * se), (draws.mean(axis=1), want, se)


def _brute_force_values(env, x, c):
    """``[n, P]`` sum_l alpha_l q_l of every ranking, float64, with the contexts' c."""
    rm = env.reward_model
    theta, bias, w = (np.asarray(a, np.float64) for a in (rm.theta, rm.bias, rm.interaction))
    alpha, lam = np.asarray(env.position_weight, np.float64), float(rm.lam)
    base = np.asarray(x, np.float64) @ theta.T + bias[None, :]  # [n, D]
    perms = pl.all_rankings(D, L)
    values = np.zeros((len(base), len(perms)))
    for p, ranking in enumerate(perms):
        pair = w[ranking[:, None], ranking[None, :]]  # [m, l]: W(a_m, a_l)
        inter = np.einsum("nlm,ml->nl", c, pair)  # the diagonal of W is zero
        values[:, p] = (base[:, ranking] + lam * inter) @ alpha
    return values


@pytest.mark.parametrize("name", STRUCTURES)
def test_best_rankings_are_the_brute_force_argmax(name):
    env = _env(name, lam=1.0)
    x = _contexts(env, 200, seed=11)
    values = _brute_force_values(env, x, _reference_behaviours(name, x))
    best, method = env.best_rankings(x)
    assert method == ("exact-sort" if name == "independent" else "exact")  # nothing interacts: sorted
    perms = pl.all_rankings(D, L)
    np.testing.assert_array_equal(np.asarray(best), perms[np.argmax(values, axis=1)])
    if name == "independent":  # beyond enumeration: sorting is exact
        by_sort, method = env.best_rankings(x, max_enumerated=0)
        assert method == "exact-sort"
        np.testing.assert_array_equal(np.asarray(by_sort), np.asarray(best))
    elif name != "symmetric":  # no approximation pretends to be the optimum
        with pytest.raises(ValueError, match=r"needs enumeration: D!/\(D-L\)! = 60 rankings exceed max_enumerated=0"):
            env.best_rankings(x, max_enumerated=0)
        assert env.with_lambda(0.0).best_rankings(x, max_enumerated=0)[1] == "exact-sort"  # no interactions


def test_optimal_value_is_the_value_of_the_brute_force_optimum():
    env = _env("context", lam=1.0)
    perms = pl.all_rankings(D, L)

    def brute_force(key, x):
        return jnp.asarray(perms[np.argmax(_brute_force_values(env, x, _reference_behaviours("context", x)), axis=1)])

    value, method = env.optimal_value(make_key(12), 2000)
    assert method == "exact"
    want = env.policy_value(brute_force, make_key(12), 2000)  # the same contexts
    assert value.value == pytest.approx(want.value, rel=1e-6)
    assert value.value > env.logging_policy_value(make_key(12), 2000).value


def test_new_lambda_keeps_the_structure_and_does_not_recompile():
    env = _env("cascade")
    env.sample_logged_data(make_key(40), 64)
    before = rollout._logged_chunk._cache_size()
    for lam in (0.0, 0.25, 1.0):
        moved = env.with_lambda(lam)
        np.testing.assert_array_equal(np.asarray(moved.reward_model.behaviour_masks), _reference_c("cascade")[None])
        moved.sample_logged_data(make_key(41), 64)
    assert rollout._logged_chunk._cache_size() == before


@pytest.mark.parametrize(
    "structure,message",
    [
        (
            "sideways",
            r"reward_structure must be one of \['symmetric', 'independent', 'cascade', 'neighbour', 'context'\]",
        ),
        ("Cascade", "reward_structure must be one of"),
        (np.ones((2, 2)), r"reward_structure must have shape \[L, L\] = \(3, 3\)"),
        (np.ones((3, 3, 1)), "reward_structure must have shape"),
        (3, "reward_structure must have shape"),
        (2 * np.eye(3), "reward_structure must hold only 0 and 1"),
        (np.full((3, 3), np.nan), "reward_structure must hold only 0 and 1"),
        (np.ones((3, 3)) - np.eye(3), "reward_structure must have a unit diagonal"),
        ([["a", "b", "c"]] * 3, "reward_structure must be a name in"),
    ],
)
def test_bad_reward_structures_are_one_line_errors_naming_it(structure, message):
    with pytest.raises(ValueError, match=message) as err:
        SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, reward_structure=structure)
    assert "\n" not in str(err.value)


def test_the_registry_builds_the_structure_a_sweep_names():
    from experiments.opl_sweep import OPLSweep
    from experiments.sweep_config import cell_env_options, cell_name, cells

    assert set(REWARD_STRUCTURES) == {"symmetric", "independent", "cascade", "neighbour", "context"}
    assert environments.get("synthetic").options == {"reward_structure": "symmetric"}
    grid = ["independent", "cascade", "neighbour", "symmetric"]
    base = dict(n_items=(D,), ranking_length=(L,), lam=(0.5,), n=(100,), seeds=(0,))
    sweep = OPLSweep(**base, axes={"reward_structure": grid})
    names = [cell_name(c) for c in cells(sweep)]
    assert names == [f"D5_L3_tau1.0_lam0.5_seed0_n100_reward_structure{v}" for v in grid]
    assert [cell_env_options(sweep, c) for c in cells(sweep)] == [{"reward_structure": v} for v in grid]
    fixed = OPLSweep(**base, env_options={"reward_structure": "cascade"})
    [cell] = cells(fixed)
    options = cell_env_options(fixed, cell)
    assert options == {"reward_structure": "cascade"} and cell_name(cell) == "D5_L3_tau1.0_lam0.5_seed0_n100"
    env = environments.create(
        "synthetic",
        make_key(1),
        n_items=D,
        ranking_length=L,
        lam=0.5,
        tau=1.0,
        logging_policy="pl",
        config=fixed,
        options=options,
    )
    x = _contexts(env)
    np.testing.assert_array_equal(np.asarray(env.behaviour(x)), _reference_behaviours("cascade", x))
    direct = _env("cascade", sigma=fixed.sigma, interaction_scale=fixed.interaction_scale)
    np.testing.assert_array_equal(
        np.asarray(env.expected_reward(x, _rankings(64))), np.asarray(direct.expected_reward(x, _rankings(64)))
    )
    default = environments.create(  # no option: the paper's model
        "synthetic", make_key(1), n_items=D, ranking_length=L, lam=0.5, tau=1.0, logging_policy="pl", config=fixed
    )
    assert default.reward_model.behaviour_masks is None
    with pytest.raises(ValueError, match="reward_structure must be one of"):
        OPLSweep(**base, env_options={"reward_structure": "sideways"})
    with pytest.raises(ValueError, match="reward_structure must be one of"):
        OPLSweep(**base, axes={"reward_structure": ["cascade", "sideways"]})
    with pytest.raises(ValueError, match="reward_structure must be one of"):
        environments.create(
            "synthetic",
            make_key(1),
            n_items=D,
            ranking_length=L,
            lam=0.5,
            tau=1.0,
            logging_policy="pl",
            config=fixed,
            options={"reward_structure": "sideways"},
        )
