"""Bad inputs at the command line's edges: each gives one line naming what to change and exit
status 2 (Ctrl-C: 130, tests/test_sweep_reliability.py), and nothing is written first."""

import json
import os
import subprocess
import sys

import pytest

from experiments.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = "experiments/configs/synthetic_opl_small.yaml"
TINY_SWEEP = [
    "--set",
    "n_items=4",
    "--set",
    "ranking_length=2",
    "--set",
    "n=200",
    "--set",
    "seeds=0",
    "--set",
    "lam=0.5",
    "--set",
    "ks=0,1",
    "--set",
    "methods=ips",
    "--set",
    "eval_contexts=200",
    "--set",
    "policy_epochs=1",
    "--set",
    "reward_epochs=1",
]


def _one_line_error(capsys, args, *needles):
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("sweep:", "\r"))]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"opl-rank {args[0]}: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "args,needles",
    [
        (["simulate", "--out", "logs.txt"], ["--out logs.txt", ".parquet", ".csv", ".npz"]),
        (["simulate", "--out", "logs"], ["--out logs", "got none"]),
        (["sweep", "--config", SMALL, "--set", "seed=3"], ["--set seed", "did you mean seeds?"]),
        (["sweep", "--config", SMALL, "--set", "n=-5"], [SMALL, "--set n", "got [-5]"]),
        (["sweep", "--config", SMALL, "--set", "eval_contexts=1"], ["eval_contexts must be", "got 1"]),
        (["sweep", "--config", SMALL, "--set", "policy_epochs=0"], ["policy_epochs must be"]),
        (["sweep", "--config", SMALL, "--set", "reward_learning_rate=-1"], ["reward_learning_rate must be"]),
        (["sweep", "--config", SMALL, "--set", "axes.nope=1,2"], ["axes: 'nope'"]),
        (
            ["ltr", "--config", "experiments/configs/ltr_exposure.yaml", "--set", "epoch=3"],
            ["--set epoch", "did you mean epochs?"],
        ),
        (["simulate", "--simulator", "nope"], ["unknown simulator 'nope'"]),
    ],
)
def test_bad_inputs_give_one_line_and_exit_2(args, needles, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path) if args[0] == "simulate" else None
    if args[0] != "simulate":
        args = [a if not a.endswith(".yaml") else os.path.join(ROOT, a) for a in args]
        args += ["--set", f"output_dir={tmp_path / 'out'}", "--quiet"]
        needles = [n if not n.endswith(".yaml") else os.path.join(ROOT, n) for n in needles]
    _one_line_error(capsys, args, *needles)
    assert not (tmp_path / "out").exists()  # validation before any file is written


def test_another_tools_folder_is_not_taken_over(tmp_path, capsys):
    out = tmp_path / "ltr_run"
    out.mkdir()
    (out / "config.yaml").write_text("epochs: 3\n")  # an opl-rank ltr folder: no cells/
    (out / "history.csv").write_text("epoch\n")
    args = ["sweep", "--config", os.path.join(ROOT, SMALL), *TINY_SWEEP, "--set", f"output_dir={out}", "--quiet"]
    _one_line_error(capsys, args, "holds results of a different config")
    assert (out / "config.yaml").read_text() == "epochs: 3\n"


def test_simulate_refuses_set_for_what_has_a_flag(capsys):
    _one_line_error(capsys, ["simulate", "--simulator", "synthetic", "--set", "sigma=0.9"], "use --sigma")


def test_a_folder_whose_run_finished_no_cell_takes_the_corrected_config(tmp_path, capsys):
    out = tmp_path / "sweep"
    (out / "cells").mkdir(parents=True)
    (out / "config.yaml").write_text("n_items: [99]\n")  # an earlier run that stopped before its first cell
    args = ["sweep", "--config", os.path.join(ROOT, SMALL), *TINY_SWEEP, "--set", f"output_dir={out}", "--quiet"]
    assert main(args) == 0
    assert "finished no cell; this run replaces it" in capsys.readouterr().out
    (out / "cells" / ".tmp-left-by-a-kill.json").write_text("{")
    assert main(args) == 0  # resumes; the partial write of a killed run is gone
    assert not (out / "cells" / ".tmp-left-by-a-kill.json").exists()


def test_simulate_writes_the_format_its_suffix_names_and_fit_reads_it(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    for name in ("logs.parquet", "logs.csv", "logs.npz"):
        path = str(tmp_path / name)
        assert (
            main(["simulate", "-D", "4", "-L", "2", "--n", "100", "--value-contexts", "100", "--out", path, "--quiet"])
            == 0
        )
        capsys.readouterr()
        from opl_rank.io.tabular import read_logged_data

        data = read_logged_data(path)
        assert data.n_rounds == 100 and data.n_items == 4
    with open(tmp_path / "logs.parquet", "rb") as f:
        assert f.read(4) == b"PAR1"  # Parquet, not an NPZ archive under that name


def test_version_report_streams_and_quiet_flags(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    import opl_rank

    assert capsys.readouterr().out.strip() == f"opl-rank {opl_rank.__version__}"
    from experiments.cli import build_parser

    parser = build_parser()
    for command in (
        ["evaluate", "--policy", "p", "--data", "d"],
        ["rank", "--policy", "p", "--contexts", "c", "--out", "o"],
    ):
        assert parser.parse_args([*command, "--quiet"]).quiet
    rows = os.path.join(ROOT, "experiments/results/synthetic_opl_d10/results.csv")
    assert main(["report", rows, "--plots", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    assert "wrote " not in captured.out and captured.out.startswith("###")  # stdout is the Markdown
    assert "wrote " in captured.err


def test_the_console_script_prints_warnings_as_one_line(tmp_path):
    code = (
        "import sys, warnings\n"
        "from experiments import cli\n"
        "cli._RUNNING['command'] = 'fit'\n"
        "warnings.showwarning = cli._show_warning\n"
        "warnings.warn('most rows are clipped')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stderr.strip() == "opl-rank fit: warning: most rows are clipped"
    console = subprocess.run(
        [sys.executable, "-m", "experiments.cli", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert console.returncode == 0 and json.dumps(console.stdout.split()[0]) == '"opl-rank"'


def test_rank_given_a_logs_file_writes_contexts_and_rankings_only(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    logs, policy = str(tmp_path / "logs.parquet"), str(tmp_path / "policy")
    assert main(["simulate", "-D", "4", "-L", "2", "--n", "200", "--value-contexts", "100", "--out", logs, "-q"]) == 0
    assert main(["fit", "--data", logs, "--method", "regression", "--reward-epochs", "2", "--out", policy, "-q"]) == 0
    capsys.readouterr()
    out = str(tmp_path / "ranked.parquet")
    assert main(["rank", "--policy", policy, "--contexts", logs, "--out", out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary["dropped_logged_columns"]) >= {"reward", "log_pi0_prefix", "ranking"}
    ranked = pd.read_parquet(out)
    assert "ranking" in ranked.columns  # beside the ids and other columns of the user's (not the contexts)
    assert not {"reward", "log_pi0_prefix", "log_pi0_position_marginal"} & set(ranked.columns)
    logged = pd.read_parquet(logs)
    assert len(ranked) == len(logged)
