"""Reading logs: a number beyond float32's range says so (no NumPy overflow warning first),
and the OBD loaders without obp say how to install it."""

import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from opl_rank import LoggedData


def _frame(**columns) -> pd.DataFrame:
    base = {
        "context": [[0.1, 0.2], [0.3, 0.4]],
        "ranking": [[0, 1], [1, 2]],
        "reward": [[0.0, 1.0], [0.0, 1.0]],
        "pi0_prefix": [[0.5, 0.25], [0.5, 0.25]],
    }
    return pd.DataFrame({**base, **columns})


CASES = {
    "reward": (dict(reward=[[0.0, 1.0], [1e39, 0.0]]), r"column 'reward': row 1( \(line 3\))? slot 0 holds 1e\+39"),
    "context": (
        dict(context=[[0.1, 0.2], [0.3, -1e39]]),
        r"column 'context': row 1( \(line 3\))? slot 1 holds -1e\+39",
    ),
    "log-propensity": (
        dict(pi0_prefix=None, log_pi0_prefix=[[-0.5, -1.0], [-0.5, -1e39]]),
        r"column 'log_pi0_prefix': row 1( \(line 3\))? slot 1 holds -1e\+39",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("source", ["pandas", "csv", "parquet"])
def test_a_value_beyond_float32_is_named_without_a_runtime_warning(case, source, tmp_path):
    columns, where = CASES[case]
    frame = _frame(**columns)
    frame = frame.drop(columns=[c for c in frame.columns if frame[c].isna().all()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=where + r", which exceeds float32's range \(~3.4e38") as error:
            if source == "pandas":
                LoggedData.from_pandas(frame)
            elif source == "csv":
                frame.to_csv(tmp_path / "logs.csv", index=False)
                LoggedData.from_csv(tmp_path / "logs.csv")
            else:
                frame.to_parquet(tmp_path / "logs.parquet")
                LoggedData.from_parquet(tmp_path / "logs.parquet")
    assert "non-finite" not in str(error.value)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]


def test_dataset_level_values_beyond_float32_are_named():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match=r"position_weight \(alpha\) entry 1 holds 1e\+39, which exceeds float32"):
            LoggedData.from_pandas(_frame(), position_weight=[1.0, 1e39])
        frame = _frame()
        frame.attrs["opl_rank"] = {"n_items": 3, "item_features": [[1.0], [2.0], [3e39]]}
        with pytest.raises(ValueError, match=r"column 'item_features': item \[2, 0\] holds 3e\+39, which exceeds"):
            LoggedData.from_pandas(frame)


def test_logged_data_itself_names_the_field_and_the_slot():
    reward = np.zeros((2, 2))
    reward[1, 1] = 1e39
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(
            ValueError,
            match=r"LoggedData.reward: 1 value\(s\) exceed float32's range \(~3.4e38, .*first 1e\+39 at row 1 slot 1",
        ):
            LoggedData(
                context=np.zeros((2, 2)),
                ranking=np.array([[0, 1], [1, 2]]),
                reward=reward,
                log_pi0_prefix=np.log(np.full((2, 2), 0.5)),
                position_weight=np.ones(2),
                n_items=3,
            )


def test_obd_without_obp_says_how_to_install_it(monkeypatch):
    from opl_rank.io import obd

    for name in [m for m in sys.modules if m == "obp" or m.startswith("obp.")] + ["obp"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if obp were not installed
    calls = {
        "sample_path": obd.sample_path,
        "load_obd": lambda: obd.load_obd("random", "all"),
        "bts_action_dist": lambda: obd.bts_action_dist("all", n_sim=10),
        "obp_estimates": lambda: obd.obp_estimates({"n_rounds": 1}, np.ones((2, 1))),
    }
    for name, call in calls.items():
        with pytest.raises(ImportError) as error:
            call()
        message = str(error.value)
        assert "obp (Open Bandit Pipeline) is not installed" in message, name
        assert "`bash scripts/setup.sh --test`" in message and "obp 0.5.7 with --no-deps" in message, name
        assert "Why obp is installed separately" in message, name
