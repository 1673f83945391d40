"""``opl-rank fit / evaluate / rank``: learning from your own logs (docs/data_format.md).

  fit       logged rounds (.parquet, .csv, .npz) -> a saved policy directory
            (``--k auto`` chooses R-POD's k by OPE on a hold-out split: opl_rank.opl.select_k)
  evaluate  a saved policy on logged rounds: the OPE table (value, SE, CI, ESS)
  rank      a saved policy on a table of contexts -> a table with a ``ranking`` column

Each ``run_*`` returns a JSON-able summary; errors are ValueErrors that name the command
line option (``--data``, ``--k``, ...) and the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = [
    "run_fit",
    "run_evaluate",
    "run_rank",
    "format_fit",
    "format_evaluation",
    "OPE_ESTIMATORS",
    "parse_position_weight",
]

# The table `evaluate` prints by default (iips only when the logs have position marginals).
OPE_ESTIMATORS = ("dm", "ips", "snips", "dr", "iips", "rips", "topk")


@contextlib.contextmanager
def _option(option: str) -> Iterator[None]:
    """Prefix errors with the option whose value caused them (``--data logs.parquet: ...``)."""
    try:
        yield
    except FileNotFoundError as err:
        raise ValueError(f"{option} {err.args[0] if err.args else err}") from err
    except ImportError as err:
        raise ValueError(f"{option}: {err}") from err
    except ValueError as err:
        raise ValueError(f"{option} {err}") from err


def parse_position_weight(text: str | None) -> list[float] | None:
    """``--position-weight 1,0.63,0.5`` -> floats."""
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ValueError(f"--position-weight must be comma-separated numbers, got {text!r}") from err


def _positive(option: str, value: Any, kind: type = int) -> None:
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or not value > 0
        or (kind is float and not math.isfinite(value))
    ):
        raise ValueError(f"{option} must be a positive {'int' if kind is int else 'number'}, got {value!r}")


def _read_logs(path: str, option: str, n_items: int | None, position_weight: list[float] | None) -> Any:
    from opl_rank.io.tabular import read_logged_data

    with _option(option):
        return read_logged_data(path, n_items=n_items, position_weight=position_weight)


def _finite(value: Any) -> Any:
    """NaN and inf become None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# -- fit -------------------------------------------------------------------------------


def run_fit(*, progress: bool = False, **options: Any) -> dict[str, Any]:
    """Learn a policy from the logs in ``data`` and save it to the directory ``out``
    (keywords: ``_fit``'s). ``progress``: a bar over the steps on stderr."""
    from experiments.progress import Steps, bar

    method, k = options.get("method", "rpod"), options.get("k")
    auto = method == "rpod" and (k is None or str(k).strip() == "auto")
    with bar(3 + auto, desc="fit", unit="step", enabled=progress) as progress_bar:
        step = Steps(progress_bar)
        summary = _fit(step=step, **options)
        step.done()
    return summary


def _fit(
    *,
    data: str,
    out: str,
    method: str = "rpod",
    k: str | None = None,
    reward_model: str = "additive",
    epochs: int | None = None,
    reward_epochs: int | None = None,
    batch_size: int | None = None,
    learning_rate: float | None = None,
    k_estimator: str = "dr",
    k_candidates: str | None = None,
    n_items: int | None = None,
    position_weight: list[float] | None = None,
    seed: int = 0,
    step: Any = lambda label: None,
) -> dict[str, Any]:
    from opl_rank.io.persistence import save_policy
    from opl_rank.opl import estimators as opl_estimators
    from opl_rank.opl.learners import LearnerConfig, fit, learning_methods, needs_position_marginals, needs_reward_model
    from opl_rank.opl.reward_models import REWARD_MODEL_KINDS
    from opl_rank.opl.select_k import select_k
    from opl_rank.prng import split_seed

    methods = learning_methods()
    if method not in methods:
        raise ValueError(f"--method must be one of {', '.join(methods)}; got {method!r}")
    if reward_model not in REWARD_MODEL_KINDS:
        raise ValueError(f"--reward-model must be one of {', '.join(REWARD_MODEL_KINDS)}; got {reward_model!r}")
    if method != "rpod" and k is not None:
        raise ValueError(f"--k is only for --method rpod (got --k {k} with --method {method})")
    if k_candidates is not None and not (method == "rpod" and (k is None or k.strip() == "auto")):
        raise ValueError("--k-candidates is only for --method rpod with --k auto")
    if method == "rpod" and k_estimator not in opl_estimators.OPL_ESTIMATORS:
        raise ValueError(
            f"--k-estimator must be one of {', '.join(sorted(opl_estimators.OPL_ESTIMATORS))}; got {k_estimator!r}"
        )
    for option, value in (
        ("--epochs", epochs),
        ("--reward-epochs", reward_epochs),
        ("--batch-size", batch_size),
        ("--n-items", n_items),
    ):
        _positive(option, value)
    _positive("--learning-rate", learning_rate, float)
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out}: exists and is not a directory")
    step(f"reading {os.path.basename(data)}")
    logs = _read_logs(data, "--data", n_items, position_weight)
    n_slots = logs.ranking_length
    chosen: int | str | None = None
    if method == "rpod":
        chosen = "auto" if k is None else k.strip()
        if chosen != "auto":
            try:
                chosen = int(chosen)
            except ValueError:
                chosen = None
            if chosen is None or not 0 <= chosen <= n_slots:
                raise ValueError(f"--k must be 'auto' or an int in [0, L={n_slots}] (L from --data), got {k!r}")
    candidates = None
    if k_candidates is not None:
        try:
            candidates = tuple(int(v) for v in k_candidates.split(",") if v.strip())
        except ValueError:
            candidates = ()
        if not candidates or any(not 0 <= c <= n_slots for c in candidates):
            raise ValueError(
                f"--k-candidates must be comma-separated ints in [0, L={n_slots}] (L from --data), got {k_candidates!r}"
            )
    if needs_position_marginals(method) and logs.log_pi0_position_marginal is None:
        raise ValueError(
            f"--method {method} needs logging position marginals: --data {data} has no "
            "log_pi0_position_marginal (or pi0_position_marginal) column"
        )

    defaults = LearnerConfig(method="ips")
    train = dataclasses.replace(
        defaults.train, **_given(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate)
    )
    reward_train = dataclasses.replace(defaults.reward_train, **_given(epochs=reward_epochs, batch_size=batch_size))
    config = LearnerConfig(
        method=method,
        k=0 if chosen == "auto" else chosen,
        reward_model=reward_model,
        train=train,
        reward_train=reward_train,
    )
    key_select, key_fit = split_seed(seed, 2)
    summary: dict[str, Any] = {"method": method}
    selection = None
    if chosen == "auto":
        step(f"choosing k by OPE ({len(candidates) if candidates else n_slots + 1} fits)")
        result = select_k(logs, key_select, config, ks=candidates, estimator=k_estimator)
        config = dataclasses.replace(config, k=result.k)
        selection = {"estimator": result.estimator, "table": result.table}
    step(f"fitting {method}" + (f" k={config.k}" if method == "rpod" else ""))
    totals = {"reward": config.reward_train.epochs, "policy": config.train.epochs}
    on_epoch = step.epochs(totals) if hasattr(step, "epochs") else None  # a Steps bar: epochs shown in it
    policy = fit(logs, key_fit, config, on_epoch=on_epoch)
    metadata = {"data": os.path.abspath(data), "seed": seed, "n": logs.n_rounds, "k_selection": _finite(selection)}
    step(f"saving {out}")
    spec_path = save_policy(policy, out, config=config, metadata=metadata)
    summary.update(
        {
            "k": config.k if method == "rpod" else None,
            "reward_model": reward_model if needs_reward_model(method) else None,
            "policy": type(policy).__name__,
            "n": logs.n_rounds,
            "D": logs.n_items,
            "L": n_slots,
            "dx": int(logs.context.shape[1]),
            "seed": seed,
            "saved_to": os.path.dirname(spec_path),
        }
    )
    if selection is not None:
        summary["k_estimator"] = selection["estimator"]
        summary["k_selection"] = selection["table"]
    return _finite(summary)


def format_fit(summary: dict[str, Any]) -> str:
    """The fit summary as text (and the k-selection table under --k auto)."""
    items = {name: value for name, value in summary.items() if name not in ("k_selection",)}
    width = max(len(name) for name in items)
    lines = [f"{name:<{width}}  {value}" for name, value in items.items()]
    if summary.get("k_selection"):
        lines += [
            "",
            f"k selection by OPE ({summary['k_estimator']}) on a hold-out split:",
            f"{'k':>3}  {'value':>10}  {'se':>9}  {'ci_low':>10}  {'ci_high':>10}  {'ess':>9}",
        ]
        for row in summary["k_selection"]:
            cells = [
                ("nan" if row[f] is None else f"{row[f]:.4g}") for f in ("value", "stderr", "ci_low", "ci_high", "ess")
            ]
            mark = "  <- chosen" if row["k"] == summary["k"] else ""
            lines.append(
                f"{row['k']:>3}  {cells[0]:>10}  {cells[1]:>9}  {cells[2]:>10}  {cells[3]:>10}  {cells[4]:>9}{mark}"
            )
    return "\n".join(lines)


def _given(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


# -- evaluate --------------------------------------------------------------------------


def _load(policy_dir: str, trust_edited_policy: bool = False) -> tuple[Any, dict]:
    """The saved policy and its checked spec (one reading of policy.json; errors name
    --policy). ``trust_edited_policy`` (``--trust-edited-policy``): a policy.json that fails
    its integrity check (edited by hand, a checksum removed, format 1.0) loads with a warning;
    inconsistent fields are refused all the same."""
    from opl_rank.io.persistence import load_policy_and_spec

    with _option("--policy"):
        return load_policy_and_spec(policy_dir, trust_edited_spec=trust_edited_policy)


def run_evaluate(
    *,
    policy: str,
    data: str,
    estimators: list[str] | None = None,
    reward_model: str | None = None,
    ci: str = "normal",
    level: float = 0.95,
    n_samples: int = 256,
    seed: int = 0,
    n_items: int | None = None,
    position_weight: list[float] | None = None,
    trust_edited_policy: bool = False,
) -> dict[str, Any]:
    """The OPE table of the saved policy ``policy`` on the logs ``data``
    (``trust_edited_policy``: see ``_load``).

    Each estimate carries [`opl_rank.opl.ope.OPEResult`][opl_rank.opl.ope.OPEResult]'s verdict: ``estimable`` (false:
    ``value``, ``stderr`` and the interval are null and ``reason`` says why -- no usable weight
    mass), ``model_only`` (the interval is the reward model's and excludes its bias) and
    ``caveat``; ``ci_method`` is the interval actually used."""
    import numpy as np

    from opl_rank.io.persistence import check_context_dim
    from opl_rank.opl import estimators as opl_estimators
    from opl_rank.opl import ope
    from opl_rank.opl.reward_models import REWARD_MODEL_KINDS, base_kind, fit_reward_model
    from opl_rank.optimization import TrainConfig
    from opl_rank.prng import split_seed

    if ci not in ("normal", "bootstrap"):
        raise ValueError(f"--ci must be 'normal' or 'bootstrap', got {ci!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"--level must be in (0, 1), got {level}")
    _positive("--n-samples", n_samples)
    _positive("--n-items", n_items)
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    if reward_model is not None and reward_model not in REWARD_MODEL_KINDS:
        raise ValueError(f"--reward-model must be one of {', '.join(REWARD_MODEL_KINDS)}; got {reward_model!r}")
    if estimators is not None:
        for name in estimators:
            if name not in opl_estimators.OPL_ESTIMATORS:
                raise ValueError(
                    f"--estimators: unknown estimator {name!r}; registered: {', '.join(sorted(opl_estimators.OPL_ESTIMATORS))}"
                )
    ranker, spec = _load(policy, trust_edited_policy)
    # The policy's n_items is the default: a CSV or foreign Parquet file need not record it
    # (a file that records another value is an error naming both).
    logs = _read_logs(data, "--data", n_items if n_items is not None else int(spec["n_items"]), position_weight)
    with _option(f"--data {data}:"):
        if logs.n_items != int(spec["n_items"]):
            raise ValueError(f"the logs have n_items={logs.n_items}, the policy ranks {spec['n_items']} items")
        if logs.ranking_length != int(spec["n_slots"]):
            raise ValueError(
                f"the logged rankings have L={logs.ranking_length}, the policy ranks {spec['n_slots']} slots"
            )
        check_context_dim(spec, int(logs.context.shape[1]))
    has_marginals = logs.log_pi0_position_marginal is not None
    if estimators is None:
        estimators = [name for name in OPE_ESTIMATORS if name != "iips" or has_marginals]
    elif not has_marginals:
        needing = [name for name in estimators if opl_estimators.get(name).needs_position_marginals]
        if needing:
            raise ValueError(
                f"--estimators {', '.join(needing)} need logging position marginals: --data {data} has no "
                "log_pi0_position_marginal (or pi0_position_marginal) column"
            )
    entries = {name: opl_estimators.get(name) for name in estimators}
    config = spec.get("config") or {}
    kind = reward_model or base_kind(config.get("reward_model", "additive"))
    key_model, key_ope = split_seed(seed, 2)
    model = None
    if any(e.needs_reward_model for e in entries.values()):
        train = TrainConfig(
            **{
                name: value
                for name, value in (config.get("reward_train") or {}).items()
                if name in {f.name for f in dataclasses.fields(TrainConfig)}
            }
        )
        feature_dim = config.get("item_feature_dim")
        model = fit_reward_model(
            logs,
            key_model,
            kind=kind,
            hidden=tuple(config.get("reward_hidden") or ()),
            config=train,
            item_feature_dim=feature_dim,
            two_step_k=int(spec["k"]) if kind.endswith("-two-step") else None,
        )
    k = int(spec["k"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ope.DegenerateWeightsWarning)
        results = ope.evaluate(
            ranker,
            logs,
            key_ope,
            estimators=tuple(estimators),
            reward_model=model,
            k=k if any(e.uses_k for e in entries.values()) else None,
            ci=ci,
            level=level,
            n_samples=n_samples,
        )
    for warning in caught:
        if not issubclass(warning.category, ope.DegenerateWeightsWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    weighted = np.asarray(logs.reward, np.float64) @ np.asarray(logs.position_weight, np.float64)
    summary = {
        "policy": policy,
        "policy_class": spec["policy"]["class"],
        "k": k,
        "data": data,
        "n": logs.n_rounds,
        "D": logs.n_items,
        "L": logs.ranking_length,
        "reward_model": kind if model is not None else None,
        "ci": ci,
        "level": level,
        "logged_value": float(weighted.mean()),
        "logged_value_se": float(weighted.std(ddof=1) / math.sqrt(len(weighted))) if len(weighted) > 1 else math.nan,
        "estimates": {
            name: {
                "value": r.value,
                "stderr": r.stderr,
                "ci_low": r.ci_low,
                "ci_high": r.ci_high,
                "ci_method": r.ci_method,
                "ess": r.ess,
                "max_weight": r.max_weight,
                "estimable": r.estimable,
                "reason": r.reason,
                "model_only": r.model_only,
                "caveat": r.caveat,
            }
            for name, r in results.items()
        },
        "warnings": [str(w.message) for w in caught if issubclass(w.category, ope.DegenerateWeightsWarning)],
    }
    return _finite(summary)


def format_evaluation(summary: dict[str, Any]) -> str:
    """The OPE table as text: an estimate that is not estimable prints its reason instead of
    numbers; one with a caveat (model only, unreliable, ...) is marked in the ``note``
    column and explained below the table."""

    def num(value: Any) -> str:
        return "nan" if value is None else f"{value:.4g}"

    lines = [
        f"policy {summary['policy']} ({summary['policy_class']}, k={summary['k']}) on {summary['data']}: "
        f"n={summary['n']}, D={summary['D']}, L={summary['L']}",
        f"logged (logging policy) value {num(summary['logged_value'])} (se {num(summary['logged_value_se'])})",
        f"reward model (dm, dr, topk): {summary['reward_model'] or '-'}; intervals: {summary['ci']} "
        f"{summary['level']:.0%}",
        "",
    ]
    estimates = summary["estimates"]
    header = ("estimator", "value", "se", "ci_low", "ci_high", "ess", "max_weight", "note")
    rows: list[tuple[str, ...]] = [header]
    notes: list[str] = []
    for name, e in estimates.items():
        if not e.get("estimable", True):
            continue
        note = ""
        if e.get("caveat"):
            notes.append(f"{name}: {e['caveat']}")
            note = f"{'model only' if e.get('model_only') else 'caveat'} ({len(notes)})"
        rows.append((name, *(num(e[f]) for f in ("value", "stderr", "ci_low", "ci_high", "ess", "max_weight")), note))
    if not notes:  # no note column without notes
        rows = [row[:-1] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    left = {0, len(header) - 1}  # the names and the notes

    def line(cells: tuple[str, ...]) -> str:
        text = "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return text.rstrip()

    lines += [line(rows[0]), line(tuple("-" * w for w in widths))]
    by_name = {row[0]: row for row in rows[1:]}
    for name, e in estimates.items():
        if name in by_name:
            lines.append(line(by_name[name]))
        else:
            lines.append(f"{name.ljust(widths[0])}  not estimable: {e.get('reason')}")
    if notes:
        lines += ["", *(f"({j}) {note}" for j, note in enumerate(notes, 1))]
    reported = {name for name, e in estimates.items() if e.get("caveat") or not e.get("estimable", True)}
    for message in summary["warnings"]:  # a warning the table does not already explain
        if not any(f"estimator {name!r}" in message for name in reported):
            lines.append(f"warning: {message}")
    return "\n".join(lines)


# -- rank ------------------------------------------------------------------------------


# Columns of logged feedback: what rank's output must not carry over from a logs file.
_LOGGED_COLUMNS = (
    "ranking",
    "reward",
    "log_pi0_prefix",
    "pi0_prefix",
    "log_pi0_position_marginal",
    "pi0_position_marginal",
    "position_weight",
    "alpha",
)


def run_rank(
    *,
    policy: str,
    contexts: str,
    out: str,
    sample: bool = False,
    seed: int = 0,
    chunk_size: int = 8192,
    trust_edited_policy: bool = False,
) -> dict[str, Any]:
    """Rank every row of the table ``contexts`` with the saved policy; write ``out``
    (``trust_edited_policy``: see ``_load``)."""
    import jax
    import numpy as np

    from opl_rank.io.persistence import check_context_dim
    from opl_rank.io.tabular import read_contexts, write_rankings
    from opl_rank.opl.policies import greedy_rankings
    from opl_rank.prng import make_key

    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    _positive("--chunk-size", chunk_size)
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in (".parquet", ".pq", ".csv"):
        raise ValueError(f"--out {out}: unknown format {suffix or '(no suffix)'!r}; expected .parquet or .csv")
    ranker, spec = _load(policy, trust_edited_policy)
    with _option("--contexts"):
        table, context, mask = read_contexts(contexts, n_items=int(spec["n_items"]))
    # A logs file as --contexts: its logged ranking, rewards and propensities would sit beside
    # the policy's rankings and read as logs. The output keeps the contexts (and any other
    # column of the user's) and the new rankings only, and says what it dropped.
    dropped = [c for c in _LOGGED_COLUMNS if c in table.column_names]
    if dropped:
        table = table.drop_columns(dropped)
    with _option(f"--contexts {contexts}:"):
        check_context_dim(spec, context.shape[1])
    key = make_key(seed)
    rankings, log_probs = [], []
    for i, start in enumerate(range(0, context.shape[0], chunk_size)):
        x = jax.numpy.asarray(context[start : start + chunk_size])
        where = None if mask is None else jax.numpy.asarray(mask[start : start + chunk_size])
        if sample:
            chunk = ranker.sample(jax.random.fold_in(key, i), x, where=where)
            log_probs.append(np.asarray(ranker.log_prob(x, chunk, where=where)))
        else:
            chunk = greedy_rankings(ranker, x, where=where)
        rankings.append(np.asarray(chunk, dtype=np.int32))
    columns = {"ranking": np.concatenate(rankings)}
    if sample:
        columns["log_prob"] = np.concatenate(log_probs).astype(np.float32)
    with _option("--out"):
        write_rankings(table, out, columns)
    return {
        "policy": policy,
        "policy_class": spec["policy"]["class"],
        "contexts": contexts,
        "n": int(context.shape[0]),
        "L": int(columns["ranking"].shape[1]),
        "sampled": sample,
        "seed": seed if sample else None,
        "saved_to": out,
        "dropped_logged_columns": dropped or None,
    }
