"""Sweep reports: means, standard errors, paired winners and the CLI."""

import csv
import math

import pytest

from experiments.cli import main
from experiments.report import gain_table, load_rows, markdown_report, method_label, winners

COLUMNS = [
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


def _rows():
    gains = {  # label parts -> gain per seed
        ("regression", None, "pairwise"): [0.90, 0.92, 0.94],
        ("rpod", 2, "pairwise"): [0.93, 0.95, 0.96],
        ("rpod", 0, "pairwise"): [0.90, 0.92, 0.94],  # alias of regression: never a winner
        ("ips", None, "-"): [0.2, 0.3, 0.1],
    }
    rows = []
    for (method, k, model), values in gains.items():
        for seed, g in enumerate(values):
            rows.append(
                dict(
                    simulator="synthetic",
                    method=method,
                    k=k,
                    reward_model=model,
                    **{"lambda": 1.0},
                    n=1000,
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


def test_gain_table_means_and_standard_errors():
    table = gain_table(_rows())
    cell = table[(10, 5, 1.0, 1000, "rpod(k=2)/pairwise")]
    assert cell["mean"] == pytest.approx(0.94666667)
    sd = math.sqrt(sum((v - 0.94666667) ** 2 for v in [0.93, 0.95, 0.96]) / 2)
    assert cell["se"] == pytest.approx(sd / math.sqrt(3))
    assert method_label({"method": "ips", "k": None, "reward_model": "-"}) == "ips"


def test_winner_and_paired_margins():
    (w,) = winners(gain_table(_rows()))
    assert w["best"] == "rpod(k=2)/pairwise" and w["runner_up"] == "regression/pairwise"
    mean, se, won = w["margin_over_regression"]
    assert mean == pytest.approx(0.02666667) and won == 3
    assert se == pytest.approx(
        math.sqrt(((0.03 - 0.0266667) ** 2 + (0.03 - 0.0266667) ** 2 + (0.02 - 0.0266667) ** 2) / 2 / 3), rel=1e-4
    )


def test_report_cli_reads_a_results_csv(tmp_path, capsys):
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for r in _rows():
            writer.writerow({c: ("" if r[c] is None else r[c]) for c in COLUMNS})
    assert load_rows(str(path))[0]["k"] is None
    assert main(["report", str(path), "--output", str(tmp_path / "report.md")]) == 0
    text = capsys.readouterr().out
    assert "| rpod(k=2)/pairwise | 0.947 ± 0.009 |" in text
    assert (tmp_path / "report.md").read_text() == text == markdown_report(load_rows(str(path)))
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (scripts/setup.sh --test installs it)")
    assert main(["report", str(path), "--plots", str(tmp_path / "plots")]) == 0
    capsys.readouterr()
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["gain_vs_k.png", "gain_vs_lambda.png", "gain_vs_n.png", "value_vs_k.png"]
    assert all((tmp_path / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert main(["report", str(tmp_path / "missing.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_k_selection_against_the_true_best_k():
    from experiments.report import k_selection

    rows = _rows()
    # seed 0: OPE picks k=2 (the true best), seed 1: k=0 (regret 0.03), seed 2: k=2
    for seed, chosen in enumerate([2, 0, 2]):
        gain = next(
            r["normalized_gain"] for r in rows if r["method"] == "rpod" and r["k"] == chosen and r["seed"] == seed
        )
        rows.append(
            dict(
                rows[0],
                method="rpod-ope",
                k=None,
                seed=seed,
                k_selected=chosen,
                selector="ope:dr",
                V=gain,
                normalized_gain=gain,
            )
        )
    (record,) = k_selection(rows)
    assert record["selector"] == "ope:dr" and record["best"] == [2, 2, 2] and record["chosen"] == [2, 0, 2]
    assert record["hit"] == pytest.approx(2 / 3)
    assert record["regret"][0] == pytest.approx(0.03 / 3)
    assert "| 10 | 5 | 1 | 1000 | pairwise | ope:dr | 67% |" in markdown_report(rows)
