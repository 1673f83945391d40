"""Off-policy learning and evaluation of ranking policies from logged bandit feedback.

The estimator registry ([`estimators`][opl_rank.opl.estimators]), ranking policies and their
propensities ([`policies`][opl_rank.opl.policies]), reward models f_hat and their second-stage
completion, the learners ([`learners`][opl_rank.opl.learners]), off-policy evaluation
([`ope`][opl_rank.opl.ope]) and the choice of R-POD's k ([`select_k`][opl_rank.opl.select_k]).
"""

from opl_rank.opl import completion, estimators, learners, ope, policies, reward_models, select_k

__all__ = ["completion", "estimators", "learners", "ope", "policies", "reward_models", "select_k"]
