"""Traced programs kept on disk: a warm process skips JAX's tracing and lowering of a fit.

JAX's persistent compilation cache ([`opl_rank.compilation_cache`][opl_rank.compilation_cache])
keeps XLA's executables, but a new process still traces every training chunk to a jaxpr and
lowers it to StableHLO before it can look the executable up: about 4 s of the small preset's
warm run, all of it Python holding the interpreter lock (docs/performance.md §26). This cache
keeps each program of a fit's stages ([`opl_rank.staging.stage`][opl_rank.staging.stage]) and of
the functions compiled with [`cached_jit`][cached_jit] as a serialized ``jax.export.Exported``
and calls it in later processes; XLA then compiles it (a persistent-cache hit where that cache
is on).

**A program is only ever reused for the code that made it.** Its key hashes

* the function and everything it closes over, recursively ([`fingerprint`][fingerprint], again
  for every new argument signature): code objects, closed-over values (numbers, strings, arrays
  by content and weak type, dataclasses and named tuples field by field, flax modules, optax
  transformations). A function or object it does not understand -- any code outside this
  repository's packages and jax, flax, optax, numpy -- makes the program uncacheable: it is
  traced as usual;
* the contents of the source files of ``opl_rank``, ``simulators`` and ``experiments``, the
  versions of Python, jax, jaxlib, flax, optax, numpy, ml_dtypes and chex, JAX's configuration
  (as it is at the call), ``XLA_FLAGS``, the platform and [`opl_rank.tuning`][opl_rank.tuning]'s
  values;
* the arguments' tree structure (node types and their static data, fingerprinted the same way),
  shapes, dtypes and weak types, and the static arguments.

If a source file's content changed since this process imported the library, or a function of
its modules was replaced by outside code (a monkeypatch), the cache stops being used for the
rest of the process: the running code may then differ from the files. Calls inside another
transformation (``vmap``, ``grad``) and programs with weakly typed outputs are traced as usual.
Cached or not, a program computes the same values: the first process runs the exported program
too, so a warm run's results equal the cold run's bit for bit (tested).

The folder keeps at most ``tuning.PROGRAM_CACHE_MAX_ENTRIES`` programs, the most recently used.

Cached or not, these programs compile on CPU with ``tuning.CPU_COMPILE_OPTIONS`` (library
fusions for matrix products only; docs/performance.md §29) and with cheaper XLA options where
their arrays are small ([`compiler_options`][compiler_options]; docs/performance.md §27).

The ``opl-rank`` command turns it on next to the compilation cache
(``<compilation cache>/programs``); ``OPL_RANK_PROGRAM_CACHE=0`` turns it off. The library never
turns it on by itself: [`enable_compilation_cache`][opl_rank.compilation_cache.enable_compilation_cache]
does, or [`enable_program_cache`][enable_program_cache].
"""

from __future__ import annotations

import dataclasses
import dis
import enum
import functools
import hashlib
import inspect
import logging
import os
import pickle
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = [
    "PROGRAM_CACHE_ENV",
    "enable_program_cache",
    "program_cache_dir",
    "fingerprint",
    "cached_program",
    "cached_jit",
    "compiler_options",
    "stats",
]

log = logging.getLogger(__name__)

PROGRAM_CACHE_ENV = "OPL_RANK_PROGRAM_CACHE"
_FORMAT = 1  # bump when the stored entry's layout changes
_OWN_PACKAGES = ("opl_rank", "simulators", "experiments")
# Libraries whose code is pinned by their version (part of every key).
_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes", "chex")
_BUILTIN_MODULES = ("builtins", "functools", "operator", "math", "typing", "abc", "collections", "enum")

_lock = threading.Lock()
_dir: str | None = None
_disabled_reason: str | None = None
_bindings_seen: dict[str, dict[str, int]] | None = None  # the own modules' definitions at the first look
# Programs by key, shared by every staged function and thread of the process; one lock per
# key, so two threads that need one program export or load it once.
_programs: dict[str, _Program | None] = {}
_key_locks: dict[str, threading.Lock] = {}
_counts = {"loaded": 0, "exported": 0, "uncacheable": 0, "failed": 0}


def enable_program_cache(cache_dir: str | os.PathLike | None) -> str | None:
    """Keep traced programs in ``cache_dir`` (created if missing); None turns the cache off.
    ``OPL_RANK_PROGRAM_CACHE=0`` in the environment keeps it off whatever is passed.

    Returns:
      The directory in use, or None.
    """
    global _dir
    if cache_dir is None or os.environ.get(PROGRAM_CACHE_ENV, "1") == "0":
        _dir = None
        return None
    path = os.fspath(cache_dir)
    os.makedirs(path, exist_ok=True)
    _dir = path
    return path


def program_cache_dir() -> str | None:
    """The directory in use, or None when the cache is off."""
    return _dir


def _count(name: str) -> None:
    with _lock:
        _counts[name] += 1


def stats() -> dict[str, int]:
    """Programs loaded from the cache, exported into it, uncacheable and failed, in this process."""
    return dict(_counts)


# --- what a program depends on ------------------------------------------------------------


class _Unknown(Exception):
    """An object whose effect on a traced program cannot be pinned down."""


def _root(module: str | None) -> str:
    return (module or "").split(".")[0]


def _allowed_module(module: str | None) -> bool:
    """A module of the pinned libraries, or one of this repository's own (judged by its file:
    another package named ``experiments`` or ``simulators`` is user code)."""
    root = _root(module)
    if root in _LIBRARIES or root in _BUILTIN_MODULES:
        return True
    if root not in _OWN_PACKAGES:
        return False
    path = getattr(sys.modules.get(module or ""), "__file__", None)
    if path is None:
        return False
    if not os.path.isabs(path):  # relative to the working directory, which can change
        return os.path.abspath(path).startswith(_OWN_DIRS)
    allowed = _own_file_memo.get(path)
    if allowed is None:  # abspath was most of a source check's time (called for every definition)
        allowed = _own_file_memo[path] = os.path.abspath(path).startswith(_OWN_DIRS)
    return allowed


_own_file_memo: dict[str, bool] = {}  # a module's absolute file -> inside this repository's folders


def _code(code: types.CodeType) -> str:
    parts = [code.co_qualname, code.co_code.hex(), repr(code.co_names), repr(code.co_varnames)]
    for const in code.co_consts:
        parts.append(_code(const) if isinstance(const, types.CodeType) else repr(const))
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def fingerprint(obj: Any) -> str | None:
    """A string that pins down what tracing ``obj`` (a function to stage) produces, given
    this repository's sources and the libraries' versions; None when something it closes over
    cannot be pinned down (user code, unknown objects): such a program is not cached."""
    try:
        return hashlib.sha256(_fp(obj, 0, ()).encode()).hexdigest()
    except Exception as err:  # _Unknown, or anything an odd object raises: not cacheable
        log.debug("program cache: not cacheable (%s)", err)
        return None


def _fp(x: Any, depth: int, path: tuple[int, ...]) -> str:  # noqa: C901 -- one case per kind of object
    if depth > 64:
        raise _Unknown("nested too deeply")
    if x is None or type(x) in (bool, int, float, complex, str, bytes):  # exact types: a subclass is user code
        return f"{type(x).__name__}:{x!r}"
    if id(x) in path:
        raise _Unknown("a cycle")
    path = (*path, id(x))
    deeper = functools.partial(_fp, depth=depth + 1, path=path)
    kind = type(x)
    if isinstance(x, type):
        if not _allowed_module(x.__module__):
            raise _Unknown(f"class {x.__module__}.{x.__qualname__}")
        return f"type:{x.__module__}.{x.__qualname__}"
    if not _allowed_module(kind.__module__):
        raise _Unknown(f"object of {kind.__module__}.{kind.__qualname__}")
    name = f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(x, enum.Enum):
        return f"enum:{name}.{x.name}"
    if isinstance(x, types.FunctionType):
        defined_in = x.__globals__.get("__name__")  # not __module__, which functools.wraps copies
        if not _allowed_module(defined_in):
            raise _Unknown(f"function {defined_in}.{x.__qualname__}")
        cells = [c.cell_contents if _filled(c) else "<empty>" for c in (x.__closure__ or ())]
        return (
            f"fn:{x.__module__}.{x.__qualname__}:{_code(x.__code__)}"
            f"({deeper(cells)};{deeper(x.__defaults__)};{deeper(x.__kwdefaults__)})"
        )
    if isinstance(x, types.MethodType):
        return f"method:{deeper(x.__func__)}@{deeper(x.__self__)}"
    if isinstance(x, types.BuiltinFunctionType):
        module = getattr(x, "__module__", None) or getattr(getattr(x, "__self__", None), "__name__", None)
        if not _allowed_module(module):
            raise _Unknown(f"builtin {x!r}")
        return f"builtin:{module}.{x.__qualname__}"
    if isinstance(x, functools.partial):
        return f"partial:{deeper(x.func)}({deeper(x.args)};{deeper(x.keywords)})"
    if isinstance(x, np.ndarray | np.generic):
        data = np.ascontiguousarray(x)
        return f"ndarray:{data.dtype}{data.shape}:{hashlib.sha256(data.tobytes()).hexdigest()}"
    if isinstance(x, jax.core.Tracer):
        raise _Unknown("a tracer (a value of an enclosing transformation)")
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return f"key:{jax.random.key_impl(x)}:{deeper(np.asarray(jax.random.key_data(x)))}"
        return f"array:{x.weak_type}:{deeper(np.asarray(x))}"
    if isinstance(x, np.dtype):
        return f"dtype:{x}"
    if kind in (tuple, list):
        return f"{kind.__name__}[{','.join(deeper(v) for v in x)}]"
    if kind in (set, frozenset):
        return f"{kind.__name__}{{{','.join(sorted(deeper(v) for v in x))}}}"
    if kind is dict or (isinstance(x, dict) and _root(kind.__module__) in ("flax", "collections")):
        items = [(deeper(k), deeper(v)) for k, v in x.items()]  # in order: code may iterate them
        return f"dict:{name}{{{','.join(f'{k}={v}' for k, v in items)}}}"
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a named tuple (optax's transformations)
        return f"nt:{name}({','.join(deeper(v) for v in x)})"
    if dataclasses.is_dataclass(x):  # config objects, flax modules, registry entries
        flax_module = _is_flax_module(x)
        if flax_module and getattr(x, "scope", None) is not None:
            raise _Unknown("a bound flax module (its variables are not fields)")
        fields = []
        for f in dataclasses.fields(x):
            value = getattr(x, f.name, None)
            if flax_module and f.name == "parent" and not _is_flax_module(value):
                value = None  # an unbound module's parent is a sentinel
            fields.append(f"{f.name}={deeper(value)}")
        return f"dc:{name}({','.join(fields)})"
    wrapped = getattr(x, "__wrapped__", None)
    if wrapped is not None and _root(kind.__module__) in ("jax", "jaxlib"):  # jax.jit(f) and the like
        return f"wrapped:{name}:{deeper(wrapped)}"
    for attrs in (("fun", "fwd", "bwd", "nondiff_argnums"), ("fun", "jvp", "nondiff_argnums")):
        if all(hasattr(x, a) for a in attrs) and _root(kind.__module__) == "jax":  # custom_vjp / custom_jvp
            return f"custom:{name}:{deeper([getattr(x, a) for a in attrs])}"
    raise _Unknown(f"object of {name}")


def _tree_fp(treedef: Any) -> str:
    """A pytree structure's node types and their static data, fingerprinted like closures (a
    node's static data shapes the traced program as much as a closed-over value)."""
    data = treedef.node_data()
    if data is None:
        return "*"
    kind, aux = data
    static = _tree_fp(aux) if isinstance(aux, jax.tree_util.PyTreeDef) else _fp(aux, 0, ())
    return f"{_fp(kind, 0, ())}[{static}]({','.join(_tree_fp(c) for c in treedef.children())})"


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 -- an empty cell raises
    except ValueError:
        return False
    return True


def _is_flax_module(x: Any) -> bool:
    return any(_root(c.__module__) == "flax" and c.__name__ == "Module" for c in type(x).__mro__)


def _package_dirs() -> list[str]:
    """``opl_rank`` and, beside it in this repository, ``simulators`` and ``experiments``."""
    here = os.path.dirname(os.path.abspath(__file__))
    parent = os.path.dirname(here)
    return [here] + [os.path.join(parent, p) for p in _OWN_PACKAGES[1:] if os.path.isdir(os.path.join(parent, p))]


def _source_files() -> list[tuple[str, str]]:
    """(name in the repository, path) of every ``.py`` file of the own packages, in order."""
    files = []
    for top in _package_dirs():
        for folder, subdirs, names in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__pycache__")))
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                files.append((os.path.relpath(path, os.path.dirname(top)), path))
    return files


def _stat(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _hash_sources() -> str:
    """A hash of every ``.py`` file of the own packages (names and contents). The contents are
    read again only where a file's inode, size, modification or change time moved since the
    last hash: every write sets the change time, which no tool can set back (about 4 ms, not 7)."""
    global _sources_memo
    files = _source_files()
    stats = [(name, _stat(path)) for name, path in files]
    memo = _sources_memo
    if memo is not None and memo[0] == stats and None not in (st for _, st in stats):
        return memo[1]
    h = hashlib.sha256()
    for name, path in files:
        h.update(name.encode())
        try:
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        except OSError:
            h.update(b"<unreadable>")
    _sources_memo = (stats, h.hexdigest())
    return _sources_memo[1]


_sources_memo: tuple[list[tuple[str, tuple[int, ...] | None]], str] | None = None


def _outside(module: str | None) -> bool:
    root = _root(module)
    return root == "unittest" or (not _allowed_module(module) and root not in sys.stdlib_module_names)


def _own_modules() -> list[tuple[str, types.ModuleType]]:
    return [
        (name, module)
        for name, module in list(sys.modules.items())
        if name.startswith(_OWN_PACKAGES)
        and module is not None
        and _root(name) in _OWN_PACKAGES
        and _allowed_module(name)
    ]


_REASSIGNED: dict[str, set[str]] = {}


def _reassigned(module: types.ModuleType) -> set[str]:
    """Names the module's own code assigns with ``global`` (its state, not its definitions);
    read from its bytecode once per module."""
    if module.__name__ not in _REASSIGNED:
        _REASSIGNED[module.__name__] = _global_stores(module)
    return _REASSIGNED[module.__name__]


def _global_stores(module: types.ModuleType) -> set[str]:
    names: set[str] = set()
    codes = [
        v.__code__ for v in vars(module).values() if isinstance(v, types.FunctionType) and v.__globals__ is vars(module)
    ]
    while codes:
        code = codes.pop()
        names.update(_stored_globals(code))
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


_GLOBAL_STORES = frozenset((dis.opmap["STORE_GLOBAL"], dis.opmap["DELETE_GLOBAL"]))


def _stored_globals(code: types.CodeType) -> list[str]:
    """The names one code object's ``STORE_GLOBAL`` / ``DELETE_GLOBAL`` act on, read from its
    wordcode directly (``dis.get_instructions`` formats every instruction: 0.25 s a process)."""
    raw, names, extended = code.co_code, [], 0
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | extended
        extended = arg << 8 if op == dis.EXTENDED_ARG else 0
        if op in _GLOBAL_STORES:
            names.append(code.co_names[arg])
    return names


def _bindings() -> dict[str, dict[str, int]]:
    """The identity of every definition bound in the own modules and in their classes."""
    out: dict[str, dict[str, int]] = {}
    for name, module in _own_modules():
        skip = _reassigned(module)
        values = dict(vars(module))
        out[name] = {a: id(v) for a, v in values.items() if not a.startswith("__") and a not in skip}
        for a, v in values.items():
            if isinstance(v, type) and v.__module__ == name:
                out[f"{name}.{a}"] = {m: id(x) for m, x in vars(v).items() if not m.startswith("__")}
    return out


def _patched_function() -> str | None:
    """What in the own modules was replaced -- a monkeypatch, as tests do: the running code is
    then not what the files say. A definition that is a function or callable of code outside
    the pinned packages (and the standard library, where decorators' wrappers live) is one; so is
    any definition or method rebound since the first look (a snapshot), whatever replaced it."""
    global _bindings_seen
    for name, module in _own_modules():
        for attr, value in list(vars(module).items()):
            while isinstance(value, functools.partial):
                value = value.func
            if isinstance(value, types.FunctionType):
                replaced = _outside(value.__globals__.get("__name__"))
            else:
                replaced = (
                    callable(value)
                    and not isinstance(value, type | types.ModuleType)
                    and _outside(type(value).__module__)
                )
            if replaced:
                return f"{name}.{attr}"
    now = _bindings()
    if _bindings_seen is None:
        _bindings_seen = now
        return None
    for where, seen in _bindings_seen.items():
        current = now.get(where, {})
        for attr, identity in seen.items():
            if attr in current and current[attr] != identity:
                return f"{where}.{attr}"
    for where, current in now.items():  # modules imported since: their first look
        _bindings_seen.setdefault(where, current)
    return None


def _check_sources() -> str | None:
    """The own packages' source hash, or None -- and the cache off for the rest of the
    process -- where a file's content changed since this process imported this module, or a
    module's function was replaced by outside code (the running code may not match the key)."""
    global _disabled_reason
    if _disabled_reason is not None:
        return None
    if _hash_sources() != _SOURCES_AT_START:
        _disabled_reason = "a source file of opl_rank, simulators or experiments changed after this process started"
    elif (patched := _patched_function()) is not None:
        _disabled_reason = f"{patched} was replaced by code outside the library"
    return None if _disabled_reason is not None else _SOURCES_AT_START


# The last _environment() and what it was computed from: a training run calls its programs a
# few hundred times, and sorting JAX's settings on every call cost 0.1-0.2 ms.
_environment_memo: tuple[Any, str] | None = None


def _environment() -> str:
    global _environment_memo
    from opl_rank import tuning

    probe = (
        tuple(jax.config.values.values()),
        tuple(v for k, v in vars(tuning).items() if k.isupper()),
        os.environ.get("XLA_FLAGS", ""),
    )
    memo = _environment_memo
    try:
        if memo is not None and memo[0] == probe:
            return memo[1]
    except Exception:  # a setting without a plain == (an array): compute it again
        pass
    _environment_memo = (probe, _compute_environment())
    return _environment_memo[1]


def _compute_environment() -> str:
    from opl_rank import tuning

    versions = []
    for module in ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes", "chex"):
        versions.append(f"{module}={getattr(sys.modules.get(module), '__version__', '?')}")
    settings = sorted((k, repr(v)) for k, v in jax.config.values.items())
    tuned = sorted((k, repr(v)) for k, v in vars(tuning).items() if k.isupper())
    device = jax.devices()[0]
    return repr(
        (
            _FORMAT,
            sys.version,
            versions,
            settings,
            tuned,
            os.environ.get("XLA_FLAGS", ""),
            device.platform,
            getattr(device, "device_kind", ""),
        )
    )


# --- the cache ------------------------------------------------------------------------------


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


def _signature(leaves: list[Any]) -> tuple[Any, ...]:
    """Each leaf's (shape, dtype name, weak type): a few microseconds per call of a program."""
    out = []
    for x in leaves:
        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
            x = jax.typeof(x)
        out.append((tuple(x.shape), _dtype_name(x.dtype), bool(getattr(x, "weak_type", False))))
    return tuple(out)


@functools.cache
def _dtype_name(dtype: Any) -> str:
    return str(dtype)  # ~3 microseconds uncached


class _Program:
    """One exported program: flat array arguments in, flat arrays out (PRNG keys as their
    raw data at the boundary: ``jax.export`` serializes plain dtypes only)."""

    def __init__(
        self,
        exported: Any,
        out_tree: Any,
        in_impls: list[str | None],
        out_impls: list[str | None],
        options: tuple[tuple[str, Any], ...] | None = None,
    ):
        self.call = jax.jit(exported.call, compiler_options=dict(options) if options else None)
        self.out_tree = out_tree
        self.in_impls = in_impls
        self.out_impls = out_impls

    def __call__(self, leaves: list[Any]) -> Any:
        out = self.call(*_raw_keys(leaves))
        return jax.tree.unflatten(self.out_tree, _typed_keys(out, self.out_impls))


def _key_impls(leaves: list[Any]) -> list[str | None]:
    """Each leaf's PRNG implementation's name (None: not a key)."""
    return [str(jax.random.key_impl(x)) if _is_key(x) else None for x in leaves]


def _raw_keys(leaves: list[Any]) -> list[Any]:
    """PRNG keys as their raw data (the exported program's boundary), other leaves as they are."""
    return [jax.random.key_data(x) if _is_key(x) else x for x in leaves]


def _typed_keys(leaves: list[Any], impls: list[str | None]) -> list[Any]:
    """The inverse of [`_raw_keys`][_raw_keys], given each leaf's implementation."""
    return [x if impl is None else jax.random.wrap_key_data(x, impl=impl) for x, impl in zip(leaves, impls)]


def _platform(leaves: list[Any]) -> str:
    """The platform the arguments live on (the default backend's for none)."""
    for x in leaves:
        if isinstance(x, jax.Array):
            return next(iter(x.devices())).platform
    return jax.default_backend()


def _export(
    jitted: Callable[..., Any], leaves: list[Any], in_tree: Any, options: tuple[tuple[str, Any], ...] | None
) -> tuple[bytes, _Program]:
    in_impls = _key_impls(leaves)
    made: dict[str, Any] = {}

    def flat_fn(*flat: Any) -> list[Any]:
        args = _typed_keys(list(flat), in_impls)
        out_leaves, made["out_tree"] = jax.tree.flatten(jitted(*jax.tree.unflatten(in_tree, args)))
        made["out_impls"] = _key_impls(out_leaves)
        return _raw_keys(out_leaves)

    flat_in = _raw_keys(leaves)
    # for the default backend's platform (its canonical name: "cuda", not the device's "gpu");
    # arguments on another platform make the call fail, and the caller traces as usual
    exported = jax.export.export(jax.jit(flat_fn))(*flat_in)
    if any(getattr(aval, "weak_type", False) for aval in exported.out_avals):
        # a deserialized program's outputs lose their weak types, which later arithmetic reads
        raise ValueError("weakly typed outputs are not kept")
    blob = pickle.dumps(
        {"exported": exported.serialize(), "out_tree": made["out_tree"], "in": in_impls, "out": made["out_impls"]}
    )
    return blob, _Program(exported, made["out_tree"], in_impls, made["out_impls"], options)


def _load(blob: bytes, options: tuple[tuple[str, Any], ...] | None) -> _Program:
    entry = pickle.loads(blob)  # noqa: S301 -- our own cache directory, written by _export
    exported = jax.export.deserialize(entry["exported"])
    return _Program(exported, entry["out_tree"], entry["in"], entry["out"], options)


def small_arguments(leaves: list[Any]) -> bool:
    """Whether these are a small program's arguments on CPU: at most
    ``tuning.FAST_COMPILE_MAX_ELEMENTS`` array elements in all (never under a transformation)."""
    from opl_rank import tuning

    if tuning.FAST_COMPILE_MAX_ELEMENTS <= 0 or any(isinstance(x, jax.core.Tracer) for x in leaves):
        return False
    if _platform(leaves) != "cpu":
        return False
    return sum(int(np.prod(np.shape(x))) for x in leaves if hasattr(x, "shape")) <= tuning.FAST_COMPILE_MAX_ELEMENTS


def compiler_options(leaves: list[Any], *, hot: bool = False) -> tuple[tuple[str, Any], ...] | None:
    """The XLA options a program of these arguments compiles with (None: XLA's defaults).

    On CPU every program gets ``tuning.CPU_COMPILE_OPTIONS`` (library fusions for matrix
    products only: XLA's own loops for elementwise work and reductions, about a third faster
    for the training steps at D = 10; docs/performance.md §29). A program whose array
    arguments are small ([`small_arguments`][small_arguments]) also gets
    ``tuning.FAST_COMPILE_OPTIONS`` (LLVM level 1, no MLIR fusion emitters) unless it is
    ``hot``: such programs -- a fit's training chunks at D = 10 and a few thousand rounds --
    run for less than their compilation takes, which these options cut by about a third
    without slowing their steps measurably (docs/performance.md §27). Options that
    ``XLA_FLAGS`` names are left to it (the test suite's level 0), and options this jaxlib
    does not know are dropped."""
    from opl_rank import tuning

    if any(isinstance(x, jax.core.Tracer) for x in leaves) or _platform(leaves) != "cpu":
        return None
    chosen: tuple[tuple[str, Any], ...] = tuple(tuning.CPU_COMPILE_OPTIONS)
    if not hot and small_arguments(leaves):
        chosen += tuple(tuning.FAST_COMPILE_OPTIONS)
    flags = os.environ.get("XLA_FLAGS", "")
    return _known_options(tuple(option for option in chosen if f"--{option[0]}" not in flags)) or None


@functools.cache
def _known_options(options: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """Those of the options this jaxlib's CPU compiler accepts: a trivial program compiled
    once with all of them (about 30 ms, once per process), and one by one only if that fails."""
    if not options or _accepts(options):
        return options
    return tuple(option for option in options if _accepts((option,)))


def _accepts(options: tuple[tuple[str, Any], ...]) -> bool:
    try:
        x = jax.device_put(np.float32(0), jax.devices("cpu")[0])
        jax.jit(lambda x: x + 1).lower(x).compile(compiler_options=dict(options))
    except Exception as err:  # an older or newer XLA: an option is not there, or not with this value
        log.debug("XLA options %r not all available (%s)", options, err)
        return False
    return True


class _CachedProgram:
    """``jax.jit(traced)`` with its programs kept in the program cache (see the module
    docstring), compiled with the [`compiler_options`][compiler_options] of their arguments.

    ``static_argnames`` are the static arguments (``jax.jit``'s): part of the key, by their
    fingerprint; the other arguments are the program's (as positional arguments)."""

    def __init__(
        self,
        traced: Callable[..., Any],
        fn: Any,
        salt: str,
        static_argnames: tuple[str, ...] = (),
        hot: bool = False,
        xla_defaults: bool = False,
    ):
        self.traced = traced
        self.hot = hot
        self.xla_defaults = xla_defaults
        self.jitted = jax.jit(traced, static_argnames=static_argnames)
        self._with_options: dict[tuple[tuple[str, Any], ...], Callable[..., Any]] = {}
        self.fn = fn
        self.salt = salt
        self.static_argnames = static_argnames
        self._parameters = inspect.signature(fn).parameters if static_argnames else None
        self._fingerprint: str | None | bool = False  # False: not computed yet
        self._programs: dict[Any, _Program | None] = {}
        functools.update_wrapper(self, self.jitted)

    def __getattr__(self, name: str) -> Any:  # the jitted function's own methods (_cache_size, lower, ...)
        return getattr(self.jitted, name)

    def _jit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``jax.jit`` of the traced function with the [`compiler_options`][compiler_options] of
        these arguments, called (the traced-as-usual path)."""
        options = self._options(jax.tree.leaves((args, kwargs)))
        if options is None:
            return self.jitted(*args, **kwargs)
        if options not in self._with_options:
            self._with_options[options] = jax.jit(
                self.traced, static_argnames=self.static_argnames, compiler_options=dict(options)
            )
        return self._with_options[options](*args, **kwargs)

    def _options(self, leaves: list[Any]) -> tuple[tuple[str, Any], ...] | None:
        """[`compiler_options`][compiler_options] (a hot program never gets the cheap ones;
        None for a program kept on XLA's defaults)."""
        return None if self.xla_defaults else compiler_options(leaves, hot=self.hot)

    def _split(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[str, ...] | None, tuple[Any, ...], dict[str, Any]] | None:
        """(the names of the program's arguments given, their values, the static arguments), or
        None where the call does not fit that split (variadic or positional-only parameters).
        Dynamic arguments left to their defaults stay Python constants, as ``jax.jit`` has them."""
        if self._parameters is None:
            return (None, args, {}) if not kwargs else None
        try:
            bound = inspect.Signature(list(self._parameters.values())).bind(*args, **kwargs)
        except TypeError:
            return None
        names, values, static = [], [], {}
        for name, parameter in self._parameters.items():
            if parameter.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
                return None  # called by name below
            if name in self.static_argnames:
                static[name] = bound.arguments.get(name, parameter.default)
            elif name in bound.arguments:
                names.append(name)
                values.append(bound.arguments[name])
        return tuple(names), tuple(values), static

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cache_dir = _dir
        if (
            cache_dir is None
            or _disabled_reason is not None
            or len(jax.devices()) != 1
            or jax.config.values["jax_disable_jit"]
        ):
            return self._jit(args, kwargs)
        split = self._split(args, kwargs)
        if split is None:
            return self._jit(args, kwargs)
        names, dynamic, static = split
        leaves, in_tree = jax.tree.flatten(dynamic)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):  # inside another transformation
            return self.jitted(*args, **kwargs)
        platform = _platform(leaves)
        # JAX's settings are in the key, as jax.jit's own cache has them (``with jax.enable_x64()``)
        signature = (in_tree, _signature(leaves), names, tuple(static.items()), platform, _environment())
        if signature not in self._programs:
            self._programs[signature] = self._program(cache_dir, leaves, in_tree, signature, names, static, platform)
        program = self._programs[signature]
        if program is not None:
            try:
                return program(leaves)
            except Exception as err:  # a use the exported program does not support: trace as usual
                log.debug("program cache: calling the exported program failed (%s)", err)
                self._programs[signature] = None
        return self._jit(args, kwargs)

    def _program(
        self,
        cache_dir: str,
        leaves: list[Any],
        in_tree: Any,
        signature: Any,
        names: tuple[str, ...] | None,
        static: dict[str, Any],
        platform: str,
    ) -> _Program | None:
        fingerprinted = fingerprint(self.fn)  # again for every new signature: closures can change
        try:
            structure = None if fingerprinted is None else _tree_fp(in_tree) + _fp(static, 0, ())
        except Exception as err:  # _Unknown, or anything an odd object raises: not cacheable
            log.debug("program cache: arguments not cacheable (%s)", err)
            structure = None
        if structure is None:
            _count("uncacheable")
            return None
        with _lock:
            sources = _check_sources()
        if sources is None:
            return None
        # The options are in the key: the same function's program may be hot in one fit and
        # small in another, and a program compiles with the options it was first loaded with.
        options = self._options(leaves)
        # the static arguments are in ``structure`` by fingerprint: their repr may hold addresses
        _, leaf_signature, _, _, _, environment = signature
        key = hashlib.sha256(
            repr(
                (fingerprinted, self.salt, structure, (leaf_signature, names, platform, environment), sources, options)
            ).encode()
        ).hexdigest()
        with _lock:
            key_lock = _key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in _programs:
                path = os.path.join(cache_dir, f"{key}.program")
                call = self._with_static(names, static)
                _programs[key] = self._load_or_export(path, call, leaves, in_tree, options)
            return _programs[key]

    def _with_static(self, names: tuple[str, ...] | None, static: dict[str, Any]) -> Callable[..., Any]:
        """``jitted`` as a function of the program's arguments only (by name where some are static)."""
        if names is None:
            return self.jitted
        return lambda *dynamic: self.jitted(**dict(zip(names, dynamic)), **static)

    def _load_or_export(
        self,
        path: str,
        call: Callable[..., Any],
        leaves: list[Any],
        in_tree: Any,
        options: tuple[tuple[str, Any], ...] | None,
    ) -> _Program | None:
        try:
            with open(path, "rb") as f:
                program = _load(f.read(), options)
            _count("loaded")
            _touch(path)
            return program
        except FileNotFoundError:
            pass
        except Exception as err:  # a damaged or foreign entry: export it again
            log.debug("program cache: %s unreadable (%s)", path, err)
        try:
            blob, program = _export(call, leaves, in_tree, options)
        except Exception as err:  # not exportable (a host callback, an unsupported op): trace as usual
            log.debug("program cache: export failed (%s)", err)
            _count("failed")
            return None
        from opl_rank.io.atomic import atomic_write

        with _lock:
            if _check_sources() is not None:
                try:
                    atomic_write(path, lambda f: f.write(blob))
                    _prune(os.path.dirname(path))
                except OSError as err:  # a full or read-only disk costs only the saving
                    log.debug("program cache: cannot write %s (%s)", path, err)
        _count("exported")
        return program


def _touch(path: str) -> None:
    """Mark an entry used (its modification time orders the pruning)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _prune(folder: str) -> None:
    """Above ``tuning.PROGRAM_CACHE_MAX_ENTRIES`` entries, remove the least recently used down
    to three quarters of it."""
    from opl_rank import tuning

    limit = tuning.PROGRAM_CACHE_MAX_ENTRIES
    entries = [e for e in os.scandir(folder) if e.name.endswith(".program")]
    if len(entries) <= limit:
        return
    entries.sort(key=lambda e: e.stat().st_mtime)
    for entry in entries[: len(entries) - (3 * limit) // 4]:
        try:
            os.remove(entry.path)
        except OSError:  # another process removed it first
            pass


def cached_program(traced: Callable[..., Any], fn: Any, salt: str = "", *, hot: bool = False) -> Callable[..., Any]:
    """``jax.jit(traced)`` (``traced`` built from ``fn``), with its traced programs kept in the
    program cache while one is enabled and the [`compiler_options`][compiler_options] of its
    arguments; ``salt`` names how ``traced`` was built from ``fn`` (e.g. vmapped). A ``hot``
    program -- one that runs many times and is compiled once for every size of data, such as
    a training run's steps -- compiles with XLA's defaults whatever its arguments' size."""
    return _CachedProgram(traced, fn, salt, hot=hot)


def cached_jit(
    fn: Callable[..., Any] | None = None, *, static_argnames: tuple[str, ...] = (), xla_defaults: bool = False
) -> Any:
    """``jax.jit(fn, static_argnames=...)`` with its traced programs kept in the program cache
    while one is enabled (a decorator, with or without arguments). ``xla_defaults``: compiled
    with XLA's default options, as plain ``jax.jit`` compiles it (the same numbers bit for bit
    where another option set would reassociate float sums), not with
    [`compiler_options`][compiler_options]."""
    if fn is None:
        return functools.partial(cached_jit, static_argnames=static_argnames, xla_defaults=xla_defaults)
    return _CachedProgram(fn, fn, "jit", tuple(static_argnames), xla_defaults=xla_defaults)


# The sources as this process imports them (opl_rank imports this module among its first).
_SOURCES_AT_START = _hash_sources()
_OWN_DIRS = tuple(os.path.join(d, "") for d in _package_dirs())
