"""Time one fit of every off-policy learner at n=8000 (D=10, L=5, lambda=0.5).

Usage (from the repository root)::

    python benchmarks/bench_learners.py            # n = 8000 (several minutes on 2 CPUs)
    python benchmarks/bench_learners.py --quick    # n = 1000, fewer epochs (smoke test)
    python benchmarks/bench_learners.py --grid experiments/configs/synthetic_opl.yaml \
        --backend processes --workers 2            # also the whole D=10 grid (~25 min)

For each method the first fit ("cold") includes JAX compilation; a second fit on a new
data set with another seed ("warm") reuses the compiled training steps (the sweep's
situation from its second cell on). Baseline in the same run: the IPS learner's epoch
written naively -- an un-jitted Python loop over minibatches with eager ``jax.grad`` --
against our compiled ``lax.scan`` steps; the ratio is reported. ``--grid`` times a whole
sweep from an empty compilation cache (compilation included). obp has no learner for
ranking policies to compare with.

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script

from _timing import environment, seconds  # noqa: E402  (benchmarks/ is the script folder)

from opl_rank import make_key  # noqa: E402
from opl_rank.opl import estimators as oe  # noqa: E402
from opl_rank.opl.learners import LearnerConfig, fit  # noqa: E402
from opl_rank.opl.policies import PLPolicy  # noqa: E402
from opl_rank.optimization import TrainConfig  # noqa: E402
from opl_rank.scorers import ActionScorer  # noqa: E402
from simulators import SyntheticRankingEnv  # noqa: E402

CONFIGS = [
    ("ips", None, "additive"),
    ("iips", None, "additive"),
    ("rips", None, "additive"),
    ("dr", None, "additive"),
    ("dr", None, "pairwise"),
    ("regression", None, "additive"),
    ("regression", None, "pairwise"),
    ("rpod", 2, "additive"),
    ("rpod", 2, "pairwise"),
]


def _fit_and_wait(data, key, cfg) -> None:
    """A fit, waiting until every parameter array is computed."""
    policy = fit(data, key, cfg)
    parts = [getattr(policy, name, None) for name in ("params", "reward_model", "first_stage")]
    params = [p.params if hasattr(p, "params") else p for p in parts if p is not None]
    jax.block_until_ready([leaf for leaf in jax.tree.leaves(params) if isinstance(leaf, jax.Array)])


def learner_timings(n: int, epochs: int) -> dict[str, dict[str, float]]:
    env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5, lam=0.5)
    data = [env.sample_logged_data(make_key(s), n, position_marginals="exact") for s in (1, 2)]
    train = TrainConfig(epochs=epochs, batch_size=256, learning_rate=0.05)
    reward = TrainConfig(epochs=2 * epochs, batch_size=256, learning_rate=0.02)
    out = {}
    for method, k, kind in CONFIGS:
        cfg = LearnerConfig(method, k=k, reward_model=kind, train=train, reward_train=reward)
        name = f"{method}{'' if k is None else f'(k={k})'}/{kind}" if method not in ("ips", "iips", "rips") else method
        cold = seconds(lambda: _fit_and_wait(data[0], make_key(3), cfg))
        warm = seconds(lambda: _fit_and_wait(data[1], make_key(4), cfg))
        out[name] = {"cold_s": cold, "warm_s": warm}
        print(f"  {name:<22} cold {cold:7.2f} s   warm {warm:7.2f} s", flush=True)
    return out


def naive_vs_compiled_epoch(n: int) -> dict[str, float]:
    """One IPS epoch: Python loop + eager grad vs the library's compiled scan (via fit)."""
    env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5, lam=0.5)
    data = env.sample_logged_data(make_key(1), n)
    module = ActionScorer(n_items=10)
    params = module.init(make_key(2), data.context[:1])
    optimizer = optax.adam(0.05)

    def loss(p, batch):
        target = PLPolicy(module, p, batch.ranking_length).propensities(batch)
        return -oe.estimate(oe.ips_terms(target, batch))

    def naive_epoch(p):
        state = optimizer.init(p)
        order = np.random.default_rng(0).permutation(n)
        for start in range(0, n - 255, 256):
            batch = data.take(order[start : start + 256])
            grads = jax.grad(loss)(p, batch)
            updates, state = optimizer.update(grads, state, p)
            p = optax.apply_updates(p, updates)
        return jax.block_until_ready(p)

    naive_epoch(params)  # warm the eager op caches
    naive = min(seconds(lambda: naive_epoch(params)) for _ in range(2))
    cfg = LearnerConfig("ips", train=TrainConfig(epochs=1, batch_size=256, learning_rate=0.05))
    fit(data, make_key(3), cfg)  # compile
    one = min(seconds(lambda: jax.block_until_ready(fit(data, make_key(4), cfg).params)) for _ in range(3))
    cfg2 = LearnerConfig("ips", train=TrainConfig(epochs=11, batch_size=256, learning_rate=0.05))
    fit(data, make_key(3), cfg2)
    eleven = min(seconds(lambda: jax.block_until_ready(fit(data, make_key(4), cfg2).params)) for _ in range(3))
    ours = (eleven - one) / 10  # per epoch, without fit's fixed overhead (init, first epoch)
    return {"naive_epoch_s": naive, "ours_epoch_s": ours, "ratio_naive_over_ours": naive / ours}


def grid_timing(config: str, overrides: list[str], backend: str, workers: int | None) -> dict[str, float]:
    """Wall time of a whole sweep into a fresh folder with an empty compilation cache."""
    import tempfile

    from experiments.config import parse_overrides
    from experiments.opl_sweep import cells, load_sweep, run_sweep

    with tempfile.TemporaryDirectory() as tmp:
        values = parse_overrides(overrides)
        values["output_dir"] = f"{tmp}/sweep"
        sweep = load_sweep(config, values)
        summary = run_sweep(
            sweep, echo=lambda line: None, backend=backend, workers=workers, compilation_cache=f"{tmp}/jax"
        )
    return {"grid_cells": len(cells(sweep)), "grid_rows": summary["rows"], "grid_seconds": summary["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n=1000 and fewer epochs")
    parser.add_argument("--grid", metavar="CONFIG", default=None, help="also time a whole sweep of this config")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=V1,V2", help="override a key of the grid's config"
    )
    parser.add_argument("--backend", default="processes", choices=["serial", "processes"], help="the grid's backend")
    parser.add_argument("--workers", type=int, default=None, help="the grid's worker processes")
    args = parser.parse_args()
    n, epochs = (1000, 5) if args.quick else (8000, 30)
    start = time.perf_counter()
    print(
        f"Part 1: one fit per method, D=10, L=5, lambda=0.5, n={n}, {epochs} policy epochs, {2 * epochs} reward epochs"
    )
    fits = learner_timings(n, epochs)
    print(f"Part 2: one IPS epoch at n={n}: naive Python loop vs compiled scan")
    epoch = naive_vs_compiled_epoch(n)
    print(
        f"  naive {epoch['naive_epoch_s']:.3f} s   ours {epoch['ours_epoch_s']:.4f} s   naive/ours {epoch['ratio_naive_over_ours']:.0f}x"
    )
    summary = {"bench": "learners", "quick": args.quick, "n": n, "epochs": epochs}
    if args.grid:
        print(f"Part 3: the sweep {args.grid} {' '.join(args.set)} on backend {args.backend}")
        grid = grid_timing(args.grid, args.set, args.backend, args.workers)
        print(f"  {grid['grid_cells']} cells, {grid['grid_rows']} rows in {grid['grid_seconds']:.0f} s")
        summary.update(grid, grid_backend=args.backend)
    summary.update({f"{name}_{k}": round(v, 3) for name, t in fits.items() for k, v in t.items()})
    summary.update({k: round(v, 4) for k, v in epoch.items()})
    summary.update(total_seconds=round(time.perf_counter() - start, 1), **environment())
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
