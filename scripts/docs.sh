#!/usr/bin/env bash
# Build the documentation site (docs/ and the API reference from the docstrings) into site/,
# strictly: a broken link or an unresolved cross-reference is an error.
#   bash scripts/docs.sh            # after bash scripts/setup.sh --test; open site/index.html
#   .venv/bin/mkdocs serve          # live preview at http://127.0.0.1:8000
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_MKDOCS_2_WARNING=1  # Material's end-of-life banner, not a problem of these docs
exec .venv/bin/mkdocs build --strict --quiet "$@"
