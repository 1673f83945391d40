"""The environment protocol, and the registry the sweep reads.

An environment samples logged data from its logging policy and knows the ground truth:
``V(pi)``, ``V(pi_0)`` and ``V* = E_x max_a sum_l alpha_l q_l(x, a)``. The best ranking is
the reward model's job (``reward_model.best_rankings``); [`best_rankings_by_enumeration`][best_rankings_by_enumeration]
serves any reward model with ``expected_reward`` while the rankings can be enumerated.

A new simulator plugs into ``opl-rank sweep`` and ``opl-rank simulate`` by registration::

    from simulators import environments
    environments.register("my_env", environments.EnvironmentSpec(create=my_factory, options={"eta": 1.0}))

where ``my_factory(key, *, n_items, ranking_length, logging_policy, config, eta)`` returns an
object following [`Environment`][Environment]. It is called with the options it declares (here
``eta``: a sweep's ``env_options`` value or ``axes`` value, else the declared default), and
with ``lam`` and ``tau`` (the paper's axes) only if its signature names them or takes
``**kwargs``. ``config`` is the cell's sweep config (``opl-rank simulate`` builds one from its ``--set`` values);
``logging_policy`` is one of the spec's built-in names or a callable
``(context, item_features) -> logits``. Name the module in the sweep config's ``plugins``
(or ``opl-rank simulate --plugin``) so every worker imports it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from opl_rank.data import LoggedData
from opl_rank.pl import plackett_luce as pl
from simulators.rollout import PolicyValue

__all__ = [
    "Environment",
    "EnvironmentSpec",
    "ENVIRONMENTS",
    "register",
    "get",
    "create",
    "best_rankings_by_enumeration",
]


@runtime_checkable
class Environment(Protocol):
    """What the learners' benchmark needs from a simulator."""

    n_items: int
    ranking_length: int
    position_weight: jax.Array  # [L]

    def sample_logged_data(self, key: jax.Array, n: int, *, position_marginals: str = "none") -> LoggedData:
        """``n`` logged rounds of the logging policy (``"exact"``: with position marginals)."""

    def policy_value(self, policy: Any, key: jax.Array, n_contexts: int = 100_000) -> PolicyValue:
        """Ground-truth ``V(pi)`` (exact expected rewards, Monte Carlo over contexts)."""

    def logging_policy_value(self, key: jax.Array, n_contexts: int = 100_000) -> PolicyValue:
        """``V(pi_0)``."""

    def optimal_value(self, key: jax.Array, n_contexts: int = 20_000) -> tuple[PolicyValue, str]:
        """``V*`` and how the best rankings were found (``"exact"``, ``"beam"``, ...)."""


@dataclasses.dataclass(frozen=True)
class EnvironmentSpec:
    """A registry entry.

    Attributes:
      create: ``(key, *, n_items, ranking_length, logging_policy, config, [lam, tau,]
        **options) -> Environment`` (see the module docstring).
      logging_policies: built-in logging policy names it accepts (the first is the default);
        any environment also takes ``module:function``.
      repeats_contexts: logged rounds share contexts (two-step reward models need it).
      check: optional ``check(config)`` raising a ValueError for a config it cannot run.
      options: the simulator's own options and their defaults (``{"eta": 1.0}``): each can
        be a sweep axis or an ``env_options`` value, and is passed to ``create`` by name.
    """

    create: Callable[..., Any]
    logging_policies: tuple[str, ...] = ()
    repeats_contexts: bool = False
    check: Callable[[Any], None] | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


ENVIRONMENTS: dict[str, EnvironmentSpec] = {}


def register(name: str, spec: EnvironmentSpec, *, replace: bool = False) -> EnvironmentSpec:
    """Add an environment under ``name`` (an error if taken, unless ``replace``)."""
    if not isinstance(spec, EnvironmentSpec):
        raise TypeError(f"spec must be an EnvironmentSpec, got {type(spec).__name__}")
    if name in ENVIRONMENTS and not replace and ENVIRONMENTS[name] != spec:
        raise ValueError(f"environment {name!r} is already registered")
    ENVIRONMENTS[name] = spec
    return spec


def get(name: str) -> EnvironmentSpec:
    """The registered environment ``name`` (a ValueError lists the known names)."""
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise ValueError(f"unknown simulator {name!r}; registered: {sorted(ENVIRONMENTS)}") from None


def create(
    name: str,
    key: jax.Array,
    *,
    n_items: int,
    ranking_length: int,
    lam: float,
    tau: float,
    logging_policy: Any,
    config: Any = None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """Build the registered environment ``name``: its factory gets ``options`` (over the
    spec's defaults; an unknown name is a ValueError listing the known ones), and ``lam`` /
    ``tau`` when its signature takes them."""
    spec = get(name)
    merged = dict(spec.options)
    unknown = sorted(set(options or {}) - set(merged))
    if unknown:
        raise ValueError(f"simulator {name!r} has no option(s) {unknown}; its options: {sorted(merged) or 'none'}")
    merged.update(options or {})
    params = inspect.signature(spec.create).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for paper, value in (("lam", lam), ("tau", tau)):
        if takes_any or paper in params:
            merged[paper] = value
    return spec.create(
        key, n_items=n_items, ranking_length=ranking_length, logging_policy=logging_policy, config=config, **merged
    )


def best_rankings_by_enumeration(
    expected_reward: Callable[[jax.Array, jax.Array], jax.Array],
    context: jax.Array,
    position_weight: jax.Array,
    n_items: int,
    *,
    max_enumerated: int = 20_000,
) -> jax.Array:
    """``argmax_a sum_l alpha_l q_l(x, a)`` over every ranking, for any reward model.

    Args:
      expected_reward: ``(context [m, dx], rankings [m, L]) -> [m, L]``.
      context: ``[n, dx]``.
      position_weight: ``[L]``.
      n_items: ``D``.
      max_enumerated: refuse beyond this many rankings (a ValueError).

    Returns:
      int32 ``[n, L]``.
    """
    n_slots = position_weight.shape[0]
    n_rankings = math.perm(n_items, n_slots)
    if n_rankings > max_enumerated:
        raise ValueError(f"{n_rankings} rankings of {n_items} items exceed max_enumerated={max_enumerated}")
    perms = jnp.asarray(pl.all_rankings(n_items, n_slots))  # [P, L]

    def best(x):
        xs = jnp.broadcast_to(x, (n_rankings,) + x.shape)
        return perms[jnp.argmax(expected_reward(xs, perms) @ position_weight)]

    return jax.lax.map(best, context, batch_size=max(1, min(context.shape[0], 2**20 // n_rankings)))


# ---------------------------------------------------------------------------------------
# The built-in environments (factories import lazily: registering costs nothing)
# ---------------------------------------------------------------------------------------
def _common(n_items, ranking_length, lam, tau, logging_policy, config) -> dict[str, Any]:
    if logging_policy == "pl":  # the synthetic environment's default (the paper's PL-linear)
        logging_policy = None
    return dict(
        n_items=n_items,
        ranking_length=ranking_length,
        lam=lam,
        sigma=config.sigma,
        interaction_scale=config.interaction_scale,
        logging_temperature=tau,
        logging_policy=logging_policy,
    )


def _synthetic(key, *, n_items, ranking_length, lam, tau, logging_policy, config, reward_structure="symmetric"):
    from simulators.synthetic import SyntheticRankingEnv

    return SyntheticRankingEnv.create(
        key,
        reward_structure=reward_structure,
        **_common(n_items, ranking_length, lam, tau, logging_policy, config),
    )


def _check_synthetic(config) -> None:
    """A sweep's ``reward_structure`` values (``env_options`` or an axis) are known names:
    refused when the config loads, not when a cell runs."""
    from simulators.synthetic import REWARD_STRUCTURES

    values = [v for k, v in getattr(config, "env_options", None) or () if k == "reward_structure"]
    values += [v for k, vs in getattr(config, "axes", None) or () if k == "reward_structure" for v in vs]
    for value in values:
        if value not in REWARD_STRUCTURES:
            raise ValueError(f"reward_structure must be one of {list(REWARD_STRUCTURES)}, got {value!r}")


_LETOR_CACHE: dict[tuple, Any] = {}


def _semi_synthetic(key, *, n_items, ranking_length, lam, tau, logging_policy, config):
    from simulators.letor import load_letor
    from simulators.semi_synthetic import SemiSyntheticEnv

    sha256 = getattr(config, "letor_sha256", None)
    source = (config.letor_path, config.letor_normalize, sha256)
    if source not in _LETOR_CACHE:  # one parse per process: every cell reuses it
        _LETOR_CACHE.clear()
        _LETOR_CACHE[source] = load_letor(config.letor_path, normalize=config.letor_normalize, sha256=sha256)
    return SemiSyntheticEnv.create(
        key,
        _LETOR_CACHE[source],
        eta_scale=config.eta_scale,
        forest_fraction=config.forest_fraction,
        **_common(n_items, ranking_length, lam, tau, logging_policy, config),
    )


def _needs_letor_path(config) -> None:
    if not config.letor_path:
        raise ValueError("simulator semi_synthetic needs letor_path (a LETOR/SVMlight file)")


register(
    "synthetic",
    EnvironmentSpec(
        _synthetic,
        logging_policies=("pl", "uniform"),
        check=_check_synthetic,
        options={"reward_structure": "symmetric"},  # simulators.synthetic.REWARD_STRUCTURES
    ),
)
register(
    "semi_synthetic",
    EnvironmentSpec(
        _semi_synthetic, logging_policies=("random_forest", "uniform"), repeats_contexts=True, check=_needs_letor_path
    ),
)
