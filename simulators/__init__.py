"""Simulators of logged ranking feedback (depend on opl_rank's math and data layers only)."""

from simulators import datasets
from simulators.letor import LetorData, load_letor, normalize_per_query, split_queries, take_queries
from simulators.logging_policies import (
    CallableLogging,
    PlackettLuceLinear,
    UniformLogging,
    as_logging_policy,
)
from simulators.rollout import PolicyValue, evaluate_policy, rollout_logging_policy
from simulators.synthetic import SyntheticRankingEnv, SyntheticRewardModel, SyntheticRewards

__all__ = [
    "CallableLogging",
    "PlackettLuceLinear",
    "UniformLogging",
    "as_logging_policy",
    "LetorData",
    "load_letor",
    "normalize_per_query",
    "split_queries",
    "take_queries",
    "PolicyValue",
    "evaluate_policy",
    "rollout_logging_policy",
    "SyntheticRankingEnv",
    "SyntheticRewards",
    "SyntheticRewardModel",  # the name before 0.2.0 (one release)
    "datasets",
]
