"""Friendly edges of the command line: `report` on what is not a sweep's CSV, `simulate`
errors in the CLI's own option names, progress bars (and --quiet), readable plots, and
noise that is not the user's business."""

import csv
import json
import logging
import textwrap

import pytest

from experiments import progress
from experiments.cli import build_parser, main

SWEEP_COLUMNS = [
    "simulator",
    "method",
    "k",
    "reward_model",
    "lambda",
    "n",
    "D",
    "L",
    "tau",
    "seed",
    "V",
    "V_se",
    "V0",
    "V_star",
    "V_star_method",
    "normalized_gain",
    "fit_seconds",
]


def _sweep_rows(ns=(1000,)):
    rows = []
    for n in ns:
        for (method, k, model), gains in {
            ("regression", None, "additive"): [0.9, 0.92],
            ("rpod", 1, "additive"): [0.95, 0.97],
            ("rpod", 0, "additive"): [0.9, 0.92],
            ("ips", None, "-"): [0.2, 0.3],
        }.items():
            for seed, g in enumerate(gains):
                rows.append(
                    dict(
                        simulator="synthetic",
                        method=method,
                        k=k,
                        reward_model=model,
                        **{"lambda": 0.5},
                        n=n,
                        D=10,
                        L=5,
                        tau=1.0,
                        seed=seed,
                        V=g,
                        V_se=0.01,
                        V0=0.0,
                        V_star=1.0,
                        V_star_method="exact",
                        normalized_gain=g,
                        fit_seconds=1.0,
                    )
                )
    return rows


def _write_csv(path, rows, columns):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({c: ("" if r.get(c) is None else r[c]) for c in columns})
    return path


# -- opl-rank report ----------------------------------------------------------------------


def test_report_on_a_pairwise_table_says_what_it_is(tmp_path, capsys):
    path = _write_csv(
        tmp_path / "results.csv",
        [
            dict(
                browsing="independent",
                truncation=10,
                seed=0,
                n_lists=5,
                variant="biased",
                **{"ndcg@10": 0.4, "map": 0.3},
            )
        ],
        ["browsing", "truncation", "seed", "n_lists", "variant", "ndcg@10", "map"],
    )
    (tmp_path / "report.md").write_text("# Pairwise\n")
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is a pairwise results table (opl-rank pairwise)" in err
    assert str(tmp_path / "report.md") in err and "Traceback" not in err


def test_report_on_a_table_that_is_not_a_sweeps(tmp_path, capsys):
    path = _write_csv(tmp_path / "history.csv", [{"epoch": 1, "train_loss": 0.5}], ["epoch", "train_loss"])
    assert main(["report", str(path)]) == 2
    assert "is not a sweep's results table" in capsys.readouterr().err
    (tmp_path / "logs.npz").write_bytes(b"PK\x03\x04\x00\xff\xfe binary")
    assert main(["report", str(tmp_path / "logs.npz")]) == 2
    assert "not a text CSV file" in capsys.readouterr().err


def test_report_on_a_folder_reads_its_results_csv(tmp_path, capsys):
    path = _write_csv(tmp_path / "results.csv", _sweep_rows(), SWEEP_COLUMNS)
    assert main(["report", str(path)]) == 0
    from_file = capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out == from_file
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert f"{empty} is a folder without results.csv or results.parquet" in capsys.readouterr().err


def test_report_reads_parquet(tmp_path, capsys):
    pytest.importorskip("pandas", reason="pandas is not installed (scripts/setup.sh installs it)")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (scripts/setup.sh installs it)")
    from experiments.tables import write_tables

    rows = _sweep_rows()
    write_tables(str(tmp_path), rows, int_columns=("k",), echo=lambda line: None)
    assert main(["report", str(tmp_path / "results.csv")]) == 0
    from_csv = capsys.readouterr().out
    assert main(["report", str(tmp_path / "results.parquet")]) == 0
    assert capsys.readouterr().out == from_csv
    (tmp_path / "results.csv").unlink()
    assert main(["report", str(tmp_path)]) == 0  # a folder with only the Parquet table
    assert capsys.readouterr().out == from_csv
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert main(["report", str(tmp_path / "bad.parquet")]) == 2
    assert "is not a readable Parquet file" in capsys.readouterr().err


def test_plots_are_readable_with_one_n(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (scripts/setup.sh installs it)")
    import matplotlib.pyplot as plt
    from PIL import Image

    from experiments.plots import write_plots

    plt.close("all")
    paths = write_plots(_sweep_rows(ns=(1000,)), str(tmp_path), show=True)  # show: the figures stay open here
    try:
        assert sorted(p.rsplit("/", 1)[-1] for p in paths) == [
            "gain_vs_k.png",
            "gain_vs_lambda.png",
            "gain_vs_n.png",
            "value_vs_k.png",
        ]
        for path in paths:
            with Image.open(path) as image:
                assert min(image.info["dpi"]) >= 100
        for number in plt.get_fignums():
            fig = plt.figure(number)
            fig.canvas.draw()
            axes = [ax for ax in fig.axes if ax.get_visible()]
            assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
            legend = fig.legends[0].get_window_extent()
            assert legend.x0 >= max(ax.get_window_extent().x1 for ax in axes)  # outside the panels
        gain_vs_n = plt.figure(plt.get_fignums()[2])
        ax = gain_vs_n.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1000"]  # the one n, labelled
        xs = [bars.lines[0].get_xdata()[0] for bars in ax.containers]  # each method's errorbar
        assert len(set(xs)) == len(xs) > 1  # one point per method, side by side, not piled up
    finally:
        plt.close("all")


def test_plots_of_only_rpod_rows_draw_the_k_figures(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (scripts/setup.sh installs it)")
    from experiments.plots import write_plots

    rows = [r for r in _sweep_rows() if r["method"] == "rpod"]  # no method lines over n or lambda
    paths = write_plots(rows, str(tmp_path))
    assert sorted(p.rsplit("/", 1)[-1] for p in paths) == ["gain_vs_k.png", "value_vs_k.png"]


# -- opl-rank simulate ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tau", "-1"], "--tau must be finite and > 0, got -1.0"),
        (["--sigma", "-0.5"], "--sigma must be finite and >= 0"),
        (["--context-dim", "0"], "--context-dim must be a positive int"),
        (["-D", "0"], "--n-items (-D) must be a positive int"),
        (["-L", "0"], "--length (-L) must be in [1, --n-items (-D)]"),
        (["--n", "-5"], "--n must be a positive int, got -5"),
    ],
)
def test_simulate_errors_use_the_option_names(args, message, capsys):
    assert main(["simulate", "--n", "20", "--value-contexts", "10", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    for internal in ("logging_temperature", "context_dim", "n_items", "ranking_length"):
        assert internal not in err


def test_simulate_out_into_a_missing_folder_says_so(tmp_path, capsys):
    target = tmp_path / "missing" / "folder" / "x.npz"
    assert main(["simulate", "--n", "20", "--value-contexts", "10", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"folder {tmp_path / 'missing' / 'folder'} does not exist" in err
    assert not (tmp_path / "missing").exists()
    assert main(["simulate", "--n", "20", "--value-contexts", "10", "--out", str(tmp_path)]) == 2
    assert "is a folder; give a file name" in capsys.readouterr().err


def test_user_policy_errors_speak_of_batches_not_of_n(tmp_path, monkeypatch, capsys):
    (tmp_path / "edge_policies.py").write_text(
        textwrap.dedent("""
        import numpy as np
        def two_columns(context, items):
            return np.zeros((context.shape[0], 2))
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    n = 3000  # more rows than one batch of the simulator (exact position marginals)
    assert (
        main(
            [
                "simulate",
                "--n",
                str(n),
                "-D",
                "5",
                "-L",
                "2",
                "--value-contexts",
                "10",
                "--quiet",
                "--logging-policy",
                "edge_policies:two_columns",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "expected [n, D]: one row per context and D=5 columns" in err and "it was given a batch of" in err


# -- progress -------------------------------------------------------------------------------


def test_every_long_command_takes_quiet():
    parser = build_parser()
    for command in (
        ["simulate"],
        ["sweep", "--config", "c"],
        ["pairwise", "--config", "c"],
        ["ltr", "--config", "c"],
        ["fit", "--data", "d", "--out", "o"],
    ):
        assert parser.parse_args([*command, "--quiet"]).quiet is True
        assert parser.parse_args(command).quiet is False


def test_simulate_shows_progress_unless_quiet(capsys):
    args = ["simulate", "--n", "30", "-D", "4", "-L", "2", "--value-contexts", "50", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n"] == 30  # stdout: the summary only
    # not a terminal: plain lines (the first at once, then at most one per progress.LOG_INTERVAL)
    assert captured.err.startswith("simulate:") and "environment" in captured.err and "\r" not in captured.err
    assert main([*args, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_bars_in_a_log_are_lines_with_a_heartbeat(monkeypatch):
    import io
    import time

    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.2)
    log = io.StringIO()
    with progress.bar(3, desc="job", unit="step", stream=log) as b:
        steps = progress.Steps(b)
        steps("first")
        time.sleep(0.7)  # one long step: the bar still speaks
        steps("second")
        steps.done()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
    assert lines[0].startswith("job:") and lines[0].endswith("first]")
    assert sum("first]" in line for line in lines) >= 2  # the heartbeat redrew the idle bar
    with progress.bar(3, enabled=False) as quiet:
        quiet.update(1)
        quiet.set_postfix_str("x")


def test_fit_epochs_show_in_the_step_bar():
    import io

    from opl_rank import make_key
    from opl_rank.opl.learners import LearnerConfig, fit
    from opl_rank.optimization import TrainConfig
    from simulators import SyntheticRankingEnv

    env = SyntheticRankingEnv.create(make_key(0), n_items=4, ranking_length=2)
    data = env.sample_logged_data(make_key(1), 200)
    config = LearnerConfig(
        "rpod", k=1, train=TrainConfig(epochs=3, batch_size=64), reward_train=TrainConfig(epochs=2, batch_size=64)
    )
    with progress.bar(2, desc="job", unit="step", stream=io.StringIO()) as b:
        steps = progress.Steps(b)
        steps("rpod(k=1)")
        fit(data, make_key(2), config, on_epoch=steps.epochs({"reward": 2, "policy": 3}))
        assert b.postfix == "rpod(k=1): policy epoch 3/3"
    with progress.bar(2, enabled=False) as quiet:
        assert progress.Steps(quiet).epochs({"policy": 3}) is None  # off: no host callbacks at all


@pytest.mark.slow
def test_sweep_cells_show_their_steps(tmp_path, capsys):
    tiny = [
        "--set",
        "n_items=4",
        "--set",
        "ranking_length=2",
        "--set",
        "lam=0.5",
        "--set",
        "n=200",
        "--set",
        "seeds=0",
        "--set",
        "ks=0,1",
        "--set",
        "methods=ips,regression",
        "--set",
        "reward_models=additive",
        "--set",
        "eval_contexts=200",
        "--set",
        "policy_epochs=2",
        "--set",
        "reward_epochs=2",
        "--set",
        "batch_size=64",
    ]
    args = ["sweep", "--config", "experiments/configs/synthetic_opl_small.yaml", *tiny]
    assert main([*args, "--set", f"output_dir={tmp_path / 'a'}"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("sweep: 1 cell(s), 0 done already, 1 to run (serial)")
    assert "D4_L2_tau1.0_lam0.5_seed0_n200:" in captured.err and "ground truth" in captured.err
    assert main([*args, "--set", f"output_dir={tmp_path / 'b'}", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


# -- noise ------------------------------------------------------------------------------------


def test_the_tpu_probe_line_is_silenced_but_other_backend_messages_are_not():
    progress.silence_noise()
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("jax._src.xla_bridge")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
        logger.warning("CUDA backend failed to initialize: no GPU.")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert records == ["CUDA backend failed to initialize: no GPU."]
