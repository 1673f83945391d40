"""The Open Bandit Dataset (OBD) as position-wise [`LoggedData`][opl_rank.data.LoggedData].

The OBD (Saito et al., 2020) is ZOZOTOWN's fashion-recommendation log: 80 items ("all"
campaign; 34 "men", 46 "women"), 3 positions, clicks as rewards, logged by two policies
running side by side -- uniform random and Bernoulli Thompson sampling (BTS) -- with the
logging propensities. obp ships a 10,000-row sample of each (policy, campaign) inside its
package (``obp/dataset/obd``); the full data set has the same layout (``data_path``).

**What a row is.** The OBD logs one row per (impression, position): ``item_id``,
``position`` (1-3), ``click``, ``propensity_score`` and user features, with a timestamp but
no impression id. In obp's sample the 10,000 rows of a policy are drawn from a week of
traffic: 9,991 distinct timestamps among the Random rows and 9,999 among the BTS rows, so
the three rows of one shown slate are almost never all present and cannot be reassembled.
``propensity_score`` is the logging policy's *marginal* probability of that item at that
position (``1/80 = 0.0125`` for Random, a Monte Carlo estimate that changes through the week
for BTS), which is exactly what a position-wise (IIPS-type) estimator needs and no more.

**What the converter builds.** [`from_obd`][from_obd] makes one round per row with ``L = 1``:
``ranking [n, 1]`` the item, ``reward [n, 1]`` the click, and ``log_pi0_prefix`` =
``log_pi0_position_marginal`` = ``log(pscore)`` (for a one-slot "ranking" at a given
position, the prefix probability *is* the position marginal). The position is part of the
context: ``context = [one_hot(position, len_list), obp's user features]``, so a policy whose
item probabilities depend on the position ([`PositionwisePolicy`][PositionwisePolicy]) reads it from there.
With ``L = 1`` opl_rank's ``ips``, ``iips`` and ``rips`` coincide: the estimate is
``mean_i r_i pi_e(a_i at p_i) / pi_0(a_i at p_i)``, the per-row click rate of the
evaluation policy -- the same quantity obp's ``InverseProbabilityWeighting`` estimates on
the OBD, and the same scale as the on-policy click rate ``mean(click)`` of BTS's own logs.

**The standard check** ([`bts_from_random`][bts_from_random]): BTS's value estimated from the Random logs
against BTS's on-policy click rate, with obp's estimate on the same data next to it. BTS
as the evaluation policy is obp's static version: [`bts_action_dist`][bts_action_dist] is
``BernoulliTS(is_zozotown_prior=True, campaign=...).compute_batch_action_dist`` (the
production prior at the start of data collection), vectorised and equal to obp's own.

obp 0.5.7's ``OpenBanditDataset.pre_process`` fails on recent pandas (3.1 here:
``drop(columns=..., axis=1)`` is an error) and its ``load_raw_data`` sorts with ``inplace=True`` (deprecated in pandas 3);
[`load_obd`][load_obd] uses a subclass that does the same work without either.
obp is imported lazily: importing this module does not need it. A plain ``bash
scripts/setup.sh`` does not install obp; the functions that need it raise an ImportError
that says to run ``bash scripts/setup.sh --test`` (obp 0.5.7 with ``--no-deps`` and its
import-time dependencies; README, "Why obp is installed separately").
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from pathlib import Path
from statistics import NormalDist
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from opl_rank.data import LoggedData
from opl_rank.opl.estimators import Propensities

__all__ = [
    "CAMPAIGNS",
    "BEHAVIOR_POLICIES",
    "sample_path",
    "load_obd",
    "from_obd",
    "positions",
    "bts_action_dist",
    "PositionwisePolicy",
    "on_policy_value",
    "obp_estimates",
    "bts_from_random",
]

CAMPAIGNS = ("all", "men", "women")
_OBP_INSTALL = "bash scripts/setup.sh --test"  # installs obp 0.5.7 (--no-deps) and its import-time dependencies
BEHAVIOR_POLICIES = ("random", "bts")


def _obp(module: str) -> Any:
    """``import module`` (a part of obp), or an ImportError saying how to install obp."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing = getattr(err, "name", None) or module
        what = (
            "obp (Open Bandit Pipeline) is not installed"
            if missing.split(".")[0] == "obp"
            else f"obp is installed but {missing!r}, which it imports, is not ({type(err).__name__}: {err})"
        )
        raise ImportError(
            f"opl_rank.io.obd needs obp: {what}. A plain scripts/setup.sh "
            f"does not install it: run `{_OBP_INSTALL}` (obp 0.5.7 with --no-deps and its import-time "
            'dependencies; README, "Why obp is installed separately")'
        ) from err


def sample_path() -> Path:
    """The folder of the OBD sample inside the installed obp package.

    Raises:
      ImportError: obp is not installed (the message says how to install it).
      FileNotFoundError: this obp build ships no sample.
    """
    dataset = _obp("obp.dataset")
    path = Path(dataset.__file__).parent / "obd"
    missing = [
        f"{p}/{c}/{c}.csv" for p in BEHAVIOR_POLICIES for c in CAMPAIGNS if not (path / p / c / f"{c}.csv").is_file()
    ]
    if missing:
        raise FileNotFoundError(f"obp's Open Bandit Dataset sample is incomplete under {path}: missing {missing}")
    return path


def load_obd(behavior_policy: str, campaign: str = "all", *, data_path: str | Path | None = None) -> dict[str, Any]:
    """obp's batch bandit feedback for one (policy, campaign) of the OBD.

    Exactly ``OpenBanditDataset(behavior_policy, campaign, data_path).obtain_batch_bandit_feedback()``
    (rows sorted by timestamp, 0-based positions, one-hot user features, label-encoded item
    features), with ``load_raw_data`` and ``pre_process`` rewritten so that they run on
    recent pandas (same arrays).

    Args:
      behavior_policy: ``"random"`` or ``"bts"``.
      campaign: ``"all"``, ``"men"`` or ``"women"``.
      data_path: the full OBD's root folder; ``None``: the sample shipped with obp.

    Returns:
      obp's dict: ``n_rounds``, ``n_actions``, ``action``, ``position`` (0-based),
      ``reward``, ``pscore``, ``context``, ``action_context``.
    """
    if behavior_policy not in BEHAVIOR_POLICIES:
        raise ValueError(f"behavior_policy must be one of {BEHAVIOR_POLICIES}, got {behavior_policy!r}")
    if campaign not in CAMPAIGNS:
        raise ValueError(f"campaign must be one of {CAMPAIGNS}, got {campaign!r}")
    if data_path is None:
        data_path = sample_path()
    return _dataset_class()(
        behavior_policy=behavior_policy, campaign=campaign, data_path=Path(data_path)
    ).obtain_batch_bandit_feedback()


def _dataset_class():
    import logging

    _obp("obp.dataset")  # an ImportError saying how to install obp
    import pandas as pd
    from obp.dataset import OpenBanditDataset
    from scipy.stats import rankdata
    from sklearn.preprocessing import LabelEncoder

    logging.getLogger("obp.dataset.real").setLevel(logging.WARNING)

    class _OpenBanditDataset(OpenBanditDataset):
        def load_raw_data(self) -> None:  # obp's, without sort_values(inplace=True) (deprecated in pandas 3)
            self.data = pd.read_csv(self.data_path / self.raw_data_file, index_col=0).sort_values("timestamp")
            self.item_context = pd.read_csv(self.data_path / "item_context.csv", index_col=0)
            self.action = self.data["item_id"].to_numpy()
            self.position = rankdata(self.data["position"].to_numpy(), "dense").astype(int) - 1
            self.reward = self.data["click"].to_numpy()
            self.pscore = self.data["propensity_score"].to_numpy()

        def pre_process(self) -> None:  # obp's features; drop(columns=) without axis=1
            user_cols = self.data.columns.str.contains("user_feature")
            self.context = pd.get_dummies(self.data.loc[:, user_cols], drop_first=True).to_numpy(np.float64)
            item_feature_0 = self.item_context["item_feature_0"].to_frame()
            item_feature_cat = self.item_context.drop(columns=["item_id", "item_feature_0"]).apply(
                LabelEncoder().fit_transform
            )
            self.action_context = pd.concat([item_feature_cat, item_feature_0], axis=1).to_numpy(np.float64)

    return _OpenBanditDataset


def from_obd(bandit_feedback: Mapping[str, Any], *, len_list: int | None = None) -> LoggedData:
    """Position-wise logged data from obp's OBD bandit feedback: one round per row, ``L = 1``.

    Args:
      bandit_feedback: [`load_obd`][load_obd]'s dict (obp's ``OpenBanditDataset`` layout: one row
        per (impression, position), ``position`` 0-based, ``pscore`` the item's marginal
        probability at that position under the logging policy).
      len_list: the number of positions (default: ``max(position) + 1``, 3 on the OBD).

    Returns:
      [`LoggedData`][LoggedData] with ``ranking [n, 1]`` the item, ``reward [n, 1]`` the click,
      ``log_pi0_prefix`` and ``log_pi0_position_marginal`` both ``log(pscore)``,
      ``position_weight = [1]``, ``context = [one_hot(position, len_list), context]``
      ([`positions`][positions] reads the position back), ``item_features`` the item context and
      ``n_items`` the larger of ``n_actions`` and the item context's rows.

    Raises:
      ValueError: a missing key, arrays of different lengths, positions outside
        ``[0, len_list)``, or propensities outside ``(0, 1]``.
    """
    missing = [
        k for k in ("n_actions", "action", "position", "reward", "pscore", "context") if k not in bandit_feedback
    ]
    if missing:
        raise ValueError(f"bandit_feedback lacks {missing}")
    action = np.asarray(bandit_feedback["action"])
    position = np.asarray(bandit_feedback["position"])
    reward = np.asarray(bandit_feedback["reward"], np.float64)
    pscore = np.asarray(bandit_feedback["pscore"], np.float64)
    context = np.asarray(bandit_feedback["context"], np.float64)
    n = action.shape[0]
    for name, value in (("position", position), ("reward", reward), ("pscore", pscore), ("context", context)):
        if value.shape[:1] != (n,) or value.ndim != (2 if name == "context" else 1):
            raise ValueError(f"bandit_feedback[{name!r}] must have {n} rows like 'action', got shape {value.shape}")
    if len_list is None:
        len_list = int(position.max()) + 1
    if position.min() < 0 or position.max() >= len_list:
        raise ValueError(
            f"bandit_feedback['position'] must be 0-based in [0, {len_list}), got [{position.min()}, {position.max()}]"
        )
    if not np.all(np.isfinite(pscore)) or np.any(pscore <= 0) or np.any(pscore > 1 + 1e-6):
        raise ValueError("bandit_feedback['pscore'] must be propensities in (0, 1]")
    log_p0 = np.log(np.minimum(pscore, 1.0)).astype(np.float32)[:, None]
    action_context = bandit_feedback.get("action_context")
    n_items = int(bandit_feedback["n_actions"])
    if action_context is not None:
        n_items = max(n_items, int(np.asarray(action_context).shape[0]))
    one_hot = np.eye(len_list, dtype=np.float32)[position]
    return LoggedData(
        context=jnp.asarray(np.concatenate([one_hot, context.astype(np.float32)], axis=1)),
        ranking=jnp.asarray(action.astype(np.int32)[:, None]),
        reward=jnp.asarray(reward.astype(np.float32)[:, None]),
        log_pi0_prefix=jnp.asarray(log_p0),
        position_weight=jnp.ones((1,), jnp.float32),
        n_items=n_items,
        log_pi0_position_marginal=jnp.asarray(log_p0),
        item_features=None if action_context is None else jnp.asarray(np.asarray(action_context, np.float32)),
    )


def positions(context: Any, len_list: int) -> jax.Array:
    """The 0-based position of each row of [`from_obd`][from_obd]'s context (its first ``len_list`` columns)."""
    return jnp.argmax(jnp.asarray(context)[:, :len_list], axis=1)


def bts_action_dist(
    campaign: str = "all",
    *,
    len_list: int = 3,
    n_sim: int = 100_000,
    random_state: int | None = 12345,
    chunk: int = 10_000,
) -> np.ndarray:
    """BTS's probability of each item at each position, ``[n_actions, len_list]``, float64.

    The evaluation policy of obp's OBD examples: ``BernoulliTS(n_actions, len_list,
    is_zozotown_prior=True, campaign=campaign, random_state=random_state)
    .compute_batch_action_dist(n_sim=n_sim)[0]`` -- ``n_sim`` draws from the production Beta
    prior, items sorted by their draw, counts of each item at each position / ``n_sim`` --
    vectorised. It draws the same numbers in the same order from the same
    ``np.random.RandomState``, so it returns obp's array exactly, without obp's Python loop.
    """
    production_prior_for_bts = _obp("obp.policy.contextfree").production_prior_for_bts

    if campaign not in production_prior_for_bts:
        raise ValueError(f"campaign must be one of {sorted(production_prior_for_bts)}, got {campaign!r}")
    alpha = np.asarray(production_prior_for_bts[campaign]["alpha"], np.float64)
    beta = np.asarray(production_prior_for_bts[campaign]["beta"], np.float64)
    n_actions = alpha.shape[0]
    if not 1 <= len_list <= n_actions or n_sim < 1:
        raise ValueError(f"need 1 <= len_list <= {n_actions} and n_sim >= 1, got len_list={len_list}, n_sim={n_sim}")
    rng = np.random.RandomState(random_state)
    counts = np.zeros((n_actions, len_list))
    done = 0
    while done < n_sim:
        m = min(chunk, n_sim - done)
        draws = rng.beta(np.broadcast_to(alpha, (m, n_actions)), np.broadcast_to(beta, (m, n_actions)))
        top = np.argsort(draws, axis=1)[:, ::-1][:, :len_list]  # obp: argsort()[::-1][:len_list]
        for pos in range(len_list):
            counts[:, pos] += np.bincount(top[:, pos], minlength=n_actions)
        done += m
    return counts / n_sim


@dataclasses.dataclass(frozen=True)
class PositionwisePolicy:
    """A context-free evaluation policy given by its item distribution at each position.

    A [`RankingPolicy`][opl_rank.opl.policies.RankingPolicy] over [`from_obd`][from_obd]'s one-slot rounds:
    at position ``p`` (read from the context's one-hot columns) it shows item ``a`` with
    probability ``action_dist[a, p]``. Its propensities of a logged row are that probability,
    as prefix and as slot marginal.

    Attributes:
      action_dist: ``[n_items, len_list]``, each column a distribution (obp's
        ``action_dist[0]`` for a context-free policy, e.g. [`bts_action_dist`][bts_action_dist]).
    """

    action_dist: Any
    n_slots: int = 1
    deterministic: bool = False

    def __post_init__(self) -> None:
        dist = np.asarray(self.action_dist, np.float64)
        if (
            dist.ndim != 2
            or not np.all(np.isfinite(dist))
            or (dist < 0).any()
            or not np.allclose(dist.sum(0), 1.0, atol=1e-5)
        ):
            raise ValueError("action_dist must be [n_items, len_list] with non-negative columns that sum to 1")
        object.__setattr__(self, "action_dist", jnp.asarray(dist, jnp.float32))

    @property
    def len_list(self) -> int:
        return int(self.action_dist.shape[1])

    def _log_dist(self, context: jax.Array) -> jax.Array:
        """``[n, n_items]`` log-probabilities at each row's position."""
        return jnp.log(self.action_dist.T[positions(context, self.len_list)])

    def sample(self, key: jax.Array, context: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        logits = self._log_dist(context)
        if where is not None:
            logits = jnp.where(where[:, : logits.shape[1]], logits, -jnp.inf)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)[:, None]

    def log_prob(self, context: jax.Array, rankings: jax.Array, *, where: jax.Array | None = None) -> jax.Array:
        return jnp.take_along_axis(self._log_dist(context), rankings[:, :1], axis=1)[:, 0]

    def propensities(
        self, data: LoggedData, key: jax.Array | None = None, *, slot_marginals: bool = False
    ) -> Propensities:
        if data.ranking_length != 1:
            raise ValueError(f"PositionwisePolicy scores one-slot rounds (from_obd), got L={data.ranking_length}")
        log_p = self.log_prob(data.context, data.ranking)[:, None]
        return Propensities(log_p, log_p if slot_marginals else None)


def on_policy_value(bandit_feedback: Mapping[str, Any], *, level: float = 0.95) -> dict[str, float]:
    """A policy's own click rate from its logs: ``mean(reward)`` with a normal interval.

    obp's ``calc_on_policy_policy_value_estimate`` (the OBD's ground truth) is the mean; the
    standard error is ``std(reward, ddof=1) / sqrt(n)``.
    """
    reward = np.asarray(bandit_feedback["reward"], np.float64)
    n = reward.shape[0]
    value = float(reward.mean())
    stderr = float(reward.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return {"value": value, "stderr": stderr, "ci_low": value - z * stderr, "ci_high": value + z * stderr, "n": n}


def obp_estimates(
    bandit_feedback: Mapping[str, Any],
    action_dist: Any,
    *,
    level: float = 0.95,
    n_bootstrap: int = 1000,
    random_state: int = 12345,
) -> dict[str, dict[str, float]]:
    """obp's IPW and SNIPW of ``action_dist`` on ``bandit_feedback``, with obp's bootstrap intervals.

    ``obp.ope.OffPolicyEvaluation(bandit_feedback, [InverseProbabilityWeighting(),
    SelfNormalizedInverseProbabilityWeighting()])``: ``estimate_policy_values`` and
    ``estimate_intervals(alpha=1 - level, n_bootstrap_samples=n_bootstrap)``.

    Args:
      action_dist: ``[n_items, len_list]`` (a context-free policy, tiled over rounds) or
        obp's ``[n_rounds, n_items, len_list]``.

    Returns:
      ``{"ips": {...}, "snips": {...}}`` each with ``value``, ``ci_low``, ``ci_high``.
    """
    obp_ope = _obp("obp.ope")
    InverseProbabilityWeighting, OffPolicyEvaluation = obp_ope.InverseProbabilityWeighting, obp_ope.OffPolicyEvaluation
    SelfNormalizedInverseProbabilityWeighting = obp_ope.SelfNormalizedInverseProbabilityWeighting

    dist = np.asarray(action_dist, np.float64)
    if dist.ndim == 2:
        dist = np.broadcast_to(dist, (int(bandit_feedback["n_rounds"]), *dist.shape))
    ope = OffPolicyEvaluation(
        bandit_feedback=dict(bandit_feedback),
        ope_estimators=[
            InverseProbabilityWeighting(estimator_name="ips"),
            SelfNormalizedInverseProbabilityWeighting(estimator_name="snips"),
        ],
    )
    values = ope.estimate_policy_values(action_dist=dist)
    intervals = ope.estimate_intervals(
        action_dist=dist, alpha=1.0 - level, n_bootstrap_samples=n_bootstrap, random_state=random_state
    )
    pct = 100 * level
    return {
        name: {
            "value": float(values[name]),
            "ci_low": float(intervals[name][f"{pct}% CI (lower)"]),
            "ci_high": float(intervals[name][f"{pct}% CI (upper)"]),
        }
        for name in values
    }


def bts_from_random(
    campaign: str = "all",
    *,
    n_sim: int = 100_000,
    random_state: int = 12345,
    level: float = 0.95,
    n_bootstrap: int = 1000,
    with_obp: bool = True,
    data_path: str | Path | None = None,
    key: jax.Array | None = None,
) -> list[dict[str, Any]]:
    """The OBD's standard check: BTS's click rate estimated from the Random logs.

    opl_rank's ``ips`` (= ``iips`` here) and ``snips`` via [`opl_rank.opl.ope.evaluate`][opl_rank.opl.ope.evaluate] with
    normal intervals (delta method for snips), obp's IPW / SNIPW with its bootstrap intervals,
    and BTS's on-policy click rate, all for one campaign.

    Returns:
      One dict per row: ``campaign``, ``source`` (``on-policy``: BTS's click rate in its own
      logs; ``baseline``: the Random logs' click rate, what ignoring the policy change gives;
      ``opl_rank``; ``obp``), ``estimator``, ``value``, ``stderr`` (nan for obp), ``ci_low``,
      ``ci_high``, ``n``, ``ess``, ``rel_error`` (``value / on_policy - 1``; 0 for the
      on-policy row).
    """
    from opl_rank.opl import ope
    from opl_rank.prng import make_key

    random_logs = load_obd("random", campaign, data_path=data_path)
    bts_logs = load_obd("bts", campaign, data_path=data_path)
    dist = bts_action_dist(
        campaign, len_list=int(random_logs["position"].max()) + 1, n_sim=n_sim, random_state=random_state
    )
    data = from_obd(random_logs)
    if dist.shape[0] < data.n_items:
        raise ValueError(f"BTS's action distribution covers {dist.shape[0]} items, the logs {data.n_items}")
    truth = on_policy_value(bts_logs, level=level)
    rows: list[dict[str, Any]] = [
        dict(
            campaign=campaign,
            source="on-policy",
            estimator="mean click (BTS logs)",
            value=truth["value"],
            stderr=truth["stderr"],
            ci_low=truth["ci_low"],
            ci_high=truth["ci_high"],
            n=truth["n"],
            ess=float(truth["n"]),
        )
    ]
    naive = on_policy_value(random_logs, level=level)  # a baseline any estimate should beat: Random's own click rate
    rows.append(
        dict(
            campaign=campaign,
            source="baseline",
            estimator="mean click (Random logs)",
            value=naive["value"],
            stderr=naive["stderr"],
            ci_low=naive["ci_low"],
            ci_high=naive["ci_high"],
            n=naive["n"],
            ess=float(naive["n"]),
        )
    )
    results = ope.evaluate(
        PositionwisePolicy(dist),
        data,
        make_key(0) if key is None else key,
        estimators=("ips", "snips"),
        ci="normal",
        level=level,
    )
    for name, result in results.items():
        rows.append(
            dict(
                campaign=campaign,
                source="opl_rank",
                estimator=name,
                value=result.value,
                stderr=result.stderr,
                ci_low=result.ci_low,
                ci_high=result.ci_high,
                n=result.n,
                ess=result.ess,
            )
        )
    if with_obp:
        for name, estimate in obp_estimates(
            random_logs, dist, level=level, n_bootstrap=n_bootstrap, random_state=random_state
        ).items():
            rows.append(
                dict(
                    campaign=campaign,
                    source="obp",
                    estimator=name,
                    value=estimate["value"],
                    stderr=math.nan,
                    ci_low=estimate["ci_low"],
                    ci_high=estimate["ci_high"],
                    n=data.n_rounds,
                    ess=math.nan,
                )
            )
    for row in rows:
        row["rel_error"] = row["value"] / truth["value"] - 1.0
    return rows
