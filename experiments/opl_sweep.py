"""``opl-rank sweep``: the R-POD paper's synthetic OPL benchmark over k, lambda, n, D, L, tau, seeds.

A cell is one (D, L, tau, lambda, n, seed): one environment, one logged data set, every
method fitted on it, and the ground truth -- V(pi), V(pi_0), V* -- on one shared set of
evaluation contexts (paired comparisons). Cells that differ only in their seed share
shapes and run as one group: every method is fitted on all of the group's data sets at
once, vmapped over seeds (``vmap_seeds``, on by default). Each finished cell is written atomically as
``cells/<cell>.json``; a stopped sweep resumes and skips finished cells. At the end all
rows are gathered into ``results.csv`` (one tidy row per method, k, reward model and cell)
next to the resolved ``config.yaml``, ``results.parquet`` (with pandas and pyarrow) and
the standard plots (with matplotlib).

Rows for R-POD at k = 0 and k = L reuse the regression and DR fits of the same cell: they
are the same estimators (k = 0 is regression, k = L is DR), fitted with the same key.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import time
import typing
from typing import Any, Callable

import yaml

from experiments.config import build_dataclass, load_yaml

__all__ = ["OPLSweep", "load_sweep", "run_sweep", "cells", "method_rows", "load_logging_policy", "import_plugins"]

_SELECTION_METHODS = ("rpod-ope", "rpod-oracle")  # R-POD with k chosen per cell


@dataclasses.dataclass(frozen=True)
class OPLSweep:
    """A sweep config (every grid key takes a list)."""

    simulator: str = "synthetic"  # "synthetic" or "semi_synthetic" (queries of a LETOR file)
    letor_path: str | None = None  # semi_synthetic: the LETOR/SVMlight file
    letor_normalize: str | None = None  # semi_synthetic: None, "minmax" or "zscore" per query
    eta_scale: float = 0.05  # semi_synthetic: sd of the per-document base-reward noise
    forest_fraction: float = 0.1  # semi_synthetic: share of queries training the random forest
    n_items: tuple[int, ...] = (10,)
    ranking_length: tuple[int, ...] = (5,)
    tau: tuple[float, ...] = (1.0,)
    lam: tuple[float, ...] = (0.0, 0.5, 1.0)
    n: tuple[int, ...] = (1000, 2000, 4000, 8000)
    seeds: tuple[int, ...] = tuple(range(10))
    methods: tuple[str, ...] = ("ips", "dr", "iips", "rips", "regression", "rpod")
    ks: tuple[int, ...] | None = None  # R-POD's k; None: every k in 0..L
    reward_models: tuple[str, ...] = ("additive", "pairwise")
    logging_policy: str = "pl"  # "pl" (synthetic: the paper's linear PL / tau), "random_forest"
    # (semi_synthetic: PL over a random forest / tau), "uniform", or "module:function"
    sigma: float = 0.5
    interaction_scale: float = 1.0
    eval_contexts: int = 20_000
    policy_epochs: int = 30
    policy_learning_rate: float = 0.05
    reward_epochs: int = 60
    reward_learning_rate: float = 0.02
    batch_size: int = 256
    n_samples: int = 4
    ope_estimator: str = "dr"  # rpod-ope: the estimator that picks k on held-out rounds
    ope_holdout: float = 0.3
    oracle_noise: tuple[float, ...] = (20.0, 10.0)  # rpod-oracle: Dmax = |V| / each value
    vmap_seeds: bool | str = "auto"  # fit a cell's seeds together, vmapped; auto: on GPU/TPU only
    policy_hidden: tuple[int, ...] = ()  # hidden sizes of the policies' scorers (() = linear)
    reward_hidden: tuple[int, ...] = ()  # hidden sizes of f_hat's item head
    output_dir: str = "results/opl_synthetic"
    plugins: tuple[str, ...] = ()  # modules imported first (and in every worker): they register
    # estimators (opl_rank.opl_estimators.register) or environments (simulators.environments.register)

    def __post_init__(self) -> None:
        import_plugins(self.plugins)
        from opl_rank.learners import learning_methods
        from opl_rank.reward_models import REWARD_MODEL_KINDS

        for name in ("n_items", "ranking_length", "tau", "lam", "n", "seeds", "methods", "reward_models"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        known = list(learning_methods()) + list(_SELECTION_METHODS)
        unknown = sorted(set(self.methods) - set(known))
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; known: {known}")
        from opl_rank.opl_estimators import ESTIMATORS

        usable = [name for name, e in ESTIMATORS.items() if not e.needs_position_marginals]
        if self.ope_estimator not in usable:
            raise ValueError(f"ope_estimator must be one of {usable}, got {self.ope_estimator!r}")
        if not 0.0 < self.ope_holdout < 1.0:
            raise ValueError(f"ope_holdout must be in (0, 1), got {self.ope_holdout}")
        from simulators import environments

        spec = environments.get(self.simulator)
        if spec.check is not None:
            spec.check(self)
        builtin = spec.logging_policies
        if self.logging_policy not in builtin:
            if ":" not in self.logging_policy:
                raise ValueError(f"logging_policy for {self.simulator} must be one of {list(builtin)} or 'module:function', got {self.logging_policy!r}")
            load_logging_policy(self.logging_policy)  # fails early, naming the problem
        if not spec.repeats_contexts and any(kind.endswith("-two-step") for kind in self.reward_models):
            raise ValueError(f"two-step reward models need logged rounds that share a context; simulator "
                             f"{self.simulator!r} never repeats one (use simulator semi_synthetic)")
        if self.vmap_seeds not in (True, False, "auto"):
            raise ValueError(f"vmap_seeds must be true, false or auto, got {self.vmap_seeds!r}")
        if any(v <= 0 for v in self.oracle_noise):
            raise ValueError(f"oracle_noise values must be > 0, got {self.oracle_noise}")
        unknown = sorted(set(self.reward_models) - set(REWARD_MODEL_KINDS))
        if unknown:
            raise ValueError(f"unknown reward model(s) {unknown}; known: {list(REWARD_MODEL_KINDS)}")
        if any(not 0.0 <= v <= 1.0 for v in self.lam):
            raise ValueError(f"lam values must be in [0, 1], got {self.lam}")
        if any(v <= 0 for v in self.tau):
            raise ValueError(f"tau values must be > 0, got {self.tau}")
        if any(v < 1 for v in self.n) or any(s < 0 for s in self.seeds):
            raise ValueError("n values must be >= 1 and seeds >= 0")
        if any(l > d for d in self.n_items for l in self.ranking_length):
            raise ValueError(f"every ranking_length {self.ranking_length} must be <= every n_items {self.n_items}")
        if self.ks is not None and any(k < 0 or k > min(self.ranking_length) for k in self.ks):
            raise ValueError(f"ks must be in [0, L], got {self.ks}")


def import_plugins(modules: tuple[str, ...]) -> None:
    """Import each plugin module (its registrations run on import); errors name the module."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"plugins: cannot import module {name!r} ({err})") from err


def _as_grid(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Scalars become one-element lists; ``"a,b"`` strings (from ``--set``) become lists."""
    hints = typing.get_type_hints(cls)
    out = dict(values)
    for name, value in values.items():
        if "tuple" in str(hints.get(name, "")):
            if isinstance(value, str) and "," in value:
                value = [yaml.safe_load(v) for v in value.split(",")]
            if value is not None and not isinstance(value, (list, tuple)):
                value = [value]
            out[name] = value
    return out


def load_sweep(config_path: str, overrides: dict[str, Any]) -> OPLSweep:
    from experiments.config import resolve_path

    values = load_yaml(config_path)
    values.update(overrides)
    if values.get("letor_path"):  # as written, else relative to the config file
        values["letor_path"] = os.path.abspath(resolve_path(str(values["letor_path"]), config_path))
    return build_dataclass(OPLSweep, _as_grid(OPLSweep, values), source=config_path)


def cells(sweep: OPLSweep) -> list[dict[str, Any]]:
    """Every (D, L, tau, lambda, n, seed) cell, in a stable order."""
    grid = itertools.product(sweep.n_items, sweep.ranking_length, sweep.tau, sweep.lam, sweep.seeds, sweep.n)
    return [dict(D=d, L=l, tau=t, lam=lam, seed=s, n=n) for d, l, t, lam, s, n in grid]


def method_rows(sweep: OPLSweep, n_slots: int) -> list[tuple[str, Any, str]]:
    """(method, k, reward model) of every row of a cell. For ``rpod-oracle`` the middle
    entry is the noise divisor (its k is chosen in the cell); for ``rpod-ope`` it is None."""
    from opl_rank.learners import needs_reward_model

    rows: list[tuple[str, Any, str]] = []
    for method in sweep.methods:
        with_model = method in _SELECTION_METHODS or needs_reward_model(method)
        if not with_model:
            rows.append((method, None, "-"))
        for kind in sweep.reward_models if with_model else ():
            if method == "rpod":
                rows.extend(("rpod", k, kind) for k in _candidate_ks(sweep, n_slots))
            elif method == "rpod-oracle":
                rows.extend(("rpod-oracle", divisor, kind) for divisor in sweep.oracle_noise)
            else:
                rows.append((method, None, kind))
    return rows


def _candidate_ks(sweep: OPLSweep, n_slots: int) -> tuple[int, ...]:
    return tuple(sweep.ks) if sweep.ks is not None else tuple(range(n_slots + 1))


def _cell_name(cell: dict[str, Any]) -> str:
    return "D{D}_L{L}_tau{tau}_lam{lam}_seed{seed}_n{n}".format(**cell)


def load_logging_policy(spec: str) -> Callable:
    """A user's logging policy ``"module:function"``: ``fn(context [n, dx], item_features
    [D, D]) -> logits [n, D]`` (item features are one-hot ids; logits are divided by tau)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"logging_policy must be 'pl', 'uniform' or 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"logging_policy {spec!r}: cannot import module {module_name!r} ({err})") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"logging_policy {spec!r}: module {module_name!r} has no function {attr!r}")
    return fn


@functools.lru_cache(maxsize=128)
def _environment(sweep: OPLSweep, n_items: int, ranking_length: int, tau: float, lam: float, seed: int) -> tuple:
    """The cell's environment (from the registry) and its ground truth V(pi_0), V*
    (shared by every n)."""
    from opl_rank import prng
    from simulators import environments
    from simulators.logging_policies import CallableLogging

    spec = environments.get(sweep.simulator)
    k_env, _, k_eval, _ = prng.split_seed(seed, 4)
    logging_policy: Any = sweep.logging_policy  # a built-in name, else a user's module:function
    if logging_policy not in spec.logging_policies:
        logging_policy = CallableLogging(load_logging_policy(sweep.logging_policy), n_items, temperature=tau)
    env = spec.create(k_env, n_items=n_items, ranking_length=ranking_length, lam=lam, tau=tau,
                      logging_policy=logging_policy, config=sweep)
    v0 = env.logging_policy_value(k_eval, sweep.eval_contexts)
    v_star, star_method = env.optimal_value(k_eval, sweep.eval_contexts)
    return env, v0, v_star, star_method


def _run_group(sweep: OPLSweep, group: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows of cells that differ only in their seed. Every method is fitted on all the
    seeds' data sets at once (vmapped, :func:`opl_rank.learners.fit_seeds`) when
    ``sweep.vmap_seeds`` and there is more than one; a group of one uses :func:`fit`."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from opl_rank import prng
    from opl_rank.learners import LearnerConfig, fit, fit_seeds, needs_position_marginals

    import_plugins(sweep.plugins)  # a worker process has not imported them yet
    from opl_rank.optimization import TrainConfig
    from opl_rank.select_k import select_k

    keys = [prng.split_seed(cell["seed"], 4) for cell in group]
    k_eval = [k[2] for k in keys]
    k_fit = jnp.stack([k[3] for k in keys])
    truth = [_environment(sweep, c["D"], c["L"], c["tau"], c["lam"], c["seed"]) for c in group]
    need_marginals = any(needs_position_marginals(m) for m in sweep.methods if m not in _SELECTION_METHODS)
    datas = [
        env.sample_logged_data(k[1], c["n"], position_marginals="exact" if need_marginals else "none")
        for (env, *_), k, c in zip(truth, keys, group)
    ]
    n_slots = group[0]["L"]
    train = TrainConfig(epochs=sweep.policy_epochs, batch_size=sweep.batch_size, learning_rate=sweep.policy_learning_rate)
    reward = TrainConfig(epochs=sweep.reward_epochs, batch_size=sweep.batch_size, learning_rate=sweep.reward_learning_rate)
    together = len(group) > 1

    item_feature_dim = getattr(truth[0][0], "n_features", None) or None  # semi-synthetic: score items by features

    def config(method, k, kind):
        return LearnerConfig(
            method, k=k, reward_model=kind if kind != "-" else "additive", n_samples=sweep.n_samples,
            train=train, reward_train=reward, policy_hidden=sweep.policy_hidden, reward_hidden=sweep.reward_hidden,
            item_feature_dim=item_feature_dim,
        )

    done: dict[tuple[str, int | None, str], tuple[list[Any], float]] = {}

    def values_of(method, k, kind):
        """([true value per seed], seconds per seed) of one fit, cached; R-POD at k = 0 /
        k = L reuses the regression / DR fit (the same estimator, fitted with the same key)."""
        alias = {0: ("regression", None, kind), n_slots: ("dr", None, kind)}.get(k) if method == "rpod" else None
        key = alias if alias is not None else (method, k, kind)
        if key not in done:
            start = time.perf_counter()
            policies = fit_seeds(datas, k_fit, config(*key)) if together else [fit(datas[0], k_fit[0], config(*key))]
            values = [env.policy_value(p, ke, sweep.eval_contexts) for p, (env, *_), ke in zip(policies, truth, k_eval)]
            done[key] = (values, (time.perf_counter() - start) / len(group))
        return done[key]

    rows: list[list[dict[str, Any]]] = [[] for _ in group]
    candidates = _candidate_ks(sweep, n_slots)
    for method, k, kind in method_rows(sweep, n_slots):
        start = time.perf_counter()
        chosen: list[int | None] = [None] * len(group)
        selector = ""
        if method == "rpod-ope":
            select_keys = jnp.stack([jax.random.fold_in(kf, 1) for kf in k_fit])
            options = dict(ks=candidates, estimator=sweep.ope_estimator, holdout_fraction=sweep.ope_holdout)
            selections = [select_k(d, k, config("rpod", 0, kind), **options) for d, k in zip(datas, select_keys)]
            chosen, selector = [sel.k for sel in selections], f"ope:{sweep.ope_estimator}"
        elif method == "rpod-oracle":  # the paper's oracle: true value plus U(-Dmax, Dmax), Dmax = |V| / divisor
            table = np.array([[v.value for v in values_of("rpod", c, kind)[0]] for c in candidates])  # [K, S]
            for s in range(len(group)):
                noise_key = jax.random.fold_in(jax.random.fold_in(k_fit[s], 2), int(k * 1000))
                noise = np.asarray(jax.random.uniform(noise_key, (len(candidates),), minval=-1.0, maxval=1.0))
                chosen[s] = candidates[int(np.argmax(table[:, s] + noise * np.abs(table[:, s]) / k))]
            selector = f"oracle:V/{k:g}"
        if method in _SELECTION_METHODS:
            values = [values_of("rpod", c, kind)[0][s] for s, c in enumerate(chosen)]
            seconds = (time.perf_counter() - start) / len(group)
            k = None
        else:
            values, seconds = values_of(method, k, kind)
        for s, cell in enumerate(group):
            _, v0, v_star, star_method = truth[s]
            gap = v_star.value - v0.value
            rows[s].append({
                "simulator": sweep.simulator, "logging_policy": sweep.logging_policy, "method": method, "k": k, "reward_model": kind,
                "lambda": cell["lam"], "n": cell["n"], "D": cell["D"], "L": cell["L"], "tau": cell["tau"], "seed": cell["seed"],
                "V": values[s].value, "V_se": values[s].stderr, "V0": v0.value, "V_star": v_star.value,
                "V_star_method": star_method, "normalized_gain": (values[s].value - v0.value) / gap if gap > 0 else math.nan,
                "fit_seconds": seconds, "k_selected": chosen[s], "selector": selector,
            })
    return rows


def _run_cells(sweep: OPLSweep, todo: list[dict[str, Any]], out: str) -> list[tuple[dict[str, Any], list[dict[str, Any]], float]]:
    """Run cells and write each atomically when done; cells that differ only in their seed
    run as one vmapped group (``sweep.vmap_seeds``), the others one by one."""
    from opl_rank.atomic import atomic_write_text

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for cell in todo:
        groups.setdefault(_group_key(sweep, cell), []).append(cell)
    done = []
    for group in groups.values():
        start = time.perf_counter()
        results = _run_group(sweep, group)
        seconds = (time.perf_counter() - start) / len(group)
        for cell, rows in zip(group, results):
            atomic_write_text(_cell_path(out, cell), json.dumps(rows))
            done.append((cell, rows, seconds))
    return done


def _group_key(sweep: OPLSweep, cell: dict[str, Any]) -> tuple:
    """Cells with the same key share shapes and are fitted together (their seeds vmapped)."""
    shape = tuple(cell[k] for k in ("D", "L", "tau", "lam", "n"))
    return shape + (() if sweep.vmap_seeds else (cell["seed"],))


def _cell_path(out: str, cell: dict[str, Any]) -> str:
    return os.path.join(out, "cells", _cell_name(cell) + ".json")


def _describe(cell: dict[str, Any], rows: list[dict[str, Any]], seconds: float) -> str:
    best = max(rows, key=lambda r: r["V"])
    k = "" if best["k"] is None else f"(k={best['k']})"
    return (
        f"{_cell_name(cell)}: V0 {rows[0]['V0']:.3f} V* {rows[0]['V_star']:.3f} "
        f"best {best['method']}{k}/{best['reward_model']} {best['V']:.3f}  {seconds:.1f}s"
    )


def run_sweep(
    sweep: OPLSweep,
    *,
    echo: Callable[[str], None] = print,
    backend: str = "serial",
    workers: int | None = None,
    compilation_cache: str | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run (or resume) every cell; write cells, ``results.csv`` and ``config.yaml``.

    Jobs run on ``backend`` (see :mod:`experiments.executors`); keys come from each cell's
    seed, so the table does not depend on the backend or the order cells finish in.
    ``vmap_seeds="auto"`` is resolved here, once, from this process's JAX backend (vmapped
    on GPU/TPU; on CPU one seed at a time, which measured faster on 2 cores), and the
    resolved value is written to ``config.yaml``.
    """
    import jax

    from experiments.executors import run_jobs
    from opl_rank.atomic import atomic_write_text

    if sweep.vmap_seeds == "auto":
        sweep = dataclasses.replace(sweep, vmap_seeds=jax.default_backend() != "cpu")
    out = sweep.output_dir
    os.makedirs(os.path.join(out, "cells"), exist_ok=True)
    resolved = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(sweep).items()}
    atomic_write_text(os.path.join(out, "config.yaml"), yaml.safe_dump(resolved, sort_keys=False))
    every = cells(sweep)
    todo = [cell for cell in every if not os.path.exists(_cell_path(out, cell))]
    # One job per (D, L, tau, lambda, n): its seeds run vmapped together (with vmap_seeds;
    # else one job per cell). Each process caches the environments' ground truth it computed.
    jobs: dict[tuple, list[dict[str, Any]]] = {}
    for cell in todo:
        jobs.setdefault(_group_key(sweep, cell), []).append(cell)
    start = time.perf_counter()
    finished = len(every) - len(todo)

    def report(job, results):
        nonlocal finished
        for cell, rows, seconds in results:
            finished += 1
            echo(f"[{finished}/{len(every)}] {_describe(cell, rows, seconds)}  (elapsed {time.perf_counter() - start:.0f}s)")

    run_jobs(
        _run_cells, [(sweep, group, out) for group in jobs.values()], report,
        backend=backend, workers=workers, compilation_cache=compilation_cache, ray_address=ray_address,
    )
    rows: list[dict[str, Any]] = []
    for cell in every:  # read back in grid order: the table does not depend on the backend
        with open(_cell_path(out, cell), encoding="utf-8") as f:
            rows.extend(json.load(f))
    columns = list(dict.fromkeys(c for r in rows for c in r))  # cells written by older versions lack new columns
    lines = [",".join(columns)] + [",".join("" if r.get(c) is None else str(r[c]) for c in columns) for r in rows]
    atomic_write_text(os.path.join(out, "results.csv"), "\n".join(lines) + "\n")
    parquet = _write_parquet(rows, columns, os.path.join(out, "results.parquet"), echo)
    plots = _plots(rows, os.path.join(out, "plots"), echo)
    return {
        "cells": len(every), "resumed": len(every) - len(todo), "rows": len(rows), "backend": backend,
        "seconds": time.perf_counter() - start, "results": os.path.join(out, "results.csv"), "parquet": parquet, "plots": len(plots),
    }


def _write_parquet(rows: list[dict[str, Any]], columns: list[str], path: str, echo: Callable[[str], None]) -> bool:
    """``results.parquet`` (atomically) when pandas and pyarrow are installed."""
    try:
        import pandas as pd
        import pyarrow  # noqa: F401
    except ImportError:
        echo("results.parquet skipped: needs pandas and pyarrow (pip install pandas pyarrow)")
        return False
    import io

    from opl_rank.atomic import atomic_write

    frame = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    for name in ("k", "k_selected"):
        if name in frame:
            frame[name] = frame[name].astype("Int64")  # integers with missing values
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write(path, lambda f: f.write(buffer.getvalue()))
    return True


def _plots(rows: list[dict[str, Any]], out_dir: str, echo: Callable[[str], None]) -> list[str]:
    """The standard PNGs (skipped, with a note, when matplotlib is not installed)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        echo("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return []
    from experiments.plots import write_plots

    return write_plots(rows, out_dir)
