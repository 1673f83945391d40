"""Bring your own logs: the table schema (pandas, Parquet, CSV), policy persistence, and
``opl-rank fit / evaluate / rank`` end to end (docs/data_format.md)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from experiments.cli import main
from opl_rank import LoggedData, PLPolicy, RegressionPolicy, TwoStagePolicy, greedy_rankings, make_key
from opl_rank.io.persistence import load_policy, read_policy_spec, save_policy
from opl_rank.metrics import dcg_position_weights
from opl_rank.opl.reward_models import RewardModel, _SlotValues
from opl_rank.scorers import make_scorer

D, L, N = 5, 3, 2000
FIELDS = (
    "context",
    "ranking",
    "reward",
    "log_pi0_prefix",
    "position_weight",
    "log_pi0_position_marginal",
    "item_features",
    "item_mask",
)


@pytest.fixture(scope="module")
def logs():
    from simulators import SyntheticRankingEnv

    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, lam=0.5)
    return env.sample_logged_data(make_key(1), N, position_marginals="exact")


def assert_same(a: LoggedData, b: LoggedData) -> None:
    assert a.n_items == b.n_items
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            x, y = np.asarray(x), np.asarray(y)
            assert (x.dtype, x.shape) == (y.dtype, y.shape), name
            assert np.array_equal(x, y), name


# -- the table schema ------------------------------------------------------------------


def test_pandas_parquet_csv_round_trips_are_exact(logs, tmp_path):
    frame = logs.to_pandas()
    assert list(frame.columns) == ["context", "ranking", "reward", "log_pi0_prefix", "log_pi0_position_marginal"]
    assert frame.attrs["opl_rank"]["n_items"] == D and len(frame) == N
    assert_same(logs, LoggedData.from_pandas(frame))

    logs.to_parquet(tmp_path / "logs.parquet")
    assert_same(logs, LoggedData.from_parquet(tmp_path / "logs.parquet"))
    # a frame saved by pandas itself keeps the dataset-level values (DataFrame.attrs)
    frame.to_parquet(tmp_path / "pandas.parquet")
    assert_same(logs, LoggedData.from_parquet(tmp_path / "pandas.parquet"))

    masked = logs.replace(item_mask=np.ones((N, D), bool), item_features=None)
    masked.to_csv(tmp_path / "logs.csv")
    assert_same(masked, LoggedData.from_csv(tmp_path / "logs.csv"))
    masked.to_parquet(tmp_path / "masked.parquet")
    assert_same(masked, LoggedData.from_parquet(tmp_path / "masked.parquet"))
    with pytest.raises(ValueError, match="item_features"):
        logs.to_csv(tmp_path / "no.csv")


def small_frame():
    return pd.DataFrame(
        {
            "query_id": ["a", "b", "c"],  # other columns are ignored
            "context": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]],
            "ranking": [[0, 2], [1, 0], [3, 1]],
            "reward": [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
            "pi0_prefix": [[0.5, 0.25], [0.4, 0.2], [0.3, 0.1]],
        }
    )


def test_probabilities_defaults_and_text_cells():
    data = LoggedData.from_pandas(small_frame())
    assert data.n_items == 4  # max item index + 1
    np.testing.assert_allclose(np.exp(np.asarray(data.log_pi0_prefix[0])), [0.5, 0.25], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(data.position_weight), np.asarray(dcg_position_weights(2)))
    data = LoggedData.from_pandas(small_frame(), n_items=6, position_weight=[1.0, 0.5])
    assert data.n_items == 6 and np.asarray(data.position_weight).tolist() == [1.0, 0.5]
    with pytest.warns(DeprecationWarning, match="alpha= is now position_weight="):  # the old keyword, one release
        old = LoggedData.from_pandas(small_frame(), n_items=6, alpha=[1.0, 0.5])
    assert np.asarray(old.position_weight).tolist() == [1.0, 0.5]
    with pytest.raises(TypeError, match="not both"):
        LoggedData.from_pandas(small_frame(), position_weight=[1.0, 0.5], alpha=[1.0, 0.5])
    text = small_frame()
    for name in ("context", "ranking", "reward"):
        text[name] = [" ".join(str(v) for v in row) for row in text[name]]  # space-separated
    text["pi0_prefix"] = [json.dumps(row) for row in text["pi0_prefix"]]  # JSON
    text["item_mask"] = "[True, True, True, True]"  # a Python literal, as DataFrame.to_csv writes
    expected = LoggedData.from_pandas(small_frame()).replace(item_mask=np.ones((3, 4), bool))
    assert_same(expected, LoggedData.from_pandas(text))


def edit(column, row, value):
    def apply(frame):
        frame.at[row, column] = value
        return frame

    return apply


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda f: f.drop(columns="reward"), "missing column 'reward'"),
        (lambda f: f.drop(columns="pi0_prefix"), "missing column 'log_pi0_prefix' (or 'pi0_prefix')"),
        (edit("ranking", 1, [1]), "column 'ranking': row 1 has length 1, expected 2"),
        (edit("pi0_prefix", 2, [1.2, 0.1]), "column 'pi0_prefix': row 2 slot 0 holds 1.2 > 1"),
        (edit("reward", 1, [float("nan"), 1.0]), "column 'reward': row 1 slot 0 is NaN"),
        (edit("ranking", 2, [1, 1]), "column 'ranking': repeats an item within a row (1 rows), first row 2"),
        (edit("context", 0, "0.1 x"), "column 'context': row 0 holds '0.1 x', not a list"),
        (lambda f: f.assign(n_items=[4, 4, 5]), "column 'n_items': row 2 must hold the same value"),
    ],
)
def test_table_errors_name_the_column_and_the_row(change, message):
    with pytest.raises(ValueError) as err:
        LoggedData.from_pandas(change(small_frame()))
    assert message in str(err.value)


def test_log_propensity_above_zero_and_file_errors(tmp_path):
    frame = small_frame().drop(columns="pi0_prefix").assign(log_pi0_prefix=[[-0.5, -1.0], [0.2, -1.0], [-1.0, -2.0]])
    with pytest.raises(ValueError, match=r"column 'log_pi0_prefix': row 1 slot 0 holds 0.2 > 0"):
        LoggedData.from_pandas(frame)
    path = tmp_path / "bad.parquet"
    small_frame().assign(ranking=[[0, 2], [1, 0, 3], [3, 1]]).to_parquet(path)
    with pytest.raises(ValueError, match=r"bad.parquet: column 'ranking': row 1 has length 3"):
        LoggedData.from_parquet(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        LoggedData.from_parquet(tmp_path / "missing.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="junk.parquet: not a readable Parquet file"):
        LoggedData.from_parquet(tmp_path / "junk.parquet")


# -- policy persistence ----------------------------------------------------------------


def _perturbed(params, seed):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(make_key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def _pl(context, k, hidden=()):
    module = make_scorer(D, hidden)
    return PLPolicy(module, _perturbed(module.init(make_key(1), context[:1]), 2), k)


def _reward_model(context, kind):
    module = _SlotValues(n_items=D, hidden=(), pairwise=kind == "pairwise")
    params = module.init(make_key(3), context[:1], jnp.zeros((1, L), jnp.int32))
    return RewardModel(kind, module, _perturbed(params, 4), dcg_position_weights(L))


POLICIES = {
    "pl": lambda x: _pl(x, L, hidden=(4,)),
    "regression-additive": lambda x: RegressionPolicy(_reward_model(x, "additive")),
    "two-stage-additive": lambda x: TwoStagePolicy(_pl(x, 1), _reward_model(x, "additive")),
    "two-stage-pairwise": lambda x: TwoStagePolicy(_pl(x, 2), _reward_model(x, "pairwise")),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_saved_policies_rank_identically(name, tmp_path):
    context = jax.random.normal(make_key(5), (64, 4), jnp.float32)
    policy = POLICIES[name](context)
    save_policy(policy, tmp_path / "p", metadata={"note": name})
    loaded = load_policy(tmp_path / "p")
    assert type(loaded) is type(policy)
    key = make_key(6)
    sampled = policy.sample(key, context)
    assert np.array_equal(np.asarray(sampled), np.asarray(loaded.sample(key, context)))
    assert np.array_equal(np.asarray(greedy_rankings(policy, context)), np.asarray(greedy_rankings(loaded, context)))
    assert np.array_equal(np.asarray(policy.log_prob(context, sampled)), np.asarray(loaded.log_prob(context, sampled)))
    spec = read_policy_spec(tmp_path / "p")
    assert (spec["n_items"], spec["n_slots"], spec["context_dim"], spec["metadata"]) == (D, L, 4, {"note": name})
    assert spec["k"] == {"pl": L, "two-stage-additive": 1, "two-stage-pairwise": 2}.get(name, 0)


def test_loading_errors_name_the_file(tmp_path):
    context = jnp.ones((2, 4), jnp.float32)
    with pytest.raises(FileNotFoundError, match="no such policy directory"):
        load_policy(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty/policy.json: no such file"):
        load_policy(tmp_path / "empty")
    directory = tmp_path / "p"
    save_policy(_pl(context, 2), directory)
    spec_file, params_file = directory / "policy.json", directory / "params.msgpack"
    spec = json.loads(spec_file.read_text())
    spec_file.write_text(json.dumps({**spec, "format_version": "2.0"}))
    with pytest.raises(ValueError, match=r"policy.json: policy format version '2.0'"):
        load_policy(directory)
    spec_file.write_text("{ not json")
    with pytest.raises(ValueError, match=r"policy.json: not a readable policy spec"):
        load_policy(directory)
    spec_file.write_text(json.dumps(spec))
    params_file.write_bytes(params_file.read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"params.msgpack: checksum does not match"):
        load_policy(directory)
    params_file.unlink()
    with pytest.raises(FileNotFoundError, match=r"params.msgpack: no such file"):
        load_policy(directory)
    with pytest.raises(TypeError, match="saves PLPolicy, RegressionPolicy and TwoStagePolicy"):
        save_policy(object(), tmp_path / "q")


# -- the command line end to end -------------------------------------------------------


@pytest.mark.extended
@pytest.mark.slow
def test_fit_evaluate_rank_end_to_end(logs, tmp_path, capsys):
    from experiments.byo_logs import format_evaluation

    data_path, policy_dir = tmp_path / "logs.parquet", tmp_path / "policy"
    logs.to_parquet(data_path)
    assert (
        main(
            [
                "fit",
                "--data",
                str(data_path),
                "--method",
                "rpod",
                "--k",
                "auto",
                "--k-candidates",
                "0,1",
                "--out",
                str(policy_dir),
                "--epochs",
                "3",
                "--reward-epochs",
                "3",
                "--json",
            ]
        )
        == 0
    )
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["k"] in (0, 1) and [row["k"] for row in fitted["k_selection"]] == [0, 1]
    assert fitted["policy"] == ("RegressionPolicy" if fitted["k"] == 0 else "TwoStagePolicy")
    spec = read_policy_spec(policy_dir)
    assert spec["config"]["method"] == "rpod" and spec["config"]["k"] == fitted["k"]
    policy = load_policy(policy_dir)

    assert main(["evaluate", "--policy", str(policy_dir), "--data", str(data_path), "--n-samples", "64", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["estimates"]) == ["dm", "ips", "snips", "dr", "iips", "rips", "topk"]
    for row in report["estimates"].values():
        assert row["value"] is not None and row["ci_low"] <= row["value"] <= row["ci_high"]
        assert {"stderr", "ess", "max_weight"} <= set(row)
    table = format_evaluation(report)
    assert "estimator" in table and "snips" in table and "logged (logging policy) value" in table

    contexts = pd.DataFrame({"id": np.arange(50), "context": list(np.asarray(logs.context[:50]))})
    contexts.to_parquet(tmp_path / "contexts.parquet")
    out = tmp_path / "rankings.parquet"
    assert (
        main(["rank", "--policy", str(policy_dir), "--contexts", str(tmp_path / "contexts.parquet"), "--out", str(out)])
        == 0
    )
    ranked = pd.read_parquet(out)
    assert list(ranked.columns) == ["id", "ranking"] and ranked["id"].tolist() == list(range(50))
    expected = np.asarray(greedy_rankings(policy, logs.context[:50]))
    assert np.array_equal(np.stack(ranked["ranking"].to_numpy()), expected)
    assert "ranking" in capsys.readouterr().out


def test_cli_errors_name_the_option(logs, tmp_path, capsys):
    data_path = tmp_path / "logs.parquet"
    logs.take(np.arange(50)).to_parquet(data_path)
    ragged = tmp_path / "ragged.parquet"
    small_frame().assign(ranking=[[0, 2], [1], [3, 1]]).to_parquet(ragged)
    cases = [
        (["fit", "--data", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "p")], "--data ", "no such file"),
        (
            ["fit", "--data", str(data_path), "--k", "7", "--out", str(tmp_path / "p")],
            "--k must be 'auto' or an int in [0, L=3]",
            "",
        ),
        (
            ["fit", "--data", str(data_path), "--method", "ips", "--k", "1", "--out", str(tmp_path / "p")],
            "--k is only for --method rpod",
            "",
        ),
        (
            ["fit", "--data", str(ragged), "--out", str(tmp_path / "p")],
            "ragged.parquet: column 'ranking': row 1 has length 1",
            "--data",
        ),
        (["fit", "--data", str(tmp_path / "logs.txt"), "--out", str(tmp_path / "p")], "--data ", "no such file"),
        (
            ["evaluate", "--policy", str(tmp_path / "nowhere"), "--data", str(data_path)],
            "--policy ",
            "no such policy directory",
        ),
    ]
    for args, first, second in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert first in err and second in err, err
    assert not os.path.exists(tmp_path / "p")
