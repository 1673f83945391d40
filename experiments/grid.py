"""Grid keys of an experiment config: list values, as written in YAML or with ``--set``.

A key whose annotation is a tuple takes a list. ``--set seeds=0,1`` arrives as the string
``"0,1"`` and becomes ``[0, 1]`` (each part read as YAML); a scalar becomes a one-element
list. Duplicate values in a grid key (``seeds: [0, 0]``) are a config error: they would
run one cell twice and count it twice in every mean.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

import yaml

__all__ = ["as_lists", "check_unique"]


def _list_keys(classes: Iterable[type]) -> set[str]:
    keys = set()
    for cls in classes:
        for name, hint in typing.get_type_hints(cls).items():
            if "tuple" in str(hint):
                keys.add(name)
    return keys


def as_lists(values: dict[str, Any], *classes: type) -> dict[str, Any]:
    """``values`` with every tuple-typed key of ``classes`` as a list (``None`` stays None):
    ``"a,b"`` strings are split and each part read as YAML; scalars become ``[scalar]``."""
    keys = _list_keys(classes)
    out = dict(values)
    for name, value in values.items():
        if name not in keys or value is None:
            continue
        if isinstance(value, str) and "," in value:
            value = [yaml.safe_load(v) for v in value.split(",")]
        if not isinstance(value, (list, tuple)):
            value = [value]
        out[name] = value
    return out


def check_unique(config: Any, names: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first grid key of ``config`` with a repeated value."""
    for name in names:
        values = getattr(config, name)
        if values is None:
            continue
        seen, repeated = set(), []
        for v in values:
            if v in seen and v not in repeated:
                repeated.append(v)
            seen.add(v)
        if repeated:
            raise ValueError(
                f"{name} has duplicate values {repeated} (in {list(values)}): each grid value must appear once"
            )
