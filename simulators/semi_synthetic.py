"""Semi-synthetic OPL environments on real LETOR data (R-POD paper, real-data experiment).

Contexts are queries of a LETOR file. Per query, ``D`` of its documents are sampled once
(without replacement; queries with fewer than ``D`` documents are skipped and counted).
The base reward of a document is ``rel / 4 + eta`` with ``eta ~ N(0, eta_scale^2)`` drawn
once per (query, document); position rewards add the synthetic simulator's interaction
term ``F`` (``lambda``, a symmetric ``W`` over the ``D`` candidate slots) and Gaussian noise
``sigma`` (paper: 0.05). Logging policies: uniform PL; PL over a scikit-learn
``RandomForestRegressor`` trained on the documents of a share of the queries (paper: 10%),
with temperature ``tau``; or a user's callable ``(context, item_features) -> logits``.

Context layout (what policies see): ``[n, D*F + 1]``, the ``D`` candidates' ``F`` features
flattened item-major, then the query's index (read only by the environment's own reward
model and logging table). Learners score items from their features with
``LearnerConfig(item_feature_dim=F)`` ([`opl_rank.scorers.ItemFeatureScorer`][opl_rank.scorers.ItemFeatureScorer]).

The environment is a [`simulators.synthetic.SyntheticRankingEnv`][simulators.synthetic.SyntheticRankingEnv] in every other
respect -- logged data, ground-truth ``V(pi)``, ``V(pi_0)``, ``V*`` (exact up to 2e6
rankings, beam search beyond) -- so every learner, OPE estimator and the sweep runner work
on it unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from simulators.letor import LetorData
from simulators.logging_policies import UniformLogging, as_logging_policy
from simulators.synthetic import InteractionRewards, SyntheticRankingEnv, check_environment_args, symmetric_interaction

__all__ = [
    "SemiSyntheticRewards",
    "SemiSyntheticRewardModel",
    "TableLogging",
    "SemiSyntheticEnv",
    "LOGGING_POLICIES",
    "forest_relevance_scores",
]

LOGGING_POLICIES = ("random_forest", "uniform")


def _query_index(context: jax.Array) -> jax.Array:
    return context[:, -1].astype(jnp.int32)


class SemiSyntheticRewards(InteractionRewards, struct.PyTreeNode):
    """Rewards ``rel/4 + eta + lambda-interactions`` per query (a pytree).

    Attributes:
      base_table: ``[Q, D]`` ``rel / 4 + eta`` of every query's candidates.
      interaction: ``[D, D]`` W over candidate slots, symmetric, zero diagonal.
      lam: ``[]`` interaction strength in [0, 1].
      sigma: ``[]`` reward noise.
    """

    base_table: jax.Array  # [Q, D]
    interaction: jax.Array  # [D, D]
    lam: jax.Array  # []
    sigma: jax.Array  # []

    def item_base(self, context: jax.Array) -> jax.Array:
        """``[n, D*F + 1] -> [n, D]`` (the query index is the context's last column)."""
        return self.base_table[_query_index(context)]


class TableLogging(struct.PyTreeNode):
    """A logging policy with precomputed scores per query: logits ``scores[q] / temperature``."""

    scores: jax.Array  # [Q, D]
    temperature: jax.Array  # []

    def __call__(self, context: jax.Array, item_features: jax.Array | None) -> jax.Array:
        return self.scores[_query_index(context)] / self.temperature


@dataclasses.dataclass(frozen=True)
class SemiSyntheticEnv(SyntheticRankingEnv):
    """A semi-synthetic environment over the queries of a LETOR data set.

    Extra attributes: ``contexts [Q, D*F + 1]`` (every query's context), ``labels [Q, D]``
    (the sampled documents' graded relevance), ``n_features`` (F), ``skipped_queries``
    (queries with fewer than D documents), ``logging_name``.

    Examples:
      >>> import numpy as np, jax
      >>> from simulators.letor import LetorData
      >>> rng = np.random.default_rng(0)
      >>> letor = LetorData(rng.random((6, 5, 3), dtype=np.float32), rng.integers(0, 5, (6, 5)).astype(np.float32),
      ...                   np.ones((6, 5), bool), np.arange(6), 3, "toy")
      >>> env = SemiSyntheticEnv.create(jax.random.key(0), letor, n_items=4, ranking_length=2, logging_policy="uniform")
      >>> env.sample_logged_data(jax.random.key(1), 7).context.shape
      (7, 13)
    """

    contexts: jax.Array = None  # [Q, D*F + 1]
    labels: np.ndarray = None  # [Q, D]
    n_features: int = 0
    skipped_queries: int = 0
    logging_name: str = ""

    @classmethod
    def create(
        cls,
        key: jax.Array,
        letor: LetorData,
        *,
        n_items: int = 10,
        ranking_length: int = 3,
        lam: float = 0.5,
        sigma: float = 0.05,
        eta_scale: float = 0.05,
        interaction_scale: float = 0.25,
        max_label: float = 4.0,
        position_weight: Any = None,
        logging_policy: Any = "random_forest",
        logging_temperature: float = 1.0,
        forest_fraction: float = 0.1,
        forest_options: dict[str, Any] | None = None,
    ) -> SemiSyntheticEnv:
        """Build the environment from a LETOR data set.

        Args:
          key: PRNG key (document sampling, eta, W, the forest's query share and seed).
          letor: queries from [`simulators.letor.load_letor`][simulators.letor.load_letor].
          n_items: ``D``, documents sampled per query (paper: Yahoo 10, MSLR-WEB10K 100).
          ranking_length: ``L`` (paper: Yahoo 3, MSLR-WEB10K 5).
          lam: interaction strength lambda in [0, 1].
          sigma: reward noise (paper: 0.05).
          eta_scale: standard deviation of the per-document base-reward noise (paper: 0.05).
          interaction_scale: standard deviation of W's entries (ours: 0.25, a quarter of
            the base reward's range; the paper does not give it).
          max_label: the largest relevance grade (base reward ``rel / max_label``).
          position_weight: ``[L]`` alpha (default DCG).
          logging_policy: ``"random_forest"``, ``"uniform"`` or a callable
            ``(context [n, D*F+1], item_features [D, D]) -> logits [n, D]``.
          logging_temperature: tau of the random-forest PL (> 0).
          forest_fraction: share of the queries whose documents train the forest, in (0, 1].
          forest_options: keyword arguments of ``RandomForestRegressor`` (default
            ``n_estimators=100, min_samples_leaf=5``).

        Returns:
          The environment.
        """
        position_weight = check_environment_args(
            n_items,
            ranking_length,
            lam,
            logging_temperature,
            position_weight,
            sigma=sigma,
            eta_scale=eta_scale,
            interaction_scale=interaction_scale,
        )
        if not 0.0 < forest_fraction <= 1.0:
            raise ValueError(f"forest_fraction must be in (0, 1], got {forest_fraction}")
        if isinstance(logging_policy, str) and logging_policy not in LOGGING_POLICIES:
            raise ValueError(f"logging_policy must be one of {LOGGING_POLICIES} or a callable, got {logging_policy!r}")

        counts = np.asarray(letor.mask).sum(axis=1)
        keep = np.flatnonzero(counts >= n_items)
        if keep.size == 0:
            raise ValueError(
                f"no query of {letor.path!r} has n_items={n_items} documents (most: {int(counts.max(initial=0))})"
            )
        k_docs, k_eta, k_w, k_forest = jax.random.split(key, 4)
        rng = np.random.default_rng(np.asarray(jax.random.randint(k_docs, (2,), 0, 2**31 - 1)))
        picks = np.stack([rng.choice(int(counts[q]), size=n_items, replace=False) for q in keep])  # [Q, D]
        features = np.asarray(letor.features)[keep[:, None], picks].astype(np.float32)  # [Q, D, F]
        labels = np.asarray(letor.labels)[keep[:, None], picks].astype(np.float32)  # [Q, D]
        n_q, n_features = len(keep), features.shape[-1]

        eta = jax.random.normal(k_eta, (n_q, n_items), jnp.float32) * eta_scale
        reward_model = SemiSyntheticRewards(
            base_table=jnp.asarray(labels / max_label) + eta,
            interaction=symmetric_interaction(k_w, n_items, interaction_scale),
            lam=jnp.asarray(lam, jnp.float32),
            sigma=jnp.asarray(sigma, jnp.float32),
        )
        name = logging_policy if isinstance(logging_policy, str) else getattr(logging_policy, "__name__", "callable")
        if logging_policy == "uniform":
            logging = UniformLogging(n_items)
        elif logging_policy == "random_forest":
            seed = int(jax.random.randint(k_forest, (), 0, 2**31 - 1))
            scores = forest_relevance_scores(seed, letor, features, forest_fraction, forest_options)
            logging = TableLogging(jnp.asarray(scores), jnp.asarray(logging_temperature, jnp.float32))
        else:
            logging = as_logging_policy(logging_policy, n_items)
        contexts = np.concatenate([features.reshape(n_q, -1), np.arange(n_q, dtype=np.float32)[:, None]], axis=1)
        return cls(
            reward_model=reward_model,
            logging_policy=logging,
            position_weight=position_weight,
            item_features=jnp.eye(n_items, dtype=jnp.float32),
            n_items=n_items,
            ranking_length=ranking_length,
            context_dim=contexts.shape[1],
            contexts=jnp.asarray(contexts),
            labels=labels,
            n_features=n_features,
            skipped_queries=int(len(counts) - n_q),
            logging_name=name,
        )

    @property
    def n_queries(self) -> int:
        return int(self.contexts.shape[0])

    def sample_contexts(self, key: jax.Array, n: int) -> jax.Array:
        """Queries drawn uniformly with replacement: ``[n, D*F + 1]``."""
        return self.contexts[jax.random.randint(key, (n,), 0, self.n_queries)]


def forest_relevance_scores(
    seed: int, letor: LetorData, features: np.ndarray, fraction: float = 0.1, options: dict | None = None
) -> np.ndarray:
    """A random forest's predicted relevance of documents: ``[..., D, F] -> [..., D]``.

    Trained on all documents of a random ``fraction`` of ``letor``'s queries (features to
    graded label), as the paper's logging model; also a cheap "production ranker" for
    click simulations.

    Args:
      seed: chooses the queries and seeds the forest.
      letor: the labelled queries to train on.
      features: documents to score, ``[..., F]`` with the same F.
      fraction: share of the queries used, in (0, 1].
      options: keyword arguments of ``RandomForestRegressor`` (default
        ``n_estimators=100, min_samples_leaf=5``, one job).
    """
    from sklearn.ensemble import RandomForestRegressor

    rng = np.random.default_rng(seed)
    n_all = letor.mask.shape[0]
    chosen = rng.choice(n_all, size=max(1, int(round(fraction * n_all))), replace=False)
    mask = np.asarray(letor.mask)[chosen]
    x = np.asarray(letor.features)[chosen][mask]
    y = np.asarray(letor.labels)[chosen][mask]
    settings = {"n_estimators": 100, "min_samples_leaf": 5, "random_state": seed, "n_jobs": 1, **(options or {})}
    forest = RandomForestRegressor(**settings).fit(x, y)
    flat = np.asarray(features, np.float32).reshape(-1, features.shape[-1])
    return forest.predict(flat).reshape(features.shape[:-1]).astype(np.float32)


SemiSyntheticRewardModel = SemiSyntheticRewards  # its name before 0.2.0 (one release)
