"""Tables from a sweep's ``results.csv``: normalised gain per method, and who wins where.

``opl-rank report results/opl_synthetic/results.csv`` prints, per setting, a markdown
table of the normalised gain ``(V - V0) / (V* - V0)`` (mean and standard error over seeds)
with one row per method (R-POD per k and reward model) and one column per n, then the
winner of every setting and n with its paired margin over the runner-up and over the best
regression, and how the k-selection methods did against the true best k.

A *setting* is every column of the table that is not an outcome ([`OUTCOME_COLUMNS`][OUTCOME_COLUMNS]):
``simulator, logging_policy, lambda, n, D, L, tau`` and any further sweep axis the table
carries (``interaction_scale``, ``sigma``, ... -- names are free), see
[`setting_columns`][setting_columns]. Rows of different settings are never pooled: seeds are averaged
within one setting only. Titles and tables name D, L, lambda (and n) always and every other
axis that takes more than one value in the table ([`varying_axes`][varying_axes]), so a report of a
sweep over (D, L, lambda, n) alone reads as it always did. Plain Python: usable from a
notebook without pandas.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from experiments.sweep_cell import DIAGNOSTIC_COLUMNS
from experiments.sweep_cell import OUTCOME_COLUMNS as _SWEEP_OUTCOME_COLUMNS

__all__ = [
    "load_rows",
    "results_file",
    "method_label",
    "setting_columns",
    "varying_axes",
    "gain_table",
    "GainTable",
    "winners",
    "k_selection",
    "markdown_report",
    "OUTCOME_COLUMNS",
]


REQUIRED_COLUMNS = ("method", "k", "reward_model", "lambda", "n", "D", "L", "seed", "V", "normalized_gain")
# What a row measures or which fit it is (the sweep's row schema); every other column is a
# setting axis.
OUTCOME_COLUMNS = _SWEEP_OUTCOME_COLUMNS
# Setting axes every report names (the paper's grid); n is the tables' column axis.
GRID_AXES = ("D", "L", "lambda", "n")
# Setting columns load_rows parses itself (strings, or the ints and floats below).
_KNOWN_SETTING_COLUMNS = ("simulator", "logging_policy", "lambda", "n", "D", "L", "tau")


def results_file(path: str) -> str:
    """The table ``path`` names: a file, or a sweep's folder (its ``results.csv``, else
    ``results.parquet``). A ValueError says what is missing."""
    if os.path.isdir(path):
        for name in ("results.csv", "results.parquet"):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        raise ValueError(
            f"{path} is a folder without results.csv or results.parquet; pass a sweep's output_dir "
            "(after the sweep finished) or its results.csv"
        )
    if not os.path.exists(path):
        raise ValueError(f"results file {path!r} does not exist")
    return path


def _read_table(path: str) -> list[dict[str, Any]]:
    if path.endswith(".parquet"):
        try:
            import pandas as pd

            frame = pd.read_parquet(path)
        except ImportError as err:
            raise ValueError(
                f"reading {path} needs pandas and pyarrow ({err}); or pass the results.csv beside it"
            ) from None
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
        where = (
            f"its report is {report}"
            if os.path.exists(report)
            else "opl-rank pairwise writes its report to report.md beside it"
        )
        raise ValueError(
            f"{path} is a pairwise results table (opl-rank pairwise), not a sweep's: {where}. "
            "opl-rank report reads the results.csv (or results.parquet) of opl-rank sweep"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ValueError(
            f"{path} is not a sweep's results table (opl-rank sweep's results.csv): it lacks column(s) {missing}"
        )


def _number(value: Any, kind: type) -> Any:
    if value is None or value == "":
        return None if kind is int else math.nan
    return kind(value)


def _parse_column(values: list[Any]) -> list[Any]:
    """An extra axis column's values: ints if every value reads as an int, floats if every
    value reads as a number, else the strings as they are."""
    texts = ["" if v is None else str(v).strip() for v in values]
    for kind in (int, float):
        try:
            parsed = [kind(t) for t in texts]
        except ValueError:
            continue
        return [math.nan if kind is float and math.isnan(v) else v for v in parsed]  # one NaN: groups compare equal
    return ["" if v is None else v for v in values]


def load_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a sweep's ``results.csv`` or ``results.parquet`` (or of its folder) with
    numbers parsed; a ValueError names a table that is not a sweep's (e.g. a pairwise one).

    Extra sweep-axis columns (any column that is neither an outcome nor one of the paper's
    axes, e.g. ``interaction_scale``) are parsed as ints where every value is one, as
    floats where every value is a number, and kept as strings otherwise."""
    ints = ("k", "n", "D", "L", "seed", "k_selected")
    floats = ("lambda", "tau", "V", "V_se", "V0", "V_star", "normalized_gain", "fit_seconds") + DIAGNOSTIC_COLUMNS
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
    for name in setting_columns(rows):
        if name not in _KNOWN_SETTING_COLUMNS:
            for row, value in zip(rows, _parse_column([row.get(name) for row in rows])):
                row[name] = value
    return rows


def setting_columns(rows: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The columns that make a row's setting: every column of ``rows`` that is not in
    [`OUTCOME_COLUMNS`][OUTCOME_COLUMNS], in the table's column order (first seen first), e.g.
    ``("simulator", "logging_policy", "lambda", "n", "D", "L", "tau", "interaction_scale")``.

    Rows that agree on all of them (and on the method label) are seeds of one cell; rows
    that differ in any are never pooled. A ValueError names missing grid columns.
    """
    columns: dict[str, None] = {}
    for r in rows:
        for name in r:
            if name not in columns and name not in OUTCOME_COLUMNS:
                columns[name] = None
    missing = [c for c in GRID_AXES if c not in columns]
    if missing:
        raise ValueError(
            f"rows lack the setting column(s) {missing}: they are not a sweep's results rows "
            "(opl-rank sweep's results.csv has simulator, lambda, n, D, L, tau, ...)"
        )
    return tuple(columns)


def _other_axes(columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c for c in columns if c not in GRID_AXES)


def varying_axes(rows: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The setting columns beyond (D, L, lambda, n) that take more than one value in
    ``rows`` (column order): what a title or a table must name so that no two settings
    read the same, e.g. ``("tau",)`` for a sweep over tau."""
    rows = list(rows)
    if not rows:
        return ()
    out = []
    for name in _other_axes(setting_columns(rows)):
        if len({_hashable(r.get(name)) for r in rows}) > 1:
            out.append(name)
    return tuple(out)


def _hashable(value: Any) -> Any:
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _order(value: Any) -> tuple:
    """A sort key for one setting value: numbers by value, then strings, then missing."""
    if value is None or value == "":
        return (2, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value) if not math.isnan(value) else (0, math.inf)
    return (1, str(value))


def _show(value: Any) -> str:
    """A setting value as a title or a table shows it: ``0.5``, ``2``, ``synthetic``."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


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


class GainTable(dict):
    """[`gain_table`][gain_table]'s dict. Its keys are ``(D, L, lambda, n, label, axes)``; a
    5-tuple ``(D, L, lambda, n, label)`` (the key before axes beyond the grid were kept)
    also indexes it (``table[...]`` only, not ``in`` or ``get``) when it names exactly one
    setting; a KeyError says which axes tell several apart."""

    def __missing__(self, key):
        if isinstance(key, tuple) and len(key) == 5:
            matches = [k for k in self if k[:5] == key]
            if len(matches) == 1:
                return self[matches[0]]
            if matches:
                differ = sorted(
                    {name for k in matches for name, v in k[5] if any(dict(m[5])[name] != v for m in matches)}
                )
                raise KeyError(
                    f"{key!r} matches {len(matches)} settings that differ in {differ}: index with the full key "
                    "(D, L, lambda, n, label, axes), axes as in the table's keys"
                )
        raise KeyError(key)


def _key_value(value: Any) -> Any:
    """A setting value as a key holds it: every NaN the same object, so NaNs group."""
    return math.nan if isinstance(value, float) and math.isnan(value) else value


def gain_table(rows: Iterable[dict[str, Any]], value: str = "normalized_gain") -> GainTable:
    """``{(D, L, lambda, n, label, axes): {"mean", "se", "seeds", "by_seed"}}`` of ``value``,
    one entry per setting and method label, over that setting's seeds.

    ``axes`` is a tuple of ``(name, value)`` pairs for every other setting column of
    ``rows`` ([`setting_columns`][setting_columns]: ``simulator``, ``logging_policy``, ``tau``, extra sweep
    axes...), in column order, so ``key[:5]`` reads as it always did and rows of different
    settings (e.g. two taus) are never pooled. The returned [`GainTable`][GainTable] also takes the
    old 5-tuple key where it is unambiguous.

    R-POD rows at k = 0 and k = L are kept (they equal regression and DR by construction).
    """
    rows = list(rows)
    others = _other_axes(setting_columns(rows)) if rows else ()
    groups: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        axes = tuple((name, _key_value(r.get(name))) for name in others)
        key = (r["D"], r["L"], _key_value(r["lambda"]), r["n"], method_label(r), axes)
        groups[key][r["seed"]] = r[value]
    table = GainTable()
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


def _cell_order(d: Any, l: Any, lam: Any, axes: tuple, *rest: Any) -> tuple:
    """Settings sorted by D, L, lambda, then the other axes in column order, then ``rest``."""
    return tuple(_order(v) for v in (d, l, lam, *(v for _, v in axes), *rest))


def winners(table: dict[tuple, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting and n: the best label by mean gain, the runner-up and the best
    regression, with paired differences (mean, SE, seeds won) against both.

    Each record has ``D``, ``L``, ``lambda``, ``n``, every other setting axis by name (as
    long as the name is not one of the record's own fields) and ``setting``, a dict of all
    of them."""
    cells: dict[tuple, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for key, stats in table.items():
        d, l, lam, n, label = key[:5]
        axes = key[5] if len(key) > 5 else ()
        if "(k=0)" in label or f"(k={l})" in label or label.startswith("rpod-oracle"):
            continue  # aliases of regression / DR; the oracle knows the true values
        cells[(d, l, lam, axes, n)].append((label, stats))
    out = []
    for key in sorted(cells, key=lambda c: _cell_order(*c)):
        d, l, lam, axes, n = key
        ranked = sorted(cells[key], key=lambda item: -item[1]["mean"])
        best, second = ranked[0], ranked[1] if len(ranked) > 1 else None
        regressions = [item for item in ranked if item[0].startswith("regression")]
        setting = {"D": d, "L": l, "lambda": lam, **dict(axes), "n": n}
        entry = {**setting, "best": best[0], "best_gain": best[1]["mean"], "setting": setting}
        if second is not None:
            entry["runner_up"] = second[0]
            entry["margin"] = _paired(best[1]["by_seed"], second[1]["by_seed"])
        if regressions and regressions[0][0] != best[0]:
            entry["best_regression"] = regressions[0][0]
            entry["margin_over_regression"] = _paired(best[1]["by_seed"], regressions[0][1]["by_seed"])
        out.append(entry)
    return out


def k_selection(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """How each k-selection method did against the true best k, per setting and f_hat.

    For every setting (all of [`setting_columns`][setting_columns]: D, L, lambda, n, tau, extra axes...),
    reward model and seed the true best k is the argmax over that setting's ``rpod`` rows'
    ground-truth values (ties to the smaller k). Returns one record per (setting, reward
    model, selector) with ``hit`` (share of seeds where the chosen k is the true best),
    ``regret`` (mean ± SE of best-k gain minus chosen-k gain), and the chosen and best k per
    seed; besides ``D``, ``L``, ``lambda``, ``n`` each record names every other setting axis
    (unless the name is one of its own fields) and holds them all in ``setting``.
    """
    rows = list(rows)
    if not rows:
        return []
    columns = setting_columns(rows)
    others = _other_axes(columns)

    def cell_of(r: dict[str, Any]) -> tuple:
        axes = tuple((name, _key_value(r.get(name))) for name in others)
        return (r["D"], r["L"], _key_value(r["lambda"]), axes, r["n"], r["reward_model"], r["seed"])

    best: dict[tuple, tuple[float, int, float]] = {}
    for r in rows:
        if r["method"] == "rpod":
            key = cell_of(r)
            current = best.get(key)
            if current is None or (r["V"], -r["k"]) > (current[0], -current[1]):
                best[key] = (r["V"], r["k"], r["normalized_gain"])
    groups: dict[tuple, list[tuple[int, int, float]]] = defaultdict(list)
    for r in rows:
        if r["method"] in ("rpod-ope", "rpod-oracle"):
            cell = cell_of(r)
            if cell in best:
                _, k_best, gain_best = best[cell]
                groups[cell[:6] + (r["selector"],)].append((r["k_selected"], k_best, gain_best - r["normalized_gain"]))

    def order(kv):  # as text, as it always was: D, L, lambda, the other axes, n, f_hat, selector
        d, l, lam, axes, n, model, selector = kv[0]
        return tuple(str(x) for x in (d, l, lam, *(v for _, v in axes), n, model, selector))

    out = []
    for (d, l, lam, axes, n, model, selector), items in sorted(groups.items(), key=order):
        regret = _mean_se([x[2] for x in items])
        setting = {"D": d, "L": l, "lambda": lam, **dict(axes), "n": n}
        out.append(
            {
                **setting,
                "reward_model": model,
                "selector": selector,
                "hit": sum(x[0] == x[1] for x in items) / len(items),
                "regret": regret,
                "seeds": len(items),
                "chosen": [x[0] for x in items],
                "best": [x[1] for x in items],
                "setting": setting,
            }
        )
    return out


def _fmt(mean: float, se: float) -> str:
    return f"{mean:.3f} ± {se:.3f}" if math.isfinite(se) else f"{mean:.3f}"


def _title_axes(axes: tuple, varying: tuple[str, ...]) -> str:
    """``, tau=0.5, interaction_scale=2``: the setting's values of the axes that vary."""
    return "".join(f", {name}={_show(value)}" for name, value in axes if name in varying)


def markdown_report(rows: list[dict[str, Any]]) -> str:
    """Gain tables per setting (one per D, L, lambda and every other varying axis; n is the
    columns), the winners list and the k-selection table, as markdown.

    Axes beyond (D, L, lambda, n) that take more than one value ([`varying_axes`][varying_axes]:
    ``tau``, ``simulator``, extra sweep axes...) appear in the table titles as
    ``name=value`` and as columns of the winners and k-selection tables."""
    rows = list(rows)
    varying = varying_axes(rows)
    table = gain_table(rows)
    lines: list[str] = []
    panels = sorted({(key[0], key[1], key[2], key[5]) for key in table}, key=lambda p: _cell_order(*p))
    for d, l, lam, axes in panels:
        inside = {key: stats for key, stats in table.items() if (key[0], key[1], key[2], key[5]) == (d, l, lam, axes)}
        ns = sorted({key[3] for key in inside}, key=_order)
        labels = sorted({key[4] for key in inside}, key=_label_order)
        seeds = max(stats["seeds"] for stats in inside.values())
        lines += [
            f"### D={d}, L={l}, lambda={lam:g}{_title_axes(axes, varying)} "
            f"(normalised gain, mean ± SE over {seeds} seeds)",
            "",
        ]
        lines.append("| method | " + " | ".join(f"n={n}" for n in ns) + " |")
        lines.append("|---|" + "---|" * len(ns))
        for label in labels:
            cells = [inside.get((d, l, lam, n, label, axes)) for n in ns]
            lines.append(f"| {label} | " + " | ".join(_fmt(c["mean"], c["se"]) if c else "" for c in cells) + " |")
        lines.append("")
    extra_head = "".join(f" {name} |" for name in varying)
    extra_rule = "---|" * len(varying)

    def extra_cells(record: dict[str, Any]) -> str:
        return "".join(f" {_show(record['setting'][name])} |" for name in varying)

    lines += ["### Winners (paired differences over seeds: mean ± SE, seeds won)", ""]
    lines.append(f"| D | L | lambda |{extra_head} n | best | gain | runner-up | margin | best regression | margin |")
    lines.append(f"|---|---|---|{extra_rule}---|---|---|---|---|---|---|")
    for w in winners(table):
        margin = w.get("margin")
        reg = w.get("margin_over_regression")
        lines.append(
            f"| {w['D']} | {w['L']} | {w['lambda']:g} |{extra_cells(w)} {w['n']} | {w['best']} | {w['best_gain']:.3f} | "
            f"{w.get('runner_up', '')} | {_fmt(*margin[:2]) + f' ({margin[2]})' if margin else ''} | "
            f"{w.get('best_regression', '(best)')} | {_fmt(*reg[:2]) + f' ({reg[2]})' if reg else ''} |"
        )
    selection = k_selection(rows)
    if selection:
        lines += [
            "",
            "### Choosing k: the chosen k against the true best k (per seed)",
            "",
            f"| D | L | lambda |{extra_head} n | f_hat | selector | right k | regret (gain) | chosen k | best k |",
            f"|---|---|---|{extra_rule}---|---|---|---|---|---|---|",
        ]
        for s in selection:
            lines.append(
                f"| {s['D']} | {s['L']} | {s['lambda']:g} |{extra_cells(s)} {s['n']} | {s['reward_model']} | {s['selector']} | "
                f"{s['hit']:.0%} | {_fmt(*s['regret'])} | {' '.join(map(str, s['chosen']))} | {' '.join(map(str, s['best']))} |"
            )
    return "\n".join(lines) + "\n"


def _label_order(label: str) -> tuple:
    order = {"ips": 0, "iips": 1, "rips": 2, "dr": 3, "regression": 4, "rpod": 5, "rpod-ope": 6, "rpod-oracle": 7}
    method = label.split("(")[0].split("/")[0]
    k = int(label.split("k=")[1].split(")")[0]) if "k=" in label else -1
    model = label.split("/")[1] if "/" in label else ""
    return (order.get(method, 9), model, k, label)  # label last: ties (rpod-oracle(V/10), (V/20)) in one order
