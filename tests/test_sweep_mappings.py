"""A sweep process drops JAX's in-process program caches before a cell once it holds more than
``tuning.SWEEP_MAX_MAPPINGS`` memory mappings.

Every program a process loads keeps its code mapped; a long-lived worker of the D = 30 regime
map reached Linux's limit of 65,530 mappings and died mid-sweep ("LLVM compilation error:
Cannot allocate memory").
"""

import jax

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
