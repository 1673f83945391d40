"""Saving and loading ranking policies: a directory with a JSON spec and the parameters.

A saved policy is a directory holding

  policy.json      what to rebuild: the policy class, its scorer (flax module class and
                   fields), its reward model (kind, module fields, completion settings),
                   k, n_items, L, the context dimension, the package version that wrote it,
                   the format version, the SHA-256 of the parameters file, the SHA-256 of
                   the spec itself (and a short digest of each of its keys), and
                   optionally the learner's config and free-form metadata;
  params.msgpack   every array (scorer and reward-model parameters, the reward model's
                   position weights), serialised with ``flax.serialization`` (msgpack;
                   arrays are stored bit for bit, so a loaded policy ranks exactly as the
                   saved one).

[`save_policy`][save_policy] writes both files atomically, the parameters first; [`load_policy`][load_policy]
checks the format version, both checksums (a spec edited by hand, or a checksum removed
from it, is refused unless ``trust_edited_spec=True``), the spec's fields against each
other (k, L, D; never overridable) and the parameters' shapes against the spec (a
``jax.eval_shape`` of the rebuilt modules' ``init``), and names the offending file (and
field) in every error. Supported: [`PLPolicy`][opl_rank.opl.policies.PLPolicy],
[`RegressionPolicy`][opl_rank.opl.policies.RegressionPolicy] and [`TwoStagePolicy`][opl_rank.opl.policies.TwoStagePolicy]
over the scorers of [`opl_rank.scorers.make_scorer`][opl_rank.scorers.make_scorer] and the reward models of
[`opl_rank.opl.reward_models.fit_reward_model`][opl_rank.opl.reward_models.fit_reward_model] (any kind), and any policy class
registered with [`register_policy_class`][register_policy_class]. The layout is described in
docs/data_format.md.

Each policy class writes and reads its own spec (``to_spec(writer)`` returning
[`PolicyParts`][opl_rank.opl.policies.PolicyParts], the classmethod ``from_spec(spec, arrays,
reader)``); this module only keeps the registry of spec names (``"class"`` in the spec)
and the helpers for nested parts: [`SpecWriter`][SpecWriter] and [`SpecReader`][SpecReader] save and
rebuild policies (a two-stage policy's first stage is a saved policy spec of its own),
scorers and reward models.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from typing import Any, TypeGuard

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from opl_rank.io.atomic import atomic_write, atomic_write_text
from opl_rank.opl.policies import PLPolicy, PolicyParts, RegressionPolicy, TwoStagePolicy
from opl_rank.opl.reward_models import RewardModel, _SlotValues
from opl_rank.scorers import ActionScorer, ItemFeatureScorer

__all__ = [
    "save_policy",
    "load_policy",
    "load_policy_and_spec",
    "read_policy_spec",
    "EditedPolicyWarning",
    "check_context_dim",
    "register_policy_class",
    "policy_classes",
    "SpecWriter",
    "SpecReader",
    "SPEC_FILE",
    "PARAMS_FILE",
    "FORMAT",
    "FORMAT_VERSION",
]

SPEC_FILE = "policy.json"
PARAMS_FILE = "params.msgpack"
FORMAT = "opl_rank.policy"
# major.minor: another major is refused; a minor adds keys that older readers of the same
# major ignore. 1.1 added spec_sha256 and field_sha256: this reader requires them (a 1.0
# file is refused with how to proceed: save it again, or trust_edited_spec=True).
FORMAT_VERSION = "1.1"
# The keys the spec's own checksum leaves out (itself) and the per-key digests' length.
_SPEC_HASH_KEY = "spec_sha256"
_FIELD_HASH_KEY = "field_sha256"
_FIELD_DIGEST_CHARS = 16
_OVERRIDE = "trust_edited_spec=True (opl-rank: --trust-edited-policy)"


class EditedPolicyWarning(UserWarning):
    """A saved policy whose spec fails its integrity check was loaded anyway
    (``trust_edited_spec=True``)."""


_SCORERS: dict[str, type[nn.Module]] = {"ActionScorer": ActionScorer, "ItemFeatureScorer": ItemFeatureScorer}

# spec name ("class" in policy.json) -> policy class, in registration order
_POLICY_CLASSES: dict[str, type[Any]] = {}


# -- the registry of policy classes ----------------------------------------------------


def register_policy_class(cls: type | None = None, *, name: str | None = None, replace: bool = False) -> Any:
    """Let [`save_policy`][save_policy] and [`load_policy`][load_policy] handle the policy class ``cls``.

    Usable as a decorator (``@register_policy_class``) or a call. The class provides
    ``to_spec(self, writer) -> PolicyParts`` and the classmethod ``from_spec(spec, arrays,
    reader)`` ([`RankingPolicy`][opl_rank.opl.policies.RankingPolicy]); it is saved under ``name``
    (default: its ``spec_name`` attribute, else its ``__name__``), the spec's ``"class"``.

    Args:
      cls: the class (omitted: a decorator is returned).
      name: the stable spec name.
      replace: allow another class to take a registered name.

    Returns:
      ``cls`` (or the decorator).

    Raises:
      TypeError: ``cls`` lacks ``to_spec`` or ``from_spec``.
      ValueError: an empty name, or a name taken by another class (unless ``replace``).
    """

    def add(cls: type) -> type:
        spec_name = name if name is not None else getattr(cls, "spec_name", None) or getattr(cls, "__name__", None)
        if not isinstance(spec_name, str) or not spec_name:
            raise ValueError(f"register_policy_class: the spec name must be a non-empty string, got {spec_name!r}")
        missing = [m for m in ("to_spec", "from_spec") if not callable(getattr(cls, m, None))]
        if missing:
            raise TypeError(
                f"register_policy_class: {getattr(cls, '__name__', cls)!r} lacks {' and '.join(missing)} "
                "(see opl_rank.opl.policies.RankingPolicy)"
            )
        taken = _POLICY_CLASSES.get(spec_name)
        if taken is not None and taken is not cls and not replace:
            raise ValueError(
                f"policy class name {spec_name!r} is already registered (by {taken.__module__}.{taken.__qualname__})"
            )
        _POLICY_CLASSES[spec_name] = cls
        return cls

    return add if cls is None else add(cls)


def policy_classes() -> dict[str, type]:
    """The registered policy classes by spec name (a copy)."""
    return dict(_POLICY_CLASSES)


def _spec_name(policy: Any) -> str | None:
    for spec_name, cls in _POLICY_CLASSES.items():
        if type(policy) is cls:
            return spec_name
    return None


def _known() -> str:
    return ", ".join(_POLICY_CLASSES)


# -- saving ----------------------------------------------------------------------------


def save_policy(policy: Any, directory: str | os.PathLike, *, config: Any = None, metadata: dict | None = None) -> str:
    """Save ``policy`` to ``directory`` (created if needed; its two files are replaced).

    Args:
      policy: a PLPolicy, RegressionPolicy or TwoStagePolicy, or an instance of a class
        registered with [`register_policy_class`][register_policy_class].
      directory: where to write ``policy.json`` and ``params.msgpack``.
      config: optionally the [`LearnerConfig`][opl_rank.opl.learners.LearnerConfig] (or any dataclass
        or JSON-able dict) that produced the policy; stored in the spec for reference.
      metadata: optionally a JSON-able dict stored as is (data file, seed, ...).

    The spec records the SHA-256 of the parameters file and of itself (``spec_sha256``,
    with a short digest per key in ``field_sha256``): [`load_policy`][load_policy] refuses a spec
    edited afterwards.

    Returns:
      The path of the spec file.

    Raises:
      TypeError: a policy, scorer or reward model this module cannot rebuild, a config
        that cannot be written as JSON, or a ``to_spec`` whose sizes (k, L, D) contradict
        each other.
    """
    from opl_rank import __version__

    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"{directory}: exists and is not a directory")
    parts = SpecWriter().policy(policy)
    payload = serialization.msgpack_serialize(parts.arrays)
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "opl_rank_version": __version__,
        "policy": parts.spec,
        "n_items": parts.n_items,
        "n_slots": int(policy.n_slots),
        "k": parts.k,
        "context_dim": parts.context_dim,
        "params_file": PARAMS_FILE,
        "params_sha256": hashlib.sha256(payload).hexdigest(),
        "config": _jsonable(config, "config"),
        "metadata": _jsonable(metadata, "metadata"),
    }
    document[_FIELD_HASH_KEY] = _field_digests(document)
    document[_SPEC_HASH_KEY] = _spec_digest(document)
    problems = _consistency_problems(document)
    if problems:  # a to_spec whose sizes contradict each other: refused now, not at loading
        raise TypeError(f"save_policy: the policy's spec is inconsistent: {'; '.join(problems)}")
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    os.makedirs(directory, exist_ok=True)
    atomic_write(os.path.join(directory, PARAMS_FILE), lambda f: f.write(payload))
    spec_path = os.path.join(directory, SPEC_FILE)
    atomic_write_text(spec_path, text)
    return spec_path


def _jsonable(value: Any, what: str) -> Any:
    if value is None:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"save_policy: {what} must be JSON-serialisable (a dataclass or dict of plain values): {err}"
        ) from err


def _host(tree: Any) -> Any:
    return jax.tree.map(np.asarray, serialization.to_state_dict(tree))


def _scorer_spec(module: Any, params: Any) -> tuple[dict, int]:
    """The scorer's class and fields, and the context dimension its parameters imply."""
    name = type(module).__name__
    if name not in _SCORERS or type(module) is not _SCORERS[name]:
        raise TypeError(
            f"save_policy rebuilds scorers {sorted(_SCORERS)} (opl_rank.scorers.make_scorer), got {type(module).__name__}"
        )
    spec: dict[str, Any] = {"class": name, "n_items": int(module.n_items), "hidden": [int(h) for h in module.hidden]}
    if name == "ItemFeatureScorer":
        spec["n_features"] = int(module.n_features)
        return spec, int(module.n_items) * int(module.n_features)
    return spec, int(np.shape(params["Dense_0"]["kernel"])[0])


def _reward_spec(model: Any) -> tuple[dict, Any, int]:
    if type(model) is not RewardModel or type(model.module) is not _SlotValues:
        raise TypeError(
            f"save_policy rebuilds reward models of opl_rank.opl.reward_models.fit_reward_model, got {type(model).__name__}"
        )
    module = model.module
    fields = {
        "n_items": int(module.n_items),
        "hidden": [int(h) for h in module.hidden],
        "pairwise": bool(module.pairwise),
        "item_feature_dim": None if module.item_feature_dim is None else int(module.item_feature_dim),
        "prefix_slots": int(module.prefix_slots),
    }
    spec = {
        "kind": model.kind,
        "module": fields,
        "n_slots": int(model.n_slots),
        "max_enumerated": int(model.max_enumerated),
        "beam_width": int(model.beam_width),
    }
    if module.item_feature_dim is not None:
        context_dim = int(module.n_items) * int(module.item_feature_dim)
    else:
        context_dim = int(np.shape(model.params["params"]["item_head"]["Dense_0"]["kernel"])[0])
    arrays = {"params": _host(model.params), "position_weight": np.asarray(model.position_weight, np.float32)}
    return spec, arrays, context_dim


class SpecWriter:
    """What a policy's ``to_spec(writer)`` saves its nested parts with."""

    def policy(self, policy: Any) -> PolicyParts:
        """A (nested) policy's [`PolicyParts`][opl_rank.opl.policies.PolicyParts], its spec led by
        ``"class"`` (its registered name).

        Raises:
          TypeError: an unregistered policy class, or a ``to_spec`` that does not return
            PolicyParts of a dict spec and int sizes.
        """
        spec_name = _spec_name(policy)
        if spec_name is None:
            raise TypeError(
                f"save_policy saves PLPolicy, RegressionPolicy and TwoStagePolicy and the classes registered "
                f"with opl_rank.io.persistence.register_policy_class (registered: {_known()}), "
                f"got {type(policy).__name__}"
            )
        parts = policy.to_spec(self)
        if not isinstance(parts, tuple) or len(parts) != len(PolicyParts._fields):
            raise TypeError(
                f"save_policy: {type(policy).__name__}.to_spec must return PolicyParts"
                f"{PolicyParts._fields}, got {type(parts).__name__}"
            )
        parts = PolicyParts(*parts)
        if not isinstance(parts.spec, dict) or "class" in parts.spec:
            raise TypeError(f"save_policy: {type(policy).__name__}.to_spec's spec must be a dict without a 'class' key")
        for field in ("n_items", "context_dim", "k"):
            value = getattr(parts, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"save_policy: {type(policy).__name__}.to_spec's {field} must be an int, got {value!r}")
        head: dict[str, Any] = {"class": spec_name}
        module = type(policy).__module__
        if module.split(".")[0] != "opl_rank":  # a plugin's class: the loader's error names its module
            head["class_module"] = module
        return PolicyParts(
            {**head, **parts.spec}, parts.arrays, int(parts.n_items), int(parts.context_dim), int(parts.k)
        )

    def scorer(self, module: Any, params: Any) -> tuple[dict, int]:
        """A scorer's spec (class and fields) and the context dimension its parameters imply
        (``params``: the module's ``"params"`` collection)."""
        return _scorer_spec(module, params)

    def reward_model(self, model: Any) -> tuple[dict, Any, int]:
        """A reward model's spec, its arrays and its context dimension."""
        return _reward_spec(model)

    @staticmethod
    def arrays(tree: Any) -> Any:
        """A pytree of parameters as nested dicts of NumPy arrays (what msgpack stores)."""
        return _host(tree)


# -- loading ---------------------------------------------------------------------------


def read_policy_spec(directory: str | os.PathLike, *, trust_edited_spec: bool = False) -> dict:
    """The spec (``policy.json``) of a saved policy, checked: its format version, its
    integrity and its fields' consistency.

    Integrity: the spec must carry ``params_sha256`` and ``spec_sha256`` (the SHA-256 of
    its canonical JSON, every key but ``spec_sha256`` itself), and the latter must match:
    an edited spec is refused, naming the keys that changed (``field_sha256``, a short
    digest per key, tells which). ``trust_edited_spec=True`` reads it anyway, with an
    [`EditedPolicyWarning`][EditedPolicyWarning]. A format 1.0 file (written before specs had checksums)
    fails the same way: save it again, or trust it.

    Consistency (never overridable, checksums or not): ``k``, ``n_slots`` (L), ``n_items``
    (D) and ``context_dim`` are ints with ``0 <= k <= L <= D``, and for the built-in
    classes they equal what the nested parts say (a PLPolicy's ``n_slots``, a reward
    model's ``n_slots``, a two-stage policy's first-stage ``n_slots`` = k, every
    ``n_items``).

    Args:
      directory: a directory written by [`save_policy`][save_policy].
      trust_edited_spec: warn instead of refusing when the integrity check fails.

    Raises:
      FileNotFoundError: no such directory or no spec file in it (naming the path).
      ValueError: naming the file (and the field): not JSON, not a policy spec, another
        major format version, a missing or mismatched checksum, inconsistent fields.
    """
    return _read_spec(directory, trust_edited_spec, stacklevel=3)


def _read_spec(directory: str | os.PathLike, trust_edited_spec: bool, stacklevel: int) -> dict:
    directory = os.fspath(directory)
    path = os.path.join(directory, SPEC_FILE)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"{directory}: no such policy directory" + (" (it is a file)" if os.path.exists(directory) else "")
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (not a directory written by save_policy?)")
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable policy spec (corrupt JSON?): {err}") from err
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise ValueError(f'{path}: not a policy spec written by save_policy (no "format": "{FORMAT}")')
    version = str(spec.get("format_version", ""))
    if version.split(".")[0] != FORMAT_VERSION.split(".")[0]:
        raise ValueError(
            f"{path}: policy format version {version!r} (written by opl_rank "
            f"{spec.get('opl_rank_version', '?')}); this opl_rank reads format version "
            f"{FORMAT_VERSION.split('.')[0]}.x -- save the policy again with this version"
        )
    edited = _integrity_problem(spec)
    problems = _consistency_problems(spec)
    if problems:
        detail = f" (and {edited})" if edited else ""
        raise ValueError(f"{path}: inconsistent policy spec: {'; '.join(problems)}{detail}")
    if edited:
        if not trust_edited_spec:
            raise ValueError(
                f"{path}: {edited}; save the policy again (docs/data_format.md, 'Saved policies'), or pass "
                f"{_OVERRIDE} to load it as it is"
            )
        warnings.warn(
            f"{path}: {edited}; loading it anyway (trust_edited_spec)", EditedPolicyWarning, stacklevel=stacklevel
        )
    return spec


def load_policy(directory: str | os.PathLike, *, trust_edited_spec: bool = False) -> Any:
    """Rebuild a policy written by [`save_policy`][save_policy].

    Args:
      directory: the policy's directory.
      trust_edited_spec: load a spec that fails its integrity check (edited by hand, a
        checksum removed, a format 1.0 file) with an [`EditedPolicyWarning`][EditedPolicyWarning] instead
        of refusing it; inconsistent fields are refused all the same.

    Raises:
      FileNotFoundError: a missing directory or file (named).
      ValueError: naming the file: a corrupt or foreign spec, another major format version,
        a spec edited after saving or without its checksums (see
        [`read_policy_spec`][read_policy_spec]), inconsistent fields, a parameters file that does
        not match the spec (checksum, structure or shapes).
    """
    return _load(directory, trust_edited_spec, stacklevel=4)[0]


def load_policy_and_spec(directory: str | os.PathLike, *, trust_edited_spec: bool = False) -> tuple[Any, dict]:
    """[`load_policy`][load_policy]'s policy and the checked spec it was rebuilt from
    ([`read_policy_spec`][read_policy_spec]'s dict), from one reading of ``policy.json``."""
    return _load(directory, trust_edited_spec, stacklevel=4)


def _load(directory: str | os.PathLike, trust_edited_spec: bool, stacklevel: int) -> tuple[Any, dict]:
    spec = _read_spec(directory, trust_edited_spec, stacklevel)
    directory = os.fspath(directory)
    spec_path = os.path.join(directory, SPEC_FILE)
    name = str(spec.get("params_file", PARAMS_FILE))
    if os.path.basename(name) != name or name in ("", ".", ".."):  # the parameters live beside policy.json
        raise ValueError(f"{spec_path}: params_file must be a file name in the policy's folder, got {name!r}")
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (the parameters named by {spec_path})")
    with open(path, "rb") as f:
        payload = f.read()
    expected = spec.get("params_sha256")
    if expected is not None and hashlib.sha256(payload).hexdigest() != expected:
        raise ValueError(f"{path}: checksum does not match {spec_path} (corrupt, or from another save?)")
    try:
        arrays = serialization.msgpack_restore(payload)
    except Exception as err:  # msgpack raises its own exception types
        raise ValueError(f"{path}: not a readable parameters file ({type(err).__name__}: {err})") from err
    try:
        policy = SpecReader(int(spec["context_dim"]), path).policy(spec["policy"], arrays)
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{spec_path}: malformed policy spec ({type(err).__name__}: {err})") from err
    problems = _rebuilt_problems(policy, spec)
    if problems:
        raise ValueError(f"{spec_path}: inconsistent policy spec: {'; '.join(problems)}")
    return policy, spec


# -- the spec's integrity and consistency ----------------------------------------------


def _canonical(value: Any) -> bytes:
    """The JSON text a checksum is taken over: sorted keys, no whitespace, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _field_digests(document: dict) -> dict[str, str]:
    """A short SHA-256 prefix per top-level key (but the checksums): what names an edit."""
    return {
        key: hashlib.sha256(_canonical(value)).hexdigest()[:_FIELD_DIGEST_CHARS]
        for key, value in document.items()
        if key not in (_SPEC_HASH_KEY, _FIELD_HASH_KEY)
    }


def _spec_digest(document: dict) -> str:
    """The SHA-256 of the spec: every key but ``spec_sha256`` (``field_sha256`` included)."""
    return hashlib.sha256(_canonical({k: v for k, v in document.items() if k != _SPEC_HASH_KEY})).hexdigest()


def _integrity_problem(spec: dict) -> str | None:
    """What is wrong with the spec's checksums (None: they are there and match)."""
    missing = [key for key in ("params_sha256", _SPEC_HASH_KEY) if not isinstance(spec.get(key), str)]
    if _SPEC_HASH_KEY in missing and str(spec.get("format_version")) == "1.0":
        return (
            f"written in format 1.0 by opl_rank {spec.get('opl_rank_version', '?')}, before saved specs had "
            f"a checksum (no {_SPEC_HASH_KEY!r}): edits to it cannot be detected"
        )
    if missing:
        what = " and ".join(repr(key) for key in missing)
        cannot = "edits to it cannot be detected" if _SPEC_HASH_KEY in missing else "the parameters cannot be checked"
        return f"has no {what} (removed after saving?): {cannot}"
    try:
        digest = _spec_digest(spec)
    except ValueError:  # a NaN or inf written by hand
        digest = ""
    if digest == spec[_SPEC_HASH_KEY]:
        return None
    saved = spec.get(_FIELD_HASH_KEY)
    changed: list[str] = []
    if isinstance(saved, dict):
        try:
            now = _field_digests(spec)
        except ValueError:
            now = {}
        changed = sorted(key for key in set(saved) | set(now) if saved.get(key) != now.get(key))
    if changed:
        listed = ", ".join(repr(key) for key in changed)
        return f"was edited after saving: {listed} {'differs' if len(changed) == 1 else 'differ'} from what was saved"
    return f"was edited after saving ({_SPEC_HASH_KEY} does not match its contents)"


def _int_field(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _consistency_problems(spec: dict) -> list[str]:
    """How the spec's top-level sizes contradict each other or its built-in parts."""
    problems: list[str] = []
    header: dict[str, int] = {}
    for key in ("n_items", "n_slots", "k", "context_dim"):
        value = spec.get(key)
        if not _int_field(value):
            problems.append(f"{key!r} must be an int, got {value!r}")
        else:
            header[key] = value
    if problems:
        return problems
    n_items, n_slots, k = header["n_items"], header["n_slots"], header["k"]
    if n_items < 1:
        problems.append(f"'n_items' is {n_items}, not a positive number of items")
    if not 1 <= n_slots <= max(n_items, 1):
        problems.append(f"'n_slots' (L) is {n_slots}, outside [1, n_items={n_items}]")
    if not 0 <= k <= n_slots:
        problems.append(f"'k' is {k}, outside [0, n_slots={n_slots}]")
    if header["context_dim"] < 1:
        problems.append(f"'context_dim' is {header['context_dim']}, not a positive number of columns")
    policy = spec.get("policy")
    if not isinstance(policy, dict):
        return problems + [f"'policy' must be an object, got {type(policy).__name__}"]
    try:
        sizes = _part_sizes(policy, "policy", problems)
    except (KeyError, TypeError, AttributeError) as err:  # a missing or mistyped field
        return problems + [f"malformed 'policy' ({type(err).__name__}: {err})"]
    if sizes is None:  # a plugin's class: checked once rebuilt (_rebuilt_problems)
        return problems
    for key, (value, where) in sizes.items():
        if value != header[key]:
            problems.append(f"{key!r} is {header[key]} but {where} is {value}")
    return problems


def _size(spec: dict, key: str, where: str, problems: list[str]) -> int:
    value = spec[key]
    if not _int_field(value):
        problems.append(f"{where}.{key} must be an int, got {value!r}")
        return -1
    return int(value)


def _reward_sizes(spec: dict, where: str, problems: list[str]) -> tuple[int, int, int]:
    """A reward model's (n_items, n_slots, prefix_slots)."""
    module = spec["module"]
    n_items = _size(module, "n_items", f"{where}.module", problems)
    n_slots = _size(spec, "n_slots", where, problems)
    prefix = _size(module, "prefix_slots", f"{where}.module", problems)
    if prefix > n_slots:
        problems.append(f"{where}.module.prefix_slots is {prefix}, more than its n_slots={n_slots}")
    return n_items, n_slots, prefix


def _part_sizes(policy: dict, where: str, problems: list[str]) -> dict[str, tuple[int, str]] | None:
    """What a built-in policy spec's parts say n_items, n_slots and k are (with where they
    say it); appends contradictions between the parts to ``problems``. None: not built in."""
    name = policy["class"]
    if name == "PLPolicy" and _POLICY_CLASSES.get(name) is PLPolicy:
        n_items = _size(policy["scorer"], "n_items", f"{where}.scorer", problems)
        n_slots = _size(policy, "n_slots", where, problems)
        return {
            "n_items": (n_items, f"{where}.scorer.n_items"),
            "n_slots": (n_slots, f"{where}.n_slots"),
            "k": (n_slots, f"{where}.n_slots (a PLPolicy samples all its slots)"),
        }
    if name == "RegressionPolicy" and _POLICY_CLASSES.get(name) is RegressionPolicy:
        n_items, n_slots, _ = _reward_sizes(policy["reward_model"], f"{where}.reward_model", problems)
        return {
            "n_items": (n_items, f"{where}.reward_model.module.n_items"),
            "n_slots": (n_slots, f"{where}.reward_model.n_slots"),
            "k": (0, "a RegressionPolicy's k (it samples no prefix)"),
        }
    if name == "TwoStagePolicy" and _POLICY_CLASSES.get(name) is TwoStagePolicy:
        first = policy["first_stage"]
        if first.get("class") != "PLPolicy":
            problems.append(f"{where}.first_stage must be a PLPolicy, got {first.get('class')!r}")
            return None
        inner = _part_sizes(first, f"{where}.first_stage", problems)
        assert inner is not None  # a PLPolicy
        n_items, n_slots, prefix = _reward_sizes(policy["reward_model"], f"{where}.reward_model", problems)
        k = inner["n_slots"][0]
        if inner["n_items"][0] != n_items:
            problems.append(
                f"{inner['n_items'][1]} is {inner['n_items'][0]} but {where}.reward_model.module.n_items is {n_items}"
            )
        if k > n_slots:
            problems.append(f"{where}.first_stage.n_slots (k) is {k}, more than {where}.reward_model.n_slots={n_slots}")
        if prefix > k:
            problems.append(
                f"{where}.reward_model.module.prefix_slots is {prefix}, more than the first stage's k={k} "
                "(a two-step f_hat completes prefixes of at least that length)"
            )
        return {
            "n_items": (n_items, f"{where}.reward_model.module.n_items"),
            "n_slots": (n_slots, f"{where}.reward_model.n_slots"),
            "k": (k, f"{where}.first_stage.n_slots (the first stage's k)"),
        }
    return None


def _rebuilt_problems(policy: Any, spec: dict) -> list[str]:
    """The rebuilt policy's own sizes (its ``to_spec``) against the spec's top level: the
    consistency check of any class, plugins' included."""
    try:
        parts = SpecWriter().policy(policy)
        n_slots = int(policy.n_slots)
    except (TypeError, ValueError, AttributeError):  # a class that loads but cannot save: nothing to compare
        return []
    found = {"n_items": parts.n_items, "n_slots": n_slots, "k": parts.k, "context_dim": parts.context_dim}
    return [
        f"{key!r} is {spec[key]} but the rebuilt {type(policy).__name__} has {key}={value}"
        for key, value in found.items()
        if spec.get(key) != value
    ]


def check_context_dim(spec: dict, context_dim: int) -> None:
    """Raise a ValueError unless contexts of ``context_dim`` columns suit the saved policy
    (equal to the training dimension; at least ``n_items * n_features`` for item-feature
    scorers, whose further columns are ignored)."""
    expected = int(spec["context_dim"])
    policy = spec["policy"]
    scorer = _first_part(policy, "scorer")  # a two-stage (or plugin) policy's own nested parts
    reward = _first_part(policy, "reward_model")
    item_features = (scorer or {}).get("class") == "ItemFeatureScorer" or (
        scorer is None and reward is not None and reward["module"].get("item_feature_dim") is not None
    )
    if item_features and context_dim < expected:
        raise ValueError(
            f"contexts have {context_dim} columns; the policy reads the first {expected} (n_items * n_features)"
        )
    if not item_features and context_dim != expected:
        raise ValueError(f"contexts have {context_dim} columns; the policy was trained on {expected}")


def _first_part(spec: Any, name: str) -> dict | None:
    """The first ``name`` entry of a (nested) policy spec, depth first in key order."""
    if not isinstance(spec, dict):
        return None
    if isinstance(spec.get(name), dict):
        return spec[name]
    for value in spec.values():
        found = _first_part(value, name)
        if found is not None:
            return found
    return None


class SpecReader:
    """What a policy class's ``from_spec(spec, arrays, reader)`` rebuilds its nested parts
    with; errors name the parameters file.

    Attributes:
      context_dim: dx, the saved context dimension (the modules' input width).
      path: the parameters file (named in errors).
    """

    def __init__(self, context_dim: int, path: str) -> None:
        self.context_dim = context_dim
        self.path = path

    def policy(self, spec: dict, arrays: Any) -> Any:
        """The policy of a (nested) spec, by its ``"class"``."""
        name = spec["class"]
        cls = _POLICY_CLASSES.get(name)
        if cls is None:
            hint = (
                f"; it was saved from module {spec['class_module']!r}: import it first"
                if spec.get("class_module")
                else ""
            )
            raise ValueError(f"unknown policy class {name!r} (known: {_known()}){hint}")
        return cls.from_spec({k: v for k, v in spec.items() if k not in ("class", "class_module")}, arrays, self)

    def part(self, arrays: Any, name: str) -> Any:
        """``arrays[name]`` (a ValueError naming the file when it is missing)."""
        return _part(arrays, name, self.path)

    def scorer(self, spec: dict, params: Any) -> tuple[Any, Any]:
        """A scorer module and its parameters (checked against the module's shapes)."""
        scorer = dict(spec)
        cls = scorer.pop("class")
        if cls not in _SCORERS:
            raise ValueError(f"unknown scorer class {cls!r} (known: {sorted(_SCORERS)})")
        scorer["hidden"] = tuple(scorer.get("hidden", ()))
        module = _SCORERS[cls](**scorer)
        template = jax.eval_shape(
            module.init, jax.random.key(0), jax.ShapeDtypeStruct((1, self.context_dim), jnp.float32)
        )
        return module, self.restore(template, params, "scorer")

    def reward_model(self, spec: dict, arrays: Any) -> RewardModel:
        """A reward model of [`fit_reward_model`][opl_rank.opl.reward_models.fit_reward_model]."""
        return _build_reward(spec, arrays, self.context_dim, self.path)

    def restore(self, template: Any, params: Any, what: str) -> Any:
        """``params`` as JAX arrays, checked against ``template`` (``jax.eval_shape`` of an init)."""
        return _restore(template, params, self.path, what)


def _part(arrays: Any, name: str, path: str) -> Any:
    if not isinstance(arrays, dict) or name not in arrays:
        raise ValueError(f"{path}: lacks the {name!r} parameters the spec names")
    return arrays[name]


def _build_reward(spec: dict, arrays: Any, context_dim: int, path: str) -> RewardModel:
    fields = dict(spec["module"])
    fields["hidden"] = tuple(fields.get("hidden", ()))
    module = _SlotValues(**fields)
    n_slots = int(spec["n_slots"])
    template = jax.eval_shape(
        module.init,
        jax.random.key(0),
        jax.ShapeDtypeStruct((1, context_dim), jnp.float32),
        jax.ShapeDtypeStruct((1, n_slots), jnp.int32),
    )
    params = _restore(template, _part(arrays, "params", path), path, "reward model")
    weight = jnp.asarray(_part(arrays, "position_weight", path))
    if weight.shape != (n_slots,):
        raise ValueError(
            f"{path}: the reward model's position_weight has shape {weight.shape}, the spec says ({n_slots},)"
        )
    return RewardModel(spec["kind"], module, params, weight, int(spec["max_enumerated"]), int(spec["beam_width"]))


def _restore(template: Any, params: Any, path: str, what: str) -> Any:
    """``params`` as JAX arrays, after checking them against the module's shapes."""
    want = jax.tree_util.tree_flatten_with_path(template)[0]
    got_def: Any  # the treedef (jaxlib's PyTreeDef has no type here)
    try:
        got_leaves, got_def = jax.tree.flatten(params)
    except Exception as err:  # pragma: no cover - msgpack gives dicts of arrays
        raise ValueError(f"{path}: unreadable {what} parameters ({err})") from err
    if got_def != jax.tree.structure(template):
        names = sorted(jax.tree_util.keystr(p) for p, _ in want)
        raise ValueError(f"{path}: the {what} parameters do not match the spec's module (expected {names})")
    for (key_path, expected), value in zip(want, got_leaves):
        value = np.asarray(value)
        if value.shape != expected.shape or value.dtype != expected.dtype:
            raise ValueError(
                f"{path}: {what} parameter {jax.tree_util.keystr(key_path)} has {value.dtype} {value.shape}, "
                f"the spec's module needs {expected.dtype} {expected.shape}"
            )
    return jax.tree.map(jnp.asarray, params)


for _cls in (PLPolicy, RegressionPolicy, TwoStagePolicy):
    register_policy_class(_cls)
