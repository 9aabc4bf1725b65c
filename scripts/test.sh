#!/usr/bin/env bash
# The test command (README, CI): lint, type-check, layering contracts, then the whole pytest suite.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${TANDEM_VENV:-${TANDEM_CACHE:-$HOME/.cache/tandem}/venv}
cd "$here"
export PATH="$venv/bin:$PATH"
echo "== ruff";          ruff check operator sidecars spec checkpoint_engine tests bench
echo "== mypy --strict"; mypy
echo "== import-linter"; lint-imports
# TANDEM_TEST_WORKERS=2 runs two pytest workers (tests/conftest.py keeps together what must not run side by
# side); one by default until a two-worker run is measured green and faster on a quiet machine (tests/README.md).
# Each test directory's seconds are printed at the end either way.
workers=${TANDEM_TEST_WORKERS:-1}
echo "== pytest ($workers workers)"
if [[ $workers -gt 1 ]]; then
  python -m pytest -n "$workers" "$@"
else
  python -m pytest "$@"
fi
