"""Off-policy learning and evaluation of ranking policies from logged bandit feedback.

The estimator registry ([`estimators`][opl_rank.opl.estimators]) and what its estimators read
([`estimator_inputs`][opl_rank.opl.estimator_inputs]; Cascade-DR: [`cascade_dr`][opl_rank.opl.cascade_dr]; adaptive IPS: [`aips`][opl_rank.opl.aips]), ranking policies and their
propensities ([`policies`][opl_rank.opl.policies]), reward models f_hat and their second-stage
completion, the learners ([`learners`][opl_rank.opl.learners]), off-policy evaluation
([`ope`][opl_rank.opl.ope]), the choice of R-POD's k ([`select_k`][opl_rank.opl.select_k]) and
R-POD's measured error sources ([`diagnostics`][opl_rank.opl.diagnostics]).
"""

from opl_rank.opl import (
    aips,
    cascade_dr,
    completion,
    diagnostics,
    estimator_inputs,
    estimators,
    learners,
    ope,
    policies,
    reward_models,
    select_k,
)

__all__ = [
    "aips",
    "cascade_dr",
    "completion",
    "diagnostics",
    "estimator_inputs",
    "estimators",
    "learners",
    "ope",
    "policies",
    "reward_models",
    "select_k",
]
