"""Learners end to end on the synthetic environment, and their degenerate inputs."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key, tuning
from opl_rank.opl.learners import LearnerConfig, fit, fit_seeds
from opl_rank.opl.policies import PLPolicy, RegressionPolicy, TwoStagePolicy
from opl_rank.optimization import TrainConfig
from simulators import SyntheticRankingEnv

TRAIN = TrainConfig(epochs=15, batch_size=256, learning_rate=5e-2)
REWARD = TrainConfig(epochs=20, batch_size=256, learning_rate=3e-2)


@pytest.fixture(scope="module")
def setting():
    env = SyntheticRankingEnv.create(make_key(0), n_items=5, ranking_length=3, lam=0.5)
    data = env.sample_logged_data(make_key(1), 3000, position_marginals="exact")
    v0 = env.logging_policy_value(make_key(2), 20_000)
    return env, data, v0


def _config(method, **kwargs):
    return LearnerConfig(method, train=TRAIN, reward_train=REWARD, **kwargs)


@pytest.mark.parametrize(
    "config",
    [
        _config("ips"),
        _config("rips"),
        _config("iips"),
        _config("dr"),
        _config("regression"),
        _config("rpod", k=1),
        _config("rpod", k=1, reward_model="pairwise"),
    ],
    ids=["ips", "rips", "iips", "dr", "regression", "rpod-1", "rpod-1-pairwise"],
)
@pytest.mark.slow
def test_learned_policy_beats_the_logging_policy(setting, config):
    env, data, v0 = setting
    policy = fit(data, make_key(3), config)
    value = env.policy_value(policy, make_key(4), 20_000)
    assert value.value > v0.value + 4 * math.hypot(value.stderr, v0.stderr)


@pytest.mark.slow
def test_k_zero_is_regression_and_k_l_is_dr(setting):
    env, data, _ = setting
    x = env.sample_contexts(make_key(5), 100)
    reg = fit(data, make_key(6), _config("regression"))
    k0 = fit(data, make_key(6), _config("rpod", k=0))
    assert isinstance(k0, RegressionPolicy)
    np.testing.assert_array_equal(np.asarray(k0.sample(None, x)), np.asarray(reg.sample(None, x)))
    dr = fit(data, make_key(6), _config("dr"))
    k_l = fit(data, make_key(6), _config("rpod", k=3))
    assert isinstance(dr, PLPolicy) and isinstance(k_l, PLPolicy)
    np.testing.assert_allclose(np.asarray(dr.logits(x)), np.asarray(k_l.logits(x)), atol=1e-5)


@pytest.mark.slow
def test_two_stage_policy_log_prob_and_support(setting):
    env, data, _ = setting
    policy = fit(data, make_key(7), _config("rpod", k=2))
    assert isinstance(policy, TwoStagePolicy)
    x = env.sample_contexts(make_key(8), 50)
    a = policy.sample(make_key(9), x)
    assert bool(jnp.all(jnp.isfinite(policy.log_prob(x, a))))
    swapped = a[:, jnp.array([0, 1, 2])].at[:, 2].set((a[:, 2] + 1) % 5)
    off_support = jnp.any(swapped[:, 2:3] == a[:, :2], axis=-1) | (swapped[:, 2] != a[:, 2])
    assert bool(jnp.all(jnp.where(off_support, policy.log_prob(x, swapped) == -jnp.inf, True)))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(method="greedy"), "method must be one of"),
        (dict(method="rpod"), "rpod needs k"),
        (dict(method="rpod", k=-1), "rpod needs k"),
        (dict(method="ips", k=2), "k is only for method 'rpod'"),
        (dict(method="dr", reward_model="forest"), "reward_model must be one of"),
        (dict(method="dr", n_samples=1), "n_samples must be an int >= 2"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LearnerConfig(**kwargs)


def test_k_above_l_and_missing_marginals_are_clear_errors(setting):
    env, data, _ = setting
    with pytest.raises(ValueError, match=r"k=4 must be in \[0, L=3\]"):
        fit(data, make_key(0), _config("rpod", k=4))
    no_marginals = env.sample_logged_data(make_key(10), 100)
    with pytest.raises(ValueError, match="iips needs"):
        fit(no_marginals, make_key(0), _config("iips"))


@pytest.mark.slow
def test_degenerate_inputs_give_finite_policies(setting):
    env, data, _ = setting
    x = env.sample_contexts(make_key(11), 20)
    small = data.take(np.arange(50))  # fewer rows than a batch: full-data batches
    zero = data.replace(reward=jnp.zeros_like(data.reward))  # nothing to learn: gradients are 0
    extreme = data.replace(log_pi0_prefix=data.log_pi0_prefix * 100.0)  # propensities near 1e-300
    for name, d in (("n < batch", small), ("all-zero rewards", zero), ("extreme propensities", extreme)):
        for method in ("ips", "dr"):
            policy = fit(d, make_key(12), _config(method))
            assert bool(jnp.all(jnp.isfinite(policy.logits(x)))), (name, method)
    init = fit(zero, make_key(12), dataclasses.replace(_config("ips"), train=TrainConfig(epochs=1, batch_size=256)))
    untouched = fit(zero, make_key(12), _config("ips"))
    np.testing.assert_allclose(np.asarray(untouched.logits(x)), np.asarray(init.logits(x)), atol=1e-6)


@pytest.mark.slow
def test_refitting_with_new_lambda_or_seed_does_not_recompile(setting, caplog):
    env, data, _ = setting
    config = _config("rpod", k=1)
    fit(data, make_key(20), config)  # compiles every stage of the fit
    other = env.with_lambda(0.9).sample_logged_data(make_key(21), data.n_rounds, position_marginals="exact")
    compiled = lambda: [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    with jax.log_compiles(True):
        caplog.clear()
        fit(other, make_key(22), config)  # new lambda, data and seed; same shapes
    assert compiled() == []
    with jax.log_compiles(True):  # the detector works: a new batch size is a new shape
        fit(other, make_key(23), dataclasses.replace(config, train=dataclasses.replace(TRAIN, batch_size=128)))
    assert len(compiled()) >= 1


@pytest.mark.parametrize(
    "config",
    [
        _config("ips"),
        pytest.param(_config("rpod", k=1, reward_model="pairwise"), marks=pytest.mark.extended),
        _config("regression"),
    ],
    ids=["ips", "rpod-1-pairwise", "regression"],
)
@pytest.mark.slow
def test_fits_vmapped_over_seeds_match_one_by_one_fits(setting, config):
    """fit_seeds (vmapped over seeds) = fit per seed, up to float rounding."""
    env, data, _ = setting
    config = dataclasses.replace(
        config, train=dataclasses.replace(TRAIN, epochs=5), reward_train=dataclasses.replace(REWARD, epochs=5)
    )
    datas = [data.take(np.arange(1000)), env.sample_logged_data(make_key(30), 1000, position_marginals="exact")]
    keys = jnp.stack([make_key(31), make_key(32)])
    together = fit_seeds(datas, keys, config)
    x = env.sample_contexts(make_key(33), 200)
    for d, k, policy in zip(datas, keys, together):
        alone = fit(d, k, config)
        assert type(alone) is type(policy)
        np.testing.assert_array_equal(
            np.asarray(policy.sample(make_key(34), x)), np.asarray(alone.sample(make_key(34), x))
        )
        if isinstance(alone, (PLPolicy, TwoStagePolicy)):
            first = alone if isinstance(alone, PLPolicy) else alone.first_stage
            other = policy if isinstance(policy, PLPolicy) else policy.first_stage
            np.testing.assert_allclose(np.asarray(other.logits(x)), np.asarray(first.logits(x)), atol=2e-4)
    # the replicas really are different fits
    assert not np.allclose(np.asarray(datas[0].reward), np.asarray(datas[1].reward))


def test_fits_vmapped_over_seeds_need_equal_shapes(setting):
    _, data, _ = setting
    with pytest.raises(ValueError, match=r"datas\[1\] does not share"):
        fit_seeds([data, data.take(np.arange(1000))], jnp.stack([make_key(1), make_key(2)]), _config("ips"))
    with pytest.raises(ValueError, match="keys must have shape"):
        fit_seeds([data, data], jnp.stack([make_key(1)]), _config("ips"))


@pytest.mark.extended
def test_iips_chooses_its_slot_marginals_by_cost_and_learns_with_sampled_ones():
    """Exact quadrature at small D, the unbiased sampled estimate at large D (or when asked);
    the fitted policy's own propensities stay exact."""
    from opl_rank.opl.learners import _plan

    small = SyntheticRankingEnv.create(make_key(70), n_items=6, ranking_length=3).sample_logged_data(
        make_key(71), 200, position_marginals="exact"
    )
    assert _plan(small, _config("iips")).slot_marginal_samples == 0
    assert _plan(small, _config("iips", slot_marginals="sampled")).slot_marginal_samples == 8
    env = SyntheticRankingEnv.create(make_key(72), n_items=60, ranking_length=5)
    data = env.sample_logged_data(make_key(73), 2000, position_marginals="exact")
    assert _plan(data, _config("iips")).slot_marginal_samples == 8
    assert _plan(data, _config("ips")).slot_marginal_samples == 0
    policy = fit(data, make_key(74), _config("iips"))
    assert isinstance(policy, PLPolicy) and policy.slot_marginal_samples == 0
    v, v0 = env.policy_value(policy, make_key(75), 5000).value, env.logging_policy_value(make_key(75), 5000).value
    assert v > v0
    with pytest.raises(ValueError, match="slot_marginals"):
        LearnerConfig(method="iips", slot_marginals="magic")


@pytest.mark.extended
def test_iips_learns_with_the_insertion_estimate_of_its_slot_marginals():
    """``slot_marginals="insertion"`` (the logged item inserted into the others' sampled
    order) is used as asked, also where the exact quadrature would be chosen, and learns."""
    from opl_rank.opl.learners import _plan

    env = SyntheticRankingEnv.create(make_key(72), n_items=60, ranking_length=5)
    data = env.sample_logged_data(make_key(73), 2000, position_marginals="exact")
    small = SyntheticRankingEnv.create(make_key(70), n_items=6, ranking_length=3).sample_logged_data(
        make_key(71), 200, position_marginals="exact"
    )
    assert _plan(small, _config("iips", slot_marginals="insertion")).slot_marginal_samples == 2
    assert _plan(small, _config("iips", slot_marginals="insertion", slot_marginal_samples=1)).slot_marginal_samples == 1
    with pytest.raises(ValueError, match="slot_marginal_samples"):
        _config("iips", slot_marginals="sampled", slot_marginal_samples=1)
    policy = fit(data, make_key(74), _config("iips", slot_marginals="insertion", slot_marginal_samples=1))
    v, v0 = env.policy_value(policy, make_key(75), 5000).value, env.logging_policy_value(make_key(75), 5000).value
    assert v > v0
    with pytest.raises(ValueError, match="slot_marginal_estimator"):
        policy_kind = PLPolicy(policy.module, policy.params, 5, 1, "magic")
        policy_kind.propensities(data.take(np.arange(4)), make_key(1), slot_marginals=True)


def test_on_epoch_sees_every_epoch_and_changes_nothing(setting):
    _, data, _ = setting
    config = _config("rpod", k=1)
    seen = []
    watched = fit(data, make_key(40), config, on_epoch=lambda part, epoch, record: seen.append((part, epoch)))
    plain = fit(data, make_key(40), config)
    assert seen == [("reward", e) for e in range(1, REWARD.epochs + 1)] + [
        ("policy", e) for e in range(1, TRAIN.epochs + 1)
    ]
    for got, want in zip(jax.tree.leaves(watched.first_stage.params), jax.tree.leaves(plain.first_stage.params)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    seen.clear()  # vmapped over seeds: every seed's epochs
    fit_seeds([data, data], jax.random.split(make_key(41), 2), _config("ips"), on_epoch=lambda *a: seen.append(a[:2]))
    assert sorted(seen) == sorted([("policy", e) for e in range(1, TRAIN.epochs + 1)] * 2)


def test_clipping_check_runs_in_chunks_with_the_same_verdict(setting, monkeypatch):
    import opl_rank.opl.learners as learners_module

    _, data, _ = setting
    extreme = data.replace(log_pi0_prefix=data.log_pi0_prefix * 100.0)  # every weight above the clip
    config = dataclasses.replace(_config("ips"), train=TrainConfig(epochs=1, batch_size=256))
    monkeypatch.setattr(tuning, "CLIP_CHECK_ROWS", 7)  # 429 chunks, the last one short
    with pytest.warns(learners_module.ClippedWeightsWarning, match="100% of the logged rows"):
        fit(extreme, make_key(13), config)


@pytest.mark.extended
def test_precomputed_completion_orders_change_nothing():
    """Two-stage R-POD with an additive f_hat reads each row's completion order, computed
    once before the policy's epochs, instead of a top-L per step: the same fit exactly."""
    from opl_rank.opl.learners import _plan, fit_arrays

    env = SyntheticRankingEnv.create(make_key(0), n_items=40, ranking_length=5)
    data = env.sample_logged_data(make_key(1), 600)
    config = LearnerConfig(
        "rpod",
        k=2,
        train=TrainConfig(epochs=2, batch_size=128),
        reward_train=TrainConfig(epochs=2, batch_size=128),
        valid_fraction=0.2,
    )
    plan = _plan(data, config)
    assert plan.completion_order
    once = fit_arrays(plan, data, make_key(2))["policy"]
    per_step = fit_arrays(plan._replace(completion_order=False), data, make_key(2))["policy"]
    for a, b in zip(jax.tree.leaves(once.params), jax.tree.leaves(per_step.params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(once.history["valid_loss"], per_step.history["valid_loss"], rtol=1e-6)
    assert not _plan(data, dataclasses.replace(config, reward_model="pairwise")).completion_order


@pytest.mark.parametrize(("k", "mask"), [pytest.param(1, False, marks=pytest.mark.extended), (2, True)])
def test_pairwise_prefix_table_changes_nothing(k, mask):
    """Two-stage R-POD with a pairwise f_hat reads every possible top-k prefix's completed
    value from a per-row table built once (k = 1: beam completions of 9!/5! tails; k = 2:
    exact ones), instead of completing the sampled prefixes in every step: the same fit up
    to float reassociation, held-out losses included; the table is skipped where it would
    cost more than the epochs' completions."""
    from opl_rank.opl.learners import _plan, fit_arrays

    env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5, lam=1.0)
    data = env.sample_logged_data(make_key(1), 600)
    if mask:  # each row's two lowest unranked items excluded: they never complete a prefix
        shown = np.zeros((600, 10), bool)
        np.put_along_axis(shown, np.asarray(data.ranking), True, axis=1)
        excluded = np.argsort(shown, axis=1, kind="stable")[:, :2]
        item_mask = np.ones((600, 10), bool)
        np.put_along_axis(item_mask, excluded, False, axis=1)
        data = data.replace(item_mask=jnp.asarray(item_mask))
    config = LearnerConfig(
        "rpod",
        k=k,
        reward_model="pairwise",
        n_samples=4,
        train=TrainConfig(epochs=30, batch_size=128),
        reward_train=TrainConfig(epochs=2, batch_size=128),
        valid_fraction=0.2,
    )
    plan = _plan(data, config)
    assert plan.prefix_table and not plan.completion_order
    table = fit_arrays(plan, data, make_key(2))["policy"]
    per_step = fit_arrays(plan._replace(prefix_table=False), data, make_key(2))["policy"]
    for a, b in zip(jax.tree.leaves(table.params), jax.tree.leaves(per_step.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(table.history["valid_loss"], per_step.history["valid_loss"], rtol=1e-5)
    # P = 10!/7! = 720 prefixes against 4 samples x 30 epochs per row: not worth a table
    assert not _plan(data, dataclasses.replace(config, k=3)).prefix_table
    # early stopping counts 4 x patience epochs: 90 prefixes > 4 x 4 x 5
    short = dataclasses.replace(config, train=TrainConfig(epochs=30, batch_size=128, patience=5))
    assert _plan(data, short).prefix_table == (k == 1)


@pytest.mark.parametrize("steps", [pytest.param(1, marks=pytest.mark.extended), 40])
def test_training_in_chunks_of_epochs_changes_no_bit(setting, monkeypatch, steps):
    """The policy's epochs run as one compiled scan by default and as chunks of epochs (the
    host reporting progress between them) when a run has more steps than
    tuning.CHUNK_STEPS: the parameters are the same, bit for bit, with early stopping too."""
    _, data, _ = setting
    config = dataclasses.replace(
        _config("rpod", k=2),
        valid_fraction=0.2,
        train=dataclasses.replace(TRAIN, patience=2),
        reward_train=dataclasses.replace(REWARD, epochs=5),
    )
    whole = fit(data, make_key(50), config)
    monkeypatch.setattr(tuning, "CHUNK_STEPS", steps)  # chunks of 1 epoch (steps=1) or of a few
    seen = []
    chunked = fit(data, make_key(50), config, on_epoch=lambda part, epoch, record: seen.append((part, epoch)))
    for got, want in zip(jax.tree.leaves(chunked.first_stage.params), jax.tree.leaves(whole.first_stage.params)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    policy_epochs = [e for part, e in seen if part == "policy"]
    assert policy_epochs == list(range(1, len(policy_epochs) + 1))
    assert [e for part, e in seen if part == "reward"] == [1, 2, 3, 4, 5]


@pytest.mark.extended
def test_a_shared_reward_model_gives_the_fit_bit_for_bit(setting):
    """fit_reward's f_hat passed to several methods: each fit is what it is without it."""
    from opl_rank.opl.learners import fit_reward, fit_reward_seeds

    env, data, _ = setting
    config = _config("rpod", k=2, reward_model="pairwise")
    shared = fit_reward(data, make_key(60), config)
    for method_config in (config, _config("dr", reward_model="pairwise")):
        alone = fit(data, make_key(60), method_config)
        reused = fit(data, make_key(60), method_config, reward_params=shared)
        for got, want in zip(jax.tree.leaves(reused), jax.tree.leaves(alone)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    datas = [data.take(np.arange(1000)), env.sample_logged_data(make_key(61), 1000, position_marginals="exact")]
    keys = jnp.stack([make_key(62), make_key(63)])
    stacked = fit_reward_seeds(datas, keys, config)
    alone = fit_seeds(datas, keys, config)
    reused = fit_seeds(datas, keys, config, reward_params=stacked)
    for got, want in zip(jax.tree.leaves(reused), jax.tree.leaves(alone)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="reward_params"):
        fit(data, make_key(60), _config("ips"), reward_params=shared)
    with pytest.raises(ValueError, match="fits no one-step f_hat"):
        fit_reward(data, make_key(60), _config("ips"))


@pytest.mark.extended
def test_two_stage_model_values_through_the_prefix_table():
    """OPE's E_pi[f_hat] of a two-stage policy reads one table of every prefix's completed value
    when that is cheaper: the same samples' values as completing each sampled prefix, with and
    without a mask, and their mean within 4 SE of the exact sum over prefixes."""
    import math

    from opl_rank.opl import completion, estimator_inputs

    env = SyntheticRankingEnv.create(make_key(0), n_items=6, ranking_length=4, lam=1.0)
    data = env.sample_logged_data(make_key(1), 600)
    short = {"train": TrainConfig(epochs=3, batch_size=128), "reward_train": TrainConfig(epochs=3, batch_size=128)}
    context = env.sample_contexts(make_key(3), 50)
    where = (jax.random.uniform(make_key(4), (50, 6)) > 0.3).at[:, :4].set(True)
    for k, kind in ((1, "pairwise"), (2, "pairwise"), (2, "additive")):
        policy = fit(data, make_key(2), LearnerConfig("rpod", k=k, reward_model=kind, **short))
        model = policy.reward_model
        assert estimator_inputs._prefix_table_pays(policy, 50, 256)
        assert not estimator_inputs._prefix_table_pays(policy, 50, math.perm(6, k) - 1)  # fewer samples than prefixes
        for mask in (None, where):
            keys = jax.random.split(make_key(7), 256)
            # each key's completed sample, as one program (op by op this test took a minute)
            completed = jax.jit(jax.vmap(lambda key: model.predict(context, policy.sample(key, context, where=mask))))(
                keys
            )
            tabled = estimator_inputs._model_values(policy, model, context, make_key(7), 256, mask, 6)
            np.testing.assert_allclose(tabled, completed.mean(0), rtol=1e-5, atol=1e-5)
            # exact: sum over every prefix of its PL probability times its completed value
            prefixes = jnp.asarray(completion.prefix_layout(6, k)[0])  # [P, k]
            table = policy.prefix_values(model.predict, context, where=mask)  # [n, P]
            log_p = jax.vmap(
                lambda prefix: policy.first_stage.log_prob(context, jnp.broadcast_to(prefix, (50, k)), where=mask),
                out_axes=1,
            )(prefixes)  # [n, P]: -inf for a prefix outside the mask
            exact = jnp.sum(jnp.exp(log_p) * jnp.where(jnp.isfinite(log_p), table, 0.0), axis=1)
            se = completed.std(0) / np.sqrt(256) + 1e-6
            assert np.all(np.abs(np.asarray(tabled) - np.asarray(exact)) < 4 * np.asarray(se) + 1e-4)


@pytest.mark.extended
def test_compiled_sample_gives_each_policys_own_rankings():
    """``compiled_sample`` (one program, as the ground-truth rollouts call it) returns what
    ``policy.sample`` returns op by op, for every built-in policy, with and without a mask;
    an object without ``jit_sample`` runs as it is."""
    from opl_rank.opl.policies import compiled_sample

    env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5, lam=1.0)
    data = env.sample_logged_data(make_key(1), 800)
    short = {"train": TrainConfig(epochs=2, batch_size=256), "reward_train": TrainConfig(epochs=2, batch_size=256)}
    policies = [
        fit(data, make_key(2), LearnerConfig("ips", **short)),
        fit(data, make_key(2), LearnerConfig("regression", reward_model="pairwise", **short)),
        fit(data, make_key(2), LearnerConfig("rpod", k=2, reward_model="pairwise", **short)),
        fit(data, make_key(2), LearnerConfig("rpod", k=1, **short)),
    ]
    assert [type(p) for p in policies] == [PLPolicy, RegressionPolicy, TwoStagePolicy, TwoStagePolicy]
    context = env.sample_contexts(make_key(3), 500)
    where = jax.random.uniform(make_key(4), (500, 10)) > 0.3
    where = where.at[:, :5].set(True)  # at least L candidates per row
    for policy in policies:
        assert policy.jit_sample
        for mask in (None, where):
            eager = policy.sample(make_key(5), context, where=mask)
            compiled = compiled_sample(policy, make_key(5), context, where=mask)
            assert compiled.dtype == eager.dtype and compiled.shape == (500, 5)
            np.testing.assert_array_equal(compiled, eager)

    class Fixed:  # a user's policy without the attribute: called as it is, no jit
        def sample(self, key, context, *, where=None):
            return np.tile(np.arange(5, dtype=np.int32), (context.shape[0], 1))

    np.testing.assert_array_equal(compiled_sample(Fixed(), make_key(0), context)[0], np.arange(5))
