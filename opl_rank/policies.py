"""Scorers: flax modules that produce Plackett-Luce logits.

``MLPScorer`` scores query-document feature vectors pointwise (LETOR-style candidates):
``[.., D, F] -> [.., D]``. The ranking-policy interface of the OPL learners builds on these.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["MLPScorer", "ActionScorer"]


class MLPScorer(nn.Module):
    """Pointwise MLP scorer: ReLU hidden layers, one linear output per document.

    The exposure paper uses ``hidden=(1024, 512, 256)``.

    Attributes:
      hidden: hidden layer sizes.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> model = MLPScorer(hidden=(8,))
      >>> params = model.init(jax.random.key(0), jnp.zeros((2, 5, 3)))
      >>> model.apply(params, jnp.ones((2, 5, 3))).shape
      (2, 5)
    """

    hidden: Sequence[int] = (1024, 512, 256)

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        """``[.., D, F]`` float32 features -> ``[.., D]`` float32 logits."""
        x = features.astype(jnp.float32)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(1)(x)[..., 0]


class ActionScorer(nn.Module):
    """Per-action head over a fixed action set: ``[.., dx] -> [.., D]`` logits.

    ``hidden=()`` is linear (``theta_a^T x + b_a``, the form of the synthetic environment);
    otherwise a ReLU MLP with a D-way output.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> model = ActionScorer(n_items=4)
      >>> params = model.init(jax.random.key(0), jnp.zeros((1, 5)))
      >>> model.apply(params, jnp.ones((3, 5))).shape
      (3, 4)
    """

    n_items: int
    hidden: Sequence[int] = ()

    @nn.compact
    def __call__(self, context: jax.Array) -> jax.Array:
        """``[.., dx]`` -> ``[.., D]``."""
        x = context.astype(jnp.float32)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.n_items)(x)
