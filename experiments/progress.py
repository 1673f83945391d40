"""Console output of long jobs: progress bars (tqdm, on stderr) and noise filters.

Every long ``opl-rank`` job (sweep cells and the fits inside a cell, pairwise and LTR
training, simulation, ``fit``) shows a bar; ``--quiet`` turns the bars off (results, per-cell
lines and errors are still printed). Library functions take ``progress=False`` by default.

On a terminal a bar redraws in place at least once a second, so its elapsed time moves even
while one long step (a compilation, a ground truth) runs. Elsewhere (CI logs, a file) a bar
prints one plain line at most every [`LOG_INTERVAL`][LOG_INTERVAL] seconds, and also when nothing moved
for that long: no job is silent for longer than that.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["bar", "Steps", "write", "echo_to", "silence_noise", "LOG_INTERVAL"]

LOG_INTERVAL = 10.0  # seconds between lines of a bar written to a log (not a terminal)
_TTY_INTERVAL = 1.0  # seconds between redraws on a terminal while nothing moves
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _isatty(stream: Any) -> bool:
    """A terminal with a width (a pseudo-terminal of 0 columns would hide every bar)."""
    try:
        return bool(stream.isatty()) and os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):
        return False


class _Lines:
    """A file for tqdm that turns its in-place redraws into whole lines (for logs)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.last = time.monotonic()

    def write(self, text: str) -> None:
        text = _ESCAPES.sub("", str(text)).replace("\r", "\n")
        lines = [line.rstrip() for line in text.split("\n") if line.strip()]
        if lines:
            self.stream.write(lines[-1] + "\n")
            self.last = time.monotonic()

    def flush(self) -> None:
        getattr(self.stream, "flush", lambda: None)()


class _Bar(tqdm):
    """A tqdm bar redrawn by a daemon thread while it is open (a heartbeat)."""

    def __init__(self, *args: Any, heartbeat: float | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._stop = threading.Event()
        self._beat = None
        if heartbeat and not self.disable:
            self._beat = threading.Thread(target=self._pulse, args=(heartbeat,), name="opl-rank-progress", daemon=True)
            self._beat.start()

    def _pulse(self, interval: float) -> None:
        lines = self.fp if isinstance(self.fp, _Lines) else getattr(self.fp, "_wrapped", None)
        while not self._stop.wait(interval / 4 if isinstance(lines, _Lines) else interval):
            if isinstance(lines, _Lines) and time.monotonic() - lines.last < interval:
                continue
            try:
                self.refresh()
            except Exception:  # a closed stream: stop drawing, never fail the job
                return

    def close(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            if self._beat is not None and self._beat is not threading.current_thread():
                self._beat.join()
        super().close()


def bar(
    total: int | None = None,
    *,
    desc: str = "",
    unit: str = "it",
    enabled: bool = True,
    leave: bool = False,
    stream: TextIO | None = None,
) -> tqdm:
    """A progress bar on ``stream`` (default: stderr); a no-op object when not ``enabled``.

    Use it as a context manager (``with bar(...) as b: b.update()``); ``b.set_postfix_str``
    names the current step. On a terminal it redraws in place; elsewhere it writes a line at
    most every [`LOG_INTERVAL`][LOG_INTERVAL] seconds (and when nothing moved for that long).
    """
    if not enabled:
        return tqdm(total=total, disable=True)
    stream = sys.stderr if stream is None else stream
    common = dict(total=total, desc=desc, unit=unit, leave=leave, dynamic_ncols=True)
    if _isatty(stream):
        return _Bar(file=stream, mininterval=0.2, heartbeat=_TTY_INTERVAL, **common)
    # A log: plain lines, every bar at position 0 (no cursor movement between bars), and no
    # line for a bar that is done before it is first drawn.
    return _Bar(
        file=_Lines(stream),
        mininterval=LOG_INTERVAL,
        heartbeat=LOG_INTERVAL,
        position=0,
        ascii=True,
        ncols=100,
        delay=0.5,
        **common,
    )


#: Observers of every cell group's steps, for timing (``benchmarks/bench_main_job.py``): each is
#: called on the running thread with a step's label as it starts, and with None when the group's
#: last step is done. A hook instead of wrapping the sweep's functions, which would turn the
#: program cache off (``opl_rank.program_cache``: library functions replaced by outside code).
STEP_OBSERVERS: list[Callable[[str | None], None]] = []


class Steps:
    """``steps(label)``: the previous step of ``bar`` is done, ``label`` runs now (shown as the
    bar's postfix). ``steps.done()`` completes the last one."""

    def __init__(self, progress: tqdm):
        self.bar = progress
        self.started = False
        self.label = ""

    def __call__(self, label: str) -> None:
        for observe in STEP_OBSERVERS:
            observe(label)
        self.label = label
        self.bar.set_postfix_str(label, refresh=False)
        if self.started:
            self.bar.update(1)  # drawn now, unless the bar was drawn a moment ago (tqdm's mininterval)
        else:
            self.bar.refresh()
        self.started = True

    def detail(self, text: str) -> None:
        """Show ``text`` after the current step's label (drawn at the bar's next redraw)."""
        self.bar.set_postfix_str(f"{self.label}: {text}", refresh=False)

    def epochs(self, totals: dict[str, int]) -> Callable[[str, int, dict[str, float]], None] | None:
        """An ``on_epoch`` for [`opl_rank.opl.learners.fit`][opl_rank.opl.learners.fit]: shows ``policy epoch 3/30``
        (``totals``: epochs per part, ``{"reward": 60, "policy": 30}``); None when the bar
        is off (no host callbacks at all)."""
        if self.bar.disable:
            return None

        def show(part: str, epoch: int, record: dict[str, float]) -> None:
            total = totals.get(part)
            self.detail(f"{part} epoch {epoch}" + (f"/{total}" if total else ""))

        return show

    def done(self) -> None:
        for observe in STEP_OBSERVERS:
            observe(None)
        if self.started:
            self.bar.update(1)
            self.started = False


def write(line: str, stream: TextIO | None = None) -> None:
    """Print ``line`` (default: stdout) without breaking the bars drawn on a terminal."""
    stream = sys.stdout if stream is None else stream
    tqdm.write(line, file=stream)
    getattr(stream, "flush", lambda: None)()


def echo_to(stream: TextIO | None = None) -> Callable[[str], None]:
    """An ``echo`` for the experiments' runners that prints through [`write`][write]."""
    return lambda line: write(line, sys.stdout if stream is None else stream)


class _DropMessages(logging.Filter):
    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


_SILENCED = False


def silence_noise() -> None:
    """Hide messages that are not the user's business (idempotent).

    * JAX's probe of a TPU runtime, ``Unable to initialize backend 'tpu': ... libtpu.so``
      (logged when a TPU backend that JAX tries quietly is absent; shown wherever logging is
      at INFO). Only that probe line: a failing GPU backend or a TPU that is present but
      unusable still warns.

    (Ray's ``os.fork() was called`` warning is silenced where Ray starts: executors.py.)
    """
    global _SILENCED
    if _SILENCED:
        return
    _SILENCED = True
    logging.getLogger("jax._src.xla_bridge").addFilter(_DropMessages("Unable to initialize backend 'tpu'"))
