"""Standard plots of a sweep's results (PNG).

  gain_vs_k.png       normalised gain of R-POD against k, one panel per (D, reward model),
                      a line per (L, lambda, n) -- the paper's main figure
  value_vs_k.png      the same with V
  gain_vs_n.png       normalised gain against n, one panel per (D, lambda), a line per method
  gain_vs_lambda.png  normalised gain against lambda, one panel per (D, n), a line per method

Settings are never pooled: every setting axis beyond the grid that takes more than one
value in the table ([`experiments.report.varying_axes`][experiments.report.varying_axes]: ``tau``, ``simulator``, extra
sweep axes such as ``interaction_scale``) splits the panels further, and the panel title
names it (``R-POD, D=10, f_hat additive, tau=0.5``); so does L in the method plots when it
varies. [`plot_series`][plot_series] returns what each figure draws (panels, lines, points), without
matplotlib.

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

from experiments.report import _order, _show, gain_table, varying_axes

__all__ = ["write_plots", "plot_series"]


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
    return {
        label: {"color": f"C{i % 10}", "marker": _MARKERS[(i // 10) % len(_MARKERS)]} for i, label in enumerate(labels)
    }


def _legend(fig, axes) -> None:
    """One legend for the figure, outside the panels (right), each label once."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize=8,
            frameon=False,
        )


def _save(fig, path: str) -> str:
    from opl_rank.io.atomic import atomic_write

    fig.tight_layout()
    # bbox_inches="tight": the figure grows to hold the legend outside the panels
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=_DPI, bbox_inches="tight"))
    return path


def _extras(axes: tuple, varying: tuple[str, ...]) -> str:
    return "".join(f", {name}={_show(value)}" for name, value in axes if name in varying)


def _vs_k_series(rows, value: str, varying: tuple[str, ...]) -> list[dict[str, Any]]:
    table = gain_table([r for r in rows if r["method"] == "rpod"], value=value)
    k_of = lambda label: int(label.split("k=")[1].split(")")[0])
    # a panel per (D, f_hat, the other axes); a line per (L, lambda, n) inside it
    panels = sorted(
        {(key[0], key[4].split("/")[-1], key[5]) for key in table},
        key=lambda p: (_order(p[0]), p[1], tuple(_order(v) for _, v in p[2])),
    )
    ylabel = "normalised gain" if value == "normalized_gain" else "V"
    out = []
    for d, model, axes in panels:
        inside = {key: v for key, v in table.items() if key[0] == d and key[5] == axes}
        lines = []
        for l, lam, n in sorted({key[1:4] for key in inside}):
            pts = sorted(
                (k_of(key[4]), v)
                for key, v in inside.items()
                if key[1:4] == (l, lam, n) and key[4].endswith("/" + model)
            )
            if pts:
                lines.append(
                    {
                        "label": f"L={l}, λ={lam:g}, n={n}",
                        "x": [p[0] for p in pts],
                        "mean": [p[1]["mean"] for p in pts],
                        "se": [p[1]["se"] for p in pts],
                        "seeds": [p[1]["seeds"] for p in pts],
                        "grid": (l, lam, n),
                    }
                )
        out.append(
            {
                "title": f"R-POD, D={d}, f_hat {model}{_extras(axes, varying)}",
                "xlabel": "k",
                "ylabel": ylabel,
                "xticks": sorted({k_of(key[4]) for key in inside}),
                "lines": lines,
            }
        )
    return out


def _method_series(
    rows, x_name: str, panel_name: str, varying: tuple[str, ...], l_varies: bool
) -> list[dict[str, Any]]:
    keep = [r for r in rows if r["method"] != "rpod" and r["method"] != "rpod-oracle"]
    table = gain_table(keep)
    index = {"lambda": 2, "n": 3}
    # a panel per (D, L, lambda or n, the other axes); a line per method, x the other of lambda and n
    panel_of = lambda key: (key[0], key[1], key[index[panel_name]], key[5])
    panels = sorted(
        {panel_of(key) for key in table},
        key=lambda p: (_order(p[0]), _order(p[1]), _order(p[2]), tuple(_order(v) for _, v in p[3])),
    )
    labels = sorted({key[4] for key in table})
    out = []
    for panel in panels:
        d, l, at, axes = panel
        inside = {key: v for key, v in table.items() if panel_of(key) == panel}
        lines = []
        for label in labels:
            pts = sorted((key[index[x_name]], v) for key, v in inside.items() if key[4] == label)
            if pts:
                lines.append(
                    {
                        "label": label,
                        "x": [p[0] for p in pts],
                        "mean": [p[1]["mean"] for p in pts],
                        "se": [p[1]["se"] for p in pts],
                        "seeds": [p[1]["seeds"] for p in pts],
                    }
                )
        title = f"D={d:g}" + (f", L={l}" if l_varies else "") + f", {panel_name}={at:g}{_extras(axes, varying)}"
        out.append({"title": title, "xlabel": x_name, "ylabel": "normalised gain", "lines": lines})
    return out


def plot_series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What [`write_plots`][write_plots] draws, without drawing it: ``{file name: [panel, ...]}``.

    A panel is ``{"title", "xlabel", "ylabel", "lines"}`` (R-POD panels add ``"xticks"``,
    the k values); a line is ``{"label", "x", "mean", "se", "seeds"}`` (R-POD lines add
    ``"grid"``, their (L, lambda, n)) with one point per x,
    each the mean (and SE) over the seeds of one setting. Panels split by every varying axis
    beyond the grid (and by L when it varies), so no line pools two settings.
    """
    rows = list(rows)
    varying = varying_axes(rows)
    l_varies = len({r["L"] for r in rows}) > 1
    out: dict[str, list[dict[str, Any]]] = {}
    if any(r["method"] == "rpod" for r in rows):
        out["gain_vs_k.png"] = _vs_k_series(rows, "normalized_gain", varying)
        out["value_vs_k.png"] = _vs_k_series(rows, "V", varying)
    out["gain_vs_n.png"] = _method_series(rows, "n", "lambda", varying, l_varies)
    out["gain_vs_lambda.png"] = _method_series(rows, "lambda", "n", varying, l_varies)
    return out


def _titles(ax, panel: dict[str, Any]) -> None:
    ax.set(title=panel["title"], xlabel=panel["xlabel"], ylabel=panel["ylabel"])
    if len(panel["title"]) > 40:  # a title that names further axes: smaller, to stay over its panel
        ax.title.set_fontsize("medium")


def _draw_vs_k(panels: list[dict[str, Any]], out: str, show: bool) -> str:
    fig, axes = _axes(len(panels), show)
    grid = {line["label"]: line["grid"] for panel in panels for line in panel["lines"]}
    style = _style(sorted(grid, key=grid.get))  # by (L, lambda, n), as the lines are drawn
    for ax, panel in zip(axes, panels):
        for line in panel["lines"]:
            ax.errorbar(
                line["x"], line["mean"], yerr=line["se"], capsize=2, label=line["label"], **style[line["label"]]
            )
        ax.set_xticks(panel["xticks"])
        _titles(ax, panel)
    _legend(fig, axes)
    return _save(fig, out)


def _draw_method_lines(panels: list[dict[str, Any]], out: str, show: bool) -> str:
    fig, axes = _axes(len(panels), show)
    # The grid's x values, evenly spaced (n usually doubles), each method a little to the side
    # of the others: one n (or lambda) is a readable column of points, not a pile.
    xs = sorted({x for panel in panels for line in panel["lines"] for x in line["x"]})
    labels = sorted({line["label"] for panel in panels for line in panel["lines"]})
    style = _style(labels)
    width = 0.5 / max(len(labels), 1)
    for ax, panel in zip(axes, panels):
        for line in panel["lines"]:
            shift = (labels.index(line["label"]) - (len(labels) - 1) / 2) * width
            ax.errorbar(
                [xs.index(x) + shift for x in line["x"]],
                line["mean"],
                yerr=line["se"],
                capsize=2,
                label=line["label"],
                **style[line["label"]],
            )
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
        ax.set_xlim(-0.5, len(xs) - 0.5)
        _titles(ax, panel)
    _legend(fig, axes)
    return _save(fig, out)


def write_plots(rows: list[dict[str, Any]], out_dir: str, *, show: bool = False) -> list[str]:
    """Write the standard PNGs for ``rows`` (from [`experiments.report.load_rows`][experiments.report.load_rows] or a
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
    for name, panels in plot_series(rows).items():
        if not panels:  # e.g. a sweep of only R-POD's k: no method lines to draw
            continue
        draw = _draw_vs_k if name.endswith("_vs_k.png") else _draw_method_lines
        paths.append(draw(panels, os.path.join(out_dir, name), show))
    return paths
