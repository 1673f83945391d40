#!/usr/bin/env bash
# Set up .venv with the test extras (and obp), then run the test suite, doctests included, on
# two pytest-xdist workers (much of the suite is single-threaded JAX compilation).
#   bash scripts/test.sh               # the default suite (everything but the `extended` set)
#   bash scripts/test.sh --extended    # the end-to-end runs only (.ci/run runs both)
#   bash scripts/test.sh --all         # both in one run
#   OPL_RANK_TEST_WORKERS=0 bash scripts/test.sh   # in one process
#   OPL_RANK_SKIP_SETUP=1 bash scripts/test.sh     # .venv is already set up
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not extended")
case "${1:-}" in
  --extended) select=(-m extended); shift ;;
  --all) select=(); shift ;;
esac
[ "${OPL_RANK_SKIP_SETUP:-}" = 1 ] || bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -n "${OPL_RANK_TEST_WORKERS:-2}" --dist worksteal --doctest-modules opl_rank simulators tests \
  ${select[@]+"${select[@]}"} "$@"
