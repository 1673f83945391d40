#!/usr/bin/env bash
# The static checks (.ci/run and pre-commit run the same): lint, format, types.
#   bash scripts/check.sh          # after bash scripts/setup.sh --test
#   .venv/bin/ruff format .        # apply the formatter
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
