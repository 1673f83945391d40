"""PRNG keys: integer seeds become keys only at entry points.

Measured on the 2-core CPU machines (docs/performance.md §3): the default threefry key draws
~0.04 G uniforms/s, philox2x32 ~0.2 G/s; Gumbel top-L sampling is RNG-bound, so entry
points use philox by default. Every library function takes whatever key it is given.
"""

from __future__ import annotations

import jax

__all__ = ["make_key", "split_seed", "DEFAULT_PRNG_IMPL"]

DEFAULT_PRNG_IMPL = "philox2x32"


def make_key(seed: int, impl: str | None = DEFAULT_PRNG_IMPL) -> jax.Array:
    """A typed PRNG key from an integer seed.

    Args:
      seed: a non-negative int.
      impl: a ``jax.random`` implementation name (``"philox2x32"``, ``"threefry2x32"``,
        ``"rbg"``, ...), or None for JAX's configured default.

    Returns:
      A typed key array (shape ``()``).

    Examples:
      >>> import jax
      >>> k = make_key(0)
      >>> jax.random.normal(k, (2,)).shape
      (2,)
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return jax.random.key(seed, impl=impl)


def split_seed(seed: int, n: int, impl: str | None = DEFAULT_PRNG_IMPL) -> list[jax.Array]:
    """``n`` independent keys from one integer seed (an entry point's first step).

    Examples:
      >>> len(split_seed(0, 3))
      3
    """
    return list(jax.random.split(make_key(seed, impl), n))
