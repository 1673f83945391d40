"""``opl-rank pairwise``: the pairwise-debiasing paper's reproduction on a LETOR file.

Per seed the queries are split into train and test. A logging ranker (a random forest on
the labels of a share of the training queries) orders every training query's documents;
the list is cut at each truncation and shown ``repeats`` times to simulated users of each
browsing model (clicks = examination x Bernoulli relevance). A pairwise neural ranker is
then trained per variant:

  biased      RankNet on clicks (the lower bound);
  ips         inverse propensity on the clicked item of a pair (Unbiased-LambdaMART style);
  debiased    the unbiased loss with the 4x4 correction from individual and joint
              examination probabilities (the paper's method, true propensities);
  relevance   RankNet on the relevance draws themselves (full information: the upper bound).

Every ranker is evaluated on the test queries' full lists with the true graded labels:
NDCG@{1,3,5,10} and MAP (labels >= 1 relevant), queries without a relevant document
excluded. Training stops early on the same loss computed on the click logs of held-out
training queries (``valid_fraction``; the paper's point that validation must be debiased
too), keeping the best epoch. Each (seed, browsing, truncation) is written atomically to ``cells/``,
stamped with the config's hash; a rerun of the same config reuses finished ones (see
[`experiments.resume`][experiments.resume]). ``results.csv`` (and ``results.parquet``, via
[`experiments.tables`][experiments.tables]) and ``report.md`` (mean ± SE over seeds) follow.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from experiments.config import build_with_training, load_yaml, resolve_path
from experiments.grid import as_lists, check_unique
from experiments.resume import BadCell, open_run_folder, read_cell, write_cell
from experiments.tables import write_tables
from opl_rank.io.atomic import atomic_write_text
from opl_rank.ltr.pairwise_training import PairwiseTrainConfig

__all__ = ["PairwiseExperiment", "load_pairwise", "run_pairwise", "cells", "check_rows", "VARIANTS", "METRICS"]

VARIANTS = {"biased": "none", "ips": "individual", "debiased": "joint", "relevance": "none"}
METRICS = ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "map")


@dataclasses.dataclass(frozen=True)
class PairwiseExperiment:
    """A ``pairwise`` config; the training keys ([`PairwiseTrainConfig`][PairwiseTrainConfig]) sit beside these."""

    data: str
    n_features: int | None = None
    normalize: str | None = None
    test_fraction: float = 0.3
    valid_fraction: float = 0.2  # share of training queries whose click logs early-stop training
    ranker_fraction: float = 0.1  # share of training queries labelled for the logging ranker
    browsing: tuple[str, ...] = ("independent", "continuous")
    truncation: tuple[int, ...] = (10, 20)
    eta: float = 1.0
    repeats: int = 16
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    variants: tuple[str, ...] = ("biased", "ips", "debiased", "relevance")
    output_dir: str = "results/pairwise_yahoo"
    training: PairwiseTrainConfig = PairwiseTrainConfig()

    def __post_init__(self) -> None:
        from simulators.clicks import BROWSING_MODELS

        if (
            not 0.0 < self.test_fraction < 1.0
            or not 0.0 < self.ranker_fraction <= 1.0
            or not 0.0 <= self.valid_fraction < 1.0
        ):
            raise ValueError("test_fraction must be in (0, 1), valid_fraction in [0, 1) and ranker_fraction in (0, 1]")
        unknown = sorted(set(self.browsing) - set(BROWSING_MODELS))
        if unknown or not self.browsing:
            raise ValueError(f"browsing must be a non-empty list of {BROWSING_MODELS}, got {list(self.browsing)}")
        unknown = sorted(set(self.variants) - set(VARIANTS))
        if unknown or not self.variants:
            raise ValueError(f"variants must be a non-empty list of {list(VARIANTS)}, got {list(self.variants)}")
        if not self.truncation or any(t < 2 for t in self.truncation):
            raise ValueError(f"truncation values must be >= 2, got {list(self.truncation)}")
        if not self.seeds or any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be non-negative, got {list(self.seeds)}")
        if self.repeats < 1 or not (self.eta >= 0 and math.isfinite(self.eta)):
            raise ValueError("repeats must be >= 1 and eta finite and >= 0")
        check_unique(self, ("browsing", "truncation", "seeds", "variants"))


def load_pairwise(config_path: str, overrides: dict[str, Any]) -> PairwiseExperiment:
    """Read the YAML and ``--set`` overrides (lists with commas); unknown keys are errors."""
    from experiments.config import check_override_keys

    check_override_keys(overrides, PairwiseExperiment, PairwiseTrainConfig)
    values = as_lists({**load_yaml(config_path), **overrides}, PairwiseExperiment, PairwiseTrainConfig)
    experiment = build_with_training(PairwiseExperiment, PairwiseTrainConfig, values, source=config_path)
    return dataclasses.replace(experiment, data=resolve_path(experiment.data, config_path))


def resolved_config(experiment: PairwiseExperiment) -> dict[str, Any]:
    """The flat config written to ``config.yaml`` (the training keys beside the others)."""
    resolved = {k: v for k, v in dataclasses.asdict(experiment).items() if k != "training"}
    resolved.update(dataclasses.asdict(experiment.training))
    return resolved


def cells(experiment: PairwiseExperiment) -> list[dict[str, Any]]:
    """Every (seed, browsing, truncation), in a stable order."""
    return [
        dict(seed=s, browsing=b, truncation=t)
        for s in experiment.seeds
        for b in experiment.browsing
        for t in experiment.truncation
    ]


def cell_name(cell: dict[str, Any]) -> str:
    return "seed{seed}_{browsing}_K{truncation}".format(**cell)


def check_rows(experiment: PairwiseExperiment, cell: dict[str, Any], rows: Any) -> str | None:
    """None when ``rows`` are what [`_run_cell`][_run_cell] writes for ``cell``; else the problem."""
    expected = ["logging_ranker", *experiment.variants]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "rows are not a list of objects"
    if len(rows) != len(expected):
        return f"{len(rows)} rows, expected {len(expected)}"
    for i, (row, variant) in enumerate(zip(rows, expected)):
        missing = [
            c
            for c in ("browsing", "truncation", "seed", "n_lists", "variant", *METRICS, "train_seconds")
            if c not in row
        ]
        if missing:
            return f"row {i} lacks column(s) {missing}"
        if row["variant"] != variant:
            return f"row {i} is variant {row['variant']!r}, expected {variant!r}"
        wrong = [k for k in cell if row[k] != cell[k]]
        if wrong:
            return f"row {i} belongs to another cell ({', '.join(f'{k}={row[k]!r}' for k in wrong)})"
    return None


def evaluate_ranker(scores: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Mean NDCG@{1,3,5,10} and MAP over queries with a relevant document (``[Q, D]`` inputs)."""
    import jax.numpy as jnp

    from opl_rank import metrics

    keep = (np.where(mask, labels, 0) > 0).any(axis=1)
    s, y, m = (jnp.asarray(a[keep]) for a in (scores, labels, mask))
    out = {f"ndcg@{k}": float(jnp.mean(metrics.ndcg_at_k(s, y, k, where=m))) for k in (1, 3, 5, 10)}
    out["map"] = float(jnp.mean(metrics.average_precision(s, y, where=m)))
    return out


def _run_cell(
    experiment: PairwiseExperiment, seed: int, browsing: str, truncation: int, data, progress: Any = None
) -> list[dict[str, Any]]:
    """One (seed, browsing, truncation); ``progress``: a bar with ``1 + len(variants)`` steps."""
    import jax

    from experiments.progress import Steps
    from opl_rank import prng
    from opl_rank.ltr.pairwise_training import train_pairwise_ranker
    from simulators.clicks import ClickModel, simulate_click_logs
    from simulators.letor import split_queries
    from simulators.semi_synthetic import forest_relevance_scores

    step = Steps(progress) if progress is not None else (lambda label: None)
    step("clicks and the logging ranker")
    train, test = split_queries(data, (1.0 - experiment.test_fraction, experiment.test_fraction), seed=seed)
    ranker_scores = forest_relevance_scores(seed, train, train.features, experiment.ranker_fraction)
    k_clicks, k_train = prng.split_seed(seed, 2)
    k_clicks = jax.random.fold_in(
        jax.random.fold_in(k_clicks, truncation), ["independent", "continuous"].index(browsing)
    )
    logs = simulate_click_logs(
        k_clicks,
        train.labels,
        train.mask,
        ranker_scores,
        ClickModel(browsing, truncation, experiment.eta),
        repeats=experiment.repeats,
    )
    features = train.features[logs.query[:, None], logs.docs]  # [N, K, F]
    # early stopping on held-out training queries' logs (the same, debiased, loss: no labels needed)
    queries = np.unique(logs.query)
    held = np.random.default_rng(seed).permutation(queries)[: int(round(experiment.valid_fraction * len(queries)))]
    is_valid = np.isin(logs.query, held)
    base = {
        "browsing": browsing,
        "truncation": truncation,
        "seed": seed,
        "n_lists": int(len(logs.query)),
        "clicks_per_list": float(logs.clicks.sum(1).mean()),
    }
    test_forest = forest_relevance_scores(seed, train, test.features, experiment.ranker_fraction)
    rows = [
        {
            **base,
            "variant": "logging_ranker",
            **evaluate_ranker(test_forest, test.labels, test.mask),
            "train_seconds": 0.0,
        }
    ]
    # the [N, K, F] feature gathers are shared by every variant: slice them once
    fit_features, valid_features = features[~is_valid], features[is_valid]
    fit_mask, valid_mask = logs.mask[~is_valid], logs.mask[is_valid]
    for variant in experiment.variants:
        step(variant)
        targets = logs.relevant if variant == "relevance" else logs.clicks
        start = time.perf_counter()

        def on_epoch(epoch: int, record: dict[str, float], variant: str = variant) -> None:
            progress.set_postfix_str(f"{variant} epoch {epoch}/{experiment.training.epochs}", refresh=False)

        ranker = train_pairwise_ranker(
            fit_features,
            targets[~is_valid],
            fit_mask,
            logs.examination,
            logs.joint_examination,
            k_train,
            correction=VARIANTS[variant],
            config=experiment.training,
            valid=(valid_features, targets[is_valid], valid_mask) if is_valid.any() else None,
            on_epoch=on_epoch if progress is not None else None,
        )
        scores = np.asarray(ranker.scores(test.features))
        rows.append(
            {
                **base,
                "variant": variant,
                **evaluate_ranker(scores, test.labels, test.mask),
                "epochs": len(ranker.history),
                "train_seconds": time.perf_counter() - start,
            }
        )
    if progress is not None:
        step.done()
    return rows


def run_pairwise(
    experiment: PairwiseExperiment,
    *,
    echo: Callable[[str], None] = print,
    new_config: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Run (or resume) every (seed, browsing, truncation); write cells, results.csv
    (and results.parquet), report.md and config.yaml.

    The output folder is locked and checked like a sweep's ([`experiments.resume.open_run_folder`][experiments.resume.open_run_folder]):
    another config there is an error naming the differing keys, unless ``new_config``; cell
    files of this config are reused, bad ones named and recomputed.

    ``progress``: bars on stderr ([`experiments.progress`][experiments.progress]) over the cells and over each
    cell's steps (clicks, then every variant's training, epoch by epoch).
    """
    from experiments.progress import bar
    from simulators.letor import load_letor

    with (
        open_run_folder(experiment.output_dir, resolved_config(experiment), new_config=new_config, echo=echo) as folder,
        bar(len(cells(experiment)), desc="cells", unit="cell", enabled=progress) as cells_bar,
    ):
        experiment = dataclasses.replace(experiment, output_dir=folder.path)
        every = cells(experiment)

        def read(cell):
            return read_cell(
                folder.cell_path(cell_name(cell)),
                config_hash=folder.config_hash,
                cell=cell,
                check_rows=lambda rows: check_rows(experiment, cell, rows),
            )

        data = None
        start = time.perf_counter()
        rows: list[dict[str, Any]] = []
        resumed = 0
        for i, cell in enumerate(every, start=1):
            try:
                rows.extend(read(cell))
                resumed += 1
                cells_bar.update(1)
                continue
            except BadCell as bad:
                if not isinstance(bad.__cause__, FileNotFoundError):
                    echo(f"cell file {bad}: recomputing it")
            if data is None:
                cells_bar.set_postfix_str(f"loading {os.path.basename(experiment.data)}")
                data = load_letor(experiment.data, n_features=experiment.n_features, normalize=experiment.normalize)
                cells_bar.set_postfix_str("")
            with bar(1 + len(experiment.variants), desc=cell_name(cell), unit="step", enabled=progress) as cell_bar:
                done = _run_cell(
                    experiment,
                    cell["seed"],
                    cell["browsing"],
                    cell["truncation"],
                    data,
                    progress=cell_bar if progress else None,
                )
            cells_bar.update(1)
            write_cell(folder.cell_path(cell_name(cell)), cell=cell, rows=done, config_hash=folder.config_hash)
            best = max((r for r in done if r["variant"] != "logging_ranker"), key=lambda r: r["ndcg@10"])
            echo(
                f"[{i}/{len(every)}] seed {cell['seed']} {cell['browsing']} K={cell['truncation']}: best {best['variant']} "
                f"ndcg@10 {best['ndcg@10']:.4f}  (elapsed {time.perf_counter() - start:.0f}s)"
            )
            rows.extend(read(cell))
        tables = write_tables(folder.path, rows, int_columns=("epochs",), echo=echo)
        atomic_write_text(folder.file("report.md"), pairwise_report(rows))
    return {
        "cells": len(every),
        "resumed": resumed,
        "rows": len(rows),
        "seconds": time.perf_counter() - start,
        "results": tables["results"],
        "report": folder.file("report.md"),
        "output_dir": folder.path,
        "config_hash": folder.config_hash[:8],
    }


def pairwise_report(rows: list[dict[str, Any]]) -> str:
    """Markdown: per browsing model and truncation, each variant's metrics as mean ± SE over
    seeds, and the share of the biased-to-relevance gap that debiasing closes (NDCG@10)."""
    lines = ["# Pairwise debiasing on simulated clicks", ""]
    groups = sorted({(r["browsing"], int(r["truncation"])) for r in rows})
    order = ["logging_ranker", *VARIANTS]
    for browsing, truncation in groups:
        sub = [r for r in rows if r["browsing"] == browsing and int(r["truncation"]) == truncation]
        lines += [
            f"## {browsing} browsing, lists cut at {truncation}",
            "",
            "| variant | " + " | ".join(METRICS) + " |",
            "|---|" + "---|" * len(METRICS),
        ]
        means = {}
        for variant in [v for v in order if any(r["variant"] == v for r in sub)]:
            cells = []
            for metric in METRICS:
                values = np.array([float(r[metric]) for r in sub if r["variant"] == variant])
                se = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
                means[(variant, metric)] = values.mean()
                cells.append(f"{values.mean():.4f} ± {se:.4f}")
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        if all((v, "ndcg@10") in means for v in ("biased", "debiased", "relevance")):
            gap = means[("relevance", "ndcg@10")] - means[("biased", "ndcg@10")]
            gain = means[("debiased", "ndcg@10")] - means[("biased", "ndcg@10")]
            if gap > 0.01:
                lines += ["", f"Debiasing closes {gain / gap:.0%} of the biased-to-relevance NDCG@10 gap ({gap:+.4f})."]
            else:
                lines += [
                    "",
                    f"No gap to close: relevance minus biased NDCG@10 is {gap:+.4f} (debiased minus biased {gain:+.4f}).",
                ]
        lines.append("")
    return "\n".join(lines)
