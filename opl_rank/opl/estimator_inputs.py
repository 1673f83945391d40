"""What an estimator reads, built in one place for learning and for evaluation.

A registry entry ([`opl_rank.opl.estimators.Estimator`][opl_rank.opl.estimators.Estimator]) gets three
kinds of input:

* the target's [`Propensities`][opl_rank.opl.estimators.Propensities] of the logged rankings (always;
  position marginals when ``needs_position_marginals``);
* [`ModelTerms`][opl_rank.opl.estimators.ModelTerms] of the f_hat a learner or OPE was given
  (``needs_reward_model``), built by [`model_terms`][model_terms];
* anything else it asks for through its own ``inputs`` hook: a function of one
  [`InputRequest`][InputRequest] (the policy, the batch, a key, the optional reward model, k, whether
  the inputs must carry a policy gradient, and what the caller supplied for this estimator),
  whose result reaches ``terms(..., inputs=...)``. The helpers here build the common ones:
  [`choice_probs`][choice_probs] (the target's next-item distribution at every logged prefix,
  ``[n, L, D]``) and [`slot_item_values`][slot_item_values] (an additive f_hat's per-item values).

The learners ([`opl_rank.opl.learners`][opl_rank.opl.learners]), [`opl_rank.opl.ope.evaluate`][opl_rank.opl.ope.evaluate],
``select_k`` and the sweep all go through [`build`][build] and [`call_terms`][call_terms], so an
estimator that needs a new input is one module that registers it (``opl_rank.opl.cascade_dr``
is one; ``tests/plugins/cascade_dm.py`` is one outside the package).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from opl_rank import tuning
from opl_rank.data import LoggedData
from opl_rank.opl import completion
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl.estimators import Estimator, ModelTerms, Propensities, Terms
from opl_rank.program_cache import cached_jit

__all__ = [
    "InputRequest",
    "build",
    "call_terms",
    "model_terms",
    "model_values",
    "choice_probs",
    "slot_item_values",
]


@dataclasses.dataclass(frozen=True)
class InputRequest:
    """Everything an estimator's inputs may be built from.

    Attributes:
      policy: the target [`RankingPolicy`][opl_rank.opl.policies.RankingPolicy] (when learning: a
        ``PLPolicy`` whose parameters are traced).
      batch: the logged rounds, [`LoggedData`][opl_rank.data.LoggedData] (``n`` rows).
      key: a PRNG key for Monte Carlo inputs.
      reward_model: the fitted f_hat, or None.
      k: R-POD's k (for an estimator with ``uses_k``), else None.
      learning: True inside a learner's loss: inputs must be differentiable in the policy's
        parameters where the estimator's gradient needs them (magic boxes), and must not
        leave the traced program (no host work); False in OPE (plain values; host work such
        as fitting a model is allowed).
      n_samples: Monte Carlo samples for expectations under the policy.
      given: what the caller supplied for this estimator (``ope.evaluate(inputs={name: ...})``),
        or None.
      extras: other per-row arrays a learner computed once (e.g. ``"completion_order"``).
    """

    policy: Any
    batch: LoggedData
    key: jax.Array
    reward_model: Any = None
    k: int | None = None
    learning: bool = False
    n_samples: int = 256
    given: Any = None
    extras: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def build(entry: Estimator, request: InputRequest, *, model: ModelTerms | None = None) -> tuple[ModelTerms | None, Any]:
    """``(model, inputs)`` for ``entry``: ``model`` is reused when given (OPE builds it once
    for all its estimators), else built by [`model_terms`][model_terms] when the entry needs a
    reward model; ``inputs`` is the entry's own hook's result (None without a hook)."""
    if entry.needs_reward_model and model is None:
        if request.reward_model is None:
            raise ValueError("this estimator needs a reward model (reward_model=)")
        model = model_terms(request)
    inputs = entry.inputs(request) if entry.inputs is not None else None
    return (model if entry.needs_reward_model else None), inputs


def call_terms(
    entry: Estimator,
    target: Propensities,
    batch: LoggedData,
    *,
    model: ModelTerms | None = None,
    k: int | None = None,
    max_log_weight: float = jnp.inf,
    inputs: Any = None,
) -> Terms:
    """``entry.terms(...)``, passing ``inputs=`` only to an entry with an ``inputs`` hook (so
    estimators written before hooks existed keep their signature)."""
    kwargs: dict[str, Any] = {"model": model, "k": k if entry.uses_k else None, "max_log_weight": max_log_weight}
    if entry.inputs is not None:
        kwargs["inputs"] = inputs
    return entry.terms(target, batch, **kwargs)


# ---------------------------------------------------------------------------------------
# Reward-model terms
# ---------------------------------------------------------------------------------------
def model_terms(request: InputRequest) -> ModelTerms:
    """[`ModelTerms`][opl_rank.opl.estimators.ModelTerms] of ``request.reward_model``: ``f_hat`` at the
    logged rankings ``[n]`` and ``E_{a ~ pi}[f_hat(x, a)]`` ``[n]``.

    Learning (``request.learning``): a magic box whose gradient is the model part of the policy
    gradient -- marginalize-all (exposure paper Eq. 30) for an additive f_hat over all L slots,
    else the score function over ``n_samples`` sampled top-``k`` prefixes completed by f_hat
    (R-POD's second stage). Evaluation: the plain mean of [`model_values`][model_values].
    """
    policy, batch, reward_model = request.policy, request.batch, request.reward_model
    logged = reward_model.predict(batch.context, batch.ranking)
    if not request.learning:
        value = model_values(
            policy,
            reward_model,
            batch.context,
            request.key,
            n_samples=request.n_samples,
            where=batch.item_mask,
            n_items=batch.n_items,
        )
        return ModelTerms(logged, value)
    n_slots, k = batch.ranking.shape[-1], policy.n_slots
    logits = policy.logits(batch.context)
    if k == n_slots and reward_model.kind == "additive":
        value = opl_estimators.additive_model_value(
            logits,
            reward_model.item_values(batch.context),
            batch.position_weight,
            request.key,
            request.n_samples,
            where=batch.item_mask,
        )
    else:
        order, table = request.extras.get("completion_order"), request.extras.get("prefix_values")

        def value_fn(prefixes):
            if table is not None:  # every prefix's completed value, computed once per fit
                return completion.prefix_table_values(table, prefixes, batch.n_items)
            completed = reward_model.complete(batch.context, prefixes, where=batch.item_mask, order=order)
            return reward_model.predict(batch.context, completed)

        value = opl_estimators.ranking_model_value(
            logits, value_fn, k, request.key, request.n_samples, where=batch.item_mask
        )
    return ModelTerms(logged, value)


def model_values(
    policy: Any,
    reward_model: Any,
    context: jax.Array,
    key: jax.Array,
    *,
    n_samples: int = 256,
    where: jax.Array | None = None,
    n_items: int | None = None,
) -> jax.Array:
    """``E_{a ~ pi}[f_hat(x, a)]`` per row ``[n]``: exact for deterministic policies, a
    Monte Carlo mean over ``n_samples`` rankings for stochastic ones (of the candidates
    ``where`` allows). ``n_items`` (D) only sizes the batches of samples (default 1024)."""
    if _is_pytree(policy) and _is_pytree(reward_model):  # this library's policies: one compiled program
        return _compiled_model_values(policy, reward_model, context, key, n_samples, where, n_items)
    return _model_values(policy, reward_model, context, key, n_samples, where, n_items)


def _is_pytree(x: Any) -> bool:
    return not jax.tree_util.all_leaves([x])


def _model_values(policy, reward_model, context, key, n_samples, where, n_items):
    if policy.deterministic:
        return reward_model.predict(context, policy.sample(None, context, where=where))
    keys = jax.random.split(key, n_samples)
    # Samples in batches of about tuning.OPE_BATCH_FLOATS sampling intermediates ([b, n, D]) each:
    # bounded memory at any n, and the same keys (hence values) as one vmap over all of them.
    per_sample = context.shape[0] * max(1024 if n_items is None else n_items, policy.n_slots)
    batch = int(max(1, min(n_samples, tuning.OPE_BATCH_FLOATS // per_sample)))
    if _prefix_table_pays(policy, context.shape[0], n_samples):
        # A sampled prefix plus a deterministic completion: complete each possible prefix once
        # per row, then read the samples' values (the same prefixes and values as completing them)
        table = policy.prefix_values(reward_model.predict, context, where=where)  # [n, P]

        def draw(k):
            return completion.prefix_table_values(table, policy.sample_prefix(k, context, where=where), policy.n_items)

    else:

        def draw(k):
            return reward_model.predict(context, policy.sample(k, context, where=where))

    values = jax.lax.map(draw, keys, batch_size=batch)  # [N, n]
    return jnp.mean(values, axis=0)


def _prefix_table_pays(policy: Any, n_rows: int, n_samples: int) -> bool:
    """Whether a policy that samples a top-k prefix and completes it deterministically
    (``sample_prefix`` / ``prefix_values``) is cheaper to average through its table of every
    prefix's value: at most ``n_samples`` prefixes per row, 1 <= k < L, and the ``[n, P]`` table
    within ``tuning.PREFIX_TABLE_FLOATS``."""
    if not hasattr(policy, "prefix_values") or not 0 < policy.k < policy.n_slots:
        return False
    n_prefixes = math.perm(policy.n_items, policy.k)
    return (
        policy.n_items**policy.k <= 2**16
        and n_prefixes <= n_samples
        and n_prefixes * n_rows <= tuning.PREFIX_TABLE_FLOATS
    )


_compiled_model_values = cached_jit(_model_values, static_argnames=("n_samples", "n_items"), xla_defaults=True)


# ---------------------------------------------------------------------------------------
# Per-slot inputs
# ---------------------------------------------------------------------------------------
def choice_probs(request: InputRequest) -> jax.Array:
    """``pi(d | x, a_{1:l-1})`` at every logged prefix: ``[n, L, D]``.

    The policy's own ``choice_probs(data)`` (a [`PLPolicy`][opl_rank.opl.policies.PLPolicy]: the masked
    softmax along the logged ranking, differentiable in its parameters; a deterministic or
    two-stage policy: its next choice where the logged prefix is on its support). A caller's
    array (``request.given`` as ``{"choice_probs": [n, L, D]}``) takes precedence.

    Raises:
      ValueError: the policy has no ``choice_probs`` and none was given, or the given array
        has the wrong shape.
    """
    batch = request.batch
    shape = (batch.ranking.shape[0], batch.ranking.shape[1], batch.n_items)
    given = request.given.get("choice_probs") if isinstance(request.given, Mapping) else None
    if given is not None:
        given = jnp.asarray(given, jnp.float32)
        if given.shape != shape:
            raise ValueError(f"choice_probs must have shape [n, L, D]={list(shape)}, got {list(given.shape)}")
        return given
    method = getattr(request.policy, "choice_probs", None)
    if not callable(method):
        raise ValueError(
            f"this estimator needs the target's choice distribution at each logged prefix: "
            f"{type(request.policy).__name__} has no choice_probs(data) method; pass "
            f"inputs={{name: {{'choice_probs': array [n, L, D]}}}}"
        )
    return method(batch)


def slot_item_values(request: InputRequest) -> jax.Array:
    """An additive f_hat's item values ``g(x, d)`` ``[n, D]`` (a ValueError for other kinds)."""
    model = request.reward_model
    if model is None:
        raise ValueError("this estimator needs a reward model (reward_model=)")
    return model.item_values(request.batch.context)
