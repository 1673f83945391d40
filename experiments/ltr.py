"""``opl-rank ltr``: full-information LTR on a LETOR file with a PL gradient estimator."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import yaml

from experiments.config import build_with_training, load_yaml, resolve_path
from experiments.progress import bar
from experiments.tables import write_csv
from opl_rank.ltr.training import LTRConfig

__all__ = ["LTRExperiment", "run_ltr"]


@dataclasses.dataclass(frozen=True)
class LTRExperiment:
    """An ``ltr`` config: data, split and output; the training keys (every
    [`LTRConfig`][opl_rank.ltr.training.LTRConfig] field) sit beside them, flat, in the YAML."""

    data: str
    normalize: str | None = "minmax"
    valid_fraction: float = 0.2
    max_docs: int | None = None
    seed: int = 0
    output_dir: str | None = None
    training: LTRConfig = LTRConfig()

    def __post_init__(self) -> None:
        if not 0.0 < self.valid_fraction < 1.0:
            raise ValueError(f"valid_fraction must be in (0, 1), got {self.valid_fraction}")
        if self.normalize not in (None, "minmax", "zscore"):
            raise ValueError(f"normalize must be null, 'minmax' or 'zscore', got {self.normalize!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


def load_experiment(config_path: str, overrides: dict[str, Any]) -> LTRExperiment:
    """Read the YAML, apply ``--set`` overrides, split the keys between the experiment and
    [`LTRConfig`][LTRConfig], and validate both (unknown keys are errors)."""
    values = load_yaml(config_path)
    from experiments.config import check_override_keys

    check_override_keys(overrides, LTRExperiment, LTRConfig)
    values.update(overrides)
    experiment = build_with_training(LTRExperiment, LTRConfig, values, source=config_path)
    return dataclasses.replace(experiment, data=resolve_path(experiment.data, config_path))


def run_ltr(
    experiment: LTRExperiment, *, echo: Callable[[str], None] = print, progress: bool = False
) -> dict[str, Any]:
    """Load, split, train, and (with ``output_dir``) write ``history.csv``, ``config.yaml``
    and ``summary.json`` atomically. ``progress``: a bar over the epochs on stderr."""
    with bar(experiment.training.epochs, desc="ltr", unit="epoch", enabled=progress) as epochs_bar:
        return _run_ltr(experiment, echo, epochs_bar)


def _run_ltr(experiment: LTRExperiment, echo: Callable[[str], None], epochs_bar: Any) -> dict[str, Any]:
    from opl_rank import prng
    from opl_rank.io import atomic
    from opl_rank.ltr import training as ltr_training
    from simulators.letor import load_letor, split_queries

    epochs_bar.set_postfix_str(f"loading {os.path.basename(experiment.data)}")
    data = load_letor(experiment.data, normalize=experiment.normalize, max_docs=experiment.max_docs)
    train, valid = split_queries(
        data, (1.0 - experiment.valid_fraction, experiment.valid_fraction), seed=experiment.seed
    )
    cfg = experiment.training
    echo(
        f"ltr: {os.path.basename(experiment.data)}: {train.features.shape[0]} train / {valid.features.shape[0]} valid "
        f"queries, {data.features.shape[2]} features; estimator={cfg.estimator} loss={cfg.loss} N={cfg.n_samples} K={cfg.cutoff}"
    )
    metric = f"valid_ndcg@{cfg.cutoff}"
    epochs_bar.set_postfix_str("training (the first epoch compiles)")

    def progress(record: dict[str, float]) -> None:
        epochs_bar.set_postfix_str(f"{metric} {record[metric]:.4f}", refresh=False)
        epochs_bar.update(1)
        echo(
            f"epoch {record['epoch']:>3}/{cfg.epochs}  train_loss {record['train_loss']:+.4f}  "
            f"{metric} {record[metric]:.4f}  valid_loss {record['valid_loss']:+.4f}  {record['seconds']:.3f}s"
        )

    result = ltr_training.train_ltr(train, valid, prng.make_key(experiment.seed), cfg, progress=progress)
    history = result.history
    summary = {
        "final_" + metric: history[-1][metric],
        "best_" + metric: max(r[metric] for r in history),
        "seconds_per_epoch": sum(r["seconds"] for r in history[1:]) / max(1, len(history) - 1),
        "epochs": len(history),
        "estimator": cfg.estimator,
        "loss": cfg.loss,
    }
    if experiment.output_dir:
        out = experiment.output_dir
        write_csv(os.path.join(out, "history.csv"), history)
        resolved = {k: v for k, v in dataclasses.asdict(experiment).items() if k != "training"}
        resolved.update(dataclasses.asdict(cfg), hidden=list(cfg.hidden))
        atomic.atomic_write_text(os.path.join(out, "config.yaml"), yaml.safe_dump(resolved, sort_keys=False))
        atomic.atomic_write_text(os.path.join(out, "summary.json"), json.dumps(summary, indent=2) + "\n")
        summary["output_dir"] = out
    return summary
