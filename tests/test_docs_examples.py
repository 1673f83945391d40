"""The code blocks of README.md and docs/*.md run as written.

* Every ```` ```python ```` block is executed. The blocks of one file share one namespace and
  run in order, like a tutorial, in a fresh Python process per file (as a user runs them:
  ``conftest.py``'s strict JAX promotion does not apply), from a temporary working directory
  (files a block writes land there) with the repository on ``PYTHONPATH``. A failure shows
  the Markdown file and its line numbers in the traceback. A block that cannot run here (it
  needs the user's own files, or takes minutes) is marked ```` ```python skip-test ```` --
  keep those few.
* Every ```` ```bash ```` block's commands are checked without running them: each
  ``.venv/bin/opl-rank ...`` command parses with the CLI's own parser and the files it
  names (``--config``) exist, and each ``.venv/bin/python FILE`` / ``bash FILE`` exists.
  Commands are written with ``.venv/bin/`` (or after activating the venv), never a bare
  ``python``/``pip``.
* Every dotted name of this repository's code cited there or in a ``*/README.md``
  (``opl_rank.opl.ope.evaluate``, ``simulators.datasets``, ...) exists.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# the names check also reads the READMEs beside the code
ALL_TEXT = [*DOCS, *sorted(REPO_ROOT.glob("*/README.md"))]
# files whose Python blocks take long enough to count as slow (still in the default suite)
SLOW = {"README.md", "tutorial_opl.md", "tutorial_estimators.md", "real_logs.md", "datasets.md"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the block's first code line
    info: str  # the fence's info string, e.g. "python" or "python skip-test"
    code: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def skipped(self) -> bool:
        return "skip-test" in self.info.split()[1:]


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the line where each one's code starts."""
    blocks, lines, i = [], path.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, start = m["fence"], len(m["indent"]), i + 1
        j = start
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            j += 1
        body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[start:j]]
        blocks.append(Block(path, start + 1, m["info"].strip(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def _python_docs() -> list:
    params = []
    for path in DOCS:
        if any(b.language == "python" and not b.skipped for b in code_blocks(path)):
            marks = [pytest.mark.slow] if path.name in SLOW else []
            params.append(pytest.param(path, id=_rel(path), marks=marks))
    return params


# Runs the blocks of one file in one namespace; each is compiled under the Markdown file's
# name, padded so that traceback line numbers are the file's own.
RUNNER = """
import json, sys, time
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
for path, line, code in blocks:
    print(f"--- {path}:{line}", flush=True)
    t = time.perf_counter()
    exec(compile("\\n" * (line - 1) + code, path, "exec"), namespace)
    print(f"--- {path}:{line} ran in {time.perf_counter() - t:.1f}s", flush=True)
"""


def test_docs_have_python_examples():
    assert _python_docs(), "no ```python blocks found in README.md or docs/*.md"


@pytest.mark.extended
@pytest.mark.parametrize("doc", _python_docs())
def test_python_blocks_run(doc, tmp_path):
    import json

    blocks = [b for b in code_blocks(doc) if b.language == "python" and not b.skipped]
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([[_rel(b.path), b.line, b.code] for b in blocks]), encoding="utf-8")
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        MPLBACKEND="Agg",
        MPLCONFIGDIR=str(tmp_path / "mpl"),
    )
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(spec)], cwd=work, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, (
        f"a ```python block of {_rel(doc)} failed (the traceback's line numbers are the file's)\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    )


# --- bash blocks: checked, not run --------------------------------------------------------


def _commands(block: Block) -> list[tuple[int, str]]:
    """``(line, command)`` of a shell block: continuation lines joined, comments dropped."""
    out, pending, first = [], "", None
    for offset, raw in enumerate(block.code.splitlines()):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line and not pending:
            continue
        first = block.line + offset if first is None else first
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((first, pending + line))
        pending, first = "", None
    return out


def _shell_commands() -> list:
    params = []
    for path in DOCS:
        for block in code_blocks(path):
            if block.language in ("bash", "sh", "shell", "console") and not block.skipped:
                for line, command in _commands(block):
                    params.append(pytest.param(path, line, command, id=f"{_rel(path)}:{line}"))
    return params


@pytest.mark.parametrize(("doc", "line", "command"), _shell_commands())
def test_shell_commands_name_what_exists(doc, line, command):
    from experiments.cli import build_parser

    where = f"{_rel(doc)}:{line}: {command!r}"
    for part in re.split(r"&&|\|\||;|\|", command):
        words = shlex.split(part)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
            words = words[1:]
        if not words:
            continue
        program, args = words[0], words[1:]
        assert program not in ("python", "python3", "pip", "pytest", "opl-rank", "jupyter", "jupytext"), (
            f"{where}: write .venv/bin/{program} (or say to activate the venv first)"
        )
        if program == ".venv/bin/opl-rank":
            try:
                parsed = build_parser().parse_args(args)
            except SystemExit as exit_:
                pytest.fail(f"{where}: opl-rank does not accept these arguments (exit {exit_.code})")
            config = getattr(parsed, "config", None)
            if config:
                assert (REPO_ROOT / config).exists(), f"{where}: no file {config}"
        elif program in (".venv/bin/python", "bash") and args and not args[0].startswith("-"):
            assert (REPO_ROOT / args[0]).exists(), f"{where}: no file {args[0]}"


# --- names the text cites -----------------------------------------------------------------

# a dotted name of ours, not inside a string literal ("opl_rank.policy" is a format tag)
DOTTED = re.compile(r"""(?<![\w."'])((?:opl_rank|simulators|experiments)(?:\.[A-Za-z_]\w*)+)""")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_cited_names_exist():
    missing = []
    for path in ALL_TEXT:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in DOTTED.findall(line):
                name = name.rstrip(".")
                if not _resolves(name):
                    missing.append(f"{_rel(path)}:{number}: {name}")
    assert not missing, "names cited in the docs that the code does not have:\n" + "\n".join(missing)
