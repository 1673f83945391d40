"""opl_rank: offline learning of ranking policies from logged bandit feedback.

Layers, each importing only those before it: [`opl_rank.pl`][opl_rank.pl] (Plackett-Luce maths,
marginals, PL policy-gradient estimators); the shared core ([`data`][opl_rank.data],
[`optimization`][opl_rank.optimization], [`scorers`][opl_rank.scorers], [`metrics`][opl_rank.metrics],
[`prng`][opl_rank.prng], [`tuning`][opl_rank.tuning]); [`opl_rank.opl`][opl_rank.opl] (off-policy learning
and evaluation); [`opl_rank.ltr`][opl_rank.ltr] (learning to rank from labels and clicks);
[`opl_rank.io`][opl_rank.io] (tables, saved policies, interop). The names below are the stable API.

``import opl_rank`` needs only jax, flax, optax and numpy.
"""

from opl_rank import _aliases, compilation_cache, io, ltr, memory, metrics, opl, optimization, pl, prng, scorers, tuning
from opl_rank._version import __version__
from opl_rank.compilation_cache import enable_compilation_cache
from opl_rank.data import LoggedData, minibatches, train_val_split
from opl_rank.io import persistence
from opl_rank.io.persistence import load_policy, register_policy_class, save_policy
from opl_rank.ltr import exposure_losses, pairwise
from opl_rank.metrics import dcg_position_weights
from opl_rank.opl import completion, learners, ope, policies, reward_models
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl import select_k as k_selection
from opl_rank.opl.estimators import OPL_ESTIMATORS, Estimator, ModelTerms, Propensities, Terms, register
from opl_rank.opl.estimators import OPL_ESTIMATORS as ESTIMATORS
from opl_rank.opl.learners import LearnerConfig, fit, fit_seeds, learning_methods, register_learner
from opl_rank.opl.ope import OPEResult, evaluate
from opl_rank.opl.policies import PLPolicy, RankingPolicy, RegressionPolicy, TwoStagePolicy, greedy_rankings
from opl_rank.opl.reward_models import RewardModel, fit_reward_model
from opl_rank.opl.select_k import KSelection, select_k
from opl_rank.optimization import TrainConfig, minimize
from opl_rank.pl import gradients as ltr_estimators
from opl_rank.pl import marginals, plackett_luce
from opl_rank.pl.marginals import (
    PositionMarginals,
    estimate_position_marginals,
    exact_position_marginals,
    exact_ranked_item_marginals,
    exact_slot_marginals,
    insertion_slot_marginals,
    position_marginals,
    sampled_slot_marginals,
)
from opl_rank.pl.plackett_luce import (
    all_rankings,
    enumerate_position_marginals,
    enumerate_ranking_probs,
    placement_log_probs,
    prefix_log_probs,
    sample_rankings,
    slot_log_probs,
)
from opl_rank.prng import make_key, split_seed

_aliases.install()

__all__ = [
    "__version__",
    # layers
    "io",
    "ltr",
    "opl",
    "pl",
    # modules
    "compilation_cache",
    "completion",
    "exposure_losses",
    "k_selection",
    "learners",
    "ltr_estimators",
    "marginals",
    "memory",
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
    "tuning",
    # data
    "LoggedData",
    "minibatches",
    "train_val_split",
    # metrics
    "dcg_position_weights",
    # estimators (one registry)
    "ESTIMATORS",
    "OPL_ESTIMATORS",
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
    "register_learner",
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
    "register_policy_class",
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
