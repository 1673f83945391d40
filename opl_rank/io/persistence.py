"""Saving and loading ranking policies: a directory with a JSON spec and the parameters.

A saved policy is a directory holding

  policy.json      what to rebuild: the policy class, its scorer (flax module class and
                   fields), its reward model (kind, module fields, completion settings),
                   k, n_items, L, the context dimension, the package version that wrote it,
                   the format version, the SHA-256 of the parameters file, and optionally
                   the learner's config and free-form metadata;
  params.msgpack   every array (scorer and reward-model parameters, the reward model's
                   position weights), serialised with ``flax.serialization`` (msgpack;
                   arrays are stored bit for bit, so a loaded policy ranks exactly as the
                   saved one).

:func:`save_policy` writes both files atomically, the parameters first; :func:`load_policy`
checks the format version, the checksum and the parameters' shapes against the spec (a
``jax.eval_shape`` of the rebuilt modules' ``init``) and names the offending file in every
error. Supported: :class:`~opl_rank.opl.policies.PLPolicy`,
:class:`~opl_rank.opl.policies.RegressionPolicy` and :class:`~opl_rank.opl.policies.TwoStagePolicy`
over the scorers of :func:`opl_rank.scorers.make_scorer` and the reward models of
:func:`opl_rank.opl.reward_models.fit_reward_model` (any kind). The layout is described in
docs/data_format.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from opl_rank.io.atomic import atomic_write, atomic_write_text
from opl_rank.opl.policies import PLPolicy, RegressionPolicy, TwoStagePolicy
from opl_rank.opl.reward_models import RewardModel, _SlotValues
from opl_rank.scorers import ActionScorer, ItemFeatureScorer

__all__ = ["save_policy", "load_policy", "read_policy_spec", "check_context_dim", "SPEC_FILE", "PARAMS_FILE",
           "FORMAT", "FORMAT_VERSION"]

SPEC_FILE = "policy.json"
PARAMS_FILE = "params.msgpack"
FORMAT = "opl_rank.policy"
FORMAT_VERSION = "1.0"  # major.minor: another major is refused; minors only add optional keys

_SCORERS = {"ActionScorer": ActionScorer, "ItemFeatureScorer": ItemFeatureScorer}


# -- saving ----------------------------------------------------------------------------


def save_policy(policy: Any, directory: str | os.PathLike, *, config: Any = None, metadata: dict | None = None) -> str:
    """Save ``policy`` to ``directory`` (created if needed; its two files are replaced).

    Args:
      policy: a PLPolicy, RegressionPolicy or TwoStagePolicy.
      directory: where to write ``policy.json`` and ``params.msgpack``.
      config: optionally the :class:`~opl_rank.opl.learners.LearnerConfig` (or any dataclass
        or JSON-able dict) that produced the policy; stored in the spec for reference.
      metadata: optionally a JSON-able dict stored as is (data file, seed, ...).

    Returns:
      The path of the spec file.

    Raises:
      TypeError: a policy, scorer or reward model this module cannot rebuild, or a config
        that cannot be written as JSON.
    """
    from opl_rank import __version__

    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"{directory}: exists and is not a directory")
    spec, arrays = _policy_spec(policy)
    payload = serialization.msgpack_serialize(arrays)
    n_slots = int(policy.n_slots)
    k = {"PLPolicy": n_slots, "RegressionPolicy": 0, "TwoStagePolicy": spec.get("first_stage", {}).get("n_slots")}[spec["class"]]
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "opl_rank_version": __version__,
        "policy": spec,
        "n_items": spec.pop("_n_items"),
        "n_slots": n_slots,
        "k": k,
        "context_dim": spec.pop("_context_dim"),
        "params_file": PARAMS_FILE,
        "params_sha256": hashlib.sha256(payload).hexdigest(),
        "config": _jsonable(config, "config"),
        "metadata": _jsonable(metadata, "metadata"),
    }
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
        raise TypeError(f"save_policy: {what} must be JSON-serialisable (a dataclass or dict of plain values): {err}") from err


def _host(tree: Any) -> Any:
    return jax.tree.map(np.asarray, serialization.to_state_dict(tree))


def _scorer_spec(module: Any, params: Any) -> tuple[dict, int]:
    """The scorer's class and fields, and the context dimension its parameters imply."""
    name = type(module).__name__
    if name not in _SCORERS or type(module) is not _SCORERS[name]:
        raise TypeError(f"save_policy rebuilds scorers {sorted(_SCORERS)} (opl_rank.scorers.make_scorer), got {type(module).__name__}")
    spec: dict[str, Any] = {"class": name, "n_items": int(module.n_items), "hidden": [int(h) for h in module.hidden]}
    if name == "ItemFeatureScorer":
        spec["n_features"] = int(module.n_features)
        return spec, int(module.n_items) * int(module.n_features)
    return spec, int(np.shape(params["Dense_0"]["kernel"])[0])


def _pl_spec(policy: PLPolicy) -> tuple[dict, Any, int, int]:
    scorer, context_dim = _scorer_spec(policy.module, policy.params["params"])
    spec = {"class": "PLPolicy", "scorer": scorer, "n_slots": int(policy.n_slots)}
    return spec, {"scorer": _host(policy.params)}, scorer["n_items"], context_dim


def _reward_spec(model: Any) -> tuple[dict, Any, int]:
    if type(model) is not RewardModel or type(model.module) is not _SlotValues:
        raise TypeError(f"save_policy rebuilds reward models of opl_rank.opl.reward_models.fit_reward_model, got {type(model).__name__}")
    module = model.module
    fields = {"n_items": int(module.n_items), "hidden": [int(h) for h in module.hidden], "pairwise": bool(module.pairwise),
              "item_feature_dim": None if module.item_feature_dim is None else int(module.item_feature_dim),
              "prefix_slots": int(module.prefix_slots)}
    spec = {"kind": model.kind, "module": fields, "n_slots": int(model.n_slots),
            "max_enumerated": int(model.max_enumerated), "beam_width": int(model.beam_width)}
    if module.item_feature_dim is not None:
        context_dim = int(module.n_items) * int(module.item_feature_dim)
    else:
        context_dim = int(np.shape(model.params["params"]["item_head"]["Dense_0"]["kernel"])[0])
    arrays = {"params": _host(model.params), "position_weight": np.asarray(model.position_weight, np.float32)}
    return spec, arrays, context_dim


def _policy_spec(policy: Any) -> tuple[dict, Any]:
    if type(policy) is PLPolicy:
        spec, arrays, n_items, context_dim = _pl_spec(policy)
    elif type(policy) is RegressionPolicy:
        model, arrays, context_dim = _reward_spec(policy.reward_model)
        spec, arrays, n_items = {"class": "RegressionPolicy", "reward_model": model}, {"reward_model": arrays}, model["module"]["n_items"]
    elif type(policy) is TwoStagePolicy:
        if type(policy.first_stage) is not PLPolicy:
            raise TypeError(f"save_policy: a TwoStagePolicy's first stage must be a PLPolicy, got {type(policy.first_stage).__name__}")
        first, first_arrays, n_items, context_dim = _pl_spec(policy.first_stage)
        model, model_arrays, _ = _reward_spec(policy.reward_model)
        spec = {"class": "TwoStagePolicy", "first_stage": first, "reward_model": model,
                "n_samples": int(policy.n_samples), "max_enumerated": int(policy.max_enumerated)}
        arrays = {"first_stage": first_arrays, "reward_model": model_arrays}
    else:
        raise TypeError(f"save_policy saves PLPolicy, RegressionPolicy and TwoStagePolicy, got {type(policy).__name__}")
    spec["_n_items"], spec["_context_dim"] = n_items, context_dim
    return spec, arrays


# -- loading ---------------------------------------------------------------------------


def read_policy_spec(directory: str | os.PathLike) -> dict:
    """The spec (``policy.json``) of a saved policy, its format version checked.

    Raises:
      FileNotFoundError: no such directory or no spec file in it (naming the path).
      ValueError: naming the file: not JSON, not a policy spec, or another major format version.
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, SPEC_FILE)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such policy directory" + (" (it is a file)" if os.path.exists(directory) else ""))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (not a directory written by save_policy?)")
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable policy spec (corrupt JSON?): {err}") from err
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise ValueError(f"{path}: not a policy spec written by save_policy (no \"format\": \"{FORMAT}\")")
    version = str(spec.get("format_version", ""))
    if version.split(".")[0] != FORMAT_VERSION.split(".")[0]:
        raise ValueError(f"{path}: policy format version {version!r} (written by opl_rank "
                         f"{spec.get('opl_rank_version', '?')}); this opl_rank reads format version "
                         f"{FORMAT_VERSION.split('.')[0]}.x -- save the policy again with this version")
    return spec


def load_policy(directory: str | os.PathLike) -> Any:
    """Rebuild a policy written by :func:`save_policy`.

    Raises:
      FileNotFoundError: a missing directory or file (named).
      ValueError: naming the file: a corrupt or foreign spec, another major format version,
        a parameters file that does not match the spec (checksum, structure or shapes).
    """
    spec = read_policy_spec(directory)
    directory = os.fspath(directory)
    spec_path = os.path.join(directory, SPEC_FILE)
    path = os.path.join(directory, str(spec.get("params_file", PARAMS_FILE)))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (the parameters named by {spec_path})")
    with open(path, "rb") as f:
        payload = f.read()
    if spec.get("params_sha256") and hashlib.sha256(payload).hexdigest() != spec["params_sha256"]:
        raise ValueError(f"{path}: checksum does not match {spec_path} (corrupt, or from another save?)")
    try:
        arrays = serialization.msgpack_restore(payload)
    except Exception as err:  # msgpack raises its own exception types
        raise ValueError(f"{path}: not a readable parameters file ({type(err).__name__}: {err})") from err
    try:
        return _build_policy(spec["policy"], arrays, int(spec["context_dim"]), path)
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{spec_path}: malformed policy spec ({type(err).__name__}: {err})") from err


def check_context_dim(spec: dict, context_dim: int) -> None:
    """Raise a ValueError unless contexts of ``context_dim`` columns suit the saved policy
    (equal to the training dimension; at least ``n_items * n_features`` for item-feature
    scorers, whose further columns are ignored)."""
    expected = int(spec["context_dim"])
    policy = spec["policy"]
    scorer = (policy.get("first_stage") or policy).get("scorer")
    item_features = (scorer or {}).get("class") == "ItemFeatureScorer" or (
        scorer is None and policy["reward_model"]["module"].get("item_feature_dim") is not None)
    if item_features and context_dim < expected:
        raise ValueError(f"contexts have {context_dim} columns; the policy reads the first {expected} (n_items * n_features)")
    if not item_features and context_dim != expected:
        raise ValueError(f"contexts have {context_dim} columns; the policy was trained on {expected}")


def _build_policy(spec: dict, arrays: Any, context_dim: int, path: str) -> Any:
    cls = spec["class"]
    if cls == "PLPolicy":
        return _build_pl(spec, _part(arrays, "scorer", path), context_dim, path)
    if cls == "RegressionPolicy":
        return RegressionPolicy(_build_reward(spec["reward_model"], _part(arrays, "reward_model", path), context_dim, path))
    if cls == "TwoStagePolicy":
        first = _build_pl(spec["first_stage"], _part(_part(arrays, "first_stage", path), "scorer", path), context_dim, path)
        model = _build_reward(spec["reward_model"], _part(arrays, "reward_model", path), context_dim, path)
        return TwoStagePolicy(first, model, n_samples=int(spec["n_samples"]), max_enumerated=int(spec["max_enumerated"]))
    raise ValueError(f"unknown policy class {cls!r} (known: PLPolicy, RegressionPolicy, TwoStagePolicy)")


def _part(arrays: Any, name: str, path: str) -> Any:
    if not isinstance(arrays, dict) or name not in arrays:
        raise ValueError(f"{path}: lacks the {name!r} parameters the spec names")
    return arrays[name]


def _build_pl(spec: dict, params: Any, context_dim: int, path: str) -> PLPolicy:
    scorer = dict(spec["scorer"])
    cls = scorer.pop("class")
    if cls not in _SCORERS:
        raise ValueError(f"unknown scorer class {cls!r} (known: {sorted(_SCORERS)})")
    scorer["hidden"] = tuple(scorer.get("hidden", ()))
    module = _SCORERS[cls](**scorer)
    template = jax.eval_shape(module.init, jax.random.key(0), jax.ShapeDtypeStruct((1, context_dim), jnp.float32))
    return PLPolicy(module, _restore(template, params, path, "scorer"), int(spec["n_slots"]))


def _build_reward(spec: dict, arrays: Any, context_dim: int, path: str) -> RewardModel:
    fields = dict(spec["module"])
    fields["hidden"] = tuple(fields.get("hidden", ()))
    module = _SlotValues(**fields)
    n_slots = int(spec["n_slots"])
    template = jax.eval_shape(module.init, jax.random.key(0), jax.ShapeDtypeStruct((1, context_dim), jnp.float32),
                              jax.ShapeDtypeStruct((1, n_slots), jnp.int32))
    params = _restore(template, _part(arrays, "params", path), path, "reward model")
    weight = jnp.asarray(_part(arrays, "position_weight", path))
    if weight.shape != (n_slots,):
        raise ValueError(f"{path}: the reward model's position_weight has shape {weight.shape}, the spec says ({n_slots},)")
    return RewardModel(spec["kind"], module, params, weight, int(spec["max_enumerated"]), int(spec["beam_width"]))


def _restore(template: Any, params: Any, path: str, what: str) -> Any:
    """``params`` as JAX arrays, after checking them against the module's shapes."""
    want = jax.tree_util.tree_flatten_with_path(template)[0]
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
            raise ValueError(f"{path}: {what} parameter {jax.tree_util.keystr(key_path)} has {value.dtype} {value.shape}, "
                             f"the spec's module needs {expected.dtype} {expected.shape}")
    return jax.tree.map(jnp.asarray, params)
