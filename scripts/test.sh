#!/usr/bin/env bash
# The test command (README, CI): lint, type-check, layering contracts, and the whole pytest suite.
# Usage: scripts/test.sh [pytest args] (`make test`). It installs the venv itself (scripts/setup.sh python).
#
# Side by side, to keep a fresh machine's `make test` short (tests/README.md, the suite's budget):
# - the Kubernetes control plane (scripts/build-k8s.sh, ~10 minutes of Go alone on a fresh machine) builds
#   beside the venv's setup and then the suite when its binaries are missing: it starts first, so that its module
#   downloads and first packages fill what the venv's downloads leave of the cores; the control plane's test
#   groups are handed to a worker only once it ended (or when nothing else is left: the control-plane fixture,
#   tests/operator/conftest.py, then waits for it);
# - ruff, mypy and the import contracts run beside pytest; their output is printed when they end;
# - two pytest workers by default (TANDEM_TEST_WORKERS=1: one process), each pinned to its own share of the
#   cores (TANDEM_TEST_PIN=0: not pinned). tests/conftest.py keeps together what must not run side by side and
#   hands out the longest groups first (xdist's own reordering by test count is off). Each test directory's
#   seconds and the wall time are printed at the end.
# The run fails when any of them fails.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
venv=${TANDEM_VENV:-$cache/venv}
cd "$here"
export PATH="$venv/bin:$PATH"
started=$SECONDS
mkdir -p "$cache"
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT

build=""
if ! "$here/scripts/build-k8s.sh" --check; then
  export TANDEM_K8S_BUILD_LOG="$cache/k8s-build.log" TANDEM_K8S_BUILD_RC="$work/k8s-build.rc"
  echo "== control plane: building beside the tests (log: $TANDEM_K8S_BUILD_LOG)"
  # own session (killed as a group if this script is stopped); the rc file appears only once it ended.
  # Not at idle priority: the suite keeps both cores busy (vmstat: 0-5% idle once it runs), so an idle-priority
  # build got no CPU until the workers ran out of other groups and then held them up for its whole length. A new
  # session is its own scheduler autogroup (/proc/sys/kernel/sched_autogroup_enabled), which shares the CPU as an
  # equal of each test's process group, nice or not; the control plane's groups wait for it in the scheduler
  # (tests/conftest.py, GroupScheduling), not in a worker.
  setsid bash -c '"$1" > "$2" 2>&1; echo $? > "$3.tmp"; mv "$3.tmp" "$3"' _ \
    "$here/scripts/build-k8s.sh" "$TANDEM_K8S_BUILD_LOG" "$TANDEM_K8S_BUILD_RC" &
  build=$!; pids+=("$build")
fi

"$here/scripts/setup.sh" python >/dev/null  # the venv (and Debian's etcd): cached, seconds when nothing changed
echo "== venv ready after $((SECONDS - started)) s"

setsid bash -c 'set -e; echo "== ruff"; ruff check operator sidecars spec checkpoint_engine tests bench
                echo "== mypy --strict"; mypy; echo "== import-linter"; lint-imports' > "$work/checks.log" 2>&1 &
checks=$!; pids+=("$checks")

workers=${TANDEM_TEST_WORKERS:-2}
echo "== pytest ($workers workers)"
status=0
if [[ $workers -gt 1 ]]; then
  python -m pytest -n "$workers" --no-loadscope-reorder "$@" || status=$?
else
  python -m pytest "$@" || status=$?
fi

wait "$checks" || status=$?
cat "$work/checks.log"
if [[ -n $build ]]; then
  wait "$build" || true
  rc=$(cat "$TANDEM_K8S_BUILD_RC" 2>/dev/null || echo "?")
  echo "== control plane build: exit $rc (log: $TANDEM_K8S_BUILD_LOG)"
  [[ $rc == 0 ]] || { tail -20 "$TANDEM_K8S_BUILD_LOG"; status=1; }
fi
pids=()
echo "== scripts/test.sh: exit $status after $((SECONDS - started)) s"
exit "$status"
