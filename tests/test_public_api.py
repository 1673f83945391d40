"""What ``import opl_rank`` makes reachable: the layers, the submodules and the main names;
the old module paths as aliases; the layers' import discipline."""

import ast
import importlib
import pathlib
import subprocess
import sys
import types
import warnings

import pytest

import opl_rank
from opl_rank import _aliases

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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the old path, an alias
            assert module is importlib.import_module(f"opl_rank.{name}"), name
        assert name in opl_rank.__all__, name
    # ``opl_rank.select_k`` is the function; its module is ``opl_rank.k_selection``.
    assert opl_rank.k_selection is importlib.import_module("opl_rank.opl.select_k")
    assert opl_rank.select_k is opl_rank.k_selection.select_k


def test_key_names_are_reachable():
    assert opl_rank.fit is opl_rank.opl.learners.fit
    assert opl_rank.LearnerConfig is opl_rank.opl.learners.LearnerConfig
    assert opl_rank.LoggedData is importlib.import_module("opl_rank.data").LoggedData
    assert callable(opl_rank.opl.ope.evaluate) and opl_rank.evaluate is opl_rank.opl.ope.evaluate
    assert opl_rank.PLPolicy is opl_rank.opl.policies.PLPolicy
    assert opl_rank.TwoStagePolicy is opl_rank.opl.policies.TwoStagePolicy
    assert opl_rank.ESTIMATORS is opl_rank.opl.estimators.OPL_ESTIMATORS
    assert opl_rank.register is opl_rank.opl.estimators.register
    assert opl_rank.exact_position_marginals is opl_rank.pl.marginals.exact_position_marginals
    assert opl_rank.dcg_position_weights is opl_rank.metrics.dcg_position_weights


def test_everything_in_all_exists():
    missing = [name for name in opl_rank.__all__ if not hasattr(opl_rank, name)]
    assert not missing


def test_position_marginals_live_in_one_module():
    """Moved out of ``plackett_luce`` with no re-export left behind."""
    for name in (
        "PositionMarginals",
        "exact_position_marginals",
        "exact_slot_marginals",
        "exact_ranked_item_marginals",
        "estimate_position_marginals",
        "position_marginals",
        "QUADRATURE_NODES",
    ):
        assert hasattr(opl_rank.pl.marginals, name), name
        assert not hasattr(opl_rank.pl.plackett_luce, name), name
    assert not hasattr(importlib.import_module("opl_rank.data"), "dcg_position_weights")


@pytest.mark.parametrize("old", sorted(_aliases.MOVED))
def test_old_module_paths_are_the_new_modules_and_warn(old):
    new = importlib.import_module(_aliases.MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {_aliases.MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is new
    assert module.__spec__.name == _aliases.MOVED[old]  # the alias does not rename the module


def test_old_from_imports_still_work_in_a_fresh_process():
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from opl_rank import ope, learners, marginals  # top-level names: no warning\n"
        "warnings.simplefilter('ignore')\n"
        "from opl_rank.learners import LearnerConfig\n"
        "from opl_rank.interop.obp import from_obp_slate\n"
        "import opl_rank.opl.learners as new\n"
        "assert LearnerConfig is new.LearnerConfig\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=pathlib.Path(__file__).parents[1])


def _opl_rank_imports(path: pathlib.Path) -> set[str]:
    """Every ``opl_rank...`` module a file imports, at any depth (lazy imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("opl_rank")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opl_rank"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out - {"opl_rank"}  # ``from opl_rank import x`` counts as opl_rank.x


def test_the_pl_layer_imports_nothing_above_it():
    """opl_rank.pl is the bottom layer: it may import itself and two leaf modules, the tuning
    constants and the array reductions, which import nothing of opl_rank."""
    package = pathlib.Path(opl_rank.__file__).parent
    leaves = ("tuning", "reductions")
    for leaf in leaves:
        assert not _opl_rank_imports(package / f"{leaf}.py"), leaf
    allowed = ("opl_rank.pl",) + tuple(f"opl_rank.{leaf}" for leaf in leaves)
    bad = {
        f.name: sorted(m for m in _opl_rank_imports(f) if not m.startswith(allowed))
        for f in (package / "pl").glob("*.py")
    }
    assert not {f: m for f, m in bad.items() if m}


def test_the_opl_layer_imports_neither_ltr_nor_the_experiments():
    root = pathlib.Path(opl_rank.__file__).parent / "opl"
    for f in root.glob("*.py"):
        text = f.read_text()
        assert not any(m.startswith("opl_rank.ltr") for m in _opl_rank_imports(f)), f.name
        assert "import experiments" not in text and "from experiments" not in text, f.name


def test_the_version_is_written_once_and_everything_follows_it():
    import importlib.metadata

    import yaml

    root = pathlib.Path(__file__).parents[1]
    assert importlib.metadata.version("opl_rank") == opl_rank.__version__
    assert yaml.safe_load((root / "CITATION.cff").read_text())["version"] == opl_rank.__version__
    changelog = (root / "CHANGELOG.md").read_text()
    released = [line.split()[1] for line in changelog.splitlines() if line.startswith("## ") and line[3].isdigit()]
    assert released[0] == opl_rank.__version__, "CHANGELOG.md's newest release is not the package version"
    assert 'version = "' not in (root / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
