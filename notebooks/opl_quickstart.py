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
# # Quickstart: your own logging policy, R-POD, and off-policy evaluation
#
# Simulate logs from the synthetic environment with a logging policy written as a plain
# function, learn ranking policies from them (IPS, the regression argmax and R-POD with
# k=2), and compare three views of each policy's value: the simulator's ground truth, and
# the off-policy estimates a user without a simulator would have (DR and SNIPS on
# held-out logs).

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from opl_rank import enable_compilation_cache, make_key
from opl_rank.data import train_val_split
from opl_rank.opl import ope
from opl_rank.opl.learners import LearnerConfig, fit
from opl_rank.opl.reward_models import fit_reward_model
from opl_rank.optimization import TrainConfig
from simulators import SyntheticRankingEnv

enable_compilation_cache()  # a rerun loads the compiled kernels (~/.cache/opl_rank/jax)

# Outputs go under the repository root (results/ is git-ignored), also when Jupyter runs this
# notebook from notebooks/; an absolute OPL_RANK_NOTEBOOK_OUT is used as it is.
if "__file__" in globals():
    ROOT = Path(__file__).resolve().parent.parent
else:
    ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
SIZE = os.environ.get("OPL_RANK_NOTEBOOK_SIZE", "default")
OUT = ROOT / os.environ.get("OPL_RANK_NOTEBOOK_OUT", "results/notebooks/opl_quickstart")
os.makedirs(OUT, exist_ok=True)
N, EPOCHS, EVAL, SAMPLES = (1000, 2, 4000, 32) if SIZE == "smallest" else (8000, 30, 20_000, 256)

# %% [markdown]
# A logging policy is any function `(context [n, dx], item_features [D, D]) -> logits [n, D]`
# (NumPy, scikit-learn or JAX). This one prefers low item ids and leans on the first context
# feature; the environment checks its output at every call.


# %%
def my_logging_policy(context, item_features):
    context = np.asarray(context)
    n_items = np.asarray(item_features).shape[0]
    return -0.3 * np.arange(n_items)[None, :] + 0.5 * context[:, :1] * np.linspace(-1, 1, n_items)[None, :]


env = SyntheticRankingEnv.create(make_key(0), n_items=10, ranking_length=5, lam=1.0, logging_policy=my_logging_policy)
data = env.sample_logged_data(make_key(1), N, position_marginals="exact")
train, holdout = train_val_split(data, make_key(2), 0.3)
print(data.summary())

# %%
fast = TrainConfig(epochs=EPOCHS, batch_size=256, learning_rate=0.05)
reward = TrainConfig(epochs=2 * EPOCHS, batch_size=256, learning_rate=0.02)
policies = {
    "ips": fit(train, make_key(3), LearnerConfig("ips", train=fast)),
    "regression/pairwise": fit(
        train, make_key(3), LearnerConfig("regression", reward_model="pairwise", reward_train=reward)
    ),
    "rpod(k=2)/pairwise": fit(
        train, make_key(3), LearnerConfig("rpod", k=2, reward_model="pairwise", train=fast, reward_train=reward)
    ),
}
f_hat = fit_reward_model(train, make_key(4), kind="pairwise", config=reward)

# %%
rows = []
v0 = env.logging_policy_value(make_key(5), EVAL)
for name, policy in policies.items():
    truth = env.policy_value(policy, make_key(5), EVAL)
    estimates = ope.evaluate(
        policy, holdout, make_key(6), estimators=("dr", "snips"), reward_model=f_hat, ci="normal", n_samples=SAMPLES
    )
    rows.append(
        {
            "policy": name,
            "V_true": truth.value,
            "V_true_se": truth.stderr,
            "V0": v0.value,
            **{f"{e}": r.value for e, r in estimates.items()},
            **{f"{e}_se": r.stderr for e, r in estimates.items()},
            "dr_ess": estimates["dr"].ess,
        }
    )
table = pd.DataFrame(rows)
table.to_csv(os.path.join(OUT, "policies.csv"), index=False)
table

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
x = np.arange(len(table))
for i, (column, label) in enumerate(
    [("V_true", "ground truth"), ("dr", "DR (hold-out)"), ("snips", "SNIPS (hold-out)")]
):
    err = table[column + "_se"] if column + "_se" in table else None
    ax.bar(x + (i - 1) * 0.27, table[column], width=0.27, yerr=err, capsize=2, label=label)
ax.axhline(v0.value, color="grey", linestyle="--", label="logging policy")
ax.set_xticks(x, table["policy"], fontsize=8)
ax.set_ylabel("policy value")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(os.path.join(OUT, "policies.png"), dpi=120)  # the figure stays open: Jupyter shows it
