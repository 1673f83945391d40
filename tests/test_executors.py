"""Where a sweep's jobs run (experiments.executors): worker processes pinned to a core each."""

from __future__ import annotations

import os
import time

import pytest

from experiments import executors


def _splits_loops() -> bool:
    """Whether XLA in this process splits a loop over ``[20000, 10]`` into parallel tasks."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    compiled = jax.jit(lambda x: jnp.exp(x) * 2.0).lower(np.zeros((20000, 10), np.float32)).compile()
    return "outer_dimension_partitions" in compiled.as_text()


def _where_am_i(_job: int) -> tuple[int, list[int], tuple[str, str | None], bool, int]:
    import jax

    from opl_rank import program_cache

    time.sleep(0.3)  # long enough that both workers get jobs
    caches = (jax.config.jax_compilation_cache_dir, program_cache.program_cache_dir())  # type: ignore[attr-defined]
    return os.getpid(), sorted(os.sched_getaffinity(0)), caches, _splits_loops(), executors.worker_lane()


def test_worker_cores_are_distinct_cores_this_process_may_use():
    if not hasattr(os, "sched_getaffinity"):
        assert executors.worker_cores(2) is None
        return
    mine = os.sched_getaffinity(0)
    assert executors.worker_cores(1) is None  # one worker: no reason to pin
    assert executors.worker_cores(len(mine) + 1) is None  # more workers than cores: none pinned
    if len(mine) >= 2:
        cores = executors.worker_cores(2)
        assert cores is not None and len(set(cores)) == 2 and set(cores) <= mine


@pytest.mark.extended  # spawns two JAX processes (the process backend)
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="pinning needs os.sched_setaffinity (Linux)")
def test_process_workers_each_compile_for_a_core_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("OPL_RANK_PROGRAM_CACHE", "1")  # the suite turns it off; workers inherit this
    results: list[tuple[int, list[int], tuple[str, str | None], bool, int]] = []
    executors.run_jobs(
        _where_am_i,
        [(i,) for i in range(6)],
        lambda job, result: results.append(result),
        backend="processes",
        workers=2,
        compilation_cache=str(tmp_path / "jax"),
    )
    by_worker = {pid: (cores, cache, splits) for pid, cores, cache, splits, _ in results}
    lanes = {pid: lane for pid, *_, lane in results}
    assert sorted(lanes.values()) == list(range(len(lanes)))  # a lane each (fit_order), from 0
    if executors.worker_cores(2) is None:  # a one-core machine: workers stay as they were
        assert all(cores == sorted(os.sched_getaffinity(0)) for cores, _, _ in by_worker.values())
        return
    assert len(by_worker) == 2, "both workers should have run jobs"
    pinned = [cores for cores, _, _ in by_worker.values()]
    assert all(len(cores) == 1 for cores in pinned) and pinned[0] != pinned[1]
    for _, (executables, programs), splits in by_worker.values():
        assert executables == str(tmp_path / "jax" / executors.ONE_CORE_CACHE)
        assert programs == str(tmp_path / "jax" / "programs")  # traced programs stay shared
        assert not splits  # XLA compiled for one core
    assert _splits_loops()  # while this (unpinned) process splits the same loop
