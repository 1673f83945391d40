"""Old module paths (before 0.2.0's ``pl`` / ``opl`` / ``ltr`` / ``io`` layout), kept for one
release: ``import opl_rank.learners`` still works, returns the very module
[`opl_rank.opl.learners`][opl_rank.opl.learners] (so patches and ``isinstance`` checks agree) and warns once with
the new path. Removed in 0.3.0.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

#: old dotted path -> new dotted path
MOVED: dict[str, str] = {
    "opl_rank.plackett_luce": "opl_rank.pl.plackett_luce",
    "opl_rank.prefix_sampling": "opl_rank.pl.prefix_sampling",
    "opl_rank.marginals": "opl_rank.pl.marginals",
    "opl_rank.ltr_estimators": "opl_rank.pl.gradients",
    "opl_rank.opl_estimators": "opl_rank.opl.estimators",
    "opl_rank.policies": "opl_rank.opl.policies",
    "opl_rank.reward_models": "opl_rank.opl.reward_models",
    "opl_rank.completion": "opl_rank.opl.completion",
    "opl_rank.learners": "opl_rank.opl.learners",
    "opl_rank.ope": "opl_rank.opl.ope",
    "opl_rank.select_k": "opl_rank.opl.select_k",
    "opl_rank.exposure_losses": "opl_rank.ltr.exposure_losses",
    "opl_rank.ltr_training": "opl_rank.ltr.training",
    "opl_rank.pairwise": "opl_rank.ltr.pairwise",
    "opl_rank.pairwise_training": "opl_rank.ltr.pairwise_training",
    "opl_rank.tabular": "opl_rank.io.tabular",
    "opl_rank.persistence": "opl_rank.io.persistence",
    "opl_rank.atomic": "opl_rank.io.atomic",
    "opl_rank.interop": "opl_rank.io",
    "opl_rank.interop.obp": "opl_rank.io.obp",
    "opl_rank.interop.obd": "opl_rank.io.obd",
}


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} in opl_rank 0.2.0; the old path goes in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._spec = module.__spec__  # the import system writes the old path's spec over it
        return module

    def exec_module(self, module):  # the module is the new one, already executed
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(), is_package=fullname == "opl_rank.interop")


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
