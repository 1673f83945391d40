"""The OPE-across-reward-structures experiment: rows, resume, report."""

import json
import os

import pytest

from experiments import ope_structures


@pytest.mark.extended
def test_rows_resume_and_report(tmp_path):
    out = str(tmp_path / "opes")
    args = ["--seeds", "1", "--ns", "300", "--structures", "cascade", "--n-items", "5", "--ranking-length", "3"]
    assert ope_structures.main([*args, "--output-dir", out]) == 0
    path = os.path.join(out, "rows", "cascade_n300_s000.json")
    row = json.load(open(path))
    assert set(ope_structures.ESTIMATORS) <= set(row) and row["structure"] == "cascade"
    # Cascade rewards: AIPS with the true c is RIPS on the same logs
    assert abs(row["aips"] - row["rips"]) <= 1e-4 * max(1.0, abs(row["rips"]))
    mtime = os.path.getmtime(path)
    assert ope_structures.main([*args, "--output-dir", out]) == 0  # resumes: nothing recomputed
    assert os.path.getmtime(path) == mtime
    report = open(os.path.join(out, "report.md")).read()
    assert "| cascade | 300 | 1 |" in report
    assert len(open(os.path.join(out, "rows.csv")).read().splitlines()) == 2
