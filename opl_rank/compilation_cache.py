"""JAX's persistent compilation cache: compile a kernel once, load it in every later process.

Most of a small run's time is XLA compilation, not computation: the tutorial's five steps
(D = 10, n = 2,000) take about 100 s from a cold start on two CPU cores and about 40 s when
their kernels come from this cache (docs/performance.md §17). JAX keys every cached
executable by its program, compile options, backend and JAX version, so a changed function
simply misses; nothing stale is ever loaded. Beside it, [`opl_rank.program_cache`][opl_rank.program_cache]
keeps the fits' traced programs (``<cache>/programs``), so a later process skips tracing them too.

The ``opl-rank`` command enables it for every subcommand, in ``$OPL_RANK_JAX_CACHE`` or
``~/.cache/opl_rank/jax`` (``OPL_RANK_JAX_CACHE=""`` turns it off); sweep workers (local
processes or Ray tasks) share the same directory. In a notebook or script, call
[`enable_compilation_cache`][enable_compilation_cache] once, at the top. The library never enables it on import:
that is the user's choice of where to write.
"""

from __future__ import annotations

import os

__all__ = ["CACHE_ENV", "default_cache_dir", "enable_compilation_cache"]

CACHE_ENV = "OPL_RANK_JAX_CACHE"
# Compiles shorter than this are not written. JAX's default, 1 s, suits slow network file
# systems; most of this library's kernels compile in well under a second, and on a local
# disk writing them all costs nothing measurable (docs/performance.md §17).
MIN_COMPILE_SECONDS = 0.0


def default_cache_dir() -> str | None:
    """``$OPL_RANK_JAX_CACHE`` if set (``""``: None, the cache is off), else ``~/.cache/opl_rank/jax``."""
    if CACHE_ENV in os.environ:
        return os.environ[CACHE_ENV] or None
    return os.path.join(os.path.expanduser("~"), ".cache", "opl_rank", "jax")


def enable_compilation_cache(
    cache_dir: str | os.PathLike | None = None,
    *,
    min_compile_seconds: float = MIN_COMPILE_SECONDS,
    programs: bool = True,
) -> str | None:
    """Point JAX's persistent compilation cache at ``cache_dir`` for this process.

    With ``programs`` the fits' traced programs are kept beside it too
    (``cache_dir/programs``, [`opl_rank.program_cache`][opl_rank.program_cache]): a later
    process then skips tracing and lowering them as well.

    Args:
      cache_dir: a directory (created if missing); None: [`default_cache_dir`][default_cache_dir], which
        may say the cache is off.
      min_compile_seconds: compiles shorter than this are not written.
      programs: keep traced programs as well (``OPL_RANK_PROGRAM_CACHE=0`` in the
        environment turns that off).

    Returns:
      The directory in use, or None when the cache is off.

    Raises:
      ValueError: ``cache_dir`` cannot be created or written, or ``min_compile_seconds`` < 0.

    Examples:
      >>> import tempfile
      >>> with tempfile.TemporaryDirectory() as d:
      ...     enable_compilation_cache(d) == d
      True
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if not min_compile_seconds >= 0:
        raise ValueError(f"min_compile_seconds must be >= 0, got {min_compile_seconds!r}")
    from opl_rank.program_cache import enable_program_cache

    path = default_cache_dir() if cache_dir is None else os.fspath(cache_dir)
    if not path:
        enable_program_cache(None)
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cache_dir {path!r} cannot be created: {err}") from err
    if not os.access(path, os.W_OK):
        raise ValueError(f"cache_dir {path!r} is not writable")
    # jax.config creates one attribute per option at runtime; its type declares none of them
    changed = jax.config.jax_compilation_cache_dir != path  # type: ignore[attr-defined]
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    if changed:
        # JAX decides once per process, at its first compile, whether the cache is used;
        # forget that decision so a directory set after some work takes effect.
        compilation_cache.reset_cache()
    enable_program_cache(os.path.join(path, "programs") if programs else None)
    return path
