"""Where R-POD's claim holds: the regime map of ``experiments/configs/rpod_regime.yaml``.

Reads every finished cell of a sweep folder (``cells/*.json``: a sweep run in parts with
``--set`` subsets of the grid leaves each part's rows there, while ``results.csv`` holds only
the last part's) and writes, beside them:

  rows.csv       every finished cell's rows (the table the others are computed from);
  regime.csv     one row per regime (D, n, tau, interaction_scale, f_hat class): the best k, the
                 margin of the best middle R-POD(k) over max(regression, DR) with its standard
                 error, the measured causes (CPC violation of f_hat at k = 0 and k = 1 as a
                 share of E|Delta_q|, the ESS of the top-1 weights, of the best middle k's and
                 of the full weights) and how R-POD with k chosen by OPE fared;
  by_k.csv       gain, CPC violation and ESS per regime and k (means and standard errors);
  phase.png      the phase diagram: one panel per (f_hat class, D), tau across, interaction
                 down, each square coloured by the margin and labelled with the best k;
  causes.png     the margin against the two causes, one point per regime;
  report.md      the tables in Markdown.

**Definitions.** Gains are normalised, ``(V - V0) / (V* - V0)``, on each seed's environment.
The best k is the k with the highest mean gain over seeds. The margin compares the best
*middle* k (``1 <= k <= L - 1``, by mean gain) with the better of regression and DR (by mean
gain); its standard error is that of the paired per-seed differences. Picking the best middle
k on the same seeds favours R-POD slightly (a winner's curse of up to L - 1 = 4 choices); a
margin within about 2 standard errors of 0 is read as no difference. The OPE choice is
``rpod-ope``: its hit rate counts the seeds where it picked the seed's own best k (by true
value), its regret is that best k's gain minus the chosen k's. Regimes with fewer than two
finished seeds (no standard error) are left out.

Run: ``python -m experiments.rpod_regime experiments/results/rpod_regime``.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

__all__ = ["load_cells", "regime_tables", "write_regime_report", "main"]

_REGIME = ["D", "n", "tau", "interaction_scale", "f_hat"]  # n: a sweep may grow its n list


def _f_hat_class(row: Any) -> str:
    hidden = str(row.get("reward_hidden", "linear"))
    return f"{row['reward_model']}-{'linear' if hidden in ('linear', 'nan', '') else 'mlp' + hidden}"


def _se(values: Any) -> float:
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def regime_tables(results: Any) -> tuple[Any, Any]:
    """``(regime, by_k)`` pandas tables from a sweep's results table (module docstring)."""
    import pandas as pd

    table = results.copy()
    if "interaction_scale" not in table:
        table["interaction_scale"] = math.nan
    table["f_hat"] = table.apply(_f_hat_class, axis=1)
    rpod = table[table["method"] == "rpod"].copy()
    rpod["k"] = rpod["k"].astype(int)
    rpod["cpc_relative"] = rpod["cpc_violation"] / rpod["cpc_scale"].where(rpod["cpc_scale"] > 0)
    by_k = (
        rpod.groupby(_REGIME + ["k"])
        .agg(
            seeds=("seed", "nunique"),
            gain=("normalized_gain", "mean"),
            gain_se=("normalized_gain", _se),
            cpc_violation=("cpc_violation", "mean"),
            cpc_relative=("cpc_relative", "mean"),
            ess_fraction=("ess_fraction", "mean"),
        )
        .reset_index()
    )
    out = []
    for regime, part in rpod.groupby(_REGIME):
        n_slots = int(part["L"].iloc[0])
        gains = part.pivot_table(index="seed", columns="k", values="normalized_gain")
        if gains.isna().any().any() or gains.shape[1] != n_slots + 1 or len(gains) < 2:
            continue  # a regime whose cells are not all done, or with one seed (no standard error)
        means = gains.mean()
        best_k = int(means.idxmax())
        middle = means.loc[1 : n_slots - 1]
        best_middle = int(middle.idxmax())
        baseline = 0 if means[0] >= means[n_slots] else n_slots
        diff = gains[best_middle] - gains[baseline]
        ope = table[(table["method"] == "rpod-ope")]
        for name, value in zip(_REGIME, regime):
            ope = ope[ope[name] == value]
        chosen = ope.set_index("seed")["k_selected"]
        seed_best = gains.idxmax(axis=1)
        picked = [(s, int(chosen[s])) for s in gains.index if s in chosen and not pd.isna(chosen[s])]
        hits = [seed_best[s] == k for s, k in picked]
        regret = [gains.loc[s, seed_best[s]] - gains.loc[s, k] for s, k in picked]
        row_of = {k: part[part["k"] == k] for k in (0, 1, best_middle, n_slots)}
        out.append(
            {
                **dict(zip(_REGIME, regime)),
                "seeds": len(gains),
                "gain_regression": means[0],
                "gain_dr": means[n_slots],
                "best_k": best_k,
                "gain_best_k": means[best_k],
                "best_middle_k": best_middle,
                "margin": diff.mean(),
                "margin_se": _se(list(diff)),
                "middle_wins": bool(diff.mean() > 2 * _se(list(diff))),
                "cpc_relative_k0": (row_of[0]["cpc_violation"] / row_of[0]["cpc_scale"]).mean(),
                "cpc_relative_k1": (row_of[1]["cpc_violation"] / row_of[1]["cpc_scale"]).mean(),
                "ess_k1": row_of[1]["ess_fraction"].mean(),
                "ess_kL": row_of[n_slots]["ess_fraction"].mean(),
                "ess_best_middle": row_of[best_middle]["ess_fraction"].mean(),
                "ope_hit_rate": sum(hits) / len(hits) if hits else math.nan,
                "ope_regret": sum(regret) / len(regret) if regret else math.nan,
                "ope_gain": ope["normalized_gain"].mean() if len(ope) else math.nan,
            }
        )
    return pd.DataFrame(out), by_k


def _phase(regime: Any, path: str) -> None:
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    classes = sorted(regime["f_hat"].unique())
    dims = sorted({(int(d), int(n)) for d, n in zip(regime["D"], regime["n"])})  # a panel per (D, n)
    taus = sorted(regime["tau"].unique())
    scales = sorted(regime["interaction_scale"].unique())
    limit = max(0.02, float(np.nanmax(np.abs(regime["margin"]))))
    norm = TwoSlopeNorm(vmin=-limit, vcenter=0.0, vmax=limit)
    fig = Figure(figsize=(3.2 * len(dims) + 1.6, 2.6 * len(classes) + 0.6), layout="constrained")
    axes = fig.subplots(len(classes), len(dims), squeeze=False)
    image = None
    for i, cls in enumerate(classes):
        for j, (d, n) in enumerate(dims):
            ax = axes[i][j]
            grid = np.full((len(scales), len(taus)), np.nan)
            part = regime[(regime["f_hat"] == cls) & (regime["D"] == d) & (regime["n"] == n)]
            for _, r in part.iterrows():
                y, x = scales.index(r["interaction_scale"]), taus.index(r["tau"])
                grid[y, x] = r["margin"]
                label = f"k*={r['best_k']}\n{r['margin']:+.3f}\n±{r['margin_se']:.3f}"
                ax.text(x, y, label, ha="center", va="center", fontsize=7, weight="bold" if r["middle_wins"] else None)
            image = ax.imshow(grid, cmap="RdBu", norm=norm, origin="lower", aspect="auto")
            ax.set_xticks(range(len(taus)), [f"{t:g}" for t in taus])
            ax.set_yticks(range(len(scales)), [f"{s:g}" for s in scales])
            ax.set_title(f"{cls}, D={d}" + (f", n={n}" if regime["n"].nunique() > 1 else ""), fontsize=9)
            if i == len(classes) - 1:
                ax.set_xlabel("tau (logging temperature)")
            if j == 0:
                ax.set_ylabel("interaction_scale")
    if image is not None:
        fig.colorbar(image, ax=axes, label="best middle R-POD(k) - max(regression, DR), normalised gain")
    fig.suptitle(
        "Best middle R-POD(k) minus max(regression, DR): blue where a middle k wins (bold: > 2 SE)\n"
        "k* = best k by mean gain; margin ± its standard error over seeds",
        fontsize=9,
    )
    fig.savefig(path, dpi=120)


def _causes(regime: Any, path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    for ax, column, label in (
        (left, "cpc_relative_k0", "CPC violation of f_hat at k=0 (share of |Delta_q|)"),
        (right, "ess_best_middle", "ESS / n of the top-k weights at the best middle k"),
    ):
        for d, part in regime.groupby("D"):
            ax.errorbar(part[column], part["margin"], yerr=part["margin_se"], fmt="o", ms=4, label=f"D={d}", alpha=0.8)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel("margin of the best middle k", fontsize=8)
    right.set_xscale("log")
    left.legend(fontsize=7)
    fig.savefig(path, dpi=120)


def _markdown(table: Any, digits: int = 3) -> str:
    columns = list(table.columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, r in table.iterrows():
        cells = [
            (f"{v:g}" if name in _REGIME or name == "k" else f"{v:.{digits}f}") if isinstance(v, float) else str(v)
            for name, v in zip(columns, r)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_cells(output_dir: str) -> Any:
    """Every finished cell's rows of the sweep folder ``output_dir`` as one pandas table; a
    ValueError if there are none or the cells come from different configs."""
    import glob
    import json

    import pandas as pd

    files = sorted(glob.glob(os.path.join(output_dir, "cells", "*.json")))
    if not files:
        raise ValueError(f"{output_dir}: no finished cells (cells/*.json)")
    rows, hashes = [], set()
    for path in files:
        with open(path) as f:
            cell = json.load(f)
        hashes.add(cell["config_hash"])
        rows.extend(cell["rows"])
    if len(hashes) > 1:
        raise ValueError(f"{output_dir}: cells of {len(hashes)} different configs; report one config's folder")
    return pd.DataFrame(rows)


def write_regime_report(output_dir: str) -> dict[str, str]:
    """Read the finished cells of ``output_dir`` and write the files of the module docstring;
    returns ``{name: path}``."""
    from opl_rank.io.atomic import atomic_write_text

    results = load_cells(output_dir)
    regime, by_k = regime_tables(results)
    n_slots = int(results["L"].max())
    if regime.empty:
        raise ValueError(f"{output_dir}: no regime has every k of every seed done yet")
    names = ("rows.csv", "regime.csv", "by_k.csv", "phase.png", "causes.png", "report.md")
    paths = {name: os.path.join(output_dir, name) for name in names}
    atomic_write_text(paths["rows.csv"], results.to_csv(index=False))
    atomic_write_text(paths["regime.csv"], regime.to_csv(index=False))
    atomic_write_text(paths["by_k.csv"], by_k.to_csv(index=False))
    _phase(regime, paths["phase.png"])
    _causes(regime, paths["causes.png"])
    shown = regime[
        _REGIME
        + ["seeds", "gain_regression", "gain_dr", "best_k", "gain_best_k", "best_middle_k", "margin", "margin_se"]
        + ["cpc_relative_k0", "cpc_relative_k1", "ess_k1", "ess_best_middle", "ess_kL", "ope_hit_rate", "ope_regret"]
    ]
    wins = regime[regime["middle_wins"]]
    summary = (
        regime.groupby(["D", "n", "f_hat"])
        .agg(
            regimes=("margin", "size"),
            middle_best=("best_k", lambda k: int(((k > 0) & (k < n_slots)).sum())),
            middle_wins_2se=("middle_wins", "sum"),
            margin_max=("margin", "max"),
            margin_min=("margin", "min"),
            cpc_relative_k0=("cpc_relative_k0", "mean"),
            ess_k1=("ess_k1", "mean"),
            ess_kL=("ess_kL", "mean"),
            ope_hit_rate=("ope_hit_rate", "mean"),
            ope_regret=("ope_regret", "mean"),
        )
        .reset_index()
    )
    text = [
        "# R-POD regime map",
        "",
        f"{len(regime)} regimes with every k of every seed done ({int(regime['seeds'].sum())} seed-regimes).",
        f"A middle k beats max(regression, DR) by more than 2 SE in {len(wins)} of them.",
        f"R-POD with k chosen by OPE picks each seed's best k in {regime['ope_hit_rate'].mean():.0%} of seeds "
        f"(mean regret {regime['ope_regret'].mean():.3f} normalised gain).",
        "",
        "## Per D and f_hat class",
        "",
        "Over the (tau, interaction_scale) regimes of each (D, n, f_hat): how many have a middle k best by mean gain,",
        "how many by more than 2 SE over max(regression, DR), the margins' range, and the causes' means.",
        "",
        _markdown(summary),
        "",
        "## Per regime",
        "",
        _markdown(shown),
        "",
        "## Gain, CPC violation and ESS per k",
        "",
        _markdown(by_k),
        "",
    ]
    atomic_write_text(paths["report.md"], "\n".join(text))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", help="the sweep's output_dir (with cells/)")
    args = parser.parse_args(argv)
    for name, path in write_regime_report(args.output_dir).items():
        print(f"wrote {name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
