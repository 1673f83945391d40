"""Sweep workers (``--backend processes``) are replaced after ``tuning.SWEEP_CELLS_PER_WORKER`` cells.

Every program a process loads keeps its code mapped; a long-lived worker of the D = 30 regime
map reached Linux's limit of 65,530 memory mappings and died mid-sweep. Replacing workers bounds
that, and every job still runs exactly once.
"""

import os

import pytest

from experiments.executors import run_jobs
from opl_rank import tuning


def _pid(i: int) -> tuple[int, int]:
    return i, os.getpid()


@pytest.mark.parametrize(("per_worker", "least", "most"), [(2, 3, 3), (0, 1, 1)])
def test_workers_are_replaced_after_their_share_of_jobs(monkeypatch, per_worker, least, most):
    monkeypatch.setattr(tuning, "SWEEP_CELLS_PER_WORKER", per_worker)
    results = {}
    run_jobs(
        _pid, [(i,) for i in range(5)], lambda job, r: results.update({r[0]: r[1]}), backend="processes", workers=1
    )
    assert sorted(results) == [0, 1, 2, 3, 4]  # every job once
    assert least <= len(set(results.values())) <= most  # 5 jobs, 2 per worker: 3 workers; 0: one for all
    assert os.getpid() not in results.values()
