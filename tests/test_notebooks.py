"""Every ``notebooks/*.py`` runs top to bottom at its smallest size and writes its outputs.

Each notebook runs in a fresh subprocess (so ``conftest.py``'s strict JAX promotion does not
apply: notebooks run as users run them) with ``OPL_RANK_NOTEBOOK_SIZE=smallest`` and its
output folder ``OPL_RANK_NOTEBOOK_OUT`` in a temporary directory. Every CSV it writes must
parse and be non-empty, at least one PNG must be written, and the CSVs of the notebooks
listed in ``EXPECTED_COLUMNS`` must have those columns.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.py"))

# notebook stem -> {csv file name: columns it must have}
EXPECTED_COLUMNS = {
    "exposure_ltr_curves": {
        "curves.csv": {"estimator", "n_samples", "seed", "epoch", "valid_ndcg@10", "train_loss", "valid_loss", "seconds"},
    },
    "opl_quickstart": {"policies.csv": {"policy", "V_true", "V0", "dr", "snips", "dr_ess"}},
    "opl_sweep_analysis": {"k_selection.csv": {"k_true_best", "k_selected", "gain_lost"}},
}
# notebook stem -> shipped data sets it reads (simulators.datasets; checked before the run)
NEEDS_DATA = {
    "exposure_ltr_curves": ["yahoo_sample"],
}


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/*.py found"


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_at_smallest_size(notebook, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from simulators import datasets

    for name in NEEDS_DATA.get(notebook.stem, []):
        datasets.verify(name)  # the shipped file is there and intact

    out = tmp_path / "out"
    env = dict(os.environ)
    env.update(
        OPL_RANK_NOTEBOOK_SIZE="smallest",
        OPL_RANK_NOTEBOOK_OUT=str(out),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        MPLBACKEND="Agg",
        MPLCONFIGDIR=str(tmp_path / "mpl"),
    )
    proc = subprocess.run(
        [sys.executable, str(notebook)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{notebook.name} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"

    csvs = sorted(out.glob("*.csv"))
    assert csvs, f"{notebook.name} wrote no CSV into {out}"
    for csv in csvs:
        table = pd.read_csv(csv)
        assert len(table) > 0, f"{csv.name} is empty"
    for name, columns in EXPECTED_COLUMNS.get(notebook.stem, {}).items():
        assert (out / name).exists(), f"{notebook.name} did not write {name}"
        table = pd.read_csv(out / name)
        assert columns <= set(table.columns), f"{name} lacks columns {sorted(columns - set(table.columns))}"
    pngs = sorted(out.glob("*.png"))
    assert pngs, f"{notebook.name} wrote no PNG into {out}"
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png.name} is not a PNG"
    assert not list(out.glob(".tmp-*")), "temporary files left behind"
