"""A new user's first large run, as issue 12 measured it: wall time of what they wait for.

Usage (from the repository root)::

    python benchmarks/bench_new_user.py                    # D=100, L=10, n=20k; simulate at D=1000 too
    python benchmarks/bench_new_user.py --n 2000 --d1000-rows 500   # smoke test

Protocol (the issue's): the synthetic environment's defaults (lambda = 0.5, tau = 1),
``simulate`` with exact logged item-position propensities, then ``fit`` of each method with
5 epochs, batch 1024 and the additive f_hat -- each a single cold call, compilation
included, the way a user meets it. Also the simulator's rows/s at D = 1000, L = 10 (a
warm run over ``--d1000-rows`` rows). Run the same script on an older checkout (put it
first on ``PYTHONPATH``) for the "before" column; ``bench_scale.py`` has the per-epoch,
compilation-free numbers.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--methods", default="ips,rips,rpod1,rpod3,dr,iips")
    parser.add_argument("--d1000-rows", type=int, default=20_000)
    args = parser.parse_args(argv)

    import jax

    import opl_rank
    from opl_rank.opl.learners import LearnerConfig, fit
    from opl_rank.optimization import TrainConfig
    from simulators import SyntheticRankingEnv

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        jax.block_until_ready(jax.tree.leaves(out)) if out is not None else None
        return out, time.perf_counter() - start

    out = {"bench": "new_user", "n": args.n, "opl_rank_file": opl_rank.__file__, **environment()}
    env = SyntheticRankingEnv.create(opl_rank.make_key(0), n_items=100, ranking_length=10)
    data, out["simulate_d100_s"] = timed(
        lambda: env.sample_logged_data(opl_rank.make_key(1), args.n, position_marginals="exact")
    )
    print(f"simulate D=100 L=10 n={args.n}: {out['simulate_d100_s']:.1f} s", flush=True)
    train = TrainConfig(epochs=5, batch_size=1024, learning_rate=0.05)
    reward = TrainConfig(epochs=5, batch_size=1024, learning_rate=0.02)
    for method in args.methods.split(","):
        k = int(method[4:]) if method.startswith("rpod") else None
        config = LearnerConfig("rpod" if k is not None else method, k=k, train=train, reward_train=reward)
        policy, seconds = timed(lambda: fit(data, opl_rank.make_key(2), config))
        params = [
            p.params for p in (policy, getattr(policy, "first_stage", None)) if p is not None and hasattr(p, "params")
        ]
        jax.block_until_ready(params)
        out[f"fit_{method}_s"] = seconds
        print(f"fit {method:6s} (5 epochs, batch 1024, cold): {seconds:.1f} s", flush=True)
    big = SyntheticRankingEnv.create(opl_rank.make_key(3), n_items=1000, ranking_length=10)
    big.sample_logged_data(opl_rank.make_key(4), 256, position_marginals="exact")  # compile
    _, seconds = timed(
        lambda: big.sample_logged_data(opl_rank.make_key(5), args.d1000_rows, position_marginals="exact")
    )
    out["simulate_d1000_rows_per_s"] = args.d1000_rows / seconds
    print(f"simulate D=1000 L=10 (exact marginals, warm): {out['simulate_d1000_rows_per_s']:,.0f} rows/s", flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
