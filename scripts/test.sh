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
echo "== pytest";        python -m pytest "$@"
