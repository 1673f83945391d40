"""A size that cannot fit in memory is refused before the work starts, naming what it needs."""

import os
import time

import pytest

from experiments.cli import main
from opl_rank import make_key, memory
from simulators import SyntheticRankingEnv


def test_logged_data_bytes_counts_every_array():
    assert memory.logged_data_bytes(10, 7, 3, 5) == 10 * 4 * (5 + 3 * 3)
    assert memory.logged_data_bytes(10, 7, 3, 5, position_marginals=True, item_mask=True) == 10 * (4 * (5 + 4 * 3) + 7)


def test_require_names_the_work_and_the_sizes(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**30)
    memory.require(2**29, "small work")  # fits: nothing happens
    with pytest.raises(
        memory.MemoryBudgetError, match=r"big work needs about 4.0 GiB of memory, but 1.0 GiB are available; try less"
    ):
        memory.require(4 * 2**30, "big work", "try less")
    monkeypatch.setattr(memory, "available_bytes", lambda: None)  # unknown: no check
    memory.require(2**60, "anything")


def test_available_memory_is_known_here():
    assert memory.available_bytes() is not None and memory.available_bytes() > 2**20


def test_simulating_too_many_rows_fails_at_once_with_how_much_it_needs():
    env = SyntheticRankingEnv.create(make_key(0), n_items=100, ranking_length=10)
    start = time.perf_counter()
    with pytest.raises(memory.MemoryBudgetError) as err:
        env.sample_logged_data(make_key(1), 10**11)
    assert time.perf_counter() - start < 30  # before the work: one chunk at most
    message = str(err.value)
    assert "n=100,000,000,000 logged rows (D=100, L=10, dx=5)" in message and "GiB of memory" in message
    assert "use a smaller n (about" in message


def test_cli_simulate_and_sweep_refuse_an_n_that_cannot_fit(tmp_path, capsys):
    assert main(["simulate", "--n", str(10**11), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "opl-rank simulate: error: simulating n=100,000,000,000 logged rows" in err and "Traceback" not in err
    out = tmp_path / "sweep"
    args = [
        "sweep",
        "--config",
        "experiments/configs/synthetic_opl_small.yaml",
        "--set",
        f"n={10**11}",
        "--set",
        f"output_dir={out}",
        "--quiet",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the sweep's largest cell (n=100,000,000,000, D=10, L=5)" in err and "GiB" in err
    assert not os.path.exists(out / "cells") or not os.listdir(out / "cells")  # no work done
