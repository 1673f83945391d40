#!/usr/bin/env bash
# Set up .venv with the test extras (and obp), then run the whole test suite, doctests included,
# on two pytest-xdist workers (much of the suite is single-threaded JAX compilation).
#   OPL_RANK_TEST_WORKERS=0 bash scripts/test.sh   # in one process
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -n "${OPL_RANK_TEST_WORKERS:-2}" --doctest-modules opl_rank simulators tests "$@"
