"""Cross-check with obp: our IPS, IIPS and RIPS equal obp's slate estimators on obp's data."""

import numpy as np
import pytest

obp_dataset = pytest.importorskip("obp.dataset", reason="obp is not installed (scripts/setup.sh --test installs it)")
obp_ope = pytest.importorskip("obp.ope")

import jax.numpy as jnp  # noqa: E402

from opl_rank import make_key  # noqa: E402
from opl_rank.io.obp import from_obp_slate, to_obp_slate  # noqa: E402
from opl_rank.opl import estimators as oe  # noqa: E402
from opl_rank.pl import marginals  # noqa: E402
from opl_rank.pl import plackett_luce as pl  # noqa: E402
from simulators import SyntheticRankingEnv  # noqa: E402


@pytest.fixture(scope="module")
def obp_logs():
    dataset = obp_dataset.SyntheticSlateBanditDataset(
        n_unique_action=6,
        len_list=3,
        dim_context=2,
        reward_type="continuous",
        reward_structure="cascade_additive",
        random_state=7,
    )
    feedback = dataset.obtain_batch_bandit_feedback(n_rounds=300, return_pscore_item_position=True)
    eval_logits = np.random.default_rng(0).normal(size=(300, 6))
    pscore, pscore_item_position, pscore_cascade = dataset.obtain_pscore_given_evaluation_policy_logit(
        feedback["action"], eval_logits, return_pscore_item_position=True
    )
    return feedback, eval_logits, {"pscore": pscore, "item_position": pscore_item_position, "cascade": pscore_cascade}


def test_target_propensities_match_obp_enumeration(obp_logs):
    feedback, eval_logits, theirs = obp_logs
    data = from_obp_slate(feedback)
    logits = jnp.asarray(eval_logits, jnp.float32)
    prefix = np.exp(np.asarray(pl.prefix_log_probs(logits, data.ranking)))
    np.testing.assert_allclose(prefix.reshape(-1), theirs["cascade"], rtol=1e-5, atol=1e-7)
    slot = np.asarray(marginals.exact_slot_marginals(logits, data.ranking))
    np.testing.assert_allclose(slot.reshape(-1), theirs["item_position"], rtol=1e-5, atol=1e-6)


def test_ips_iips_rips_equal_obp_slate_estimators(obp_logs):
    feedback, eval_logits, theirs = obp_logs
    data = from_obp_slate(feedback)
    logits = jnp.asarray(eval_logits, jnp.float32)
    target = oe.Propensities(
        pl.prefix_log_probs(logits, data.ranking), jnp.log(marginals.exact_slot_marginals(logits, data.ranking))
    )
    ours = {name: oe.get(name).terms(target, data).value for name in ("ips", "iips", "rips")}
    common = dict(slate_id=feedback["slate_id"], reward=feedback["reward"], position=feedback["position"])
    want = {
        "ips": obp_ope.SlateStandardIPS(len_list=3).estimate_policy_value(
            pscore=feedback["pscore"], evaluation_policy_pscore=theirs["pscore"], **common
        ),
        "iips": obp_ope.SlateIndependentIPS(len_list=3).estimate_policy_value(
            pscore_item_position=feedback["pscore_item_position"],
            evaluation_policy_pscore_item_position=theirs["item_position"],
            **common,
        ),
        "rips": obp_ope.SlateRewardInteractionIPS(len_list=3).estimate_policy_value(
            pscore_cascade=feedback["pscore_cascade"], evaluation_policy_pscore_cascade=theirs["cascade"], **common
        ),
    }
    for name in ours:
        got = float(jnp.mean(ours[name]))
        assert abs(got - want[name]) <= 1e-5 * max(1.0, abs(want[name])), (name, got, want[name])
    assert len({round(v, 6) for v in want.values()}) == 3  # three different estimators, not one number


def test_round_trip_through_obp_layout():
    env = SyntheticRankingEnv.create(make_key(0), n_items=6, ranking_length=3)
    data = env.sample_logged_data(make_key(1), 50, position_marginals="exact")
    back = from_obp_slate(to_obp_slate(data), position_weight=data.position_weight)
    for name in ("context", "ranking", "reward", "log_pi0_prefix", "log_pi0_position_marginal", "position_weight"):
        np.testing.assert_allclose(
            np.asarray(getattr(back, name)), np.asarray(getattr(data, name)), rtol=1e-5, atol=1e-6
        )
    bad = to_obp_slate(data)
    bad["pscore_cascade"] = bad["pscore_cascade"] * 0.0
    with pytest.raises(ValueError, match="pscore_cascade"):
        from_obp_slate(bad)
    bad = to_obp_slate(data)
    bad["position"] = bad["position"][::-1].copy()
    with pytest.raises(ValueError, match="sorted by slate_id"):
        from_obp_slate(bad)
