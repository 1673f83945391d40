"""Logging policies: maps from (context, item features) to Plackett-Luce logits.

A logging policy is any callable ``policy(context, item_features) -> logits`` with
``context`` ``[n, dx]``, ``item_features`` ``[D, di]`` and logits ``[n, D]``; the simulator
samples PL rankings from those logits. Built-in policies are pytrees (they pass through
``jit`` and a new temperature does not recompile). Wrap any other function with
[`CallableLogging`][CallableLogging], which checks what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["PlackettLuceLinear", "UniformLogging", "CallableLogging", "as_logging_policy"]


class PlackettLuceLinear(struct.PyTreeNode):
    """The R-POD paper's logging policy (Eq. 15): ``logits = (theta0_a^T x + b0_a) / tau``.

    Attributes:
      coef: ``[D, dx]`` float32 theta0 (U(0, 1) in the paper).
      bias: ``[D]`` float32 b0 (U(0, 1) in the paper).
      temperature: tau > 0 (scalar); larger is closer to uniform.
    """

    coef: jax.Array  # [D, dx]
    bias: jax.Array  # [D]
    temperature: jax.Array  # [] float32

    @classmethod
    def random(cls, key: jax.Array, n_items: int, context_dim: int, temperature: float = 1.0) -> PlackettLuceLinear:
        """theta0, b0 ~ U(0, 1) as in the paper.

        Examples:
          >>> import jax
          >>> pi0 = PlackettLuceLinear.random(jax.random.key(0), 4, 5, temperature=2.0)
          >>> pi0(jax.numpy.zeros((3, 5)), None).shape
          (3, 4)
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        k_coef, k_bias = jax.random.split(key)
        return cls(
            coef=jax.random.uniform(k_coef, (n_items, context_dim), jnp.float32),
            bias=jax.random.uniform(k_bias, (n_items,), jnp.float32),
            temperature=jnp.asarray(temperature, jnp.float32),
        )

    def __call__(self, context: jax.Array, item_features: jax.Array | None) -> jax.Array:
        """``[n, dx] -> [n, D]`` logits."""
        return (context @ self.coef.T + self.bias[None, :]) / self.temperature


class UniformLogging(struct.PyTreeNode):
    """Uniformly random rankings (all logits zero)."""

    n_items: int = struct.field(pytree_node=False)

    def __call__(self, context: jax.Array, item_features: jax.Array | None) -> jax.Array:
        """``[n, dx] -> [n, D]`` zeros."""
        return jnp.zeros((context.shape[0], self.n_items), jnp.float32)


class CallableLogging:
    """Wraps a user function ``fn(context [n, dx], item_features [D, di]) -> [n, D]``.

    The function may use NumPy, scikit-learn or JAX; it is called outside ``jit`` on
    chunks of rows, and its output is checked: shape ``[n, D]``, no NaN, no ``+inf``
    (``-inf`` excludes an item), and every row keeps at least ``ranking_length`` (L)
    finite logits -- otherwise excluded items would fill the remaining slots of a logged
    ranking with prefix propensities claiming probability 1, data pi_0 cannot produce.
    Without ``ranking_length`` every row needs one finite logit. ``temperature`` divides
    the returned logits.
    """

    def __init__(
        self, fn: Callable[..., Any], n_items: int, temperature: float = 1.0, ranking_length: int | None = None
    ):
        if not callable(fn):
            raise TypeError(f"logging policy must be callable, got {type(fn).__name__}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.fn = fn
        self.n_items = int(n_items)
        self.temperature = float(temperature)
        if ranking_length is not None and not 1 <= int(ranking_length) <= self.n_items:
            raise ValueError(f"ranking_length must be in [1, n_items={self.n_items}], got {ranking_length}")
        self.ranking_length = None if ranking_length is None else int(ranking_length)

    def __call__(self, context: jax.Array, item_features: jax.Array | None) -> jax.Array:
        name = getattr(self.fn, "__name__", repr(self.fn))
        try:
            out = self.fn(context, item_features)
        except Exception as err:  # the user's code: say whose call failed
            raise RuntimeError(f"logging policy {name!r} raised {type(err).__name__}: {err}") from err
        out = np.asarray(out, dtype=np.float32)
        expected = (context.shape[0], self.n_items)
        if out.shape != expected:
            # The rows it was given, not the caller's n: a simulator passes contexts in batches.
            raise ValueError(
                f"logging policy {name!r} returned logits of shape {out.shape}; expected [n, D]: one row per "
                f"context and D={self.n_items} columns (one logit per item); it was given a batch of {expected[0]} contexts"
            )
        if np.isnan(out).any() or np.isposinf(out).any():
            raise ValueError(f"logging policy {name!r} returned NaN or +inf logits")
        if np.isneginf(out).all(axis=1).any():
            row = int(np.flatnonzero(np.isneginf(out).all(axis=1))[0])
            raise ValueError(f"logging policy {name!r} excluded every item (-inf) in some row (first: row {row})")
        if self.ranking_length is not None:
            n_finite = np.isfinite(out).sum(axis=1)
            short = np.flatnonzero(n_finite < self.ranking_length)
            if short.size:
                row = int(short[0])
                raise ValueError(
                    f"logging policy {name!r} returned fewer than L={self.ranking_length} finite logits in "
                    f"{short.size} of the {out.shape[0]} row(s) it was given; first: row {row} has {int(n_finite[row])} "
                    f"(the others are -inf). A logged ranking of length L would have to place excluded items; return "
                    f"at least L finite logits per row, or use a shorter ranking length L"
                )
        return jnp.asarray(out / self.temperature)


def as_logging_policy(policy: Any, n_items: int, ranking_length: int | None = None) -> Any:
    """Built-in policies pass through; any other callable is wrapped and checked (with
    ``ranking_length``: at least that many finite logits per row)."""
    if isinstance(policy, (PlackettLuceLinear, UniformLogging, CallableLogging)):
        return policy
    return CallableLogging(policy, n_items, ranking_length=ranking_length)
