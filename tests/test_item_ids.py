"""Item ids in a logs table are checked against ``n_items`` when it is given and against a
plausible D when it is inferred: one stray id must not grow the catalog silently
(docs/data_format.md, "Item ids")."""

import numpy as np
import pandas as pd
import pytest

from experiments.cli import main
from opl_rank import LoggedData

L = 3


def _frame(ranking: np.ndarray) -> pd.DataFrame:
    n = len(ranking)
    return pd.DataFrame(
        {
            "context": [[0.1 * i, 0.2] for i in range(n)],
            "ranking": [list(map(int, r)) for r in ranking],
            "reward": [[0.0, 1.0, 0.0]] * n,
            "pi0_prefix": [[0.5, 0.25, 0.1]] * n,
        }
    )


def _rankings(n: int, n_items: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n_items)[:L] for _ in range(n)])


@pytest.fixture
def stray(tmp_path):
    """40 rounds over items 0..9 (all of them ranked), and one id 57 at row 7, slot 1."""
    ranking = _rankings(40, 10)
    assert len(np.unique(ranking)) == 10
    ranking[7, 1] = 57
    path = tmp_path / "stray.csv"
    _frame(ranking).to_csv(path, index=False)
    return path, ranking


def test_a_stray_id_is_refused_naming_it_the_row_and_n_items(stray, tmp_path):
    path, ranking = stray
    message = (
        r"stray.csv: column 'ranking': row 7 \(line 9\) slot 1 holds item id 57, far beyond the others "
        r"\(the next largest is 9\): n_items would be inferred as max id \+ 1 = 58, yet only 11 distinct "
        r"id\(s\) appear and 47 of the items 0..57 are never ranked. Pass n_items=58 \(opl-rank: --n-items 58\)"
    )
    with pytest.raises(ValueError, match=message):
        LoggedData.from_csv(path)
    with pytest.raises(ValueError, match=r"DataFrame: column 'ranking': row 7 slot 1 holds item id 57, far beyond"):
        LoggedData.from_pandas(_frame(ranking))
    _frame(ranking).to_parquet(tmp_path / "stray.parquet")
    with pytest.raises(ValueError, match=r"stray.parquet: column 'ranking': row 7 slot 1 holds item id 57"):
        LoggedData.from_parquet(tmp_path / "stray.parquet")


def test_with_n_items_the_stray_id_loads_or_is_out_of_range(stray):
    path, _ = stray
    data = LoggedData.from_csv(path, n_items=58)
    assert data.n_items == 58
    with pytest.raises(
        ValueError,
        match=r"stray.csv: column 'ranking': row 7 \(line 9\) slot 1 holds item id 57, not below n_items=10 "
        r"\(item ids are in \[0, 10\)\); 1 id\(s\) out of range",
    ):
        LoggedData.from_csv(path, n_items=10)


def test_an_item_mask_gives_n_items_and_bounds_the_ids(stray):
    _, ranking = stray
    frame = _frame(ranking).assign(item_mask=[[True] * 10] * len(ranking))
    with pytest.raises(ValueError, match=r"row 7 slot 1 holds item id 57, not below the item_mask's width n_items=10"):
        LoggedData.from_pandas(frame)
    wide = _frame(ranking).assign(item_mask=[[True] * 58] * len(ranking))
    assert LoggedData.from_pandas(wide).n_items == 58  # a declared width is not second-guessed


def test_a_negative_id_is_named(stray):
    _, ranking = stray
    ranking = ranking.copy()
    ranking[3, 2] = -4
    with pytest.raises(ValueError, match=r"column 'ranking': row 3 slot 2 holds item id -4; item ids are >= 0"):
        LoggedData.from_pandas(_frame(ranking), n_items=58)


def test_cli_fit_names_the_id_and_the_flag(stray, tmp_path, capsys):
    path, _ = stray
    out = tmp_path / "policy"
    assert main(["fit", "--data", str(path), "--out", str(out), "--method", "regression", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(
        f"opl-rank fit: error: --data {path}: column 'ranking': row 7 (line 9) slot 1 holds item id 57"
    )
    assert "--n-items 58" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("ids", "n_items"),
    [
        ([[0, 1, 2]], 3),  # one row, every item seen
        ([[0, 2, 5]], 6),  # a small file skipping a few ids: 3 never ranked
        ([[0, 1, 10], [2, 3, 4]], 11),  # 6 seen, 5 never ranked
    ],
)
def test_legitimate_small_files_still_load(ids, n_items):
    assert LoggedData.from_pandas(_frame(np.asarray(ids))).n_items == n_items


def test_the_rule_at_its_boundary():
    # U distinct ids, D = max + 1: refused when D - U > max(U, 8)
    assert LoggedData.from_pandas(_frame(np.asarray([[0, 1, 10]]))).n_items == 11  # 3 seen, 8 unseen
    with pytest.raises(ValueError, match="holds item id 11, far beyond the others"):
        LoggedData.from_pandas(_frame(np.asarray([[0, 1, 11]])))  # 3 seen, 9 unseen
    twenty = _rankings(200, 20, seed=1)
    assert len(np.unique(twenty)) == 20
    twenty[0, 0] = 39  # 21 seen (0..19 and 39), 19 unseen: loads
    assert LoggedData.from_pandas(_frame(twenty)).n_items == 40
    twenty[0, 0] = 41  # 21 seen (0..19 and 41), 21 unseen: loads (not more than U)
    assert LoggedData.from_pandas(_frame(twenty)).n_items == 42
    twenty[0, 0] = 42  # 43 items, 21 seen, 22 unseen: refused
    with pytest.raises(ValueError, match="holds item id 42, far beyond the others"):
        LoggedData.from_pandas(_frame(twenty))


def test_a_large_catalog_sampled_densely_loads():
    rng = np.random.default_rng(2)
    ranking = np.stack([rng.choice(200, L, replace=False) for _ in range(60)])  # ~150 of 200 items seen
    seen = len(np.unique(ranking))
    assert seen > (ranking.max() + 1) / 2
    assert LoggedData.from_pandas(_frame(ranking)).n_items == ranking.max() + 1


def test_a_file_that_records_n_items_is_not_inferred(stray, tmp_path):
    _, ranking = stray
    data = LoggedData.from_pandas(_frame(ranking), n_items=58)
    data.to_parquet(tmp_path / "recorded.parquet")  # n_items in the metadata
    assert LoggedData.from_parquet(tmp_path / "recorded.parquet").n_items == 58
    data.to_csv(tmp_path / "recorded.csv")  # n_items as a constant column
    assert LoggedData.from_csv(tmp_path / "recorded.csv").n_items == 58
