"""Logged ranking data: a frozen, validated pytree, and row-wise helpers.

``LoggedData`` holds ``n`` logged rounds ``(x_i, a_i, r_i)`` from a logging policy pi_0
with the logging propensities the off-policy estimators need. It is converted and
validated once, at construction with concrete arrays (NumPy or JAX arrays, or Python
lists); inside ``jit``/``vmap`` (tracers) both are skipped.

Conversion: Python lists become NumPy arrays; float fields become float32 (a finite value
beyond float32's range, ~3.4e38, e.g. a float64 ``1e39``, is an error naming the field and
saying so, checked before the cast: no ``inf``, no NumPy overflow warning), integer rankings become int32, and a list ``item_mask`` becomes bool. Arrays
of the wrong kind (a float ranking, a float mask) are not converted; validation rejects
them. JAX arrays stay JAX arrays and NumPy arrays stay NumPy arrays.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from opl_rank.io.atomic import atomic_write

__all__ = ["LoggedData", "train_val_split", "minibatches"]


class LoggedData(struct.PyTreeNode):
    """``n`` logged rankings with position-wise rewards and logging propensities.

    Attributes:
      context: ``[n, dx]`` float32 contexts x_i.
      ranking: ``[n, L]`` int32 item indices a_i (best first) in ``[0, D)``, no repeats.
      reward: ``[n, L]`` float32 position rewards r_il (finite).
      log_pi0_prefix: ``[n, L]`` float32 ``log pi_0(a_{i,1:l} | x_i)``: finite, ``<= 0``,
        non-increasing along slots (RIPS, R-POD's top-k weights, IPS at ``l = L``).
      position_weight: ``[L]`` float32 alpha_l >= 0 (DCG by default in the simulators).
      n_items: ``D``, the number of candidate items (static).
      log_pi0_position_marginal: optional ``[n, L]`` float32
        ``log P_0(a_l = a_il | x_i)``, finite, ``<= 0`` (IIPS).
      item_features: optional ``[D, di]`` (shared) or ``[n, D, di]`` float32.
      item_mask: optional ``[n, D]`` bool, True for real candidates.
      logging_logits: optional ``[n, D]`` float32 PL logits of the logging policy (``-inf``
        for items it never places; no NaN or ``+inf``): what an estimator needs for the
        logging policy's probability of item sets other than prefixes and single slots
        (``aips`` with a non-prefix behaviour, [`opl_rank.opl.aips`][opl_rank.opl.aips]);
        the simulators store it with ``sample_logged_data(..., logging_logits=True)``.
    """

    context: jax.Array  # [n, dx] float32
    ranking: jax.Array  # [n, L] int32
    reward: jax.Array  # [n, L] float32
    log_pi0_prefix: jax.Array  # [n, L] float32, log pi_0(a_{1:l} | x)
    position_weight: jax.Array  # [L] float32
    n_items: int = struct.field(pytree_node=False)
    log_pi0_position_marginal: jax.Array | None = None  # [n, L] float32
    item_features: jax.Array | None = None  # [D, di] or [n, D, di] float32
    item_mask: jax.Array | None = None  # [n, D] bool
    logging_logits: jax.Array | None = None  # [n, D] float32

    def __post_init__(self) -> None:
        if _is_concrete(self):
            _convert(self)
            _validate(self)

    # -- shape accessors -------------------------------------------------------------
    @property
    def n_rounds(self) -> int:
        """``n``."""
        return int(self.ranking.shape[0])

    @property
    def ranking_length(self) -> int:
        """``L``."""
        return int(self.ranking.shape[1])

    def __len__(self) -> int:
        return self.n_rounds

    # -- rows ------------------------------------------------------------------------
    def row_fields(self) -> dict[str, jax.Array]:
        """The per-round arrays (leading axis ``n``) by field name; the rest is shared."""
        names = [
            "context",
            "ranking",
            "reward",
            "log_pi0_prefix",
            "log_pi0_position_marginal",
            "item_mask",
            "logging_logits",
        ]
        fields = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.item_features is not None and self.item_features.ndim == 3:
            fields["item_features"] = self.item_features
        return fields

    def take(self, rows: Any) -> LoggedData:
        """The rounds ``rows`` (an index array, slice or bool mask) as a new LoggedData."""
        return self.replace(**{name: value[rows] for name, value in self.row_fields().items()})

    def summary(self) -> dict[str, Any]:
        """Plain-Python summary: sizes, reward statistics, propensity ranges."""
        reward = np.asarray(self.reward, dtype=np.float64)
        weighted = reward @ np.asarray(self.position_weight, dtype=np.float64)
        lp = np.asarray(self.log_pi0_prefix, dtype=np.float64)
        out: dict[str, Any] = {
            "n": self.n_rounds,
            "D": self.n_items,
            "L": self.ranking_length,
            "dx": int(self.context.shape[1]),
            "mean_weighted_reward": float(weighted.mean()),
            "se_weighted_reward": float(weighted.std(ddof=1) / np.sqrt(max(len(weighted), 1)))
            if len(weighted) > 1
            else float("nan"),
            "reward_mean_by_slot": [float(v) for v in reward.mean(axis=0)],
            "reward_std": float(reward.std()),
            "reward_min": float(reward.min()),
            "reward_max": float(reward.max()),
            "log_pi0_ranking_min": float(lp[:, -1].min()),
            "log_pi0_ranking_max": float(lp[:, -1].max()),
            "pi0_top1_min": float(np.exp(lp[:, 0].min())),
            "pi0_top1_max": float(np.exp(lp[:, 0].max())),
        }
        if self.log_pi0_position_marginal is not None:
            marg = np.exp(np.asarray(self.log_pi0_position_marginal, dtype=np.float64))
            out["pi0_position_marginal_min"] = float(marg.min())
            out["pi0_position_marginal_max"] = float(marg.max())
        return out

    # -- persistence -----------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write to ``path`` (``.npz``) atomically: a temporary file, then a rename."""
        # Any: numpy's stubs would match a str-keyed ** against savez's allow_pickle (no field has that name)
        arrays: dict[str, Any] = {
            name: np.asarray(getattr(self, name)) for name in _ARRAY_FIELDS if getattr(self, name) is not None
        }
        arrays["n_items"] = np.asarray(self.n_items)
        atomic_write(path, lambda f: np.savez(f, **arrays))

    @classmethod
    def load(cls, path: str | os.PathLike) -> LoggedData:
        """Read what [`save`][save] wrote (validated again).

        Raises:
          FileNotFoundError: no such file.
          ValueError: naming ``path``: not an ``.npz`` archive (e.g. truncated or another
            format), a required array missing, or data that fails validation.
        """
        shown = os.fspath(path)
        try:
            with np.load(path, allow_pickle=False) as f:
                if not hasattr(f, "files"):
                    raise ValueError("holds a single array, not an .npz archive")
                missing = [name for name in ("n_items", *_REQUIRED_FIELDS) if name not in f.files]
                if missing:
                    raise ValueError(f"lacks {missing}")
                arrays = {name: np.asarray(f[name]) for name in _ARRAY_FIELDS if name in f.files}
                n_items = f["n_items"]
        except FileNotFoundError:
            raise
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
            raise ValueError(
                f"{shown}: not a LoggedData .npz file written by LoggedData.save (truncated or another format?): {err}"
            ) from err
        except Exception as err:  # zlib.error and the like from a damaged member
            raise ValueError(f"{shown}: cannot read LoggedData .npz file ({type(err).__name__}: {err})") from err
        if n_items.shape != () or not np.issubdtype(n_items.dtype, np.integer):
            raise ValueError(f"{shown}: n_items must be a scalar integer, got {n_items.dtype} {n_items.shape}")
        try:
            return cls(n_items=int(n_items), **{name: jnp.asarray(value) for name, value in arrays.items()})
        except ValueError as err:
            raise ValueError(f"{shown}: {err}") from err

    # -- tables (pandas, Parquet, CSV; schema: docs/data_format.md, code: opl_rank.io.tabular) --
    @classmethod
    def from_pandas(
        cls, frame: Any, *, n_items: int | None = None, position_weight: Any = None, alpha: Any = None
    ) -> LoggedData:
        """From a DataFrame with one row per round and list columns ``context``, ``ranking``,
        ``reward``, ``log_pi0_prefix`` (or ``pi0_prefix``) and optionally
        ``log_pi0_position_marginal`` (or ``pi0_position_marginal``), ``item_mask``,
        ``item_features``; other columns are ignored.

        ``n_items`` and ``position_weight`` (``[L]``; ``alpha`` is its deprecated old name) default to ``frame.attrs["opl_rank"]``,
        then constant columns ``n_items`` / ``position_weight``; without them ``n_items`` is
        the item_mask's width or ``max(ranking) + 1`` and the position weights are DCG. An argument that
        contradicts the frame is an error.

        Raises:
          ValueError: naming the column and the row (0-based position): a missing column, a
            row of another length, a missing value, NaN or inf, a probability outside
            ``(0, 1]``, and everything ``LoggedData`` itself rejects.
          ImportError: pandas or pyarrow is not installed.
        """
        from opl_rank.io import tabular

        return tabular.from_pandas(frame, n_items=n_items, position_weight=position_weight, alpha=alpha)

    def to_pandas(self) -> Any:
        """A DataFrame in [`from_pandas`][from_pandas]'s schema (cells are NumPy arrays of the stored
        dtypes); ``n_items``, the position weights and shared item features in ``frame.attrs["opl_rank"]``."""
        from opl_rank.io import tabular

        return tabular.to_pandas(self)

    @classmethod
    def from_parquet(
        cls, path: str | os.PathLike, *, n_items: int | None = None, position_weight: Any = None, alpha: Any = None
    ) -> LoggedData:
        """Read a Parquet file in [`from_pandas`][from_pandas]'s schema; dataset-level values from its
        key-value metadata ``opl_rank`` (JSON), as [`to_parquet`][to_parquet] writes them.

        Raises:
          FileNotFoundError: no such file.
          ValueError: naming the file (and the column and row), as [`from_pandas`][from_pandas].
        """
        from opl_rank.io import tabular

        return tabular.from_parquet(path, n_items=n_items, position_weight=position_weight, alpha=alpha)

    def to_parquet(self, path: str | os.PathLike) -> None:
        """Write a Parquet file atomically (reads back exactly with [`from_parquet`][from_parquet])."""
        from opl_rank.io import tabular

        tabular.to_parquet(self, path)

    @classmethod
    def from_csv(
        cls, path: str | os.PathLike, *, n_items: int | None = None, position_weight: Any = None, alpha: Any = None
    ) -> LoggedData:
        """Read a CSV file: list cells as JSON (``"[0, 3, 1]"``) or space-separated (``0 3 1``);
        ``n_items`` / ``position_weight`` as arguments or constant columns."""
        from opl_rank.io import tabular

        return tabular.from_csv(path, n_items=n_items, position_weight=position_weight, alpha=alpha)

    def to_csv(self, path: str | os.PathLike) -> None:
        """Write a CSV file (JSON list cells, constant ``n_items`` / ``position_weight``
        columns) atomically; item features cannot be written (use [`to_parquet`][to_parquet])."""
        from opl_rank.io import tabular

        tabular.to_csv(self, path)


_REQUIRED_FIELDS = ("context", "ranking", "reward", "log_pi0_prefix", "position_weight")
_ARRAY_FIELDS = (
    "context",
    "ranking",
    "reward",
    "log_pi0_prefix",
    "position_weight",
    "log_pi0_position_marginal",
    "item_features",
    "item_mask",
    "logging_logits",
)


_FLOAT_FIELDS = (
    "context",
    "reward",
    "log_pi0_prefix",
    "position_weight",
    "log_pi0_position_marginal",
    "item_features",
    "logging_logits",
)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT32 = np.iinfo(np.int32)


def _is_concrete(data: LoggedData) -> bool:
    """True unless a field is a tracer or a non-array placeholder (jit, vmap, tree ops).

    Python lists count as concrete data (they are converted to arrays)."""
    for name in _ARRAY_FIELDS:
        value = getattr(data, name)
        if value is None or isinstance(value, list):
            continue
        if isinstance(value, jax.core.Tracer) or not hasattr(value, "shape"):
            return False
    return True


def _set(data: LoggedData, name: str, value: Any) -> None:
    object.__setattr__(data, name, value)  # the dataclass is frozen; this is construction


def _convert(data: LoggedData) -> None:
    """Lists to arrays and the documented dtypes (float32 / int32 / bool), in place.

    Float fields are checked in float64 before the cast: a finite value beyond float32's
    range is an error naming the field (it would silently become ``inf``)."""
    for name in _ARRAY_FIELDS:
        value = getattr(data, name)
        if value is None:
            continue
        if isinstance(value, list):
            try:
                value = np.asarray(value)
            except ValueError as err:  # ragged nested lists
                _fail(name, f"cannot be made an array ({err})")
            if value.dtype == object:
                _fail(name, "must be an array of numbers, got a list of other objects")
            _set(data, name, value)
        dtype = np.dtype(value.dtype)
        is_jax = isinstance(value, jax.Array)
        if name in _FLOAT_FIELDS:
            if dtype == np.float32 or not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
                continue  # float32 already, or not numeric: validation reports it
            host = np.asarray(value)
            if np.issubdtype(dtype, np.complexfloating):
                _fail(name, f"must be real numbers, got dtype {dtype}")
            if host.size and np.issubdtype(dtype, np.floating) and np.finfo(dtype).max > _FLOAT32_MAX:
                over = np.isfinite(host) & (np.abs(host) > _FLOAT32_MAX)
                if over.any():
                    where = np.argwhere(over)[0]
                    at = f"row {int(where[0])}" if host.ndim >= 2 else f"index {int(where[0])}"
                    if host.ndim >= 2 and name in _SLOT_FIELDS:
                        at += f" slot {int(where[1])}"
                    _fail(
                        name,
                        f"{int(over.sum())} value(s) exceed float32's range (~3.4e38, |x| > {_FLOAT32_MAX:.4g}), "
                        f"first {float(host[tuple(where)]):.6g} at {at}; stored as float32 they would be inf",
                    )
            _set(data, name, value.astype(jnp.float32) if is_jax else host.astype(np.float32))
        elif name == "ranking":
            if dtype == np.int32 or not np.issubdtype(dtype, np.integer):
                continue  # validation rejects non-integer rankings
            host = np.asarray(value)
            if host.size and (host.min() < _INT32.min or host.max() > _INT32.max):
                continue  # out of range for any n_items: validation names the slot
            _set(data, name, value.astype(jnp.int32) if is_jax else host.astype(np.int32))
        # item_mask: a list of bools is already bool; any other dtype is rejected by validation.


def _fail(field: str, problem: str) -> None:
    raise ValueError(f"LoggedData.{field}: {problem}")


def _check_finite(field: str, value: np.ndarray, hint: str = "") -> None:
    bad = ~np.isfinite(value)
    if bad.any():
        first = np.argwhere(bad)[0]
        where = f"row {int(first[0])}" + (f" slot {int(first[1])}" if field in _SLOT_FIELDS and len(first) > 1 else "")
        _fail(field, f"{int(bad.sum())} non-finite value(s) (NaN or inf), first in {where}{hint}")


_SLOT_FIELDS = ("reward", "log_pi0_prefix", "log_pi0_position_marginal")


def _validate(data: LoggedData) -> None:
    """Vectorised checks with messages naming the field; raises ``ValueError``."""
    for name in _REQUIRED_FIELDS:
        if getattr(data, name) is None:
            _fail(name, "is required (got None)")
    ranking = np.asarray(data.ranking)
    if ranking.ndim != 2:
        _fail("ranking", f"must be [n, L], got shape {ranking.shape}")
    n, n_slots = ranking.shape
    if n == 0:
        _fail("ranking", "has no rows (n = 0)")
    if not np.issubdtype(ranking.dtype, np.integer):
        _fail("ranking", f"must hold integer item indices, got dtype {ranking.dtype}")
    if not isinstance(data.n_items, (int, np.integer)) or data.n_items < 1:
        _fail("n_items", f"must be a positive int, got {data.n_items!r}")
    if n_slots < 1 or n_slots > data.n_items:
        _fail("ranking", f"length L={n_slots} must be in [1, n_items={data.n_items}]")
    if ranking.min() < 0 or ranking.max() >= data.n_items:
        bad = np.argwhere((ranking < 0) | (ranking >= data.n_items))[0]
        _fail(
            "ranking",
            f"item indices must be in [0, {data.n_items}); row {bad[0]} slot {bad[1]} holds {ranking[bad[0], bad[1]]}",
        )
    if n_slots > 1:
        srt = np.sort(ranking, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
        if dup.any():
            row = int(np.argmax(dup))
            _fail(
                "ranking",
                f"repeats an item within a row ({int(dup.sum())} rows), first row {row}: {ranking[row].tolist()}",
            )

    context = np.asarray(data.context)
    if context.ndim != 2 or context.shape[0] != n:
        _fail("context", f"must be [n={n}, dx], got shape {context.shape}")
    _check_finite("context", context)

    for name in ("reward", "log_pi0_prefix", "log_pi0_position_marginal"):
        value = getattr(data, name)
        if value is None:
            continue
        value = np.asarray(value)
        if value.shape != (n, n_slots):
            _fail(name, f"must be [n, L] = {(n, n_slots)}, got shape {value.shape}")
        hint = ""
        if name in ("log_pi0_prefix", "log_pi0_position_marginal"):
            hint = (
                " (a ranked item the logging policy could not place, e.g. one whose logit is -inf: "
                "the logged ranking is impossible under pi_0)"
            )
        _check_finite(name, value, hint)
    log_prefix = np.asarray(data.log_pi0_prefix)
    if (log_prefix > 1e-5).any():
        row = int(np.argwhere(log_prefix > 1e-5)[0][0])
        _fail(
            "log_pi0_prefix",
            f"log-propensities must be <= 0 (propensities in (0, 1]); row {row} has {log_prefix[row].tolist()}",
        )
    if n_slots > 1 and (np.diff(log_prefix, axis=1) > 1e-4).any():
        row = int(np.argwhere(np.diff(log_prefix, axis=1) > 1e-4)[0][0])
        _fail(
            "log_pi0_prefix",
            f"prefix log-probabilities must be non-increasing along slots; row {row} has {log_prefix[row].tolist()}",
        )
    if data.log_pi0_position_marginal is not None:
        marg = np.asarray(data.log_pi0_position_marginal)
        if (marg > 1e-5).any():
            row = int(np.argwhere(marg > 1e-5)[0][0])
            _fail("log_pi0_position_marginal", f"log-probabilities must be <= 0; row {row} has {marg[row].tolist()}")

    weight = np.asarray(data.position_weight)
    if weight.shape != (n_slots,):
        _fail("position_weight", f"must be [L] = ({n_slots},), got shape {weight.shape}")
    _check_finite("position_weight", weight)
    if (weight < 0).any():
        _fail("position_weight", f"must be non-negative, got {weight.tolist()}")

    if data.item_mask is not None:
        mask = np.asarray(data.item_mask)
        if mask.shape != (n, data.n_items) or mask.dtype != np.bool_:
            _fail("item_mask", f"must be bool [n, D] = {(n, data.n_items)}, got {mask.dtype} {mask.shape}")
        ranked_real = np.take_along_axis(mask, ranking, axis=1)
        if not ranked_real.all():
            row, slot = (int(i) for i in np.argwhere(~ranked_real)[0])
            _fail(
                "item_mask",
                f"row {row} ranks a masked-out item: slot {slot} holds item {int(ranking[row, slot])}, "
                f"which item_mask marks as not a candidate ({int((~ranked_real).any(axis=1).sum())} "
                f"row(s) affected; a logging policy with fewer than L real candidates?)",
            )
    if data.logging_logits is not None:
        logits = np.asarray(data.logging_logits)
        if logits.shape != (n, data.n_items):
            _fail("logging_logits", f"must be [n, D] = {(n, data.n_items)}, got shape {logits.shape}")
        if np.isnan(logits).any() or np.isposinf(logits).any():
            row = int(np.argwhere(np.isnan(logits) | np.isposinf(logits))[0][0])
            _fail("logging_logits", f"NaN or +inf logits (-inf marks an item never placed), first in row {row}")
        ranked = np.take_along_axis(logits, ranking, axis=1)
        if not np.isfinite(ranked).all():
            row = int(np.argwhere(~np.isfinite(ranked))[0][0])
            _fail("logging_logits", f"row {row} ranks an item whose logging logit is -inf (impossible under pi_0)")
    if data.item_features is not None:
        feats = np.asarray(data.item_features)
        ok = (feats.ndim == 2 and feats.shape[0] == data.n_items) or (
            feats.ndim == 3 and feats.shape[:2] == (n, data.n_items)
        )
        if not ok:
            _fail(
                "item_features", f"must be [D, di] or [n, D, di] with D={data.n_items}, n={n}; got shape {feats.shape}"
            )
        _check_finite("item_features", feats)


def train_val_split(data: LoggedData, key: jax.Array, val_fraction: float = 0.2) -> tuple[LoggedData, LoggedData]:
    """Random split by row into (train, validation).

    Args:
      data: the logged data.
      key: PRNG key for the permutation.
      val_fraction: share of rows in the validation part, in (0, 1).

    Returns:
      ``(train, validation)``, both non-empty.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n = data.n_rounds
    n_val = int(round(n * val_fraction))
    if n_val < 1 or n_val >= n:
        raise ValueError(f"val_fraction={val_fraction} of n={n} rows leaves an empty part")
    perm = jax.random.permutation(key, n)  # jnp throughout: traceable (fits vmapped over seeds)
    return data.take(jnp.sort(perm[n_val:])), data.take(jnp.sort(perm[:n_val]))


def minibatches(data: LoggedData, key: jax.Array, batch_size: int, *, drop_last: bool = True) -> Iterator[LoggedData]:
    """Shuffled minibatches of rows, one pass (an epoch).

    Args:
      data: the logged data.
      key: PRNG key for the shuffle.
      batch_size: rows per batch, ``>= 1``. With ``drop_last`` every batch has exactly
        this size (fixed shapes: the jitted step compiles once); the remainder is dropped.
      drop_last: keep (False) or drop (True) a smaller final batch.

    Yields:
      LoggedData batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = data.n_rounds
    if drop_last and batch_size > n:
        raise ValueError(f"batch_size={batch_size} exceeds the number of rows n={n}")
    perm = np.asarray(jax.random.permutation(key, n))
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        yield data.take(perm[start : start + batch_size])
