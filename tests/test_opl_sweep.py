"""The OPL sweep: tidy rows, ground truth, resume, and config errors."""

import csv
import json
import math

import pytest

from experiments.cli import main
from experiments.opl_sweep import OPLSweep, cells, method_rows

TINY = [
    "--set",
    "n_items=5",
    "--set",
    "ranking_length=3",
    "--set",
    "lam=0.5",
    "--set",
    "n=400",
    "--set",
    "seeds=0",
    "--set",
    "ks=0,1,3",
    "--set",
    "eval_contexts=2000",
    "--set",
    "policy_epochs=4",
    "--set",
    "reward_epochs=4",
]
CONFIG = "experiments/configs/synthetic_opl_small.yaml"


@pytest.mark.extended
@pytest.mark.slow
def test_sweep_writes_tidy_rows_and_resumes(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--config", CONFIG, *TINY, "--set", f"output_dir={out}", "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["cells"] == 1 and summary["resumed"] == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    expected = {(m, k, r) for m, k, r in method_rows(OPLSweep(ranking_length=(3,), ks=(0, 1, 3)), 3)}
    assert {(r["method"], int(r["k"]) if r["k"] else None, r["reward_model"]) for r in rows} == expected
    for r in rows:
        v, v0, vstar = float(r["V"]), float(r["V0"]), float(r["V_star"])
        assert vstar >= v - 4 * float(r["V_se"])  # nothing beats the optimum
        assert abs(float(r["normalized_gain"]) - (v - v0) / (vstar - v0)) < 1e-9
        assert r["V_star_method"] == "exact"
    pd = pytest.importorskip("pandas", reason="pandas is not installed (scripts/setup.sh --test installs it)")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (scripts/setup.sh --test installs it)")
    frame = pd.read_parquet(out / "results.parquet")
    assert len(frame) == len(rows) and list(frame.columns) == list(rows[0])
    assert frame["V"].tolist() == [float(r["V"]) for r in rows]
    by = {(r["method"], r["k"], r["reward_model"]): float(r["V"]) for r in rows}
    assert by[("rpod", "0", "additive")] == by[("regression", "", "additive")]  # k = 0 is regression
    assert by[("rpod", "3", "pairwise")] == by[("dr", "", "pairwise")]  # k = L is DR
    # A rerun resumes: nothing is fitted again and the table is the same.
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["resumed"] == 1
    assert (out / "results.csv").read_text().count("\n") == len(rows) + 1


def test_grid_and_rows():
    sweep = OPLSweep(n_items=(10, 50), lam=(0.0, 1.0), n=(100,), seeds=(0, 1, 2))
    assert len(cells(sweep)) == 2 * 2 * 3
    rows = method_rows(sweep, 5)
    assert len(rows) == 3 + 2 * 2 + 2 * 6  # ips/iips/rips, dr+regression x 2 models, rpod k=0..5 x 2


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--set", "methods=ips,magic"], "unknown method(s) ['magic']"),
        (["--set", "lam=1.5"], "lam values must be in [0, 1]"),
        (["--set", "ranking_length=12"], "must be <= every n_items"),
        (["--set", "ks=9"], "ks must be in [0, L]"),
        (["--set", "colour=blue"], "--set colour: unknown key"),
        (["--set", "n=many"], "n[0] must be an integer"),
        (["--set", "logging_policy=no_such_module:fn"], "cannot import module 'no_such_module'"),
        (["--set", "logging_policy=tests.user_logging:missing"], "has no attribute 'missing'"),
        (["--set", "seeds=0,0"], "seeds has duplicate values [0]"),
        (["--set", "lam=0.5,1.0,0.5"], "lam has duplicate values [0.5]"),
        (
            ["--set", "logging_policy=greedy"],
            "logging_policy for synthetic must be one of ['pl', 'uniform'] or 'module:function'",
        ),
        (
            ["--set", "slot_marginals=magic"],
            "slot_marginals must be null or one of ('auto', 'exact', 'sampled', 'insertion')",
        ),
    ],
)
def test_sweep_config_errors(extra, message, capsys):
    assert main(["sweep", "--config", CONFIG, *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.extended
def test_threads_backend_gives_the_serial_results(tmp_path, capsys, monkeypatch):
    """Cells in threads of one process (shared compiled programs) write the serial table."""
    import os

    def sweep_args(out):
        args = ["sweep", "--config", CONFIG, *TINY, "--set", "seeds=0,1", "--set", "methods=ips,regression,rpod"]
        args += ["--set", "ks=1", "--set", "reward_models=additive", "--set", "vmap_seeds=false"]
        return args + ["--set", f"output_dir={out}", "--compilation-cache", str(tmp_path / "jax")]

    tables = {}
    for backend in ("serial", "threads"):
        out = tmp_path / backend
        assert main([*sweep_args(out), "--backend", backend, "--workers", "2", "--json"]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out.strip().splitlines()[-1])["backend"] == backend
        with open(out / "results.csv") as f:
            tables[backend] = [{k: v for k, v in row.items() if k != "fit_seconds"} for row in csv.DictReader(f)]
    assert len(tables["serial"]) == 2 * 3
    assert tables["threads"] == tables["serial"]
    # the default (auto) on two or more cores: the same table, each running cell's steps shown
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    out = tmp_path / "auto"
    assert main(sweep_args(out)) == 0
    captured = capsys.readouterr()
    assert "to run (threads, 2 at a time)" in captured.out
    for seed in (0, 1):  # each cell's own bar of steps (on stderr), not only the bar of cells
        assert f"D5_L3_tau1.0_lam0.5_seed{seed}_n400: " in captured.err, captured.err
    with open(out / "results.csv") as f:
        assert [{k: v for k, v in row.items() if k != "fit_seconds"} for row in csv.DictReader(f)] == tables["serial"]


def test_auto_backend_runs_cells_in_threads_where_cores_and_memory_allow(monkeypatch):
    """``auto`` (the command line's default): threads, one per core, on a CPU with two or more
    cores and two or more jobs, as many as the jobs' logged data fit in memory; else serial.
    An explicit backend is kept, its workers capped at the jobs."""
    import os

    from experiments import opl_sweep
    from opl_rank import memory

    sweep = OPLSweep()
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**12)
    for cores, jobs, workers, expected in [
        (2, 4, None, ("threads", 2)),
        (8, 3, None, ("threads", 3)),  # no more threads than jobs
        (8, 6, 4, ("threads", 4)),  # --workers
        (1, 4, None, ("serial", 1)),  # one core
        (2, 1, None, ("serial", 1)),  # one job
        (8, 6, 1, ("serial", 1)),
    ]:
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert opl_sweep.choose_backend(sweep, "auto", workers, jobs) == expected, (cores, jobs, workers)
    job = opl_sweep._job_bytes(sweep)
    assert job > 0
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(memory, "available_bytes", lambda: 3 * job + job // 2)
    assert opl_sweep.choose_backend(sweep, "auto", None, 6) == ("threads", 3)  # three jobs' data fit
    monkeypatch.setattr(memory, "available_bytes", lambda: job + job // 2)
    assert opl_sweep.choose_backend(sweep, "auto", None, 6) == ("serial", 1)
    assert opl_sweep.choose_backend(sweep, "serial", 4, 6) == ("serial", 1)
    assert opl_sweep.choose_backend(sweep, "processes", None, 3) == ("processes", 3)
    assert opl_sweep.choose_backend(sweep, "threads", 2, 6) == ("threads", 2)
    with pytest.raises(ValueError, match="backend must be one of"):
        opl_sweep.choose_backend(sweep, "gpu", None, 2)


def test_an_unknown_backend_is_refused_before_the_output_folder_is_made(tmp_path):
    from experiments import opl_sweep

    out = tmp_path / "never"
    with pytest.raises(ValueError, match="backend must be one of .* got 'gpu'"):
        opl_sweep.run_sweep(OPLSweep(output_dir=str(out)), echo=lambda line: None, backend="gpu")
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.filterwarnings("ignore:os.fork")  # Ray starts its own daemons with fork_exec
def test_process_and_ray_backends_give_the_serial_results(tmp_path, capsys):
    # Keys come from each cell, never from execution order: two worker processes and a
    # local Ray instance must write the same table as one process (and print per-cell
    # progress lines as cells finish).
    small = [
        "--set",
        "n_items=5",
        "--set",
        "ranking_length=3",
        "--set",
        "lam=0.5",
        "--set",
        "n=300",
        "--set",
        "seeds=0,1",
        "--set",
        "methods=ips,regression,rpod",
        "--set",
        "ks=1",
        "--set",
        "reward_models=additive",
        "--set",
        "eval_contexts=1000",
        "--set",
        "policy_epochs=2",
        "--set",
        "reward_epochs=2",
        "--set",
        "vmap_seeds=true",
    ]
    tables = {}
    backends = ["serial", "processes"]
    try:
        import ray  # noqa: F401

        backends.append("ray")
    except ImportError:
        pass  # reported below, after the other backends are checked
    for backend in backends:
        out = tmp_path / backend
        args = [
            "sweep",
            "--config",
            CONFIG,
            *small,
            "--set",
            f"output_dir={out}",
            "--backend",
            backend,
            "--workers",
            "2",
            "--compilation-cache",
            str(tmp_path / "jax"),
            "--json",
        ]
        assert main(args) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out.strip().splitlines()[-1])["backend"] == backend
        assert captured.err.count("[") >= 2  # one progress line per cell
        with open(out / "results.csv") as f:
            tables[backend] = [{k: v for k, v in row.items() if k != "fit_seconds"} for row in csv.DictReader(f)]
    assert len(tables["serial"]) == 2 * 3
    for backend in backends[1:]:
        assert tables[backend] == tables["serial"], backend
    if "ray" not in backends:
        pytest.skip("Ray is not installed (scripts/setup.sh --test installs it): serial and processes checked")


@pytest.mark.slow
@pytest.mark.extended
def test_k_selection_rows_point_at_fitted_rpod_values(tmp_path, capsys):
    out = tmp_path / "select"
    args = [
        "sweep",
        "--config",
        CONFIG,
        *TINY,
        "--set",
        "methods=rpod,rpod-ope,rpod-oracle",
        "--set",
        "ks=0,1,3",
        "--set",
        "reward_models=pairwise",
        "--set",
        f"output_dir={out}",
        "--json",
    ]
    assert main(args) == 0
    capsys.readouterr()
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    rpod = {int(r["k"]): float(r["V"]) for r in rows if r["method"] == "rpod"}
    selected = [r for r in rows if r["method"] in ("rpod-ope", "rpod-oracle")]
    assert sorted(r["selector"] for r in selected) == ["ope:dr", "oracle:V/10", "oracle:V/20"]
    for r in selected:
        assert float(r["V"]) == rpod[int(r["k_selected"])]  # the chosen k's full-data fit
        if r["method"] == "rpod-oracle":  # noise of at most |V|/10 around the truth
            assert float(r["V"]) >= max(rpod.values()) - 0.2 * max(abs(v) for v in rpod.values())


def test_user_logging_policy_from_module_function(tmp_path, capsys):
    base = ["sweep", "--config", CONFIG, *TINY, "--set", "methods=ips", "--json"]
    out = tmp_path / "user"
    assert main(base + ["--set", "logging_policy=tests.user_logging:favour_low_ids", "--set", f"output_dir={out}"]) == 0
    capsys.readouterr()
    with open(out / "results.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert math.isfinite(float(row["V"])) and float(row["V0"]) != 0.0
    # A function returning the wrong shape fails the sweep with a message naming it.
    assert (
        main(
            base + ["--set", "logging_policy=tests.user_logging:wrong_shape", "--set", f"output_dir={tmp_path / 'bad'}"]
        )
        == 2
    )
    assert "logging policy 'wrong_shape' returned logits of shape" in capsys.readouterr().err


def test_slot_marginals_reach_iips_and_leave_older_configs_hash(tmp_path, capsys):
    from experiments.opl_sweep import resolved_config
    from experiments.resume import config_hash

    # A config written before the key existed hashes as one that leaves it unset (None).
    config = resolved_config(OPLSweep())
    assert config_hash(config) == config_hash({k: v for k, v in config.items() if k != "slot_marginals"})
    values = {}
    for choice in ("exact", "insertion"):
        out = tmp_path / choice
        args = [
            "sweep",
            "--config",
            CONFIG,
            *TINY,
            "--set",
            "methods=iips",
            "--set",
            f"slot_marginals={choice}",
            "--set",
            f"output_dir={out}",
            "--json",
        ]
        assert main(args) == 0
        capsys.readouterr()
        with open(out / "results.csv") as f:
            (row,) = list(csv.DictReader(f))
        values[choice] = float(row["V"])
        assert f"slot_marginals: {choice}" in (out / "config.yaml").read_text()
    # The same data, key and epochs: only the estimate of the slot marginals differs.
    assert all(math.isfinite(v) for v in values.values()) and values["exact"] != values["insertion"]


@pytest.mark.slow
@pytest.mark.extended
def test_seeds_vmapped_together_match_cells_run_one_by_one(tmp_path, capsys):
    # vmap_seeds fits a cell's seeds in one vmapped loop; one by one gives the same table
    # up to float rounding (and the same chosen k).
    two = [*TINY, "--set", "seeds=0,1", "--set", "methods=ips,rpod,rpod-ope", "--set", "reward_models=pairwise"]
    tables = {}
    for vmapped in ("true", "false"):
        out = tmp_path / vmapped
        assert (
            main(
                [
                    "sweep",
                    "--config",
                    CONFIG,
                    *two,
                    "--set",
                    f"vmap_seeds={vmapped}",
                    "--set",
                    f"output_dir={out}",
                    "--json",
                ]
            )
            == 0
        )
        capsys.readouterr()
        with open(out / "results.csv") as f:
            tables[vmapped] = list(csv.DictReader(f))
    assert len(tables["true"]) == len(tables["false"]) == 2 * 5
    for a, b in zip(tables["true"], tables["false"]):
        assert (a["method"], a["k"], a["seed"], a["k_selected"]) == (b["method"], b["k"], b["seed"], b["k_selected"])
        assert abs(float(a["V"]) - float(b["V"])) < 1e-3 * max(1.0, abs(float(b["V"])))
    assert {r["V"] for r in tables["true"] if r["seed"] == "0"} != {r["V"] for r in tables["true"] if r["seed"] == "1"}


@pytest.mark.extended
@pytest.mark.slow
def test_semi_synthetic_sweep_on_the_yahoo_sample(tmp_path, capsys):
    yahoo = "experiments/configs/semi_synthetic_yahoo.yaml"
    out = tmp_path / "yahoo"
    args = [
        "sweep",
        "--config",
        yahoo,
        "--set",
        "n_items=5",
        "--set",
        "ranking_length=2",
        "--set",
        "lam=0.5",
        "--set",
        "n=300",
        "--set",
        "seeds=0",
        "--set",
        "methods=ips,regression,rpod",
        "--set",
        "ks=1",
        "--set",
        "reward_models=additive,pairwise-two-step",
        "--set",
        "eval_contexts=2000",
        "--set",
        "policy_epochs=3",
        "--set",
        "reward_epochs=3",
        "--set",
        f"output_dir={out}",
        "--json",
    ]
    assert main(args) == 0  # letor_path: dataset:yahoo_sample, shipped in simulators/data
    capsys.readouterr()
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["method"] for r in rows} == {"ips", "regression", "rpod"}
    assert {r["reward_model"] for r in rows if r["method"] == "rpod"} == {"additive", "pairwise-two-step"}
    for r in rows:
        assert r["simulator"] == "semi_synthetic" and r["logging_policy"] == "random_forest"
        assert r["V_star_method"] == "exact" and float(r["V_star"]) >= float(r["V"]) - 4 * float(r["V_se"])
    # bad configs name the problem
    assert main(["sweep", "--config", yahoo, "--set", "logging_policy=pl", "--set", f"output_dir={out}"]) == 2
    assert "logging_policy for semi_synthetic must be one of" in capsys.readouterr().err
    assert (
        main(["sweep", "--config", CONFIG, "--set", "reward_models=pairwise-two-step", "--set", f"output_dir={out}"])
        == 2
    )
    assert "two-step reward models need logged rounds that share a context" in capsys.readouterr().err


def test_fit_order_rotates_row_order_by_lane():
    from experiments.sweep_cell import fit_order

    assert fit_order(6, 0) == [0, 1, 2, 3, 4, 5]
    assert fit_order(6, 1) == [3, 4, 5, 0, 1, 2]  # half-way
    assert fit_order(8, 2) == [2, 3, 4, 5, 6, 7, 0, 1]  # a quarter in
    assert fit_order(8, 3) == [6, 7, 0, 1, 2, 3, 4, 5]  # three quarters in
    assert fit_order(0, 1) == []
    for n in range(1, 12):
        for lane in range(9):
            assert sorted(fit_order(n, lane)) == list(range(n))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="lane must be an int >= 0"):
            fit_order(6, bad)


def test_groups_running_at_once_take_different_lanes():
    """The threads backend's groups: the smallest lane no running group holds, freed on exit."""
    from experiments.opl_sweep import _CellGate

    gate = _CellGate()
    with gate.group() as first:
        with gate.group() as second:
            assert (first, second) == (0, 1)
        with gate.group() as third:
            assert third == 1
    with gate.group() as again:
        assert again == 0


def test_a_lane_fits_in_another_order_and_returns_the_same_rows():
    """``run_group(lane=1)`` starts its fits half-way through the rows and leaves the ground
    truth for last (its steps say so), and returns every row as lane 0 does, in row order."""
    import dataclasses

    from experiments.sweep_cell import run_group

    sweep = dataclasses.replace(
        OPLSweep(), n_items=(5,), ranking_length=(3,), lam=(0.5,), n=(300,), seeds=(0,), eval_contexts=500,
        methods=("ips", "regression", "rips"), reward_models=("additive",), policy_epochs=2, reward_epochs=2,
    )  # fmt: skip
    cell = {"D": 5, "L": 3, "tau": 1.0, "lam": 0.5, "n": 300, "seed": 0}
    results = {}
    for lane in (0, 1):
        labels = []
        rows = run_group(sweep, [cell], on_step=labels.append, lane=lane)[0]
        results[lane] = [{k: v for k, v in row.items() if k != "fit_seconds"} for row in rows]
        fits = ["ips", "regression/additive", "rips"]
        truth, logging = "ground truth V(pi_0), V*", "logging 300 rounds"
        if lane == 0:
            assert labels == [truth, logging, *fits]
        else:  # from row int(3 / 2), the ground truth last
            assert labels == [logging, *fits[1:], *fits[:1], truth]
    assert [row["method"] for row in results[1]] == ["ips", "regression", "rips"]
    assert results[1] == results[0]
