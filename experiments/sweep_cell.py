"""The maths of the OPL sweep: cells in, rows out (no files, no printing).

A cell is one (D, L, tau, lambda, n, seed, *axes): one environment, one logged data set, every
method fitted on it, and the ground truth -- V(pi), V(pi_0), V* -- on one shared set of
evaluation contexts (paired comparisons). [`run_group`][run_group] takes cells that differ only
in their seed: every method is fitted on all of their data sets at once, vmapped over
seeds, when ``vmap_seeds`` is on. Keys come from each cell's seed, never from the order
cells run in.

Rows for R-POD at k = 0 and k = L reuse the regression and DR fits of the same cell: they
are the same estimators (k = 0 is regression, k = L is DR), fitted with the same key.
[`check_rows`][check_rows] says whether a list of rows is what [`run_group`][run_group] writes for a cell.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

from experiments.sweep_config import (
    SELECTION_METHODS,
    OPLSweep,
    candidate_ks,
    cell_config,
    cell_env_options,
    method_rows,
    row_axis_columns,
)
from experiments.user_code import import_plugins, load_callable

__all__ = ["run_group", "group_steps", "check_rows", "row_columns", "ROW_COLUMNS"]

ROW_COLUMNS = (
    "simulator",
    "logging_policy",
    "method",
    "k",
    "reward_model",
    "lambda",
    "n",
    "D",
    "L",
    "tau",
    "seed",
    "V",
    "V_se",
    "V0",
    "V_star",
    "V_star_method",
    "normalized_gain",
    "fit_seconds",
    "k_selected",
    "selector",
)
# With ``diagnostics: true``: R-POD's two error sources per row (opl_rank.opl.diagnostics):
# E|Delta_q - Delta_f_hat| over pairs sharing the row's top k, its scale E|Delta_q|, and the
# top-k weights' ESS over n on the logged rounds (NaN where a row has no such quantity).
DIAGNOSTIC_COLUMNS = ("cpc_violation", "cpc_scale", "ess_fraction")
# The columns of a row that say which fit it is or what it measured; the others (simulator,
# logging policy, D, L, tau, lambda, n and the declared axes) are its setting.
OUTCOME_COLUMNS = (
    tuple(c for c in ROW_COLUMNS if c not in ("simulator", "logging_policy", "lambda", "n", "D", "L", "tau"))
    + DIAGNOSTIC_COLUMNS
)
DIAGNOSTIC_CONTEXTS = 2000  # contexts x 4 pairs each for the CPC violation
DIAGNOSTIC_PAIRS = 4
_CELL_COLUMNS = {"D": "D", "L": "L", "tau": "tau", "lam": "lambda", "seed": "seed", "n": "n"}  # cell key -> row column


def row_columns(sweep: OPLSweep) -> tuple[str, ...]:
    """A row's columns: [`ROW_COLUMNS`][ROW_COLUMNS] with one column per declared axis after ``seed``
    (and [`DIAGNOSTIC_COLUMNS`][DIAGNOSTIC_COLUMNS] last with ``diagnostics``)."""
    at = ROW_COLUMNS.index("seed") + 1
    extra = DIAGNOSTIC_COLUMNS if sweep.diagnostics else ()
    return ROW_COLUMNS[:at] + row_axis_columns(sweep) + ROW_COLUMNS[at:] + extra


@functools.lru_cache(maxsize=128)
def _cell_environment(
    sweep: OPLSweep, n_items: int, ranking_length: int, tau: float, lam: float, seed: int, options: tuple = ()
) -> Any:
    """The cell's environment (from the registry, with the cell's simulator ``options``; shared
    by every n)."""
    from opl_rank import prng
    from simulators import environments
    from simulators.logging_policies import CallableLogging

    spec = environments.get(sweep.simulator)
    k_env = prng.split_seed(seed, 4)[0]
    logging_policy: Any = sweep.logging_policy  # a built-in name, else a user's module:function
    if logging_policy not in spec.logging_policies:
        fn = load_callable(sweep.logging_policy, what="logging_policy")
        logging_policy = CallableLogging(fn, n_items, temperature=tau)
    env = environments.create(
        sweep.simulator,
        k_env,
        n_items=n_items,
        ranking_length=ranking_length,
        lam=lam,
        tau=tau,
        logging_policy=logging_policy,
        config=sweep,
        options=dict(options),
    )
    return env


@functools.lru_cache(maxsize=128)
def _environment(
    sweep: OPLSweep, n_items: int, ranking_length: int, tau: float, lam: float, seed: int, options: tuple = ()
) -> tuple:
    """The cell's environment ([`_cell_environment`][_cell_environment]) and its ground truth
    ``(env, V(pi_0), V*, V*'s method)`` (shared by every n)."""
    from opl_rank import prng

    env = _cell_environment(sweep, n_items, ranking_length, tau, lam, seed, options)
    k_eval = prng.split_seed(seed, 4)[2]
    v0 = env.logging_policy_value(k_eval, sweep.eval_contexts)
    v_star, star_method = env.optimal_value(k_eval, sweep.eval_contexts)
    return env, v0, v_star, star_method


def run_group(
    sweep: OPLSweep,
    group: list[dict[str, Any]],
    *,
    on_step: Callable[[str], None] | None = None,
    on_epoch: Callable[[str, int, dict[str, float]], None] | None = None,
    lane: int = 0,
) -> list[list[dict[str, Any]]]:
    """Rows of cells that differ only in their seed (so share every axis but the seed). Every method is fitted on all the
    seeds' data sets at once (vmapped, [`opl_rank.opl.learners.fit_seeds`][opl_rank.opl.learners.fit_seeds]) when
    ``sweep.vmap_seeds`` and there is more than one; a group of one uses [`fit`][opl_rank.opl.learners.fit].

    ``on_step(label)`` is called as each of the [`group_steps`][group_steps] steps starts, and
    ``on_epoch(part, epoch, record)`` after every epoch of a fit (progress only).

    ``lane``: the rows are fitted in [`fit_order`][fit_order]``(rows, lane)`` and returned in
    [`method_rows`][experiments.sweep_config.method_rows]' order; lanes other than 0 compute
    the ground truth last instead of first. Groups running at once in one process (the threads
    backend) and worker processes take different lanes, so on an empty cache they compile
    different programs at the same time instead of waiting on each other's (or, in processes,
    compiling the same ones twice); a row does not depend on the order (every fit's and the
    ground truth's keys come from the cell's seed)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from opl_rank import prng
    from opl_rank.opl.learners import (
        LearnerConfig,
        fit,
        fit_reward,
        fit_reward_seeds,
        fit_seeds,
        needs_position_marginals,
        shares_reward_model,
    )

    import_plugins(sweep.plugins)  # a worker process has not imported them yet
    axes = row_axis_columns(sweep)
    options = tuple(sorted(cell_env_options(sweep, group[0]).items()))
    sweep = cell_config(sweep, group[0])  # the group's values of the config axes (policy_epochs, ...)
    from opl_rank.opl.select_k import select_k
    from opl_rank.optimization import TrainConfig

    keys = [prng.split_seed(cell["seed"], 4) for cell in group]
    k_eval = [k[2] for k in keys]
    k_fit = jnp.stack([k[3] for k in keys])
    step = on_step or (lambda label: None)
    cells = [(c["D"], c["L"], c["tau"], c["lam"], c["seed"], options) for c in group]

    def ground_truth() -> list[tuple]:
        step("ground truth V(pi_0), V*")
        return [_environment(sweep, *cell) for cell in cells]

    # Lane 0 starts with the ground truth; another lane leaves it for last, so on an empty
    # cache it compiles the logging and fitting programs meanwhile instead of waiting for
    # lane 0's ground-truth programs (`fit_order`).
    truth = ground_truth() if lane == 0 else None
    step(f"logging {group[0]['n']} rounds")
    envs = [_cell_environment(sweep, *cell) for cell in cells]
    need_marginals = any(needs_position_marginals(m) for m in sweep.methods if m not in SELECTION_METHODS)
    # aips needs the logging policy's logits for non-prefix behaviours: only asked where it is run
    extra = {"logging_logits": True} if "aips" in sweep.methods else {}
    datas = [
        env.sample_logged_data(k[1], c["n"], position_marginals="exact" if need_marginals else "none", **extra)
        for env, k, c in zip(envs, keys, group)
    ]
    n_slots = group[0]["L"]
    train = TrainConfig(
        epochs=sweep.policy_epochs,
        batch_size=sweep.batch_size,
        learning_rate=sweep.policy_learning_rate,
        devices=sweep.devices,
        patience=sweep.policy_patience,
    )
    reward = TrainConfig(
        epochs=sweep.reward_epochs,
        batch_size=sweep.batch_size,
        learning_rate=sweep.reward_learning_rate,
        devices=sweep.devices,
        patience=sweep.reward_patience,
    )
    together = len(group) > 1

    item_feature_dim = getattr(envs[0], "n_features", None) or None  # semi-synthetic: score items by features

    def config(method, k, kind):
        return LearnerConfig(
            method,
            k=k,
            reward_model=kind if kind != "-" else "additive",
            n_samples=sweep.n_samples,
            train=train,
            reward_train=reward,
            policy_hidden=sweep.policy_hidden,
            reward_hidden=sweep.reward_hidden,
            item_feature_dim=item_feature_dim,
            slot_marginals=sweep.slot_marginals or "auto",
            estimator_options=dict(sweep.estimator_options or ()).get(method),
            valid_fraction=sweep.valid_fraction,
        )

    done: dict[tuple[str, int | None, str], tuple[list[Any], float, list[dict[str, float]]]] = {}

    def fit_key(method, k, kind):
        """The fit a row reads: R-POD at k = 0 / k = L is the regression / DR fit (the same
        estimator, fitted with the same key)."""
        alias = {0: ("regression", None, kind), n_slots: ("dr", None, kind)}.get(k) if method == "rpod" else None
        return alias if alias is not None else (method, k, kind)

    def values_of(method, k, kind):
        """([true value per seed], seconds per seed) of one fit (`fit_key`), cached
        in ``done`` with its diagnostics per seed."""
        key = fit_key(method, k, kind)
        if key not in done:
            reward_params, reward_seconds = shared_reward(*key)
            start = time.perf_counter()
            if together:
                policies = fit_seeds(datas, k_fit, config(*key), on_epoch=on_epoch, reward_params=reward_params)
            else:
                policies = [fit(datas[0], k_fit[0], config(*key), on_epoch=on_epoch, reward_params=reward_params)]
            values = [env.policy_value(p, ke, sweep.eval_contexts) for p, env, ke in zip(policies, envs, k_eval)]
            seconds = reward_seconds + (time.perf_counter() - start) / len(group)
            measured = [
                _diagnostics(env, p, d, key[0], n_slots if key[0] == "dr" else key[1], ke) if sweep.diagnostics else {}
                for p, env, d, ke in zip(policies, envs, datas, k_eval)
            ]
            done[key] = (values, seconds, measured)
        return done[key][:2]

    rewards: dict[str, tuple[Any, float]] = {}

    def shared_reward(method, k, kind):
        """(f_hat's parameters, seconds per seed) of the cell's one-step f_hat of ``kind``,
        fitted once for every built-in method that fits it (the same fit each would make:
        same data, key and settings); (None, 0) for the others, which fit their own."""
        if not shares_reward_model(config(method, k, kind)):
            return None, 0.0
        if kind not in rewards:
            start = time.perf_counter()
            reward_config = config("regression", None, kind)
            if together:
                params = fit_reward_seeds(datas, k_fit, reward_config)
            else:
                params = fit_reward(datas[0], k_fit[0], reward_config)
            rewards[kind] = (params, (time.perf_counter() - start) / len(group))
        return rewards[kind]

    def diagnosed(method, k, kind, s, *, selected=False):
        """Seed ``s``'s diagnostic columns of a fitted row ({} without ``diagnostics``); a
        selection row (``selected``) has those of the R-POD fit at the k it chose."""
        if not sweep.diagnostics:
            return {}
        if selected and k is None:  # a selection row that chose no k
            return dict.fromkeys(DIAGNOSTIC_COLUMNS, math.nan)
        values_of(method, k, kind)
        return done[fit_key(method, k, kind)][2][s]

    specs = method_rows(sweep, n_slots)
    fitted: dict[int, tuple] = {}  # row index -> what its fit gave, filled in fit order
    candidates = candidate_ks(sweep, n_slots)
    for index in fit_order(len(specs), lane):
        method, k, kind = specs[index]
        step(
            f"{method}{'' if k is None else f'(V/{k:g})' if method == 'rpod-oracle' else f'(k={k})'}"
            f"{'' if kind == '-' else '/' + kind}"
        )
        start = time.perf_counter()
        chosen: list[int | None] = [None] * len(group)
        selector = ""
        if method == "rpod-ope":
            select_keys = jnp.stack([jax.random.fold_in(kf, 1) for kf in k_fit])
            selection = dict(ks=candidates, estimator=sweep.ope_estimator, holdout_fraction=sweep.ope_holdout)
            selector = f"ope:{sweep.ope_estimator}"
            for s, (d, key) in enumerate(zip(datas, select_keys)):
                try:
                    chosen[s] = select_k(d, key, config("rpod", 0, kind), **selection).k
                except ValueError as err:  # no candidate k is estimable on the hold-out: a row that says so
                    if "estimable" not in str(err):
                        raise
                    selector = f"ope:{sweep.ope_estimator} (no k estimable)"
        elif method == "rpod-oracle":  # the paper's oracle: true value plus U(-Dmax, Dmax), Dmax = |V| / divisor
            table = np.array([[v.value for v in values_of("rpod", c, kind)[0]] for c in candidates])  # [K, S]
            for s in range(len(group)):
                noise_key = jax.random.fold_in(jax.random.fold_in(k_fit[s], 2), int(k * 1000))
                noise = np.asarray(jax.random.uniform(noise_key, (len(candidates),), minval=-1.0, maxval=1.0))
                chosen[s] = candidates[int(np.argmax(table[:, s] + noise * np.abs(table[:, s]) / k))]
            selector = f"oracle:V/{k:g}"
        if method in SELECTION_METHODS:
            from simulators.rollout import PolicyValue

            unknown = PolicyValue(math.nan, math.nan, 0)  # no k chosen: no value (never a silent k)
            values = [unknown if c is None else values_of("rpod", c, kind)[0][s] for s, c in enumerate(chosen)]
            seconds = (time.perf_counter() - start) / len(group)
            measured = [diagnosed("rpod", c, kind, s, selected=True) for s, c in enumerate(chosen)]
            k = None
        else:
            values, seconds = values_of(method, k, kind)
            measured = [diagnosed(method, k, kind, s) for s in range(len(group))]
        fitted[index] = (method, k, kind, values, seconds, chosen, selector, measured)
    if truth is None:
        truth = ground_truth()
    rows: list[list[dict[str, Any]]] = [[] for _ in group]
    for index in range(len(specs)):  # row order
        method, k, kind, values, seconds, chosen, selector, measured = fitted[index]
        for s, cell in enumerate(group):
            _, v0, v_star, star_method = truth[s]
            gap = v_star.value - v0.value
            rows[s].append(
                {
                    "simulator": sweep.simulator,
                    "logging_policy": sweep.logging_policy,
                    "method": method,
                    "k": k,
                    "reward_model": kind,
                    "lambda": cell["lam"],
                    "n": cell["n"],
                    "D": cell["D"],
                    "L": cell["L"],
                    "tau": cell["tau"],
                    "seed": cell["seed"],
                    **{name: cell[name] for name in axes},
                    "V": values[s].value,
                    "V_se": values[s].stderr,
                    "V0": v0.value,
                    "V_star": v_star.value,
                    "V_star_method": star_method,
                    "normalized_gain": (values[s].value - v0.value) / gap if gap > 0 else math.nan,
                    "fit_seconds": seconds,
                    "k_selected": chosen[s],
                    "selector": selector,
                    **measured[s],
                }
            )
    return rows


def _diagnostics(env: Any, policy: Any, data: Any, method: str, k: int | None, key: Any) -> dict[str, float]:
    """R-POD's two error sources for one fitted policy ([`DIAGNOSTIC_COLUMNS`][DIAGNOSTIC_COLUMNS]):
    the CPC violation of its f_hat at its k, on the environment's exact q over
    [`DIAGNOSTIC_CONTEXTS`][DIAGNOSTIC_CONTEXTS] fresh contexts (NaN without an f_hat, 0 at
    k = L), and the ESS of its top-k weights on the logged rounds (1 at k = 0, NaN for a
    policy without PL propensities). Methods other than regression (k = 0), rpod and the
    policy-based ones (k = L) get NaN for the CPC violation."""
    import jax
    import jax.numpy as jnp

    from opl_rank.opl import diagnostics

    n_slots = data.ranking_length
    k = {"regression": 0}.get(method, k)
    nan = math.nan
    out = {"cpc_violation": nan, "cpc_scale": nan, "ess_fraction": nan}
    f_hat = getattr(policy, "reward_model", None)
    if k is not None and all(hasattr(env, a) for a in ("sample_contexts", "logging_logits", "expected_reward")):
        k_ctx, k_pairs = jax.random.split(jax.random.fold_in(key, 7))
        context = env.sample_contexts(k_ctx, DIAGNOSTIC_CONTEXTS)
        a, b = diagnostics.shared_prefix_pairs(
            k_pairs, env.logging_logits(context), k, n_slots, DIAGNOSTIC_PAIRS
        )  # [P, m, L]
        tiled = jnp.broadcast_to(context, (DIAGNOSTIC_PAIRS,) + context.shape).reshape(-1, context.shape[-1])
        weight = jnp.asarray(data.position_weight, jnp.float32)

        def q(r):
            return env.expected_reward(tiled, r.reshape(-1, n_slots)) @ weight

        if k == n_slots:  # pairs sharing the whole ranking: CPC asks nothing
            out["cpc_violation"], out["cpc_scale"] = 0.0, 0.0
        elif f_hat is not None:
            violation, scale = diagnostics.cpc_violation(
                q(a), q(b), f_hat.predict(tiled, a.reshape(-1, n_slots)), f_hat.predict(tiled, b.reshape(-1, n_slots))
            )
            out["cpc_violation"], out["cpc_scale"] = float(violation), float(scale)
    stage = getattr(policy, "pl_stage", None)
    if k == 0:
        out["ess_fraction"] = 1.0
    elif stage is not None:
        log_pi = stage.log_prob(data.context, data.ranking, where=data.item_mask)
        log_w = diagnostics.log_prefix_weights(log_pi, data.log_pi0_prefix, stage.n_slots)
        out["ess_fraction"] = float(diagnostics.ess_fraction(log_w))
    return out


def fit_order(n_rows: int, lane: int) -> list[int]:
    """The order in which [`run_group`][run_group] fits its ``n_rows`` rows: row order rotated
    to start at the fraction ``vdc(lane)`` of the rows, the van der Corput sequence (lane 0
    at the first row, 1 half-way, 2 a quarter in, 3 three quarters in, ...), which spreads
    any number of lanes' starts evenly without knowing how many there are."""
    if isinstance(lane, bool) or not isinstance(lane, int) or lane < 0:
        raise ValueError(f"lane must be an int >= 0, got {lane!r}")  # a negative lane never shifts to 0
    fraction, scale, rest = 0.0, 0.5, lane
    while rest:
        fraction, rest, scale = fraction + scale * (rest & 1), rest >> 1, scale / 2
    start = int(n_rows * fraction)
    return [(start + i) % n_rows for i in range(n_rows)] if n_rows else []


def group_steps(sweep: OPLSweep, n_slots: int) -> int:
    """How many times [`run_group`][run_group] calls ``on_step``: the ground truth, the logged data
    and one per row of [`method_rows`][method_rows]."""
    return 2 + len(method_rows(sweep, n_slots))


def check_rows(sweep: OPLSweep, cell: dict[str, Any], rows: Any) -> str | None:
    """None when ``rows`` are what [`run_group`][run_group] writes for ``cell``; else the problem."""
    expected = method_rows(sweep, cell["L"])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "rows are not a list of objects"
    if len(rows) != len(expected):
        return f"{len(rows)} rows, expected {len(expected)}"
    columns = row_columns(sweep)
    cell_columns = {**_CELL_COLUMNS, **{name: name for name in row_axis_columns(sweep)}}
    for i, (row, (method, k, kind)) in enumerate(zip(rows, expected)):
        missing = [c for c in columns if c not in row]
        if missing:
            return f"row {i} lacks column(s) {missing}"
        k_written = None if method in SELECTION_METHODS else k
        if (row["method"], row["k"], row["reward_model"]) != (method, k_written, kind):
            return f"row {i} is {(row['method'], row['k'], row['reward_model'])}, expected {(method, k_written, kind)}"
        wrong = [col for key, col in cell_columns.items() if row[col] != cell[key]]
        if wrong:
            return f"row {i} belongs to another cell ({', '.join(f'{c}={row[c]!r}' for c in wrong)})"
    return None
