"""opl_rank: offline learning of ranking policies from logged bandit feedback.

``import opl_rank`` needs only jax, flax, optax and numpy.
"""

from opl_rank import (
    compilation_cache,
    completion,
    exposure_losses,
    learners,
    ltr_estimators,
    marginals,
    memory,
    metrics,
    ope,
    opl_estimators,
    optimization,
    pairwise,
    persistence,
    plackett_luce,
    policies,
    prng,
    reward_models,
    scorers,
    select_k as k_selection,
)
from opl_rank.compilation_cache import enable_compilation_cache
from opl_rank.data import LoggedData, minibatches, train_val_split
from opl_rank.learners import LearnerConfig, fit, fit_seeds, learning_methods
from opl_rank.marginals import (
    PositionMarginals,
    estimate_position_marginals,
    exact_position_marginals,
    exact_ranked_item_marginals,
    exact_slot_marginals,
    insertion_slot_marginals,
    position_marginals,
    sampled_slot_marginals,
)
from opl_rank.metrics import dcg_position_weights
from opl_rank.ope import OPEResult, evaluate
from opl_rank.opl_estimators import ESTIMATORS, Estimator, ModelTerms, Propensities, Terms, register
from opl_rank.optimization import TrainConfig, minimize
from opl_rank.plackett_luce import (
    all_rankings,
    enumerate_position_marginals,
    enumerate_ranking_probs,
    placement_log_probs,
    prefix_log_probs,
    sample_rankings,
    slot_log_probs,
)
from opl_rank.persistence import load_policy, save_policy
from opl_rank.policies import PLPolicy, RankingPolicy, RegressionPolicy, TwoStagePolicy, greedy_rankings
from opl_rank.prng import make_key, split_seed
from opl_rank.reward_models import RewardModel, fit_reward_model
from opl_rank.select_k import KSelection, select_k

__version__ = "0.1.0"

__all__ = [
    # modules
    "compilation_cache",
    "completion",
    "exposure_losses",
    "k_selection",
    "learners",
    "ltr_estimators",
    "marginals",
    "metrics",
    "ope",
    "opl_estimators",
    "optimization",
    "pairwise",
    "persistence",
    "plackett_luce",
    "policies",
    "prng",
    "reward_models",
    "scorers",
    # data
    "LoggedData",
    "minibatches",
    "train_val_split",
    # metrics
    "dcg_position_weights",
    # estimators (one registry)
    "ESTIMATORS",
    "Estimator",
    "ModelTerms",
    "Propensities",
    "Terms",
    "register",
    # learning and evaluation
    "LearnerConfig",
    "fit",
    "fit_seeds",
    "learning_methods",
    "TrainConfig",
    "minimize",
    "RewardModel",
    "fit_reward_model",
    "OPEResult",
    "evaluate",
    "KSelection",
    "select_k",
    # policies
    "RankingPolicy",
    "PLPolicy",
    "RegressionPolicy",
    "TwoStagePolicy",
    "greedy_rankings",
    "save_policy",
    "load_policy",
    # Plackett-Luce
    "all_rankings",
    "enumerate_position_marginals",
    "enumerate_ranking_probs",
    "placement_log_probs",
    "prefix_log_probs",
    "sample_rankings",
    "slot_log_probs",
    # position marginals
    "PositionMarginals",
    "estimate_position_marginals",
    "exact_position_marginals",
    "exact_ranked_item_marginals",
    "exact_slot_marginals",
    "insertion_slot_marginals",
    "position_marginals",
    "sampled_slot_marginals",
    # keys
    "make_key",
    "split_seed",
    # JAX's persistent compilation cache
    "enable_compilation_cache",
]
