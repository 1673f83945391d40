"""Wall-clock helpers shared by the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable


def seconds(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls (the least disturbed by other load)."""
    return min(seconds(fn) for _ in range(repeats))


def environment() -> dict[str, object]:
    """Versions and machine size, recorded in every benchmark's JSON line."""
    import os

    import jax
    import numpy as np

    return {
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "numpy_version": np.__version__,
        "cpu_count": os.cpu_count(),
    }
