"""Logging policies: maps from (context, item features) to Plackett-Luce logits.

A logging policy is any callable ``policy(context, item_features) -> logits`` with
``context`` ``[n, dx]``, ``item_features`` ``[D, di]`` and logits ``[n, D]``; the simulator
samples PL rankings from those logits. Built-in policies are pytrees (they pass through
``jit`` and a new temperature does not recompile). Wrap any other function with
:class:`CallableLogging`, which checks what it returns.
"""

from __future__ import annotations

from typing import Any, Callable

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
    def random(
        cls, key: jax.Array, n_items: int, context_dim: int, temperature: float = 1.0
    ) -> "PlackettLuceLinear":
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
    (``-inf`` excludes an item). ``temperature`` divides the returned logits.
    """

    def __init__(self, fn: Callable[..., Any], n_items: int, temperature: float = 1.0):
        if not callable(fn):
            raise TypeError(f"logging policy must be callable, got {type(fn).__name__}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.fn = fn
        self.n_items = int(n_items)
        self.temperature = float(temperature)

    def __call__(self, context: jax.Array, item_features: jax.Array | None) -> jax.Array:
        name = getattr(self.fn, "__name__", repr(self.fn))
        try:
            out = self.fn(context, item_features)
        except Exception as err:  # the user's code: say whose call failed
            raise RuntimeError(f"logging policy {name!r} raised {type(err).__name__}: {err}") from err
        out = np.asarray(out, dtype=np.float32)
        expected = (context.shape[0], self.n_items)
        if out.shape != expected:
            raise ValueError(
                f"logging policy {name!r} returned logits of shape {out.shape}; expected "
                f"[n, D] = {expected}"
            )
        if np.isnan(out).any() or np.isposinf(out).any():
            raise ValueError(f"logging policy {name!r} returned NaN or +inf logits")
        if np.isneginf(out).all(axis=1).any():
            raise ValueError(f"logging policy {name!r} excluded every item (-inf) in some row")
        return jnp.asarray(out / self.temperature)


def as_logging_policy(policy: Any, n_items: int) -> Any:
    """Built-in policies pass through; any other callable is wrapped and checked."""
    if isinstance(policy, (PlackettLuceLinear, UniformLogging, CallableLogging)):
        return policy
    return CallableLogging(policy, n_items)
