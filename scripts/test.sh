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
# Two pytest workers by default (TANDEM_TEST_WORKERS=1: one process): the end-to-end runs leave about half of
# the cores idle (process start-up, HTTP, etcd), so two side by side finish sooner. tests/conftest.py keeps
# together what must not run side by side and hands out the longest groups first (xdist's own reordering by
# test count is off). Each test directory's seconds and the wall time are printed at the end.
workers=${TANDEM_TEST_WORKERS:-2}
echo "== pytest ($workers workers)"
if [[ $workers -gt 1 ]]; then
  python -m pytest -n "$workers" --no-loadscope-reorder "$@"
else
  python -m pytest "$@"
fi
