"""Strict JAX in tests only: implicit rank or dtype promotion is an error here, so the
library's shapes and dtypes are explicit (as in equinox's test setup).

One persistent compilation cache for the whole run (``.cache/jax-tests`` in this checkout,
or ``$OPL_RANK_JAX_CACHE``): the pytest-xdist workers and every subprocess a test starts
(the CLI, docs examples, notebook kernels, sweep workers) load a kernel another one
compiled, and a rerun loads them all. It never changes a result (docs/performance.md §17).

XLA's CPU backend compiles at LLVM optimisation level 0 in tests (unless ``XLA_FLAGS`` already
sets ``--xla_backend_optimization_level``): most of the suite's time is compiling small
programs that then run once, and level 0 cut the 30 slowest tests from 15.7 to 12.1 min with
the golden sweep's rows within 1.6e-6 of the committed ones (docs/performance.md §18).
Two more flags cut XLA's own passes, not only LLVM's: the classic loop emitters instead of
the fusion emitters (which lower every fusion through MLIR) and one code-generation module
per program instead of a split; on three compile-bound tests they took 47 s to 30 s
(docs/performance.md §18). Setting all three in ``XLA_FLAGS`` (e.g.
``--xla_backend_optimization_level=3 --xla_cpu_use_fusion_emitters=true`` and the split
count XLA uses by default) tests the users' code generation. Set here, before JAX starts its backend;
subprocesses inherit it.
"""

import os
from pathlib import Path

# Each is added unless XLA_FLAGS already names it (so a run can test the users' defaults).
_TEST_COMPILE_FLAGS = {
    "xla_backend_optimization_level": "0",
    "xla_cpu_use_fusion_emitters": "false",
    "xla_cpu_parallel_codegen_split_count": "1",
}
for _flag, _value in _TEST_COMPILE_FLAGS.items():
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --{_flag}={_value}").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

from opl_rank.compilation_cache import CACHE_ENV, MIN_COMPILE_SECONDS, enable_compilation_cache  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

# Tests monkeypatch library functions, which the program cache's keys cannot see
# (opl_rank.program_cache): it stays off unless a test turns it on.
os.environ.setdefault("OPL_RANK_PROGRAM_CACHE", "0")
os.environ.setdefault(CACHE_ENV, str(Path(__file__).resolve().parents[1] / ".cache" / "jax-tests"))
# Plain Python subprocesses read JAX's own variables when they import JAX.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ[CACHE_ENV])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(MIN_COMPILE_SECONDS))
if os.environ[CACHE_ENV]:  # "" turns it off
    enable_compilation_cache(os.environ[CACHE_ENV])


@pytest.fixture
def key():
    """A fresh philox key per test (the library's default implementation)."""
    from opl_rank import make_key

    return make_key(0)
