"""Off-policy learning and evaluation of ranking policies from logged bandit feedback.

The estimator registry (:mod:`~opl_rank.opl.estimators`), ranking policies and their
propensities (:mod:`~opl_rank.opl.policies`), reward models f_hat and their second-stage
completion, the learners (:mod:`~opl_rank.opl.learners`), off-policy evaluation
(:mod:`~opl_rank.opl.ope`) and the choice of R-POD's k (:mod:`~opl_rank.opl.select_k`).
"""

from opl_rank.opl import completion, estimators, learners, ope, policies, reward_models, select_k

__all__ = ["completion", "estimators", "learners", "ope", "policies", "reward_models", "select_k"]
