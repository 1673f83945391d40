"""R-POD's measured error sources (opl_rank.opl.diagnostics) and the regime sweep's machinery:
pairs sharing a top k follow pi_0's conditional law (against enumeration), the CPC violation
is 0 exactly when f_hat's differences are q's, the ESS is Kish's in log space, and a sweep with
``diagnostics``, early stopping and an f_hat-class axis writes rows the regime report reads."""

import collections
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.opl_sweep import OPLSweep, run_sweep
from experiments.report import load_rows
from experiments.sweep_config import cell_config, cell_name, cells, resolved_config
from opl_rank.opl import diagnostics


def _pl_prob(logits, ranking):
    """PL probability of a (partial) ranking, float64."""
    logits = np.asarray(logits, np.float64)
    left = list(range(len(logits)))
    p = 1.0
    for item in ranking:
        w = np.exp(logits[left])
        p *= math.exp(logits[item]) / w.sum()
        left.remove(item)
    return p


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_pairs_share_the_top_k_and_redraw_the_rest_from_pi0_given_the_prefix(k):
    """b's bottom given a's top k has pi_0's conditional law: the joint frequencies of (a, b)
    match P(a) P(b | a_{1:k}) by enumeration (D=4, L=3), within 4 standard errors."""
    logits = jnp.array([[1.0, 0.2, -0.5, 0.7]])
    n_pairs = 40_000
    a, b = diagnostics.shared_prefix_pairs(jax.random.key(k), logits, k, 3, n_pairs)
    a, b = np.asarray(a[:, 0]), np.asarray(b[:, 0])
    assert a.shape == b.shape == (n_pairs, 3)
    assert (a[:, :k] == b[:, :k]).all()
    assert all(len(set(r)) == 3 for r in b[:200])
    counts = collections.Counter(zip(map(tuple, a), map(tuple, b)))
    worst = 0.0
    for ra in itertools.permutations(range(4), 3):
        pa = _pl_prob(logits[0], ra)
        for rb in itertools.permutations(range(4), 3):
            if rb[:k] != ra[:k]:
                assert counts[(ra, rb)] == 0
                continue
            expected = pa * _pl_prob(logits[0], rb) / _pl_prob(logits[0], ra[:k])
            se = math.sqrt(expected * (1 - expected) / n_pairs)
            worst = max(worst, abs(counts[(ra, rb)] / n_pairs - expected) / se)
    assert worst < 4.5, worst


def test_cpc_violation_is_zero_for_q_plus_a_prefix_term_and_positive_otherwise():
    """CPC holds for f_hat = q + any function of the top k (the paper's condition), not for a
    model that misses a term below the prefix."""
    key = jax.random.key(0)
    n_items, n_slots, k = 6, 4, 2
    logits = jax.random.normal(key, (50, n_items))
    a, b = diagnostics.shared_prefix_pairs(jax.random.key(1), logits, k, n_slots, 8)
    value = jax.random.normal(jax.random.key(2), (n_items,))
    weight = jnp.array([1.0, 0.7, 0.5, 0.3])

    def q(r):
        return value[r] @ weight + 0.5 * value[r[..., 2]] * value[r[..., 3]]  # an interaction below k

    prefix_term = 3.0 * value[a[..., 0]] - value[a[..., 1]]  # the same for a and b
    violation, scale = diagnostics.cpc_violation(q(a), q(b), q(a) + prefix_term, q(b) + prefix_term)
    assert float(violation) < 1e-5 and float(scale) > 0.1
    additive = lambda r: value[r] @ weight  # noqa: E731
    violation, scale = diagnostics.cpc_violation(q(a), q(b), additive(a), additive(b))
    delta = np.asarray(q(a) - q(b) - additive(a) + additive(b))
    assert float(violation) == pytest.approx(np.abs(delta).mean(), rel=1e-5) and float(violation) > 0.01


def test_ess_fraction_is_kish_in_log_space():
    assert float(diagnostics.ess_fraction(jnp.zeros(10))) == pytest.approx(1.0)
    assert float(diagnostics.ess_fraction(jnp.array([0.0, -200.0, -200.0, -200.0]))) == pytest.approx(0.25)
    lw = np.random.default_rng(0).normal(size=100) * 2
    w = np.exp(lw)
    assert float(diagnostics.ess_fraction(jnp.asarray(lw, jnp.float32))) == pytest.approx(
        w.sum() ** 2 / (w**2).sum() / 100, rel=1e-4
    )
    big = diagnostics.ess_fraction(jnp.asarray(lw + 500.0, jnp.float32))  # e^500 overflows float32; log space does not
    assert np.isfinite(float(big)) and float(big) == pytest.approx(w.sum() ** 2 / (w**2).sum() / 100, rel=1e-3)
    lp0 = jnp.log(jnp.array([[0.5, 0.1, 0.05], [0.2, 0.1, 0.01]]))
    np.testing.assert_allclose(diagnostics.log_prefix_weights(jnp.zeros(2), lp0, 0), [0.0, 0.0])
    np.testing.assert_allclose(
        diagnostics.log_prefix_weights(jnp.log(jnp.array([0.4, 0.4])), lp0, 2), np.log([4.0, 4.0])
    )
    with pytest.raises(ValueError, match="k must be in"):
        diagnostics.log_prefix_weights(jnp.zeros(2), lp0, 4)


TINY = dict(
    n_items=(5,),
    ranking_length=(3,),
    lam=(1.0,),
    n=(400,),
    seeds=(0,),
    methods=("dr", "regression", "rpod", "rpod-ope"),
    reward_models=("additive",),
    eval_contexts=1000,
    policy_epochs=4,
    reward_epochs=4,
)


def test_config_keys_for_early_stopping_diagnostics_and_the_f_hat_class():
    plain = OPLSweep(**TINY)
    for key in ("valid_fraction", "policy_patience", "reward_patience", "diagnostics"):
        assert key not in resolved_config(plain)  # older configs keep their hash
    sweep = OPLSweep(
        **TINY,
        valid_fraction=0.2,
        policy_patience=2,
        diagnostics=True,
        axes={"reward_hidden": ["linear", [8, 4], "16"]},
    )
    assert resolved_config(sweep)["diagnostics"] is True
    assert [c["reward_hidden"] for c in cells(sweep)] == ["linear", "8x4", "16"]
    assert cell_name(cells(sweep)[1]).endswith("_reward_hidden8x4")
    assert [cell_config(sweep, c).reward_hidden for c in cells(sweep)] == [(), (8, 4), (16,)]
    with pytest.raises(ValueError, match="policy_patience needs held-out rounds"):
        OPLSweep(**TINY, policy_patience=3)
    with pytest.raises(ValueError, match="valid_fraction must be"):
        OPLSweep(**TINY, valid_fraction=1.0)
    with pytest.raises(ValueError, match="reward_patience must"):
        OPLSweep(**TINY, valid_fraction=0.2, reward_patience=0)
    with pytest.raises(ValueError, match=r"axes.reward_hidden\[0\]: hidden sizes must be positive"):
        OPLSweep(**TINY, axes={"reward_hidden": ["0x4"]})


@pytest.mark.extended
def test_a_diagnosed_sweep_writes_the_causes_and_the_regime_report(tmp_path):
    """Every row carries the CPC violation and the ESS: 0 violation and the full weights'
    ESS at k = L (DR's), ESS 1 at k = 0 (regression's), a selection row those of its k; the
    regime report reads the rows."""
    from experiments.rpod_regime import write_regime_report

    out = tmp_path / "regime"
    sweep = OPLSweep(
        **dict(TINY, seeds=(0, 1)),
        valid_fraction=0.2,
        policy_patience=2,
        reward_patience=2,
        diagnostics=True,
        axes={"interaction_scale": [2.0]},
        output_dir=str(out),
    )
    run_sweep(sweep, echo=lambda *_: None)
    rows = load_rows(str(out))
    assert len(rows) == 2 * 7
    by = {(r["seed"], r["method"], r["k"]): r for r in rows}
    for seed in (0, 1):
        assert by[(seed, "rpod", 0)]["ess_fraction"] == 1.0 == by[(seed, "regression", None)]["ess_fraction"]
        assert by[(seed, "rpod", 3)]["cpc_violation"] == 0.0 == by[(seed, "dr", None)]["cpc_violation"]
        assert 0.0 < by[(seed, "dr", None)]["ess_fraction"] <= 1.0
        k1 = by[(seed, "rpod", 1)]
        assert 0.0 < k1["ess_fraction"] <= 1.0 and 0.0 < k1["cpc_violation"] <= 2 * k1["cpc_scale"]
        assert by[(seed, "rpod", 0)]["cpc_violation"] >= k1["cpc_violation"] * 0.5  # f_hat misses interactions
        chosen = by[(seed, "rpod-ope", None)]
        assert chosen["ess_fraction"] == by[(seed, "rpod", chosen["k_selected"])]["ess_fraction"]
    paths = write_regime_report(str(out))
    text = open(paths["report.md"]).read()
    assert "1 regimes" in text and "| 5 | 400 | 1 | 2 | additive-linear | 2 |" in text, text
    import pandas as pd

    assert len(pd.read_csv(paths["rows.csv"])) == len(rows)
    regime = pd.read_csv(paths["regime.csv"]).iloc[0]
    gains = {k: np.mean([by[(s, "rpod", k)]["normalized_gain"] for s in (0, 1)]) for k in range(4)}
    assert regime["best_k"] == max(gains, key=gains.get)
    best_middle = max((1, 2), key=gains.get)
    base = 0 if gains[0] >= gains[3] else 3
    assert regime["margin"] == pytest.approx(gains[best_middle] - gains[base], abs=1e-9)


def test_the_regime_report_reads_every_cell_of_one_config_only(tmp_path):
    import json

    from experiments.rpod_regime import load_cells

    with pytest.raises(ValueError, match="no finished cells"):
        load_cells(str(tmp_path))
    (tmp_path / "cells").mkdir()
    for name, digest in (("a", "1"), ("b", "2")):
        cell = {"config_hash": digest, "rows": [{"method": "dr"}]}
        (tmp_path / "cells" / f"{name}.json").write_text(json.dumps(cell))
    with pytest.raises(ValueError, match="2 different configs"):
        load_cells(str(tmp_path))
