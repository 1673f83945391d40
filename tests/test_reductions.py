"""opl_rank.reductions: the same indices as jax.numpy's reductions."""

import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank.reductions import first_argmax, first_argmax_short


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_first_argmax_is_argmax_with_ties_and_infinities(axis):
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(40, 33, 7))).astype(np.float32)  # many ties
    x[4] = -np.inf
    x[6, 2, 1] = np.inf
    x[8, 1:4, 5] = -np.inf
    got = np.asarray(first_argmax(jnp.asarray(x), axis=axis))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=axis)))
    assert got.dtype == np.int32
    x[3, 5, :] = np.nan
    x[7, :, 3] = np.nan
    with_nan = np.asarray(first_argmax(jnp.asarray(x), axis=axis))
    assert np.all((with_nan >= 0) & (with_nan < x.shape[axis]))


@pytest.mark.parametrize("n_items", [1, 2, 5, 10, 16])
def test_first_argmax_short_is_argmax_with_ties_and_infinities(n_items):
    rng = np.random.default_rng(n_items)
    x = np.round(rng.normal(size=(3, 41, n_items))).astype(np.float32)  # many ties
    x[0, 4] = -np.inf
    x[1, 6, -1] = np.inf
    x[2, 8, : n_items // 2] = -np.finfo(np.float32).max  # a sampler's invalid items
    got = np.asarray(first_argmax_short(jnp.asarray(x)))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
    assert got.dtype == np.int32 and got.shape == x.shape[:-1]
    x[1, 5, :] = np.nan
    x[2, 7, -1] = np.nan
    with_nan = np.asarray(first_argmax_short(jnp.asarray(x)))
    assert np.all((with_nan >= 0) & (with_nan < n_items))
