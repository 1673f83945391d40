"""Reports and plots never pool two settings: rows that differ in tau, or in any extra sweep
axis (``interaction_scale``, ...), are separate tables, winners, k-selection records and
plot lines, each the mean over its own seeds."""

import csv
import math
import subprocess
import sys

import pytest

from experiments.cli import main
from experiments.report import (
    gain_table,
    k_selection,
    load_rows,
    markdown_report,
    setting_columns,
    varying_axes,
    winners,
)

HEAD = ["simulator", "logging_policy", "method", "k", "reward_model", "lambda", "n", "D", "L", "tau", "seed"]
TAIL = ["V", "V_se", "V0", "V_star", "V_star_method", "normalized_gain", "fit_seconds", "k_selected", "selector"]

# (axis value, method) -> normalised gain per seed (0, 1): every value distinct
GAINS = {
    (0.5, "ips"): [0.11, 0.23],
    (0.5, "regression"): [0.41, 0.47],
    (2.0, "ips"): [0.62, 0.78],
    (2.0, "regression"): [0.83, 0.89],
}
MODEL = {"ips": "-", "regression": "pairwise"}


def _row(axis: str, value, method: str, seed: int, gain: float, **extra):
    row = dict(
        simulator="synthetic",
        logging_policy="default",
        method=method,
        k=None,
        reward_model=MODEL.get(method, "pairwise"),
        **{"lambda": 0.5},
        n=1000,
        D=10,
        L=5,
        tau=1.0,
        seed=seed,
        V=gain,
        V_se=0.01,
        V0=0.0,
        V_star=1.0,
        V_star_method="exact",
        normalized_gain=gain,
        fit_seconds=1.0,
        k_selected=None,
        selector="",
    )
    row[axis] = value
    row.update(extra)
    return row


def _rows(axis: str = "tau", gains=GAINS):
    return [
        _row(axis, value, method, seed, g) for (value, method), values in gains.items() for seed, g in enumerate(values)
    ]


def _columns(axis: str):
    return HEAD + TAIL if axis in HEAD else HEAD + [axis] + TAIL


def _write(path, rows, columns):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({c: ("" if r.get(c) is None else r[c]) for c in columns})
    return path


def _fmt(values):
    mean = sum(values) / len(values)
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
    return f"{mean:.3f} ± {se:.3f}"


def _gain_tables(text: str) -> dict[str, dict[str, list[str]]]:
    """``{title: {method label: [cell per n]}}`` of a report's gain tables."""
    tables, title = {}, None
    for line in text.splitlines():
        if line.startswith("### D="):
            title = line[4:]
            tables[title] = {}
        elif line.startswith("### "):
            title = None
        elif title and line.startswith("| ") and not line.startswith("| method |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            tables[title][cells[0]] = cells[1:]
    return tables


def _report(tmp_path, rows, columns, capsys) -> str:
    path = _write(tmp_path / "results.csv", rows, columns)
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert text == markdown_report(load_rows(str(path)))
    return text


@pytest.mark.parametrize("axis,shown", [("tau", ("0.5", "2")), ("interaction_scale", ("0.5", "2"))])
def test_a_table_per_setting_with_its_own_seeds(axis, shown, tmp_path, capsys):
    text = _report(tmp_path, _rows(axis), _columns(axis), capsys)
    tables = _gain_tables(text)
    assert sorted(tables) == [
        f"D=10, L=5, lambda=0.5, {axis}={v} (normalised gain, mean ± SE over 2 seeds)" for v in shown
    ]
    for value, label in zip((0.5, 2.0), shown):
        table = tables[f"D=10, L=5, lambda=0.5, {axis}={label} (normalised gain, mean ± SE over 2 seeds)"]
        assert table == {
            "ips": [_fmt(GAINS[(value, "ips")])],
            "regression/pairwise": [_fmt(GAINS[(value, "regression")])],
        }
    # ips at 0.5 is the mean of the 0.5 rows (0.17), not of the 2.0 rows (0.70) nor of all four
    assert tables[f"D=10, L=5, lambda=0.5, {axis}=0.5 (normalised gain, mean ± SE over 2 seeds)"]["ips"] == [
        "0.170 ± 0.060"
    ]
    # the winners name the axis, one row per setting
    assert f"| D | L | lambda | {axis} | n | best | gain |" in text
    assert "| 10 | 5 | 0.5 | 0.5 | 1000 | regression/pairwise | 0.440 | ips |" in text
    assert "| 10 | 5 | 0.5 | 2 | 1000 | regression/pairwise | 0.860 | ips |" in text


def test_extra_axis_columns_parse_and_make_the_setting(tmp_path):
    rows = _rows("interaction_scale")
    for r in rows:
        r.update(policy_epochs=2 if r["seed"] == 0 else 30, eta="a" if r["seed"] == 0 else "b2", mixed=r["seed"] or "x")
    columns = HEAD + ["interaction_scale", "policy_epochs", "eta", "mixed"] + TAIL
    loaded = load_rows(str(_write(tmp_path / "results.csv", rows, columns)))
    assert setting_columns(loaded) == (
        "simulator",
        "logging_policy",
        "lambda",
        "n",
        "D",
        "L",
        "tau",
        "interaction_scale",
        "policy_epochs",
        "eta",
        "mixed",
    )
    assert {type(r["interaction_scale"]) for r in loaded} == {float}
    assert {r["policy_epochs"] for r in loaded} == {2, 30} and {type(r["policy_epochs"]) for r in loaded} == {int}
    assert {r["eta"] for r in loaded} == {"a", "b2"} and {r["mixed"] for r in loaded} == {"x", "1"}  # not all numbers
    assert varying_axes(loaded) == ("interaction_scale", "policy_epochs", "eta", "mixed")
    # the axes beyond the grid that do not vary are still part of the setting, never in titles
    assert varying_axes(_rows("tau")) == ("tau",)
    with pytest.raises(ValueError, match=r"lack the setting column\(s\) \['n'\]"):
        setting_columns([{"D": 1, "L": 1, "lambda": 0.0, "method": "ips"}])


def test_gain_table_keys_keep_the_axes():
    table = gain_table(_rows("interaction_scale"))
    assert len(table) == 4
    key = (
        10,
        5,
        0.5,
        1000,
        "ips",
        (("simulator", "synthetic"), ("logging_policy", "default"), ("tau", 1.0), ("interaction_scale", 0.5)),
    )
    assert table[key]["mean"] == pytest.approx(0.17) and table[key]["by_seed"] == {0: 0.11, 1: 0.23}
    with pytest.raises(KeyError, match=r"matches 2 settings that differ in \['interaction_scale'\]"):
        table[(10, 5, 0.5, 1000, "ips")]  # the old key names two settings here
    one = gain_table([r for r in _rows("interaction_scale") if r["interaction_scale"] == 2.0])
    assert one[(10, 5, 0.5, 1000, "ips")]["mean"] == pytest.approx(0.70)  # unambiguous: the old key still reads
    records = winners(table)
    assert [(w["interaction_scale"], w["best"], w["setting"]["interaction_scale"]) for w in records] == [
        (0.5, "regression/pairwise", 0.5),
        (2.0, "regression/pairwise", 2.0),
    ]
    assert records[0]["margin"][0] == pytest.approx(0.44 - 0.17)


def test_a_varying_simulator_is_named(tmp_path, capsys):
    rows = _rows(
        "simulator",
        {("synthetic", m): g for (v, m), g in GAINS.items() if v == 0.5}
        | {("semi_synthetic", m): g for (v, m), g in GAINS.items() if v == 2.0},
    )
    tables = _gain_tables(_report(tmp_path, rows, _columns("tau"), capsys))
    assert tables["D=10, L=5, lambda=0.5, simulator=synthetic (normalised gain, mean ± SE over 2 seeds)"]["ips"] == [
        _fmt(GAINS[(0.5, "ips")])
    ]
    assert len(tables) == 2


# R-POD at k = 0, 1, 2 per tau: the true best k is 1 at tau = 0.5 and 2 at tau = 2 (and 2 over both)
RPOD = {
    0.5: {0: [0.40, 0.42], 1: [0.60, 0.64], 2: [0.30, 0.32]},
    2.0: {0: [0.50, 0.52], 1: [0.70, 0.72], 2: [0.90, 0.94]},
}


def _selection_rows(axis: str = "tau"):
    rows = _rows(axis)
    for value, by_k in RPOD.items():
        for k, gains in by_k.items():
            rows += [_row(axis, value, "rpod", seed, g, k=k) for seed, g in enumerate(gains)]
        for seed in (0, 1):  # OPE picks k = 1 in both settings
            g = by_k[1][seed]
            rows.append(_row(axis, value, "rpod-ope", seed, g, k_selected=1, selector="ope:dr"))
    return rows


@pytest.mark.parametrize("axis", ["tau", "interaction_scale"])
def test_the_true_best_k_is_picked_within_each_setting(axis, tmp_path, capsys):
    records = k_selection(_selection_rows(axis))
    assert [(r[axis], r["best"], r["chosen"], r["hit"]) for r in records] == [
        (0.5, [1, 1], [1, 1], 1.0),
        (2.0, [2, 2], [1, 1], 0.0),
    ]
    assert records[0]["regret"][0] == pytest.approx(0.0)
    assert records[1]["regret"][0] == pytest.approx(((0.90 - 0.70) + (0.94 - 0.72)) / 2)
    text = _report(tmp_path, _selection_rows(axis), _columns(axis), capsys)
    assert f"| D | L | lambda | {axis} | n | f_hat | selector | right k |" in text
    assert "| 10 | 5 | 0.5 | 0.5 | 1000 | pairwise | ope:dr | 100% | 0.000 ± 0.000 | 1 1 | 1 1 |" in text
    assert "| 10 | 5 | 0.5 | 2 | 1000 | pairwise | ope:dr | 0% | 0.210 ± 0.010 | 1 1 | 2 2 |" in text
    tables = _gain_tables(text)
    assert tables[f"D=10, L=5, lambda=0.5, {axis}=0.5 (normalised gain, mean ± SE over 2 seeds)"][
        "rpod(k=1)/pairwise"
    ] == [_fmt(RPOD[0.5][1])]


def test_plots_keep_settings_apart(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (scripts/setup.sh --test installs it)")
    from experiments.plots import plot_series, write_plots

    rows = _selection_rows("tau")
    series = plot_series(rows)
    assert sorted(series) == ["gain_vs_k.png", "gain_vs_lambda.png", "gain_vs_n.png", "value_vs_k.png"]
    by_k = series["gain_vs_k.png"]
    assert [p["title"] for p in by_k] == ["R-POD, D=10, f_hat pairwise, tau=0.5", "R-POD, D=10, f_hat pairwise, tau=2"]
    for panel, tau in zip(by_k, (0.5, 2.0)):
        (line,) = panel["lines"]
        assert line["x"] == [0, 1, 2] and line["seeds"] == [2, 2, 2]
        assert line["mean"] == pytest.approx([sum(RPOD[tau][k]) / 2 for k in (0, 1, 2)])
    for name in ("gain_vs_n.png", "gain_vs_lambda.png"):
        panels = series[name]
        assert [p["title"].endswith(f"tau={t}") for p, t in zip(panels, ("0.5", "2"))] == [True, True] and len(
            panels
        ) == 2
        for panel, tau in zip(panels, (0.5, 2.0)):
            lines = {line["label"]: line for line in panel["lines"]}
            assert sorted(lines) == ["ips", "regression/pairwise", "rpod-ope/pairwise"]
            for line in lines.values():
                assert len(line["x"]) == len(set(line["x"])) == 1 and line["seeds"] == [2]  # one setting per point
            assert lines["ips"]["mean"] == pytest.approx([sum(GAINS[(tau, "ips")]) / 2])
            assert lines["rpod-ope/pairwise"]["mean"] == pytest.approx([sum(RPOD[tau][1]) / 2])
    paths = write_plots(rows, str(tmp_path / "direct"))
    assert sorted(p.rsplit("/", 1)[-1] for p in paths) == sorted(series)
    path = _write(tmp_path / "results.csv", rows, _columns("tau"))
    assert main(["report", str(path), "--plots", str(tmp_path / "plots")]) == 0
    assert "tau=2" in capsys.readouterr().out
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["gain_vs_k.png", "gain_vs_lambda.png", "gain_vs_n.png", "value_vs_k.png"]
    assert all((tmp_path / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_plots_split_by_an_extra_axis_and_by_a_varying_L():
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (scripts/setup.sh --test installs it)")
    from experiments.plots import plot_series

    rows = _rows("interaction_scale") + [
        dict(r, L=3, normalized_gain=r["normalized_gain"] + 0.01) for r in _rows("interaction_scale")
    ]
    panels = plot_series(rows)["gain_vs_n.png"]
    assert [p["title"] for p in panels] == [
        "D=10, L=3, lambda=0.5, interaction_scale=0.5",
        "D=10, L=3, lambda=0.5, interaction_scale=2",
        "D=10, L=5, lambda=0.5, interaction_scale=0.5",
        "D=10, L=5, lambda=0.5, interaction_scale=2",
    ]
    assert sum(len(line["x"]) for p in panels for line in p["lines"]) == len(gain_table(rows)) == 8


def test_cli_module_reports_each_tau(tmp_path):
    path = _write(tmp_path / "results.csv", _rows("tau"), _columns("tau"))
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.cli", "report", str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    tables = _gain_tables(proc.stdout)
    assert tables["D=10, L=5, lambda=0.5, tau=0.5 (normalised gain, mean ± SE over 2 seeds)"]["ips"] == [
        _fmt(GAINS[(0.5, "ips")])
    ]
    assert tables["D=10, L=5, lambda=0.5, tau=2 (normalised gain, mean ± SE over 2 seeds)"]["ips"] == [
        _fmt(GAINS[(2.0, "ips")])
    ]
