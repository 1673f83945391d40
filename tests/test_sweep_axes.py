"""Declared sweep axes: any config key or simulator option is a grid axis; cells, rows,
resume and the report follow them; cells of another opl_rank version are not reused silently."""

import csv
import json
import os
import re

import pytest

import opl_rank
from experiments.cli import main
from experiments.opl_sweep import OPLSweep, cells, run_sweep
from experiments.report import load_rows, markdown_report
from experiments.sweep_config import cell_name, load_sweep, resolved_config

TINY = dict(
    n_items=(5,),
    ranking_length=(3,),
    lam=(0.5,),
    n=(300,),
    seeds=(0,),
    methods=("ips", "regression"),
    reward_models=("additive",),
    eval_contexts=1000,
    policy_epochs=2,
    reward_epochs=3,
)
TOY = dict(
    TINY,
    plugins=("tests.plugins.toy_environment",),
    simulator="toy",
    logging_policy="uniform",
    n_items=(4,),
    ranking_length=(2,),
    lam=(0.0,),
)


def _rows(folder):
    with open(os.path.join(folder, "results.csv")) as f:
        return list(csv.DictReader(f))


def _quiet(*_):
    pass


def test_two_taus_are_two_settings_in_the_report(tmp_path):
    """The reproduced bug: tau = 0.5 and tau = 2 rows were merged into one table."""
    sweep = OPLSweep(**dict(TINY, tau=(0.5, 2.0)), output_dir=str(tmp_path / "taus"))
    run_sweep(sweep, echo=_quiet)
    rows = load_rows(str(tmp_path / "taus"))
    assert len(rows) == 4 and {r["tau"] for r in rows} == {0.5, 2.0}
    report = markdown_report(rows)
    gains = {}
    for tau in (0.5, 2.0):
        (gains[tau],) = [r["normalized_gain"] for r in rows if r["tau"] == tau and r["method"] == "ips"]
        table = report.split(f"tau={tau:g}")[1].split("###")[0]
        assert f"| ips | {gains[tau]:.3f}" in table, (tau, table)  # merged: the mean of both
    assert f"{gains[0.5]:.3f}" != f"{gains[2.0]:.3f}"  # so a merged table could not pass


def test_an_axis_the_paper_does_not_have_runs_with_no_library_edit(tmp_path):
    """interaction_scale as an axis: cells, names and columns follow it, and each cell equals
    the sweep that fixes interaction_scale to its value."""
    axes = OPLSweep(**TINY, axes={"interaction_scale": [0.5, 2.0]}, output_dir=str(tmp_path / "axes"))
    assert [c["interaction_scale"] for c in cells(axes)] == [0.5, 2.0]
    assert [cell_name(c) for c in cells(axes)] == [
        "D5_L3_tau1.0_lam0.5_seed0_n300_interaction_scale0.5",
        "D5_L3_tau1.0_lam0.5_seed0_n300_interaction_scale2.0",
    ]
    run_sweep(axes, echo=_quiet)
    rows = _rows(tmp_path / "axes")
    assert list(rows[0])[list(rows[0]).index("seed") + 1] == "interaction_scale"
    fixed = OPLSweep(**TINY, interaction_scale=2.0, output_dir=str(tmp_path / "fixed"))
    run_sweep(fixed, echo=_quiet)
    same = [
        {k: v for k, v in r.items() if k not in ("interaction_scale", "fit_seconds")}
        for r in rows
        if r["interaction_scale"] == "2.0"
    ]
    assert same == [{k: v for k, v in r.items() if k != "fit_seconds"} for r in _rows(tmp_path / "fixed")]
    small = [r for r in rows if r["interaction_scale"] == "0.5"]
    assert small[0]["V_star"] != same[0]["V_star"]  # another environment
    assert "interaction_scale=0.5" in markdown_report(load_rows(str(tmp_path / "axes")))
    # Resume: both cells are reused, and config.yaml records the axis, not the fixed key.
    again = run_sweep(axes, echo=_quiet)
    assert again["resumed"] == 2
    assert resolved_config(axes)["axes"] == {"interaction_scale": [0.5, 2.0]}
    assert "interaction_scale" not in resolved_config(axes)


def test_a_learner_option_and_a_simulator_option_are_axes(tmp_path):
    """policy_epochs (a learner option) and score_scale (the plugin simulator's own option)."""
    sweep = OPLSweep(**TOY, axes={"score_scale": [1.0, 3.0], "policy_epochs": [1, 3]}, output_dir=str(tmp_path / "toy"))
    assert len(cells(sweep)) == 4
    run_sweep(sweep, echo=_quiet)
    rows = _rows(tmp_path / "toy")
    by = {(r["score_scale"], r["policy_epochs"], r["method"]): r for r in rows}
    # Additive rewards scale with the item scores: V* and V(pi_0) three times larger.
    for column in ("V_star", "V0"):
        assert float(by[("3.0", "1", "ips")][column]) == pytest.approx(
            3 * float(by[("1.0", "1", "ips")][column]), rel=1e-4
        )
    assert by[("1.0", "1", "ips")]["V"] != by[("1.0", "3", "ips")]["V"]  # more epochs, another policy
    fixed = OPLSweep(**dict(TOY, policy_epochs=3), env_options={"score_scale": 3.0}, output_dir=str(tmp_path / "fixed"))
    run_sweep(fixed, echo=_quiet)
    [ips] = [r for r in _rows(tmp_path / "fixed") if r["method"] == "ips"]
    assert ips["V"] == by[("3.0", "3", "ips")]["V"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (dict(axes={"tau": [1.0, 2.0]}), "'tau' is a grid key of its own"),
        (dict(axes={"no_such_option": [1, 2]}), "neither a config key that can vary"),
        (dict(axes={"output_dir": ["a", "b"]}), "neither a config key that can vary"),
        (dict(axes={"interaction_scale": [1.0, 1.0]}), "duplicate values"),
        (dict(axes={"policy_epochs": ["many"]}), "policy_epochs"),
        (dict(axes={"sigma": []}), "must not be empty"),
        (dict(env_options={"eta": 1.0}), "has no option 'eta'"),
        (dict(axes=[1, 2]), "axes must be a mapping"),
    ],
)
def test_bad_axes_are_errors_naming_them(extra, message):
    with pytest.raises(ValueError, match=message):
        OPLSweep(**TINY, **extra)


@pytest.mark.parametrize(
    "extra,message",
    [
        (dict(axes={"score_scale": [1, "1"]}), "would share cell file names"),
        (dict(axes={"score_scale": ["a b", "a/b"]}), "would share cell file names"),
        (dict(env_options={"score_scale": [1, 2]}), "env_options.score_scale: a value must be"),
        (dict(axes={"k": [1, 2]}), "names a column of the results table"),
    ],
)
def test_axes_that_would_clash_are_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        OPLSweep(**TOY, **extra)


def test_axes_from_the_command_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("n_items: [5]\nranking_length: [3]\naxes:\n  sigma: [0.1]\n")
    sweep = load_sweep(str(config), {"axes.interaction_scale": "0.5,2", "axes.sigma": [0.2, 0.3]})
    assert sweep.axes == (("sigma", (0.2, 0.3)), ("interaction_scale", (0.5, 2.0)))


def test_set_on_a_declared_axis_sets_that_axis(tmp_path):
    """``--set NAME=...`` on an axis the file declares replaces the axis's values; as a plain key
    the axis would win in every cell and the sweep would run the file's values silently."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "n_items: [5]\nranking_length: [3]\naxes:\n  interaction_scale: [0.0, 1.0, 3.0]\n"
        "  reward_hidden: [linear, '64']\n  reward_structure: [symmetric, cascade]\n"
    )
    sweep = load_sweep(str(config), {"interaction_scale": 3, "reward_hidden": "linear", "reward_structure": "cascade"})
    assert sweep.axes == (
        ("interaction_scale", (3.0,)),
        ("reward_hidden", ("linear",)),
        ("reward_structure", ("cascade",)),
    )
    assert {(c["interaction_scale"], c["reward_hidden"]) for c in cells(sweep)} == {(3.0, "linear")}
    assert load_sweep(str(config), {"interaction_scale": "0,1"}).axes[0] == ("interaction_scale", (0.0, 1.0))
    # --set reward_hidden=64 reads a bare int: one hidden layer, as the file's "64"
    assert load_sweep(str(config), {"reward_hidden": 64}).axes[1] == ("reward_hidden", ("64",))
    assert load_sweep(str(config), {"reward_hidden": "linear,64"}).axes[1] == ("reward_hidden", ("linear", "64"))
    with pytest.raises(ValueError, match="hidden sizes must be positive ints"):
        load_sweep(str(config), {"reward_hidden": 0})
    with pytest.raises(ValueError, match="unknown key"):  # not declared, not a key: still an error
        load_sweep(str(config), {"no_such_key": 1})
    config.write_text("n_items: [5]\nranking_length: [3]\ninteraction_scale: 2.0\naxes:\n  interaction_scale: [1.0]\n")
    with pytest.raises(ValueError, match="c.yaml: 'interaction_scale' is both an axis"):
        load_sweep(str(config), {})


def test_a_cell_of_another_version_is_not_reused_silently(tmp_path, capsys):
    out = tmp_path / "stale"
    sweep = OPLSweep(**TINY, output_dir=str(out))
    run_sweep(sweep, echo=_quiet)
    [path] = [os.path.join(out, "cells", f) for f in os.listdir(out / "cells")]
    record = json.load(open(path))
    record["opl_rank_version"] = "0.0.9"
    record["rows"][0]["V"] = 123.0  # what an older estimator might have written
    with open(path, "w") as f:
        json.dump(record, f)
    with pytest.raises(
        ValueError,
        match=rf"written by opl_rank 0\.0\.9, not by this {re.escape(opl_rank.__version__)}.*--recompute-stale",
    ):
        run_sweep(sweep, echo=_quiet)
    lines = []
    summary = run_sweep(sweep, echo=lines.append, recompute_stale=True)
    assert summary["resumed"] == 0 and any("recomputing 1 cell(s) written by opl_rank 0.0.9" in l for l in lines)
    assert 123.0 not in [float(r["V"]) for r in _rows(out)]
    # From the command line: the error names the version, and the flag recomputes.
    cli_out = tmp_path / "cli"
    args = [
        "sweep",
        "--config",
        "experiments/configs/synthetic_opl_small.yaml",
        "--quiet",
        "--set=ks=0,1",
        *[f"--set={k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in TINY.items()],
        f"--set=output_dir={cli_out}",
    ]
    assert main(args) == 0
    [path] = [os.path.join(cli_out, "cells", f) for f in os.listdir(cli_out / "cells")]
    record = json.load(open(path))
    record["opl_rank_version"] = "0.0.9"
    with open(path, "w") as f:
        json.dump(record, f)
    capsys.readouterr()
    assert main(args) == 2
    assert "written by opl_rank 0.0.9" in capsys.readouterr().err
    assert main(args + ["--recompute-stale"]) == 0
    assert json.load(open(path))["opl_rank_version"] == opl_rank.__version__


def test_simulate_builds_any_registered_environment(capsys):
    args = [
        "simulate",
        "--simulator",
        "toy",
        "--plugin",
        "tests.plugins.toy_environment",
        "-D",
        "4",
        "-L",
        "2",
        "--n",
        "200",
        "--value-contexts",
        "500",
        "--set",
        "score_scale=3",
        "--json",
        "--quiet",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["simulator"] == "toy" and summary["option score_scale"] == 3 and summary["n"] == 200
    assert 0 < summary["logging_policy_value"] < 3 * 2
    assert main(args[:-2] + ["--set", "nope=1", "--quiet"]) == 2
    assert "nope" in capsys.readouterr().err
