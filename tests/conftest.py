"""Strict JAX in tests only: implicit rank or dtype promotion is an error here, so the
library's shapes and dtypes are explicit (as in equinox's test setup)."""

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture
def key():
    """A fresh philox key per test (the library's default implementation)."""
    from opl_rank import make_key

    return make_key(0)
