"""Write ``notebooks/NAME.ipynb`` from every ``notebooks/NAME.py`` (percent format, the source).

    .venv/bin/python scripts/sync_notebooks.py           # (re)write every missing or stale .ipynb
    .venv/bin/python scripts/sync_notebooks.py --check   # only say which are; exit 1 if any

The ``.py`` is the file to edit and review; the ``.ipynb`` is generated from it, without
outputs (small diffs; the plots appear inline when the notebook runs), and
``tests/test_notebooks.py`` checks that both hold the same cells. A ``.py`` whose jupytext
header does not pair it with an ``.ipynb`` gets the standard header first (only the header
block is rewritten), so Jupyter with jupytext (the ``notebooks`` extra) keeps both files in
step when you save the notebook there. Needs jupytext (the ``test`` or ``notebooks`` extra).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO_ROOT / "notebooks"

HEADER = """# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: kernelspec,jupytext,-jupytext.text_representation
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---
"""


def cells(nb) -> list[tuple[str, str]]:
    """What must agree between the two files: each cell's type and source."""
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def stable_ids(nb) -> None:
    """Cell ids from each cell's content (not random): regenerating changes only edited cells."""
    seen: set[str] = set()
    for cell in nb.cells:
        base = hashlib.sha1(f"{cell.cell_type}\0{cell.source}".encode()).hexdigest()[:8]
        cell.id = base
        n = 1
        while cell.id in seen:
            n += 1
            cell.id = f"{base}-{n}"
        seen.add(cell.id)


def with_header(text: str) -> str:
    """``text`` with the standard header in place of its jupytext header (prepended if none)."""
    lines = text.splitlines(keepends=True)
    if len(lines) > 1 and lines[0].rstrip() == "# ---" and lines[1].rstrip() == "# jupyter:":
        end = next((i for i in range(2, len(lines)) if lines[i].rstrip() == "# ---"), None)
        if end is not None:
            return HEADER + "".join(lines[end + 1 :])
    return HEADER + "\n" + text


def sync(py: Path, check: bool) -> str | None:
    """Bring ``py``'s notebook up to date (or only report); returns what was (or is) wrong."""
    import jupytext
    import nbformat

    ipynb = py.with_suffix(".ipynb")
    text = py.read_text(encoding="utf-8")
    problems = []
    if "formats: ipynb,py:percent" not in text.split("\n# ---\n", 1)[0]:
        problems.append("its header does not pair it with the .ipynb")
        if not check:
            text = with_header(text)
            py.write_text(text, encoding="utf-8")
    nb = jupytext.reads(text, fmt="py:percent")
    if not ipynb.exists():
        problems.append(f"{ipynb.name} is missing")
    else:
        current = nbformat.read(ipynb, as_version=4)
        if cells(current) != cells(nb):
            problems.append(f"{ipynb.name} has other cells than {py.name}")
        if any(cell.get("outputs") or cell.get("execution_count") for cell in current.cells):
            problems.append(f"{ipynb.name} holds outputs")
    if problems and not check:
        stable_ids(nb)
        new = jupytext.writes(nb, fmt="ipynb")
        if not ipynb.exists() or ipynb.read_text(encoding="utf-8") != new:
            ipynb.write_text(new, encoding="utf-8")
    return "; ".join(problems) or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook is missing or stale")
    parser.add_argument("sources", nargs="*", type=Path, help="notebooks/*.py to sync (default: all)")
    args = parser.parse_args(argv)
    sources = args.sources or sorted(NOTEBOOKS.glob("*.py"))
    stale = 0
    for py in sources:
        problem = sync(py, args.check)
        if problem:
            stale += 1
            print(f"{py}: {problem}" + ("" if args.check else f" -> wrote {py.with_suffix('.ipynb').name}"))
    if args.check and stale:
        print(f"{stale} notebook(s) out of sync: run .venv/bin/python scripts/sync_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
