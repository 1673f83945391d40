"""A sweep never writes a silently wrong table: kill -9 at random points resumes to the
identical table; corrupt or foreign cell files are named and recomputed; a changed config
into the same folder is refused (or moved to a subfolder with ``--new-config``); one run per
folder; worker processes die with their parent."""

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from experiments.cli import main
from experiments.folder_lock import folder_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "experiments/configs/synthetic_opl_small.yaml"
SMALL = [
    "--set",
    "n_items=5",
    "--set",
    "ranking_length=3",
    "--set",
    "lam=0.5",
    "--set",
    "n=300",
    "--set",
    "methods=ips,regression",
    "--set",
    "ks=1",
    "--set",
    "reward_models=additive",
    "--set",
    "eval_contexts=500",
    "--set",
    "policy_epochs=2",
    "--set",
    "reward_epochs=2",
    "--set",
    "vmap_seeds=false",
]


def _sweep_args(out, seeds="0,1", *extra):
    return ["sweep", "--config", CONFIG, *SMALL, "--set", f"seeds={seeds}", "--set", f"output_dir={out}", *extra]


def _table(path):
    with open(path) as f:
        return [{k: v for k, v in row.items() if k != "fit_seconds"} for row in csv.DictReader(f)]


def _subprocess_sweep(out, seeds, cache, *extra):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "experiments.cli",
            "sweep",
            "--config",
            CONFIG,
            *SMALL,
            "--set",
            f"seeds={seeds}",
            "--set",
            f"output_dir={out}",
            "--compilation-cache",
            str(cache),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_changed_config_is_refused_before_any_work_or_goes_to_a_new_subfolder(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(_sweep_args(out, "0", "--json")) == 0
    capsys.readouterr()
    before = (out / "results.csv").read_text()
    cell_times = {p: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}

    # Other methods into the same folder: an error naming the key, and nothing touched.
    changed = _sweep_args(out, "0", "--set", "methods=ips,rips")
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "holds results of a different config" in err and "methods" in err and "--new-config" in err
    assert (out / "results.csv").read_text() == before
    assert {p: p.stat().st_mtime_ns for p in (out / "cells").iterdir()} == cell_times
    assert "- regression" in (out / "config.yaml").read_text()

    # --new-config: a fresh subfolder whose config.yaml and results.csv agree.
    assert main([*changed, "--new-config", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sub = summary["output_dir"]
    assert os.path.dirname(sub) == str(out) and os.path.basename(sub).startswith("config-")
    assert summary["resumed"] == 0
    assert {r["method"] for r in _table(os.path.join(sub, "results.csv"))} == {"ips", "rips"}
    assert "- rips" in open(os.path.join(sub, "config.yaml")).read()
    assert (out / "results.csv").read_text() == before  # the first run's table is untouched


def test_bad_cell_files_are_named_and_recomputed(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = _sweep_args(out, "0,1,2,3", "--json")
    assert main(args) == 0
    capsys.readouterr()
    reference = _table(out / "results.csv")
    cells = sorted((out / "cells").iterdir())
    assert len(cells) == 4
    text = cells[0].read_text()
    cells[0].write_text(text[: len(text) // 2])  # truncated
    cells[1].write_text("[]")  # the old bare-list format, and no rows
    record = json.loads(cells[2].read_text())
    record["config_hash"] = "0" * 64  # written by another config
    cells[2].write_text(json.dumps(record))
    record = json.loads(cells[3].read_text())
    record["rows"] = record["rows"][:-1]  # a row missing
    cells[3].write_text(json.dumps(record))

    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["resumed"] == 0
    for path, reason in zip(cells, ["truncated or not JSON", "no config hash", "written by another config", "row"]):
        line = next(line for line in captured.err.splitlines() if path.name in line and "recomputing" in line)
        assert reason in line, line
    assert _table(out / "results.csv") == reference


def test_one_run_per_folder(tmp_path, capsys):
    out = tmp_path / "sweep"
    with folder_lock(str(out), echo=lambda _: None) as holder:
        assert main(_sweep_args(out, "0")) == 2
    err = capsys.readouterr().err
    assert f"in use by pid {holder['pid']}" in err
    assert not (out / "results.csv").exists()
    assert main(_sweep_args(out, "0")) == 0  # released when the holder is done


@pytest.mark.slow
@pytest.mark.extended
def test_sigkill_at_random_points_resumes_to_the_identical_table(tmp_path, capsys):
    # Warm cells take 0.03-0.1 s here (n=3000), so the kills wait for a cell file to appear
    # and then a random fraction of a cell, not of a second: twelve cells leave room for
    # every kill to land mid-sweep.
    seeds = ",".join(str(s) for s in range(12))
    heavier = ("--set", "n=3000")
    cache = tmp_path / "jax"
    reference_dir = tmp_path / "reference"
    assert main([*_sweep_args(reference_dir, seeds, *heavier), "--compilation-cache", str(cache)]) == 0
    capsys.readouterr()
    reference = _table(reference_dir / "results.csv")
    assert len(reference) == 12 * 2

    out = tmp_path / "killed"
    cells = out / "cells"

    def finished():
        return len([p for p in cells.iterdir() if p.suffix == ".json"]) if cells.exists() else 0

    rng = random.Random(0)
    progress = []
    for attempt in range(5):
        # The first kill lands during start-up; later ones after one or two more cells
        # were written, plus a random fraction of a cell (mid-cell, mid-write, ...).
        target = 0 if attempt == 0 else min(finished() + rng.randint(1, 2), 8)
        proc = _subprocess_sweep(out, seeds, cache, *heavier)
        deadline = time.monotonic() + 120
        while finished() < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05) if attempt else rng.uniform(0.0, 1.0))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        progress.append(finished())
        assert proc.returncode == -signal.SIGKILL, (progress, proc.stderr.read())
    assert progress[0] < 12 and any(0 < p < 12 for p in progress), progress  # kills landed mid-sweep
    final = _subprocess_sweep(out, seeds, cache, *heavier)
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    assert _table(out / "results.csv") == reference


@pytest.mark.slow
@pytest.mark.extended
def test_ctrl_c_at_random_points_ends_with_one_line_and_resumes(tmp_path):
    """SIGINT (Ctrl-C) at start-up, mid-cell and between cells: exit 130, one line saying
    what was kept and how to resume, no traceback; the resumed table is the uninterrupted one."""
    seeds = "0,1,2"
    cache = tmp_path / "jax"
    reference_dir = tmp_path / "reference"
    done = _subprocess_sweep(reference_dir, seeds, cache)
    assert done.wait(timeout=300) == 0
    reference = _table(reference_dir / "results.csv")
    out = tmp_path / "interrupted"
    cells = out / "cells"

    def finished():
        return len([p for p in cells.iterdir() if p.suffix == ".json"]) if cells.exists() else 0

    rng = random.Random(1)
    stopped = []
    for attempt in range(3):
        proc = _subprocess_sweep(out, seeds, cache)
        target = 0 if attempt == 0 else min(finished() + 1, 2)
        deadline = time.monotonic() + 120
        while finished() < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.2, 1.5) if attempt == 0 else rng.uniform(0.0, 0.8))
        if proc.poll() is not None:
            continue  # it finished first: nothing to interrupt
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if proc.returncode == 0 and finished() == 3:
            continue  # it finished while the signal was on its way: complete, and says so
        stopped.append(finished())
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        last = [line for line in err.splitlines() if line.strip()][-1]
        assert last.startswith("opl-rank sweep: interrupted"), err
        if "cell(s) finished" in last:
            assert "rerun the same command to resume" in last and str(out) in last, last
    assert stopped, "every run finished before it could be interrupted"
    final = _subprocess_sweep(out, seeds, cache)
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    assert _table(out / "results.csv") == reference


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads the process table from /proc (Linux)")
def test_worker_processes_die_with_their_parent(tmp_path):
    proc = _subprocess_sweep(
        tmp_path / "sweep", "0,1,2,3", tmp_path / "jax", "--backend", "processes", "--workers", "2"
    )
    deadline = time.monotonic() + 60
    workers = []
    while time.monotonic() < deadline and len(workers) < 2:
        time.sleep(0.2)
        workers = [p for p in _children(proc.pid) if b"spawn_main" in _cmdline(p)]
    assert len(workers) >= 2, "the sweep did not start its worker processes"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    survivors = [p for p in workers if _alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"worker processes {survivors} outlived their killed parent"


def test_growing_the_grid_reuses_the_cells_already_there(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(_sweep_args(out, "0", "--json")) == 0
    first = _table(out / "results.csv")
    capsys.readouterr()
    assert main(_sweep_args(out, "0,1", "--json")) == 0  # one more seed: only that cell runs
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["cells"] == 2 and summary["resumed"] == 1
    assert "grid changed (seeds)" in captured.err
    grown = _table(out / "results.csv")
    assert [r for r in grown if r["seed"] == "0"] == first
    assert "- 1" in (out / "config.yaml").read_text()  # config.yaml lists the grown grid


def test_ctrl_c_after_the_work_is_done_does_not_change_the_exit_status():
    """A Ctrl-C that lands once main() has returned (the interpreter tearing down, where Python
    restores the default handler) neither kills the process by signal nor reports an interrupt."""
    script = (
        "import atexit, os, signal, time\n"
        "from experiments import cli\n"
        "cli.main = lambda: 0\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
        "cli.console_main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "interrupted" not in done.stderr, done.stderr
