"""Seeds one by one (``fit``) against seeds vmapped into one loop (``fit_seeds``).

Usage (from the repository root)::

    python benchmarks/bench_vmap_seeds.py                 # S = 10 seeds, n = 2000 (CPU: minutes)
    python benchmarks/bench_vmap_seeds.py --seeds 4 --n 1000 --methods ips

For every method, S data sets of the same shape (one sweep cell's seeds) are fitted one by
one and then together, each after a warm-up fit so that compilation is excluded; the ratio
(one by one / vmapped) is reported per method, > 1 meaning vmapping wins. The sweep's
``vmap_seeds: auto`` turns vmapping on for GPU/TPU backends only: on the 2-core CPU
machines a whole cell ran slower vmapped (the closing note of the issue has the numbers).
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script

from _timing import environment, seconds  # noqa: E402

from opl_rank import prng  # noqa: E402
from opl_rank.opl.learners import LearnerConfig, fit, fit_seeds  # noqa: E402
from opl_rank.optimization import TrainConfig  # noqa: E402
from simulators import SyntheticRankingEnv  # noqa: E402

METHODS = {
    "ips": dict(method="ips"),
    "dr-pairwise": dict(method="dr", reward_model="pairwise"),
    "regression-pairwise": dict(method="regression", reward_model="pairwise"),
    "rpod2-pairwise": dict(method="rpod", k=2, reward_model="pairwise"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {list(METHODS)}")
    args = parser.parse_args()
    datas, keys = [], []
    for seed in range(args.seeds + 1):  # the extra seed warms the one-by-one path up
        k_env, k_data, _, k_fit = prng.split_seed(seed, 4)
        env = SyntheticRankingEnv.create(k_env, n_items=10, ranking_length=5, lam=0.5)
        datas.append(env.sample_logged_data(k_data, args.n))
        keys.append(k_fit)
    train = TrainConfig(epochs=30, batch_size=256, learning_rate=0.05)
    reward = TrainConfig(epochs=60, batch_size=256, learning_rate=0.02)
    results = {}
    for name in args.methods.split(","):
        config = LearnerConfig(**METHODS[name], n_samples=4, train=train, reward_train=reward)
        wait = lambda policies: jax.block_until_ready([jax.tree.leaves(p) for p in policies])
        stacked = jnp.stack(keys[1:])
        wait([fit(datas[0], keys[0], config)])  # compile the one-by-one path
        wait(fit_seeds(datas[1:], stacked, config))  # compile the vmapped path
        one_by_one = seconds(lambda: wait([fit(d, k, config) for d, k in zip(datas[1:], keys[1:])]))
        vmapped = seconds(lambda: wait(fit_seeds(datas[1:], stacked, config)))
        results[name] = {"one_by_one_s": one_by_one, "vmapped_s": vmapped, "ratio": one_by_one / vmapped}
        print(
            f"{name:<22} {args.seeds} seeds, n={args.n}: one by one {one_by_one:6.2f} s   vmapped {vmapped:6.2f} s   "
            f"ratio {one_by_one / vmapped:5.2f}",
            flush=True,
        )
    print(json.dumps({"seeds": args.seeds, "n": args.n, "results": results, **environment()}))


if __name__ == "__main__":
    main()
