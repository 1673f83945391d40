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
# # Analysing an OPL sweep: normalised gain, winners, and choosing k by OPE
#
# Reads a sweep's `results.csv` (set `OPL_RANK_RESULTS`; by default a small sweep is run
# here first) and shows: the normalised-gain tables and winners (`opl-rank report`), the
# standard plots, and how the k picked by off-policy evaluation (`rpod-ope`) compares with
# the true best k of each cell.

# %%
import os
from pathlib import Path

import pandas as pd

from experiments.opl_sweep import OPLSweep, run_sweep
from experiments.plots import write_plots
from experiments.report import load_rows, markdown_report, setting_columns, varying_axes

# Outputs go under the repository root (results/ is git-ignored), also when Jupyter runs this
# notebook from notebooks/; an absolute OPL_RANK_NOTEBOOK_OUT is used as it is.
if "__file__" in globals():
    ROOT = Path(__file__).resolve().parent.parent
else:
    ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
SIZE = os.environ.get("OPL_RANK_NOTEBOOK_SIZE", "default")
OUT = ROOT / os.environ.get("OPL_RANK_NOTEBOOK_OUT", "results/notebooks/opl_sweep_analysis")
RESULTS = os.environ.get("OPL_RANK_RESULTS")
os.makedirs(OUT, exist_ok=True)

# %%
if RESULTS is None:
    small = SIZE == "smallest"
    sweep = OPLSweep(
        n_items=(5,) if small else (10,),
        ranking_length=(2,) if small else (5,),
        lam=(1.0,) if small else (0.0, 1.0),
        n=(400,) if small else (2000,),
        seeds=(0, 1) if small else (0, 1, 2),
        methods=("regression", "rpod", "rpod-ope")
        if small
        else ("ips", "regression", "rpod", "rpod-ope", "rpod-oracle"),
        reward_models=("pairwise",),
        eval_contexts=1000 if small else 20000,
        policy_epochs=2 if small else 30,
        reward_epochs=2 if small else 60,
        output_dir=os.path.join(OUT, "sweep"),
    )
    RESULTS = run_sweep(sweep, echo=lambda line: None)["results"]
rows = load_rows(RESULTS)
print(markdown_report(rows))

# %%
for path in write_plots(rows, OUT, show=True):  # show=True: the figures stay open, Jupyter shows them
    print("wrote", path)

# %% [markdown]
# ## k chosen by OPE vs the true best k
#
# For every cell: the true best k (the argmax of the ground-truth value over the R-POD
# fits), the k that `rpod-ope` picked from logged data alone, and the normalised gain lost
# by picking it. A cell is one setting (every column of `results.csv` that is not an
# outcome: D, L, lambda, n, tau, the simulator and any other sweep axis), reward model and seed,
# so the true best k is never picked across two taus or two values of another axis.

# %%
frame = pd.DataFrame(rows)
settings = list(setting_columns(rows))  # simulator, logging_policy, lambda, n, D, L, tau, extra axes...
keys = settings + ["seed", "reward_model"]
rpod = frame[frame["method"] == "rpod"]
best = rpod.loc[rpod.groupby(keys, dropna=False)["V"].idxmax(), keys + ["k", "normalized_gain"]].rename(
    columns={"k": "k_true_best", "normalized_gain": "gain_true_best"}
)
picked = frame[frame["method"] == "rpod-ope"][keys + ["k_selected", "normalized_gain"]].rename(
    columns={"normalized_gain": "gain_ope"}
)
selection = best.merge(picked, on=keys)
selection["gain_lost"] = selection["gain_true_best"] - selection["gain_ope"]
selection.to_csv(os.path.join(OUT, "k_selection.csv"), index=False)
# one summary row per setting: D, L, lambda, every other axis that varies in this sweep, n
by = ["D", "L", "lambda", *varying_axes(rows), "n"]
if selection["reward_model"].nunique() > 1:
    by.append("reward_model")
summary = selection.groupby(by, dropna=False).agg(
    k_true_best=("k_true_best", lambda s: ",".join(map(str, s))),
    k_ope=("k_selected", lambda s: ",".join(map(str, s))),
    gain_lost_mean=("gain_lost", "mean"),
)
summary
