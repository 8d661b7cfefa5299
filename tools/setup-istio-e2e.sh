#!/usr/bin/env bash
# Installs what `make istio-e2e` and `python -m harness.mesh` need, on top of
# `make k8s-setup` (registry, Prometheus, crane, kustomize, istioctl; run first):
#
# - rows of tools/tools.tsv (apt): etcd (the API server's storage), iptables (each pod's
#   traffic capture, made by pilot-agent's own `istio-iptables`)
# - kube-apiserver and kubectl from k8s.io/kubernetes (pinned in
#   tools/kube-apiserver/go.mod), cached under build/kube/<key>/
# - istiod (pilot-discovery) and pilot-agent from istio.io/istio, the version
#   tools/istio/go.mod pins for istioctl, cached under build/istiod/<key>/
# - prometheus from the module promtool comes from (tools/promtool/go.mod), with Kubernetes
#   service discovery, cached under build/prometheus/<key>/
#
# A key is the hash of the go.mod, go.sum and Go code of its module and of the Go
# version, as for istioctl (tools/setup-k8s.sh). Idempotent; apt and the Go
# module proxy only. Writes build/istio-e2e/tools.json with the paths the harness uses.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${THROTTLE_TOOLS_BIN:-$PWD/build/bin}  # where tools/install.sh puts the tools

step() { printf '\n== setup-istio-e2e: %s\n' "$*"; }

step "etcd, iptables (apt, tools/tools.tsv, into build/bin)"
# The etcd package starts a system etcd on 127.0.0.1:2379 where systemd runs; the installer
# stops it: the harness runs its own etcd inside its network namespace.
bash tools/install.sh etcd iptables
"$BIN/etcd" --version | sed -n 1p
"$BIN/iptables" --version

# build <dir under build/> <module dir> <ldflags> <tags> <packages...>: `go build` of the packages
# into build/<dir>/<key>/, skipped when every binary is there.
build() {
  local name=$1 mod=$2 ldflags=$3 tags=$4; shift 4
  local key dir missing_bin=0
  key=$( (cat "$mod/go.mod" "$mod/go.sum"; find "$mod" -name '*.go' | sort | xargs cat; echo "$ldflags $tags"
          go version) | sha256sum | cut -c1-16)
  dir="build/$name/$key"
  for pkg in "$@"; do [ -x "$dir/$(basename "$pkg")" ] || missing_bin=1; done
  if [ $missing_bin = 1 ]; then
    local start; start=$(date +%s)
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    (cd "$mod" && nice -n 10 go build -ldflags "$ldflags" -tags "$tags" -o "$OLDPWD/$dir.tmp/" "$@")
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    echo "built $name in $(( $(date +%s) - start )) s" >&2
  fi
  echo "$PWD/$dir"
}

step "kube-apiserver, kubectl from k8s.io/kubernetes (tools/kube-apiserver/go.mod)"
# The version a release build stamps (hack/lib/version.sh), so that the API server reports it.
KUBE_VERSION=$(cd tools/kube-apiserver && go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
KUBE_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  KUBE_LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
done
KUBE_DIR=$(build kube tools/kube-apiserver "$KUBE_LDFLAGS" "" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)
"$KUBE_DIR/kubectl" version --client | sed -n 1p

step "pilot-discovery (istiod), pilot-agent from istio.io/istio (tools/istio/go.mod)"
ISTIOD_DIR=$(build istiod tools/istio "" "" istio.io/istio/pilot/cmd/pilot-discovery istio.io/istio/pilot/cmd/pilot-agent)
"$ISTIOD_DIR/pilot-agent" version --short

step "prometheus from github.com/prometheus/prometheus (tools/promtool/go.mod), with Kubernetes service discovery"
# Debian's prometheus is built without Kubernetes service discovery, which the shipped scrape
# configuration (k8s/monitoring/prometheus.yml) uses; the same build tags as promtool.
PROM_DIR=$(build prometheus tools/promtool "" "remove_all_sd,enable_kubernetes_sd" \
           github.com/prometheus/prometheus/cmd/prometheus)
"$PROM_DIR/prometheus" --version 2>&1 | sed -n 1p

ISTIO_MODULE_DIR=$(cd tools/istio && go list -m -f '{{.Dir}}' istio.io/istio)
GATEWAY_API=$(cd tools/istio && go list -m -f '{{.Path}}@{{.Version}}' sigs.k8s.io/gateway-api)
GATEWAY_API_DIR=$(cd tools/istio && go mod download -json "$GATEWAY_API" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')

mkdir -p build/istio-e2e
cat > build/istio-e2e/tools.json <<EOF
{"kube-apiserver": "$KUBE_DIR/kube-apiserver", "kubectl": "$KUBE_DIR/kubectl",
 "pilot-discovery": "$ISTIOD_DIR/pilot-discovery", "pilot-agent": "$ISTIOD_DIR/pilot-agent",
 "prometheus": "$PROM_DIR/prometheus", "etcd": "$BIN/etcd", "istio_module": "$ISTIO_MODULE_DIR", "gateway_api_module": "$GATEWAY_API_DIR"}
EOF
echo "tools: build/istio-e2e/tools.json"
