"""Standard plots of a sweep's results (PNG).

  gain_vs_k.png       normalised gain of R-POD against k, one panel per (D, reward model),
                      a line per (lambda, n) -- the paper's main figure
  value_vs_k.png      the same with V
  gain_vs_n.png       normalised gain against n, one panel per (D, lambda), a line per method
  gain_vs_lambda.png  normalised gain against lambda, one panel per (D, n), a line per method

Points are means over seeds, bars one standard error. R-POD's per-k rows are summarised
in the method plots by ``rpod-ope`` (when run) and by regression (k=0) / DR (k=L). The
method plots place the grid's n (or lambda) values evenly, each method slightly offset, so
a sweep with one n still reads as one column of points. 120 dpi; one legend per figure,
outside the panels.

Figures are plain ``matplotlib.figure.Figure`` objects rendered by Agg, outside pyplot: writing
plots never changes the caller's backend (a notebook keeps its inline plots) and opens no
window. ``write_plots(..., show=True)`` creates them through pyplot instead and leaves them
open, so a notebook displays them inline.
"""

from __future__ import annotations

import os
from typing import Any

from experiments.report import gain_table

__all__ = ["write_plots"]


def _axes(n_panels: int, show: bool, width: float = 4.2, height: float = 3.2):
    cols = min(3, n_panels)
    rows = -(-n_panels // cols)
    if show:  # through pyplot, left open: a notebook displays it
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(width * cols, height * rows))
    else:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(width * cols, height * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


_DPI = 120
_MARKERS = "osD^vPX*"


def _style(labels) -> dict[str, dict[str, Any]]:
    """The same colour and marker for a label in every panel of a figure."""
    return {label: {"color": f"C{i % 10}", "marker": _MARKERS[(i // 10) % len(_MARKERS)]}
            for i, label in enumerate(labels)}


def _legend(fig, axes) -> None:
    """One legend for the figure, outside the panels (right), each label once."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize=8, frameon=False)


def _save(fig, path: str) -> str:
    from opl_rank.io.atomic import atomic_write

    fig.tight_layout()
    # bbox_inches="tight": the figure grows to hold the legend outside the panels
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=_DPI, bbox_inches="tight"))
    return path


def _vs_k(rows, value: str, out: str, show: bool) -> str:
    table = gain_table([r for r in rows if r["method"] == "rpod"], value=value)
    k_of = lambda label: int(label.split("k=")[1].split(")")[0])
    panels = sorted({(key[0], key[4].split("/")[-1]) for key in table})
    fig, axes = _axes(len(panels), show)
    style = _style([f"L={l}, λ={lam:g}, n={n}" for l, lam, n in sorted({key[1:4] for key in table})])
    for ax, (d, model) in zip(axes, panels):
        for l, lam, n in sorted({key[1:4] for key in table if key[0] == d}):
            pts = sorted((k_of(key[4]), v) for key, v in table.items() if key[:4] == (d, l, lam, n) and key[4].endswith("/" + model))
            label = f"L={l}, λ={lam:g}, n={n}"
            ax.errorbar([p[0] for p in pts], [p[1]["mean"] for p in pts], yerr=[p[1]["se"] for p in pts],
                        capsize=2, label=label, **style[label])
        ax.set_xticks(sorted({k_of(key[4]) for key in table if key[0] == d}))
        ax.set(title=f"R-POD, D={d}, f_hat {model}", xlabel="k", ylabel="normalised gain" if value == "normalized_gain" else "V")
    _legend(fig, axes)
    return _save(fig, out)


def _method_lines(rows, x_name: str, panel_names: tuple[str, str], out: str, show: bool) -> str:
    keep = [r for r in rows if r["method"] != "rpod" and r["method"] != "rpod-oracle"]
    table = gain_table(keep)
    index = {"D": 0, "lambda": 2, "n": 3}
    panels = sorted({(key[index[panel_names[0]]], key[index[panel_names[1]]]) for key in table})
    fig, axes = _axes(len(panels), show)
    # The grid's x values, evenly spaced (n usually doubles), each method a little to the side
    # of the others: one n (or lambda) is a readable column of points, not a pile.
    xs = sorted({key[index[x_name]] for key in table})
    labels = sorted({key[4] for key in table})
    style = _style(labels)
    width = 0.5 / len(labels)
    for ax, panel in zip(axes, panels):
        inside = {key: v for key, v in table.items() if (key[index[panel_names[0]]], key[index[panel_names[1]]]) == panel}
        for j, label in enumerate(labels):
            pts = sorted((key[index[x_name]], v) for key, v in inside.items() if key[4] == label)
            if not pts:
                continue
            shift = (j - (len(labels) - 1) / 2) * width
            ax.errorbar([xs.index(p[0]) + shift for p in pts], [p[1]["mean"] for p in pts], yerr=[p[1]["se"] for p in pts],
                        capsize=2, label=label, **style[label])
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set(title=f"{panel_names[0]}={panel[0]:g}, {panel_names[1]}={panel[1]:g}", xlabel=x_name, ylabel="normalised gain")
    _legend(fig, axes)
    return _save(fig, out)


def write_plots(rows: list[dict[str, Any]], out_dir: str, *, show: bool = False) -> list[str]:
    """Write the standard PNGs for ``rows`` (from :func:`experiments.report.load_rows` or a
    sweep) into ``out_dir``; returns their paths.

    ``show=True`` (notebooks) also leaves the figures open in pyplot, so Jupyter's inline
    backend displays them under the cell.
    """
    try:
        import matplotlib  # noqa: F401  (a base dependency; checked here for a one-line error)
    except ImportError as err:
        raise RuntimeError(
            f"plots need matplotlib, a dependency of opl_rank that is not importable here ({err}); "
            "reinstall with `bash scripts/setup.sh` or `.venv/bin/pip install matplotlib`"
        ) from None
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    if any(r["method"] == "rpod" for r in rows):
        paths.append(_vs_k(rows, "normalized_gain", os.path.join(out_dir, "gain_vs_k.png"), show))
        paths.append(_vs_k(rows, "V", os.path.join(out_dir, "value_vs_k.png"), show))
    paths.append(_method_lines(rows, "n", ("D", "lambda"), os.path.join(out_dir, "gain_vs_n.png"), show))
    paths.append(_method_lines(rows, "lambda", ("D", "n"), os.path.join(out_dir, "gain_vs_lambda.png"), show))
    return paths
