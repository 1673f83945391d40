"""A per-slot estimator defined outside opl_rank: a cascade direct method.

``sum_l w_{1:l-1} sum_d pi(d | x, a_{1:l-1}) alpha_l g(x, d)`` with an additive f_hat's item
values ``g``: its expectation is ``E_{a ~ pi}[f_hat(x, a)]``, formed slot by slot along the
logged prefixes. It reads two inputs no built-in estimator passes (the target's choice
distribution ``[n, L, D]`` and f_hat's item values ``[n, D]``) and builds them with its own
hook; importing this module registers it as ``"cascade_dm"``; nothing else changes.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.estimator_inputs import choice_probs, slot_item_values


class SlotInputs(NamedTuple):
    choice: jax.Array  # [n, L, D]
    item_values: jax.Array  # [n, D]


def slot_inputs(request):
    return SlotInputs(choice_probs(request), slot_item_values(request))


def cascade_dm_terms(target, batch, *, model=None, k=None, max_log_weight=jnp.inf, inputs=None):
    w = opl_estimators.importance_weight(target.log_prefix, batch.log_pi0_prefix, max_log_weight)  # [n, L]
    w_prev = jnp.concatenate([jnp.ones_like(w[:, :1]), w[:, :-1]], axis=1)
    log_prev = jnp.concatenate([jnp.zeros_like(w[:, :1]), target.log_prefix[:, :-1]], axis=1)
    values = jax.lax.stop_gradient(inputs.item_values)[:, None, :] * batch.position_weight[None, :, None]
    expected = jnp.sum(inputs.choice * values, axis=-1)  # [n, L], differentiable in the choices
    sg = jax.lax.stop_gradient
    slot = opl_estimators.boxed(w_prev, sg(expected), log_prev) + w_prev * (expected - sg(expected))
    return opl_estimators.Terms(jnp.sum(slot, axis=-1), w_prev)


opl_estimators.register(
    "cascade_dm",
    opl_estimators.Estimator(cascade_dm_terms, needs_reward_model=True, inputs=slot_inputs),
)
