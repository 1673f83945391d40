"""Rolling a logging policy out in an environment: contexts -> PL rankings -> rewards.

Shared by every simulator. Rows are processed in fixed-size chunks (the last one padded),
so one compiled kernel serves any ``n`` and no intermediate grows with ``n``
(docs/performance.md §2: fresh buffers of hundreds of MB are 7-10x slower to write). Within a
chunk everything is vectorised; there is no Python loop over rows.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank import marginals
from opl_rank import plackett_luce as pl

__all__ = [
    "RewardModel",
    "PolicyValue",
    "chunk_rows",
    "rollout_logging_policy",
    "evaluate_policy",
    "POSITION_MARGINAL_MODES",
]

POSITION_MARGINAL_MODES = ("none", "exact")
# With ``progress=None`` a bar appears only once a run has taken this many seconds.
PROGRESS_DELAY_S = 5.0
# Smallest probability stored for a logged position marginal: the quadrature's absolute
# error is ~1e-7, so a logged item's marginal is never rounded to an impossible 0.
_MIN_MARGINAL = 1e-30


class RewardModel(Protocol):
    """Ground truth of an environment (a pytree, so it passes through ``jit``)."""

    def expected_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``[n, dx], [n, L] -> [n, L]`` q_l(x, a)."""

    def sample_reward(self, key: jax.Array, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``[n, dx], [n, L] -> [n, L]`` sampled r_l."""


class PolicyValue(NamedTuple):
    """A Monte Carlo ground-truth policy value."""

    value: float  # mean over contexts of sum_l alpha_l q_l(x, a), a ~ pi(.|x)
    stderr: float  # its standard error
    n_contexts: int


def chunk_rows(floats_per_row: int) -> int:
    """Rows per chunk: about 2^21 floats of intermediates (cache-sized), 256..65536."""
    return int(min(65536, max(256, 2 ** int(np.log2(max(1, (2**21) // floats_per_row))))))


@functools.partial(jax.jit, static_argnames=("n_slots", "position_marginals"))
def _logged_chunk(reward_model, key, context, logits, *, n_slots, position_marginals):
    """One chunk: PL rankings, prefix log-propensities, rewards, optional marginals."""
    k_rank, k_reward = jax.random.split(key)
    ranking = pl.sample_rankings(k_rank, logits, n_slots)
    log_prefix = pl.prefix_log_probs(logits, ranking)
    reward = reward_model.sample_reward(k_reward, context, ranking)
    if position_marginals == "exact":
        marginal = marginals.exact_slot_marginals(logits, ranking)  # P(rank(a_l) = l)
        log_marginal = jnp.log(jnp.maximum(marginal, _MIN_MARGINAL))
    else:
        log_marginal = jnp.zeros_like(log_prefix)
    return ranking, reward, log_prefix, log_marginal


class _Progress:
    """A progress bar over rows (tqdm when installed -- it is optional, not a dependency --
    else a line on stderr per tenth). ``enabled``: True always, None after
    ``PROGRESS_DELAY_S`` seconds (long runs only), False never."""

    def __init__(self, total: int, desc: str, enabled: bool | None):
        import time

        self._bar, self._start, self._done, self._total, self._desc = None, time.perf_counter(), 0, total, desc
        self._enabled, self._shown = enabled, 0
        if enabled is False:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=desc, unit="rows", unit_scale=True, leave=False,
                         delay=0.0 if enabled else PROGRESS_DELAY_S, mininterval=0.5)

    def update(self, rows: int) -> None:
        import sys
        import time

        self._done += rows
        if self._bar is not None:
            self._bar.update(rows)
            return
        elapsed = time.perf_counter() - self._start
        tenth = 10 * self._done // self._total
        if self._enabled is not False and tenth > self._shown and (self._enabled or elapsed >= PROGRESS_DELAY_S):
            self._shown = tenth
            print(f"{self._desc}: {self._done}/{self._total} rows, {elapsed:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


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
    progress: bool | None = None,
) -> dict[str, np.ndarray]:
    """Sample ``n`` logged rounds in chunks.

    Args:
      key: PRNG key.
      n: rows.
      sample_contexts: ``(key, m) -> [m, dx]``.
      logging_logits: ``[m, dx] -> [m, D]`` logging PL logits (may be non-JAX code).
      reward_model: a :class:`RewardModel` pytree.
      n_items: ``D``.
      n_slots: ``L``.
      position_marginals: ``"none"`` or ``"exact"`` (logged ``log P_0(a_l = a_il)`` by
        the exponential-race quadrature, for IIPS).
      progress: a progress bar on stderr: True, False, or None (shown once the run has
        taken ``PROGRESS_DELAY_S`` seconds).

    Returns:
      dict of NumPy arrays: ``context [n, dx]``, ``ranking [n, L]``, ``reward [n, L]``,
      ``log_pi0_prefix [n, L]`` and, if asked, ``log_pi0_position_marginal [n, L]``.
    """
    if position_marginals not in POSITION_MARGINAL_MODES:
        raise ValueError(
            f"position_marginals must be one of {POSITION_MARGINAL_MODES}, got {position_marginals!r}"
        )
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
    bar = _Progress(int(n), "simulate", progress)
    for c in range(n_chunks):
        k_ctx, k_chunk = jax.random.split(keys[c])
        m = min(rows, int(n) - c * rows)
        context = sample_contexts(k_ctx, rows)
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
        bar.update(m)
    bar.close()
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
    progress: bool | None = False,
) -> PolicyValue:
    """Ground-truth ``V(pi) = E_x E_{a ~ pi} sum_l alpha_l q_l(x, a)`` by Monte Carlo.

    Args:
      policy: ``(key, context [m, dx]) -> rankings [m, L]``, or an object with such a
        ``sample`` method.
      key: PRNG key (contexts and the policy's own randomness).
      n_contexts: contexts drawn (one ranking each).
      sample_contexts: ``(key, m) -> [m, dx]``.
      reward_model: the environment's :class:`RewardModel`.
      position_weight: ``[L]`` alpha.
      n_items: ``D`` (to size chunks).
      progress: a progress bar (see :func:`rollout_logging_policy`; off by default here).

    Returns:
      :class:`PolicyValue`.
    """
    sample = policy.sample if hasattr(policy, "sample") else policy
    if not callable(sample):
        raise TypeError(f"policy must be callable or have a .sample method, got {type(policy).__name__}")
    if n_contexts < 2:
        raise ValueError(f"n_contexts must be >= 2 for a standard error, got {n_contexts}")
    rows = min(chunk_rows(n_items), int(n_contexts))
    n_chunks = -(-int(n_contexts) // rows)
    n_slots = position_weight.shape[0]
    values = []
    bar = _Progress(int(n_contexts), "evaluate", progress)
    for c, k in enumerate(jax.random.split(key, n_chunks)):
        k_ctx, k_pol = jax.random.split(k)
        m = min(rows, int(n_contexts) - c * rows)
        context = sample_contexts(k_ctx, rows)  # full chunks: one compiled shape
        rankings = np.asarray(sample(k_pol, context))
        _check_rankings(rankings, (rows, n_slots), n_items)
        value = _weighted_expected_reward(reward_model, context, jnp.asarray(rankings), position_weight)
        values.append(np.asarray(value[:m]))
        bar.update(m)
    bar.close()
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
