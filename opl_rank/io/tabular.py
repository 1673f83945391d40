"""Logged rankings as tables: pandas DataFrames, Parquet and CSV files.

The on-disk schema (docs/data_format.md) has one row per logged round with list columns:

  context                    list[float] (dx)   required
  ranking                    list[int] (L)      required, item indices in [0, D), best first
  reward                     list[float] (L)    required
  log_pi0_prefix             list[float] (L)    required: log pi_0(a_1..a_l | x), or instead
  pi0_prefix                 list[float] (L)      the probabilities themselves, in (0, 1]
  log_pi0_position_marginal  list[float] (L)    optional (IIPS), or pi0_position_marginal
  item_mask                  list[bool] (D)     optional, True for real candidates
  item_features              list[list[float]]  optional, per-round ``[D][di]``

and dataset-level values -- ``n_items`` (D), ``position_weight`` (alpha, [L]) and shared
``item_features`` (``[D][di]``) -- in the Parquet file's key-value metadata under the key
``opl_rank`` (a JSON object; ``DataFrame.attrs["opl_rank"]`` in pandas), or as constant
columns ``n_items`` / ``position_weight`` (alias ``alpha``), or as keyword arguments; when
none gives them, ``n_items`` is inferred and alpha defaults to DCG.

pandas and pyarrow are imported here, lazily; ``import opl_rank`` does not need them.
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import re
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "from_pandas",
    "to_pandas",
    "from_parquet",
    "to_parquet",
    "from_csv",
    "to_csv",
    "read_logged_data",
    "read_table",
    "read_contexts",
    "write_rankings",
]

FORMAT = "opl_rank.logged_data"
FORMAT_VERSION = 1
METADATA_KEY = "opl_rank"

# Row columns: (name, alternative name holding probabilities instead of logs).
_PREFIX = ("log_pi0_prefix", "pi0_prefix")
_MARGINAL = ("log_pi0_position_marginal", "pi0_position_marginal")
_REQUIRED = ("context", "ranking", "reward")
_DATASET_COLUMNS = ("n_items", "position_weight", "alpha")
KNOWN_COLUMNS = _REQUIRED + _PREFIX + _MARGINAL + ("item_mask", "item_features") + _DATASET_COLUMNS

_ROW_FIELDS = ("context", "ranking", "reward", "log_pi0_prefix", "log_pi0_position_marginal", "item_mask")
_PROB_TOLERANCE = 1e-6  # a probability up to 1 + this counts as 1 (float rounding)
_FLOAT32_MAX = float(np.finfo(np.float32).max)  # ~3.4e38: floats are stored as float32
# n_items inferred as max id + 1 is refused when more than this many, and more than the
# distinct ids that appear, of the items 0..D-1 are never ranked: a stray id (docs/data_format.md)
_MAX_UNSEEN_ITEMS = 8
_LOG_TOLERANCE = 1e-5  # the same for a log-probability above 0 (as LoggedData)


def _require(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package = module.split(".")[0]
        raise ImportError(f"{what} needs {package}, a dependency of opl_rank (pip install {package})") from err


# -- reading ---------------------------------------------------------------------------


class _Columns:
    """The columns of one table as pyarrow arrays, with the source named in every error."""

    def __init__(
        self,
        columns: dict[str, Any],
        n: int,
        source: str,
        metadata: dict[str, Any],
        row_note: Callable[[int], str] = lambda i: "",
    ) -> None:
        self.columns, self.n, self.source, self.metadata, self.row_note = columns, n, source, metadata, row_note

    def fail(self, column: str | None, problem: str, row: int | None = None) -> NoReturn:
        where = "" if column is None else f"column {column!r}: "
        if row is not None:
            where += f"row {int(row)}{self.row_note(int(row))} "
        raise ValueError(f"{self.source}: {where}{problem}")

    def matrix(self, name: str, kind: str, width: int | None = None, width_name: str = "") -> np.ndarray:
        """A list column as an ``[n, w]`` array (``kind``: float, int or bool), every row the
        same length ``w`` (``width`` when given), with no missing values."""
        pa, pc = _require("pyarrow", "reading logged data"), _require("pyarrow.compute", "reading logged data")
        arr = self.columns[name]
        kind_name = {"float": "numbers", "int": "item indices (integers)", "bool": "booleans"}[kind]
        if pa.types.is_fixed_size_list(arr.type):
            arr = arr.cast(pa.list_(arr.type.value_type))
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            self.fail(name, f"must hold one list of {kind_name} per row, got values of type {arr.type}")
        if arr.null_count:
            self.fail(name, "is missing (null or NaN), expected a list", _first(arr.is_null()))
        lengths = np.asarray(pc.list_value_length(arr).to_numpy(zero_copy_only=False), dtype=np.int64)
        expected = int(lengths[0]) if width is None else width
        bad = np.flatnonzero(lengths != expected)
        if bad.size:
            i = int(bad[0])
            why = f"as in row 0{self.row_note(0)}" if width is None else width_name
            self.fail(
                name,
                f"has length {int(lengths[i])}, expected {expected} ({why}); {bad.size} row(s) of another length",
                i,
            )
        if expected == 0:
            self.fail(name, "holds empty lists")
        values = arr.flatten()
        if values.null_count:
            at = _first(values.is_null())
            self.fail(
                name, f"slot {at % expected} is null (missing, or a NaN that pandas stored as null)", at // expected
            )
        vtype = values.type
        if not (pa.types.is_integer(vtype) or pa.types.is_floating(vtype) or pa.types.is_boolean(vtype)):
            self.fail(name, f"must hold lists of {kind_name}, got lists of {vtype}")
        host = values.to_numpy(zero_copy_only=False).reshape(self.n, expected)
        if kind == "float":
            host = host.astype(np.float32) if host.dtype == np.bool_ else host
            bad_value = ~np.isfinite(host.astype(np.float64))
            if bad_value.any():
                row, slot = (int(v) for v in np.argwhere(bad_value)[0])
                shown = "NaN" if np.isnan(host[row, slot]) else str(float(host[row, slot]))
                self.fail(
                    name,
                    f"slot {slot} is {shown} ({int(bad_value.sum())} non-finite value(s)); values must be finite",
                    row,
                )
            self.within_float32(name, host)
            return host
        if kind == "int":
            if np.issubdtype(host.dtype, np.floating):
                bad_value = ~np.isfinite(host) | (host != np.round(host))
                if bad_value.any():
                    row, slot = (int(v) for v in np.argwhere(bad_value)[0])
                    self.fail(
                        name, f"slot {slot} holds {float(host[row, slot])!r}, not an item index (an integer)", row
                    )
                if np.abs(host).max() > np.iinfo(np.int32).max:
                    row, slot = (int(v) for v in np.argwhere(np.abs(host) > np.iinfo(np.int32).max)[0])
                    self.fail(name, f"slot {slot} holds {float(host[row, slot])!r}, beyond int32", row)
                return host.astype(np.int32)
            if host.dtype == np.bool_:
                self.fail(name, "must hold item indices (integers), got booleans")
            info = np.iinfo(np.int32)
            wide = (host < info.min) | (host > info.max)
            if wide.any():
                row, slot = (int(v) for v in np.argwhere(wide)[0])
                self.fail(name, f"slot {slot} holds {int(host[row, slot])}, beyond int32", row)
            return host.astype(np.int32)
        # bool
        if host.dtype != np.bool_:
            bad_value = (host != 0) & (host != 1)
            if bad_value.any():
                row, slot = (int(v) for v in np.argwhere(bad_value)[0])
                self.fail(name, f"slot {slot} holds {host[row, slot].item()!r}; item_mask holds booleans (or 0/1)", row)
            host = host != 0
        return host

    def within_float32(self, name: str | None, values: np.ndarray, what: str = "") -> None:
        """Fail on a finite value beyond float32's range (it would be stored as inf):
        ``values`` ``[n, w]`` per row (slot named), or a dataset-level array (``what`` names it)."""
        if values.dtype.kind != "f" or values.dtype.itemsize <= 4 or not values.size:
            return
        over = np.abs(values) > _FLOAT32_MAX
        if not over.any():
            return
        at = tuple(int(v) for v in np.argwhere(over)[0])
        problem = (
            f"{float(values[at]):.6g}, which exceeds float32's range (~3.4e38; values are stored as float32)"
            f" ({int(over.sum())} such value(s))"
        )
        if what:
            self.fail(name, f"{what} {list(at) if len(at) > 1 else at[0]} holds {problem}")
        self.fail(name, f"slot {at[1]} holds {problem}", at[0])

    def probabilities(self, names: tuple[str, str], width: int, required: bool) -> np.ndarray | None:
        """``log_*`` or the probability column ``*`` as float64 log-probabilities."""
        log_name, prob_name = names
        present = [name for name in names if name in self.columns]
        if len(present) == 2:
            self.fail(None, f"has both {log_name!r} and {prob_name!r}; give one (log-probabilities or probabilities)")
        if not present:
            if required:
                self.missing(f"{log_name!r} (or {prob_name!r})")
            return None
        name = present[0]
        values = self.matrix(name, "float", width, f"L={width}, the ranking's length").astype(np.float64)
        if name == log_name:
            over = values > _LOG_TOLERANCE
            if over.any():
                row, slot = (int(v) for v in np.argwhere(over)[0])
                self.fail(
                    name,
                    f"slot {slot} holds {values[row, slot]:.6g} > 0: log-probabilities must be <= 0 "
                    f"(that is a probability exp({values[row, slot]:.4g}) = "
                    f"{math.exp(min(values[row, slot], 700.0)):.4g} > 1)",
                    row,
                )
            return values
        over = values > 1.0 + _PROB_TOLERANCE
        if over.any():
            row, slot = (int(v) for v in np.argwhere(over)[0])
            self.fail(
                name,
                f"slot {slot} holds {values[row, slot]:.6g} > 1: probabilities must be in (0, 1] "
                f"({int(over.sum())} value(s) above 1)",
                row,
            )
        zero = values <= 0.0
        if zero.any():
            row, slot = (int(v) for v in np.argwhere(zero)[0])
            self.fail(
                name,
                f"slot {slot} holds {values[row, slot]:.6g}: probabilities must be in (0, 1] "
                "(0: the logged ranking was impossible under the logging policy)",
                row,
            )
        return np.log(np.minimum(values, 1.0))

    def missing(self, name: str) -> NoReturn:
        have = sorted(self.columns)
        self.fail(None, f"missing column {name}; the table has columns {have} (schema: docs/data_format.md)")

    def scalar_column(self, name: str) -> Any:
        """The single value of a constant column (a list column's list, or a scalar)."""
        values = self.columns[name].to_pylist()
        first = values[0]
        for i, value in enumerate(values):
            if value is None:
                self.fail(name, "is missing (null)", i)
            if value != first:
                self.fail(
                    name,
                    f"must hold the same value in every row (a dataset-level value), "
                    f"but row 0 has {first!r} and this row {value!r}",
                    i,
                )
        return first


def _first(mask: Any) -> int:
    return int(np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool))[0])


def _check_metadata(meta: Any, source: str) -> dict:
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise ValueError(f"{source}: metadata {METADATA_KEY!r} must be a JSON object, got {type(meta).__name__}")
    version = meta.get("version", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{source}: metadata {METADATA_KEY!r} has format version {version!r}; this opl_rank reads "
            f"version {FORMAT_VERSION} (written by a newer opl_rank?)"
        )
    unknown = sorted(set(meta) - {"format", "version", "n_items", "position_weight", "item_features"})
    if unknown:
        raise ValueError(f"{source}: metadata {METADATA_KEY!r} has unknown keys {unknown}")
    return meta


def _dataset_value(cols: _Columns, name: str, argument: Any, argument_name: str, column_names: tuple[str, ...]) -> Any:
    """The argument, the metadata's value, or a constant column's (None: none of them);
    an argument that contradicts the file is an error."""
    found = None
    where = ""
    if name in cols.metadata:
        found, where = cols.metadata[name], f"metadata {METADATA_KEY!r}"
    else:
        present = [c for c in column_names if c in cols.columns]
        if len(present) > 1:
            cols.fail(None, f"has both columns {present}; give one")
        if present:
            found, where = cols.scalar_column(present[0]), f"column {present[0]!r}"
    if argument is None:
        return found
    if found is not None and not _same(found, argument):
        cols.fail(None, f"{argument_name}={_short(argument)} contradicts the table's {where} ({_short(found)})")
    return argument


def _same(a: Any, b: Any) -> bool:
    """Equal as numbers up to float32 rounding (a file's alpha is float32)."""
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-6, atol=0.0))


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple, np.ndarray)):
        return "[" + ", ".join(f"{float(v):.4g}" for v in np.asarray(value).reshape(-1)) + "]"
    return repr(value)


def renamed_position_weight(position_weight: Any, alpha: Any) -> Any:
    """``position_weight``, or the deprecated keyword ``alpha`` (its name before 0.2.0) with a warning."""
    if alpha is None:
        return position_weight
    if position_weight is not None:
        raise TypeError("give position_weight or its old name alpha, not both")
    import warnings

    warnings.warn(
        "the keyword alpha= is now position_weight= (opl_rank 0.2.0); alpha= goes in 0.3.0",
        DeprecationWarning,
        stacklevel=3,
    )
    return alpha


def _build(cols: _Columns, n_items: int | None, position_weight: Any) -> Any:
    """A validated LoggedData from the columns (errors name the column and the row)."""
    import jax.numpy as jnp

    from opl_rank.data import LoggedData
    from opl_rank.metrics import dcg_position_weights

    if cols.n == 0:
        cols.fail(None, "has no rows")
    for name in _REQUIRED:
        if name not in cols.columns:
            cols.missing(repr(name))
    if not any(name in cols.columns for name in _PREFIX):
        cols.missing(f"{_PREFIX[0]!r} (or {_PREFIX[1]!r})")
    ranking = cols.matrix("ranking", "int")
    n_slots = ranking.shape[1]
    context = cols.matrix("context", "float")
    reward = cols.matrix("reward", "float", n_slots, f"L={n_slots}, the ranking's length")
    log_prefix = cols.probabilities(_PREFIX, n_slots, required=True)
    log_marginal = cols.probabilities(_MARGINAL, n_slots, required=False)

    n_items = _dataset_value(cols, "n_items", n_items, "n_items", ("n_items",))
    mask, from_mask = None, False
    if "item_mask" in cols.columns:
        mask = cols.matrix(
            "item_mask",
            "bool",
            None if n_items is None else int(n_items),
            "" if n_items is None else f"n_items={n_items}",
        )
        if n_items is None:
            n_items, from_mask = mask.shape[1], True
    _check_negative_ids(cols, ranking)
    if n_items is None:
        n_items = max(int(ranking.max()) + 1, n_slots)
        _check_inferred_n_items(cols, ranking, n_items)
    if isinstance(n_items, bool) or not isinstance(n_items, (int, np.integer)) or int(n_items) < 1:
        cols.fail(None, f"n_items must be a positive int, got {n_items!r}")
    n_items = int(n_items)
    _check_ids_below(cols, ranking, n_items, from_mask)

    weight = _dataset_value(cols, "position_weight", position_weight, "position_weight", ("position_weight", "alpha"))
    if weight is None:
        weight = np.asarray(dcg_position_weights(n_slots))
    try:
        weight = np.asarray(weight, dtype=np.float64)
    except (TypeError, ValueError) as err:
        cols.fail(None, f"position_weight (alpha) must be a list of {n_slots} numbers: {err}")
    if weight.shape != (n_slots,):
        cols.fail(
            None, f"position_weight (alpha) must have L={n_slots} entries (the ranking's length), got {weight.tolist()}"
        )
    cols.within_float32(None, weight, "position_weight (alpha) entry")

    features = cols.metadata.get("item_features")
    if "item_features" in cols.columns:
        if features is not None:
            cols.fail("item_features", f"is given both per row and in the metadata {METADATA_KEY!r}; give one")
        features = _nested_column(cols, "item_features", n_items)
    elif features is not None:
        features = np.asarray(features, dtype=np.float64)
    if features is not None:
        cols.within_float32("item_features", features, "item" if features.ndim == 2 else "[row, item, feature]")

    fields = dict(
        context=context,
        ranking=ranking,
        reward=reward,
        log_pi0_prefix=log_prefix,
        position_weight=weight,
        log_pi0_position_marginal=log_marginal,
        item_mask=mask,
        item_features=features,
    )
    try:
        # LoggedData casts (float32, int32) and validates what is left: item indices in
        # [0, n_items), no repeats, prefix log-probabilities non-increasing, the mask.
        arrays: dict[str, Any] = {k: None if v is None else jnp.asarray(v) for k, v in fields.items()}
        return LoggedData(n_items=n_items, **arrays)
    except ValueError as err:
        message = str(err)
        match = re.match(r"LoggedData\.(\w+): ", message)
        if match:
            field = match.group(1)
            label = f"column {field!r}" if field in _ROW_FIELDS else field
            for log_name, prob_name in (_PREFIX, _MARGINAL):
                if field == log_name and prob_name in cols.columns:
                    label = f"column {prob_name!r} (checked as log-probabilities)"
            message = label + ": " + message[match.end() :]
        raise ValueError(f"{cols.source}: {message}") from err


def _check_negative_ids(cols: _Columns, ranking: np.ndarray) -> None:
    if ranking.min() < 0:
        row, slot = (int(v) for v in np.argwhere(ranking < 0)[0])
        cols.fail("ranking", f"slot {slot} holds item id {int(ranking[row, slot])}; item ids are >= 0", row)


def _check_ids_below(cols: _Columns, ranking: np.ndarray, n_items: int, from_mask: bool) -> None:
    """Every id below the given (or the item_mask's) n_items, else an error naming the row."""
    beyond = ranking >= n_items
    if beyond.any():
        row, slot = (int(v) for v in np.argwhere(beyond)[0])
        source = f"the item_mask's width n_items={n_items}" if from_mask else f"n_items={n_items}"
        cols.fail(
            "ranking",
            f"slot {slot} holds item id {int(ranking[row, slot])}, not below {source} (item ids are in "
            f"[0, {n_items})); {int(beyond.sum())} id(s) out of range",
            row,
        )


def _check_inferred_n_items(cols: _Columns, ranking: np.ndarray, n_items: int) -> None:
    """Refuse an inferred ``n_items = max id + 1`` that most items 0..D-1 never reach.

    Rule (docs/data_format.md): with ``U`` distinct ids in the rankings, the ``D - U``
    items never ranked must not outnumber both ``U`` and ``_MAX_UNSEEN_ITEMS``. One id 57
    among ids 0..9 (D = 58, U = 11: 47 never ranked) fails; a small file whose ids skip a
    few items, or a large catalog sampled densely enough, does not.
    """
    ids = np.unique(ranking)
    seen = int(ids.size)
    unseen = n_items - seen
    if unseen <= max(seen, _MAX_UNSEEN_ITEMS):
        return
    largest = int(ids[-1])
    row, slot = (int(v) for v in np.argwhere(ranking == largest)[0])
    others = f"the next largest is {int(ids[-2])}" if seen > 1 else "the only id"
    cols.fail(
        "ranking",
        f"slot {slot} holds item id {largest}, far beyond the others ({others}): n_items would be inferred "
        f"as max id + 1 = {n_items}, yet only {seen} distinct id(s) appear and {unseen} of the items "
        f"0..{n_items - 1} are never ranked. Pass n_items={n_items} (opl-rank: --n-items {n_items}) if "
        "there really are that many items, or fix the id",
        row,
    )


def _nested_column(cols: _Columns, name: str, n_items: int) -> np.ndarray:
    """A per-round ``[D][di]`` column as ``[n, D, di]``."""
    rows = cols.columns[name].to_pylist()
    out: list[np.ndarray] = []
    for i, row in enumerate(rows):
        try:
            value = np.asarray(row, dtype=np.float64)
        except (TypeError, ValueError) as err:
            cols.fail(name, f"must be a [D][di] list of numbers ({err})", i)
        if value.ndim != 2 or value.shape[0] != n_items or (out and value.shape != out[0].shape):
            cols.fail(name, f"must be [D={n_items}][di] like row 0, got shape {value.shape}", i)
        out.append(value)
    return np.stack(out)


# -- pandas ----------------------------------------------------------------------------


def _is_missing(cell: Any) -> bool:
    if cell is None:
        return True
    if isinstance(cell, float) and math.isnan(cell):
        return True
    return type(cell).__name__ in ("NAType", "NaTType")


def _parse_cell(text: str) -> Any:
    """A list written as JSON (``[1, 2]``), as a Python literal (``[True, False]``, what
    ``DataFrame.to_csv`` writes for list cells) or as space-separated numbers (``1 2``)."""
    text = text.strip()
    if text.startswith(("[", "(")):
        try:
            return json.loads(text)
        except ValueError:
            try:  # a Python list literal, as pandas' own to_csv writes list cells ([True, False])
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError) as err:
                raise ValueError(f"neither JSON nor a Python list literal ({type(err).__name__}: {err})") from None
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"a {type(value).__name__}, not a list") from None
            return list(value)
    out: list[Any] = []
    for token in text.replace(",", " ").split():
        low = token.lower()
        if low in ("true", "false"):
            out.append(low == "true")
            continue
        try:
            out.append(int(token))
        except ValueError:
            out.append(float(token))  # ValueError names the token
    return out


def _series_to_arrow(series: Any, name: str, cols: _Columns) -> Any:
    pa = _require("pyarrow", "LoggedData.from_pandas")
    cells = series.tolist()
    parsed: list[Any] = []
    for i, cell in enumerate(cells):
        if _is_missing(cell) or (isinstance(cell, str) and not cell.strip()):
            parsed.append(None)
        elif isinstance(cell, (bytes, str)):
            try:
                value = _parse_cell(cell.decode() if isinstance(cell, bytes) else cell)
            except ValueError as err:
                cols.fail(
                    name, f"holds {_short_repr(cell)}, not a list (JSON '[1, 2]' or space-separated '1 2'): {err}", i
                )
            if name == "n_items" and isinstance(value, list) and len(value) == 1:
                value = value[0]  # a CSV's "5"
            parsed.append(value)
        elif isinstance(cell, np.ndarray) and cell.ndim == 0:
            parsed.append(cell.item())
        else:
            parsed.append(cell)
    if name == "item_features":  # nested: kept as Python objects (checked in _nested_column)
        return pa.array([None if c is None else np.asarray(c).tolist() for c in parsed])
    try:
        return pa.array(parsed)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as err:
        for i, cell in enumerate(parsed):
            try:
                pa.array([cell])
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as cell_err:
                cols.fail(name, f"holds {_short_repr(cell)}, which is not a list of numbers ({cell_err})", i)
        kinds = sorted({type(c).__name__ for c in parsed if c is not None})
        cols.fail(name, f"mixes lists and other values ({', '.join(kinds)}): {err}")


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def from_pandas(
    frame: Any,
    *,
    n_items: int | None = None,
    position_weight: Any = None,
    alpha: Any = None,
    source: str = "DataFrame",
    row_note: Callable[[int], str] | None = None,
) -> Any:
    """[`opl_rank.data.LoggedData.from_pandas`][opl_rank.data.LoggedData.from_pandas] (``source`` names the table in errors)."""
    pd = _require("pandas", "LoggedData.from_pandas")
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"from_pandas needs a pandas DataFrame, got {type(frame).__name__}")
    duplicated = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    if duplicated:
        raise ValueError(f"{source}: duplicate columns {duplicated}")
    if row_note is None:
        index = frame.index
        plain = isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
        row_note = (lambda i: "") if plain else (lambda i: f" (index {index[i]!r})")
    meta = frame.attrs.get(METADATA_KEY)
    cols = _Columns({}, len(frame), source, _check_metadata(meta, source), row_note)
    for name in frame.columns:
        if name in KNOWN_COLUMNS:
            cols.columns[name] = _series_to_arrow(frame[name], name, cols)
    # unknown columns (ids, timestamps, ...) are ignored
    return _build(cols, n_items, renamed_position_weight(position_weight, alpha))


def _table(data: Any) -> Any:
    """LoggedData -> pyarrow Table with the dataset-level values in its metadata."""
    pa = _require("pyarrow", "LoggedData.to_parquet / to_pandas")
    columns = {}
    for name in ("context", "ranking", "reward", "log_pi0_prefix", "log_pi0_position_marginal", "item_mask"):
        value = getattr(data, name)
        if value is not None:
            columns[name] = _list_array(pa, np.asarray(value))
    features = None if data.item_features is None else np.asarray(data.item_features)
    if features is not None and features.ndim == 3:
        columns["item_features"] = _list_array(pa, features)
    table = pa.table(columns)
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(_metadata(data))})


def _metadata(data: Any) -> dict:
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "n_items": int(data.n_items),
        "position_weight": [float(v) for v in np.asarray(data.position_weight).reshape(-1)],
    }
    if data.item_features is not None and np.asarray(data.item_features).ndim == 2:
        meta["item_features"] = np.asarray(data.item_features, dtype=np.float64).tolist()
    return meta


def _list_array(pa: Any, values: np.ndarray) -> Any:
    """``[n, w, ...]`` -> nested list arrays (the dtype kept: float32 stays float32)."""
    if values.ndim == 1:
        return pa.array(values)
    n, width = values.shape[:2]
    inner = _list_array(pa, values.reshape((n * width,) + values.shape[2:]))
    return pa.ListArray.from_arrays(pa.array(np.arange(0, n * width + 1, width, dtype=np.int32)), inner)


def to_pandas(data: Any) -> Any:
    """[`opl_rank.data.LoggedData.to_pandas`][opl_rank.data.LoggedData.to_pandas]."""
    _require("pandas", "LoggedData.to_pandas")
    table = _table(data)
    frame = table.to_pandas()
    frame.attrs[METADATA_KEY] = _metadata(data)
    return frame


# -- files -----------------------------------------------------------------------------


def _exists(path: str | os.PathLike, what: str) -> str:
    shown = os.fspath(path)
    if not os.path.exists(shown):
        raise FileNotFoundError(f"{shown}: no such file ({what})")
    if os.path.isdir(shown):
        raise ValueError(f"{shown}: is a directory, expected a {what} file")
    return shown


def read_table(path: str | os.PathLike) -> tuple[Any, dict | None]:
    """A Parquet file as a pyarrow Table and its ``opl_rank`` metadata (None if absent).

    Raises:
      FileNotFoundError: no such file.
      ValueError: naming the file: not a Parquet file, or unreadable metadata.
    """
    pa = _require("pyarrow", "reading Parquet")
    pq = _require("pyarrow.parquet", "reading Parquet")
    shown = _exists(path, "Parquet")
    try:
        table = pq.read_table(shown)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{shown}: not a readable Parquet file ({type(err).__name__}: {err})") from err
    raw = table.schema.metadata or {}
    meta = None
    try:
        if METADATA_KEY.encode() in raw:
            meta = json.loads(raw[METADATA_KEY.encode()])
        elif b"PANDAS_ATTRS" in raw:  # a frame from to_pandas() saved with DataFrame.to_parquet
            meta = json.loads(raw[b"PANDAS_ATTRS"]).get(METADATA_KEY)
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{shown}: the Parquet metadata {METADATA_KEY!r} is not valid JSON ({err})") from err
    return table, meta


def from_parquet(
    path: str | os.PathLike, *, n_items: int | None = None, position_weight: Any = None, alpha: Any = None
) -> Any:
    """[`opl_rank.data.LoggedData.from_parquet`][opl_rank.data.LoggedData.from_parquet]."""
    table, meta = read_table(path)
    shown = os.fspath(path)
    names = table.column_names
    duplicated = sorted({c for c in names if names.count(c) > 1})
    if duplicated:
        raise ValueError(f"{shown}: duplicate columns {duplicated}")
    cols = _Columns(
        {name: table.column(name).combine_chunks() for name in names if name in KNOWN_COLUMNS},
        table.num_rows,
        shown,
        _check_metadata(meta, shown),
    )
    return _build(cols, n_items, position_weight)


def to_parquet(data: Any, path: str | os.PathLike) -> None:
    """[`opl_rank.data.LoggedData.to_parquet`][opl_rank.data.LoggedData.to_parquet]."""
    from opl_rank.io.atomic import atomic_write

    pq = _require("pyarrow.parquet", "LoggedData.to_parquet")
    table = _table(data)
    atomic_write(path, lambda f: pq.write_table(table, f))


def from_csv(
    path: str | os.PathLike, *, n_items: int | None = None, position_weight: Any = None, alpha: Any = None
) -> Any:
    """[`opl_rank.data.LoggedData.from_csv`][opl_rank.data.LoggedData.from_csv]."""
    pd = _require("pandas", "LoggedData.from_csv")
    shown = _exists(path, "CSV")
    try:
        frame = pd.read_csv(shown, dtype=str, keep_default_na=False)
    except (ValueError, OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{shown}: not a readable CSV file ({type(err).__name__}: {err})") from err
    # row i is line i + 2 of the file (line 1 is the header) when no cell spans lines
    return from_pandas(
        frame,
        n_items=n_items,
        position_weight=renamed_position_weight(position_weight, alpha),
        source=shown,
        row_note=lambda i: f" (line {i + 2})",
    )


def to_csv(data: Any, path: str | os.PathLike) -> None:
    """[`opl_rank.data.LoggedData.to_csv`][opl_rank.data.LoggedData.to_csv]."""
    from opl_rank.io.atomic import atomic_write_text

    if data.item_features is not None:
        raise ValueError(
            "LoggedData.to_csv: CSV has no place for item_features; use to_parquet, "
            "or data.replace(item_features=None) to drop them"
        )
    frame = to_pandas(data)
    for name in frame.columns:
        frame[name] = [json.dumps(np.asarray(cell).tolist()) for cell in frame[name]]
    frame["n_items"] = int(data.n_items)
    frame["position_weight"] = json.dumps([float(v) for v in np.asarray(data.position_weight)])
    atomic_write_text(path, frame.to_csv(index=False))


def read_logged_data(
    path: str | os.PathLike, *, n_items: int | None = None, position_weight: Any = None, alpha: Any = None
) -> Any:
    """LoggedData from ``.parquet`` / ``.pq``, ``.csv`` or ``.npz`` (by the file's suffix).

    ``n_items`` / ``position_weight`` apply to Parquet and CSV (an ``.npz`` file holds both);
    ``alpha`` is its name before 0.2.0 (deprecated).
    """
    from opl_rank.data import LoggedData

    position_weight = renamed_position_weight(position_weight, alpha)
    shown = _exists(path, "logged data")
    suffix = os.path.splitext(shown)[1].lower()
    if suffix in (".parquet", ".pq"):
        return from_parquet(shown, n_items=n_items, position_weight=position_weight)
    if suffix == ".csv":
        return from_csv(shown, n_items=n_items, position_weight=position_weight)
    if suffix == ".npz":
        data = LoggedData.load(shown)
        if n_items is not None and n_items != data.n_items:
            raise ValueError(f"{shown}: n_items={n_items} contradicts the file's n_items={data.n_items}")
        if position_weight is not None and not _same(position_weight, data.position_weight):
            raise ValueError(
                f"{shown}: position_weight={_short(position_weight)} contradicts the file's position_weight "
                f"{_short(data.position_weight)}"
            )
        return data
    raise ValueError(f"{shown}: unknown format {suffix or '(no suffix)'!r}; expected .parquet, .csv or .npz")


# -- contexts to rank, and rankings out (opl-rank rank) ---------------------------------


def read_contexts(path: str | os.PathLike, *, n_items: int | None = None) -> tuple[Any, np.ndarray, np.ndarray | None]:
    """A table of contexts to rank: ``.parquet`` / ``.pq`` or ``.csv`` with a ``context``
    list column and optionally ``item_mask`` (``[D]`` booleans; ``n_items`` checks its width).

    Returns:
      ``(table, context [n, dx] float32, item_mask [n, D] bool or None)``; ``table`` is a
      pyarrow Table of the other columns (ids and the like, passed through to the output).
    """
    pa = _require("pyarrow", "reading contexts")
    shown = os.fspath(path)
    suffix = os.path.splitext(shown)[1].lower()
    if suffix in (".parquet", ".pq"):
        table, _ = read_table(shown)
        columns = {
            name: table.column(name).combine_chunks() for name in ("context", "item_mask") if name in table.column_names
        }
        note: Callable[[int], str] = lambda i: ""
    elif suffix == ".csv":
        pd = _require("pandas", "reading contexts")
        _exists(shown, "CSV")
        try:
            frame = pd.read_csv(shown, dtype=str, keep_default_na=False)
        except (ValueError, OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{shown}: not a readable CSV file ({type(err).__name__}: {err})") from err
        note = lambda i: f" (line {i + 2})"  # noqa: E731
        probe = _Columns({}, len(frame), shown, {}, note)
        columns = {
            name: _series_to_arrow(frame[name], name, probe)
            for name in ("context", "item_mask")
            if name in frame.columns
        }
        table = pa.Table.from_pandas(frame, preserve_index=False)
    else:
        raise ValueError(f"{shown}: unknown format {suffix or '(no suffix)'!r}; expected .parquet or .csv")
    cols = _Columns(columns, table.num_rows, shown, {}, note)
    if table.num_rows == 0:
        cols.fail(None, "has no rows")
    if "context" not in columns:
        cols.columns = {name: None for name in table.column_names}
        cols.missing("'context'")
    context = cols.matrix("context", "float").astype(np.float32)
    mask = None
    if "item_mask" in columns:
        mask = cols.matrix("item_mask", "bool", n_items, "" if n_items is None else f"n_items={n_items}, the policy's")
    rest = table.drop_columns([name for name in ("context",) if name in table.column_names])
    return rest, context, mask


def write_rankings(table: Any, path: str | os.PathLike, columns: dict[str, np.ndarray]) -> None:
    """``table`` plus the ``[n, ...]`` arrays ``columns`` (2-D ones as list columns) to a
    ``.parquet`` / ``.pq`` or ``.csv`` file (JSON list cells), atomically."""
    from opl_rank.io.atomic import atomic_write, atomic_write_text

    pa = _require("pyarrow", "writing rankings")
    shown = os.fspath(path)
    suffix = os.path.splitext(shown)[1].lower()
    if suffix not in (".parquet", ".pq", ".csv"):
        raise ValueError(f"{shown}: unknown format {suffix or '(no suffix)'!r}; expected .parquet or .csv")
    for name, values in columns.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, _list_array(pa, np.asarray(values)))
    if suffix == ".csv":
        frame = table.to_pandas()
        for name in columns:
            if np.asarray(columns[name]).ndim > 1:
                frame[name] = [json.dumps(np.asarray(cell).tolist()) for cell in frame[name]]
        atomic_write_text(shown, frame.to_csv(index=False))
        return
    pq = _require("pyarrow.parquet", "writing rankings")
    atomic_write(shown, lambda f: pq.write_table(table, f))
