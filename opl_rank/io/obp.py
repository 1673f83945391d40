"""obp's slate bandit feedback <-> [`opl_rank.data.LoggedData`][opl_rank.data.LoggedData].

obp (Open Bandit Pipeline) stores slate logs flattened over (round, slot): ``slate_id``,
``action``, ``position``, ``reward`` of length ``n * L``, and propensities per entry --
``pscore`` (the whole slate's), ``pscore_cascade`` (the prefix up to the slot) and
``pscore_item_position`` (the item's marginal probability of its slot). Ours are
``[n, L]`` arrays of log-propensities. Plain numpy; obp itself is not imported.

Shapes: ``n_rounds`` must be a positive integer; ``context`` must be ``[n_rounds, dim]``
(one row per round, as obp's ``SyntheticSlateBanditDataset`` returns; a 1-D ``[n_rounds]``
context is one feature per round) -- a context with one row per (round, slot) is an error,
not reshaped; ``action`` ids must be integers (floats such as ``3.0`` are accepted, ``3.7``
is an error rather than truncated).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from opl_rank.data import LoggedData

__all__ = ["from_obp_slate", "to_obp_slate"]


def _per_round(name: str, values: Any, n: int, n_slots: int) -> np.ndarray:
    values = np.asarray(values)
    if values.shape != (n * n_slots,):
        raise ValueError(
            f"bandit_feedback[{name!r}] must have shape (n_rounds * len_list,) = ({n * n_slots},), got {values.shape}"
        )
    return values.reshape(n, n_slots)


def _n_rounds(value: Any) -> int:
    """``n_rounds`` as a positive int (an integral float such as ``300.0`` is accepted)."""
    try:
        n = operator.index(value)
    except TypeError:
        as_float = np.asarray(value)
        if (
            as_float.ndim != 0
            or not np.issubdtype(as_float.dtype, np.floating)
            or not np.isfinite(as_float)
            or float(as_float) != int(as_float)
        ):
            raise ValueError(f"bandit_feedback['n_rounds'] must be a positive integer, got {value!r}") from None
        n = int(as_float)
    if n < 1:
        raise ValueError(f"bandit_feedback['n_rounds'] must be a positive integer, got {value!r}")
    return n


def _item_ids(name: str, values: np.ndarray) -> np.ndarray:
    """Integer ids as int32; non-integral or non-finite floats are an error, not truncated."""
    if values.dtype == np.bool_ or not (
        np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)
    ):
        raise ValueError(f"bandit_feedback[{name!r}] must hold integer ids, got dtype {values.dtype}")
    if np.issubdtype(values.dtype, np.floating):
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"bandit_feedback[{name!r}] must hold integer ids; round {first[0]} slot {first[1]} holds "
                f"{values[first]!r} (not truncated)"
            )
    if values.size and (values.min() < np.iinfo(np.int32).min or values.max() > np.iinfo(np.int32).max):
        raise ValueError(f"bandit_feedback[{name!r}] ids do not fit in int32")
    return values.astype(np.int32)


def _context(values: Any, n: int, n_slots: int) -> np.ndarray:
    context = np.asarray(values, np.float32)
    if context.ndim == 1 and context.shape[0] == n:
        return context[:, None]
    if context.ndim == 2 and context.shape[0] == n:
        return context
    hint = ""
    if context.ndim >= 1 and n_slots > 1 and context.shape[0] == n * n_slots:
        hint = (
            " (it has n_rounds * len_list rows, one per slot; pass one row per round, e.g. "
            "context[::len_list] if the rows of a round are equal)"
        )
    raise ValueError(
        f"bandit_feedback['context'] must have shape (n_rounds, dim_context) = ({n}, dim_context), "
        f"got {context.shape}{hint}"
    )


def _log_propensity(name: str, values: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(values)) or np.any(values <= 0) or np.any(values > 1 + 1e-6):
        raise ValueError(f"bandit_feedback[{name!r}] must be propensities in (0, 1]")
    return np.log(np.minimum(values, 1.0)).astype(np.float32)


def from_obp_slate(bandit_feedback: Mapping[str, Any], *, position_weight: Any = None) -> LoggedData:
    """Logged data from obp's slate bandit feedback (e.g. ``SyntheticSlateBanditDataset``).

    Args:
      bandit_feedback: obp's dict with ``n_rounds``, ``n_unique_action``, ``context``,
        ``slate_id``, ``action``, ``position``, ``reward`` and ``pscore_cascade``
        (``pscore_item_position`` and ``action_context`` are used when present).
      position_weight: ``[L]`` alpha (default: ones -- obp's estimators weight slots equally).

    Raises:
      ValueError: a missing key, ``n_rounds`` not a positive integer, arrays not of length
        ``n_rounds * len_list`` in obp's (slate_id, position) order, non-integer action ids,
        a context that is not ``[n_rounds, dim_context]``, or propensities outside (0, 1].

    Returns:
      [`LoggedData`][LoggedData] with ``log_pi0_prefix`` from ``pscore_cascade`` and, when present,
      ``log_pi0_position_marginal`` from ``pscore_item_position``.
    """
    missing = [
        k
        for k in (
            "n_rounds",
            "n_unique_action",
            "context",
            "slate_id",
            "action",
            "position",
            "reward",
            "pscore_cascade",
        )
        if k not in bandit_feedback
    ]
    if missing:
        raise ValueError(f"bandit_feedback lacks {missing}")
    n = _n_rounds(bandit_feedback["n_rounds"])
    slate_id = np.asarray(bandit_feedback["slate_id"])
    position = np.asarray(bandit_feedback["position"])
    if slate_id.ndim != 1 or slate_id.shape[0] < n or slate_id.shape[0] % n:
        raise ValueError(
            f"bandit_feedback['slate_id'] must have length n_rounds * len_list, a positive multiple of "
            f"n_rounds={n}; got shape {slate_id.shape}"
        )
    n_slots = slate_id.shape[0] // n
    if not (
        np.array_equal(slate_id, np.repeat(np.arange(n), n_slots))
        and np.array_equal(position, np.tile(np.arange(n_slots), n))
    ):
        raise ValueError(
            "bandit_feedback must be sorted by slate_id then position (obp's layout), with every slot present"
        )
    pick = lambda name: _per_round(name, bandit_feedback[name], n, n_slots)
    marginal = None
    if bandit_feedback.get("pscore_item_position") is not None:
        marginal = _log_propensity("pscore_item_position", pick("pscore_item_position"))
    alpha = np.ones(n_slots, np.float32) if position_weight is None else np.asarray(position_weight, np.float32)
    action_context = bandit_feedback.get("action_context")
    return LoggedData(
        context=jnp.asarray(_context(bandit_feedback["context"], n, n_slots)),
        ranking=jnp.asarray(_item_ids("action", pick("action"))),
        reward=jnp.asarray(pick("reward").astype(np.float32)),
        log_pi0_prefix=jnp.asarray(_log_propensity("pscore_cascade", pick("pscore_cascade"))),
        position_weight=jnp.asarray(alpha),
        n_items=int(bandit_feedback["n_unique_action"]),
        log_pi0_position_marginal=None if marginal is None else jnp.asarray(marginal),
        item_features=None if action_context is None else jnp.asarray(np.asarray(action_context, np.float32)),
    )


def to_obp_slate(data: LoggedData) -> dict[str, Any]:
    """obp's slate bandit-feedback dict from logged data (numpy arrays, obp's layout)."""
    n, n_slots = data.n_rounds, data.ranking_length
    prefix = np.exp(np.asarray(data.log_pi0_prefix, np.float64))
    feedback: dict[str, Any] = {
        "n_rounds": n,
        "n_unique_action": data.n_items,
        "slate_id": np.repeat(np.arange(n), n_slots),
        "context": np.asarray(data.context),
        "action": np.asarray(data.ranking).reshape(-1),
        "position": np.tile(np.arange(n_slots), n),
        "reward": np.asarray(data.reward).reshape(-1),
        "pscore_cascade": prefix.reshape(-1),
        "pscore": np.repeat(prefix[:, -1], n_slots),
        "pscore_item_position": None,
    }
    if data.log_pi0_position_marginal is not None:
        feedback["pscore_item_position"] = np.exp(np.asarray(data.log_pi0_position_marginal, np.float64)).reshape(-1)
    if data.item_features is not None and data.item_features.ndim == 2:
        feedback["action_context"] = np.asarray(data.item_features)
    return feedback
