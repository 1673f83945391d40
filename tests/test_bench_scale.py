"""Smoke test of benchmarks/bench_scale.py: ``--quick`` runs and its JSON last line has the
expected keys (the real sizes are run by hand; docs/performance.md §10)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_scale.py"


@pytest.mark.extended
@pytest.mark.slow
def test_quick_run_reports_every_figure():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--methods", "ips"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in (
        "bench",
        "quick",
        "methods",
        "epochs",
        "batch_size",
        "devices",
        "matmul_gflops",
        "results",
        "jax_backend",
    ):
        assert name in summary, name
    assert summary["bench"] == "scale" and summary["quick"] and summary["matmul_gflops"] > 0
    (row,) = summary["results"]
    assert "error" not in row, row.get("error")
    for name in (
        "D",
        "L",
        "n",
        "method",
        "simulate_s",
        "simulate_compile_s",
        "compile_s",
        "epoch_s",
        "rows_per_s",
        "peak_rss_mb",
        "ips_flops_per_row",
        "ips_matmul_flops_per_row",
        "naive_epoch_s",
        "naive_grad_rel_diff",
    ):
        assert name in row, name
    assert row["method"] == "ips" and row["peak_rss_mb"] > 0 and row["ips_flops_per_row"] > 0
    assert row["naive_grad_rel_diff"] < 1e-3  # the naive baseline computes the library's gradient
    if row["epoch_s"] is not None:  # None only when an epoch is below the timing noise
        assert {"ips_gflops", "ips_fraction_of_matmul", "ratio_naive_over_ours"} <= set(row)


def test_unknown_method_is_an_error():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--methods", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "unknown methods" in proc.stderr
