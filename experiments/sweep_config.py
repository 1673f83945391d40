"""The OPL sweep's config: the [`OPLSweep`][OPLSweep] dataclass, loading, and the grid it spans.

Everything here is pure: which cells a config has, which rows each cell holds
([`method_rows`][method_rows]), how a cell's file is named, and the resolved config written to
``config.yaml`` (whose hash identifies every cell a config produced).

**Axes.** The R-POD paper's grid -- ``n_items`` (D), ``ranking_length`` (L), ``tau``,
``lam``, ``n``, ``seeds`` -- are list keys of the config. Any other option can be an axis
too, declared under ``axes``::

    axes:
      interaction_scale: [0.5, 1.0, 2.0]   # a config key: each cell runs with its value
      policy_epochs: [10, 30]
      eta: [0.5, 1.0]                      # an option of the simulator (EnvironmentSpec.options)
    env_options: {eta: 1.0}                # or fixed: a simulator option for every cell

An axis is a scalar config key ([`config_axis_names`][config_axis_names]) or an option the simulator
declares ([`simulators.environments.EnvironmentSpec.options`][simulators.environments.EnvironmentSpec.options]). Cells, their file
names (``..._n1000_interaction_scale0.5``), the rows' columns (one per axis, after
``seed``), resume and the report's groups all follow the declared axes; a sweep without
``axes`` names its cells and rows as before.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import typing
from typing import Any

import yaml

from experiments.config import build_dataclass, load_yaml
from experiments.grid import as_lists, check_unique
from experiments.user_code import import_plugins, load_callable

__all__ = [
    "OPLSweep",
    "load_sweep",
    "cells",
    "method_rows",
    "candidate_ks",
    "cell_name",
    "group_key",
    "resolved_config",
    "cell_config",
    "cell_env_options",
    "config_axis_names",
    "row_axis_columns",
    "SELECTION_METHODS",
    "GRID_KEYS",
    "NOT_HASHED",
    "CELL_KEYS",
]

SELECTION_METHODS = ("rpod-ope", "rpod-oracle")  # R-POD with k chosen per cell
GRID_KEYS = ("n_items", "ranking_length", "tau", "lam", "n", "seeds", "methods", "ks", "reward_models", "oracle_noise")
NOT_HASHED = ("output_dir",)  # the only key that cannot change a row
# Keys added after configs were first hashed: left out of the resolved config at these
# defaults, so the cells of a config that does not set them keep their hash.
_LATER_KEYS = {"valid_fraction": 0.0, "policy_patience": None, "reward_patience": None, "diagnostics": False}
# Tuple-valued keys that can still be an axis: each value a list of hidden sizes, written in
# cell names and rows as text ("64x64"; "linear" for none).
_HIDDEN_AXES = ("policy_hidden", "reward_hidden")
# The grid keys that only choose which cells exist (a cell file records its own D, L, tau,
# lambda, n, seed): growing them in an existing output_dir reuses the cells already there.
CELL_KEYS = ("n_items", "ranking_length", "tau", "lam", "n", "seeds", "axes")
# Keys that cannot be an axis: where and how the sweep runs, and what defines the grid.
_NOT_AXES = (
    "simulator",
    "letor_path",
    "letor_sha256",
    "output_dir",
    "plugins",
    "axes",
    "env_options",
    "vmap_seeds",
    "devices",
)
_PAPER_AXES = {"n_items": "D", "ranking_length": "L", "tau": "tau", "lam": "lam", "n": "n", "seeds": "seed"}


@dataclasses.dataclass(frozen=True)
class OPLSweep:
    """A sweep config (every grid key takes a list)."""

    simulator: str = "synthetic"  # "synthetic" or "semi_synthetic" (queries of a LETOR file)
    letor_path: str | None = None  # semi_synthetic: the LETOR/SVMlight file
    letor_sha256: str | None = None  # semi_synthetic: the file's expected SHA-256 (checked before parsing)
    letor_normalize: str | None = None  # semi_synthetic: None, "minmax" or "zscore" per query
    eta_scale: float = 0.05  # semi_synthetic: sd of the per-document base-reward noise
    forest_fraction: float = 0.1  # semi_synthetic: share of queries training the random forest
    n_items: tuple[int, ...] = (10,)
    ranking_length: tuple[int, ...] = (5,)
    tau: tuple[float, ...] = (1.0,)
    lam: tuple[float, ...] = (0.0, 0.5, 1.0)
    n: tuple[int, ...] = (1000, 2000, 4000, 8000)
    seeds: tuple[int, ...] = tuple(range(10))
    methods: tuple[str, ...] = ("ips", "dr", "iips", "rips", "regression", "rpod")
    ks: tuple[int, ...] | None = None  # R-POD's k; None: every k in 0..L
    reward_models: tuple[str, ...] = ("additive", "pairwise")
    logging_policy: str = "pl"  # "pl" (synthetic: the paper's linear PL / tau), "random_forest"
    # (semi_synthetic: PL over a random forest / tau), "uniform", or "module:function"
    sigma: float = 0.5
    interaction_scale: float = 1.0
    eval_contexts: int = 20_000
    policy_epochs: int = 30
    policy_learning_rate: float = 0.05
    reward_epochs: int = 60
    reward_learning_rate: float = 0.02
    batch_size: int = 256
    n_samples: int = 4
    slot_marginals: str | None = None  # iips: the policy's slot marginals ("exact", "sampled", "insertion");
    # None: the learners' "auto" (exact up to D ~ 10 at L = 10, sampled prefixes above)
    ope_estimator: str = "dr"  # rpod-ope: the estimator that picks k on held-out rounds
    ope_holdout: float = 0.3
    oracle_noise: tuple[float, ...] = (20.0, 10.0)  # rpod-oracle: Dmax = |V| / each value
    vmap_seeds: bool | str = "auto"  # fit a cell's seeds together, vmapped; auto: on GPU/TPU only
    policy_hidden: tuple[int, ...] = ()  # hidden sizes of the policies' scorers (() = linear)
    reward_hidden: tuple[int, ...] = ()  # hidden sizes of f_hat's item head
    devices: int | str | None = None  # data parallel over devices: None (one), an int, or "all"
    output_dir: str = "results/opl_synthetic"
    plugins: tuple[str, ...] = ()  # modules imported first (and in every worker): they register
    # estimators (opl_rank.opl.estimators.register) or environments (simulators.environments.register)
    axes: Any = None  # {name: [values]}: more grid axes (config keys or simulator options); see the module doc
    env_options: Any = None  # {name: value}: options of the simulator (its EnvironmentSpec.options)
    estimator_options: Any = None  # {method: {option: value}}: its estimator's inputs-hook options
    # (LearnerConfig.estimator_options), e.g. {aips: {behaviour: neighbour-1}}
    valid_fraction: float = 0.0  # logged rounds held out of every fit to early-stop it (0: none)
    policy_patience: int | None = None  # early stopping of the policies on the held-out estimate
    reward_patience: int | None = None  # early stopping of f_hat on the held-out squared error
    diagnostics: bool = False  # add R-POD's error sources to every row (DIAGNOSTIC_COLUMNS)

    def __post_init__(self) -> None:
        import_plugins(self.plugins)
        # Stored as tuples of pairs: the config stays hashable (cells cache their environments).
        object.__setattr__(self, "env_options", _pairs(self.env_options, "env_options") or None)
        object.__setattr__(self, "axes", _pairs(self.axes, "axes") or None)
        object.__setattr__(self, "estimator_options", _estimator_options(self.estimator_options, self.methods))
        from opl_rank.opl.learners import learning_methods
        from opl_rank.opl.reward_models import REWARD_MODEL_KINDS

        for name in ("n_items", "ranking_length", "tau", "lam", "n", "seeds", "methods", "reward_models"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        check_unique(self, GRID_KEYS)
        known = list(learning_methods()) + list(SELECTION_METHODS)
        unknown = sorted(set(self.methods) - set(known))
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; known: {known}")
        from opl_rank.opl.estimators import OPL_ESTIMATORS

        usable = [name for name, e in OPL_ESTIMATORS.items() if not e.needs_position_marginals]
        if self.ope_estimator not in usable:
            raise ValueError(f"ope_estimator must be one of {usable}, got {self.ope_estimator!r}")
        if not 0.0 < self.ope_holdout < 1.0:
            raise ValueError(f"ope_holdout must be in (0, 1), got {self.ope_holdout}")
        from simulators import environments

        spec = environments.get(self.simulator)
        self._check_training()
        self._check_axes(spec)
        if spec.check is not None:
            spec.check(self)
        builtin = spec.logging_policies
        if self.logging_policy not in builtin:
            if ":" not in self.logging_policy:
                raise ValueError(
                    f"logging_policy for {self.simulator} must be one of {list(builtin)} or 'module:function', got {self.logging_policy!r}"
                )
            load_callable(self.logging_policy, what="logging_policy")  # fails early, naming the problem
        if not spec.repeats_contexts and any(kind.endswith("-two-step") for kind in self.reward_models):
            raise ValueError(
                f"two-step reward models need logged rounds that share a context; simulator "
                f"{self.simulator!r} never repeats one (use simulator semi_synthetic)"
            )
        if self.vmap_seeds not in (True, False, "auto"):
            raise ValueError(f"vmap_seeds must be true, false or auto, got {self.vmap_seeds!r}")
        if any(v <= 0 for v in self.oracle_noise):
            raise ValueError(f"oracle_noise values must be > 0, got {self.oracle_noise}")
        unknown = sorted(set(self.reward_models) - set(REWARD_MODEL_KINDS))
        if unknown:
            raise ValueError(f"unknown reward model(s) {unknown}; known: {list(REWARD_MODEL_KINDS)}")
        if any(not 0.0 <= v <= 1.0 for v in self.lam):
            raise ValueError(f"lam values must be in [0, 1], got {self.lam}")
        if any(v <= 0 for v in self.tau):
            raise ValueError(f"tau values must be > 0, got {self.tau}")
        if any(v < 1 for v in self.n):
            raise ValueError(f"n values must be >= 1, got {list(self.n)}")
        if any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be >= 0, got {list(self.seeds)}")
        if any(l > d for d in self.n_items for l in self.ranking_length):
            raise ValueError(f"every ranking_length {self.ranking_length} must be <= every n_items {self.n_items}")
        if self.ks is not None and any(k < 0 or k > min(self.ranking_length) for k in self.ks):
            raise ValueError(f"ks must be in [0, L], got {self.ks}")
        from opl_rank.opl.learners import SLOT_MARGINALS

        if self.slot_marginals is not None and self.slot_marginals not in SLOT_MARGINALS:
            raise ValueError(f"slot_marginals must be null or one of {SLOT_MARGINALS}, got {self.slot_marginals!r}")

    def _check_training(self) -> None:
        """The learners' settings, checked here in the config's own key names (before any
        file is written), as the cells will build them."""
        import math

        from opl_rank.optimization import TrainConfig

        if isinstance(self.eval_contexts, bool) or not isinstance(self.eval_contexts, int) or self.eval_contexts < 2:
            raise ValueError(f"eval_contexts must be an int >= 2 (ground-truth contexts), got {self.eval_contexts!r}")
        if isinstance(self.n_samples, bool) or not isinstance(self.n_samples, int) or self.n_samples < 2:
            raise ValueError(f"n_samples must be an int >= 2, got {self.n_samples!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be finite and >= 0, got {self.sigma!r}")
        if not (math.isfinite(self.interaction_scale) and self.interaction_scale >= 0):
            raise ValueError(f"interaction_scale must be finite and >= 0, got {self.interaction_scale!r}")
        if isinstance(self.valid_fraction, bool) or not (
            isinstance(self.valid_fraction, (int, float)) and 0.0 <= self.valid_fraction < 1.0
        ):
            raise ValueError(f"valid_fraction must be a number in [0, 1), got {self.valid_fraction!r}")
        for prefix in ("policy", "reward"):
            patience = getattr(self, f"{prefix}_patience")
            if patience is not None and self.valid_fraction == 0:
                raise ValueError(
                    f"{prefix}_patience needs held-out rounds to stop on: set valid_fraction > 0 (e.g. 0.2)"
                )
            try:
                TrainConfig(
                    epochs=getattr(self, f"{prefix}_epochs"),
                    batch_size=self.batch_size,
                    learning_rate=getattr(self, f"{prefix}_learning_rate"),
                    devices=self.devices,
                    patience=patience,
                )
            except ValueError as err:  # "epochs must be ..." in the sweep's words
                message = str(err)
                for name in ("epochs", "learning_rate", "patience"):
                    message = message.replace(f"{name} must", f"{prefix}_{name} must", 1)
                raise ValueError(message) from None

    def _check_axes(self, spec: Any) -> None:
        """Axes name config keys or the simulator's options; values are unique and typed."""
        from experiments.config import _coerce
        from experiments.sweep_cell import ROW_COLUMNS

        options = dict(spec.options)
        for name, value in self.env_options or ():
            if name not in options:
                raise ValueError(
                    f"env_options: simulator {self.simulator!r} has no option {name!r}; "
                    f"its options: {sorted(options) or 'none'}"
                )
            if value is not None and not isinstance(value, (int, float, str, bool)):
                raise ValueError(f"env_options.{name}: a value must be a number, a string or a boolean, got {value!r}")
        hints = typing.get_type_hints(OPLSweep)
        coerced = []
        for name, values in self.axes or ():
            if name in _PAPER_AXES:
                raise ValueError(f"axes: {name!r} is a grid key of its own: list its values as {name}: [...]")
            if name in ROW_COLUMNS or name in _CELL_NAMES:  # it would overwrite a column of every row
                raise ValueError(f"axes: {name!r} names a column of the results table; it cannot be an axis")
            if name in options:
                pass  # a simulator option: its factory checks the values
            elif name in _HIDDEN_AXES:
                values = tuple(hidden_text(v, f"axes.{name}[{i}]") for i, v in enumerate(values))
            elif name in config_axis_names():
                values = tuple(_coerce(f"axes.{name}[{i}]", v, hints[name]) for i, v in enumerate(values))
            else:
                raise ValueError(
                    f"axes: {name!r} is neither a config key that can vary ({', '.join(config_axis_names())}) "
                    f"nor an option of simulator {self.simulator!r} ({', '.join(sorted(options)) or 'none'})"
                )
            if any(v is not None and not isinstance(v, (int, float, str, bool)) for v in values):
                raise ValueError(f"axes.{name}: values must be numbers, strings or booleans, got {list(values)}")
            if len(set(values)) != len(values):
                raise ValueError(
                    f"axes.{name} has duplicate values (in {list(values)}): each grid value must appear once"
                )
            if name in dict(self.env_options or ()):
                raise ValueError(f"{name!r} is both an axis and a fixed env_options value: keep one")
            shown = [_name_part(v) for v in values]  # cell file names must tell the values apart
            if len(set(shown)) != len(shown):
                raise ValueError(
                    f"axes.{name}: values {list(values)} would share cell file names ({shown}); "
                    "give values that differ as text (letters, digits, '.', '+', '-')"
                )
            coerced.append((name, values))
        object.__setattr__(self, "axes", tuple(coerced) or None)
        for name, values in self.axes or ():  # each value must make a valid config
            if name not in options:
                for v in values:
                    dataclasses.replace(self, axes=None, **{name: _axis_value(name, v)})


def hidden_text(value: Any, what: str) -> str:
    """Hidden sizes as an axis value's text: ``[64, 64]`` or ``"64x64"`` -> ``"64x64"``; one
    layer as a bare int (``64``, as ``--set reward_hidden=64`` reads it) -> ``"64"``;
    ``[]``, ``"linear"`` or ``""`` -> ``"linear"``."""
    if isinstance(value, str):
        parts = [] if value in ("", "linear") else value.split("x")
    elif isinstance(value, int) and not isinstance(value, bool):
        parts = [value]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise ValueError(f"{what}: hidden sizes must be a list of ints or text like '64x64', got {value!r}")
    try:
        sizes = [int(p) for p in parts]
    except (TypeError, ValueError):
        raise ValueError(
            f"{what}: hidden sizes must be positive ints (e.g. [64, 64] or '64x64'), got {value!r}"
        ) from None
    if any(isinstance(p, bool) or size < 1 for p, size in zip(parts, sizes)):
        raise ValueError(f"{what}: hidden sizes must be positive ints, got {value!r}")
    return "x".join(str(size) for size in sizes) or "linear"


def _axis_value(name: str, value: Any) -> Any:
    """A config axis's value as the config key takes it (hidden sizes from their text)."""
    if name in _HIDDEN_AXES:
        return tuple(int(p) for p in value.split("x")) if value != "linear" else ()
    return value


def _estimator_options(value: Any, methods: tuple[str, ...]) -> tuple | None:
    """``{method: {option: value}}`` as sorted nested pairs (hashable); each method must be in
    ``methods``; the options are checked by ``LearnerConfig`` when a cell fits."""
    if value is None or value == {} or value == ():
        return None
    if isinstance(value, (list, tuple)):  # already stored
        value = {name: dict(options) for name, options in value}
    if not isinstance(value, dict):
        raise ValueError(f"estimator_options must be a mapping of methods to option mappings, got {value!r}")
    out = []
    for method, options in value.items():
        if method not in methods:
            raise ValueError(f"estimator_options.{method}: not one of this sweep's methods {list(methods)}")
        if not isinstance(options, dict):
            raise ValueError(f"estimator_options.{method} must be a mapping of options, got {options!r}")
        out.append(
            (method, tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in options.items())))
        )
    return tuple(sorted(out))


def _pairs(value: Any, what: str) -> tuple:
    """A YAML mapping (or its stored pairs) as ``((name, value), ...)``; axes' values as tuples."""
    if value is None:
        return ()
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        items = [tuple(p) for p in value]
    else:
        raise ValueError(
            f"{what} must be a mapping of names to {'lists of values' if what == 'axes' else 'values'}, got {value!r}"
        )
    out = []
    for name, v in items:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{what}: names must be identifiers, got {name!r}")
        if what == "axes":
            if isinstance(v, str) and "," in v:  # --set axes.name=a,b
                v = [yaml.safe_load(part) for part in v.split(",")]
            v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
            if not v:
                raise ValueError(f"axes.{name} must not be empty")
        out.append((name, v))
    return tuple(out)


def config_axis_names() -> tuple[str, ...]:
    """The config keys that can be an axis: every scalar key but those of the paper's grid
    and those that say where or how the sweep runs."""
    hints = typing.get_type_hints(OPLSweep)
    return tuple(
        f.name
        for f in dataclasses.fields(OPLSweep)
        if f.name not in _NOT_AXES
        and f.name not in _PAPER_AXES
        and ("tuple" not in str(hints[f.name]) or f.name in _HIDDEN_AXES)
    )


def row_axis_columns(sweep: OPLSweep) -> tuple[str, ...]:
    """The columns the declared ``axes`` add to every row (and cell), in declared order."""
    return tuple(name for name, _ in sweep.axes or ())


def cell_config(sweep: OPLSweep, cell: dict[str, Any]) -> OPLSweep:
    """The config a cell runs with: the sweep's, with the cell's value of every config axis."""
    changes = {name: _axis_value(name, cell[name]) for name, _ in sweep.axes or () if name in config_axis_names()}
    return dataclasses.replace(sweep, **changes) if changes else sweep


def cell_env_options(sweep: OPLSweep, cell: dict[str, Any]) -> dict[str, Any]:
    """The simulator options of a cell: the spec's defaults, ``env_options``, then the cell's axes."""
    from simulators import environments

    options = dict(environments.get(sweep.simulator).options)
    options.update(dict(sweep.env_options or ()))
    options.update({name: cell[name] for name, _ in sweep.axes or () if name in options})
    return options


def load_sweep(config_path: str, overrides: dict[str, Any]) -> OPLSweep:
    """Read the YAML and ``--set`` overrides (lists with commas); unknown keys are errors."""
    from experiments.config import check_override_keys, resolve_path

    values = load_yaml(config_path)
    declared = values.get("axes") if isinstance(values.get("axes"), dict) else {}
    # --set NAME=a,b on an axis the file declares sets that axis's values: as a plain key the
    # axis would override it in every cell, silently running the file's values instead
    check_override_keys({k: v for k, v in overrides.items() if k not in declared}, OPLSweep)
    for key in declared:  # the axis would win in every cell, silently
        if key in values:
            raise ValueError(
                f"{config_path}: {key!r} is both an axis (axes.{key}: {declared[key]}) and a fixed value "
                f"({key}: {values[key]}): keep one"
            )
    for key, value in overrides.items():  # --set axes.NAME=a,b / --set env_options.NAME=v
        head, dot, name = key.partition(".")
        if key in declared:
            head, dot, name = "axes", ".", key
        if dot and head in ("axes", "env_options"):
            merged = dict(values.get(head) or {})
            merged[name] = value
            values[head] = merged
        else:
            values[key] = value
    if values.get("letor_path"):  # as written, else relative to the config file
        values["letor_path"] = os.path.abspath(resolve_path(str(values["letor_path"]), config_path))
    try:
        return build_dataclass(OPLSweep, as_lists(values, OPLSweep), source=config_path)
    except ValueError as err:  # name where the bad value came from: the file or --set
        message = str(err)
        if message.startswith(config_path):
            raise
        given = f" with --set {', '.join(overrides)}" if overrides else ""
        raise ValueError(f"{config_path}{given}: {message}") from None


def resolved_config(sweep: OPLSweep) -> dict[str, Any]:
    """The config as written to ``config.yaml`` (lists, not tuples; ``axes`` and
    ``env_options`` as mappings). A config key that is an axis is left out: its cells say
    their values."""
    out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(sweep).items()}
    out["axes"] = {name: list(values) for name, values in sweep.axes} if sweep.axes else None
    out["env_options"] = dict(sweep.env_options) if sweep.env_options else None
    if sweep.estimator_options is None:  # absent, as before the key existed: older cells keep their hash
        out.pop("estimator_options", None)
    else:
        out["estimator_options"] = {
            m: {k: list(v) if isinstance(v, tuple) else v for k, v in o} for m, o in sweep.estimator_options
        }
    for name, default in _LATER_KEYS.items():
        if name in out and out[name] == default:
            out.pop(name)
    for name in row_axis_columns(sweep):
        out.pop(name, None)
    return out


def cells(sweep: OPLSweep) -> list[dict[str, Any]]:
    """Every (D, L, tau, lambda, seed, n, *axes) cell, in a stable order."""
    grid = itertools.product(
        sweep.n_items,
        sweep.ranking_length,
        sweep.tau,
        sweep.lam,
        sweep.seeds,
        sweep.n,
        *(values for _, values in sweep.axes or ()),
    )
    names = row_axis_columns(sweep)
    return [
        dict(D=d, L=l, tau=t, lam=lam, seed=s, n=n, **dict(zip(names, extra))) for d, l, t, lam, s, n, *extra in grid
    ]


def method_rows(sweep: OPLSweep, n_slots: int) -> list[tuple[str, Any, str]]:
    """(method, k, reward model) of every row of a cell. For ``rpod-oracle`` the middle
    entry is the noise divisor (its k is chosen in the cell); for ``rpod-ope`` it is None."""
    from opl_rank.opl.learners import needs_reward_model

    rows: list[tuple[str, Any, str]] = []
    for method in sweep.methods:
        with_model = method in SELECTION_METHODS or needs_reward_model(method)
        if not with_model:
            rows.append((method, None, "-"))
        for kind in sweep.reward_models if with_model else ():
            if method == "rpod":
                rows.extend(("rpod", k, kind) for k in candidate_ks(sweep, n_slots))
            elif method == "rpod-oracle":
                rows.extend(("rpod-oracle", divisor, kind) for divisor in sweep.oracle_noise)
            else:
                rows.append((method, None, kind))
    return rows


def candidate_ks(sweep: OPLSweep, n_slots: int) -> tuple[int, ...]:
    """R-POD's k values in a cell with ``n_slots`` positions."""
    return tuple(sweep.ks) if sweep.ks is not None else tuple(range(n_slots + 1))


def cell_name(cell: dict[str, Any]) -> str:
    """The cell's file name under ``cells/`` (without ``.json``): the paper's coordinates,
    then ``_<axis><value>`` per declared axis."""
    name = "D{D}_L{L}_tau{tau}_lam{lam}_seed{seed}_n{n}".format(**cell)
    extra = [k for k in cell if k not in _CELL_NAMES]
    return name + "".join(f"_{k}{_name_part(cell[k])}" for k in extra)


def _name_part(value: Any) -> str:
    """An axis value as it stands in a cell file name (case kept; other characters as '-')."""
    return re.sub(r"[^A-Za-z0-9.+-]", "-", str(value))[:64]


_CELL_NAMES = ("D", "L", "tau", "lam", "seed", "n")


def shape_key(sweep: OPLSweep, cell: dict[str, Any]) -> tuple:
    """What sets a cell's array shapes, and so its compiled programs: D, L, n and the declared
    axes (which may be sizes, e.g. ``reward_hidden``); tau, lambda and the seed do not."""
    return tuple(cell[k] for k in ("D", "L", "n")) + tuple(cell[k] for k in row_axis_columns(sweep))


def group_key(sweep: OPLSweep, cell: dict[str, Any]) -> tuple:
    """Cells with the same key share shapes and are fitted together (their seeds vmapped)."""
    shape = tuple(cell[k] for k in ("D", "L", "tau", "lam", "n")) + tuple(cell[k] for k in row_axis_columns(sweep))
    return shape + (() if sweep.vmap_seeds else (cell["seed"],))
