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
too), keeping the best epoch. Each (seed, browsing, truncation) is written atomically to ``cells/``; a rerun
skips finished ones. ``results.csv`` and ``report.md`` (mean ± SE over seeds) follow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable

import numpy as np
import yaml

from experiments.config import build_with_training, load_yaml, resolve_path
from opl_rank.pairwise_training import PairwiseTrainConfig

__all__ = ["PairwiseExperiment", "load_pairwise", "run_pairwise", "VARIANTS", "METRICS"]

VARIANTS = {"biased": "none", "ips": "individual", "debiased": "joint", "relevance": "none"}
METRICS = ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "map")


@dataclasses.dataclass(frozen=True)
class PairwiseExperiment:
    """A ``pairwise`` config; the training keys (:class:`PairwiseTrainConfig`) sit beside these."""

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

        if not 0.0 < self.test_fraction < 1.0 or not 0.0 < self.ranker_fraction <= 1.0 or not 0.0 <= self.valid_fraction < 1.0:
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


def load_pairwise(config_path: str, overrides: dict[str, Any]) -> PairwiseExperiment:
    """Read the YAML and ``--set`` overrides (lists with commas); unknown keys are errors."""
    values = load_yaml(config_path)
    values.update(overrides)
    for name in ("browsing", "truncation", "seeds", "variants", "hidden"):
        value = values.get(name)
        if isinstance(value, str):
            values[name] = [yaml.safe_load(v) for v in value.split(",")]
        elif value is not None and not isinstance(value, (list, tuple)):
            values[name] = [value]
    experiment = build_with_training(PairwiseExperiment, PairwiseTrainConfig, values, source=config_path)
    return dataclasses.replace(experiment, data=resolve_path(experiment.data, config_path))


def evaluate_ranker(scores: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Mean NDCG@{1,3,5,10} and MAP over queries with a relevant document (``[Q, D]`` inputs)."""
    import jax.numpy as jnp

    from opl_rank import metrics

    keep = (np.where(mask, labels, 0) > 0).any(axis=1)
    s, y, m = (jnp.asarray(a[keep]) for a in (scores, labels, mask))
    out = {f"ndcg@{k}": float(jnp.mean(metrics.ndcg_at_k(s, y, k, where=m))) for k in (1, 3, 5, 10)}
    out["map"] = float(jnp.mean(metrics.average_precision(s, y, where=m)))
    return out


def _run_cell(experiment: PairwiseExperiment, seed: int, browsing: str, truncation: int, data) -> list[dict[str, Any]]:
    import jax

    from opl_rank import prng
    from opl_rank.pairwise_training import train_pairwise_ranker
    from simulators.clicks import ClickModel, simulate_click_logs
    from simulators.letor import split_queries
    from simulators.semi_synthetic import forest_relevance_scores

    train, test = split_queries(data, (1.0 - experiment.test_fraction, experiment.test_fraction), seed=seed)
    ranker_scores = forest_relevance_scores(seed, train, train.features, experiment.ranker_fraction)
    k_clicks, k_train = prng.split_seed(seed, 2)
    k_clicks = jax.random.fold_in(jax.random.fold_in(k_clicks, truncation), ["independent", "continuous"].index(browsing))
    logs = simulate_click_logs(
        k_clicks, train.labels, train.mask, ranker_scores, ClickModel(browsing, truncation, experiment.eta), repeats=experiment.repeats,
    )
    features = train.features[logs.query[:, None], logs.docs]  # [N, K, F]
    # early stopping on held-out training queries' logs (the same, debiased, loss: no labels needed)
    queries = np.unique(logs.query)
    held = np.random.default_rng(seed).permutation(queries)[: int(round(experiment.valid_fraction * len(queries)))]
    is_valid = np.isin(logs.query, held)
    base = {"browsing": browsing, "truncation": truncation, "seed": seed, "n_lists": int(len(logs.query)),
            "clicks_per_list": float(logs.clicks.sum(1).mean())}
    test_forest = forest_relevance_scores(seed, train, test.features, experiment.ranker_fraction)
    rows = [{**base, "variant": "logging_ranker", **evaluate_ranker(test_forest, test.labels, test.mask), "train_seconds": 0.0}]
    # the [N, K, F] feature gathers are shared by every variant: slice them once
    fit_features, valid_features = features[~is_valid], features[is_valid]
    fit_mask, valid_mask = logs.mask[~is_valid], logs.mask[is_valid]
    for variant in experiment.variants:
        targets = logs.relevant if variant == "relevance" else logs.clicks
        start = time.perf_counter()
        ranker = train_pairwise_ranker(
            k_train, fit_features, targets[~is_valid], fit_mask, logs.examination, logs.joint_examination,
            correction=VARIANTS[variant], config=experiment.training,
            valid=(valid_features, targets[is_valid], valid_mask) if is_valid.any() else None,
        )
        scores = np.asarray(ranker.scores(test.features))
        rows.append({**base, "variant": variant, **evaluate_ranker(scores, test.labels, test.mask),
                     "epochs": len(ranker.history), "train_seconds": time.perf_counter() - start})
    return rows


def run_pairwise(experiment: PairwiseExperiment, *, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) every (seed, browsing, truncation); write cells, results.csv, report.md, config.yaml."""
    from opl_rank.atomic import atomic_write_text
    from simulators.letor import load_letor

    out = experiment.output_dir
    os.makedirs(os.path.join(out, "cells"), exist_ok=True)
    resolved = {k: v for k, v in dataclasses.asdict(experiment).items() if k != "training"}
    resolved.update(dataclasses.asdict(experiment.training))
    atomic_write_text(os.path.join(out, "config.yaml"), yaml.safe_dump(_plain(resolved), sort_keys=False))
    data = load_letor(experiment.data, n_features=experiment.n_features, normalize=experiment.normalize)
    cells = [(s, b, t) for s in experiment.seeds for b in experiment.browsing for t in experiment.truncation]
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for i, (seed, browsing, truncation) in enumerate(cells, start=1):
        path = os.path.join(out, "cells", f"seed{seed}_{browsing}_K{truncation}.json")
        if not os.path.exists(path):
            atomic_write_text(path, json.dumps(_run_cell(experiment, seed, browsing, truncation, data)))
            with open(path, encoding="utf-8") as f:
                done = json.load(f)
            best = max((r for r in done if r["variant"] != "logging_ranker"), key=lambda r: r["ndcg@10"])
            echo(f"[{i}/{len(cells)}] seed {seed} {browsing} K={truncation}: best {best['variant']} "
                 f"ndcg@10 {best['ndcg@10']:.4f}  (elapsed {time.perf_counter() - start:.0f}s)")
        with open(path, encoding="utf-8") as f:
            rows.extend(json.load(f))
    columns = list(dict.fromkeys(c for r in rows for c in r))
    lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]
    atomic_write_text(os.path.join(out, "results.csv"), "\n".join(lines) + "\n")
    report = pairwise_report(rows)
    atomic_write_text(os.path.join(out, "report.md"), report)
    return {"cells": len(cells), "rows": len(rows), "seconds": time.perf_counter() - start,
            "results": os.path.join(out, "results.csv"), "report": os.path.join(out, "report.md")}


def pairwise_report(rows: list[dict[str, Any]]) -> str:
    """Markdown: per browsing model and truncation, each variant's metrics as mean ± SE over
    seeds, and the share of the biased-to-relevance gap that debiasing closes (NDCG@10)."""
    lines = ["# Pairwise debiasing on simulated clicks", ""]
    groups = sorted({(r["browsing"], int(r["truncation"])) for r in rows})
    order = ["logging_ranker", *VARIANTS]
    for browsing, truncation in groups:
        sub = [r for r in rows if r["browsing"] == browsing and int(r["truncation"]) == truncation]
        lines += [f"## {browsing} browsing, lists cut at {truncation}", "",
                  "| variant | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
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
                lines += ["", f"No gap to close: relevance minus biased NDCG@10 is {gap:+.4f} (debiased minus biased {gain:+.4f})."]
        lines.append("")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
