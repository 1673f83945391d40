"""The ``opl-rank`` command line.

Subcommands:
  simulate   draw a synthetic environment, log a data set with its logging policy and print
             a summary (sizes, logging policy value, reward statistics, propensity ranges).
  ltr        train a PL ranker on a LETOR file with a policy-gradient estimator (YAML config).
  sweep      the synthetic OPL benchmark: every method and k over lambda, n, D, L, tau, seeds.
  report     markdown tables of a sweep's results: normalised gain per method, and winners.
  pairwise   the pairwise-debiasing reproduction: rankers trained on simulated clicks
             (biased, IPS, debiased) and on relevance, NDCG@{1,3,5,10} and MAP on test queries.
  fit        learn a ranking policy from your own logs (.parquet, .csv, .npz; schema in
             docs/data_format.md) and save it (--k auto: R-POD's k chosen by OPE).
  evaluate   off-policy estimates of a saved policy's value on logs (dm, ips, snips, dr, iips,
             rips, topk: value, SE, CI, ESS).
  rank       rank a table of contexts with a saved policy (greedy, or --sample).

Kept short: parsing and printing only; everything else is a library call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from experiments.user_code import load_callable

__all__ = ["main", "console_main", "build_parser", "load_callable", "INTERRUPTED"]

INTERRUPTED = 130  # the exit status of a run stopped by Ctrl-C (128 + SIGINT), as shells report it


def _version() -> str:
    """The installed package's version, without importing JAX for ``--version``."""
    import importlib.metadata

    try:
        return importlib.metadata.version("opl_rank")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        from opl_rank._version import __version__

        return __version__


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """Warnings during a command: one line each, ``opl-rank CMD: warning: ...`` (no source line)."""
    command = _RUNNING.get("command", "")
    print(f"opl-rank{' ' + command if command else ''}: warning: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opl-rank", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"opl-rank {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "simulate",
        help="log a data set from a simulator and print its summary",
        description="Draw an environment (the R-POD synthetic one by default, or any registered "
        "simulator), log n rounds of its logging policy, and print n, D, L, the logging policy "
        "value, reward statistics and propensity ranges.",
    )
    sim.add_argument(
        "--simulator",
        default="synthetic",
        help="a registered simulator: synthetic (default), semi_synthetic, or one a --plugin registers",
    )
    sim.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers a simulator); repeatable",
    )
    sim.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another simulator's options: sweep config keys (interaction_scale=2, letor_path=...) "
        "or the simulator's own options (its EnvironmentSpec.options); repeatable",
    )
    sim.add_argument("--n", type=int, default=1000, help="logged rounds (default 1000)")
    sim.add_argument("--n-items", "-D", type=int, default=10, help="candidate items D (default 10)")
    sim.add_argument("--length", "-L", type=int, default=5, help="ranking length L (default 5)")
    sim.add_argument("--context-dim", type=int, default=5, help="context dimension (default 5)")
    sim.add_argument("--lam", type=float, default=0.5, help="interaction strength lambda in [0, 1] (default 0.5)")
    sim.add_argument("--sigma", type=float, default=0.5, help="reward noise sd (default 0.5)")
    sim.add_argument("--tau", type=float, default=1.0, help="logging PL temperature (default 1)")
    sim.add_argument(
        "--logging-policy",
        default=None,
        help="'pl' (PL linear, the paper's; the synthetic default), 'uniform', another simulator's built-in "
        "name (default: its first), or 'module:function' returning "
        "logits [n, D] from (context [n, dx], item_features [D, D])",
    )
    sim.add_argument(
        "--position-marginals",
        choices=("none", "exact"),
        default="exact",
        help="also log exact position-marginal propensities for IIPS (default exact)",
    )
    sim.add_argument("--seed", type=int, default=0, help="environment and data seed (default 0)")
    sim.add_argument("--value-contexts", type=int, default=100_000, help="contexts for the ground-truth logging value")
    sim.add_argument(
        "--out", default=None, help="save the logged data: .parquet, .csv (docs/data_format.md) or .npz, by its suffix"
    )
    sim.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    sim.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bars (results and errors are still printed)"
    )

    ltr = sub.add_parser(
        "ltr",
        help="full-information LTR with a PL gradient estimator",
        description="Train an MLP-scored Plackett-Luce ranker on a LETOR file with one of the "
        "exposure paper's estimators; print NDCG@K per epoch.",
    )
    ltr.add_argument("--config", required=True, help="YAML config (see experiments/configs/ltr_exposure.yaml)")
    ltr.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (repeatable)"
    )
    ltr.add_argument("--json", action="store_true", help="print the summary as one JSON object at the end")
    ltr.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bars (results and errors are still printed)"
    )

    sweep = sub.add_parser(
        "sweep",
        help="OPL benchmark grid (resumable)",
        description="Run every (D, L, tau, lambda, n, seed) cell of a YAML config: fit each method "
        "(and R-POD for each k) on logged data and record V(pi), V(pi_0), V* and the normalised gain. "
        "Finished cells of the same config are reused on a rerun; another config in the same output_dir "
        "is refused (see --new-config), and one sweep at a time may write to a folder.",
    )
    sweep.add_argument("--config", required=True, help="YAML config (see experiments/configs/synthetic_opl.yaml)")
    sweep.add_argument(
        "--set", action="append", default=[], metavar="KEY=V1,V2", help="override a key; lists with commas (repeatable)"
    )
    sweep.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "serial", "threads", "processes", "ray"],
        help="where cells run: one after another, in threads of this process (shared compiled programs), "
        "in worker processes or on Ray (default: auto, threads on a CPU with 2 or more cores, else serial)",
    )
    sweep.add_argument(
        "--ray-address", default=None, help="an existing Ray cluster for --backend ray (default: start a local one)"
    )
    sweep.add_argument(
        "--workers",
        type=int,
        default=None,
        help="threads or worker processes at a time for --backend auto / threads / processes (default: CPU count)",
    )
    sweep.add_argument(
        "--compilation-cache",
        default=None,
        metavar="DIR",
        help="JAX persistent compilation cache (default: $OPL_RANK_JAX_CACHE or ~/.cache/opl_rank/jax; '' disables)",
    )
    sweep.add_argument(
        "--new-config",
        action="store_true",
        help="when output_dir holds another config, write to output_dir/config-<hash8>/ instead of stopping",
    )
    sweep.add_argument(
        "--recompute-stale",
        action="store_true",
        help="recompute the cells another opl_rank version wrote (without it such a folder is refused)",
    )
    sweep.add_argument("--json", action="store_true", help="print the summary as one JSON object at the end")
    sweep.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bars (results and errors are still printed)"
    )

    pairwise = sub.add_parser(
        "pairwise",
        help="unbiased pairwise LTR on simulated clicks (resumable)",
        description="Simulate clicks (independent or continuous browsing) on a LETOR file's training "
        "queries, train pairwise rankers biased, IPS-weighted, debiased and on relevance, and report "
        "NDCG@{1,3,5,10} and MAP on the test queries (mean ± SE over seeds).",
    )
    pairwise.add_argument("--config", required=True, help="YAML config (see experiments/configs/pairwise_yahoo.yaml)")
    pairwise.add_argument(
        "--set", action="append", default=[], metavar="KEY=V1,V2", help="override a key; lists with commas (repeatable)"
    )
    pairwise.add_argument(
        "--new-config",
        action="store_true",
        help="when output_dir holds another config, write to output_dir/config-<hash8>/ instead of stopping",
    )
    pairwise.add_argument("--json", action="store_true", help="print the summary as one JSON object at the end")
    pairwise.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bars (results and errors are still printed)"
    )

    report = sub.add_parser(
        "report",
        help="tables of a sweep's results",
        description="Print markdown tables of normalised gain (mean ± SE over seeds) per method and n, "
        "for every D, L and lambda, and the winner of each cell with paired margins.",
    )
    report.add_argument("results", help="a sweep's results.csv or results.parquet, or its output folder")
    report.add_argument("--output", default=None, help="also write the markdown here (atomically)")
    report.add_argument("--plots", default=None, metavar="DIR", help="also write the standard PNG plots here")
    _add_byo_parsers(sub)
    return parser


# --trust-edited-policy (evaluate, rank): opl_rank.io.persistence.load_policy's trust_edited_spec
_TRUST_EDITED_HELP = (
    "load a policy whose policy.json was edited after saving, lacks its checksums or predates them "
    "(format 1.0), with a warning; inconsistent fields (k, L, D) are refused all the same"
)


def _add_byo_parsers(sub: Any) -> None:
    """``fit``, ``evaluate`` and ``rank`` (experiments/byo_logs.py; docs/data_format.md)."""
    logs_help = "logged rounds: .parquet or .csv (schema: docs/data_format.md) or .npz (LoggedData.save)"
    fit = sub.add_parser(
        "fit",
        help="learn a ranking policy from logged data and save it",
        description="Fit a ranking policy on logged rounds with any learning method (R-POD by default) "
        "and save it to a directory (policy.json and params.msgpack) for `evaluate` and `rank`.",
    )
    fit.add_argument("--data", required=True, help=logs_help)
    fit.add_argument("--out", required=True, metavar="DIR", help="directory to save the policy in")
    fit.add_argument(
        "--method",
        default="rpod",
        help="learning method: an estimator (ips, snips, dr, dm, iips, rips, or a registered one), "
        "regression, or rpod (default rpod)",
    )
    fit.add_argument(
        "--k",
        default=None,
        help="R-POD's top-k length: an int in [0, L], or 'auto' to choose it by OPE on a hold-out "
        "split (the default for rpod)",
    )
    fit.add_argument(
        "--reward-model",
        default="additive",
        help="f_hat's kind: additive, pairwise, additive-two-step, pairwise-two-step (default additive)",
    )
    fit.add_argument("--epochs", type=int, default=None, help="policy training epochs (default 30)")
    fit.add_argument("--reward-epochs", type=int, default=None, help="reward-model training epochs (default 60)")
    fit.add_argument("--batch-size", type=int, default=None, help="rows per step (default 256)")
    fit.add_argument("--learning-rate", type=float, default=None, help="policy learning rate (default 0.05)")
    fit.add_argument("--k-estimator", default="dr", help="OPE estimator that chooses k under --k auto (default dr)")
    fit.add_argument(
        "--k-candidates",
        default=None,
        metavar="K1,K2,...",
        help="the k values --k auto compares (default every k in 0..L)",
    )
    fit.add_argument(
        "--n-items", type=int, default=None, help="D, when the file does not record it (default: inferred)"
    )
    fit.add_argument(
        "--position-weight",
        "--alpha",
        dest="position_weight",
        default=None,
        help="position weights, comma-separated, when the file does not record them (default DCG)",
    )
    fit.add_argument("--seed", type=int, default=0, help="seed of the fit (default 0)")
    fit.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers a learner, an estimator or a policy class); repeatable",
    )
    fit.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    fit.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bars (results and errors are still printed)"
    )

    ev = sub.add_parser(
        "evaluate",
        help="off-policy evaluation of a saved policy on logged data",
        description="Estimate a saved policy's value on logged rounds with dm, ips, snips, dr, iips (when the "
        "logs have position marginals), rips and topk: value, standard error, confidence interval and "
        "effective sample size. The reward model of dm/dr/topk is fitted on these logs.",
    )
    ev.add_argument("--policy", required=True, metavar="DIR", help="a directory written by `opl-rank fit`")
    ev.add_argument("--data", required=True, help=logs_help)
    ev.add_argument(
        "--estimators", default=None, help="comma-separated estimators (default dm,ips,snips,dr,iips,rips,topk)"
    )
    ev.add_argument(
        "--reward-model", default=None, help="f_hat's kind for dm/dr/topk (default: the policy's, else additive)"
    )
    ev.add_argument(
        "--ci", default="normal", help="interval method: normal (delta method) or bootstrap (default normal)"
    )
    ev.add_argument("--level", type=float, default=0.95, help="confidence level (default 0.95)")
    ev.add_argument(
        "--n-samples", type=int, default=256, help="rankings sampled per round for model terms (default 256)"
    )
    ev.add_argument(
        "--n-items", type=int, default=None, help="D, when the file does not record it (default: the policy's)"
    )
    ev.add_argument(
        "--position-weight",
        "--alpha",
        dest="position_weight",
        default=None,
        help="position weights, comma-separated, when the file does not record them (default DCG)",
    )
    ev.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    ev.add_argument(
        "--trust-edited-policy",
        action="store_true",
        help=_TRUST_EDITED_HELP,
    )
    ev.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers a learner, an estimator or a policy class); repeatable",
    )
    ev.add_argument("--json", action="store_true", help="print the table as one JSON object")
    ev.add_argument(
        "--quiet", "-q", action="store_true", help="accepted as by every command (evaluate draws no progress bars)"
    )

    rank = sub.add_parser(
        "rank",
        help="rank a table of contexts with a saved policy",
        description="Read contexts (a `context` list column, optionally `item_mask`; other columns are passed "
        "through) and write them with a `ranking` list column: the most probable ranking by default, "
        "a sampled one (and its `log_prob`) with --sample.",
    )
    rank.add_argument("--policy", required=True, metavar="DIR", help="a directory written by `opl-rank fit`")
    rank.add_argument("--contexts", required=True, help="contexts: .parquet or .csv with a `context` list column")
    rank.add_argument("--out", required=True, help="output table: .parquet or .csv")
    rank.add_argument(
        "--sample", action="store_true", help="sample rankings from the policy instead of the greedy ranking"
    )
    rank.add_argument("--seed", type=int, default=0, help="seed for --sample (default 0)")
    rank.add_argument(
        "--trust-edited-policy",
        action="store_true",
        help=_TRUST_EDITED_HELP,
    )
    rank.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers a learner, an estimator or a policy class); repeatable",
    )
    rank.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    rank.add_argument(
        "--quiet", "-q", action="store_true", help="accepted as by every command (rank draws no progress bars)"
    )


def _byo(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Run fit / evaluate / rank: (summary, its text form)."""
    from experiments import byo_logs
    from experiments.user_code import import_plugins

    import_plugins(tuple(args.plugin))  # a plugin learner, estimator or saved policy class

    if args.command == "fit":
        summary = byo_logs.run_fit(
            data=args.data,
            out=args.out,
            method=args.method,
            k=args.k,
            reward_model=args.reward_model,
            epochs=args.epochs,
            reward_epochs=args.reward_epochs,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            k_estimator=args.k_estimator,
            k_candidates=args.k_candidates,
            n_items=args.n_items,
            position_weight=byo_logs.parse_position_weight(args.position_weight),
            seed=args.seed,
            progress=not args.quiet,
        )
        return summary, byo_logs.format_fit(summary)
    if args.command == "evaluate":
        estimators = None if args.estimators is None else [e.strip() for e in args.estimators.split(",") if e.strip()]
        summary = byo_logs.run_evaluate(
            policy=args.policy,
            data=args.data,
            estimators=estimators,
            reward_model=args.reward_model,
            ci=args.ci,
            level=args.level,
            n_samples=args.n_samples,
            seed=args.seed,
            n_items=args.n_items,
            position_weight=byo_logs.parse_position_weight(args.position_weight),
            trust_edited_policy=args.trust_edited_policy,
        )
        return summary, byo_logs.format_evaluation(summary)
    summary = byo_logs.run_rank(
        policy=args.policy,
        contexts=args.contexts,
        out=args.out,
        sample=args.sample,
        seed=args.seed,
        trust_edited_policy=args.trust_edited_policy,
    )
    width = max(len(name) for name in summary)
    return summary, "\n".join(f"{name:<{width}}  {value}" for name, value in summary.items())


def _check_simulate_args(args: argparse.Namespace) -> None:
    """Errors in the command line's own terms (``--tau``, not ``logging_temperature``),
    before anything is computed."""
    import math

    for option, value in (("--n", args.n), ("--n-items (-D)", args.n_items), ("--context-dim", args.context_dim)):
        if value < 1:
            raise ValueError(f"{option} must be a positive int, got {value}")
    if not 1 <= args.length <= args.n_items:
        raise ValueError(f"--length (-L) must be in [1, --n-items (-D)]: got -L {args.length} with -D {args.n_items}")
    if not 0.0 <= args.lam <= 1.0:
        raise ValueError(f"--lam must be in [0, 1], got {args.lam}")
    if not (math.isfinite(args.sigma) and args.sigma >= 0):
        raise ValueError(f"--sigma must be finite and >= 0, got {args.sigma}")
    if not (math.isfinite(args.tau) and args.tau > 0):
        raise ValueError(f"--tau must be finite and > 0, got {args.tau}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.value_contexts < 2:
        raise ValueError(f"--value-contexts must be >= 2, got {args.value_contexts}")
    if args.out:
        folder = os.path.dirname(os.path.abspath(args.out))
        if os.path.isdir(args.out):
            raise ValueError(
                f"--out {args.out} is a folder; give a file name, e.g. {os.path.join(args.out, 'logged.npz')}"
            )
        if not os.path.isdir(folder):
            raise ValueError(
                f"--out {args.out}: folder {os.path.dirname(args.out) or folder} does not exist (create it first)"
            )
        suffix = os.path.splitext(args.out)[1].lower()
        if suffix not in _LOG_WRITERS:
            raise ValueError(
                f"--out {args.out}: the suffix says the format; use one of {', '.join(sorted(_LOG_WRITERS))} "
                f"(got {suffix or 'none'})"
            )


# simulate --out: the file's suffix names its format (the LoggedData method that writes it)
_LOG_WRITERS = {".npz": "save", ".parquet": "to_parquet", ".pq": "to_parquet", ".csv": "to_csv"}


def _simulate(args: argparse.Namespace) -> dict[str, Any]:
    import opl_rank
    from experiments.progress import Steps, bar
    from simulators import SyntheticRankingEnv
    from simulators.logging_policies import CallableLogging

    _check_simulate_args(args)
    if args.simulator != "synthetic" or args.set or args.plugin:
        return _simulate_registered(args)
    args.logging_policy = args.logging_policy or "pl"
    if args.logging_policy == "pl":
        logging_policy = None
    elif args.logging_policy == "uniform":
        logging_policy = "uniform"
    else:  # checked on every call: [n, D] logits, at least L finite per row
        fn = load_callable(args.logging_policy, what="--logging-policy")
        logging_policy = CallableLogging(fn, args.n_items, ranking_length=args.length)
    key_env, key_data, key_value = opl_rank.prng.split_seed(args.seed, 3)
    with bar(3 + bool(args.out), desc="simulate", unit="step", enabled=not args.quiet) as progress:
        step = Steps(progress)
        step("environment")
        env = SyntheticRankingEnv.create(
            key_env,
            n_items=args.n_items,
            ranking_length=args.length,
            context_dim=args.context_dim,
            lam=args.lam,
            sigma=args.sigma,
            logging_temperature=args.tau,
            logging_policy=logging_policy,
        )
        # a second bar over the rows, fed by the simulator after each chunk
        step(f"logging {args.n} rounds")
        with bar(args.n, desc="rows", unit="row", enabled=not args.quiet) as rows:
            data = env.sample_logged_data(
                key_data, args.n, position_marginals=args.position_marginals, progress=rows.update
            )
        step(f"logging policy value ({args.value_contexts} contexts)")
        with bar(args.value_contexts, desc="contexts", unit="context", enabled=not args.quiet) as contexts:
            value = env.logging_policy_value(key_value, args.value_contexts, progress=contexts.update)
        return _simulation_summary(args, step, data, value, {"simulator": "synthetic"})


def _simulation_summary(
    args: argparse.Namespace, step: Any, data: Any, value: Any, head: dict[str, Any]
) -> dict[str, Any]:
    """The summary ``simulate`` prints (and the saved file, with ``--out``)."""
    summary = {**head, "lambda": args.lam, "tau": args.tau, "seed": args.seed}
    summary.update(data.summary())
    summary["logging_policy_value"] = value.value
    summary["logging_policy_value_se"] = value.stderr
    if args.out:
        step(f"saving {args.out}")
        writer = _LOG_WRITERS[os.path.splitext(args.out)[1].lower()]
        if writer == "to_csv" and data.item_features is not None:
            import numpy as np

            features = np.asarray(data.item_features)
            if features.shape != (data.n_items, data.n_items) or not np.array_equal(features, np.eye(data.n_items)):
                raise ValueError(f"--out {args.out}: CSV has no place for this simulator's item features; use .parquet")
            data = data.replace(item_features=None)  # one-hot identities: the item ids say the same
        getattr(data, writer)(args.out)
        summary["saved_to"] = args.out
    step.done()
    return summary


def _simulate_registered(args: argparse.Namespace) -> dict[str, Any]:
    """``opl-rank simulate --simulator NAME``: any registered environment, built as a sweep
    cell would build it (``--set`` values: sweep config keys or the simulator's options)."""
    import dataclasses

    import opl_rank
    from experiments.config import build_dataclass, parse_overrides
    from experiments.grid import as_lists
    from experiments.progress import Steps, bar
    from experiments.sweep_config import OPLSweep
    from experiments.user_code import import_plugins
    from simulators import environments
    from simulators.logging_policies import CallableLogging

    import_plugins(tuple(args.plugin))
    spec = environments.get(args.simulator)
    values = parse_overrides(args.set)
    fields = {f.name for f in dataclasses.fields(OPLSweep)}
    options = {k: v for k, v in values.items() if k in spec.options}
    config_values = {k: v for k, v in values.items() if k not in spec.options}
    flagged = {"n_items": "-D", "ranking_length": "-L", "tau": "--tau", "lam": "--lam", "sigma": "--sigma",
               "logging_policy": "--logging-policy", "seeds": "--seed", "n": "--n"}  # fmt: skip
    for key in config_values:
        if key in flagged:
            raise ValueError(f"--set {key}: simulate sets it with its own flag; use {flagged[key]}")
    if config_values.get("letor_path"):  # a file, or dataset:NAME (a shipped sample)
        from experiments.config import resolve_path

        config_values["letor_path"] = os.path.abspath(resolve_path(str(config_values["letor_path"]), None))
    unknown = sorted(set(config_values) - fields)
    if unknown:
        raise ValueError(
            f"--set {', '.join(unknown)}: neither an option of simulator {args.simulator!r} "
            f"({', '.join(sorted(spec.options)) or 'none'}) nor a sweep config key"
        )
    if args.context_dim != 5:
        raise ValueError("--context-dim is the synthetic simulator's; another simulator's contexts are its own")
    logging_policy = args.logging_policy or (spec.logging_policies[0] if spec.logging_policies else None)
    if logging_policy is None:
        raise ValueError(
            f"--logging-policy: simulator {args.simulator!r} names no built-in logging policy; give module:function"
        )
    config_values.update(
        simulator=args.simulator,
        plugins=list(args.plugin),
        logging_policy=logging_policy,
        n_items=[args.n_items],
        ranking_length=[args.length],
        tau=[args.tau],
        lam=[args.lam],
        sigma=args.sigma,
    )
    config = build_dataclass(OPLSweep, as_lists(config_values, OPLSweep), source="--set")
    if logging_policy not in spec.logging_policies:
        logging_policy = CallableLogging(
            load_callable(logging_policy, what="--logging-policy"), args.n_items, temperature=args.tau
        )
    key_env, key_data, key_value = opl_rank.prng.split_seed(args.seed, 3)
    with bar(3 + bool(args.out), desc="simulate", unit="step", enabled=not args.quiet) as progress:
        step = Steps(progress)
        step("environment")
        env = environments.create(
            args.simulator,
            key_env,
            n_items=args.n_items,
            ranking_length=args.length,
            lam=args.lam,
            tau=args.tau,
            logging_policy=logging_policy,
            config=config,
            options=options,
        )
        step(f"logging {args.n} rounds")
        data = env.sample_logged_data(key_data, args.n, position_marginals=args.position_marginals)
        step(f"logging policy value ({args.value_contexts} contexts)")
        value = env.logging_policy_value(key_value, args.value_contexts)
        return _simulation_summary(
            args, step, data, value, {"simulator": args.simulator, **{f"option {k}": v for k, v in options.items()}}
        )


def _echo(args: argparse.Namespace) -> Any:
    """Progress lines: to stdout (stderr under --json), printed around the progress bars."""
    from experiments.progress import echo_to

    return echo_to(sys.stderr if args.json else sys.stdout)


def _ltr(args: argparse.Namespace) -> dict[str, Any]:
    from experiments.config import parse_overrides
    from experiments.ltr import load_experiment, run_ltr

    experiment = load_experiment(args.config, parse_overrides(args.set))
    return run_ltr(experiment, echo=_echo(args), progress=not args.quiet)


def _sweep(args: argparse.Namespace) -> dict[str, Any]:
    from experiments.config import parse_overrides
    from experiments.opl_sweep import load_sweep, run_sweep

    sweep = load_sweep(args.config, parse_overrides(args.set))
    return run_sweep(
        sweep,
        echo=_echo(args),
        backend=args.backend,
        workers=args.workers,
        compilation_cache=args.compilation_cache or None,
        ray_address=args.ray_address,
        new_config=args.new_config,
        progress=not args.quiet,
        recompute_stale=args.recompute_stale,
        status=_RUNNING,
    )


def _pairwise(args: argparse.Namespace) -> dict[str, Any]:
    from experiments.config import parse_overrides
    from experiments.pairwise_ltr import load_pairwise, run_pairwise

    experiment = load_pairwise(args.config, parse_overrides(args.set))
    summary = run_pairwise(experiment, echo=_echo(args), new_config=args.new_config, progress=not args.quiet)
    with open(summary["report"], encoding="utf-8") as f:
        print(f.read(), file=sys.stderr if args.json else sys.stdout)
    return summary


def _report(args: argparse.Namespace) -> None:
    from experiments.report import load_rows, markdown_report
    from opl_rank.io.atomic import atomic_write_text

    rows = load_rows(args.results)  # a ValueError names a missing file or a table that is not a sweep's
    text = markdown_report(rows)
    if args.output:
        atomic_write_text(args.output, text)
    print(text, end="")
    if args.plots:
        from experiments.plots import write_plots

        for path in write_plots(rows, args.plots):
            print(f"wrote {path}", file=sys.stderr)  # stdout is the Markdown (opl-rank report > report.md)


def _print_summary(summary: dict[str, Any]) -> None:
    width = max(len(k) for k in summary)
    for name, value in summary.items():
        if isinstance(value, float):
            text = f"{value:.6g}"
        elif isinstance(value, list):
            text = "[" + ", ".join(f"{v:.4g}" for v in value) + "]"
        else:
            text = str(value)
        print(f"{name:<{width}}  {text}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``opl-rank`` console script; returns the exit status."""
    from experiments.progress import silence_noise

    parser = build_parser()
    args = parser.parse_args(argv)
    _RUNNING.clear()
    _RUNNING["command"] = args.command
    silence_noise()
    try:
        if args.command != "report":
            # Every computing subcommand loads the kernels earlier runs compiled (docs/performance.md
            # §17); sweep's --compilation-cache names the directory ('' turns it off), the others use
            # $OPL_RANK_JAX_CACHE or ~/.cache/opl_rank/jax.
            from opl_rank.compilation_cache import enable_compilation_cache

            chosen = getattr(args, "compilation_cache", None)
            args.compilation_cache = "" if chosen == "" else enable_compilation_cache(chosen) or ""
        if args.command == "simulate":
            summary = _simulate(args)
        elif args.command == "ltr":
            summary = _ltr(args)
        elif args.command == "sweep":
            summary = _sweep(args)
        elif args.command == "pairwise":
            summary = _pairwise(args)
        elif args.command == "report":
            _report(args)
            return 0
        elif args.command in ("fit", "evaluate", "rank"):
            summary, text = _byo(args)
            print(json.dumps(summary) if args.json else text)
            return 0
        else:  # pragma: no cover - argparse rejects unknown subcommands
            parser.error(f"unknown command {args.command!r}")
    except (ValueError, TypeError, RuntimeError) as err:
        print(f"opl-rank {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C: one line, no traceback (finished cells are kept)
        detail = f": {stop}" if str(stop) else ""
        print(f"\nopl-rank {args.command}: interrupted{detail}", file=sys.stderr)
        return INTERRUPTED
    if args.json:
        from experiments.byo_logs import _finite

        print(json.dumps(_finite(summary)))  # NaN / inf as null: strict JSON readers (jq) refuse NaN
    else:
        _print_summary(summary)
    return 0


# What a running command reports when Ctrl-C stops it (the sweep fills it: its folder and
# cell count). Only the console script reads it; library calls never see this state.
_RUNNING: dict[str, Any] = {}


def _interrupted_line() -> str:
    command = _RUNNING.get("command", "")
    line = f"opl-rank{' ' + command if command else ''}: interrupted"
    folder, total = _RUNNING.get("folder"), _RUNNING.get("cells")
    if folder and total:
        cells = os.path.join(folder, "cells")
        done = (
            sum(1 for f in os.listdir(cells) if f.endswith(".json") and not f.startswith(".tmp-"))
            if os.path.isdir(cells)
            else 0
        )
        line += (
            f": {min(done, total)} of {total} cell(s) finished and kept in {folder}; rerun the same command to resume"
        )
    return line


def _on_sigint(signum: int, frame: Any) -> None:
    # A KeyboardInterrupt raised at an arbitrary bytecode can land in a garbage-collection
    # callback, where Python swallows it and the run goes on; and tearing the interpreter
    # down around JAX's compiler and worker threads crashed 1 of 5 tries. So Ctrl-C ends the
    # process here and now: one line, exit 130. Every finished cell is already on disk
    # (written atomically); a half-written one is a temporary file the next run removes.
    try:  # a raw write: a print could re-enter a buffered write the signal interrupted
        os.write(2, f"\n{_interrupted_line()}\n".encode())
    finally:
        os._exit(INTERRUPTED)


def console_main() -> None:
    """The ``opl-rank`` console script: :func:`main`, with Ctrl-C ending the run at once
    with one line and exit status 130 (see ``_on_sigint``); once :func:`main` has returned,
    Ctrl-C no longer changes the exit status."""
    import signal
    import warnings

    signal.signal(signal.SIGINT, _on_sigint)
    # Warnings as one line each, like the errors (in-process callers of main keep Python's).
    warnings.showwarning = _show_warning
    code = main()
    # The work is done and on disk. While the interpreter tears down (JAX's threads and
    # backends: ~0.25 s) Python puts back the default handler, and a Ctrl-C landing there
    # killed the process with no line and no exit status of its own; ignore it instead, so
    # the status says what happened.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console_main()
