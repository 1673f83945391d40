"""One run per output folder: a lock file that names its holder.

``folder_lock(folder)`` holds ``folder/.opl-rank.lock`` for the duration of a run. The
file says who holds it (pid, host, start time, command). A second run on the same folder
fails with a ``ValueError`` naming the holder. A lock left behind by a run that was killed
(its pid is gone) is taken over with a warning.

On POSIX the lock is an ``flock`` on the file (the kernel releases it when the holder
dies, however it dies); the pid check then only decides what to say. Elsewhere the file
is created exclusively and a holder is alive while its pid is.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["folder_lock", "LOCK_NAME", "describe_holder"]

LOCK_NAME = ".opl-rank.lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else fields[19]  # a zombie is dead
    except (OSError, IndexError):
        return None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the holder's process still runs (unknown hosts count as alive)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if os.path.exists("/proc/self/stat"):
        started = _process_start(pid)
        return started is not None and started == holder.get("proc_start", started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_holder(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')}"


def _me() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "proc_start": _process_start(os.getpid()),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:500],
    }


def _parse(text: str) -> dict[str, Any] | None:
    try:
        holder = json.loads(text)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _read_fd(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _held_error(folder: str, path: str, holder: dict[str, Any] | None) -> ValueError:
    who = describe_holder(holder) if holder else "another process (its lock file is being written)"
    return ValueError(
        f"output folder {folder} is in use by {who}: one run per folder. Wait for it to finish, "
        f"or use another output_dir (if that process is gone, delete {path})"
    )


@contextlib.contextmanager
def folder_lock(folder: str, *, echo: Callable[[str], None] = print) -> Iterator[dict[str, Any]]:
    """Hold ``folder``'s lock (creating the folder) while the block runs; yields our holder record."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    me = _me()
    if fcntl is None:  # pragma: no cover - Windows
        yield from _exclusive_file_lock(folder, path, me, echo)
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _parse(_read_fd(fd))
            os.close(fd)
            raise _held_error(folder, path, holder) from None
        try:  # a holder unlinks the file when it finishes: make sure we locked the current one
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        previous = _read_fd(fd)
        if previous.strip():
            holder = _parse(previous)
            if (
                holder is not None
                and holder.get("host") == me["host"]
                and _alive(holder)
                and holder.get("pid") != me["pid"]
            ):
                # the kernel says nobody holds it, yet its process runs: a file system without flock
                raise _held_error(folder, path, holder)
            what = describe_holder(holder) if holder else "an unreadable holder"
            echo(f"warning: taking over the stale lock of {what} in {folder}: that run was killed or crashed")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode("utf-8"))
        os.fsync(fd)
        yield me
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # still holding the flock: nobody can lock this file in between
        os.close(fd)


def _exclusive_file_lock(folder, path, me, echo):  # pragma: no cover - Windows
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-lock-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(me))
    try:
        for _ in range(2):
            try:
                os.link(tmp, path)
                break
            except FileExistsError:
                try:
                    with open(path, encoding="utf-8") as f:
                        holder = _parse(f.read())
                except FileNotFoundError:
                    continue
                if holder is not None and _alive(holder):
                    raise _held_error(folder, path, holder) from None
                echo(f"warning: taking over the stale lock of {describe_holder(holder or {})} in {folder}")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        else:
            raise _held_error(folder, path, None)
    finally:
        os.unlink(tmp)
    try:
        yield me
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
