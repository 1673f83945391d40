"""Where a sweep's jobs run: in this process (one after another, or in threads), in local
worker processes, or on Ray.

A job is a picklable top-level function and its arguments; results come back in
completion order through ``on_result``. Jobs derive their PRNG keys from their own cell
(never from execution order), so every backend gives the same results.

``threads`` runs jobs in a pool of threads of this process. They share its compiled programs
(each is traced and compiled or loaded once, not once per worker) while XLA runs the programs
outside Python's lock, so two threads keep two cores busier than one job at a time (the small
preset: about 15% faster, docs/performance.md §22, §25). Each job writes its own cells. A
sweep's default, ``auto``, chooses it on a CPU with two or more cores
(``experiments.opl_sweep.choose_backend``).

``processes`` starts workers with the ``spawn`` method (JAX is not fork-safe) and, with at
most one worker per core, pins each to a core of its own before it imports JAX: XLA then
compiles its programs for one core. (XLA splits every larger loop into as many tasks as the
process has cores; two cells splitting theirs over the same two cores get in each other's
way. Warm, on one host a pinned worker computed a D = 10, n = 8000 cell 1.25x faster than a
thread beside another one, on another host equally fast; from an empty cache each worker
compiles every program itself, so threads stay the default: docs/performance.md §31.)
Workers point JAX's persistent compilation cache at a shared directory, so a kernel compiled
by one worker is loaded by the others and by later runs; pinned workers keep their one-core
executables in its ``one-core`` folder (the same programs compiled for all cores would run
single-threaded in an unpinned process). Workers die with their parent: each polls its
parent pid in a daemon thread and exits as soon as the parent is gone (even after
``kill -9`` of the parent, which runs no cleanup), so no orphan keeps computing or writing
cells.

``ray`` submits each job as a Ray task (one CPU each) to the cluster at ``ray_address``
(e.g. ``"auto"`` or ``"ray://head:10001"``), or to a local Ray instance it starts and
stops itself. Tasks get the same single-thread XLA setting and this checkout on their
``PYTHONPATH`` (enough on one machine or a shared file system; elsewhere install
opl_rank on the cluster's nodes).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["BACKENDS", "run_jobs", "exit_with_parent", "worker_cores", "worker_lane", "ONE_CORE_CACHE"]

BACKENDS = ("serial", "threads", "processes", "ray")
_SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false"  # matrix products on one thread
_PARENT_POLL_SECONDS = 0.2
#: the folder of the compilation cache where pinned workers keep their one-core executables
ONE_CORE_CACHE = "one-core"
_lane = 0  # this process's index among its pool's workers (set once, as a worker starts)


def worker_lane() -> int:
    """This process's index among the worker processes of a ``processes`` pool (0 in any other
    process). A sweep's cells start their fits at another row per lane
    ([`experiments.sweep_cell.fit_order`][experiments.sweep_cell.fit_order]), so workers
    that start on an empty cache compile different programs and share them through it."""
    return _lane


def _enable_compilation_cache(cache_dir: str | None, *, one_core: bool = False) -> None:
    if cache_dir:  # None or "": off (here None does not mean the default directory)
        # Imported here: opl_rank imports JAX, and a spawned worker sets XLA_FLAGS first.
        from opl_rank.compilation_cache import enable_compilation_cache
        from opl_rank.program_cache import enable_program_cache

        if not one_core:
            enable_compilation_cache(cache_dir)
            return
        # One-core executables apart (JAX's cache key does not tell them from the others);
        # the traced programs do not depend on the cores and stay shared.
        enable_compilation_cache(os.path.join(cache_dir, ONE_CORE_CACHE), programs=False)
        enable_program_cache(os.path.join(cache_dir, "programs"))


def worker_cores(n_workers: int) -> list[int] | None:
    """The cores ``n_workers`` pinned workers take, one each: None where this system cannot
    pin (no ``os.sched_setaffinity``) or this process may run on fewer cores than that."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    return cores[:n_workers] if 2 <= n_workers <= len(cores) else None


def _take_slot(slots: Any) -> bool:
    """Take a ``(lane, core)`` slot from the ``slots`` queue: this worker's lane, and the core it
    runs on alone (None: unpinned), set before JAX is imported (XLA reads the cores it may use
    once). Returns whether the process is pinned."""
    import queue

    global _lane
    try:
        _lane, core = slots.get(timeout=1.0)
    except queue.Empty:  # more workers started than slots handed out: lane 0, unpinned
        return False
    if core is None:
        return False
    os.sched_setaffinity(0, {core})
    return True


def exit_with_parent(parent: int, poll_seconds: float = _PARENT_POLL_SECONDS) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit``) once its parent is no
    longer ``parent`` (the parent died and this process was re-parented)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os._exit(1)

    thread = threading.Thread(target=watch, name="opl-rank-exit-with-parent", daemon=True)
    thread.start()
    return thread


def _init_worker(cache_dir: str | None, parent: int | None = None, slots: Any = None) -> None:
    if parent is not None:
        exit_with_parent(parent)
        # Ctrl-C reaches the whole process group: the parent stops the sweep (one line); a
        # worker does not print a traceback of its own, and ends with its parent.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before JAX is imported in this fresh (spawned) interpreter.
    one_core = slots is not None and _take_slot(slots)
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} {_SINGLE_THREAD_XLA}".strip()
    _enable_compilation_cache(cache_dir, one_core=one_core)


def run_jobs(
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    on_result: Callable[[tuple, Any], None],
    *,
    backend: str = "serial",
    workers: int | None = None,
    compilation_cache: str | None = None,
    ray_address: str | None = None,
) -> None:
    """Run ``fn(*job)`` for every job; call ``on_result(job, result)`` as each finishes.

    Args:
      fn: a top-level (picklable) function.
      jobs: argument tuples.
      on_result: called in this process, in completion order.
      backend: one of [`BACKENDS`][BACKENDS].
      workers: worker threads or processes (default: the CPU count; not for ``serial``).
      compilation_cache: directory for JAX's persistent compilation cache (None: off).
      ray_address: an existing Ray cluster (``ray`` only; None starts a local instance
        with ``workers`` CPUs).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if backend == "serial" or not jobs:
        _enable_compilation_cache(compilation_cache)
        for job in jobs:
            on_result(job, fn(*job))
        return
    if backend == "ray":
        _run_on_ray(fn, jobs, on_result, workers, compilation_cache, ray_address)
        return
    n_workers = min(workers or os.cpu_count() or 1, len(jobs))
    if backend == "threads":
        _enable_compilation_cache(compilation_cache)
        with concurrent.futures.ThreadPoolExecutor(n_workers, thread_name_prefix="opl-rank-job") as threads:
            _collect(threads, fn, jobs, on_result)
        return
    context = multiprocessing.get_context("spawn")
    cores = worker_cores(n_workers)
    slots = context.Queue()  # (lane, core) per worker
    for lane in range(n_workers):
        slots.put((lane, None if cores is None else cores[lane]))
    with concurrent.futures.ProcessPoolExecutor(
        n_workers, mp_context=context, initializer=_init_worker, initargs=(compilation_cache, os.getpid(), slots)
    ) as pool:
        _collect(pool, fn, jobs, on_result)


def _collect(
    pool: concurrent.futures.Executor,
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    on_result: Callable[[tuple, Any], None],
) -> None:
    """Submit every job to ``pool`` and call ``on_result`` here as each finishes. On Ctrl-C
    the jobs not started are cancelled and worker processes terminated; a thread cannot be
    stopped, so running threads end their current job (each writes its cells atomically)."""
    futures = {pool.submit(fn, *job): job for job in jobs}
    try:
        for future in concurrent.futures.as_completed(futures):
            on_result(futures[future], future.result())
    except KeyboardInterrupt:  # Ctrl-C: stop now rather than wait for every job
        pool.shutdown(wait=False, cancel_futures=True)
        for process in list((getattr(pool, "_processes", None) or {}).values()):  # worker processes only
            process.terminate()
        raise
    except BaseException:
        for future in futures:
            future.cancel()
        raise


class _DropPrefix:
    """A logging filter that drops records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def filter(self, record: Any) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _ray_task(fn: Callable[..., Any], job: tuple, cache_dir: str | None) -> Any:
    _enable_compilation_cache(cache_dir)
    return fn(*job)


def _run_on_ray(fn, jobs, on_result, workers, cache_dir, address) -> None:
    try:
        import ray
    except ImportError as err:
        raise RuntimeError("backend 'ray' needs Ray: pip install 'opl_rank[ray]'") from err
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
    runtime_env = {
        "env_vars": {"PYTHONPATH": path, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {_SINGLE_THREAD_XLA}".strip()}
    }
    started = not ray.is_initialized()
    if started:
        import logging
        import warnings

        with warnings.catch_warnings():
            # Ray starts its processes with fork + exec; JAX's fork handler warns about a
            # deadlock that cannot happen there. Not the user's business.
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
            if address:
                ray.init(address=address, runtime_env=runtime_env)
            else:  # a local instance we stop again: no "Started a local Ray instance", no note that
                # token authentication is on (the secure default; a warning that it is off still shows)
                auth = logging.getLogger("ray._private.authentication.authentication_token_setup")
                enabled_note = _DropPrefix("Token authentication is enabled for this Ray cluster")
                auth.addFilter(enabled_note)
                try:
                    ray.init(
                        num_cpus=workers or os.cpu_count() or 1,
                        include_dashboard=False,
                        runtime_env=runtime_env,
                        logging_level=logging.WARNING,
                    )
                finally:
                    auth.removeFilter(enabled_note)
    try:
        task = ray.remote(num_cpus=1)(_ray_task).options(runtime_env=runtime_env)
        pending = {task.remote(fn, job, cache_dir): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                on_result(pending.pop(ref), ray.get(ref))
    finally:
        if started:
            ray.shutdown()
