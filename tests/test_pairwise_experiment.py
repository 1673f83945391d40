"""The pairwise reproduction end to end at a tiny size, and its ranker training."""

import csv
import json

import numpy as np
import pytest

from experiments.cli import main
from opl_rank import make_key
from opl_rank.ltr.pairwise import unbiased_pairwise_loss
from opl_rank.ltr.pairwise_training import PairwiseTrainConfig, train_pairwise_ranker
from simulators.clicks import ClickModel, simulate_click_logs

CONFIG = "experiments/configs/pairwise_yahoo.yaml"  # data: dataset:yahoo_sample (shipped in simulators/data)


def test_debiased_training_recovers_the_relevance_order_that_clicks_hide():
    """One feature decides relevance; position bias makes the top-ranked (irrelevant)
    documents look clicked. The biased ranker learns the logging order, the debiased one
    the relevance order."""
    rng = np.random.default_rng(0)
    q, k = 400, 6
    relevance_feature = rng.random((q, k))
    shown_first = np.tile(np.linspace(1, 0, k), (q, 1))  # the logging ranker's order, a second feature
    features = np.stack([relevance_feature, shown_first], axis=-1).astype(np.float32)
    labels = np.floor(relevance_feature * 4.99)  # grades 0..4 from feature 0
    logs = simulate_click_logs(
        make_key(0),
        labels,
        np.ones((q, k), bool),
        -np.arange(k)[None].repeat(q, 0) * 1.0,
        ClickModel("independent", k, eta=2.0),
        repeats=8,
    )
    shown = features[logs.query[:, None], logs.docs]
    config = PairwiseTrainConfig(hidden=(), learning_rate=0.05, epochs=15, batch_lists=256)
    weights = {}
    for correction in ("none", "joint"):
        ranker = train_pairwise_ranker(
            shown,
            logs.clicks,
            logs.mask,
            logs.examination,
            logs.joint_examination,
            make_key(1),
            correction=correction,
            config=config,
        )
        kernel = np.asarray(ranker.params["params"]["Dense_0"]["kernel"])[:, 0]
        weights[correction] = kernel[1] / abs(kernel[0])  # weight on position relative to relevance
    assert weights["none"] > 0.3  # clicks reward being shown first
    assert abs(weights["joint"]) < 0.6 * weights["none"]  # debiasing removes most of it


def test_early_stopping_keeps_the_best_validation_epoch():
    """With validation lists, training stops `patience` epochs after the best validation loss
    and returns that epoch's parameters (their validation loss is the history's minimum)."""
    rng = np.random.default_rng(3)
    q, k = 60, 5
    features = rng.normal(size=(q, k, 8)).astype(np.float32)  # noise features: overfitting is guaranteed
    labels = rng.integers(0, 5, size=(q, k)).astype(np.float64)
    logs = simulate_click_logs(
        make_key(2),
        labels,
        np.ones((q, k), bool),
        rng.normal(size=(q, k)),
        ClickModel("independent", k, eta=1.0),
        repeats=4,
    )
    shown = features[logs.query[:, None], logs.docs]
    held = logs.query < q // 3
    config = PairwiseTrainConfig(hidden=(32,), learning_rate=0.05, epochs=60, batch_lists=64, patience=3)
    ranker = train_pairwise_ranker(
        shown[~held],
        logs.clicks[~held],
        logs.mask[~held],
        logs.examination,
        logs.joint_examination,
        make_key(4),
        config=config,
        valid=(shown[held], logs.clicks[held], logs.mask[held]),
    )
    valid = [r["valid_loss"] for r in ranker.history]
    best = int(np.argmin(valid))
    assert len(valid) == best + 1 + config.patience < config.epochs  # stopped early, exactly patience after the best
    scores = ranker.scores(shown[held])
    kept = float(
        np.mean(
            unbiased_pairwise_loss(
                scores,
                logs.clicks[held],
                logs.examination,
                logs.joint_examination,
                where=logs.mask[held],
                pair_loss="ranknet",
                correction="joint",
            )
        )
    )
    assert kept == pytest.approx(valid[best], rel=1e-5)
    no_valid = train_pairwise_ranker(
        shown[~held],
        logs.clicks[~held],
        logs.mask[~held],
        logs.examination,
        logs.joint_examination,
        make_key(4),
        config=config,
    )
    assert len(no_valid.history) == config.epochs and "valid_loss" not in no_valid.history[0]


@pytest.mark.extended
@pytest.mark.slow
def test_pairwise_command_writes_tables_and_resumes(tmp_path, capsys):
    out = tmp_path / "pw"
    args = [
        "pairwise",
        "--config",
        CONFIG,
        "--set",
        "seeds=0",
        "--set",
        "browsing=continuous",
        "--set",
        "truncation=10",
        "--set",
        "epochs=2",
        "--set",
        "repeats=2",
        "--set",
        "variants=biased,debiased",
        "--set",
        f"output_dir={out}",
        "--json",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["cells"] == 1
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == ["logging_ranker", "biased", "debiased"]
    for r in rows:
        for metric in ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "map"):
            assert 0.0 < float(r[metric]) <= 1.0
    assert "| debiased |" in (out / "report.md").read_text()
    assert main(args) == 0  # resumes: the cell is read back, not refitted
    assert "[1/1]" not in capsys.readouterr().err
    assert main(["pairwise", "--config", CONFIG, "--set", "browsing=cascade", "--set", f"output_dir={out}"]) == 2
    assert "browsing must be a non-empty list of" in capsys.readouterr().err
    # Another config into the same folder is refused, naming the key; a corrupt cell is named and recomputed.
    changed = [a if a != "epochs=2" else "epochs=3" for a in args]
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "holds results of a different config" in err and "epochs" in err
    (cell,) = (out / "cells").iterdir()
    cell.write_text(cell.read_text()[:40])
    assert main(args) == 0
    err = capsys.readouterr().err
    assert cell.name in err and "recomputing" in err
    with open(out / "results.csv") as f:
        again = list(csv.DictReader(f))
    untimed = lambda table: [{k: v for k, v in r.items() if "seconds" not in k} for r in table]  # noqa: E731
    assert untimed(again) == untimed(rows)
