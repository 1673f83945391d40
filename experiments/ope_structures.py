"""OPE estimators across reward structures: where Cascade-DR and adaptive IPS pay off.

For each reward structure of the synthetic environment (``independent``, ``cascade``,
``neighbour``, ``symmetric``; docs/maths.md §1.25) and each ``n``, ``seeds`` logged data sets
are drawn from one environment and one target policy; every estimator's squared error
against the target's ground-truth value gives its MSE, reported relative to Cascade-DR's::

    python -m experiments.ope_structures --seeds 100 --output-dir experiments/results/ope_structures

Each (structure, n, seed) writes one JSON row atomically and a rerun skips rows already there
(stop and resume at will); ``--report-only`` rebuilds ``rows.csv`` and ``report.md``.

Estimates are the raw estimators' means (no trust layer: a degenerate-weight estimate counts
with its error). The target is PL over ``logging logits + beta * the true base reward`` (a
better policy close enough to the logging one for the weights to be usable). DR and top-k
use an additive f_hat; AIPS runs with the true behaviour (``env.behaviour``) and with the one
[`opl_rank.opl.aips.select_behaviour`][opl_rank.opl.aips.select_behaviour] picks from the logs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank.io.atomic import atomic_write_text
from opl_rank.opl import aips
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.estimator_inputs import InputRequest, build, call_terms
from opl_rank.opl.policies import PLPolicy
from opl_rank.opl.reward_models import fit_reward_model
from opl_rank.optimization import TrainConfig
from opl_rank.prng import make_key
from simulators.synthetic import SyntheticRankingEnv

STRUCTURES = ("independent", "cascade", "neighbour", "symmetric")
ESTIMATORS = ("ips", "snips", "iips", "rips", "dr", "topk", "cascade_dr", "aips", "aips_selected")
BEHAVIOUR_NAMES = {
    "independent": "independent",
    "cascade": "cascade",
    "neighbour": "neighbour-1",
    "symmetric": "standard",
}


@dataclasses.dataclass(frozen=True, eq=False)  # identity equality: a hashable jit-static module
class TargetScorer:
    """Target logits: the logging policy's plus ``beta`` times the true base reward."""

    env: Any

    def apply(self, params: jax.Array, context: jax.Array) -> jax.Array:
        return self.env.logging_logits(context) + params * self.env.reward_model.item_base(context)


def _estimate(name: str, policy: Any, data: Any, key: jax.Array, reward_model: Any, given: Any, k: int) -> float:
    entry = opl_estimators.get(name)
    target = policy.propensities(data, key, slot_marginals=entry.needs_position_marginals)
    request = InputRequest(policy, data, key, reward_model, k if entry.uses_k else None, given=given)
    model, inputs = build(entry, request)
    return float(opl_estimators.estimate(call_terms(entry, target, data, model=model, k=k, inputs=inputs)))


def run_row(env: Any, policy: Any, structure: str, n: int, seed: int, k: int) -> dict[str, Any]:
    key = jax.random.fold_in(make_key(1000 + seed), n)
    k_data, k_model, k_est, k_sel = jax.random.split(key, 4)
    data = env.sample_logged_data(k_data, n, position_marginals="exact", logging_logits=True)
    reward_model = fit_reward_model(
        data, k_model, kind="additive", config=TrainConfig(epochs=20, batch_size=256, learning_rate=2e-2)
    )
    started = time.perf_counter()
    true_c = np.asarray(env.behaviour(data.context)).astype(bool)
    choice = aips.select_behaviour(policy, data, k_sel, split_quantiles=())
    row: dict[str, Any] = {"structure": structure, "n": n, "seed": seed, "selected": choice.behaviour}
    for name in ESTIMATORS:
        given = None
        if name == "aips":
            given = {"behaviour": true_c}
        elif name == "aips_selected":
            given = {"behaviour": choice.matrix}
        entry = "aips" if name.startswith("aips") else name
        row[name] = _estimate(entry, policy, data, k_est, reward_model, given, k)
    row["seconds"] = time.perf_counter() - started
    return row


def make_setting(structure: str, n_items: int, ranking_length: int, beta: float) -> tuple[Any, Any, float]:
    env = SyntheticRankingEnv.create(
        make_key(0),
        n_items=n_items,
        ranking_length=ranking_length,
        context_dim=3,
        lam=1.0,
        reward_structure=structure,
    )
    policy = PLPolicy(TargetScorer(env), jnp.float32(beta), ranking_length)
    truth = env.policy_value(policy, make_key(7), 200_000).value
    return env, policy, truth


LEARNERS = (
    ("ips", None),
    ("iips", None),
    ("rips", None),
    ("cascade_dr", None),
    ("aips", {"behaviour": "cascade"}),
    ("aips", {"behaviour": "neighbour-1"}),
)


def learner_row(structure: str, n: int, seed: int, n_items: int, ranking_length: int) -> list[dict[str, Any]]:
    """Normalised gains ``(V - V0) / (V* - V0)`` of the estimators as learners, one data set."""
    from opl_rank.opl.learners import LearnerConfig, fit

    env = SyntheticRankingEnv.create(
        make_key(0), n_items=n_items, ranking_length=ranking_length, context_dim=3, lam=1.0, reward_structure=structure
    )
    data = env.sample_logged_data(make_key(2000 + seed), n, position_marginals="exact", logging_logits=True)
    v0 = env.logging_policy_value(make_key(8), 100_000).value
    v_star = env.optimal_value(make_key(9), 20_000)[0].value
    rows = []
    for method, options in LEARNERS:
        started = time.perf_counter()
        policy = fit(data, make_key(3000 + seed), LearnerConfig(method, estimator_options=options))
        value = env.policy_value(policy, make_key(10), 100_000).value
        label = method if options is None else f"{method}({options['behaviour']})"
        rows.append(
            {
                "structure": structure,
                "n": n,
                "seed": seed,
                "method": label,
                "gain": (value - v0) / (v_star - v0),
                "seconds": time.perf_counter() - started,
            }
        )
    return rows


def report(output_dir: str) -> str:
    rows = []
    rows_dir = os.path.join(output_dir, "rows")
    for name in sorted(os.listdir(rows_dir)):
        with open(os.path.join(rows_dir, name)) as f:
            rows.append(json.load(f))
    header = ["structure", "n", "seed", "truth", "selected", *ESTIMATORS]
    lines = [",".join(header)] + [",".join(str(r[h]) for h in header) for r in rows]
    atomic_write_text(os.path.join(output_dir, "rows.csv"), "\n".join(lines) + "\n")
    out = [
        "| structure | n | seeds | " + " | ".join(ESTIMATORS) + " | CDR MSE | AIPS picks the true c |",
        "|---|---|---|" + "---|" * (len(ESTIMATORS) + 2),
    ]
    for structure in STRUCTURES:
        for n in sorted({r["n"] for r in rows}):
            group = [r for r in rows if r["structure"] == structure and r["n"] == n]
            if not group:
                continue
            mse = {e: float(np.mean([(r[e] - r["truth"]) ** 2 for r in group])) for e in ESTIMATORS}
            picks = np.mean([r["selected"] == BEHAVIOUR_NAMES[structure] for r in group])
            rel = " | ".join(f"{mse[e] / mse['cascade_dr']:.3g}" for e in ESTIMATORS)
            out.append(f"| {structure} | {n} | {len(group)} | {rel} | {mse['cascade_dr']:.3g} | {picks:.0%} |")
    learn_dir = os.path.join(output_dir, "learners")
    if os.path.isdir(learn_dir):
        learned = []
        for name in sorted(os.listdir(learn_dir)):
            with open(os.path.join(learn_dir, name)) as f:
                learned.extend(json.load(f))
        methods = list(dict.fromkeys(r["method"] for r in learned))
        out += ["", "| structure | n | seeds | " + " | ".join(methods) + " |", "|---|---|---|" + "---|" * len(methods)]
        for structure, n in sorted({(r["structure"], r["n"]) for r in learned}):
            group = [r for r in learned if r["structure"] == structure and r["n"] == n]
            cells = []
            for m in methods:
                gains = np.array([r["gain"] for r in group if r["method"] == m])
                cells.append(
                    f"{gains.mean():.3f} +- {gains.std(ddof=1) / np.sqrt(len(gains)) if len(gains) > 1 else 0:.3f}"
                )
            out.append(f"| {structure} | {n} | {len(group) // len(methods)} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n"
    atomic_write_text(os.path.join(output_dir, "report.md"), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="results/ope_structures")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--ns", type=int, nargs="+", default=[500, 2000, 8000])
    parser.add_argument("--structures", nargs="+", default=list(STRUCTURES), choices=STRUCTURES)
    parser.add_argument("--n-items", type=int, default=8)
    parser.add_argument("--ranking-length", type=int, default=4)
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--k", type=int, default=2, help="top-k's k")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--learners", type=int, default=0, help="also learn with the estimators on this many seeds")
    parser.add_argument("--learner-n", type=int, default=2000)
    parser.add_argument("--learner-structure", default="cascade", choices=STRUCTURES)
    args = parser.parse_args(argv)
    os.makedirs(os.path.join(args.output_dir, "rows"), exist_ok=True)
    if not args.report_only:
        settings = {s: make_setting(s, args.n_items, args.ranking_length, args.beta) for s in args.structures}
        for seed in range(args.seeds):  # seeds outermost: a stopped run covers every setting evenly
            for structure, (env, policy, truth) in settings.items():
                for n in args.ns:
                    path = os.path.join(args.output_dir, "rows", f"{structure}_n{n}_s{seed:03d}.json")
                    if os.path.exists(path):
                        continue
                    row = run_row(env, policy, structure, n, seed, args.k)
                    row["truth"] = truth
                    atomic_write_text(path, json.dumps(row) + "\n")
                    print(f"{structure} n={n} seed={seed} {row['seconds']:.1f}s", file=sys.stderr, flush=True)
    for seed in range(args.learners):
        path = os.path.join(args.output_dir, "learners", f"{args.learner_structure}_n{args.learner_n}_s{seed:03d}.json")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            rows = learner_row(args.learner_structure, args.learner_n, seed, args.n_items, args.ranking_length)
            atomic_write_text(path, json.dumps(rows) + "\n")
            print(f"learners seed={seed}", file=sys.stderr, flush=True)
    print(report(args.output_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
