"""Speed of the PL policy-gradient estimators: LTR training epochs and the exposure kernel.

Usage (from the repository root)::

    python benchmarks/bench_ltr_estimators.py            # full run (about 3 minutes on 2 idle CPUs)
    python benchmarks/bench_ltr_estimators.py --quick    # smoke test (< 1 minute)

Part 1: seconds per training epoch
----------------------------------
``train_ltr`` on the Yahoo sample (``lightgbm_yahoo_sample.txt``, min-max normalised,
80/20 query split with seed 0) with the paper's MLP ``[1024, 512, 256]``, 128 queries per
step, ``K = 10``, for every estimator of ``gradients.GRADIENT_ESTIMATORS`` and
``N in {10, 100, 1000}`` sampled rankings per query. The figure is the median of the
``seconds`` records of epochs 2..E (epoch 1 includes JIT compilation; evaluation is not
counted). The sample has only 141 training queries padded to 25 documents, so one epoch
is ONE optimisation step on 128 queries (``train_ltr`` drops the incomplete last batch):
seconds per epoch = seconds per step here. Each configuration compiles its own step and
evaluation function (2-4 s), which dominates the wall time of this part; that is why E
is small: 4 epochs, i.e. 3 timed steps, at every N (N = 1000 is not slow enough with the
big MLP to need fewer: about 1.3 s per step at most).

Part 2: the exposure kernel alone
---------------------------------
Value and gradient w.r.t. the logits of ``sum(rel * exposure(logits))`` at ``Q = 1000``
queries, ``D = 100`` documents, ``K = 10`` (DCG weights), ``N = 100``: jitted,
``block_until_ready``, one warm-up call, best of 5 (a fresh key per call). Compared in
the same process with :func:`reference_exposure`, a plain transcription of the paper's
Figure 8 listing (the corrected estimator of Appendix A), ``vmap``-ed over queries with
one key per query. The listing's ``sample_rankings`` returns complete ``[N, D]`` rankings
(its reverse ``cumlogsumexp`` needs every document's rank), so here it is Gumbel top-k
with ``k = D`` (``jax.lax.top_k``, a full sort); the library samples only the top ``K``.
Both get keys from ``opl_rank.make_key`` (philox2x32).

Before timing, four checks that both compute unbiased estimates of the same quantities
(the first three on the first ``check_queries`` rows of the timed problem):

* same noise: the reference is fed the exact Gumbel noise the library draws
  (``jax.random.gumbel(key, (N, Q, D))``, an implementation detail of
  ``plackett_luce.sample_rankings``), so the sampled rankings coincide; values and
  gradients should then agree to float32 rounding.
* independent keys: over ``R`` keys, ``sum_e (m_a - m_b)^2 / sum_e (s_a^2 + s_b^2) / R``
  (means ``m`` and variances ``s^2`` over the keys, summed over every query and document
  ``e``) is about 1 when both have the same expectation. It has little power here: at
  ``N = 100`` the bias of ``exposure_original`` is small next to the sampling noise.
* total exposure: every per-query exposure vector sums to ``sum(theta)``.
* exact: one query with ``D = 6``, ``K = 3`` (exposure and its gradient by enumerating all
  120 top-3 rankings), repeated in 4000 rows; max |z| of the mean exposure and mean
  gradient against the exact values, for ours, the listing and, as a control that the
  test has power, ``exposure_original`` (Eq. 33, biased gradient with baselines).

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script

from opl_rank import make_key  # noqa: E402
from opl_rank.ltr.training import LTRConfig, train_ltr  # noqa: E402
from opl_rank.pl import gradients as le  # noqa: E402
from simulators import datasets  # noqa: E402
from simulators.letor import load_letor, split_queries  # noqa: E402

DATA = datasets.path("yahoo_sample")  # the shipped Yahoo! LTR sample
CUTOFF = 10
BATCH_QUERIES = 128
# Exact check: one small query, exposure by enumerating all D!/(D-K)! = 120 top-3 rankings.
EXACT_SCORES = (1.5, 1.0, 0.5, 0.0, -0.5, -1.0)
EXACT_RELEVANCE = (1.0, 0.0, 0.3, 1.0, 0.0, 0.6)
EXACT_SLOTS = 3
EXACT_ROWS = 4000
EXACT_Z_MAX = 4.5
IMPLEMENTATIONS = ("ours", "listing")  # must pass the exact check


@dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses."""

    hidden: tuple[int, ...]
    epochs: dict[int, int]  # N -> epochs (the first one compiles)
    kernel_queries: int
    kernel_docs: int
    kernel_samples: int
    kernel_repeats: int  # timed calls after the warm-up (best of)
    check_queries: int  # the checks run on the first rows of the kernel problem
    check_keys: int  # R, independent keys of the unbiasedness check


FULL = Sizes(
    hidden=(1024, 512, 256),
    epochs={10: 4, 100: 4, 1000: 4},
    kernel_queries=1000,
    kernel_docs=100,
    kernel_samples=100,
    kernel_repeats=5,
    check_queries=100,
    check_keys=8,
)
QUICK = Sizes(
    hidden=(32,),
    epochs={10: 2},
    kernel_queries=50,
    kernel_docs=100,
    kernel_samples=20,
    kernel_repeats=3,
    check_queries=50,
    check_keys=4,
)


# -- timing ------------------------------------------------------------------------------------
from _timing import best_of, environment  # noqa: E402  (benchmarks/ is the script folder)


# -- part 1: training epochs -------------------------------------------------------------------
def load_yahoo():
    data = load_letor(DATA, normalize="minmax")
    return split_queries(data, (0.8, 0.2), seed=0)


def epoch_seconds(train, valid, sizes: Sizes, estimator: str, n_samples: int) -> dict[str, float]:
    """Median training seconds of epochs 2..E, epoch 1 and the wall time of the whole call."""
    config = LTRConfig(
        hidden=sizes.hidden,
        epochs=sizes.epochs[n_samples],
        estimator=estimator,
        n_samples=n_samples,
        cutoff=CUTOFF,
        batch_queries=BATCH_QUERIES,
    )
    start = time.perf_counter()
    history = train_ltr(train, valid, make_key(0), config).history
    wall = time.perf_counter() - start
    later = [record["seconds"] for record in history[1:]]
    return {"median": statistics.median(later), "first": history[0]["seconds"], "wall": wall}


# -- part 2: the paper's Figure 8 listing --------------------------------------------------------
def sample_rankings(rng_key: jax.Array, n_samples: int, scores: jax.Array) -> jax.Array:
    """``[N, D]`` complete PL rankings by Gumbel top-k with k = D (the listing's ``utils``)."""
    gumbel = jax.random.gumbel(rng_key, (n_samples, scores.shape[0]), dtype=scores.dtype)
    return rankings_from_noise(scores, gumbel)


def rankings_from_noise(scores: jax.Array, gumbel: jax.Array) -> jax.Array:
    return jax.lax.top_k(scores[None, :] + gumbel, scores.shape[0])[1]


def exposure_listing(scores: jax.Array, rank_exposure: jax.Array, rankings: jax.Array) -> jax.Array:
    """The body of Figure 8 (corrected estimator), line by line, for one query.

    Args:
      scores: ``[D]``; rank_exposure: ``[K]``; rankings: ``[N, D]`` sampled rankings.

    Returns:
      ``[D]`` estimated exposure; its Jacobian is the exposure-based estimator.
    """
    stop_gradient = jax.lax.stop_gradient
    n_samples = rankings.shape[0]
    K = rank_exposure.shape[0]
    ranked_scores = scores[rankings]
    # [N, K] log denominator of placement prob. per position per sample
    log_denom = jax.lax.cumlogsumexp(ranked_scores, axis=1, reverse=True)[:, :K]
    # [N, K-1] log prob. of sampled ranking up to pos. k (not including)
    log_prefix = ranked_scores[:, : K - 1] - log_denom[:, : K - 1]
    log_prefix = jnp.cumsum(jnp.pad(log_prefix, ((0, 0), (1, 0))), axis=1)
    # [N, K, D] placement prob. of every document per position & sample
    prob_in = jnp.exp(scores[None, None, :] - log_denom[:, :, None])
    mask = jnp.zeros_like(prob_in, dtype=bool)
    mask = mask.at[jnp.arange(n_samples)[:, None], jnp.arange(1, K)[None, :], rankings[:, : K - 1]].set(True)
    mask = jnp.cumsum(mask, axis=1).astype(bool)
    prob_in = jnp.where(mask, 0, prob_in)
    prob_out = jnp.where(mask[:, -1, :], 0, 1 - prob_in[:, -1, :])
    # [N, K, D] placement prob. per position and outside rankings
    prob_all = jnp.concat((prob_in, prob_out[:, None, :]), axis=1)
    log_prefix_all = jnp.concat((log_prefix, log_prefix[:, -1:]), axis=1)
    rank_exposure_all = jnp.pad(rank_exposure, (0, 1))
    # [N, K, D] loss value used for computing policy gradient
    loss_K_D = prob_all + stop_gradient(prob_all) * log_prefix_all[:, :, None]
    exposure_prob_prod = prob_all * rank_exposure_all[None, :, None]
    # [N, D] exposure of document per sample
    sample_exposure = jnp.sum(exposure_prob_prod, axis=1)
    # [D] expected exposure of document estimated from samples
    mean_exposure = jnp.mean(sample_exposure, axis=0)
    # [N, D] leave-one-out baseline corrections
    baseline = mean_exposure[None, :] - sample_exposure / n_samples
    baseline *= n_samples / (n_samples - 1)
    # [N, K, D] baseline-corrected rewards for every doc., pos., sample
    rewards = stop_gradient(rank_exposure_all[None, :, None] - baseline[:, None, :])
    loss = jnp.mean(jnp.sum(rewards * loss_K_D, axis=1), axis=0)
    # trick: value is expected exposure but gradient comes from loss
    return stop_gradient(mean_exposure) + loss - stop_gradient(loss)


def reference_exposure(scores: jax.Array, rank_exposure: jax.Array, rng_key: jax.Array, n_samples: int) -> jax.Array:
    """Figure 8's ``exposure(scores, rank_exposure, rng_key, n_samples)`` for one query."""
    return exposure_listing(scores, rank_exposure, sample_rankings(rng_key, n_samples, scores))


# -- part 2: the two kernels ------------------------------------------------------------------------
def dcg_theta(k: int) -> jax.Array:
    return 1.0 / jnp.log2(jnp.arange(k, dtype=jnp.float32) + 2.0)


def kernel_problem(sizes: Sizes) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Logits ``[Q, D]`` ~ N(0, 1), relevance ``[Q, D]`` ~ U(0, 1), DCG theta ``[K]``."""
    k_logits, k_rel = jax.random.split(make_key(1234))
    shape = (sizes.kernel_queries, sizes.kernel_docs)
    return jax.random.normal(k_logits, shape), jax.random.uniform(k_rel, shape), dcg_theta(CUTOFF)


def ours_value_and_grad(theta, n_samples: int, corrected: bool = True):
    """Jitted ``(logits, rel, key) -> ((sum(rel * exposure), exposure [Q, D]), d/dlogits)``."""

    def objective(logits, rel, key):
        expo = le.exposure(logits, theta, key, n_samples, corrected=corrected)
        return jnp.sum(rel * expo), expo

    return jax.jit(jax.value_and_grad(objective, has_aux=True))


def reference_value_and_grad(theta, n_samples: int):
    """The same for the listing, vmapped over queries with one key per query."""
    per_query = jax.vmap(reference_exposure, in_axes=(0, None, 0, None))

    def objective(logits, rel, key):
        expo = per_query(logits, theta, jax.random.split(key, logits.shape[0]), n_samples)
        return jnp.sum(rel * expo), expo

    return jax.jit(jax.value_and_grad(objective, has_aux=True))


def reference_same_noise(theta, n_samples: int):
    """The listing fed the library's own Gumbel noise ``[N, Q, D]`` (identical rankings)."""
    per_query = jax.vmap(exposure_listing, in_axes=(0, None, 0))

    def objective(logits, rel, key):
        gumbel = jax.random.gumbel(key, (n_samples,) + logits.shape, dtype=jnp.float32)
        rankings = jax.vmap(rankings_from_noise, in_axes=(0, 1))(logits, gumbel)  # [Q, N, D]
        expo = per_query(logits, theta, rankings)
        return jnp.sum(rel * expo), expo

    return jax.jit(jax.value_and_grad(objective, has_aux=True))


def draws(fn, logits, rel, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """``[R, Q, D]`` exposures and gradients over keys ``make_key(100 + r)``."""
    expos, grads = [], []
    for r in range(n_keys):
        (_, expo), grad = fn(logits, rel, make_key(100 + r))
        expos.append(np.asarray(expo))
        grads.append(np.asarray(grad))
    return np.stack(expos), np.stack(grads)


def noise_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """``sum_e (mean_a - mean_b)^2 / sum_e (var_a + var_b) / R`` over the ``R`` draws of
    every element ``e``: about 1 when ``a`` and ``b`` have the same expectation."""
    n = a.shape[0]
    diff2 = (a.mean(axis=0) - b.mean(axis=0)) ** 2
    var = (a.var(axis=0, ddof=1) + b.var(axis=0, ddof=1)) / n
    return float(np.sum(diff2) / np.sum(var))


def exact_exposure_fn(n_items: int, theta: jax.Array) -> Callable[[jax.Array], jax.Array]:
    """Exact PL top-K exposure of one query by enumerating all ``D!/(D-K)!`` rankings."""
    n_slots = theta.shape[0]
    perms = np.array(list(itertools.permutations(range(n_items), n_slots)))  # [P, K]
    one_hot = perms[:, :, None] == np.arange(n_items)  # [P, K, D]
    available = (np.cumsum(one_hot, axis=1) - one_hot) == 0  # d not in y_{1:k-1}

    def exposure(scores):
        log_z = jax.nn.logsumexp(jnp.where(available, scores, -jnp.inf), axis=-1)  # [P, K]
        prob = jnp.exp(jnp.sum(scores[perms] - log_z, axis=-1))  # [P]
        return jnp.einsum("p,pkd,k->d", prob, one_hot.astype(jnp.float32), theta)

    return exposure


def exact_check(n_samples: int) -> dict[str, float]:
    """Max |z| of ours, the listing and exposure_original against exact enumeration.

    One query (``D = 6``, ``K = 3``) repeated in ``M`` rows: every row draws its own
    samples, so the ``M`` row estimates are independent.
    """
    theta = dcg_theta(EXACT_SLOTS)
    scores = jnp.array(EXACT_SCORES)
    rel = jnp.array(EXACT_RELEVANCE)
    exact = exact_exposure_fn(scores.shape[0], theta)
    want_expo = np.asarray(exact(scores))
    want_grad = np.asarray(jax.grad(lambda f: jnp.sum(rel * exact(f)))(scores))
    logits = jnp.tile(scores, (EXACT_ROWS, 1))
    rels = jnp.tile(rel, (EXACT_ROWS, 1))
    fns = {
        "ours": ours_value_and_grad(theta, n_samples),
        "listing": reference_value_and_grad(theta, n_samples),
        "original": ours_value_and_grad(theta, n_samples, corrected=False),
    }
    out = {}
    for name, fn in fns.items():
        (_, expo), grad = fn(logits, rels, make_key(3))
        for what, got, want in (("exposure", np.asarray(expo), want_expo), ("grad", np.asarray(grad), want_grad)):
            z = (got.mean(axis=0) - want) / (got.std(axis=0, ddof=1) / np.sqrt(EXACT_ROWS))
            out[f"exact_z_{what}_{name}"] = float(np.max(np.abs(z)))
    return out


def check_kernels(sizes: Sizes, logits, rel, theta, ours, reference) -> dict[str, float]:
    """Same-noise agreement, independent-key agreement, total exposure, exact check."""
    logits, rel = logits[: sizes.check_queries], rel[: sizes.check_queries]
    key = make_key(7)
    (v_ours, e_ours), g_ours = ours(logits, rel, key)
    (v_same, e_same), g_same = reference_same_noise(theta, sizes.kernel_samples)(logits, rel, key)
    e_ref_all, g_ref_all = draws(reference, logits, rel, sizes.check_keys)
    e_ours_all, g_ours_all = draws(ours, logits, rel, sizes.check_keys)
    total = float(jnp.sum(theta))
    sums = np.concatenate([e_ref_all.sum(-1).ravel(), e_ours_all.sum(-1).ravel()])
    return {
        "same_noise_value_rel_diff": float(abs(v_ours - v_same) / abs(v_same)),
        "same_noise_exposure_max_abs_diff": float(jnp.max(jnp.abs(e_ours - e_same))),
        "same_noise_grad_max_abs_diff": float(jnp.max(jnp.abs(g_ours - g_same))),
        "grad_max_abs": float(jnp.max(jnp.abs(g_same))),
        "noise_ratio_exposure": noise_ratio(e_ours_all, e_ref_all),
        "noise_ratio_grad": noise_ratio(g_ours_all, g_ref_all),
        "total_exposure_max_abs_err": float(np.max(np.abs(sums - total))),
        "total_exposure": total,
        **exact_check(sizes.kernel_samples),
    }


def time_kernel(fn, logits, rel, repeats: int) -> float:
    """Best-of milliseconds of one call (after a warm-up call), a fresh key per call."""
    jax.block_until_ready(fn(logits, rel, make_key(0)))
    seeds = iter(range(1, repeats + 1))
    return 1e3 * best_of(lambda: jax.block_until_ready(fn(logits, rel, make_key(next(seeds)))), repeats)


def kernel_part(sizes: Sizes) -> dict[str, float]:
    logits, rel, theta = kernel_problem(sizes)
    n = sizes.kernel_samples
    ours = ours_value_and_grad(theta, n)
    reference = reference_value_and_grad(theta, n)
    checks = check_kernels(sizes, logits, rel, theta, ours, reference)
    ours_ms = time_kernel(ours, logits, rel, sizes.kernel_repeats)
    reference_ms = time_kernel(reference, logits, rel, sizes.kernel_repeats)
    return {**checks, "ours_ms": ours_ms, "reference_ms": reference_ms, "ratio": reference_ms / ours_ms}


def checks_pass(k: dict[str, float]) -> bool:
    """Loose thresholds: agreement within noise, tiny same-noise differences, |z| < 4.5."""
    return (
        k["same_noise_value_rel_diff"] < 1e-4
        and k["same_noise_grad_max_abs_diff"] < 1e-4 * max(1.0, k["grad_max_abs"])
        and 0.5 < k["noise_ratio_exposure"] < 1.5
        and 0.5 < k["noise_ratio_grad"] < 1.5
        and k["total_exposure_max_abs_err"] < 1e-3
        and all(k[f"exact_z_{what}_{name}"] < EXACT_Z_MAX for what in ("exposure", "grad") for name in IMPLEMENTATIONS)
    )


# -- output ------------------------------------------------------------------------------------------
def print_epochs(sizes: Sizes, epochs: dict[tuple[str, int], dict[str, float]], n_train: int) -> None:
    ns = sorted(sizes.epochs)
    print(
        f"Part 1: seconds per training epoch, Yahoo sample ({n_train} training queries = 1 step of "
        f"{BATCH_QUERIES}), MLP {list(sizes.hidden)}, K={CUTOFF}"
    )
    print("  median of epochs 2..E (E = " + ", ".join(f"{sizes.epochs[n]} at N={n}" for n in ns) + ")")
    header = f"{'estimator':<20}" + "".join(f"{f'N={n}':>12}" for n in ns) + "".join(f"{f'1st N={n}':>13}" for n in ns)
    print(header)
    print("-" * len(header))
    for name in le.GRADIENT_ESTIMATORS:
        median = "".join(f"{epochs[(name, n)]['median']:>11.3f}s" for n in ns)
        first = "".join(f"{epochs[(name, n)]['first']:>12.1f}s" for n in ns)
        print(f"{name:<20}{median}{first}")
    print("  '1st' = epoch 1 (includes JIT compilation of the training step)")
    wall = sum(r["wall"] for r in epochs.values())
    print(f"  wall time of part 1 (all train_ltr calls, incl. compilation and evaluation): {wall:.0f} s")


def print_kernel(sizes: Sizes, k: dict[str, float]) -> None:
    q, d, n = sizes.kernel_queries, sizes.kernel_docs, sizes.kernel_samples
    print()
    print(f"Part 2: exposure kernel, value + grad of sum(rel * exposure), Q={q}, D={d}, K={CUTOFF}, N={n}")
    print(f"  checks before timing (on the first {sizes.check_queries} queries):")
    print(
        f"    same noise: value rel. diff {k['same_noise_value_rel_diff']:.1e}, exposure max |diff| "
        f"{k['same_noise_exposure_max_abs_diff']:.1e}, grad max |diff| {k['same_noise_grad_max_abs_diff']:.1e} "
        f"(max |grad| {k['grad_max_abs']:.2e})"
    )
    print(
        f"    {sizes.check_keys} independent keys, squared difference of the means / its noise, ours vs "
        f"listing: exposure {k['noise_ratio_exposure']:.2f}, gradient {k['noise_ratio_grad']:.2f} (about 1)"
    )
    print(
        f"    total exposure per query = sum(theta) = {k['total_exposure']:.4f}: max |err| "
        f"{k['total_exposure_max_abs_err']:.1e}"
    )
    print(
        f"    exact enumeration (D={len(EXACT_SCORES)}, K={EXACT_SLOTS}, {EXACT_ROWS} rows, N={n}), max |z| of "
        f"exposure / gradient (< {EXACT_Z_MAX} expected):"
    )
    for name, label in (("ours", "ours"), ("listing", "listing"), ("original", "exposure_original (control, biased)")):
        print(f"      {label:<38}{k[f'exact_z_exposure_{name}']:>8.1f} /{k[f'exact_z_grad_{name}']:>8.1f}")
    print(f"    checks pass: {checks_pass(k)}")
    header = f"{'implementation':<40}{'ms/call':>10}"
    print(f"  timing on all {q} queries: warm-up call, then best of {sizes.kernel_repeats}")
    print("  " + header)
    print("  " + "-" * len(header))
    print(f"  {'ours (le.exposure, corrected)':<40}{k['ours_ms']:>10.1f}")
    print(f"  {'Figure 8 listing, vmapped (reference)':<40}{k['reference_ms']:>10.1f}")
    print(f"  reference / ours: {k['ratio']:.2f}x")


def headline(sizes: Sizes, quick: bool, epochs, kernel: dict[str, float], total_seconds: float) -> dict:
    summary: dict[str, object] = {"bench": "ltr_estimators", "quick": quick}
    summary["mlp"] = list(sizes.hidden)
    summary["epochs"] = {str(n): e for n, e in sizes.epochs.items()}
    for (name, n), r in epochs.items():
        summary[f"epoch_s_{name}_N{n}"] = round(r["median"], 4)
    summary["kernel_shape_QDKN"] = [sizes.kernel_queries, sizes.kernel_docs, CUTOFF, sizes.kernel_samples]
    summary["kernel_ours_ms"] = round(kernel["ours_ms"], 2)
    summary["kernel_reference_ms"] = round(kernel["reference_ms"], 2)
    summary["kernel_ratio_reference_over_ours"] = round(kernel["ratio"], 3)
    summary["kernel_noise_ratio_grad"] = round(kernel["noise_ratio_grad"], 3)
    for name in ("ours", "listing", "original"):
        summary[f"exact_max_z_grad_{name}"] = round(kernel[f"exact_z_grad_{name}"], 1)
    summary["kernel_checks_pass"] = checks_pass(kernel)
    summary["total_seconds"] = round(total_seconds, 1)
    summary.update(environment())
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shrink every size (smoke test)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    start = time.perf_counter()

    kernel = kernel_part(sizes)
    train, valid = load_yahoo()
    epochs = {
        (name, n): epoch_seconds(train, valid, sizes, name, n)
        for name in le.GRADIENT_ESTIMATORS
        for n in sorted(sizes.epochs)
    }
    print_epochs(sizes, epochs, train.features.shape[0])
    print_kernel(sizes, kernel)
    print(json.dumps(headline(sizes, args.quick, epochs, kernel, time.perf_counter() - start)))


if __name__ == "__main__":
    main()
