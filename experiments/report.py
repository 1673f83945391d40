"""Tables from a sweep's ``results.csv``: normalised gain per method, and who wins where.

``opl-rank report results/opl_synthetic/results.csv`` prints, per (D, L, lambda), a
markdown table of the normalised gain ``(V - V0) / (V* - V0)`` (mean and standard error
over seeds) with one row per method (R-POD per k and reward model) and one column per n,
then the winner of every (D, L, lambda, n) with its paired margin over the runner-up and
over the best regression. Plain Python: usable from a notebook without pandas.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from typing import Any, Iterable

__all__ = ["load_rows", "results_file", "method_label", "gain_table", "winners", "k_selection", "markdown_report"]


REQUIRED_COLUMNS = ("method", "k", "reward_model", "lambda", "n", "D", "L", "seed", "V", "normalized_gain")


def results_file(path: str) -> str:
    """The table ``path`` names: a file, or a sweep's folder (its ``results.csv``, else
    ``results.parquet``). A ValueError says what is missing."""
    if os.path.isdir(path):
        for name in ("results.csv", "results.parquet"):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        raise ValueError(f"{path} is a folder without results.csv or results.parquet; pass a sweep's output_dir "
                         "(after the sweep finished) or its results.csv")
    if not os.path.exists(path):
        raise ValueError(f"results file {path!r} does not exist")
    return path


def _read_table(path: str) -> list[dict[str, Any]]:
    if path.endswith(".parquet"):
        try:
            import pandas as pd

            frame = pd.read_parquet(path)
        except ImportError as err:
            raise ValueError(f"reading {path} needs pandas and pyarrow ({err}); or pass the results.csv beside it") from None
        except Exception as err:  # pyarrow's errors for a file that is not Parquet
            raise ValueError(f"{path} is not a readable Parquet file ({type(err).__name__}: {err})") from None
        frame = frame.astype(object).where(frame.notna(), None)
        return frame.to_dict("records")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text CSV file; pass a sweep's results.csv or results.parquet") from None


def _check_columns(path: str, columns: Iterable[str]) -> None:
    columns = set(columns)
    if {"variant", "ndcg@10"} <= columns:
        report = os.path.join(os.path.dirname(os.path.abspath(path)), "report.md")
        where = f"its report is {report}" if os.path.exists(report) else "opl-rank pairwise writes its report to report.md beside it"
        raise ValueError(f"{path} is a pairwise results table (opl-rank pairwise), not a sweep's: {where}. "
                         "opl-rank report reads the results.csv (or results.parquet) of opl-rank sweep")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"{path} is not a sweep's results table (opl-rank sweep's results.csv): it lacks "
                         f"column(s) {missing}")


def _number(value: Any, kind: type) -> Any:
    if value is None or value == "":
        return None if kind is int else math.nan
    return kind(value)


def load_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a sweep's ``results.csv`` or ``results.parquet`` (or of its folder) with
    numbers parsed; a ValueError names a table that is not a sweep's (e.g. a pairwise one)."""
    ints = ("k", "n", "D", "L", "seed", "k_selected")
    floats = ("lambda", "tau", "V", "V_se", "V0", "V_star", "normalized_gain", "fit_seconds")
    path = results_file(path)
    raws = _read_table(path)
    if not raws:
        raise ValueError(f"{path} has no rows")
    _check_columns(path, raws[0])
    rows = []
    for raw in raws:
        row: dict[str, Any] = {name: ("" if value is None else value) for name, value in raw.items()}
        for name in ints:
            row[name] = _number(raw.get(name), int)
        for name in floats:
            if name in raw:
                row[name] = _number(raw[name], float)
        rows.append(row)
    return rows


def method_label(row: dict[str, Any]) -> str:
    """``ips``, ``dr/pairwise``, ``rpod(k=2)/additive``, ``rpod-oracle(V/20)/pairwise``, ..."""
    name = row["method"] if row["k"] is None else f"{row['method']}(k={row['k']})"
    if row["method"] == "rpod-oracle":
        name = f"rpod-oracle({row['selector'].split(':', 1)[-1]})"
    return name if row["reward_model"] in ("-", "", None) else f"{name}/{row['reward_model']}"


def _mean_se(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, math.nan
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))


def gain_table(rows: Iterable[dict[str, Any]], value: str = "normalized_gain") -> dict[tuple, dict[str, Any]]:
    """``{(D, L, lambda, n, label): {"mean", "se", "seeds", "by_seed"}}`` of ``value``.

    R-POD rows at k = 0 and k = L are kept (they equal regression and DR by construction).
    """
    groups: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        groups[(r["D"], r["L"], r["lambda"], r["n"], method_label(r))][r["seed"]] = r[value]
    table = {}
    for key, by_seed in groups.items():
        mean, se = _mean_se(list(by_seed.values()))
        table[key] = {"mean": mean, "se": se, "seeds": len(by_seed), "by_seed": by_seed}
    return table


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, int]:
    """Mean and SE of ``a - b`` over shared seeds, and the seeds where ``a > b``."""
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    mean, se = _mean_se(diffs)
    return mean, se, sum(d > 0 for d in diffs)


def winners(table: dict[tuple, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (D, L, lambda, n): the best label by mean gain, the runner-up and the best
    regression, with paired differences (mean, SE, seeds won) against both."""
    cells: dict[tuple, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for (d, l, lam, n, label), stats in table.items():
        if "(k=0)" in label or f"(k={l})" in label or label.startswith("rpod-oracle"):
            continue  # aliases of regression / DR; the oracle knows the true values
        cells[(d, l, lam, n)].append((label, stats))
    out = []
    for key in sorted(cells):
        ranked = sorted(cells[key], key=lambda item: -item[1]["mean"])
        best, second = ranked[0], ranked[1] if len(ranked) > 1 else None
        regressions = [item for item in ranked if item[0].startswith("regression")]
        entry = {"D": key[0], "L": key[1], "lambda": key[2], "n": key[3], "best": best[0], "best_gain": best[1]["mean"]}
        if second is not None:
            entry["runner_up"] = second[0]
            entry["margin"] = _paired(best[1]["by_seed"], second[1]["by_seed"])
        if regressions and regressions[0][0] != best[0]:
            entry["best_regression"] = regressions[0][0]
            entry["margin_over_regression"] = _paired(best[1]["by_seed"], regressions[0][1]["by_seed"])
        out.append(entry)
    return out


def k_selection(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """How each k-selection method did against the true best k, per (D, L, lambda, n, f_hat).

    For every cell and reward model the true best k is the argmax over the ``rpod`` rows'
    ground-truth values (ties to the smaller k). Returns one record per (D, L, lambda, n,
    reward model, selector) with ``hit`` (share of seeds where the chosen k is the true best),
    ``regret`` (mean ± SE of best-k gain minus chosen-k gain), and the chosen and best k per seed.
    """
    best: dict[tuple, tuple[float, int, float]] = {}
    for r in rows:
        if r["method"] == "rpod":
            key = (r["D"], r["L"], r["lambda"], r["n"], r["reward_model"], r["seed"])
            current = best.get(key)
            if current is None or (r["V"], -r["k"]) > (current[0], -current[1]):
                best[key] = (r["V"], r["k"], r["normalized_gain"])
    groups: dict[tuple, list[tuple[int, int, float]]] = defaultdict(list)
    for r in rows:
        if r["method"] in ("rpod-ope", "rpod-oracle"):
            cell = (r["D"], r["L"], r["lambda"], r["n"], r["reward_model"], r["seed"])
            if cell in best:
                _, k_best, gain_best = best[cell]
                groups[cell[:5] + (r["selector"],)].append((r["k_selected"], k_best, gain_best - r["normalized_gain"]))
    out = []
    for (d, l, lam, n, model, selector), items in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        regret = _mean_se([x[2] for x in items])
        out.append({"D": d, "L": l, "lambda": lam, "n": n, "reward_model": model, "selector": selector,
                    "hit": sum(x[0] == x[1] for x in items) / len(items), "regret": regret, "seeds": len(items),
                    "chosen": [x[0] for x in items], "best": [x[1] for x in items]})
    return out


def _fmt(mean: float, se: float) -> str:
    return f"{mean:.3f} ± {se:.3f}" if math.isfinite(se) else f"{mean:.3f}"


def markdown_report(rows: list[dict[str, Any]]) -> str:
    """Gain tables per (D, L, lambda) and the winners list, as markdown."""
    table = gain_table(rows)
    lines: list[str] = []
    for d, l, lam in sorted({key[:3] for key in table}):
        ns = sorted({key[3] for key in table if key[:3] == (d, l, lam)})
        labels = sorted({key[4] for key in table if key[:3] == (d, l, lam)}, key=_label_order)
        seeds = max(table[(d, l, lam, n, lab)]["seeds"] for n in ns for lab in labels if (d, l, lam, n, lab) in table)
        lines += [f"### D={d}, L={l}, lambda={lam:g} (normalised gain, mean ± SE over {seeds} seeds)", ""]
        lines.append("| method | " + " | ".join(f"n={n}" for n in ns) + " |")
        lines.append("|---|" + "---|" * len(ns))
        for label in labels:
            cells = [table.get((d, l, lam, n, label)) for n in ns]
            lines.append(f"| {label} | " + " | ".join(_fmt(c["mean"], c["se"]) if c else "" for c in cells) + " |")
        lines.append("")
    lines += ["### Winners (paired differences over seeds: mean ± SE, seeds won)", ""]
    lines.append("| D | L | lambda | n | best | gain | runner-up | margin | best regression | margin |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for w in winners(table):
        margin = w.get("margin")
        reg = w.get("margin_over_regression")
        lines.append(
            f"| {w['D']} | {w['L']} | {w['lambda']:g} | {w['n']} | {w['best']} | {w['best_gain']:.3f} | "
            f"{w.get('runner_up', '')} | {_fmt(*margin[:2]) + f' ({margin[2]})' if margin else ''} | "
            f"{w.get('best_regression', '(best)')} | {_fmt(*reg[:2]) + f' ({reg[2]})' if reg else ''} |"
        )
    selection = k_selection(rows)
    if selection:
        lines += ["", "### Choosing k: the chosen k against the true best k (per seed)", "",
                  "| D | L | lambda | n | f_hat | selector | right k | regret (gain) | chosen k | best k |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in selection:
            lines.append(
                f"| {s['D']} | {s['L']} | {s['lambda']:g} | {s['n']} | {s['reward_model']} | {s['selector']} | "
                f"{s['hit']:.0%} | {_fmt(*s['regret'])} | {' '.join(map(str, s['chosen']))} | {' '.join(map(str, s['best']))} |"
            )
    return "\n".join(lines) + "\n"


def _label_order(label: str) -> tuple:
    order = {"ips": 0, "iips": 1, "rips": 2, "dr": 3, "regression": 4, "rpod": 5, "rpod-ope": 6, "rpod-oracle": 7}
    method = label.split("(")[0].split("/")[0]
    k = int(label.split("k=")[1].split(")")[0]) if "k=" in label else -1
    model = label.split("/")[1] if "/" in label else ""
    return (order.get(method, 9), model, k)
