"""Every notebook is a real ``.ipynb`` in step with its source, and runs top to bottom in Jupyter.

Each ``notebooks/NAME.py`` (percent format, the file to edit) has a committed
``notebooks/NAME.ipynb`` generated from it by ``scripts/sync_notebooks.py`` (jupytext):

* ``test_ipynb_matches_its_source`` (fast): the ``.ipynb`` exists, is valid nbformat 4 with
  the ``python3`` kernel, holds the same cells (type and source) as the ``.py`` and no outputs;
* ``test_notebook_executes_at_smallest_size`` (slow): the ``.ipynb`` is executed by nbclient
  in a fresh ``python3`` kernel of this interpreter (ipykernel's own kernel spec, so the
  venv's; checked), from ``notebooks/`` as Jupyter runs it, with
  ``OPL_RANK_NOTEBOOK_SIZE=smallest`` and its output folder ``OPL_RANK_NOTEBOOK_OUT`` in a
  temporary directory, and matplotlib's inline backend (``MPLBACKEND`` is not passed on). No
  cell may fail, at least one plot must be displayed inline (an ``image/png`` output), every
  CSV it writes must parse and be non-empty, at least one PNG must be written, and the CSVs
  of the notebooks listed in ``EXPECTED_COLUMNS`` must have those columns. Kernels are
  separate processes, so ``conftest.py``'s strict JAX promotion does not apply: notebooks
  run as users run them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.py"))
SYNC = ".venv/bin/python scripts/sync_notebooks.py"

# notebook stem -> {csv file name: columns it must have}
EXPECTED_COLUMNS = {
    "exposure_ltr_curves": {
        "curves.csv": {
            "estimator",
            "n_samples",
            "seed",
            "epoch",
            "valid_ndcg@10",
            "train_loss",
            "valid_loss",
            "seconds",
        },
    },
    "opl_quickstart": {"policies.csv": {"policy", "V_true", "V0", "dr", "snips", "dr_ess"}},
    "opl_sweep_analysis": {"k_selection.csv": {"k_true_best", "k_selected", "gain_lost"}},
}
# notebook stem -> shipped data sets it reads (simulators.datasets; checked before the run)
NEEDS_DATA = {
    "exposure_ltr_curves": ["yahoo_sample"],
}
CELL_TIMEOUT_S = 600


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/*.py found"


def _cells(nb) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in nb.cells]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_ipynb_matches_its_source(notebook):
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")

    ipynb = notebook.with_suffix(".ipynb")
    assert ipynb.exists(), f"notebooks/{ipynb.name} is missing: run {SYNC}"
    nb = nbformat.read(ipynb, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", (
        f"{ipynb.name}: kernelspec is not python3: run {SYNC}"
    )
    source = jupytext.read(notebook, fmt="py:percent")
    ours, theirs = _cells(nb), _cells(source)
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        pytest.fail(
            f"notebooks/{ipynb.name} is not in step with notebooks/{notebook.name} ({len(ours)} vs {len(theirs)} "
            f"cells, first difference at cell {first}): edit the .py, then run {SYNC}"
        )
    with_outputs = [i for i, cell in enumerate(nb.cells) if cell.get("outputs") or cell.get("execution_count")]
    assert not with_outputs, (
        f"notebooks/{ipynb.name} holds outputs in cells {with_outputs}: run {SYNC} (commits keep none)"
    )


def _inline_images(nb) -> int:
    return sum(
        "image/png" in output.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") in ("display_data", "execute_result")
    )


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_at_smallest_size(notebook, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from nbclient.exceptions import CellExecutionError

    from simulators import datasets

    for name in NEEDS_DATA.get(notebook.stem, []):
        datasets.verify(name)  # the shipped file is there and intact

    ipynb = notebook.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.fail(f"notebooks/{ipynb.name} is missing: run {SYNC}")
    nb = nbformat.read(ipynb, as_version=4)
    # Last, an extra cell that reports the kernel's interpreter (not saved anywhere).
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.prefix)"))

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernel's inline backend
    env.update(
        OPL_RANK_NOTEBOOK_SIZE="smallest",
        OPL_RANK_NOTEBOOK_OUT=str(out),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        MPLCONFIGDIR=str(tmp_path / "mpl"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    client = nbclient.NotebookClient(
        nb,
        kernel_name=nb.metadata.get("kernelspec", {}).get("name", "python3"),
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        resources={"metadata": {"path": str(notebook.parent)}},  # the working directory, as in Jupyter
    )
    try:
        client.execute(env=env)
    except CellExecutionError as err:
        pytest.fail(f"notebooks/{ipynb.name} failed:\n{str(err)[-6000:]}")

    reported = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream").strip()
    assert reported == sys.prefix, f"the kernel ran in {reported!r}, not in this environment {sys.prefix!r}"
    assert _inline_images(nb) >= 1, f"notebooks/{ipynb.name} displayed no plot inline (leave its figures open)"

    csvs = sorted(out.glob("*.csv"))
    assert csvs, f"{ipynb.name} wrote no CSV into {out}"
    for csv in csvs:
        table = pd.read_csv(csv)
        assert len(table) > 0, f"{csv.name} is empty"
    for name, columns in EXPECTED_COLUMNS.get(notebook.stem, {}).items():
        assert (out / name).exists(), f"{ipynb.name} did not write {name}"
        table = pd.read_csv(out / name)
        assert columns <= set(table.columns), f"{name} lacks columns {sorted(columns - set(table.columns))}"
    pngs = sorted(out.glob("*.png"))
    assert pngs, f"{ipynb.name} wrote no PNG into {out}"
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png.name} is not a PNG"
    assert not list(out.glob(".tmp-*")), "temporary files left behind"
