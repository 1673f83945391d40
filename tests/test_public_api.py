"""What ``import opl_rank`` makes reachable: the submodules and the main names."""

import importlib
import types

import opl_rank

SUBMODULES = [
    "learners",
    "marginals",
    "metrics",
    "ope",
    "opl_estimators",
    "pairwise",
    "plackett_luce",
    "policies",
]


def test_submodules_are_attributes_of_the_package():
    for name in SUBMODULES:
        module = getattr(opl_rank, name)
        assert isinstance(module, types.ModuleType), name
        assert module is importlib.import_module(f"opl_rank.{name}"), name
        assert name in opl_rank.__all__, name
    # ``opl_rank.select_k`` is the function; its module is ``opl_rank.k_selection``.
    assert opl_rank.k_selection is importlib.import_module("opl_rank.select_k")
    assert opl_rank.select_k is opl_rank.k_selection.select_k


def test_key_names_are_reachable():
    assert opl_rank.fit is opl_rank.learners.fit
    assert opl_rank.LearnerConfig is opl_rank.learners.LearnerConfig
    assert opl_rank.LoggedData is importlib.import_module("opl_rank.data").LoggedData
    assert callable(opl_rank.ope.evaluate) and opl_rank.evaluate is opl_rank.ope.evaluate
    assert opl_rank.PLPolicy is opl_rank.policies.PLPolicy
    assert opl_rank.TwoStagePolicy is opl_rank.policies.TwoStagePolicy
    assert opl_rank.ESTIMATORS is opl_rank.opl_estimators.ESTIMATORS
    assert opl_rank.register is opl_rank.opl_estimators.register
    assert opl_rank.exact_position_marginals is opl_rank.marginals.exact_position_marginals
    assert opl_rank.dcg_position_weights is opl_rank.metrics.dcg_position_weights


def test_everything_in_all_exists():
    missing = [name for name in opl_rank.__all__ if not hasattr(opl_rank, name)]
    assert not missing


def test_position_marginals_live_in_one_module():
    """Moved out of ``plackett_luce`` with no re-export left behind."""
    for name in ("PositionMarginals", "exact_position_marginals", "exact_slot_marginals",
                 "exact_ranked_item_marginals", "estimate_position_marginals", "position_marginals",
                 "QUADRATURE_NODES"):
        assert hasattr(opl_rank.marginals, name), name
        assert not hasattr(opl_rank.plackett_luce, name), name
    assert not hasattr(importlib.import_module("opl_rank.data"), "dcg_position_weights")
