#!/usr/bin/env bash
# Set up .venv with the test extras (and obp), then run the whole test suite, doctests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q --doctest-modules opl_rank simulators tests "$@"
