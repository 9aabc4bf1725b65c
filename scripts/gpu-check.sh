#!/usr/bin/env bash
# The GPU path in one command, on a machine with an NVIDIA GPU (make gpu-check):
#   1. a venv built from the sidecar images' own requirement files (requirements/torch.txt first, then
#      torch + checkpoint + trainer + rollout-cuda: what Dockerfile.megatron and Dockerfile.vllm install)
#      plus pytest, and Tandem itself (--no-deps, editable);
#   2. the driver: nvidia-smi's version against the minimum torch's CUDA 13.0 build needs (580);
#   3. the GPU-marked tests (tests/gpu: bf16 Megatron train + offload/onload with max_memory_allocated per
#      phase; vLLM on CUDA: start, in-place update, sleep level 2 + wake, greedy as transformers, terminate);
#   4. bench/weight_sync.py --sizes 100m (publish -> etcd -> vLLM on the GPU, vs the naive reload);
# and prints one table. Each step runs under a 10-minute limit; a failed step does not stop the others.
# Env: GPU_VENV (default ~/.cache/tandem/gpu-venv), PYTHON (default python3.11, else python3).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
venv=${GPU_VENV:-$cache/gpu-venv}
out=$(mktemp -d "${TMPDIR:-/tmp}/tandem-gpu-check.XXXXXX")
py=${PYTHON:-$(command -v python3.11 || command -v python3)}
limit=600
rows=()

step() {  # step NAME COMMAND...: run under the limit, log to $out/NAME.log, remember status and seconds
  local name=$1 start rc status
  shift
  printf '\033[1;34m[gpu-check]\033[0m %s\n' "$name" >&2
  start=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124) status="TIMEOUT (>${limit}s)" ;;
    *) status="FAIL (rc $rc)" ;;
  esac
  rows+=("$name|$status|$(($(date +%s) - start))|$out/$name.log")
  return $rc
}

build_venv() {
  [[ -x $venv/bin/python ]] || "$py" -m venv "$venv" || return 1
  "$venv/bin/pip" install -q --upgrade pip &&
    "$venv/bin/pip" install -q -r "$here/requirements/torch.txt" &&
    "$venv/bin/pip" install -q -r "$here/requirements/torch.txt" -r "$here/requirements/checkpoint.txt" \
      -r "$here/requirements/trainer.txt" -r "$here/requirements/rollout-cuda.txt" pytest pytest-timeout &&
    "$venv/bin/pip" install -q --no-deps -e "$here" &&
    "$venv/bin/python" -c "import torch, vllm, megatron.core; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
}

check_driver() {
  local version
  version=$(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader | head -1) || return 1
  echo "driver, GPU: $version"
  [[ ${version%%.*} -ge 580 ]] || { echo "driver ${version%%,*} < 580: torch 2.13.0+cu130 needs >= 580"; return 1; }
}

etcd_on_path() {  # bench/weight_sync.py starts a private etcd
  command -v etcd >/dev/null && return 0
  [[ $(id -u) == 0 ]] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server
}

cd "$here" || exit 1
step venv build_venv
step driver check_driver
export TANDEM_GPU_CHECK_OUT=$out/rows.jsonl
step gpu-tests "$venv/bin/python" -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider
if etcd_on_path; then
  step weight-sync "$venv/bin/python" bench/weight_sync.py --sizes 100m
else
  rows+=("weight-sync|SKIPPED (no etcd on PATH)|0|-")
fi

printf '\n%-14s %-22s %8s  %s\n' STEP STATUS SECONDS LOG
for r in "${rows[@]}"; do
  IFS='|' read -r name status secs log <<<"$r"
  printf '%-14s %-22s %8s  %s\n' "$name" "$status" "$secs" "$log"
done
if [[ -s $out/rows.jsonl ]]; then
  printf '\n%-32s %s\n' CHECK MEASURED
  "$venv/bin/python" - "$out/rows.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    check = row.pop("check")
    print(f"{check:<32} " + ", ".join(f"{k} {v}" for k, v in row.items()))
PY
fi
grep -h -E "x naive|steady|first publish" "$out/weight-sync.log" 2>/dev/null | tail -5
! printf '%s\n' "${rows[@]}" | cut -d'|' -f2 | grep -q -E "FAIL|TIMEOUT"
