"""Scorers: flax modules that produce Plackett-Luce logits.

``MLPScorer`` scores query-document feature vectors pointwise (LETOR-style candidates):
``[.., D, F] -> [.., D]``; ``ActionScorer`` and ``ItemFeatureScorer`` score a fixed action
set from a context. The ranking policies of [`opl_rank.opl.policies`][opl_rank.opl.policies] wrap these.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["MLPScorer", "ActionScorer", "ItemFeatureScorer", "make_scorer"]


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


class ItemFeatureScorer(nn.Module):
    """A shared per-item scorer over item features packed into the context.

    LETOR-style environments (e.g. [`simulators.semi_synthetic`][simulators.semi_synthetic]) put the ``D``
    candidates' ``F`` features first in the context, flattened item-major:
    ``context[..., :D*F]``; anything after them (such as a query index) is ignored. Every
    item gets the same MLP (``hidden=()``: linear), so the scorer generalises across
    queries whose candidate lists differ.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> model = ItemFeatureScorer(n_items=4, n_features=3, hidden=(8,))
      >>> params = model.init(jax.random.key(0), jnp.zeros((1, 13)))
      >>> model.apply(params, jnp.ones((2, 13))).shape
      (2, 4)
    """

    n_items: int
    n_features: int
    hidden: Sequence[int] = ()

    @nn.compact
    def __call__(self, context: jax.Array) -> jax.Array:
        """``[.., dx >= D*F]`` -> ``[.., D]``."""
        width = self.n_items * self.n_features
        if context.shape[-1] < width:
            raise ValueError(f"context has {context.shape[-1]} columns, fewer than n_items * n_features = {width}")
        features = context[..., :width].reshape(context.shape[:-1] + (self.n_items, self.n_features))
        return MLPScorer(hidden=tuple(self.hidden))(features)


def make_scorer(n_items: int, hidden: Sequence[int] = (), item_feature_dim: int | None = None) -> nn.Module:
    """[`ActionScorer`][ActionScorer] (``item_feature_dim=None``) or [`ItemFeatureScorer`][ItemFeatureScorer]."""
    if item_feature_dim is None:
        return ActionScorer(n_items=n_items, hidden=tuple(hidden))
    return ItemFeatureScorer(n_items=n_items, n_features=item_feature_dim, hidden=tuple(hidden))
