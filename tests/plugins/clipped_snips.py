"""A new estimator defined outside opl_rank: self-normalised IPS with its weights capped at 20.

Importing this module registers it as ``"capped_snips"``; nothing else in the package changes.
"""

import math

import jax.numpy as jnp

from opl_rank.opl import estimators as opl_estimators
from opl_rank.pl.gradients import magic_box


def capped_snips_terms(target, batch, *, model=None, k=None, max_log_weight=jnp.inf):
    """``sum_i w_i R_i / sum_i w_i`` with ``w_i = min(pi / pi_0, 20)``."""
    cap = jnp.minimum(max_log_weight, math.log(20.0))
    log_pi = target.log_prefix[..., -1]
    w = opl_estimators.importance_weight(log_pi, batch.log_pi0_prefix[..., -1], cap)
    reward = opl_estimators.weighted_reward(batch.reward, batch.position_weight)
    value = magic_box(w * reward, w * reward * log_pi)
    return opl_estimators.Terms(value, w, normalizer=w)


opl_estimators.register("capped_snips", opl_estimators.Estimator(capped_snips_terms))
