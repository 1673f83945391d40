"""The Open Bandit Dataset sample shipped with obp: the converter, BTS's action distribution,
and opl_rank's position-wise IPS / SNIPS equal to obp's IPW / SNIPW on the same real logs."""

import numpy as np
import pytest

pytest.importorskip("obp.ope", reason="obp is not installed (scripts/setup.sh --test installs it)")
pd = pytest.importorskip("pandas")

import jax.numpy as jnp  # noqa: E402

from opl_rank import make_key  # noqa: E402
from opl_rank.io import obd  # noqa: E402
from opl_rank.opl import ope

pytestmark = pytest.mark.obp
N_SIM = 2000  # BTS's Monte Carlo action distribution (the check itself uses 100,000)


@pytest.fixture(scope="module")
def sample():
    try:
        return obd.sample_path()
    except FileNotFoundError as err:
        pytest.skip(f"obp's OBD sample is not installed: {err}")


@pytest.fixture(scope="module")
def logs(sample):
    return {policy: obd.load_obd(policy, "all") for policy in obd.BEHAVIOR_POLICIES}


@pytest.fixture(scope="module")
def bts_dist(sample):
    return obd.bts_action_dist("all", n_sim=N_SIM)


def test_load_obd_is_the_shipped_csv_sorted_by_time(sample, logs):
    for policy, feedback in logs.items():
        raw = pd.read_csv(sample / policy / "all" / "all.csv", index_col=0).sort_values("timestamp")
        assert feedback["n_rounds"] == len(raw) == 10_000
        assert feedback["n_actions"] == 80 and feedback["action_context"].shape[0] == 80
        np.testing.assert_array_equal(feedback["action"], raw["item_id"].to_numpy())
        np.testing.assert_array_equal(feedback["position"], raw["position"].to_numpy() - 1)  # 0-based
        np.testing.assert_array_equal(feedback["reward"], raw["click"].to_numpy())
        np.testing.assert_array_equal(feedback["pscore"], raw["propensity_score"].to_numpy())
        assert feedback["context"].shape[0] == 10_000 and np.isfinite(feedback["context"]).all()
    np.testing.assert_allclose(logs["random"]["pscore"], 1 / 80)  # uniform over 80 items at each position
    assert (logs["bts"]["pscore"] > 0).all() and (logs["bts"]["pscore"] <= 1).all()


def test_from_obd_one_slot_rounds_with_position_in_context(logs):
    for feedback in logs.values():
        data = obd.from_obd(feedback)
        n = feedback["n_rounds"]
        assert (data.n_rounds, data.ranking_length, data.n_items) == (n, 1, 80)
        assert data.context.shape == (n, 3 + feedback["context"].shape[1])
        np.testing.assert_array_equal(np.asarray(obd.positions(data.context, 3)), feedback["position"])
        np.testing.assert_array_equal(np.asarray(data.ranking[:, 0]), feedback["action"])
        np.testing.assert_array_equal(np.asarray(data.reward[:, 0]), feedback["reward"])
        pscore = np.exp(np.asarray(data.log_pi0_position_marginal[:, 0], np.float64))
        np.testing.assert_allclose(pscore, feedback["pscore"], rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(data.log_pi0_prefix), np.asarray(data.log_pi0_position_marginal))
        assert set(np.unique(np.asarray(data.reward))) <= {0.0, 1.0}
        assert data.item_features.shape == (80, 4)


def test_from_obd_rejects_bad_feedback(logs):
    feedback = dict(logs["random"])
    with pytest.raises(ValueError, match="pscore"):
        obd.from_obd({**feedback, "pscore": np.zeros(10_000)})
    with pytest.raises(ValueError, match="position"):
        obd.from_obd(feedback, len_list=2)
    with pytest.raises(ValueError, match="lacks"):
        obd.from_obd({k: v for k, v in feedback.items() if k != "pscore"})
    with pytest.raises(ValueError, match="rows"):
        obd.from_obd({**feedback, "reward": feedback["reward"][:-1]})


def test_bts_action_dist_is_obps_exactly(bts_dist):
    from obp.policy import BernoulliTS

    theirs = BernoulliTS(
        n_actions=80, len_list=3, is_zozotown_prior=True, campaign="all", random_state=12345
    ).compute_batch_action_dist(n_rounds=1, n_sim=N_SIM)[0]
    np.testing.assert_array_equal(bts_dist, theirs)
    np.testing.assert_allclose(bts_dist.sum(axis=0), 1.0)
    men = obd.bts_action_dist("men", n_sim=100, chunk=7)  # chunking does not change the draws
    np.testing.assert_array_equal(men, obd.bts_action_dist("men", n_sim=100))
    assert men.shape == (34, 3)


def test_positionwise_policy_propensities(logs, bts_dist):
    data = obd.from_obd(logs["random"])
    policy = obd.PositionwisePolicy(bts_dist)
    target = policy.propensities(data, slot_marginals=True)
    expected = bts_dist[logs["random"]["action"], logs["random"]["position"]]
    np.testing.assert_allclose(np.exp(np.asarray(target.log_prefix[:, 0], np.float64)), expected, rtol=1e-5, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(target.log_slot), np.asarray(target.log_prefix))
    drawn = np.asarray(policy.sample(make_key(0), data.context))
    assert drawn.shape == (data.n_rounds, 1)
    assert (bts_dist[drawn[:, 0], logs["random"]["position"]] > 0).all()  # only items BTS can show there
    with pytest.raises(ValueError, match="sum to 1"):
        obd.PositionwisePolicy(2 * bts_dist)


def test_opl_rank_ips_snips_equal_obp_on_the_random_logs(logs, bts_dist):
    data = obd.from_obd(logs["random"])
    ours = ope.evaluate(
        obd.PositionwisePolicy(bts_dist), data, make_key(0), estimators=("ips", "snips", "iips", "rips"), ci="normal"
    )
    theirs = obd.obp_estimates(logs["random"], bts_dist, n_bootstrap=50)
    for name in ("ips", "snips"):
        assert ours[name].value == pytest.approx(theirs[name]["value"], rel=1e-5), name
        assert theirs[name]["ci_low"] <= theirs[name]["value"] <= theirs[name]["ci_high"]
    # one slot per round: the position-wise estimators are IPS
    assert ours["iips"].value == pytest.approx(ours["ips"].value, rel=1e-6)
    assert ours["rips"].value == pytest.approx(ours["ips"].value, rel=1e-6)
    # by hand, in float64
    w = bts_dist[logs["random"]["action"], logs["random"]["position"]] / logs["random"]["pscore"]
    r = logs["random"]["reward"]
    assert ours["ips"].value == pytest.approx(np.mean(w * r), rel=1e-5)
    assert ours["ips"].stderr == pytest.approx(np.std(w * r, ddof=1) / np.sqrt(len(r)), rel=1e-4)
    assert ours["snips"].value == pytest.approx(np.sum(w * r) / np.sum(w), rel=1e-5)


def test_bts_from_random_table_is_sane(sample):
    rows = obd.bts_from_random("all", n_sim=N_SIM, n_bootstrap=50, key=make_key(1))
    table = pd.DataFrame(rows)
    assert list(table["source"]) == ["on-policy", "baseline", "opl_rank", "opl_rank", "obp", "obp"]
    assert ((table["value"] >= 0) & (table["value"] <= 1)).all()
    assert ((table["ci_low"] <= table["value"]) & (table["value"] <= table["ci_high"])).all()
    truth = table.iloc[0]
    assert truth["value"] == pytest.approx(0.0042) and truth["rel_error"] == 0.0  # 42 clicks in 10,000 BTS rows
    for name in ("ips", "snips"):
        ours = table[(table.source == "opl_rank") & (table.estimator == name)]["value"].item()
        theirs = table[(table.source == "obp") & (table.estimator == name)]["value"].item()
        assert ours == pytest.approx(theirs, rel=1e-5)
    assert np.isfinite(table["rel_error"]).all()
    assert jnp.isfinite(jnp.asarray(table["stderr"].iloc[:4].to_numpy())).all()
