"""Short PL prefixes: the shared inverse-CDF table against Gumbel top-k, same process.

Usage (from the repository root)::

    python benchmarks/bench_prefix_sampler.py            # D in {8, 16, 32, 100, 1000}, K in 1..5 (about 2 minutes)
    python benchmarks/bench_prefix_sampler.py --quick    # D = 100, K in {1, 3}

What is timed, per (D, K): drawing ``N = 8`` prefixes of ``K`` slots for each of 256 rows
and the gradient of their summed log-probabilities with respect to the logits -- the work
of a sampled model term in one training step (R-POD's first stage, the LTR estimators).

* ``gumbel`` (the baseline): ``plackett_luce.sample_rankings(..., n_samples=N)`` (``N x D``
  Gumbel numbers and a top-K per sample) and ``prefix_log_probs`` on ``N`` broadcast copies
  of the logits (``N x D`` normalisers).
* ``table``: ``prefix_sampling.sample_prefixes`` and ``shared_slot_log_probs`` (one table
  and one set of normalisers per row, docs/maths.md §1.6).

Jitted, one warm-up call, best of 5 blocks of 50 calls. Before timing, a check that both
compute the same thing: the table's log-probabilities of the Gumbel sampler's prefixes
equal ``prefix_log_probs`` (max abs difference reported). Prints a table; the last line is
JSON with the ratios (gumbel / table; > 1: the table is faster).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of, environment  # noqa: E402

from opl_rank import make_key  # noqa: E402
from opl_rank.pl import plackett_luce as pl  # noqa: E402
from opl_rank.pl import prefix_sampling as ps  # noqa: E402

ROWS, N_SAMPLES, CALLS = 256, 8, 50


def _gumbel(key, logits, k):
    y = pl.sample_rankings(key, jax.lax.stop_gradient(logits), k, n_samples=N_SAMPLES)
    many = jnp.broadcast_to(logits, (N_SAMPLES,) + logits.shape)
    return jax.grad(lambda s: jnp.sum(pl.prefix_log_probs(jnp.broadcast_to(s, many.shape), y)))(logits)


def _table(key, logits, k):
    y = ps.sample_prefixes(key, logits, k, N_SAMPLES)
    return jax.grad(lambda s: jnp.sum(ps.shared_slot_log_probs(s, y)))(logits)


def _ms_per_call(fn, key, logits) -> float:
    jax.block_until_ready(fn(key, logits))

    def block():
        out = None
        for _ in range(CALLS):
            out = fn(key, logits)
        jax.block_until_ready(out)

    return best_of(block, 5) / CALLS * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="D = 100, K in {1, 3}")
    args = parser.parse_args()
    sizes = [100] if args.quick else [8, 16, 32, 100, 1000]
    slots = [1, 3] if args.quick else [1, 2, 3, 4, 5]
    key = make_key(0)
    results = []
    print(f"{'D':>5} {'K':>2} {'gumbel ms':>10} {'table ms':>9} {'ratio':>6} {'check':>9}")
    for n_items in sizes:
        logits = jax.random.normal(jax.random.fold_in(key, n_items), (ROWS, n_items)) * 2.0
        for k in slots:
            if k > n_items:
                continue
            y = pl.sample_rankings(key, logits, k, n_samples=N_SAMPLES)
            check = float(
                jnp.max(
                    jnp.abs(
                        pl.cumsum_slots(ps.shared_slot_log_probs(logits, y))
                        - pl.prefix_log_probs(jnp.broadcast_to(logits, (N_SAMPLES,) + logits.shape), y)
                    )
                )
            )
            gumbel = _ms_per_call(jax.jit(lambda kk, s, k=k: _gumbel(kk, s, k)), key, logits)
            table = _ms_per_call(jax.jit(lambda kk, s, k=k: _table(kk, s, k)), key, logits)
            row = {
                "D": n_items,
                "K": k,
                "gumbel_ms": round(gumbel, 4),
                "table_ms": round(table, 4),
                "ratio": round(gumbel / table, 2),
                "max_abs_logprob_diff": check,
                "auto": ps.prefix_sampler(n_items, k),
            }
            results.append(row)
            print(f"{n_items:>5} {k:>2} {gumbel:>10.3f} {table:>9.3f} {gumbel / table:>6.2f} {check:>9.1e}", flush=True)
    print(
        json.dumps(
            {"bench": "prefix_sampler", "rows": ROWS, "n_samples": N_SAMPLES, "results": results, **environment()}
        )
    )


if __name__ == "__main__":
    main()
