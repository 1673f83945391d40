# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: kernelspec,jupytext,-jupytext.text_representation
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Learning curves of the PL policy-gradient estimators on the Yahoo! LTR sample
#
# A small reproduction of the learning-curve experiment of *Exposure-based RL for LTR*
# (Secs. 6-8, Figs. 4-5, Table 1; the paper text is not part of this repository):
# NDCG@10 on held-out queries after every epoch for PL-Rank-3 (`plrank3`), the standard
# (`standard`), placement (`placement`), marginalize-all (`marginalize_all`) and
# exposure-based (`exposure`) estimators, all with leave-one-out baseline corrections
# (PL-Rank-3 has none), at N sampled rankings per query, over several seeds.
#
# What the paper claims (MSLR-Web30k and Istella-S, 15,000 epochs, 25 runs, float32 on GPU):
#
# * with baselines, the exposure-based estimator learns fastest and converges at the
#   highest (or a competitive) NDCG@10 **as long as N >= 5**; it is beaten by standard and
#   placement only at N = 2 (Sec. 7.3, Table 1);
# * with baselines, marginalize-all has the *poorest* performance of the RL estimators
#   (its unconditioned baseline fits badly; Sec. 7.2); standard and placement are close;
# * PL-Rank-3 is **unstable in float32**: after a few hundred epochs its NDCG@10 degrades
#   dramatically (also on the training set), which the authors attribute to the
#   unnormalised `exp(score)` quantities in its custom gradient (Sec. 7.1); it is the
#   fastest per epoch for N <= 100 (Sec. 7.4);
# * no meaningful gain of the exposure estimator beyond N = 100.
#
# How this run differs (so read it as a sanity check of the direction, not as a replication):
#
# * data: the 176-query LightGBM sample of Yahoo! C14 (about 15 docs per query), one fixed
#   80/20 split by query (seed 0): 141 training and 35 held-out queries. NDCG@10 on 35
#   queries is noisy, and the standard errors below are over seeds (model initialisation
#   and sampling), not over queries;
# * model: a small ReLU MLP for every estimator (the paper: 1024-512-256 with batch norm
#   and dropout, and a 32-32 sigmoid net for PL-Rank), Adamax at 1e-3 as in the paper;
# * batches of 16 queries instead of 128: with 141 training queries a batch of 128 gives
#   one update per epoch;
# * tens of epochs, not thousands. PL-Rank-3's float32 overflow needs scores above ~88
#   (`exp` overflows); a small MLP on min-max scaled features, trained for a few hundred
#   updates, has scores far below that, so **the instability may well not show here** --
#   the largest |score| reached is printed below to check;
# * `exposure` is the library's corrected estimator (paper App. A, Eqs. 36-39), which the
#   paper's experiments did not use (its Eq. 33 is `exposure_original`).

# %%
# Size cell: every knob of the run. OPL_RANK_NOTEBOOK_SIZE=smallest shrinks it (tests);
# OPL_RANK_NOTEBOOK_OUT overrides the output folder.
import os

SIZE = os.environ.get("OPL_RANK_NOTEBOOK_SIZE", "default")
if SIZE == "default":
    ESTIMATORS = ("plrank3", "standard", "placement", "marginalize_all", "exposure")
    N_VALUES = (10, 100)  # samples per query and step
    SEEDS = tuple(range(6))  # model init + sampling; the query split is fixed
    EPOCHS = 30
    HIDDEN = (64, 32)
elif SIZE == "smallest":
    ESTIMATORS = ("plrank3", "exposure")
    N_VALUES = (10,)
    SEEDS = (0,)
    EPOCHS = 2
    HIDDEN = (8,)
else:
    raise ValueError(f"OPL_RANK_NOTEBOOK_SIZE must be 'default' or 'smallest', got {SIZE!r}")
LEARNING_RATE = 1e-3  # Adamax, as in the paper
BATCH_QUERIES = 16
CUTOFF = 10  # K: sampled ranking length and NDCG@K
SPLIT_SEED = 0
VALID_FRACTION = 0.2
TARGET_FRACTION = 0.98  # "epochs to reach 98% of the best mean NDCG@10 at that N"
DATA = "yahoo_sample"  # a data set shipped with the package (simulators.datasets, simulators/data/)
OUT_DIR = os.environ.get("OPL_RANK_NOTEBOOK_OUT", "results/exposure_ltr_curves")

# %%
import io
import math
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# The repository root: this file's parent folder's parent (or the working directory in Jupyter).
if "__file__" in globals():
    REPO_ROOT = Path(__file__).resolve().parent.parent
else:
    REPO_ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
if str(REPO_ROOT) not in sys.path:  # plain `python notebooks/...` without an installed package
    sys.path.insert(0, str(REPO_ROOT))

import jax

from opl_rank import make_key
from opl_rank.io.atomic import atomic_write, atomic_write_text
from opl_rank.ltr.training import LTRConfig, train_ltr
from opl_rank.scorers import MLPScorer
from simulators import datasets
from simulators.letor import split_queries

out_dir = Path(OUT_DIR) if Path(OUT_DIR).is_absolute() else REPO_ROOT / OUT_DIR
out_dir.mkdir(parents=True, exist_ok=True)
# Seeds of one (estimator, N) compile the same programs: JAX's persistent compilation cache
# lets every seed after the first load them instead of recompiling (compiling dominates
# these short runs). It lives in the (git-ignored) output folder.
jax.config.update("jax_compilation_cache_dir", str(out_dir / "jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

NDCG = f"valid_ndcg@{CUTOFF}"
print(f"size={SIZE}  jax {jax.__version__} on {jax.default_backend()}  output: {out_dir}")

# %% [markdown]
# ## Data: the Yahoo! LTR sample, one fixed split by query

# %%
data = datasets.load(DATA, normalize="minmax")
train, valid = split_queries(data, (1 - VALID_FRACTION, VALID_FRACTION), seed=SPLIT_SEED)
print(
    f"{data.qids.shape[0]} queries, {int(data.mask.sum())} docs, {data.n_features} features; "
    f"train {train.qids.shape[0]} queries, held-out {valid.qids.shape[0]} queries "
    f"(split seed {SPLIT_SEED}), up to {data.mask.shape[1]} docs per query"
)

# %% [markdown]
# ## Training: every estimator x N x seed
#
# The CSV is rewritten (atomically) after every run, so an interrupted run keeps what it
# finished. `seconds` is the training time of an epoch; epoch 1 includes compilation.

# %%
csv_path = out_dir / "curves.csv"
rows: list[dict] = []
runs: list[dict] = []  # one per run: largest |score| on the held-out docs after training
t_start = time.perf_counter()
for estimator in ESTIMATORS:
    for n_samples in N_VALUES:
        config = LTRConfig(
            hidden=tuple(HIDDEN),
            learning_rate=LEARNING_RATE,
            batch_queries=BATCH_QUERIES,
            epochs=EPOCHS,
            estimator=estimator,
            n_samples=n_samples,
            baseline=True,
            cutoff=CUTOFF,
        )
        for seed in SEEDS:
            t_run = time.perf_counter()
            result = train_ltr(train, valid, make_key(seed), config)
            for record in result.history:
                rows.append(
                    {
                        "estimator": estimator,
                        "n_samples": n_samples,
                        "seed": seed,
                        "epoch": int(record["epoch"]),
                        NDCG: record[NDCG],
                        "train_loss": record["train_loss"],
                        "valid_loss": record["valid_loss"],
                        "seconds": record["seconds"],
                    }
                )
            scores = np.asarray(MLPScorer(hidden=tuple(HIDDEN)).apply(result.params, valid.features))
            max_abs_score = float(np.max(np.abs(scores[np.asarray(valid.mask)])))
            runs.append({"estimator": estimator, "n_samples": n_samples, "seed": seed, "max_abs_score": max_abs_score})
            atomic_write_text(csv_path, pd.DataFrame(rows).to_csv(index=False))
            print(
                f"{estimator:>16s} N={n_samples:<4d} seed={seed}  final {NDCG}={result.history[-1][NDCG]:.4f}"
                f"  max|score|={max_abs_score:.2f}  {time.perf_counter() - t_run:5.1f}s",
                flush=True,
            )
total_seconds = time.perf_counter() - t_start
curves = pd.DataFrame(rows)
runs = pd.DataFrame(runs)
print(f"{len(runs)} runs, {len(curves)} rows in {total_seconds:.0f}s -> {csv_path}")

# %% [markdown]
# ## Mean ± standard error over seeds


# %%
def mean_se(values: pd.Series) -> pd.Series:
    """Mean and standard error over seeds (NaN SE for a single seed; non-finite values dropped)."""
    v = values.to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    se = v.std(ddof=1) / math.sqrt(v.size) if v.size > 1 else float("nan")
    return pd.Series({"mean": v.mean() if v.size else float("nan"), "se": se, "n": v.size})


keys = ["estimator", "n_samples"]
by_epoch = curves.groupby(keys + ["epoch"])[NDCG].apply(mean_se).unstack().reset_index()
per_run = (
    curves.sort_values("epoch")
    .groupby(keys + ["seed"])
    .agg(
        final=(NDCG, "last"),
        best=(NDCG, "max"),
        nonfinite=(NDCG, lambda s: int((~np.isfinite(s.to_numpy(float))).sum())),
    )
)
per_run["degradation"] = per_run["best"] - per_run["final"]
per_run["auc"] = curves.groupby(keys + ["seed"])[NDCG].mean()  # area under the learning curve / epochs
nonfinite_loss = curves.groupby(keys)[["train_loss", "valid_loss"]].agg(
    lambda s: int((~np.isfinite(s.to_numpy(float))).sum())
)
best_mean_at_n = by_epoch.groupby("n_samples")["mean"].max()


def epochs_to_target(group: pd.DataFrame) -> float:
    """First epoch at which the mean curve reaches TARGET_FRACTION of the best mean at that N."""
    target = TARGET_FRACTION * best_mean_at_n[group["n_samples"].iloc[0]]
    hit = group.sort_values("epoch").loc[lambda g: g["mean"] >= target, "epoch"]
    return float(hit.iloc[0]) if len(hit) else float("nan")


summary_rows = []
for n_samples in N_VALUES:
    for estimator in ESTIMATORS:
        group = by_epoch[(by_epoch["estimator"] == estimator) & (by_epoch["n_samples"] == n_samples)]
        run_stats = per_run.loc[(estimator, n_samples)]
        final, best, auc = mean_se(run_stats["final"]), mean_se(run_stats["best"]), mean_se(run_stats["auc"])
        epoch_seconds = curves.loc[
            (curves["estimator"] == estimator) & (curves["n_samples"] == n_samples) & (curves["epoch"] > 1), "seconds"
        ]
        summary_rows.append(
            {
                "estimator": estimator,
                "N": n_samples,
                "final_mean": final["mean"],
                "final_se": final["se"],
                "best_mean": best["mean"],
                "best_se": best["se"],
                "auc_mean": auc["mean"],
                "auc_se": auc["se"],
                "epochs_to_target": epochs_to_target(group),
                "s_per_epoch": float(epoch_seconds.median()) if len(epoch_seconds) else float("nan"),
                "max_abs_score": float(
                    runs.loc[(runs["estimator"] == estimator) & (runs["n_samples"] == n_samples), "max_abs_score"].max()
                ),
                "nonfinite": int(run_stats["nonfinite"].sum() + nonfinite_loss.loc[(estimator, n_samples)].sum()),
            }
        )
summary = pd.DataFrame(summary_rows)


def pm(mean: float, se: float) -> str:
    return f"{mean:.4f} ± {se:.4f}" if np.isfinite(se) else f"{mean:.4f}"


table = pd.DataFrame(
    {
        "estimator": summary["estimator"],
        "N": summary["N"],
        f"final {NDCG}": [pm(m, s) for m, s in zip(summary["final_mean"], summary["final_se"])],
        f"best {NDCG}": [pm(m, s) for m, s in zip(summary["best_mean"], summary["best_se"])],
        "mean over epochs": [pm(m, s) for m, s in zip(summary["auc_mean"], summary["auc_se"])],
        f"epochs to {TARGET_FRACTION:.0%} of best": [
            "never" if not np.isfinite(e) else str(int(e)) for e in summary["epochs_to_target"]
        ],
        "s/epoch": [f"{s:.3f}" for s in summary["s_per_epoch"]],
        "max|score|": [f"{s:.1f}" for s in summary["max_abs_score"]],
        "non-finite": summary["nonfinite"],
    }
)
print(
    f"{len(SEEDS)} seed(s), {EPOCHS} epochs, hidden {tuple(HIDDEN)}, batch {BATCH_QUERIES} queries; "
    f"'best' = each seed's best epoch (selected on the same held-out queries, so optimistic); "
    f"'mean over epochs' = area under the learning curve / epochs (learning speed and level); "
    f"'epochs to {TARGET_FRACTION:.0%} of best' = first epoch the mean curve reaches {TARGET_FRACTION:.0%} "
    f"of the best mean {NDCG} of any estimator at that N; s/epoch = median, epoch 1 (compile) excluded"
)
print(table.to_string(index=False))

# %% [markdown]
# ## Plot: one panel per N, mean ± 1 SE band over seeds

# %%
colors = dict(zip(ESTIMATORS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
fig, axes = plt.subplots(1, len(N_VALUES), figsize=(5.5 * len(N_VALUES), 4.2), sharey=True, squeeze=False)
for ax, n_samples in zip(axes[0], N_VALUES):
    for estimator in ESTIMATORS:
        g = by_epoch[(by_epoch["estimator"] == estimator) & (by_epoch["n_samples"] == n_samples)].sort_values("epoch")
        se = g["se"].fillna(0.0)
        ax.plot(g["epoch"], g["mean"], color=colors[estimator], label=estimator, lw=1.6)
        ax.fill_between(g["epoch"], g["mean"] - se, g["mean"] + se, color=colors[estimator], alpha=0.2, lw=0)
    ax.set_title(f"N = {n_samples}")
    ax.set_xlabel("epoch")
    ax.grid(alpha=0.3)
axes[0][0].set_ylabel(f"held-out NDCG@{CUTOFF}")
axes[0][-1].legend(loc="lower right", fontsize=8)
fig.suptitle(
    f"Yahoo! LTR sample ({valid.qids.shape[0]} held-out queries): mean ± 1 SE over {len(SEEDS)} seed(s); "
    f"MLP {tuple(HIDDEN)}, batch {BATCH_QUERIES}, Adamax {LEARNING_RATE:g}",
    fontsize=9,
)
fig.tight_layout()
png = io.BytesIO()
fig.savefig(png, format="png", dpi=120)  # the figure stays open: Jupyter shows it under this cell
png_path = out_dir / "curves.png"
atomic_write(png_path, lambda f: f.write(png.getvalue()))
print(f"plot -> {png_path}")

# %% [markdown]
# ## What we see
#
# Filled in by the next cell from the numbers above (nothing here is hard-coded):
# whether exposure is at least as good as the other estimators at each N, at the final
# epoch, at its best epoch and averaged over epochs (learning speed); whether PL-Rank-3 is
# behind and whether it shows any float32 trouble. Differences are paired by seed (a seed
# gives every estimator the same initial weights and batch order), mean ± SE over seeds.

# %%
findings: list[str] = []


def paired_diff(a: tuple[str, int], b: tuple[str, int], col: str) -> tuple[float, float, int]:
    """Mean and SE over seeds of ``per_run[col]`` of run ``a`` minus run ``b`` (each ``(estimator, N)``).

    Paired by seed: a seed gives every estimator the same initial weights and batch order.
    """
    diff = (per_run.loc[a][col] - per_run.loc[b][col]).dropna().to_numpy(float)
    se = diff.std(ddof=1) / math.sqrt(diff.size) if diff.size > 1 else float("nan")
    return float(diff.mean()) if diff.size else float("nan"), se, diff.size


def describe(d: float, se: float) -> str:
    if not np.isfinite(se):
        return f"{d:+.4f} (one seed: no SE)"
    z = d / se if se > 0 else float("inf") * np.sign(d)
    return f"{d:+.4f} ± {se:.4f} ({z:+.1f} SE, {'within noise' if abs(z) < 2 else 'beyond 2 SE'})"


COLUMNS = {
    "final": f"final-epoch {NDCG}",
    "best": f"best-epoch {NDCG}",
    "auc": f"{NDCG} averaged over epochs (learning speed)",
}
for n_samples in N_VALUES:
    at_n = summary[summary["N"] == n_samples].set_index("estimator")
    order = at_n.sort_values("final_mean", ascending=False)
    findings.append(
        f"N={n_samples}, final {NDCG}: " + " > ".join(f"{e} {m:.4f}" for e, m in order["final_mean"].items()) + "."
    )
    if "exposure" in at_n.index and len(at_n) > 1:
        for col, label in COLUMNS.items():
            means = per_run.loc[(slice(None), n_samples), col].groupby(level="estimator").mean().drop(index="exposure")
            top_other = means.idxmax()
            d, se, _ = paired_diff(("exposure", n_samples), (top_other, n_samples), col)
            findings.append(
                f"  exposure minus the best other ({top_other}), {label}, paired by seed: {describe(d, se)}."
            )
    speeds = at_n["epochs_to_target"]
    if speeds.notna().any():
        fastest = speeds[speeds == speeds.min()].index.tolist()
        findings.append(
            f"  epochs to {TARGET_FRACTION:.0%} of the best mean at N={n_samples}: "
            + ", ".join(f"{e} {'never' if not np.isfinite(v) else int(v)}" for e, v in speeds.items())
            + f" (fastest: {', '.join(fastest)})."
        )
    rl = at_n.drop(index="plrank3", errors="ignore")
    if "marginalize_all" in rl.index and len(rl) > 1:
        findings.append(
            f"  lowest final mean among the baseline-corrected estimators at N={n_samples}: {rl['final_mean'].idxmin()} "
            "(paper: marginalize_all)."
        )
    if "plrank3" in at_n.index and len(rl):
        top_rl = rl["final_mean"].idxmax()
        d, se, _ = paired_diff(("plrank3", n_samples), (top_rl, n_samples), "final")
        findings.append(
            f"  plrank3 minus the best baseline-corrected estimator ({top_rl}), final, paired by seed: {describe(d, se)}."
        )

if "exposure" in ESTIMATORS and len(N_VALUES) > 1:
    lo, hi = min(N_VALUES), max(N_VALUES)
    d, se, _ = paired_diff(("exposure", hi), ("exposure", lo), "final")
    findings.append(f"exposure, N={hi} minus N={lo}, final, paired by seed: {describe(d, se)}.")

if "plrank3" in ESTIMATORS:
    pl = summary[summary["estimator"] == "plrank3"]
    pl_runs = per_run.loc["plrank3"]
    others = per_run.drop(index="plrank3", level="estimator")
    findings.append(
        f"PL-Rank-3: {int(pl['nonfinite'].sum())} non-finite NDCG/loss values; largest |score| reached "
        f"{pl['max_abs_score'].max():.1f} (float32 exp overflows above ~88.7); mean drop from each run's "
        f"best to its final epoch {pl_runs['degradation'].mean():.4f}"
        + (f" vs {others['degradation'].mean():.4f} for the other estimators" if len(others) else "")
        + "."
    )
    fastest_epoch = summary.loc[summary.groupby("N")["s_per_epoch"].idxmin(), ["N", "estimator", "s_per_epoch"]]
    findings.append(
        "fastest per epoch (CPU, median): "
        + ", ".join(f"N={r.N}: {r.estimator} {r.s_per_epoch:.3f}s" for r in fastest_epoch.itertuples())
        + "."
    )
findings.append(f"total training time {total_seconds:.0f}s for {len(runs)} runs.")
print("What we see:")
print("\n".join(f"- {f}" if not f.startswith("  ") else f"  {f.strip()}" for f in findings))
