#!/usr/bin/env bash
# Create .venv and install opl_rank into it (editable).
#   bash scripts/setup.sh          # the library and its CLI
#   bash scripts/setup.sh --test   # plus the test/benchmark extras, Ray, obp, the checks and the docs (see README)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "opl_rank needs Python >= 3.11")'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# setuptools' "Editable installation ... be careful with folders ... same name as your package"
# box is not the user's business (the checkout is the package): silence that one warning.
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation"
.venv/bin/python -m pip install -q --upgrade pip
if [ "${1:-}" = "--test" ]; then
  # torch is pinned to the CPU build these machines ship; obp needs it only to import.
  .venv/bin/python -m pip install -q -e ".[test,obp,ray,dev,docs]" "torch==2.13.0"
  # obp 0.5.7 declares Python < 3.11 and exact old pins, but its slate code runs on 3.11 with
  # numpy 2 / pandas 3 / scikit-learn 1.9: install it without its declared dependencies.
  .venv/bin/python -m pip install -q --no-deps --ignore-requires-python "obp==0.5.7"
else
  .venv/bin/python -m pip install -q -e .
fi
