"""Reductions that XLA's CPU backend runs slowly in their plain ``jax.numpy`` form.

``jnp.argmax`` lowers to one variadic reduction over (value, index) pairs, which XLA's CPU
backend does not vectorise: over the last axis of ``[27, 90, 336]`` it takes 2.0 ms against
0.7 ms for a maximum followed by the smallest index that attains it (docs/performance.md §30).
Over a short last axis (a PL sample's ten items) the same two steps as unrolled chains of
elementwise maxima and minima, each item a slice of its own, run vectorised over the rows
(docs/performance.md §31).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["first_argmax", "first_argmax_short"]


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


def first_argmax_short(x: jax.Array) -> jax.Array:
    """``jnp.argmax(x, axis=-1)`` over a short last axis: ``[.., C] -> int32 [..]``.

    ``C`` slices ``[..]`` (materialised once, items leading), a chain of ``C - 1`` maxima,
    then the smallest index equal to it by a chain of minima: elementwise work that XLA
    vectorises over the rows, where its (value, index) reduction runs one row at a time and
    takes whatever computes ``x`` into that loop (a sampler's random numbers among it: four
    times slower at ``[1024, 10]``). The same index, the first largest, on every line
    without NaN (a line with NaN: some index in range). Unrolled: for ``C`` up to a few
    dozen."""
    n = x.shape[-1]
    items = jax.lax.optimization_barrier(jnp.moveaxis(x, -1, 0))
    best = functools.reduce(jnp.maximum, [items[c] for c in range(n)])
    hits = [jnp.where(items[c] == best, jnp.int32(c), jnp.int32(n - 1)) for c in range(n)]
    return functools.reduce(jnp.minimum, hits)
