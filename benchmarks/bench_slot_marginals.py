"""IIPS's slot marginals at large D: sampled prefixes against the item inserted into the
others' order (``opl_rank.pl.marginals.sampled_slot_marginals`` / ``insertion_slot_marginals``);
and the exact quadrature at small D (``--exact``).

Usage (from the repository root)::

    python benchmarks/bench_slot_marginals.py            # D = 100, L = 10: ~10 min on 2 CPUs
    python benchmarks/bench_slot_marginals.py --quick    # seconds
    python benchmarks/bench_slot_marginals.py --exact    # D = 10, L = 5, 512 rows: ~1 min

``--exact``: ``exact_slot_marginals`` (value, and value and gradient) at D <= 32, batched over
rows, against the same quadrature vmapped row by row (the code before, kept for D > 32) and
against enumerating the D! / (D - L)! rankings (value only), all compiled with the options of a
small fit's step program (``program_cache.compiler_options``); milliseconds per call, ratios,
and the largest differences (docs/performance.md §33).

Part 1, one batch (256 rows of random logits, scale 1.5; logged rankings from a flatter
PL): milliseconds of value and gradient, and the variance over 200 draws of the value and
of the gradient of a random linear function of it, for each estimator and ``N`` (the
insertion estimate's baseline is the logged order at ``N = 1``, leave-one-out from 2).
Part 2, learning: IIPS fitted on the synthetic environment (lambda = 0.5, n = 2e4 rows, 10
epochs) with each setting and 3 seeds; the learned policy's value on 2e4 fresh contexts
and the fit's wall-clock. The last line printed is one JSON object; the measured table is in
docs/performance.md §15.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import best_of, environment, seconds  # noqa: E402

SETTINGS = (
    ("prefix", 2),
    ("prefix", 8),
    ("insertion", 1),
    ("insertion", 2),
)  # insertion: logged baseline at N = 1, leave-one-out from 2


def one_batch(n_items: int, n_slots: int, rows: int, draws: int) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from opl_rank import make_key
    from opl_rank.pl import marginals
    from opl_rank.pl import plackett_luce as pl

    def estimators(name, n):
        if name == "prefix":
            return lambda k, s: marginals.sampled_slot_marginals(k, s, rankings, n)
        return lambda k, s: marginals.insertion_slot_marginals(k, s, rankings, n)  # baseline "auto"

    key = make_key(0)
    logits = 1.5 * jax.random.normal(jax.random.fold_in(key, 1), (rows, n_items))
    rankings = pl.sample_rankings(jax.random.fold_in(key, 2), 0.5 * logits, n_slots)
    cot = jax.random.normal(jax.random.fold_in(key, 3), rankings.shape)
    out = []
    for name, n in SETTINGS:
        estimate = estimators(name, n)
        step = jax.jit(jax.value_and_grad(lambda s, k: jnp.sum(cot * estimate(k, s))))
        jax.block_until_ready(step(logits, key))
        ms = 1e3 * best_of(lambda: jax.block_until_ready(step(logits, key)), 20)
        keys = jax.random.split(jax.random.fold_in(key, 4), draws)
        values, grads = [], []
        for k in keys:
            v = estimate(k, logits)
            g = step(logits, k)[1]
            values.append(np.asarray(v))
            grads.append(np.asarray(g))
        out.append(
            {
                "estimator": name,
                "n_samples": n,
                "step_ms": ms,
                "value_var": float(np.mean(np.var(values, axis=0))),
                "grad_var": float(np.mean(np.var(grads, axis=0))),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def learning(n_items: int, n_slots: int, n_rows: int, epochs: int, seeds: int, n_eval: int) -> list[dict]:
    import numpy as np

    from opl_rank import make_key
    from opl_rank.opl.learners import LearnerConfig, fit
    from opl_rank.optimization import TrainConfig
    from simulators import SyntheticRankingEnv

    out = []
    for seed in range(seeds):
        env = SyntheticRankingEnv.create(make_key(100 + seed), n_items=n_items, ranking_length=n_slots, lam=0.5)
        data = env.sample_logged_data(make_key(200 + seed), n_rows, position_marginals="exact")
        v0 = env.logging_policy_value(make_key(300 + seed), n_eval).value
        for name, n in SETTINGS:
            config = LearnerConfig(
                "iips",
                slot_marginals="sampled" if name == "prefix" else "insertion",
                slot_marginal_samples=n,
                train=TrainConfig(epochs=epochs, batch_size=256, learning_rate=5e-2),
            )
            policy = None

            def run():
                nonlocal policy
                policy = fit(data, make_key(400 + seed), config)

            wall = seconds(run)
            value = env.policy_value(policy, make_key(500 + seed), n_eval).value
            out.append(
                {
                    "seed": seed,
                    "estimator": name,
                    "n_samples": n,
                    "fit_s": wall,
                    "value": float(value),
                    "logging_value": float(v0),
                }
            )
            print(json.dumps(out[-1]), flush=True)
    summary = []
    for name, n in SETTINGS:
        vals = [r["value"] for r in out if r["estimator"] == name and r["n_samples"] == n]
        summary.append(
            {
                "estimator": name,
                "n_samples": n,
                "value_mean": float(np.mean(vals)),
                "value_sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                "values": vals,
            }
        )
    return out + summary


def exact_at_small_d(n_items: int, n_slots: int, rows: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from opl_rank import make_key
    from opl_rank.pl import marginals
    from opl_rank.pl import plackett_luce as pl
    from opl_rank.program_cache import compiler_options

    key = make_key(0)
    logits = 1.5 * jax.random.normal(jax.random.fold_in(key, 1), (rows, n_items))
    rankings = pl.sample_rankings(jax.random.fold_in(key, 2), 0.5 * logits, n_slots)
    cot = jax.random.normal(jax.random.fold_in(key, 3), rankings.shape)
    valid = jnp.ones(logits.shape, bool)

    def per_row(s):  # the quadrature vmapped row by row (before: every D; now: D > 32)
        probs = [
            jax.vmap(marginals._item_rank_probs, in_axes=(0, 0, 0, None))(s, valid, rankings[:, l], l + 1)[:, l]
            for l in range(n_slots)
        ]
        return jnp.stack(probs, axis=-1)

    def enumerated(s):
        table = pl.enumerate_position_marginals(s, n_slots)  # [n, L, D]
        return jnp.take_along_axis(table, rankings[:, :, None], axis=-1)[..., 0]

    options = dict(compiler_options([logits, rankings]) or ())
    functions = {"batched": lambda s: marginals.exact_slot_marginals(s, rankings), "per_row": per_row}
    out: dict = {"n_items": n_items, "n_slots": n_slots, "rows": rows, "compiler_options": options}
    values = {}
    for name, fn in [*functions.items(), ("enumeration", enumerated)]:
        value = jax.jit(fn).lower(logits).compile(compiler_options=options)
        values[name] = np.asarray(value(logits))
        out[f"{name}_value_ms"] = 1e3 * best_of(lambda: jax.block_until_ready(value(logits)), 20)
        if name in functions:
            grad = (
                jax.jit(jax.value_and_grad(lambda s, fn=fn: jnp.sum(cot * fn(s))))
                .lower(logits)
                .compile(compiler_options=options)
            )
            out[f"{name}_grad_ms"] = 1e3 * best_of(lambda: jax.block_until_ready(grad(logits)), 20)
            values[f"{name}_grad"] = np.asarray(grad(logits)[1])
    out["value_speedup_vs_per_row"] = out["per_row_value_ms"] / out["batched_value_ms"]
    out["grad_speedup_vs_per_row"] = out["per_row_grad_ms"] / out["batched_grad_ms"]
    out["value_speedup_vs_enumeration"] = out["enumeration_value_ms"] / out["batched_value_ms"]
    out["max_abs_diff_vs_enumeration"] = float(np.abs(values["batched"] - values["enumeration"]).max())
    out["max_abs_diff_per_row_vs_enumeration"] = float(np.abs(values["per_row"] - values["enumeration"]).max())
    out["max_abs_grad_diff_vs_per_row"] = float(np.abs(values["batched_grad"] - values["per_row_grad"]).max())
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--exact", action="store_true", help="the exact quadrature at D = 10, L = 5 only")
    args = parser.parse_args()
    if args.exact:
        result = exact_at_small_d(10, 5, 512)
        print(json.dumps({"bench": "slot_marginals_exact", **result, **environment()}))
        return
    if args.quick:
        batch = one_batch(20, 4, 32, 10)
        learned = learning(20, 4, 1000, 2, 1, 1000)
    else:
        batch = one_batch(100, 10, 256, 200)
        learned = learning(100, 10, 20_000, 10, 3, 20_000)
    print(
        json.dumps(
            {"bench": "slot_marginals", "quick": args.quick, "batch": batch, "learning": learned, **environment()}
        )
    )


if __name__ == "__main__":
    main()
