"""opl_rank.prng: keys from seeds, and the epoch shuffle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import prng


@pytest.mark.parametrize("impl", ["philox2x32", "threefry2x32"])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1625, 1626, 5600, 8000, 65536, 65537])
def test_permutation_is_jax_random_permutation(impl, n):
    # the same permutation bit for bit (so a fit's batches, hence its results, are JAX's),
    # across the one-round / two-round boundary (1625 / 1626) and the 32-bit packing limit
    for i in range(3):
        key = jax.random.fold_in(prng.make_key(11, impl=impl), i)
        got = np.asarray(jax.jit(prng.permutation, static_argnums=1)(key, n))
        np.testing.assert_array_equal(got, np.asarray(jax.random.permutation(key, n)))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(np.sort(got), np.arange(n))


@pytest.mark.parametrize("n", [1, 2, 3000, 65536])
def test_stable_argsort_keeps_equal_keys_in_index_order(n):
    # colliding 32-bit keys (rare at a fit's sizes) keep their index order, as JAX's stable
    # sort does: keys drawn from a tiny range collide everywhere
    keys = jax.random.bits(prng.make_key(3), (n,), jnp.uint32) % 13
    expected = jax.lax.sort_key_val(keys, jnp.arange(n, dtype=jnp.int32))[1]
    np.testing.assert_array_equal(np.asarray(prng.stable_argsort_uint32(keys)), np.asarray(expected))
    with pytest.raises(ValueError, match="65536"):
        prng.stable_argsort_uint32(jnp.zeros((65537,), jnp.uint32))
