"""MkDocs hooks: the repository's own Markdown pages (README, CHANGELOG, experiments/ and
notebooks/ READMEs) and the files the docs link to outside docs/ become pages under
``repo/`` (figures are copied there as they are), and relative links are rewritten to them,
so the pages read the same on the site and in the repository. A link to a file that does not exist is left as written, and
``mkdocs build --strict`` fails on it."""

from __future__ import annotations

import os
import re

from mkdocs.structure.files import File

INCLUDED = ("README.md", "CHANGELOG.md", "experiments/README.md", "notebooks/README.md")
_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
_FENCE = re.compile(r"^(```|~~~)", re.M)
_IMAGES = (".png", ".jpg", ".jpeg", ".svg")


def _repo(config) -> str:
    return os.path.dirname(os.path.abspath(config.config_file_path))


def _is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith(("/", "#"))


def _repo_path(src_uri: str) -> str:
    """The repository path of a page (``index.md`` -> ``docs/index.md``)."""
    return src_uri[len("repo/") :] if src_uri.startswith("repo/") else "docs/" + src_uri


def _site_uri(repo_path: str) -> str:
    return repo_path[len("docs/") :] if repo_path.startswith("docs/") else "repo/" + repo_path


def _outside_targets(repo: str, repo_path: str, text: str) -> set[str]:
    out = set()
    for match in _LINK.finditer(_without_code(text)):
        target = match.group(2)
        if not _is_relative(target):
            continue
        resolved = os.path.normpath(os.path.join(os.path.dirname(repo_path), target))
        if not resolved.startswith(("docs/", "..")) and os.path.isfile(os.path.join(repo, resolved)):
            out.add(resolved)
    return out


def _without_code(text: str) -> str:
    parts = _FENCE.split(text)
    return text if len(parts) == 1 else re.sub(r"```.*?```", "", text, flags=re.S)


def on_files(files, config):
    repo = _repo(config)
    todo = list(INCLUDED)
    for f in files.documentation_pages():
        with open(f.abs_src_path, encoding="utf-8") as fh:
            todo += sorted(_outside_targets(repo, _repo_path(f.src_uri), fh.read()))
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.endswith(_IMAGES):  # a figure: copied as it is
            files.append(File.generated(config, _site_uri(path), abs_src_path=os.path.join(repo, path)))
            continue
        with open(os.path.join(repo, path), encoding="utf-8") as fh:
            text = fh.read()
        if path.endswith(".md"):
            todo += sorted(_outside_targets(repo, path, text))
            uri, content = _site_uri(path), text
        else:  # a script or a config: shown as code
            uri = _site_uri(path) + ".md"
            lang = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".sh": "bash"}.get(os.path.splitext(path)[1], "")
            content = f"# `{path}`\n\n```{lang}\n{text}\n```\n"
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    repo = _repo(config)
    here = _repo_path(page.file.src_uri)
    if here.endswith(".py.md") or here.endswith(".yaml.md"):
        return markdown

    def rewrite(match):
        target = match.group(2)
        if not _is_relative(target):
            return match.group(0)
        resolved = os.path.normpath(os.path.join(os.path.dirname(here), target))
        full = os.path.join(repo, resolved)
        if os.path.isdir(full) and os.path.isfile(os.path.join(full, "README.md")):
            resolved = os.path.join(resolved, "README.md")
        elif not os.path.isfile(full):
            return match.group(0)  # broken: --strict reports it
        uri = _site_uri(resolved) + ("" if resolved.endswith((".md",) + _IMAGES) else ".md")
        new = os.path.relpath(uri, os.path.dirname(page.file.src_uri) or ".")
        return f"{match.group(1)}{new}{match.group(3) or ''}{match.group(4)}"

    chunks = re.split(r"(```.*?```)", markdown, flags=re.S)  # leave code blocks alone
    return "".join(c if c.startswith("```") else _LINK.sub(rewrite, c) for c in chunks)
