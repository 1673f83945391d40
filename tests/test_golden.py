"""The golden sweep: a small sweep's rows equal the committed table (float tolerance).

``tests/golden/sweep_rows.csv`` was written by the code before the architecture refactor;
every later change must reproduce it. Timing columns are not compared. To regenerate after
an *intended* change of results (and say why in the commit):
    .venv/bin/python -m tests.test_golden --regenerate
"""

from __future__ import annotations

import csv
import math
import os
import sys

import pytest

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")
CONFIG = os.path.join(GOLDEN_DIR, "sweep.yaml")
ROWS = os.path.join(GOLDEN_DIR, "sweep_rows.csv")
KEY = ("method", "k", "reward_model", "lambda", "n", "seed", "selector")
IGNORED = {"fit_seconds"}  # timings differ run to run
RTOL, ATOL = 1e-4, 1e-5  # XLA may fuse differently across versions; results must not move more


def _run(out: str) -> list[dict[str, str]]:
    from experiments.cli import main

    assert main(["sweep", "--config", CONFIG, "--set", f"output_dir={out}"]) == 0
    with open(os.path.join(out, "results.csv"), encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _close(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) and math.isnan(y):
        return True
    return math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL)


@pytest.mark.slow
def test_golden_sweep_reproduces_the_committed_rows(tmp_path):
    with open(ROWS, encoding="utf-8") as f:
        expected = list(csv.DictReader(f))
    rows = _run(str(tmp_path / "golden"))
    assert len(rows) == len(expected)
    by_key = {tuple(r[c] for c in KEY): r for r in rows}
    assert len(by_key) == len(rows), "the golden key must identify rows"
    mismatches = []
    for want in expected:
        got = by_key.get(tuple(want[c] for c in KEY))
        assert got is not None, f"row {[want[c] for c in KEY]} is missing"
        for column, value in want.items():
            if column in IGNORED:
                continue
            if not _close(got.get(column, ""), value):
                mismatches.append(f"{[want[c] for c in KEY]} {column}: {got.get(column)!r} != golden {value!r}")
    assert not mismatches, "\n".join(mismatches[:20])


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            _run(os.path.join(tmp, "golden"))
            shutil.copy(os.path.join(tmp, "golden", "results.csv"), ROWS)
        print(f"wrote {ROWS}")
    else:
        print(__doc__)
