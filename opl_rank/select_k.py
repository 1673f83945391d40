"""Choosing R-POD's k from logged data alone, by off-policy evaluation on a hold-out split.

``select_k`` splits the rounds into a training and a hold-out part, fits R-POD for every
candidate k on the training part, estimates each fitted policy's value on the hold-out
part with one OPE estimator (:mod:`opl_rank.ope`), and returns the k with the highest
estimate together with the whole table. The estimator's reward model (for dm, dr, topk)
is fitted on the training part, with the learner's reward-model kind.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from opl_rank import ope
from opl_rank.data import LoggedData, train_val_split
from opl_rank.learners import LearnerConfig, fit, fit_replicas, reward_model_options
from opl_rank.reward_models import base_kind, fit_reward_model, fit_reward_model_replicas

__all__ = ["KSelection", "select_k", "select_k_replicas"]


@dataclasses.dataclass(frozen=True)
class KSelection:
    """The chosen k and, per candidate, the OPE result on the hold-out rounds."""

    k: int
    estimator: str
    table: list[dict[str, Any]]  # one row per k: k, value, stderr, ci_low, ci_high, ess
    policies: dict[int, Any]  # the candidates, fitted on the training part


def select_k(
    data: LoggedData,
    key: jax.Array,
    config: LearnerConfig,
    *,
    ks: Sequence[int] | None = None,
    estimator: str = "dr",
    holdout_fraction: float = 0.3,
    ci: str = "normal",
    n_samples: int = 64,
) -> KSelection:
    """Pick R-POD's k by OPE on held-out rounds.

    Args:
      data: logged rounds.
      key: PRNG key.
      config: an ``rpod`` :class:`LearnerConfig` (its ``k`` is replaced by each candidate).
      ks: candidates (default every k in ``0..L``).
      estimator: one of :data:`opl_rank.ope.ESTIMATORS` (``topk`` uses each candidate's k).
      holdout_fraction: share of rounds held out, in (0, 1).
      ci: interval method passed to :func:`opl_rank.ope.evaluate`.
      n_samples: rankings sampled per hold-out round for the model term of dm / dr /
        topk (its Monte Carlo error averages over the rounds; 64 is ample).

    Returns:
      :class:`KSelection`; ties go to the smaller k.
    """
    return _select([data], key[None], config, ks, estimator, holdout_fraction, ci, n_samples, replicated=False)[0]


def select_k_replicas(
    datas: Sequence[LoggedData],
    keys: jax.Array,
    config: LearnerConfig,
    *,
    ks: Sequence[int] | None = None,
    estimator: str = "dr",
    holdout_fraction: float = 0.3,
    ci: str = "normal",
    n_samples: int = 64,
) -> list[KSelection]:
    """:func:`select_k` on ``S`` data sets of equal shapes (``keys [S]``): every candidate
    is fitted on all ``S`` training parts at once (:func:`opl_rank.learners.fit_replicas`)."""
    if len(datas) != keys.shape[0]:
        raise ValueError(f"keys must have shape [S={len(datas)}], got {keys.shape}")
    return _select(datas, keys, config, ks, estimator, holdout_fraction, ci, n_samples, replicated=True)


def _select(datas, keys, config, ks, estimator, holdout_fraction, ci, n_samples, replicated: bool) -> list[KSelection]:
    if config.method != "rpod":
        raise ValueError(f"select_k needs an 'rpod' LearnerConfig, got method {config.method!r}")
    if estimator not in ope.ESTIMATORS:
        raise ValueError(f"estimator must be one of {ope.ESTIMATORS}, got {estimator!r}")
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in (0, 1), got {holdout_fraction}")
    n_slots = datas[0].ranking_length
    ks = tuple(range(n_slots + 1)) if ks is None else tuple(ks)
    if not ks or any(not isinstance(k, int) or not 0 <= k <= n_slots for k in ks):
        raise ValueError(f"ks must be ints in [0, L={n_slots}], got {ks}")
    parts = jax.vmap(lambda k: jax.random.split(k, 4))(keys)
    k_split, k_model, k_fit, k_ope = (parts[:, i] for i in range(4))
    splits = [train_val_split(d, k, holdout_fraction) for d, k in zip(datas, k_split)]
    trains, holdouts = [s[0] for s in splits], [s[1] for s in splits]
    reward_models: list[Any] = [None] * len(datas)
    if estimator in ("dm", "dr", "topk"):
        options = reward_model_options(config)  # the estimator's f_hat: one for every candidate k
        options["kind"] = base_kind(options["kind"])
        if replicated:
            reward_models = fit_reward_model_replicas(trains, k_model, **options)
        else:
            reward_models = [fit_reward_model(trains[0], k_model[0], **options)]
    tables: list[list[dict[str, Any]]] = [[] for _ in datas]
    policies: list[dict[int, Any]] = [{} for _ in datas]
    for k in ks:
        candidate = dataclasses.replace(config, k=k)
        fitted = fit_replicas(trains, k_fit, candidate) if replicated else [fit(trains[0], k_fit[0], candidate)]
        for s, policy in enumerate(fitted):
            result = ope.evaluate(
                policy, holdouts[s], jax.random.fold_in(k_ope[s], k), estimators=(estimator,),
                reward_model=reward_models[s], k=k if estimator == "topk" else None, ci=ci, n_samples=n_samples,
            )[estimator]
            policies[s][k] = policy
            tables[s].append({"k": k, "value": result.value, "stderr": result.stderr, "ci_low": result.ci_low,
                              "ci_high": result.ci_high, "ess": result.ess})
    selections = []
    for table, fitted in zip(tables, policies):
        best = max(table, key=lambda row: (row["value"], -row["k"]))
        selections.append(KSelection(best["k"], estimator, table, fitted))
    return selections
