"""Rolling a logging policy out in an environment: contexts -> PL rankings -> rewards.

Shared by every simulator. Rows are processed in fixed-size chunks (the last one padded),
so one compiled kernel serves any ``n`` and no intermediate grows with ``n``
(docs/performance.md §2: fresh buffers of hundreds of MB are 7-10x slower to write). Within a
chunk everything is vectorised; there is no Python loop over rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank import memory
from opl_rank.opl.policies import MIN_MARGINAL, compiled_sample
from opl_rank.pl import marginals
from opl_rank.pl import plackett_luce as pl
from opl_rank.program_cache import cached_jit

__all__ = [
    "GroundTruthRewards",
    "RewardModel",
    "PolicyValue",
    "chunk_rows",
    "rollout_logging_policy",
    "evaluate_policy",
    "POSITION_MARGINAL_MODES",
]

POSITION_MARGINAL_MODES = ("none", "exact")


class GroundTruthRewards(Protocol):
    """Ground truth of an environment (a pytree, so it passes through ``jit``)."""

    def expected_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``[n, dx], [n, L] -> [n, L]`` q_l(x, a)."""

    def sample_reward(self, key: jax.Array, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``[n, dx], [n, L] -> [n, L]`` sampled r_l."""


RewardModel = GroundTruthRewards  # its name before 0.2.0 (one release): opl_rank's RewardModel is the fitted f_hat


class PolicyValue(NamedTuple):
    """A Monte Carlo ground-truth policy value."""

    value: float  # mean over contexts of sum_l alpha_l q_l(x, a), a ~ pi(.|x)
    stderr: float  # its standard error
    n_contexts: int


def chunk_rows(floats_per_row: int) -> int:
    """Rows per chunk: about 2^21 floats of intermediates (cache-sized), 256..65536."""
    return int(min(65536, max(256, 2 ** int(np.log2(max(1, (2**21) // floats_per_row))))))


@cached_jit(static_argnames=("n_slots", "position_marginals"))
def _logged_chunk(reward_model, key, context, logits, *, n_slots, position_marginals):
    """One chunk: PL rankings, prefix log-propensities, rewards, optional marginals."""
    k_rank, k_reward = jax.random.split(key)
    ranking = pl.sample_rankings(k_rank, logits, n_slots)
    log_prefix = pl.prefix_log_probs(logits, ranking)
    reward = reward_model.sample_reward(k_reward, context, ranking)
    if position_marginals == "exact":
        marginal = marginals.exact_slot_marginals(logits, ranking)  # P(rank(a_l) = l)
        log_marginal = jnp.log(jnp.maximum(marginal, MIN_MARGINAL))  # never an impossible 0
    else:
        log_marginal = jnp.zeros_like(log_prefix)
    return ranking, reward, log_prefix, log_marginal


def _check_memory(n: int, n_items: int, n_slots: int, context_dim: int, position_marginals: str) -> None:
    marginal = position_marginals == "exact"
    per_copy = memory.logged_data_bytes(n, n_items, n_slots, context_dim, position_marginals=marginal)
    fits = max(1, n * (memory.available_bytes() or 0) // max(1, memory.ASSEMBLY_COPIES * per_copy))
    memory.require(
        memory.ASSEMBLY_COPIES * per_copy,
        f"simulating n={n:,} logged rows (D={n_items}, L={n_slots}, dx={context_dim}"
        f"{', with position marginals' if marginal else ''})",
        f"use a smaller n (about {fits:,} fit here) or simulate in parts",
    )


def _pad_rows(x: jax.Array, rows: int) -> jax.Array:
    pad = rows - x.shape[0]
    return x if pad == 0 else jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)], axis=0)


def rollout_logging_policy(
    key: jax.Array,
    n: int,
    *,
    sample_contexts: Callable[[jax.Array, int], jax.Array],
    logging_logits: Callable[[jax.Array], jax.Array],
    reward_model: Any,
    n_items: int,
    n_slots: int,
    position_marginals: str = "none",
    progress: Callable[[int], None] | None = None,
    store_logits: bool = False,
) -> dict[str, np.ndarray]:
    """Sample ``n`` logged rounds in chunks.

    Args:
      key: PRNG key.
      n: rows.
      sample_contexts: ``(key, m) -> [m, dx]``.
      logging_logits: ``[m, dx] -> [m, D]`` logging PL logits (may be non-JAX code).
      reward_model: a [`GroundTruthRewards`][GroundTruthRewards] pytree.
      n_items: ``D``.
      n_slots: ``L``.
      position_marginals: ``"none"`` or ``"exact"`` (logged ``log P_0(a_l = a_il)`` by
        the exponential-race quadrature, for IIPS).
      progress: called with the number of rows done after each chunk, e.g. a bar's
        ``update`` (``tqdm(total=n).update``); the simulator draws nothing itself.
      store_logits: also return the logging policy's logits ``[n, D]`` (for estimators
        that need pi_0's probability of non-prefix item sets, e.g. ``aips``).

    Returns:
      dict of NumPy arrays: ``context [n, dx]``, ``ranking [n, L]``, ``reward [n, L]``,
      ``log_pi0_prefix [n, L]`` and, if asked, ``log_pi0_position_marginal [n, L]`` and
      ``logging_logits [n, D]``.
    """
    if position_marginals not in POSITION_MARGINAL_MODES:
        raise ValueError(f"position_marginals must be one of {POSITION_MARGINAL_MODES}, got {position_marginals!r}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    per_row = n_items
    if position_marginals == "exact":  # the quadrature's Poisson-binomial tables
        per_row = max(n_items, 4 * n_slots * n_slots * marginals.QUADRATURE_NODES)  # measured best
    rows = min(chunk_rows(per_row), int(n))
    n_chunks = -(-int(n) // rows)
    keys = jax.random.split(key, n_chunks)
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("context", "ranking", "reward", "log_pi0_prefix", "log_pi0_position_marginal")
    }
    if store_logits:
        parts["logging_logits"] = []
    for c in range(n_chunks):
        k_ctx, k_chunk = jax.random.split(keys[c])
        m = min(rows, int(n) - c * rows)
        context = sample_contexts(k_ctx, rows)
        if c == 0:  # the first chunk gives dx: refuse an n that cannot fit before the real work
            _check_memory(int(n), n_items, n_slots, int(context.shape[-1]), position_marginals)
        logits = jnp.asarray(logging_logits(context), jnp.float32)
        ranking, reward, log_prefix, log_marginal = _logged_chunk(
            reward_model,
            k_chunk,
            _pad_rows(context, rows),
            _pad_rows(logits, rows),
            n_slots=n_slots,
            position_marginals=position_marginals,
        )
        for name, value in (
            ("context", context),
            ("ranking", ranking),
            ("reward", reward),
            ("log_pi0_prefix", log_prefix),
            ("log_pi0_position_marginal", log_marginal),
        ):
            parts[name].append(np.asarray(value[:m]))
        if store_logits:
            parts["logging_logits"].append(np.asarray(logits[:m]))
        if progress is not None:
            progress(m)
    out = {name: np.concatenate(chunks, axis=0) for name, chunks in parts.items()}
    if position_marginals == "none":
        del out["log_pi0_position_marginal"]
    return out


@jax.jit
def _weighted_expected_reward(reward_model, context, rankings, position_weight):
    return reward_model.expected_reward(context, rankings) @ position_weight


def evaluate_policy(
    policy: Any,
    key: jax.Array,
    n_contexts: int,
    *,
    sample_contexts: Callable[[jax.Array, int], jax.Array],
    reward_model: Any,
    position_weight: jax.Array,
    n_items: int,
    progress: Callable[[int], None] | None = None,
) -> PolicyValue:
    """Ground-truth ``V(pi) = E_x E_{a ~ pi} sum_l alpha_l q_l(x, a)`` by Monte Carlo.

    Args:
      policy: ``(key, context [m, dx]) -> rankings [m, L]``, or an object with such a
        ``sample`` method.
      key: PRNG key (contexts and the policy's own randomness).
      n_contexts: contexts drawn (one ranking each).
      sample_contexts: ``(key, m) -> [m, dx]``.
      reward_model: the environment's [`GroundTruthRewards`][GroundTruthRewards].
      position_weight: ``[L]`` alpha.
      n_items: ``D`` (to size chunks).
      progress: called with the number of contexts done after each chunk (see
        [`rollout_logging_policy`][rollout_logging_policy]).

    Returns:
      [`PolicyValue`][PolicyValue].
    """
    sample = policy.sample if hasattr(policy, "sample") else policy
    if getattr(policy, "jit_sample", False):  # the library's policies: one program per chunk shape
        sample = functools.partial(compiled_sample, policy)
    if not callable(sample):
        raise TypeError(f"policy must be callable or have a .sample method, got {type(policy).__name__}")
    if n_contexts < 2:
        raise ValueError(f"n_contexts must be >= 2 for a standard error, got {n_contexts}")
    rows = min(chunk_rows(n_items), int(n_contexts))
    n_chunks = -(-int(n_contexts) // rows)
    n_slots = position_weight.shape[0]
    values = []
    for c, k in enumerate(jax.random.split(key, n_chunks)):
        k_ctx, k_pol = jax.random.split(k)
        m = min(rows, int(n_contexts) - c * rows)
        context = sample_contexts(k_ctx, rows)  # full chunks: one compiled shape
        rankings = np.asarray(sample(k_pol, context))
        _check_rankings(rankings, (rows, n_slots), n_items)
        value = _weighted_expected_reward(reward_model, context, jnp.asarray(rankings), position_weight)
        values.append(np.asarray(value[:m]))
        if progress is not None:
            progress(m)
    v = np.concatenate(values).astype(np.float64)
    return PolicyValue(float(v.mean()), float(v.std(ddof=1) / np.sqrt(v.size)), int(v.size))


def _check_rankings(rankings: np.ndarray, shape: tuple[int, int], n_items: int) -> None:
    """A policy's output: shape ``[n, L]``, items in ``[0, D)``, no repeats in a row."""
    if rankings.shape != shape:
        raise ValueError(f"policy returned rankings of shape {rankings.shape}; expected [n, L] = {shape}")
    if not np.issubdtype(rankings.dtype, np.integer):
        raise ValueError(f"policy returned rankings of dtype {rankings.dtype}; expected integers")
    if rankings.min() < 0 or rankings.max() >= n_items:
        raise ValueError(f"policy returned item indices outside [0, {n_items})")
    srt = np.sort(rankings, axis=1)
    if (srt[:, 1:] == srt[:, :-1]).any():
        raise ValueError("policy returned a ranking that repeats an item")
