"""Resumable output folders: which config a folder holds, and cell files that prove it.

An experiment writes each finished cell as ``cells/<name>.json``::

    {"format": 2, "config_hash": "<sha256>", "opl_rank_version": "0.2.0", "cell": {...}, "rows": [...]}

``config_hash`` is the SHA-256 of the resolved config (every key that can change a row;
not the output folder or how the run is executed; a key set to None counts as absent). On resume a cell is reused only when
its file parses, its hash is the run's, and its rows pass the experiment's check (columns,
row count, the cell they belong to); any other file is named, with the reason, and
recomputed. A cell written by another opl_rank version raises [`StaleCell`][StaleCell]: the
experiment decides (the OPL sweep refuses to resume unless told to recompute). [`open_run_folder`][open_run_folder] locks the folder and refuses a config that differs
from the folder's ``config.yaml`` (naming the keys), or, with ``new_config``, moves to a
fresh ``config-<hash8>/`` subfolder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import yaml

from experiments.folder_lock import folder_lock
from opl_rank.io.atomic import atomic_write_text

__all__ = [
    "CELL_FORMAT",
    "BadCell",
    "StaleCell",
    "config_hash",
    "write_cell",
    "read_cell",
    "open_run_folder",
    "RunFolder",
    "opl_rank_version",
]

CELL_FORMAT = 2  # 1: a bare JSON list of rows (before config hashes)


class BadCell(Exception):
    """A cell file that cannot be reused; ``str`` names the file and the reason."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class StaleCell(BadCell):
    """A cell file of this config written by another opl_rank version (``version``)."""

    def __init__(self, path: str, version: str):
        super().__init__(path, f"written by opl_rank {version}, this is {opl_rank_version()}")
        self.version = version


def opl_rank_version() -> str:
    import opl_rank

    return opl_rank.__version__


def _canonical(value: Any) -> Any:
    """Tuples as lists, so a config compares equal to its YAML round trip."""
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    return value


def _hashed(config: dict[str, Any], exclude: Sequence[str]) -> dict[str, Any]:
    # A key set to None counts as absent, so a new optional config key (default None) does
    # not change the hash of, or refuse, a folder written before the key existed.
    return {k: _canonical(v) for k, v in config.items() if k not in exclude and v is not None}


def config_hash(config: dict[str, Any], exclude: Sequence[str] = ("output_dir",)) -> str:
    """SHA-256 (hex) of ``config`` without the ``exclude`` keys, independent of key order."""
    text = json.dumps(_hashed(config, exclude), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_cell(path: str, *, cell: dict[str, Any], rows: list[dict[str, Any]], config_hash: str) -> None:
    """Write a cell file atomically (see the module docstring for its format)."""
    record = {
        "format": CELL_FORMAT,
        "config_hash": config_hash,
        "opl_rank_version": opl_rank_version(),
        "cell": cell,
        "rows": rows,
    }
    atomic_write_text(path, json.dumps(record))


def read_cell(
    path: str,
    *,
    config_hash: str,
    cell: dict[str, Any],
    check_rows: Callable[[Any], str | None],
    any_version: bool = False,
) -> list[dict[str, Any]]:
    """The rows of a cell file, or [`BadCell`][BadCell] saying why they cannot be reused
    ([`StaleCell`][StaleCell] for another opl_rank version's file, unless ``any_version``)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise BadCell(path, f"unreadable ({err})") from err
    try:
        record = json.loads(text)
    except ValueError as err:
        what = "empty" if not text.strip() else "truncated or not JSON"
        raise BadCell(path, f"{what} ({err})") from err
    if isinstance(record, list):
        raise BadCell(path, "written before cell files recorded their config (no config hash)")
    if not isinstance(record, dict) or record.get("format") != CELL_FORMAT:
        raise BadCell(path, f"not a cell file of format {CELL_FORMAT}")
    if record.get("config_hash") != config_hash:
        raise BadCell(
            path, f"written by another config (hash {str(record.get('config_hash'))[:8]}, this run's {config_hash[:8]})"
        )
    if _canonical(record.get("cell")) != _canonical(cell):
        raise BadCell(path, f"holds cell {record.get('cell')}, expected {cell}")
    problem = check_rows(record.get("rows"))
    if problem:
        raise BadCell(path, problem)
    version = str(record.get("opl_rank_version", "(unknown)"))
    if version != opl_rank_version() and not any_version:
        raise StaleCell(path, version)
    return record["rows"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _differences(stored: dict[str, Any], config: dict[str, Any], exclude: Sequence[str]) -> list[str]:
    a, b = _hashed(stored, exclude), _hashed(config, exclude)
    out = []
    for key in list(dict.fromkeys([*b, *a])):
        if key not in a:
            out.append(f"{key}: (absent) -> {_short(b[key])}")
        elif key not in b:
            out.append(f"{key}: {_short(a[key])} -> (absent)")
        elif json.dumps(a[key], sort_keys=True) != json.dumps(b[key], sort_keys=True):
            out.append(f"{key}: {_short(a[key])} -> {_short(b[key])}")
    return out


def _stored_config(folder: str) -> dict[str, Any] | None:
    path = os.path.join(folder, "config.yaml")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            stored = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is unreadable ({err}): move it away, or use another output_dir") from err
    if not isinstance(stored, dict):
        raise ValueError(f"{path} is not a config mapping: move it away, or use another output_dir")
    return stored


def _has_cells(folder: str) -> bool:
    cells = os.path.join(folder, "cells")
    return os.path.isdir(cells) and any(
        name.endswith(".json") and not name.startswith(".tmp-") for name in os.listdir(cells)
    )


def _started_but_empty(folder: str) -> bool:
    """The folder of a run like this one (it has ``cells/``) that finished no cell and wrote
    no table: its config.yaml protects nothing. Another tool's folder (no ``cells/``) or one
    whose cells were deleted after its tables were written is not."""
    written = ("results.csv", "results.parquet", "report.md", "history.csv")
    return (
        os.path.isdir(os.path.join(folder, "cells"))
        and not _has_cells(folder)
        and not any(os.path.exists(os.path.join(folder, name)) for name in written)
    )


def _remove_partial_writes(cells: str) -> None:
    """Temporary files of an atomic write that a killed run left (the lock is held: no
    writer of this folder is alive)."""
    for name in os.listdir(cells):
        if name.startswith(".tmp-"):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(cells, name))


class RunFolder:
    """The folder a run writes to, its config hash, and its cell files."""

    def __init__(self, path: str, config_hash: str):
        self.path, self.config_hash = path, config_hash

    def cell_path(self, name: str) -> str:
        return os.path.join(self.path, "cells", name + ".json")

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)


@contextlib.contextmanager
def open_run_folder(
    output_dir: str,
    config: dict[str, Any],
    *,
    new_config: bool = False,
    echo: Callable[[str], None] = print,
    exclude: Sequence[str] = ("output_dir",),
    grid: Sequence[str] = (),
) -> Iterator[RunFolder]:
    """Lock the run's folder, check and write its ``config.yaml``, and yield it.

    The folder is ``output_dir``, unless its ``config.yaml`` holds a different config: then a
    ``ValueError`` naming the differing keys, or with ``new_config`` the subfolder
    ``output_dir/config-<hash8>`` (said through ``echo``). Runs before any work.

    ``grid`` names the keys that only choose which cells exist (each cell file records its
    own coordinates): they are left out of the hash, and a rerun that changes them (more
    seeds, another lambda) reuses the cells it shares with the folder and rewrites
    ``config.yaml`` to the new grid.
    """
    exclude = tuple(exclude) + tuple(grid)
    digest = config_hash(config, exclude)
    sub = os.path.join(output_dir, f"config-{digest[:8]}")
    with contextlib.ExitStack() as stack:
        folder = output_dir
        stack.enter_context(folder_lock(folder, echo=echo))
        stored = _stored_config(folder)
        diff = _differences(stored, config, exclude) if stored is not None else []
        if diff and _started_but_empty(folder):  # a run that stopped before its first cell: nothing to protect
            echo(f"{folder}: its config.yaml is of an earlier run that finished no cell; this run replaces it")
            stored, diff = None, []
        if diff:
            if not new_config:
                raise ValueError(
                    f"{output_dir} holds results of a different config; config.yaml differs in "
                    f"{'; '.join(diff)}. Use another output_dir, or --new-config to write to {sub}"
                )
            stack.close()  # release output_dir: this run works in its subfolder
            folder = sub
            stack.enter_context(folder_lock(folder, echo=echo))
            stored = _stored_config(folder)
            if stored is not None and _differences(stored, config, exclude):
                raise ValueError(f"{folder} holds yet another config; use another output_dir")
            echo(
                f"--new-config: {output_dir} holds a different config ({', '.join(d.split(':')[0] for d in diff)} "
                f"differ); this run writes to {folder}"
            )
        if stored is not None and grid:
            changed = [
                d.split(":")[0] for d in _differences(stored, config, tuple(exclude[: len(exclude) - len(grid)]))
            ]
            if changed:
                echo(f"{folder}: grid changed ({', '.join(changed)}); cells it shares with the previous run are reused")
        os.makedirs(os.path.join(folder, "cells"), exist_ok=True)
        _remove_partial_writes(os.path.join(folder, "cells"))
        written = dict(config)
        if "output_dir" in written:
            written["output_dir"] = folder
        atomic_write_text(os.path.join(folder, "config.yaml"), yaml.safe_dump(_canonical(written), sort_keys=False))
        yield RunFolder(folder, digest)
