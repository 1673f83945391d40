"""The opl-rank command line: the default job end to end, user policies, clear errors."""

import json
import subprocess
import sys
import textwrap

import pytest

from experiments.cli import load_callable, main


def test_simulate_prints_a_summary_json(capsys):
    assert main(["simulate", "--n", "300", "-D", "6", "-L", "3", "--value-contexts", "2000", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["n"], summary["D"], summary["L"]) == (300, 6, 3)
    for field in ("logging_policy_value", "reward_std", "log_pi0_ranking_min", "pi0_position_marginal_min"):
        assert isinstance(summary[field], float)
    assert 0 < summary["pi0_position_marginal_min"] <= summary["pi0_position_marginal_max"] <= 1


def test_simulate_saves_loadable_data(tmp_path, capsys):
    from opl_rank import LoggedData

    out = tmp_path / "d.npz"
    assert main(["simulate", "--n", "50", "-D", "5", "-L", "2", "--value-contexts", "100", "--out", str(out)]) == 0
    assert "logging_policy_value" in capsys.readouterr().out
    data = LoggedData.load(out)
    assert data.n_rounds == 50 and data.log_pi0_position_marginal is not None


def test_simulate_with_user_logging_policy(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_policies.py").write_text(
        textwrap.dedent("""
        import numpy as np
        def prefer_first(context, items):
            out = np.zeros((context.shape[0], items.shape[0]))
            out[:, 0] = 30.0
            return out
        def wrong_shape(context, items):
            return np.zeros((context.shape[0], 2))
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["simulate", "--n", "40", "-D", "5", "-L", "2", "--value-contexts", "100", "--json"]
    assert main(args + ["--logging-policy", "my_policies:prefer_first"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pi0_top1_min"] > 0.99
    assert main(args + ["--logging-policy", "my_policies:wrong_shape"]) == 2
    assert "expected [n, D]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["-L", "12"], "--length (-L) must be in [1, --n-items (-D)]: got -L 12 with -D 10"),
        (["--lam", "2"], "lam must be in [0, 1]"),
        (["--n", "0"], "n must be a positive int"),
        (["--logging-policy", "no_such_module:f"], "cannot import module 'no_such_module'"),
        (["--logging-policy", "json:no_such_fn"], "has no attribute 'no_such_fn'"),
        (["--logging-policy", "nonsense"], "expected 'module:function'"),
        (["--seed", "-1"], "--seed must be >= 0"),
    ],
)
def test_simulate_bad_input_exits_2_with_message(args, message, capsys):
    assert main(["simulate", "--n", "20", "--value-contexts", "10"] + args) == 2
    assert message in capsys.readouterr().err


def test_load_callable_rejects_non_callables():
    with pytest.raises(ValueError, match="not callable"):
        load_callable("math:pi")


@pytest.mark.slow
def test_console_script_module_runs():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.cli",
            "simulate",
            "--n",
            "30",
            "-D",
            "4",
            "-L",
            "2",
            "--value-contexts",
            "50",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "logging_policy_value" in proc.stdout


LTR_CONFIG = "experiments/configs/ltr_exposure.yaml"


@pytest.mark.slow
@pytest.mark.extended
def test_ltr_runs_the_yahoo_preset_and_writes_results(tmp_path, capsys):
    from simulators import datasets

    data = datasets.path("yahoo_sample")
    out = tmp_path / "ltr"
    args = [
        "ltr",
        "--config",
        LTR_CONFIG,
        "--set",
        f"data={data}",
        "--set",
        "epochs=3",
        "--set",
        "hidden=[8]",
        "--set",
        f"output_dir={out}",
        "--json",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert 0.0 < summary["final_valid_ndcg@10"] <= 1.0
    assert "epoch   3/3" in captured.err
    assert {p.name for p in out.iterdir()} == {"history.csv", "config.yaml", "summary.json"}
    assert len((out / "history.csv").read_text().strip().splitlines()) == 4


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--set", "epochs=zero"], "epochs must be an integer"),
        (["--set", "nonsense=1"], "--set nonsense: unknown key"),
        (["--set", "data=/no/such/file.txt"], "data file not found"),
        (["--set", "estimator=magic"], "estimator must be one of"),
        (["--set", "novalue"], "--set expects key=value"),
    ],
)
def test_ltr_bad_config_exits_2(extra, message, capsys):
    assert main(["ltr", "--config", LTR_CONFIG] + extra) == 2
    assert message in capsys.readouterr().err


def test_ltr_missing_config_file(capsys):
    assert main(["ltr", "--config", "no/such.yaml"]) == 2
    assert "config file not found" in capsys.readouterr().err
