"""User code named by a config or a flag: ``module:function`` callables and plugin modules.

The one place that imports code by name, so every command reports a bad name the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["load_callable", "import_plugins"]


def load_callable(spec: str, *, what: str | None = None) -> Callable[..., Any]:
    """Import ``module:function`` (e.g. ``my_pkg.policies:logits``) with clear errors.

    ``what`` (e.g. ``"logging_policy"``) starts every error message, naming the setting.
    """
    prefix = f"{what} {spec!r}: " if what else ""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{prefix}expected 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{prefix}cannot import module {module_name!r} (from {spec!r}): {err}") from err
    try:
        fn = getattr(module, attr)
    except AttributeError as err:
        raise ValueError(f"{prefix}module {module_name!r} has no attribute {attr!r}") from err
    if not callable(fn):
        raise ValueError(f"{prefix}{spec!r} is not callable")
    return fn


def import_plugins(modules: Sequence[str]) -> None:
    """Import each plugin module (its registrations run on import); errors name the module."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"plugins: cannot import module {name!r} ({err})") from err
