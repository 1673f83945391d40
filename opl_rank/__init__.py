"""opl_rank: offline learning of ranking policies from logged bandit feedback.

``import opl_rank`` needs only jax, flax, optax and numpy.
"""

from opl_rank import (
    exposure_losses,
    learners,
    ltr_estimators,
    metrics,
    opl_estimators,
    optimization,
    plackett_luce,
    policies,
    reward_models,
)
from opl_rank.data import LoggedData, dcg_position_weights, minibatches, train_val_split
from opl_rank.plackett_luce import (
    PositionMarginals,
    all_rankings,
    enumerate_position_marginals,
    enumerate_ranking_probs,
    estimate_position_marginals,
    exact_position_marginals,
    exact_ranked_item_marginals,
    exact_slot_marginals,
    placement_log_probs,
    position_marginals,
    prefix_log_probs,
    sample_rankings,
    slot_log_probs,
)
from opl_rank import prng
from opl_rank.learners import LearnerConfig, fit, fit_replicas
from opl_rank.prng import make_key, split_seed

__version__ = "0.1.0"

__all__ = [
    "exposure_losses",
    "learners",
    "ltr_estimators",
    "metrics",
    "opl_estimators",
    "optimization",
    "plackett_luce",
    "policies",
    "reward_models",
    "LoggedData",
    "dcg_position_weights",
    "minibatches",
    "train_val_split",
    "PositionMarginals",
    "all_rankings",
    "enumerate_position_marginals",
    "enumerate_ranking_probs",
    "estimate_position_marginals",
    "exact_position_marginals",
    "exact_ranked_item_marginals",
    "exact_slot_marginals",
    "placement_log_probs",
    "position_marginals",
    "prefix_log_probs",
    "sample_rankings",
    "slot_log_probs",
    "prng",
    "LearnerConfig",
    "fit",
    "fit_replicas",
    "make_key",
    "split_seed",
]
