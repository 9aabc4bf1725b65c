#!/usr/bin/env bash
# The Prometheus Operator's CRDs (PodMonitor, ServiceMonitor) the operator tests install on the real control
# plane to check the chart's monitors (tests/operator/test_monitoring.py), from the Go module proxy: the
# module github.com/prometheus-operator/prometheus-operator holds them in example/prometheus-operator-crd/.
# Into $TANDEM_CACHE/prometheus-operator-crds-<version>/ (cached; never committed). Called by
# scripts/build-k8s.sh; `--check` only says (exit 0) whether they are there; prints the directory.
set -euo pipefail
PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-v0.88.0}
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
out="$cache/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"
CRDS=(monitoring.coreos.com_podmonitors.yaml monitoring.coreos.com_servicemonitors.yaml)
have() { for f in "${CRDS[@]}"; do [[ -s $out/$f ]] || return 1; done; }
if [[ ${1:-} == --check ]]; then have; exit; fi
if ! have; then
  printf '\033[1;34m[monitoring-crds]\033[0m %s\n' "fetching the Prometheus Operator's CRDs $PROMETHEUS_OPERATOR_VERSION (Go module proxy)" >&2
  dir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$out.tmp"
  for f in "${CRDS[@]}"; do install -m 0644 "$dir/example/prometheus-operator-crd/$f" "$out.tmp/$f"; done
  rm -rf "$out"; mv "$out.tmp" "$out"
fi
echo "$out"
