"""The persistent compilation cache: a second process loads what the first compiled, the
CLI uses it by default, ``""`` turns it off, and a bad directory is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opl_rank.compilation_cache import CACHE_ENV, default_cache_dir, enable_compilation_cache

ROOT = Path(__file__).resolve().parents[1]

# Counts JAX's cache-hit events around one compile of a fresh (never compiled) function.
SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from opl_rank.compilation_cache import enable_compilation_cache
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None)
enable_compilation_cache(sys.argv[1], min_compile_seconds=0.0)
f = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * 3.25 + 0.125, axis=1) @ x.T)
f(jnp.ones((7, 13))).block_until_ready()
print(json.dumps({"hits": len(hits)}))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") and k != CACHE_ENV}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _hits(cache_dir: Path) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache_dir)],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["hits"]


@pytest.mark.extended
def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    assert _hits(tmp_path) == 0  # cold: compiled and written
    assert any(tmp_path.iterdir())
    assert _hits(tmp_path) >= 1  # warm: loaded


def test_default_directory_and_the_switch(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "opl_rank", "jax")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert default_cache_dir() == str(tmp_path)
    monkeypatch.setenv(CACHE_ENV, "")
    assert default_cache_dir() is None
    assert enable_compilation_cache() is None  # off: nothing configured


def test_bad_arguments_name_themselves(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ValueError, match="cache_dir"):
        enable_compilation_cache(not_a_dir / "sub")
    with pytest.raises(ValueError, match="min_compile_seconds"):
        enable_compilation_cache(tmp_path, min_compile_seconds=-1.0)


@pytest.mark.extended
@pytest.mark.parametrize("setting", ["dir", "off"])
def test_the_cli_uses_the_cache_unless_turned_off(tmp_path, setting):
    cache = tmp_path / "cache"
    env = _clean_env(**{CACHE_ENV: str(cache) if setting == "dir" else ""}, HOME=str(tmp_path / "home"))
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.cli", "simulate", "--n", "200", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    written = sorted(cache.glob("*")) if cache.exists() else []
    if setting == "dir":
        assert written, "the CLI wrote no compiled kernels"
    else:
        assert not written and not (tmp_path / "home" / ".cache").exists()


# One fit with progress (on_epoch) of a reward model and a two-stage policy; counts how many
# programs the persistent cache served and how many it had to compile.
FIT_SCRIPT = """
import json, sys
import jax
from opl_rank import make_key
from opl_rank.compilation_cache import enable_compilation_cache
from opl_rank.opl.learners import LearnerConfig, fit
from opl_rank.optimization import TrainConfig
from simulators import SyntheticRankingEnv
counts = {"requests": 0, "hits": 0}
def count(event, **kw):
    if event.endswith("compile_requests_use_cache"):
        counts["requests"] += 1
    elif event.endswith("cache_hits"):
        counts["hits"] += 1
jax.monitoring.register_event_listener(count)
enable_compilation_cache(sys.argv[1])
env = SyntheticRankingEnv.create(make_key(0), n_items=6, ranking_length=3)
data = env.sample_logged_data(make_key(1), 600)
epochs = []
config = LearnerConfig("rpod", k=1, train=TrainConfig(epochs=4, batch_size=128),
                       reward_train=TrainConfig(epochs=3, batch_size=128))
fit(data, make_key(2), config, on_epoch=lambda part, epoch, record: epochs.append([part, epoch]))
print(json.dumps({**counts, "epochs": epochs}))
"""


@pytest.mark.extended
def test_a_fit_with_progress_is_loaded_whole_from_the_cache(tmp_path):
    """Progress is reported between compiled chunks, not by host callbacks inside them, so a
    second process finds every program of a watched fit in the persistent cache."""
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", FIT_SCRIPT, str(tmp_path)],
            cwd=ROOT,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["hits"] == 0 and cold["requests"] > 0
    assert warm["requests"] == cold["requests"]
    assert warm["hits"] == warm["requests"], f"{warm['requests'] - warm['hits']} programs compiled again"
    expected = [["reward", e] for e in (1, 2, 3)] + [["policy", e] for e in (1, 2, 3, 4)]
    assert cold["epochs"] == warm["epochs"] == expected
