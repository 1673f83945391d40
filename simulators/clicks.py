"""Click models under the examination hypothesis (pairwise paper; docs/maths.md §3.1-3.2).

A click is examination times relevance, ``c_k = e_k * r_k``. The examination probability
of rank ``k`` (1-based) is ``p(k) = (1 / k)^eta``. Two browsing models:

* ``"independent"``: ``e_k ~ Bernoulli(p(k))`` independently per rank; the joint
  examination probability of ranks ``k1 != k2`` is ``p(k1) * p(k2)``.
* ``"continuous"``: the user reads from the top and stops after the last examined rank
  ``d``, drawn with ``P(d = k) = p(k) - p(k + 1)`` (``p(K + 1) = 0``), so
  ``e_k = 1{k <= d}``, ``P(e_k = 1) = p(k)`` and the joint probability of ranks
  ``k1, k2`` is ``p(max(k1, k2))``.

Examination does not depend on relevance here (the paper allows it to; its estimator only
needs the probabilities). [`ClickRewards`][ClickRewards] turns any environment's reward model
into a binary-click one: its expected rewards are read as relevance probabilities.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = [
    "BROWSING_MODELS",
    "ClickModel",
    "ClickRewards",
    "ClickRewardModel",
    "relevance_probability",
    "joint_examination_from_swaps",
    "simulate_swap_intervention",
    "ClickLogs",
    "simulate_click_logs",
]

BROWSING_MODELS = ("independent", "continuous")


@dataclasses.dataclass(frozen=True)
class ClickModel:
    """Examination over ``n_positions`` ranks.

    Attributes:
      browsing: ``"independent"`` or ``"continuous"``.
      n_positions: ``K``, the longest list examined (ranks beyond are never examined).
      eta: severity of the position bias, ``p(k) = (1/k)^eta`` (>= 0; 0: no bias).
    """

    browsing: str
    n_positions: int
    eta: float = 1.0

    def __post_init__(self) -> None:
        if self.browsing not in BROWSING_MODELS:
            raise ValueError(f"browsing must be one of {BROWSING_MODELS}, got {self.browsing!r}")
        if not isinstance(self.n_positions, int) or isinstance(self.n_positions, bool) or self.n_positions < 1:
            raise ValueError(f"n_positions must be a positive int, got {self.n_positions!r}")
        if not (math.isfinite(self.eta) and self.eta >= 0):
            raise ValueError(f"eta must be finite and >= 0, got {self.eta}")

    def examination(self) -> jax.Array:
        """``p(k)``, ``k = 1..K``: ``[K]`` float32 (individual examination probabilities)."""
        return (1.0 / jnp.arange(1, self.n_positions + 1, dtype=jnp.float32)) ** self.eta

    def joint_examination(self) -> jax.Array:
        """``P(e_k1 = 1, e_k2 = 1)``: ``[K, K]`` float32, ``p(k)`` on the diagonal."""
        exam = self.examination()
        if self.browsing == "independent":
            joint = exam[:, None] * exam[None, :]
        else:
            joint = jnp.minimum(exam[:, None], exam[None, :])  # p(max(k1, k2)): p decreases
        return jnp.where(jnp.eye(self.n_positions, dtype=bool), exam[:, None], joint)

    def last_examined_probs(self) -> jax.Array:
        """Continuous browsing's ``P(d = k) = p(k) - p(k+1)``, ``k = 1..K``, plus
        ``P(d = 0) = 1 - p(1)`` first: ``[K + 1]``."""
        exam = jnp.concatenate([jnp.ones((1,), jnp.float32), self.examination(), jnp.zeros((1,), jnp.float32)])
        return exam[:-1] - exam[1:]

    def sample_examination(self, key: jax.Array, n: int) -> jax.Array:
        """``[n, K]`` bool examination indicators of ``n`` independent lists."""
        if self.browsing == "independent":
            return jax.random.uniform(key, (n, self.n_positions)) < self.examination()[None, :]
        last = jax.random.categorical(key, jnp.log(jnp.maximum(self.last_examined_probs(), 1e-38)), shape=(n,))
        return jnp.arange(1, self.n_positions + 1)[None, :] <= last[:, None]

    def sample_clicks(self, key: jax.Array, relevance_prob: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Clicks on ``n`` lists of ``K`` ranked items.

        Args:
          key: PRNG key.
          relevance_prob: ``[n, K]`` P(r = 1) of the item at each rank, in [0, 1].

        Returns:
          ``(clicks, examined, relevant)``, each ``[n, K]`` bool.
        """
        if relevance_prob.ndim != 2 or relevance_prob.shape[1] != self.n_positions:
            raise ValueError(f"relevance_prob must be [n, K={self.n_positions}], got shape {relevance_prob.shape}")
        k_exam, k_rel = jax.random.split(key)
        examined = self.sample_examination(k_exam, relevance_prob.shape[0])
        relevant = jax.random.uniform(k_rel, relevance_prob.shape) < relevance_prob
        return examined & relevant, examined, relevant


def relevance_probability(labels: jax.Array, max_label: int = 4) -> jax.Array:
    """The paper's ``P(r = 1 | y) = (2^y - 1) / (2^ymax - 1)``: ``[...] -> [...]`` float32."""
    labels = jnp.asarray(labels, jnp.float32)
    return (2.0**labels - 1.0) / (2.0**max_label - 1.0)


class ClickRewards(struct.PyTreeNode):
    """Binary clicks as an environment's position rewards: ``r_l = e_l * Bernoulli(rho_l)``.

    ``rho_l``, the relevance probability of the item at slot ``l``, is the wrapped reward
    model's expected reward clipped to [0, 1]. Any environment accepts it in place of its
    reward model (``dataclasses.replace(env, reward_model=ClickRewards(...))``): it
    offers the same ``expected_reward`` / ``sample_reward`` interface, with
    ``E[r_l] = p(l) * rho_l`` since examination does not depend on relevance.

    Attributes:
      relevance: the wrapped reward model (any pytree with ``expected_reward``).
      click_model: examination over at least ``L`` positions (static).
    """

    relevance: Any
    click_model: ClickModel = struct.field(pytree_node=False)

    def relevance_prob(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``[n, dx], [n, L] -> [n, L]`` in [0, 1]."""
        return jnp.clip(self.relevance.expected_reward(context, rankings), 0.0, 1.0)

    def _examination(self, n_slots: int) -> jax.Array:
        if n_slots > self.click_model.n_positions:
            raise ValueError(
                f"the click model covers {self.click_model.n_positions} positions, rankings have {n_slots}"
            )
        return self.click_model.examination()[:n_slots]

    def expected_reward(self, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """``p(l) * rho_l``: ``[n, dx], [n, L] -> [n, L]``."""
        return self._examination(rankings.shape[-1])[None, :] * self.relevance_prob(context, rankings)

    def best_rankings(
        self,
        context: jax.Array,
        position_weight: jax.Array,
        *,
        n_items: int,
        max_enumerated: int = 2_000_000,
        beam_width: int = 64,
    ) -> tuple[jax.Array, str]:
        """``argmax_a sum_l alpha_l p(l) rho_l(x, a)``: exact by enumerating every
        ranking (clipping makes the value non-additive, so no shortcut is exact).

        Returns:
          ``(rankings [n, L] int32, "exact")``; a ValueError beyond 200,000 rankings.
        """
        from simulators.environments import best_rankings_by_enumeration

        limit = min(max_enumerated, 200_000)
        return best_rankings_by_enumeration(
            self.expected_reward, context, position_weight, n_items, max_enumerated=limit
        ), "exact"

    def sample_reward(self, key: jax.Array, context: jax.Array, rankings: jax.Array) -> jax.Array:
        """Clicks as float32 ``[n, L]``."""
        n_slots = rankings.shape[-1]
        self._examination(n_slots)
        model = dataclasses.replace(self.click_model, n_positions=n_slots)
        clicks, _, _ = model.sample_clicks(key, self.relevance_prob(context, rankings))
        return clicks.astype(jnp.float32)


def joint_examination_from_swaps(
    both_clicked_kept: jax.Array, both_clicked_swapped: jax.Array, theta2: float
) -> tuple[float, float]:
    """The paper's swap-intervention estimate of ``psi(k1, k2) = P(e_k1 = 1, e_k2 = 1)``.

    On a random share of requests the items the ranker put at ranks ``k1 < k2`` are
    swapped with those at ranks 1 and 2. Relevance does not move with position, so

        psi(k1, k2) / psi(1, 2) = P(both clicked | kept) / P(both clicked | swapped),

    and ``psi(1, 2) = p(2)`` when rank 1 is always examined.

    Args:
      both_clicked_kept: ``[n1]`` bool, both items (at ranks k1, k2) clicked, no swap.
      both_clicked_swapped: ``[n2]`` bool, both items (moved to ranks 1, 2) clicked.
      theta2: ``p(2)`` (known or estimated).

    Returns:
      ``(estimate, standard error)`` (delta method, ``theta2`` treated as known).
    """
    kept = jnp.asarray(both_clicked_kept, jnp.float32)
    swapped = jnp.asarray(both_clicked_swapped, jnp.float32)
    if kept.ndim != 1 or swapped.ndim != 1 or kept.size < 2 or swapped.size < 2:
        raise ValueError("both_clicked_kept and both_clicked_swapped must be 1-d with at least 2 requests each")
    p_kept, p_swapped = float(jnp.mean(kept)), float(jnp.mean(swapped))
    if p_swapped == 0.0:
        raise ValueError("no request had both swapped items clicked: the ratio is undefined (log more swaps)")
    ratio = p_kept / p_swapped
    var_kept = p_kept * (1 - p_kept) / kept.size
    var_swapped = p_swapped * (1 - p_swapped) / swapped.size
    se = (
        theta2 * ratio * math.sqrt(var_kept / max(p_kept, 1e-300) ** 2 + var_swapped / p_swapped**2)
        if p_kept > 0
        else math.nan
    )
    return theta2 * ratio, se


def simulate_swap_intervention(
    key: jax.Array, click_model: ClickModel, relevance_prob: jax.Array, k1: int, k2: int, swap_share: float = 0.5
) -> tuple[float, float]:
    """Run the swap experiment on simulated traffic and estimate ``psi(k1, k2)``.

    Args:
      key: PRNG key.
      click_model: the users' (unknown to the estimator) browsing model.
      relevance_prob: ``[n, K]`` relevance probabilities of the ranker's lists.
      k1: a 1-based rank, ``2 < k1 < k2 <= K`` (so the swapped pairs do not overlap).
      k2: the other 1-based rank.
      swap_share: share of requests that get the swap, in (0, 1).

    Returns:
      ``(estimate, standard error)`` of [`joint_examination_from_swaps`][joint_examination_from_swaps] with the
      model's true ``p(2)``.
    """
    if not (isinstance(k1, int) and isinstance(k2, int) and 2 < k1 < k2 <= click_model.n_positions):
        raise ValueError(f"need 2 < k1 < k2 <= K={click_model.n_positions}, got k1={k1}, k2={k2}")
    if not 0.0 < swap_share < 1.0:
        raise ValueError(f"swap_share must be in (0, 1), got {swap_share}")
    k_swap, k_click = jax.random.split(key)
    n = relevance_prob.shape[0]
    swap = jax.random.uniform(k_swap, (n,)) < swap_share
    i1, i2 = k1 - 1, k2 - 1
    order = jnp.arange(click_model.n_positions)
    swapped_order = order.at[jnp.array([0, 1, i1, i2])].set(jnp.array([i1, i2, 0, 1]))
    shown = jnp.where(swap[:, None], relevance_prob[:, swapped_order], relevance_prob)
    clicks, _, _ = click_model.sample_clicks(k_click, shown)
    both = jnp.where(swap, clicks[:, 0] & clicks[:, 1], clicks[:, i1] & clicks[:, i2])
    theta2 = float(click_model.examination()[1])
    return joint_examination_from_swaps(both[~swap], both[swap], theta2)


class ClickLogs(NamedTuple):
    """Simulated click logs over a fixed set of ranked lists.

    Attributes:
      query: ``[N]`` int, the query (row of the source arrays) of each shown list.
      docs: ``[N, K]`` int, the documents shown at ranks 1..K (index into the query's row).
      mask: ``[N, K]`` bool, True where a document was shown (short queries are padded).
      clicks: ``[N, K]`` bool.
      relevant: ``[N, K]`` bool, the relevance draws (what a full-information oracle sees).
      examination: ``[K]`` p(k) of the click model; ``joint_examination``: ``[K, K]``.
    """

    query: np.ndarray
    docs: np.ndarray
    mask: np.ndarray
    clicks: np.ndarray
    relevant: np.ndarray
    examination: np.ndarray
    joint_examination: np.ndarray


def simulate_click_logs(
    key: jax.Array,
    labels: np.ndarray,
    mask: np.ndarray,
    ranker_scores: np.ndarray,
    click_model: ClickModel,
    *,
    repeats: int = 16,
    max_label: int = 4,
) -> ClickLogs:
    """The pairwise paper's click simulation on LETOR queries.

    Each query's documents are ranked by ``ranker_scores`` (the logging ranker) and the
    list is cut at ``K = click_model.n_positions``; queries without a relevant document in
    the cut are dropped (they can never be clicked). Every list is shown ``repeats`` times
    with fresh relevance draws ``r ~ Bernoulli((2^y - 1) / (2^ymax - 1))`` and fresh
    examination.

    Args:
      key: PRNG key.
      labels: ``[Q, Dmax]`` graded labels; ``mask``: ``[Q, Dmax]`` real documents.
      ranker_scores: ``[Q, Dmax]`` scores of the ranker that ordered the lists.
      click_model: the users' browsing model over ``K`` ranks.
      repeats: sessions per query (paper: 16).
      max_label: the largest grade.

    Returns:
      [`ClickLogs`][ClickLogs] with ``N = repeats * (kept queries)`` lists.
    """
    labels, mask, ranker_scores = np.asarray(labels), np.asarray(mask, bool), np.asarray(ranker_scores)
    if labels.shape != mask.shape or ranker_scores.shape != mask.shape or labels.ndim != 2:
        raise ValueError(
            f"labels, mask and ranker_scores must share one [Q, D] shape, got {labels.shape}, {mask.shape}, {ranker_scores.shape}"
        )
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    k = min(click_model.n_positions, labels.shape[1])
    order = np.argsort(np.where(mask, -ranker_scores, np.inf), axis=1, kind="stable")[:, :k]  # [Q, K]
    shown = np.take_along_axis(mask, order, axis=1)
    shown_labels = np.where(shown, np.take_along_axis(labels, order, axis=1), 0.0)
    keep = np.flatnonzero((shown_labels > 0).any(axis=1))
    query = np.repeat(keep, repeats)
    docs, shown = order[query], shown[query]
    rel_prob = np.where(shown, np.asarray(relevance_probability(shown_labels[query], max_label)), 0.0)
    model = dataclasses.replace(click_model, n_positions=k)
    clicks, _, relevant = model.sample_clicks(key, jnp.asarray(rel_prob, jnp.float32))
    return ClickLogs(
        query=query,
        docs=docs,
        mask=shown,
        clicks=np.asarray(clicks) & shown,
        relevant=np.asarray(relevant) & shown,
        examination=np.asarray(model.examination()),
        joint_examination=np.asarray(model.joint_examination()),
    )


ClickRewardModel = ClickRewards  # its name before 0.2.0 (one release)
