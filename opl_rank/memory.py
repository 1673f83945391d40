"""Memory budgets checked before large work starts: a clear error, not a kill by the OOM killer.

Logged data live on the host as NumPy chunks, are concatenated, then copied into JAX
arrays: about [`ASSEMBLY_COPIES`][ASSEMBLY_COPIES] copies of the final arrays exist at the peak.
"""

from __future__ import annotations

import os

__all__ = ["MemoryBudgetError", "available_bytes", "logged_data_bytes", "require"]

ASSEMBLY_COPIES = 3  # chunks, their concatenation, the device copy


class MemoryBudgetError(ValueError):
    """A requested size would not fit in this machine's available memory."""


def available_bytes() -> int | None:
    """Memory available to a new allocation now (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def logged_data_bytes(
    n: int,
    n_items: int,
    ranking_length: int,
    context_dim: int,
    *,
    position_marginals: bool = False,
    item_mask: bool = False,
) -> int:
    """Bytes of a [`LoggedData`][opl_rank.data.LoggedData] of ``n`` rows: contexts ``[n, dx]``,
    rankings, rewards and prefix propensities ``[n, L]`` (4 bytes each), optional position
    marginals ``[n, L]`` and an item mask ``[n, D]`` (1 byte)."""
    per_row = 4 * (context_dim + (4 if position_marginals else 3) * ranking_length)
    return int(n) * (per_row + (n_items if item_mask else 0))


def require(needed: int, what: str, hint: str = "") -> None:
    """Raise [`MemoryBudgetError`][MemoryBudgetError] if ``needed`` bytes exceed the available memory.

    Args:
      needed: bytes the work will hold at its peak.
      what: the work, as the user asked for it (``"simulating n=1e9 rows (D=100, L=10)"``).
      hint: what to change, appended to the message.
    """
    available = available_bytes()
    if available is not None and needed > available:
        raise MemoryBudgetError(
            f"{what} needs about {needed / 2**30:.1f} GiB of memory, but {available / 2**30:.1f} GiB are available"
            + (f"; {hint}" if hint else "")
        )
