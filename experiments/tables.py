"""The tidy-table writer shared by every experiment: ``results.csv`` and ``results.parquet``.

One row per dict; the columns are the union of the rows' keys in first-seen order (a row
without a key gets an empty field). ``results.csv`` is written with the csv module (values
with commas or quotes are quoted; ``None`` is empty), ``results.parquet`` with pandas and
pyarrow when both are installed. Both are written atomically; a ``results.parquet`` that
could not be rewritten is removed, so it never disagrees with ``results.csv``.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from typing import Any

from opl_rank.io.atomic import atomic_write, atomic_write_text

__all__ = ["columns_of", "write_csv", "write_parquet", "write_tables"]


def columns_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The union of the rows' keys, in first-seen order."""
    return list(dict.fromkeys(c for r in rows for c in r))


def write_csv(path: str, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
    """``rows`` as CSV at ``path`` (atomically)."""
    columns = columns_of(rows) if columns is None else list(columns)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow(["" if r.get(c) is None else r[c] for c in columns])
    atomic_write_text(path, buffer.getvalue())


def write_parquet(
    path: str,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    int_columns: Sequence[str] = (),
    echo: Callable[[str], None] = print,
) -> bool:
    """``rows`` as Parquet at ``path`` (atomically) when pandas and pyarrow are installed;
    ``int_columns`` become nullable integers. Returns whether it was written."""
    try:
        import pandas as pd
        import pyarrow  # noqa: F401
    except ImportError:
        echo(f"{os.path.basename(path)} skipped: needs pandas and pyarrow (pip install pandas pyarrow)")
        if os.path.exists(path):
            os.unlink(path)  # an older one would not match results.csv
        return False
    columns = columns_of(rows) if columns is None else list(columns)
    frame = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    for name in int_columns:
        if name in frame:
            frame[name] = frame[name].astype("Int64")  # integers with missing values
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write(path, lambda f: f.write(buffer.getvalue()))
    return True


def write_tables(
    folder: str, rows: Sequence[dict[str, Any]], *, int_columns: Sequence[str] = (), echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """``folder/results.csv`` and ``folder/results.parquet``; returns their paths (parquet: None when skipped)."""
    columns = columns_of(rows)
    csv_path = os.path.join(folder, "results.csv")
    write_csv(csv_path, rows, columns)
    parquet_path = os.path.join(folder, "results.parquet")
    written = write_parquet(parquet_path, rows, columns, int_columns=int_columns, echo=echo)
    return {"results": csv_path, "parquet": parquet_path if written else None}
