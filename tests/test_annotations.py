"""Every public function and method of ``opl_rank`` is fully annotated.

Public: a name that does not start with ``_``, defined at a module's top level or in the
body of a public class (nested public classes included), in every module under
``opl_rank/`` except ``_aliases.py`` (deprecated names). Fully annotated: every parameter
but a method's ``self`` / ``cls`` has an annotation, and so does the return. mypy
(``[tool.mypy]`` in pyproject.toml) checks the annotations themselves.
"""

from __future__ import annotations

import ast
import pathlib

import opl_rank

PACKAGE = pathlib.Path(opl_rank.__file__).parent
EXCLUDED = {"_aliases.py"}


def _missing(node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> list[str]:
    """What ``node`` lacks: parameter names and ``return``."""
    args = node.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
    if in_class and params and not is_static and params[0].arg in ("self", "cls"):
        params = params[1:]
    missing = [p.arg for p in params if p.annotation is None]
    missing += [f"*{a.arg}" for a in (args.vararg,) if a is not None and a.annotation is None]
    missing += [f"**{a.arg}" for a in (args.kwarg,) if a is not None and a.annotation is None]
    if node.returns is None:
        missing.append("return")
    return missing


def _offenders(body: list[ast.stmt], where: str, in_class: bool) -> list[str]:
    found = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            missing = _missing(node, in_class)
            if missing:
                found.append(f"{where}{node.name} (line {node.lineno}): {', '.join(missing)}")
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            found += _offenders(node.body, f"{where}{node.name}.", in_class=True)
        elif isinstance(node, ast.If):  # e.g. TYPE_CHECKING or version branches
            found += _offenders(node.body + node.orelse, where, in_class)
    return found


def test_public_functions_are_annotated() -> None:
    offenders = []
    modules = sorted(PACKAGE.rglob("*.py"))
    assert modules
    for path in modules:
        if path.name in EXCLUDED:
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{module}.{o}" for o in _offenders(tree.body, "", in_class=False)]
    assert not offenders, "public functions without full annotations:\n  " + "\n  ".join(offenders)
