"""``opl-rank sweep``: the R-POD paper's OPL benchmark over k, lambda, n, D, L, tau, seeds and any declared axis.

This module runs a sweep; the pieces live one idea per module:

* [`experiments.sweep_config`][experiments.sweep_config]: the [`OPLSweep`][OPLSweep] config, its grid ([`cells`][cells])
  and the rows of each cell ([`method_rows`][method_rows]);
* [`experiments.sweep_cell`][experiments.sweep_cell]: the maths, cells in and rows out ([`run_group`][run_group]);
* [`experiments.resume`][experiments.resume]: the locked output folder, its ``config.yaml``, and cell files
  stamped with the config's hash;
* [`experiments.tables`][experiments.tables]: ``results.csv`` / ``results.parquet``;
* [`experiments.executors`][experiments.executors]: where jobs run (serial, processes, Ray).

Cells that differ only in their seed share shapes and run as one group (vmapped over seeds
with ``vmap_seeds``). Each finished cell is written atomically as ``cells/<cell>.json``; a
stopped sweep resumes and reuses the finished cells of the same config (bad or foreign cell
files are named and recomputed). At the end all rows are gathered into ``results.csv``
(one tidy row per method, k, reward model and cell) next to the resolved ``config.yaml``,
``results.parquet`` (with pandas and pyarrow) and the standard plots (with matplotlib).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from experiments.resume import BadCell, RunFolder, StaleCell, open_run_folder, opl_rank_version, read_cell, write_cell
from experiments.sweep_cell import check_rows, group_steps, run_group
from experiments.sweep_config import (
    CELL_KEYS,
    NOT_HASHED,
    SELECTION_METHODS,
    OPLSweep,
    cell_config,
    cell_name,
    cells,
    group_key,
    load_sweep,
    method_rows,
    resolved_config,
    shape_key,
)
from experiments.tables import write_tables
from experiments.user_code import import_plugins

__all__ = [
    "OPLSweep",
    "load_sweep",
    "run_sweep",
    "choose_backend",
    "cells",
    "method_rows",
    "import_plugins",
    "run_group",
]


def _memory_mappings() -> int | None:
    """This process's count of memory mappings (Linux ``/proc/self/maps``; None elsewhere)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


def _release_programs_if_many_mappings(limit: int | None = None) -> None:
    """Drop JAX's in-process caches of compiled programs once this process holds more than
    ``limit`` (default ``tuning.SWEEP_MAX_MAPPINGS``) memory mappings: every loaded program
    keeps its code mapped (three mappings per compiled object), and at Linux's default limit
    of 65,530 (``vm.max_map_count``) XLA cannot map new code. The next cell loads its programs
    from the persistent compilation cache again; results do not change."""
    if _too_many_mappings(limit):
        import gc

        import jax

        jax.clear_caches()
        gc.collect()


def _too_many_mappings(limit: int | None = None) -> bool:
    from opl_rank import tuning

    count = _memory_mappings()
    return count is not None and count > (tuning.SWEEP_MAX_MAPPINGS if limit is None else limit)


class _CellGate:
    """Where a job's cell groups start. With the ``threads`` backend several run at once in
    one process; dropping the process's programs (the mapping guard) then waits until no
    group runs, and groups wait to start while it is due. One job at a time (serial, a
    worker process): the guard runs at once.

    A group of other shapes than the last one started here (``shape``, from
    [`shape_key`][experiments.sweep_config.shape_key]) needs programs of its own, and the
    jobs come in shape order, so the last shape's programs are not needed again: they are
    dropped already above half the limit. Without that, a D = 10 grid's process crossed the
    limit in the middle of a shape's cells and traced that shape's programs twice."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._lanes: set[int] = set()
        self._shape: tuple | None = None

    def _limit(self, shape: tuple | None) -> int:
        from opl_rank import tuning

        new_shape = shape is not None and self._shape is not None and shape != self._shape
        return tuning.SWEEP_MAX_MAPPINGS // 2 if new_shape else tuning.SWEEP_MAX_MAPPINGS

    @contextlib.contextmanager
    def group(self, shape: tuple | None = None) -> Iterator[int]:
        """Hold the gate while a group runs; yields the group's lane, the smallest not held by
        another running group ([`experiments.sweep_cell.fit_order`][experiments.sweep_cell.fit_order])."""
        with self._changed:
            while self._running and _too_many_mappings(self._limit(shape)):
                self._changed.wait()
            if not self._running:
                _release_programs_if_many_mappings(self._limit(shape))
            self._shape = shape if shape is not None else self._shape
            self._running += 1
            lane = min(set(range(len(self._lanes) + 1)) - self._lanes)
            self._lanes.add(lane)
        try:
            yield lane
        finally:
            with self._changed:
                self._lanes.discard(lane)
                self._running -= 1
                self._changed.notify_all()


_GATE = _CellGate()


def _run_cells(
    sweep: OPLSweep, todo: list[dict[str, Any]], folder: RunFolder, progress: bool = False
) -> list[tuple[dict[str, Any], list[dict[str, Any]], float]]:
    """A job: run cells and write each atomically when done; cells that differ only in their
    seed run as one vmapped group (``sweep.vmap_seeds``), the others one by one. ``progress``:
    a bar over each group's steps (ground truth, data, every fit) on stderr."""
    from experiments.executors import worker_lane
    from experiments.progress import Steps, bar

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for cell in todo:
        groups.setdefault(group_key(sweep, cell), []).append(cell)
    done = []
    for group in groups.values():
        start = time.perf_counter()
        name = cell_name(group[0]) + (f" +{len(group) - 1} seed(s)" if len(group) > 1 else "")
        with (
            _GATE.group(shape_key(sweep, group[0])) as lane,
            bar(group_steps(sweep, group[0]["L"]), desc=name, unit="step", enabled=progress) as cell_bar,
        ):
            steps = Steps(cell_bar)
            own = cell_config(sweep, group[0])  # its policy_epochs / reward_epochs when they are axes
            epochs = steps.epochs({"reward": own.reward_epochs, "policy": own.policy_epochs})
            # a lane per group running in this process (threads) or per worker process
            results = run_group(sweep, group, on_step=steps, on_epoch=epochs, lane=lane + worker_lane())
            steps.done()
        seconds = (time.perf_counter() - start) / len(group)
        for cell, rows in zip(group, results):
            write_cell(folder.cell_path(cell_name(cell)), cell=cell, rows=rows, config_hash=folder.config_hash)
            done.append((cell, rows, seconds))
    return done


def _job_bytes(sweep: OPLSweep) -> int:
    """Peak bytes of the logged data of the sweep's largest job (a lower bound: contexts of
    the synthetic environment's dx = 5; larger contexts are checked again when a cell
    simulates)."""
    from opl_rank import memory
    from opl_rank.opl.learners import needs_position_marginals

    marginals = any(needs_position_marginals(m) for m in sweep.methods if m not in SELECTION_METHODS)
    together = len(sweep.seeds) if sweep.vmap_seeds else 1
    n, n_items, n_slots = max(sweep.n), max(sweep.n_items), max(sweep.ranking_length)
    return (
        memory.ASSEMBLY_COPIES
        * together
        * memory.logged_data_bytes(n, n_items, n_slots, 5, position_marginals=marginals)
    )


def _check_memory(sweep: OPLSweep, at_once: int = 1) -> None:
    """Refuse, before any work, a grid whose largest cell's logged data cannot fit, ``at_once``
    jobs at a time (threads or worker processes)."""
    from opl_rank import memory

    together = len(sweep.seeds) if sweep.vmap_seeds else 1
    n, n_items, n_slots = max(sweep.n), max(sweep.n_items), max(sweep.ranking_length)
    memory.require(
        at_once * _job_bytes(sweep),
        f"the sweep's largest cell (n={n:,}, D={n_items}, L={n_slots}"
        f"{f', {together} seeds at once' if together > 1 else ''}"
        f"{f', {at_once} cells at a time' if at_once > 1 else ''})",
        "use a smaller n"
        + (" or vmap_seeds: false" if together > 1 else "")
        + (" or fewer --workers" if at_once > 1 else ""),
    )


def _check_backend(backend: str) -> None:
    from experiments.executors import BACKENDS

    if backend not in ("auto",) + BACKENDS:
        raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {backend!r}")


def choose_backend(sweep: OPLSweep, backend: str, workers: int | None, n_jobs: int) -> tuple[str, int]:
    """The backend and number of jobs at a time a sweep of ``n_jobs`` jobs runs with.

    ``auto`` (the command line's default): cells in threads of this process, one per CPU
    core, when JAX computes on the CPU, there are two or more jobs and cores, and that many
    jobs' logged data fit in the available memory (at least two); else ``serial``. Threads
    share the process's compiled programs and keep both of 2 cores busy: the small preset
    ran 15% faster than serially (docs/performance.md §22, §25). On a GPU one job at a
    time already fills the device. An explicit backend is kept; its worker count
    (default: the CPU count) is capped at ``n_jobs``."""
    import os

    _check_backend(backend)
    cores = os.cpu_count() or 1
    if backend == "serial":
        return "serial", 1
    if backend != "auto":
        return backend, max(1, min(workers or cores, n_jobs))
    import jax

    from opl_rank import memory

    at_once = min(workers or cores, n_jobs)
    available = memory.available_bytes()
    if available is not None:
        at_once = min(at_once, available // max(1, _job_bytes(sweep)))
    if jax.default_backend() != "cpu" or at_once < 2:
        return "serial", 1
    return "threads", int(at_once)


def _describe(cell: dict[str, Any], rows: list[dict[str, Any]], seconds: float) -> str:
    best = max(rows, key=lambda r: r["V"])
    k = "" if best["k"] is None else f"(k={best['k']})"
    return (
        f"{cell_name(cell)}: V0 {rows[0]['V0']:.3f} V* {rows[0]['V_star']:.3f} "
        f"best {best['method']}{k}/{best['reward_model']} {best['V']:.3f}  {seconds:.1f}s"
    )


def _read(
    sweep: OPLSweep, folder: RunFolder, cell: dict[str, Any], *, any_version: bool = False
) -> list[dict[str, Any]]:
    return read_cell(
        folder.cell_path(cell_name(cell)),
        config_hash=folder.config_hash,
        cell=cell,
        check_rows=lambda rows: check_rows(sweep, cell, rows),
        any_version=any_version,
    )


def run_sweep(
    sweep: OPLSweep,
    *,
    echo: Callable[[str], None] = print,
    backend: str = "auto",
    workers: int | None = None,
    compilation_cache: str | None = None,
    ray_address: str | None = None,
    new_config: bool = False,
    progress: bool = False,
    recompute_stale: bool = False,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) every cell; write cells, ``results.csv`` and ``config.yaml``.

    Jobs run on ``backend`` (see [`experiments.executors`][experiments.executors]; ``auto``: threads on a
    CPU with two or more cores, else serial, [`choose_backend`][choose_backend]); keys come from each cell's
    seed, so the table does not depend on the backend or the order cells finish in.
    ``vmap_seeds="auto"`` is resolved here, once, from this process's JAX backend (vmapped
    on GPU/TPU; on CPU one seed at a time, which measured faster on 2 cores), and the
    resolved value is written to ``config.yaml``.

    The output folder is locked for the run. If its ``config.yaml`` holds another config the
    sweep stops before any work (``ValueError`` naming the differing keys), unless
    ``new_config``: then it runs in ``output_dir/config-<hash8>/``.

    ``progress``: bars on stderr ([`experiments.progress`][experiments.progress]): one over the cells and, in
    this process (serial, threads), one over the steps of each running cell (ground truth, data,
    each fit).

    Cells written by another opl_rank version (each cell file records it) are not reused:
    the sweep stops before any work with a ``ValueError`` naming the versions, unless
    ``recompute_stale``, which recomputes them (CHANGELOG.md says which versions changed results).

    ``status``: a dict this run fills with its ``folder`` and number of ``cells`` as soon as
    they are known (the command line's Ctrl-C line reads it).
    """
    import jax

    from experiments.executors import run_jobs
    from experiments.progress import bar

    _check_backend(backend)  # before the output folder is made
    if sweep.vmap_seeds == "auto":
        sweep = dataclasses.replace(sweep, vmap_seeds=jax.default_backend() != "cpu")
    _check_memory(sweep)
    with open_run_folder(
        sweep.output_dir, resolved_config(sweep), new_config=new_config, echo=echo, exclude=NOT_HASHED, grid=CELL_KEYS
    ) as folder:
        sweep = dataclasses.replace(sweep, output_dir=folder.path)
        every = cells(sweep)
        if status is not None:
            status.update(folder=folder.path, cells=len(every))
        todo, stale = [], []
        for cell in every:
            try:
                _read(sweep, folder, cell)
            except StaleCell as bad:
                stale.append(bad)
                todo.append(cell)
            except BadCell as bad:
                if not isinstance(bad.__cause__, FileNotFoundError):
                    echo(f"cell file {bad}: recomputing it")
                todo.append(cell)
        if stale:
            versions = sorted({bad.version for bad in stale})
            if not recompute_stale:
                raise ValueError(
                    f"{folder.path}: {len(stale)} of {len(every)} cell file(s) were written by opl_rank "
                    f"{', '.join(versions)}, not by this {opl_rank_version()} (e.g. {stale[0].path}); their rows may "
                    "differ from what this version computes. Rerun with --recompute-stale to recompute them, "
                    "or use another output_dir"
                )
            echo(f"--recompute-stale: recomputing {len(stale)} cell(s) written by opl_rank {', '.join(versions)}")
        # One job per (D, L, tau, lambda, n): its seeds run vmapped together (with vmap_seeds;
        # else one job per cell). Each process caches the environments' ground truth it computed.
        jobs: dict[tuple, list[dict[str, Any]]] = {}
        for cell in todo:
            jobs.setdefault(group_key(sweep, cell), []).append(cell)
        backend, at_once = choose_backend(sweep, backend, workers, len(jobs))
        if backend in ("threads", "processes") and at_once > 1:
            _check_memory(sweep, at_once)
        ordered = _shape_order(sweep, list(jobs.values()), ahead=backend != "serial")
        start = time.perf_counter()
        finished = len(every) - len(todo)
        where = backend if at_once == 1 or backend == "ray" else f"{backend}, {at_once} at a time"
        echo(f"sweep: {len(every)} cell(s), {finished} done already, {len(todo)} to run ({where}) in {folder.path}")

        with bar(len(todo), desc="cells", unit="cell", enabled=progress and bool(todo)) as cells_bar:

            def report(job, results):
                nonlocal finished
                for cell, rows, seconds in results:
                    finished += 1
                    cells_bar.update(1)
                    echo(
                        f"[{finished}/{len(every)}] {_describe(cell, rows, seconds)}  (elapsed {time.perf_counter() - start:.0f}s)"
                    )

            try:
                run_jobs(
                    _run_cells,
                    [(sweep, group, folder, progress and backend in ("serial", "threads")) for group in ordered],
                    report,
                    backend=backend,
                    workers=at_once if backend in ("threads", "processes") else workers,
                    compilation_cache=compilation_cache,
                    ray_address=ray_address,
                )
            except KeyboardInterrupt:
                raise KeyboardInterrupt(
                    f"{finished} of {len(every)} cell(s) finished and kept in {folder.path}; "
                    "rerun the same command to resume"
                ) from None
        rows: list[dict[str, Any]] = []
        for cell in every:  # read back in grid order: the table does not depend on the backend
            try:
                rows.extend(_read(sweep, folder, cell))
            except BadCell as bad:
                raise RuntimeError(f"cell file {bad} after it was written (another process writing here?)") from None
        tables = write_tables(folder.path, rows, int_columns=("k", "k_selected"), echo=echo)
        plots = _plots(rows, folder.file("plots"), echo)
    return {
        "cells": len(every),
        "resumed": len(every) - len(todo),
        "rows": len(rows),
        "backend": backend,
        "workers": at_once,
        "seconds": time.perf_counter() - start,
        "results": tables["results"],
        "parquet": tables["parquet"] is not None,
        "plots": len(plots),
        "output_dir": folder.path,
        "config_hash": folder.config_hash[:8],
    }


def _shape_order(sweep: OPLSweep, jobs: list[list[dict[str, Any]]], *, ahead: bool) -> list[list[dict[str, Any]]]:
    """The jobs shape by shape (D, L, n and the declared axes; each shape's in grid order),
    with ``ahead`` (parallel backends) each shape's first job moved ahead of the previous
    shape's others.

    A process then traces and loads a shape's programs once for all the cells it runs of
    it; in the grid's order (n innermost) every cell was another shape and retraced its
    programs, 14-20 s of a D = 10 grid cell's 17-40 s (docs/performance.md §24). Starting the
    next shape early lets a second worker compile it while the first runs the cells of a
    compiled one, instead of both compiling the same programs at once on an empty cache (one
    process gains nothing from it). Rows do not depend on the order."""
    by_shape: dict[tuple, list[list[dict[str, Any]]]] = {}
    for group in jobs:
        by_shape.setdefault(shape_key(sweep, group[0]), []).append(group)
    shapes = list(by_shape.values())
    if not ahead:
        return [group for groups in shapes for group in groups]
    ordered = shapes[0][:1] if shapes else []
    for i, groups in enumerate(shapes):
        ordered.extend(shapes[i + 1][:1] if i + 1 < len(shapes) else [])
        ordered.extend(groups[1:])
    return ordered


def _plots(rows: list[dict[str, Any]], out_dir: str, echo: Callable[[str], None]) -> list[str]:
    """The standard PNGs (skipped, with a note, when matplotlib is not installed)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        echo("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return []
    from experiments.plots import write_plots

    return write_plots(rows, out_dir)
