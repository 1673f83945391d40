"""YAML configs parsed once, at the boundary, into frozen dataclasses with clear errors."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Sequence
from typing import Any

import yaml

__all__ = [
    "load_yaml",
    "parse_overrides",
    "check_override_keys",
    "build_dataclass",
    "build_with_training",
    "resolve_path",
]


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML mapping; errors name the file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping of keys to values")
    return data


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["epochs=5", "hidden=[64, 32]"]`` -> ``{"epochs": 5, "hidden": [64, 32]}`` (YAML values)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key = name.strip()
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:  # e.g. a tag such as !!python/object:os.system
            raise ValueError(f"--set {key}: not a valid YAML value {value!r}: {err}") from err
    return out


def check_override_keys(overrides: dict[str, Any], *classes: type) -> None:
    """A ``--set`` key that none of ``classes`` has is the command line's error, not the
    config file's: name it, with the closest known key."""
    import difflib

    known = sorted({f.name for cls in classes for f in dataclasses.fields(cls)})
    for key in overrides:
        head = key.split(".", 1)[0]
        if head not in known:
            close = difflib.get_close_matches(head, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"--set {key}: unknown key{hint}; known keys: {', '.join(known)}")


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {value!r}")
        (item_type, *_rest) = typing.get_args(annotation)
        return tuple(_coerce(f"{name}[{i}]", v, item_type) for i, v in enumerate(value))
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(name, value, arg)
            except ValueError:
                continue
        raise ValueError(f"{name}: {value!r} does not fit {annotation}")
    return value


def build_dataclass(cls: type, values: dict[str, Any], *, source: str = "config") -> Any:
    """``cls(**values)`` with unknown keys rejected and values type-checked by annotation."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; known keys: {sorted(fields)}")
    kwargs = {name: _coerce(name, value, hints[name]) for name, value in values.items()}
    return cls(**kwargs)


def build_with_training(cls: type, training_cls: type, values: dict[str, Any], *, source: str = "config") -> Any:
    """A flat mapping split between ``cls`` and its ``training`` field (``training_cls``):
    both validated, unknown keys rejected. Returns ``cls(..., training=training_cls(...))``."""
    training_keys = {f.name for f in dataclasses.fields(training_cls)}
    own_keys = {f.name for f in dataclasses.fields(cls)} - {"training"}
    unknown = sorted(set(values) - training_keys - own_keys)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; known keys: {sorted(training_keys | own_keys)}")
    training = build_dataclass(training_cls, {k: v for k, v in values.items() if k in training_keys}, source=source)
    own = build_dataclass(cls, {k: v for k, v in values.items() if k in own_keys}, source=source)
    return dataclasses.replace(own, training=training)


DATASET_PREFIX = "dataset:"


def resolve_path(path: str, config_path: str | None) -> str:
    """A data path as written, else relative to the config file's folder; must exist and be
    a file (a directory is a ``ValueError``, not a traceback later in the reader).

    ``dataset:NAME`` (e.g. ``dataset:yahoo_sample``) names a data set shipped with the
    package instead: the result is [`simulators.datasets.path`][simulators.datasets.path] of NAME, absolute, so it
    does not depend on the working directory or the config's location. An unknown NAME is a
    ``ValueError`` that lists the known ones.
    """
    if path.startswith(DATASET_PREFIX):
        from simulators import datasets

        name = path[len(DATASET_PREFIX) :].strip()
        try:
            return datasets.path(name)
        except FileNotFoundError as err:
            raise ValueError(f"data file not found: {err}") from err
    candidates = [path]
    if config_path is not None and not os.path.isabs(path):
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(config_path)), path))
    for candidate in candidates:
        if os.path.isdir(candidate):
            raise ValueError(f"data path {candidate} is a directory; expected a data file (e.g. a LETOR/SVMlight file)")
        if os.path.exists(candidate):
            return candidate
    raise ValueError(f"data file not found: tried {candidates}")
