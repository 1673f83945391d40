"""Logged-data generation throughput: our ``SyntheticRankingEnv`` vs obp's slate simulator.

Usage (from the repository root)::

    python benchmarks/bench_simulator.py            # full run (a few minutes on 2 CPUs)
    python benchmarks/bench_simulator.py --quick    # smoke test (< 1 minute)

What is compared
----------------
Generating ``n`` logged rounds ``(x, ranking, rewards, logging propensities)`` with

* ours: ``SyntheticRankingEnv.sample_logged_data(key, n, position_marginals=...)``;
* obp:  ``SyntheticSlateBanditDataset.obtain_batch_bandit_feedback(n, return_pscore_item_position=...)``.

Each setting is run with and without *position-marginal* propensities
``P0(a_l = a_il | x)`` (the IIPS propensity): ours ``position_marginals="exact"``
(exponential-race quadrature, vectorised) against obp's
``return_pscore_item_position=True`` (a Python loop over rows that, for every row and
every slot after the first, enumerates all ``D! / (D - L)!`` rankings and their
Plackett-Luce probabilities). Without marginals both return prefix (cascade) and full
ranking propensities only; obp still loops over rows in Python (``L`` calls of
``RandomState.choice`` plus ``L`` softmaxes and ``np.delete`` per row), so it stays slow.

Why the settings are equivalent
-------------------------------
* Contexts: ``x ~ N(0, I_5)`` in both.
* Logging policy: Plackett-Luce (obp's non-factorizable softmax-without-replacement is
  PL) with *identical* logits: obp gets a ``behavior_policy_function`` that returns our
  environment's logits ``(theta0 x + b0) / tau`` (R-POD Eq. 15). obp's own
  ``linear_behavior_policy_logit`` is not used: it adds the same ``x @ coef`` to every
  item, so it is context-free after the softmax; with ``behavior_policy_function=None``
  obp's marginals are the constant ``1/D`` and nothing is computed. (Checked once by
  hand: on the same rows, obp's ``pscore_item_position`` and ``pscore_cascade`` agree
  with our exact marginals and prefix propensities to ~1e-7.)
* Rewards: continuous, position-wise, base reward plus pairwise item interactions.
  obp gets our base reward ``theta_a x + b_a`` as ``base_reward_function`` with
  ``reward_structure="standard_additive"`` (``q_l = f(x, a_l) + sum_{m != l} W(a_l, a_m)``);
  the remaining differences only change reward *values*, not the work done (see
  "Caveats").

Caveats
-------
* obp draws its own ``W`` (N(0, 5^2)), always adds the interactions (our lambda-switch
  ``1{X_l <= lambda}`` is absent, i.e. lambda = 1), clips the mean at 0 and samples a
  truncated normal (std 1, support [0, 1e10]) where we add N(0, 0.5^2) noise.
* obp is timed at D = 10 only: its marginals enumerate ``D!/(D-L)!`` rankings per row,
  and its reward function casts item ids to int8 (wrong ids beyond 127 items).
* Ours is timed after a warm-up call on the same ``n`` (JAX compile excluded), best of
  3; obp has nothing to compile and is timed best of 2. obp's tqdm bars are silenced.
* Part 2 (ours alone, D = 1000, L = 10, prefix propensities only) reports the first
  call on a small ``n`` (cold: includes compilation) and the warm ``n = 1e6`` run.

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script

import obp  # noqa: E402
from obp.dataset import SyntheticSlateBanditDataset  # noqa: E402

import opl_rank  # noqa: E402
from simulators import SyntheticRankingEnv  # noqa: E402

CONTEXT_DIM = 5
OURS_REPEATS = 3
OBP_REPEATS = 2
TARGET_SECONDS_D1000 = 60.0


@dataclass(frozen=True)
class Case:
    """One obp-vs-ours setting."""

    n_items: int
    length: int
    marginals: bool
    n_obp: int
    n_ours: int

    @property
    def tag(self) -> str:
        return f"D{self.n_items}_L{self.length}_{'marg' if self.marginals else 'nomarg'}"


@dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses."""

    cases: tuple[Case, ...]
    big_n: int  # part 2: rows at D = 1000, L = 10
    big_warmup_n: int  # part 2: the cold (compiling) call


FULL = Sizes(
    cases=(
        Case(10, 3, True, n_obp=300, n_ours=200_000),
        Case(10, 3, False, n_obp=3_000, n_ours=1_000_000),
        Case(10, 5, True, n_obp=25, n_ours=100_000),
        Case(10, 5, False, n_obp=3_000, n_ours=1_000_000),
    ),
    big_n=1_000_000,
    big_warmup_n=10_000,
)
QUICK = Sizes(
    cases=(
        Case(10, 3, True, n_obp=30, n_ours=10_000),
        Case(10, 3, False, n_obp=300, n_ours=50_000),
        Case(10, 5, True, n_obp=3, n_ours=5_000),
        Case(10, 5, False, n_obp=300, n_ours=50_000),
    ),
    big_n=20_000,
    big_warmup_n=5_000,
)


# -- timing --------------------------------------------------------------------------------
from _timing import best_of, environment, seconds  # noqa: E402  (benchmarks/ is the script folder)


# -- the two simulators ----------------------------------------------------------------------
def make_env(n_items: int, length: int) -> SyntheticRankingEnv:
    return SyntheticRankingEnv.create(
        opl_rank.make_key(0), n_items=n_items, ranking_length=length, context_dim=CONTEXT_DIM
    )


def ours_sampler(env: SyntheticRankingEnv, n: int, marginals: bool) -> Callable[[], object]:
    """A call that logs ``n`` rounds and waits for every output array."""
    mode = "exact" if marginals else "none"
    seeds = itertools.count()  # a fresh key per call

    def run():
        data = env.sample_logged_data(opl_rank.make_key(next(seeds)), n, position_marginals=mode)
        return jax.block_until_ready(data)

    return run


def obp_dataset(env: SyntheticRankingEnv) -> SyntheticSlateBanditDataset:
    """obp's slate simulator with our logging logits and our base reward."""
    pi0, reward = env.logging_policy, env.reward_model
    coef = np.asarray(pi0.coef, np.float64)
    bias = np.asarray(pi0.bias, np.float64)
    temperature = float(pi0.temperature)
    theta = np.asarray(reward.theta, np.float64)
    item_bias = np.asarray(reward.bias, np.float64)

    def behavior_logits(context, action_context, random_state=None):
        return (context @ coef.T + bias) / temperature

    def base_reward(context, action_context, random_state=None):
        return context @ theta.T + item_bias

    return SyntheticSlateBanditDataset(
        n_unique_action=env.n_items,
        len_list=env.ranking_length,
        dim_context=CONTEXT_DIM,
        reward_type="continuous",
        reward_structure="standard_additive",
        base_reward_function=base_reward,
        behavior_policy_function=behavior_logits,
        random_state=12345,
    )


def obp_sampler(dataset: SyntheticSlateBanditDataset, n: int, marginals: bool) -> Callable[[], object]:
    def run():
        with contextlib.redirect_stderr(io.StringIO()):  # obp's tqdm progress bars
            return dataset.obtain_batch_bandit_feedback(n_rounds=n, return_pscore_item_position=marginals)

    return run


# -- the two parts -----------------------------------------------------------------------------
def compare(case: Case) -> dict[str, float]:
    """Part 1: rows/s of obp and of ours for one setting."""
    env = make_env(case.n_items, case.length)
    obp_s = best_of(obp_sampler(obp_dataset(env), case.n_obp, case.marginals), OBP_REPEATS)
    ours = ours_sampler(env, case.n_ours, case.marginals)
    ours()  # compile on this very shape
    ours_s = best_of(ours, OURS_REPEATS)
    obp_rate, ours_rate = case.n_obp / obp_s, case.n_ours / ours_s
    return {"obp_rows_per_s": obp_rate, "ours_rows_per_s": ours_rate, "ratio": ours_rate / obp_rate}


def large_run(sizes: Sizes) -> dict[str, float]:
    """Part 2: ours alone at D = 1000, L = 10, prefix propensities only."""
    env = make_env(1000, 10)
    cold = seconds(ours_sampler(env, sizes.big_warmup_n, marginals=False))
    warm = seconds(ours_sampler(env, sizes.big_n, marginals=False))
    return {"cold_seconds": cold, "warm_seconds": warm}


# -- output --------------------------------------------------------------------------------------
def print_table(sizes: Sizes, results: dict[str, dict[str, float]], big: dict[str, float]) -> None:
    header = f"{'setting':<18}{'obp rows':>10}{'obp rows/s':>14}{'ours rows':>12}{'ours rows/s':>14}{'ours/obp':>11}"
    print("Part 1: logged-data generation, obp vs ours (D = items, L = ranking length)")
    print(header)
    print("-" * len(header))
    for case in sizes.cases:
        r = results[case.tag]
        print(
            f"{case.tag:<18}{case.n_obp:>10,}{r['obp_rows_per_s']:>14,.0f}"
            f"{case.n_ours:>12,}{r['ours_rows_per_s']:>14,.0f}{r['ratio']:>10,.0f}x"
        )
    print("  marg = with position-marginal propensities; nomarg = prefix propensities only")
    print()
    print("Part 2: ours alone, D=1000, L=10, prefix propensities only")
    print(f"  cold: first call, n={sizes.big_warmup_n:,} (includes JAX compilation): {big['cold_seconds']:.2f} s")
    print(
        f"  warm: n={sizes.big_n:,}: {big['warm_seconds']:.2f} s "
        f"({sizes.big_n / big['warm_seconds']:,.0f} rows/s; target < {TARGET_SECONDS_D1000:.0f} s at n=1e6)"
    )
    print(f"  cold + warm: {big['cold_seconds'] + big['warm_seconds']:.2f} s")


def headline(sizes: Sizes, quick: bool, results: dict[str, dict[str, float]], big: dict[str, float]) -> dict:
    summary: dict[str, object] = {"bench": "simulator", "quick": quick}
    for case in sizes.cases:
        tag = case.tag.replace("_nomarg", "")  # e.g. D10_L3 and D10_L3_marg
        r = results[case.tag]
        summary[f"obp_rows_per_s_{tag}"] = round(r["obp_rows_per_s"], 1)
        summary[f"ours_rows_per_s_{tag}"] = round(r["ours_rows_per_s"], 1)
        summary[f"ratio_{tag}"] = round(r["ratio"], 1)
    summary["ours_seconds_D1000_L10_n1e6"] = round(big["warm_seconds"], 3)
    summary["ours_cold_seconds_D1000_L10_warmup"] = round(big["cold_seconds"], 3)
    summary["n_D1000_L10"] = sizes.big_n
    summary["n_D1000_L10_warmup"] = sizes.big_warmup_n
    summary["meets_target_D1000_L10"] = None if quick else big["warm_seconds"] < TARGET_SECONDS_D1000
    summary["obp_version"] = obp.__version__
    summary.update(environment())
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shrink every size (smoke test)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL

    results = {case.tag: compare(case) for case in sizes.cases}
    big = large_run(sizes)
    print_table(sizes, results, big)
    print(json.dumps(headline(sizes, args.quick, results, big)))


if __name__ == "__main__":
    main()
