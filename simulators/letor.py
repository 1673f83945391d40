"""Load LETOR / SVMlight learning-to-rank files into padded per-query NumPy arrays.

A LETOR file has one document per line, ``<label> qid:<N> <idx>:<val> ... [# comment]``,
with 1-based, strictly increasing feature indices (absent features are 0). Documents are
grouped by ``qid`` into ``[Q, Dmax, ...]`` arrays padded with zeros plus a boolean mask.

Parsing of the feature tokens is done by scikit-learn's ``load_svmlight_file`` (imported
lazily, so ``import simulators`` does not need scikit-learn). What scikit-learn 1.9 does
with malformed input, and how it is handled here:

* a line without ``qid:`` -- sklearn silently skips its qid, so the qid array comes back
  shorter than the label array and misaligned. Query ids are therefore read by our own
  linear pre-pass (``_read_labels_and_qids``), which reports the line. (It also avoids
  sklearn's ``query_id=True`` path, which appends with ``np.append`` per line and is
  quadratic: 3.2 s for 100k lines versus 0.26 s without query ids.)
* a non-numeric label or a non-integer qid -- sklearn raises a ``ValueError`` without a
  line number; the pre-pass reports the line.
* a malformed ``idx:val`` token (no colon, non-integer index, non-numeric or empty value),
  index 0 or negative, unsorted/duplicate indices, an index above ``n_features`` -- sklearn
  raises a ``ValueError`` (an ``OverflowError`` for indices beyond int32) without the line;
  only then is the file re-scanned token by token (``_locate_feature_error``) to name it.
* ``nan`` / ``inf`` labels or values -- sklearn accepts them silently; they are rejected
  here (vectorised check, line located from the recorded line numbers). The file is parsed
  in float64 so that finite values beyond float32's range (``1e39``), which would become
  ``inf`` in the float32 arrays, are rejected the same way, naming their line.
* a huge feature index (``2000000:1`` in a 4 KB file) -- sklearn's result is sparse (CSR),
  but the padded ``[Q, Dmax, F]`` array is dense; its size is checked against
  ``max_dense_bytes`` before it is allocated, and the error names the line that set the
  width and the size it would need.
* an empty file, or one with only comments and blank lines -- sklearn returns 0 rows; it
  is rejected here.

Speed (measured on 17 MB copies of the shared Yahoo and MSLR samples, one core): the qid
pre-pass runs at about 350-400 MB/s, sklearn's parser at about 13-15 MB/s, and the
failure-only token scan also at about 13-15 MB/s (about 7 s for a 100 MB file).
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["LetorData", "file_sha256", "load_letor", "normalize_per_query", "split_queries", "take_queries"]

_NORMALIZE_METHODS = ("minmax", "zscore")
_INT32_MAX = 2**31 - 1  # sklearn stores feature indices in a C int
_FLOAT32_MAX = float(np.finfo(np.float32).max)
DEFAULT_MAX_DENSE_BYTES = 2 * 1024**3  # 2 GiB for the padded arrays


class LetorData(NamedTuple):
    """Padded per-query learning-to-rank data.

    Attributes:
      features: ``[Q, Dmax, F]`` float32 document features, zeros at padding.
      labels: ``[Q, Dmax]`` float32 graded relevance, 0 at padding.
      mask: ``[Q, Dmax]`` bool, True for real documents (a prefix of each row).
      qids: ``[Q]`` int64 query ids, in order of first appearance in the file.
      n_features: F, the feature width (feature index ``i`` in the file is column ``i - 1``).
      path: the file the data was read from.
    """

    features: np.ndarray
    labels: np.ndarray
    mask: np.ndarray
    qids: np.ndarray
    n_features: int
    path: str


def _open_binary(path: str):
    """Opens ``path`` for binary reading the way sklearn does (``.gz``/``.bz2`` decompressed)."""
    ext = os.path.splitext(path)[1]
    if ext == ".gz":
        import gzip

        return gzip.open(path, "rb")
    if ext == ".bz2":
        import bz2

        return bz2.BZ2File(path, "rb")
    return open(path, "rb")


def _data_lines(f):
    """Yields ``(lineno, line)`` (1-based) for non-empty lines with the ``#`` comment cut off.

    Same line semantics as sklearn's parser: split on ``\\n``, cut at the first ``#``, skip
    lines that are then only whitespace.
    """
    for lineno, line in enumerate(f, 1):
        cut = line.find(b"#")
        if cut >= 0:
            line = line[:cut]
        if line.strip():
            yield lineno, line


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _located(path: str, lineno: int, reason: str) -> ValueError:
    return ValueError(f"{path}, line {lineno}: {reason}")


def _read_labels_and_qids(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Linear pre-pass: the qid and 1-based line number of every data line.

    Checks only the first two tokens (label parses as a number, second token is
    ``qid:<int>``); feature tokens are left to sklearn. About 350-400 MB/s.

    Returns:
      qids: ``[N]`` int64; linenos: ``[N]`` int64.
    """
    qids = array("q")
    linenos = array("q")
    with _open_binary(path) as f:
        for lineno, line in _data_lines(f):
            parts = line.split(None, 2)
            try:
                float(parts[0])
            except ValueError:
                raise _located(path, lineno, f"label {parts[0]!r} is not a number") from None
            if len(parts) < 2 or not parts[1].startswith(b"qid:"):
                raise _located(path, lineno, "missing 'qid:<N>' as the second token")
            try:
                qid = int(parts[1][4:])
            except ValueError:
                raise _located(path, lineno, f"query id {parts[1]!r} is not an integer") from None
            if not -(2**63) <= qid < 2**63:
                raise _located(path, lineno, f"query id {parts[1]!r} does not fit in int64")
            qids.append(qid)
            linenos.append(lineno)
    return np.frombuffer(qids, np.int64).copy(), np.frombuffer(linenos, np.int64).copy()


def _locate_feature_error(path: str, n_features: int | None) -> tuple[int, str] | None:
    """Failure-only scan of the feature tokens; the first bad line and why, or None.

    Same rules as sklearn with ``zero_based=False``; about 13-15 MB/s.
    """
    with _open_binary(path) as f:
        for lineno, line in _data_lines(f):
            prev = 0
            for tok in line.split()[2:]:  # label and qid were checked by the pre-pass
                idx_s, colon, val_s = tok.partition(b":")
                if not colon:
                    return lineno, f"malformed feature token {tok!r} (expected <idx>:<value>)"
                try:
                    idx = int(idx_s)
                except ValueError:
                    return lineno, f"feature index in {tok!r} is not an integer"
                try:
                    float(val_s)
                except ValueError:
                    return lineno, f"feature value in {tok!r} is not a number"
                if idx < 1:
                    return lineno, f"feature index {idx} < 1 (LETOR indices are 1-based)"
                if idx > _INT32_MAX:
                    return lineno, f"feature index {idx} is too large"
                if idx <= prev:
                    return lineno, f"feature indices must be strictly increasing ({prev} then {idx})"
                if n_features is not None and idx > n_features:
                    return lineno, f"feature index {idx} exceeds n_features={n_features}"
                prev = idx
    return None


def _check_positive_int(name: str, value, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def load_letor(
    path: str | os.PathLike,
    *,
    n_features: int | None = None,
    max_docs: int | None = None,
    normalize: str | None = None,
    min_docs: int = 1,
    max_dense_bytes: int = DEFAULT_MAX_DENSE_BYTES,
    sha256: str | None = None,
) -> LetorData:
    """Reads a LETOR/SVMlight ranking file into padded per-query arrays.

    Documents are grouped by qid whether or not each query's lines are contiguous;
    queries are ordered by first appearance and documents keep their file order within a
    query. (So two different queries that share a qid, e.g. in concatenated files, merge.)
    Feature indices are 1-based (index ``i`` is column ``i - 1``); index 0 is an error.
    Plain, ``.gz`` and ``.bz2`` files are read.

    Args:
      path: the file.
      n_features: feature width F; indices above it are an error. None: the largest
        index in the file (pass it to get the same width for train/test files).
      max_docs: keep at most this many documents per query, the first ones in file
        order (later ones are dropped), so ``Dmax <= max_docs``. None: keep all.
      normalize: None, ``"minmax"`` or ``"zscore"``: per-query feature normalization,
        see [`normalize_per_query`][normalize_per_query] (applied after ``max_docs`` truncation).
      min_docs: drop queries with fewer documents than this (counted before truncation).
      max_dense_bytes: memory budget for the padded arrays (``features`` float32
        ``[Q, Dmax, F]`` plus ``labels`` and ``mask``), default 2 GiB. The file is parsed
        sparse; if the dense arrays would exceed this, a ``ValueError`` names the line
        that set the width F (or the first line of the longest query when ``n_features``
        is given) and the size needed, before anything that large is allocated.
        (``normalize`` needs a few float64 temporaries of the same shape on top.)
      sha256: the file's expected SHA-256 (hex), checked before parsing, e.g. the one
        recorded for a downloaded MSLR-WEB10K / Yahoo! C14 / Istella file (see
        docs/datasets.md). None: not checked.

    Returns:
      A [`LetorData`][LetorData] with ``features [Q, Dmax, F]``, ``labels [Q, Dmax]``,
      ``mask [Q, Dmax]`` and ``qids [Q]``; Dmax is the longest kept query (after
      truncation).

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: ``path`` is a directory; a malformed line (the message names the file
        and the 1-based line number), non-finite labels or values or ones beyond float32's
        range, an empty file, no query left after ``min_docs``, or dense arrays larger
        than ``max_dense_bytes``, or a checksum that is not ``sha256``.
    """
    path = os.fspath(path)
    n_features = _check_positive_int("n_features", n_features, allow_none=True)
    max_docs = _check_positive_int("max_docs", max_docs, allow_none=True)
    min_docs = _check_positive_int("min_docs", min_docs, allow_none=False)
    max_dense_bytes = _check_positive_int("max_dense_bytes", max_dense_bytes, allow_none=False)
    if normalize is not None and normalize not in _NORMALIZE_METHODS:
        raise ValueError(f"normalize must be None or one of {_NORMALIZE_METHODS}, got {normalize!r}")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a LETOR/SVMlight file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"LETOR file not found: {path}")

    if sha256 is not None:
        actual = file_sha256(path)
        if actual != str(sha256).lower():
            raise ValueError(f"{path}: sha256 is {actual}, expected {sha256} (a different, changed or truncated file)")

    qids_per_doc, linenos = _read_labels_and_qids(path)
    if qids_per_doc.size == 0:
        raise ValueError(f"{path}: no data lines (the file is empty or has only comments/blank lines)")

    from sklearn.datasets import load_svmlight_file

    try:
        x, y = load_svmlight_file(path, n_features=n_features, dtype=np.float64, zero_based=False, query_id=False)
    except (ValueError, OverflowError) as err:
        found = _locate_feature_error(path, n_features)
        if found is None:
            raise ValueError(f"{path}: {err}") from err
        raise _located(path, *found) from err
    if y.shape[0] != qids_per_doc.shape[0]:  # same line rules on both sides; cannot happen
        raise RuntimeError(f"{path}: {y.shape[0]} labels but {qids_per_doc.shape[0]} qids")

    # Checked in float64, before the cast: a finite value beyond float32 would become inf.
    y = np.asarray(y, np.float64)
    bad = np.flatnonzero(~np.isfinite(y) | (np.abs(y) > _FLOAT32_MAX))
    if bad.size:
        raise _located(path, int(linenos[bad[0]]), f"label {y[bad[0]]} is not finite{_beyond_float32(y[bad[0]])}")
    x = x.tocsr()
    bad = np.flatnonzero(~np.isfinite(x.data) | (np.abs(x.data) > _FLOAT32_MAX))
    if bad.size:
        row = int(np.searchsorted(x.indptr, bad[0], side="right")) - 1
        col = int(x.indices[bad[0]])
        value = x.data[bad[0]]
        raise _located(
            path, int(linenos[row]), f"feature {col + 1} value {value} is not finite{_beyond_float32(value)}"
        )

    # Group by qid (first-appearance order) and find each document's slot in its query.
    n_docs = qids_per_doc.shape[0]
    _, first, inverse = np.unique(qids_per_doc, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    rank = np.empty(first.shape[0], np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    group = rank[inverse]  # [N] query index in first-appearance order
    counts = np.bincount(group, minlength=first.shape[0])
    order = np.argsort(group, kind="stable")
    starts = np.cumsum(counts) - counts
    slot = np.empty(n_docs, np.int64)
    slot[order] = np.arange(n_docs) - starts[group[order]]

    keep_query = counts >= min_docs
    if not keep_query.any():
        raise ValueError(f"{path}: no query has min_docs={min_docs} or more documents")
    new_index = np.cumsum(keep_query) - 1  # [G] index among kept queries
    keep_doc = keep_query[group]
    if max_docs is not None:
        keep_doc &= slot < max_docs
    kept_counts = counts[keep_query]
    d_max = int(kept_counts.max() if max_docs is None else min(kept_counts.max(), max_docs))
    n_q = int(keep_query.sum())
    width = int(x.shape[1])
    _check_dense_size(path, x, linenos, n_features, n_q, d_max, width, max_dense_bytes, group, keep_query, counts)

    rows = np.flatnonzero(keep_doc)
    q_of, d_of = new_index[group[rows]], slot[rows]
    labels = np.zeros((n_q, d_max), np.float32)
    mask = np.zeros((n_q, d_max), bool)
    labels[q_of, d_of] = y[rows]
    mask[q_of, d_of] = True
    coo = x.tocoo()
    entry_rows = np.asarray(coo.row, np.int64)
    sel = keep_doc[entry_rows]
    entry_rows = entry_rows[sel]
    features = np.zeros((n_q, d_max, width), np.float32)
    features[new_index[group[entry_rows]], slot[entry_rows], np.asarray(coo.col)[sel]] = coo.data[sel].astype(
        np.float32
    )

    if normalize is not None:
        features = normalize_per_query(features, mask, method=normalize)
    qids = qids_per_doc[np.sort(first)][keep_query]  # both in first-appearance order
    return LetorData(features, labels, mask, qids, width, path)


def _beyond_float32(value: float) -> str:
    if np.isfinite(value):
        return f" in float32 (|value| > {_FLOAT32_MAX:.4g}, float32's largest)"
    return ""


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 1024**3:.3g} GiB"


def _check_dense_size(
    path, x, linenos, n_features, n_q, d_max, width, max_dense_bytes, group, keep_query, counts
) -> None:
    """Raises before allocating padded arrays larger than ``max_dense_bytes``."""
    need = n_q * d_max * (4 * width + 4 + 1)  # features float32, labels float32, mask bool
    if need <= max_dense_bytes:
        return
    shape = f"features [Q, Dmax, F] = [{n_q}, {d_max}, {width}] float32 plus labels and mask"
    if n_features is None and x.nnz:
        entry = int(np.argmax(x.indices))  # first entry holding the largest index
        row = int(np.searchsorted(x.indptr, entry, side="right")) - 1
        where = f"line {int(linenos[row])}: feature index {width} sets the width F={width}"
    else:
        big = int(np.flatnonzero(keep_query)[np.argmax(counts[keep_query])])  # longest kept query
        row = int(np.flatnonzero(group == big)[0])
        where = (
            f"line {int(linenos[row])}: the longest query ({int(counts[big])} documents) starts here, "
            f"with width F={width}"
        )
    raise ValueError(
        f"{path}, {where}; the dense {shape} would need {_gib(need)} ({need} bytes), above "
        f"max_dense_bytes={max_dense_bytes} ({_gib(max_dense_bytes)}). Check that line, pass "
        f"max_docs to cap Dmax, or raise max_dense_bytes."
    )


def normalize_per_query(features: np.ndarray, mask: np.ndarray, method: str = "minmax") -> np.ndarray:
    """Normalizes each feature within each query over its real documents.

    ``"minmax"`` maps each (query, feature) to [0, 1] as ``(x - min) / (max - min)``;
    ``"zscore"`` maps it to ``(x - mean) / std`` (population std). A feature that is
    constant within a query (including single-document queries) becomes 0. Statistics
    are computed in float64.

    Args:
      features: ``[Q, D, F]`` float features.
      mask: ``[Q, D]`` bool, True for real documents.
      method: ``"minmax"`` or ``"zscore"``.

    Returns:
      ``[Q, D, F]`` float32 normalized features, 0 at padded positions.
    """
    if method not in _NORMALIZE_METHODS:
        raise ValueError(f"method must be one of {_NORMALIZE_METHODS}, got {method!r}")
    x = np.asarray(features, np.float64)
    m = np.asarray(mask, bool)
    if x.ndim != 3 or m.shape != x.shape[:2]:
        raise ValueError(f"need features [Q, D, F] and mask [Q, D], got {x.shape} and {m.shape}")
    m3 = m[:, :, None]
    lo = np.where(m3, x, np.inf).min(axis=1, keepdims=True)  # [Q, 1, F]
    hi = np.where(m3, x, -np.inf).max(axis=1, keepdims=True)
    varies = hi > lo  # False for constant features and for queries with no documents
    if method == "minmax":
        centre, scale = lo, hi - lo
    else:
        n = np.maximum(m.sum(axis=1), 1)[:, None, None].astype(np.float64)
        centre = np.where(m3, x, 0.0).sum(axis=1, keepdims=True) / n
        scale = np.sqrt((np.where(m3, x - centre, 0.0) ** 2).sum(axis=1, keepdims=True) / n)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        out = (x - centre) / np.where(varies, scale, 1.0)
    return np.where(m3 & varies, out, 0.0).astype(np.float32)


def take_queries(data: LetorData, idx: np.ndarray) -> LetorData:
    """Selects queries (rows) of a [`LetorData`][LetorData], keeping Dmax and F unchanged.

    Args:
      data: the data set.
      idx: ``[K]`` integer query positions (not qids), or a ``[Q]`` bool mask.

    Returns:
      A [`LetorData`][LetorData] with ``K`` queries in the order given.
    """
    idx = np.asarray(idx)
    n_q = data.qids.shape[0]
    if idx.dtype == bool:
        if idx.shape != (n_q,):
            raise ValueError(f"a bool idx must have shape ({n_q},), got {idx.shape}")
        idx = np.flatnonzero(idx)
    elif idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
        raise ValueError(f"idx must be a 1-D integer array or a bool mask, got {idx.dtype} {idx.shape}")
    idx = idx.astype(np.int64)
    return data._replace(
        features=data.features[idx],
        labels=data.labels[idx],
        mask=data.mask[idx],
        qids=data.qids[idx],
    )


def split_queries(data: LetorData, fractions: Sequence[float] = (0.8, 0.2), *, seed: int = 0) -> tuple[LetorData, ...]:
    """Randomly partitions the queries into parts of the given fractions.

    Every query lands in exactly one part; part sizes are the rounded cumulative
    fractions of Q (so they sum to Q). Within a part, queries keep their order in
    ``data``. The same ``seed`` gives the same split (NumPy ``default_rng(seed)``).

    Args:
      data: the data set (Q queries).
      fractions: positive fractions summing to 1, one per part.
      seed: an int seed.

    Returns:
      A tuple of [`LetorData`][LetorData], one per fraction, each with the same Dmax and F.
    """
    seed = operator.index(seed)
    fr = np.asarray(fractions, np.float64)
    if fr.ndim != 1 or fr.size == 0 or not np.all(np.isfinite(fr)) or np.any(fr <= 0):
        raise ValueError(f"fractions must be a non-empty sequence of positive numbers, got {fractions!r}")
    if not math.isclose(float(fr.sum()), 1.0, abs_tol=1e-6):
        raise ValueError(f"fractions must sum to 1, got {fractions!r} (sum {fr.sum()})")
    n_q = data.qids.shape[0]
    perm = np.random.default_rng(seed).permutation(n_q)
    bounds = np.round(np.cumsum(fr)[:-1] * n_q).astype(np.int64)
    return tuple(take_queries(data, np.sort(part)) for part in np.split(perm, bounds))
