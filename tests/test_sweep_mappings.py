"""A sweep process drops JAX's in-process program caches before a cell once it holds more than
``tuning.SWEEP_MAX_MAPPINGS`` memory mappings.

Every program a process loads keeps its code mapped; a long-lived worker of the D = 30 regime
map reached Linux's limit of 65,530 mappings and died mid-sweep ("LLVM compilation error:
Cannot allocate memory").
"""

import jax
import pytest

from experiments import opl_sweep
from opl_rank import tuning


def test_program_caches_are_dropped_only_above_the_mapping_limit(monkeypatch):
    count = opl_sweep._memory_mappings()
    assert count is None or count > 10  # Linux: this process's /proc/self/maps
    add_one = jax.jit(lambda x: x + 1.0)
    add_one(1.0)
    assert add_one._cache_size() == 1
    monkeypatch.setattr(tuning, "SWEEP_MAX_MAPPINGS", 10**9)
    opl_sweep._release_programs_if_many_mappings()
    assert add_one._cache_size() == 1  # below the limit: kept
    if count is not None:
        monkeypatch.setattr(tuning, "SWEEP_MAX_MAPPINGS", 0)
        opl_sweep._release_programs_if_many_mappings()
        assert add_one._cache_size() == 0  # above it: dropped, and the program still runs
        assert float(add_one(2.0)) == 3.0


def test_with_threads_the_programs_are_dropped_only_when_no_cell_group_runs(monkeypatch):
    """``--backend threads``: one thread's group must not lose its programs mid-fit. A group
    that finds the process over the limit waits for the running one to end, then drops them."""
    import threading

    if opl_sweep._memory_mappings() is None:
        return  # no /proc/self/maps: the guard never fires (nothing to order)
    gate = opl_sweep._CellGate()
    add_one = jax.jit(lambda x: x + 1.0)
    add_one(1.0)
    events = []
    running = threading.Event()
    finish = threading.Event()

    def first():
        with gate.group():
            running.set()
            finish.wait(10)
            events.append(("first ends", add_one._cache_size()))

    def second():
        running.wait(10)
        with gate.group():
            events.append(("second starts", add_one._cache_size()))

    monkeypatch.setattr(tuning, "SWEEP_MAX_MAPPINGS", 10**9)
    a = threading.Thread(target=first)
    a.start()
    running.wait(10)
    monkeypatch.setattr(tuning, "SWEEP_MAX_MAPPINGS", 0)  # now over the limit
    b = threading.Thread(target=second)
    b.start()
    b.join(0.5)
    assert b.is_alive() and not events  # waits while the first group runs
    finish.set()
    a.join(10)
    b.join(10)
    assert events == [("first ends", 1), ("second starts", 0)]  # dropped only after the first ended


def test_a_new_shape_drops_the_last_shapes_programs_above_half_the_limit(monkeypatch):
    """Jobs come shape by shape, so a group of a new shape drops the programs of the last one
    already above half the limit; a group of the same shape keeps them up to the limit."""
    count = opl_sweep._memory_mappings()
    if count is None:
        return  # no /proc/self/maps: the guard never fires
    monkeypatch.setattr(tuning, "SWEEP_MAX_MAPPINGS", 2 * count - 2)  # half of it: below count
    gate = opl_sweep._CellGate()
    add_one = jax.jit(lambda x: x + 1.0)
    add_one(1.0)
    with gate.group(("D", 10, "n", 1000)):
        pass
    with gate.group(("D", 10, "n", 1000)):  # same shape: below the limit, kept
        assert add_one._cache_size() == 1
    with gate.group(("D", 10, "n", 2000)):  # new shape: above half the limit, dropped
        assert add_one._cache_size() == 0


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_sweep_jobs_run_shape_by_shape(tmp_path, monkeypatch, backend):
    """The grid's order puts n innermost (every cell another shape); jobs go to the executor
    grouped by shape (D, L, n, axes), each shape's cells in grid order, every cell once; with
    parallel workers each shape's first job one shape early (a second worker compiles it
    while the first runs the cells of the shape before)."""
    from experiments import executors
    from experiments.sweep_config import OPLSweep, cell_name, cells, shape_key

    submitted = []

    class Stop(Exception):
        pass

    def record(fn, jobs, report, **kwargs):
        submitted.extend(job[1] for job in jobs)
        raise Stop

    monkeypatch.setattr(executors, "run_jobs", record)
    sweep = OPLSweep(
        n_items=(10,), lam=(0.0, 1.0), n=(100, 200), seeds=(0, 1), methods=("ips",), output_dir=str(tmp_path / "out")
    )
    with pytest.raises(Stop):
        opl_sweep.run_sweep(sweep, echo=lambda line: None, backend=backend)
    shapes = [shape_key(sweep, group[0])[2] for group in submitted]
    assert len(submitted) == 8 and all(len(group) == 1 for group in submitted)  # CPU: one cell per job
    ahead = [100, 200, 100, 100, 100, 200, 200, 200]
    assert shapes == ([100] * 4 + [200] * 4 if backend == "serial" else ahead)
    in_shape = [(g[0]["lam"], g[0]["seed"]) for g in submitted if g[0]["n"] == 100]
    assert in_shape == [(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)]  # the grid's order within a shape
    assert sorted(cell_name(g[0]) for g in submitted) == sorted(cell_name(c) for c in cells(sweep))
