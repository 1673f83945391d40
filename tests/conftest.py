"""Strict JAX in tests only: implicit rank or dtype promotion is an error here, so the
library's shapes and dtypes are explicit (as in equinox's test setup).

One persistent compilation cache for the whole run (``.cache/jax-tests`` in this checkout,
or ``$OPL_RANK_JAX_CACHE``): the pytest-xdist workers and every subprocess a test starts
(the CLI, docs examples, notebook kernels, sweep workers) load a kernel another one
compiled, and a rerun loads them all. It never changes a result (docs/performance.md §17).
"""

import os
from pathlib import Path

import jax
import pytest

from opl_rank.compilation_cache import CACHE_ENV, MIN_COMPILE_SECONDS, enable_compilation_cache

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

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
