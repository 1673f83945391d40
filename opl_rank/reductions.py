"""Reductions that XLA's CPU backend runs slowly in their plain ``jax.numpy`` form.

``jnp.argmax`` lowers to one variadic reduction over (value, index) pairs, which XLA's CPU
backend does not vectorise: over the last axis of ``[27, 90, 336]`` it takes 2.0 ms against
0.7 ms for a maximum followed by the smallest index that attains it (docs/performance.md §30).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["first_argmax"]


def first_argmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``jnp.argmax(x, axis=axis)`` as two plain reductions: ``[.., C, ..] -> int32 [.., ..]``.

    The same index, the first largest entry, on every line without NaN; on a line holding a
    NaN (where ``jnp.argmax`` gives the first NaN) some index in range: XLA's CPU maximum may
    skip NaNs, and matching ``jnp.argmax`` there cost 35% more (callers rank finite values)."""
    axis = axis % x.ndim
    best = jnp.max(x, axis=axis, keepdims=True)
    hit = x == best
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    index = jnp.arange(x.shape[axis], dtype=jnp.int32).reshape(shape)
    return jnp.min(jnp.where(hit, index, x.shape[axis] - 1), axis=axis)
