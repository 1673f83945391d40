"""Choosing R-POD's k from logged data alone, by off-policy evaluation on a hold-out split.

``select_k`` splits the rounds into a training and a hold-out part, fits R-POD for every
candidate k on the training part, estimates each fitted policy's value on the hold-out
part with one OPE estimator ([`opl_rank.opl.ope`][opl_rank.opl.ope]), and returns the k with the highest
estimate together with the whole table. The estimator's reward model (for dm, dr, topk)
is fitted on the training part, with the learner's reward-model kind.

Every candidate's fit would fit the same f_hat (same rows, key and settings), so a one-step
f_hat is fitted once and shared ([`opl_rank.opl.learners.fit_reward`][opl_rank.opl.learners.fit_reward]):
the candidates are bit for bit what separate fits return, with one reward fit instead of one per k.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import jax

from opl_rank.data import LoggedData, train_val_split
from opl_rank.opl import estimators as opl_estimators
from opl_rank.opl import ope
from opl_rank.opl.learners import LearnerConfig, fit, fit_reward, shares_reward_model
from opl_rank.opl.reward_models import base_kind, fit_reward_model

__all__ = ["KSelection", "select_k"]


@dataclasses.dataclass(frozen=True)
class KSelection:
    """The chosen k and, per candidate, the OPE result on the hold-out rounds."""

    k: int
    estimator: str
    table: list[dict[str, Any]]  # one row per k: k, value, stderr, ci_low, ci_high, ess, estimable, reason
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
      config: an ``rpod`` [`LearnerConfig`][LearnerConfig] (its ``k`` is replaced by each candidate).
      ks: candidates (default every k in ``0..L``).
      estimator: a name in [`opl_rank.opl.estimators.OPL_ESTIMATORS`][opl_rank.opl.estimators.OPL_ESTIMATORS] (one that uses k,
        such as ``topk``, gets each candidate's k).
      holdout_fraction: share of rounds held out, in (0, 1).
      ci: interval method passed to [`opl_rank.opl.ope.evaluate`][opl_rank.opl.ope.evaluate].
      n_samples: rankings sampled per hold-out round for the model term of dm / dr /
        topk (its Monte Carlo error averages over the rounds; 64 is ample).

    Returns:
      [`KSelection`][KSelection]; ties go to the smaller k. A candidate whose estimate is not
      estimable ([`opl_rank.opl.ope.OPEResult`][opl_rank.opl.ope.OPEResult]: no usable weight mass; its value is NaN)
      cannot be chosen; a ValueError when no candidate is estimable.
    """
    if config.method != "rpod":
        raise ValueError(f"select_k needs an 'rpod' LearnerConfig, got method {config.method!r}")
    entry = opl_estimators.get(estimator)
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in (0, 1), got {holdout_fraction}")
    n_slots = data.ranking_length
    ks = tuple(range(n_slots + 1)) if ks is None else tuple(ks)
    if not ks or any(not isinstance(k, int) or not 0 <= k <= n_slots for k in ks):
        raise ValueError(f"ks must be ints in [0, L={n_slots}], got {ks}")
    k_split, k_model, k_fit, k_ope = jax.random.split(key, 4)
    train, holdout = train_val_split(data, k_split, holdout_fraction)
    reward_model = None
    if entry.needs_reward_model:
        options = config.reward_model_options()  # the estimator's f_hat: one for every candidate k
        options["kind"] = base_kind(options["kind"])
        reward_model = fit_reward_model(train, k_model, **options)
    # the learners' f_hat, fitted once for every candidate k (two-step kinds depend on k: per k)
    shared = fit_reward(train, k_fit, config) if shares_reward_model(config) else None
    table: list[dict[str, Any]] = []
    policies: dict[int, Any] = {}
    weak: list[tuple[int, float, int]] = []  # (k, ESS, hold-out rounds) of degenerate estimates
    for k in ks:
        policy = fit(train, k_fit, dataclasses.replace(config, k=k), reward_params=shared)
        result = ope.evaluate(
            policy,
            holdout,
            jax.random.fold_in(k_ope, k),
            estimators=(estimator,),
            reward_model=reward_model,
            k=k if entry.uses_k else None,
            ci=ci,
            n_samples=n_samples,
            warn_degenerate=False,  # one warning for the selection below, not one per k
        )[estimator]
        if ope.degenerate(result):
            weak.append((k, result.ess, result.n))
        policies[k] = policy
        table.append(
            {
                "k": k,
                "value": result.value,
                "stderr": result.stderr,
                "ci_low": result.ci_low,
                "ci_high": result.ci_high,
                "ess": result.ess,
                "estimable": result.estimable,
                "reason": result.reason,
            }
        )
    if weak:
        warnings.warn(
            ope.DegenerateWeightsWarning(
                f"select_k: estimator {estimator!r} has degenerate importance weights on the {weak[0][2]} hold-out "
                f"rounds at k = {', '.join(str(k) for k, _, _ in weak)} (effective sample sizes "
                f"{', '.join(f'{ess:.3g}' for _, ess, _ in weak)}; below {ope.DEGENERATE_ESS_FRACTION:.0%} of n, or "
                "not finite): those candidates' estimates rest on the reward model or are not reliable "
                "(KSelection.table: each k's ess, estimable and reason)"
            ),
            stacklevel=2,
        )
    candidates = [row for row in table if row["estimable"]]
    if not candidates:
        why = "; ".join(f"k={row['k']}: {row['reason']}" for row in table)
        raise ValueError(
            f"select_k: estimator {estimator!r} cannot estimate any candidate's value on the hold-out rounds "
            f"({why}); choose another estimator (dr)"
        )
    best = max(candidates, key=lambda row: (row["value"], -row["k"]))
    return KSelection(best["k"], estimator, table, policies)
