"""Cascade-DR including its Q fit: ours against obp's on the same logs.

Usage (from the repository root)::

    python benchmarks/bench_cascade_dr.py            # n = 1e4 and 1e5 (obp takes minutes at 1e5)
    python benchmarks/bench_cascade_dr.py --quick    # n = 1e4 only

What is compared, on the same logged rounds (``SyntheticRankingEnv``, D = 10, L = 5, PL
logging policy) and the same target (a sharper PL policy over the logging logits), with
the same target choice distribution ``pi(d | x, a_{1:l-1})`` given to both:

* ours: [`opl_rank.opl.cascade_dr.fit_q`][opl_rank.opl.cascade_dr.fit_q] (ridge on
  ``[1, x, e_d, x (x) e_d, m]``, backwards over the slots, one compiled program; no
  cross-fitting, as obp) and ``cascade_dr_terms``; timed warm (best of 3) and cold (the
  first call: compilation included);
* obp: ``SlateRegressionModel(base_model=Ridge(), fitting_method="normal").fit_predict``
  (one scikit-learn model per slot on ``[x, a_{1:l}]``, built with Python loops over rows
  and items) and ``SlateCascadeDoublyRobust.estimate_policy_value``; best of 1 (it has
  nothing to compile).

The two Q models differ (obp's default features are the raw item ids), so the estimates
differ by their Q's quality; both are printed. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script

from _timing import best_of, environment, seconds  # noqa: E402  (benchmarks/ is the script folder)
from obp.ope import SlateCascadeDoublyRobust, SlateRegressionModel  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402

from opl_rank import make_key  # noqa: E402
from opl_rank.io.obp import to_obp_slate  # noqa: E402
from opl_rank.opl import cascade_dr as cdr  # noqa: E402
from opl_rank.opl import estimators as oe  # noqa: E402
from opl_rank.pl import plackett_luce as pl  # noqa: E402
from simulators import SyntheticRankingEnv  # noqa: E402

D, L, SHARPEN = 10, 5, 2.0


def _setting(n: int):
    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, lam=0.0)
    data = env.sample_logged_data(make_key(1), n)
    logits = env.logging_logits(data.context) * SHARPEN
    target = oe.Propensities(pl.prefix_log_probs(logits, data.ranking))
    choice = jnp.exp(pl.placement_log_probs(logits, data.ranking))
    return env, data, target, choice


def ours(data, target, choice) -> float:
    q = cdr.fit_q(data, choice, make_key(2), folds=1)
    return float(oe.estimate(cdr.cascade_dr_terms(target, data, inputs=cdr.CascadeInputs(q, choice))))


def obp_estimate(data, target, choice) -> float:
    feedback = to_obp_slate(data)
    eval_cascade = np.exp(np.asarray(target.log_prefix, np.float64)).reshape(-1)
    action_dist = np.asarray(choice, np.float64)
    action_dist = (action_dist / action_dist.sum(-1, keepdims=True)).reshape(-1)
    model = SlateRegressionModel(base_model=Ridge(), len_list=L, n_unique_action=D, fitting_method="normal")
    with contextlib.redirect_stderr(io.StringIO()):  # obp's progress bars
        q_hat = model.fit_predict(
            context=feedback["context"],
            action=feedback["action"],
            reward=feedback["reward"],
            pscore_cascade=feedback["pscore_cascade"],
            evaluation_policy_pscore_cascade=eval_cascade,
            evaluation_policy_action_dist=action_dist,
        )
    return float(
        SlateCascadeDoublyRobust(len_list=L, n_unique_action=D).estimate_policy_value(
            slate_id=feedback["slate_id"],
            action=feedback["action"],
            reward=feedback["reward"],
            position=feedback["position"],
            pscore_cascade=feedback["pscore_cascade"],
            evaluation_policy_pscore_cascade=eval_cascade,
            q_hat=q_hat,
            evaluation_policy_action_dist=action_dist,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e4 only")
    args = parser.parse_args()
    jax.config.update("jax_platforms", "cpu")
    rows = []
    for n in (10_000,) if args.quick else (10_000, 100_000):
        env, data, target, choice = _setting(n)
        cold = seconds(lambda: ours(data, target, choice))
        warm = best_of(lambda: ours(data, target, choice), 3)
        value_ours = ours(data, target, choice)
        start = time.perf_counter()
        value_obp = obp_estimate(data, target, choice)
        obp_s = time.perf_counter() - start
        row = {
            "n": n,
            "ours_warm_s": round(warm, 4),
            "ours_cold_s": round(cold, 3),
            "obp_s": round(obp_s, 2),
            "ratio_warm": round(obp_s / warm, 1),
            "ratio_cold": round(obp_s / cold, 1),
            "ours_value": round(value_ours, 4),
            "obp_value": round(value_obp, 4),
        }
        rows.append(row)
        print(
            f"n={n:>7}: ours {warm * 1e3:8.1f} ms warm, {cold:6.2f} s cold; obp {obp_s:8.2f} s; "
            f"obp/ours {obp_s / warm:8.1f}x warm, {obp_s / cold:6.1f}x cold; "
            f"estimates {value_ours:.4f} (ours) {value_obp:.4f} (obp)",
            flush=True,
        )
    print(json.dumps({"bench": "cascade_dr", "D": D, "L": L, "rows": rows, **environment()}))


if __name__ == "__main__":
    main()
