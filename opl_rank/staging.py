"""Compiled stages of a fit: one cached ``jax.jit`` program per step, one seed or ``S`` at once.

A fit is a few steps driven from the host (prepare the rows, train the reward model in
chunks of epochs, compute completion orders, train the policy in chunks), each step one
compiled program: the host sees progress between programs and the programs stay free of
host callbacks, so JAX's persistent compilation cache keeps them across processes
([`opl_rank.compilation_cache`][opl_rank.compilation_cache]).

The ``S`` seeds of one sweep cell run as the same steps ``jax.vmap``-ed: their inputs carry a
leading seed axis. A [`LoggedData`][opl_rank.data.LoggedData] validates its concrete arrays
when built, so ``S`` stacked data sets cannot be one; they travel as a [`Packed`][Packed]
(the leaves and the treedef), rebuilt inside the program from tracers.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from opl_rank.program_cache import cached_program

__all__ = ["Packed", "pack", "stack", "unpack", "stage", "leading_rows"]


@jax.tree_util.register_pytree_node_class
class Packed:
    """A pytree's leaves and treedef, rebuilt (``unpack``) only inside a compiled stage.

    Flattening a ``Packed`` yields the leaves (with the treedef as static data), and
    unflattening builds another ``Packed`` without running any constructor: arrays with a
    leading seed axis pass through ``jit``, ``vmap`` and ``device_get`` untouched.
    """

    def __init__(self, leaves: Sequence[Any], treedef: Any) -> None:
        self.leaves = list(leaves)
        self.treedef = treedef

    def tree_flatten(self) -> tuple[list[Any], Any]:
        return self.leaves, self.treedef

    @classmethod
    def tree_unflatten(cls, treedef: Any, leaves: Sequence[Any]) -> Packed:
        return cls(leaves, treedef)

    def __repr__(self) -> str:
        return f"Packed({self.treedef}, shapes={[getattr(x, 'shape', None) for x in self.leaves]})"


def pack(tree: Any) -> Any:
    """``tree`` as a [`Packed`][Packed] (None stays None)."""
    if tree is None or isinstance(tree, Packed):
        return tree
    leaves, treedef = jax.tree.flatten(tree)
    return Packed(leaves, treedef)


def stack(trees: Sequence[Any]) -> Packed:
    """``S`` pytrees of equal structure and shapes as one [`Packed`][Packed] whose leaves have a
    leading seed axis ``[S, ...]`` (a ValueError names the first mismatch)."""
    if not trees:
        raise ValueError("nothing to stack: an empty sequence")
    flat = [jax.tree.flatten(t) for t in trees]
    leaves0, treedef0 = flat[0]
    structure0: Any = treedef0  # PyTreeDef supports ==; its stubs do not say so
    for i, (leaves, treedef) in enumerate(flat[1:], start=1):
        shapes = [x.shape for x in leaves]
        if treedef != structure0 or shapes != [x.shape for x in leaves0]:
            raise ValueError(
                f"datas[{i}] does not share datas[0]'s structure and shapes (for LoggedData: n, L, D, optional fields): "
                f"{shapes} vs {[x.shape for x in leaves0]}"
            )
    return Packed([jnp.stack(parts) for parts in zip(*(leaves for leaves, _ in flat))], treedef0)


def unpack(tree: Any) -> Any:
    """Every [`Packed`][Packed] in ``tree`` rebuilt as the pytree it holds (inside a stage:
    from tracers, so no constructor checks concrete values)."""
    return jax.tree.map(
        lambda x: jax.tree.unflatten(x.treedef, x.leaves) if isinstance(x, Packed) else x,
        tree,
        is_leaf=lambda x: isinstance(x, Packed),
    )


def leading_rows(tree: Any, batched: bool) -> int:
    """The row count ``n`` of ``tree``'s first leaf: axis 0, or axis 1 under a seed axis."""
    first = jax.tree.leaves(tree)[0]
    return int(first.shape[1 if batched else 0])


@functools.lru_cache(maxsize=1024)
def stage(fn: Callable[..., Any], batched: bool, shared: tuple[int, ...] = (), hot: bool = False) -> Callable[..., Any]:
    """``fn`` compiled once (``jax.jit``), with every [`Packed`][Packed] argument rebuilt inside.

    Args:
      fn: a pure function of arrays (pass the same object again to reuse its compilation:
        results are cached by ``(fn, batched, shared)``).
      batched: ``jax.vmap`` over a leading seed axis of every argument but ``shared``.
      shared: positions of arguments that all seeds share (no seed axis).
      hot: XLA's default optimisations whatever the arguments' size
        ([`opl_rank.program_cache.cached_program`][opl_rank.program_cache.cached_program]).
    """

    @functools.wraps(fn)  # the program is named after fn (jax.log_compiles, profiles)
    def unpacked(*args: Any) -> Any:
        return fn(*unpack(args))

    if batched:
        traced = jax.vmap(unpacked, in_axes=tuple(None if i in shared else 0 for i in range(_arity(fn))))
    else:
        traced = unpacked
    # jitted and kept on disk as traced programs where the program cache is on (opl_rank.program_cache)
    return cached_program(traced, fn, f"stage(batched={batched}, shared={shared})", hot=hot)


def _arity(fn: Callable[..., Any]) -> int:
    return len(inspect.signature(fn).parameters)
