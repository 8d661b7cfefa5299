#!/usr/bin/env bash
# Installs what `make k8s-check` needs, on a fresh Debian 12 machine with Go,
# Python 3 and Rust. Idempotent: everything is skipped when already present.
# Nothing is downloaded outside the package registries (apt, PyPI, Go proxy).
#
# - apt: docker-registry (local OCI registry for the image test), prometheus
#   (a real Prometheus for the dashboard test)
# - go install (pinned): kustomize, kubeconform, crane
# - istioctl, wasmfetch (Istio's Wasm image fetcher), istiowasm (WasmPlugin /
#   EnvoyFilter -> the Envoy Wasm filter istiod + istio-agent make) and
#   istioclusters (manifests -> the clusters istiod pushes to a sidecar or a
#   waypoint), built from the
#   istio.io/istio Go module with the pinned versions in tools/istio/go.mod,
#   cached under build/istio/<key>/ (key: hash of go.mod, go.sum, our Go code
#   and the Go version), ~7 min on 2 cores the first time
# - promtool from github.com/prometheus/prometheus, pinned in tools/promtool/go.mod
#   (Debian's promtool is built without Kubernetes service discovery, so it
#   rejects kubernetes_sd_configs), cached under build/promtool/<key>/
# Writes build/k8s/tools.json with the paths the tests use.
set -euo pipefail
cd "$(dirname "$0")/.."

KUSTOMIZE_VERSION=v5.8.2
KUBECONFORM_VERSION=v0.8.0
CRANE_VERSION=v0.22.1

GOBIN_DIR="$(go env GOPATH)/bin"
step() { printf '\n== setup-k8s: %s\n' "$*"; }

step "apt: docker-registry, prometheus"
missing=()
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v prometheus >/dev/null || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}"
  # The Debian packages start services; we run our own processes in the tests.
  for svc in docker-registry prometheus; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  done
fi
docker-registry --version
prometheus --version 2>&1 | sed -n 1p

step "Python packages (requirements.txt: kubernetes-validate, grafana-foundation-sdk)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

step "Go tools: kustomize $KUSTOMIZE_VERSION, kubeconform $KUBECONFORM_VERSION, crane $CRANE_VERSION"
# The module version a binary was built from (go install leaves no -v string).
modversion() { [ -x "$1" ] && go version -m "$1" | awk '$1 == "mod" {print $3}'; }
[ "$(modversion "$GOBIN_DIR/kustomize")" = "$KUSTOMIZE_VERSION" ] \
  || nice -n 10 go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
[ "$(modversion "$GOBIN_DIR/kubeconform")" = "$KUBECONFORM_VERSION" ] \
  || nice -n 10 go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
[ "$(modversion "$GOBIN_DIR/crane")" = "$CRANE_VERSION" ] \
  || nice -n 10 go install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"

step "istioctl, wasmfetch, istiowasm, istioclusters from istio.io/istio (pinned in tools/istio/go.mod)"
key=$( (cat tools/istio/go.mod tools/istio/go.sum; find tools/istio -name '*.go' | sort | xargs cat; go version) \
       | sha256sum | cut -c1-16)
ISTIO_DIR="build/istio/$key"
if [ ! -x "$ISTIO_DIR/istioctl" ] || [ ! -x "$ISTIO_DIR/wasmfetch" ] || [ ! -x "$ISTIO_DIR/istiowasm" ] \
   || [ ! -x "$ISTIO_DIR/istioclusters" ]; then
  mkdir -p "$ISTIO_DIR.tmp"
  start=$(date +%s)
  (cd tools/istio && nice -n 10 go build -o "../../$ISTIO_DIR.tmp/istioctl" istio.io/istio/istioctl/cmd/istioctl \
                  && nice -n 10 go build -o "../../$ISTIO_DIR.tmp/wasmfetch" ./wasmfetch \
                  && nice -n 10 go build -o "../../$ISTIO_DIR.tmp/istiowasm" ./istiowasm \
                  && nice -n 10 go build -o "../../$ISTIO_DIR.tmp/istioclusters" ./istioclusters)
  rm -rf "$ISTIO_DIR" && mv "$ISTIO_DIR.tmp" "$ISTIO_DIR"
  echo "built in $(( $(date +%s) - start )) s"
fi
"$ISTIO_DIR/istioctl" version --remote=false
ISTIO_MODULE_DIR=$(cd tools/istio && go list -m -f '{{.Dir}}' istio.io/istio)
# Gateway API CRDs come from the module Istio pins (for the schemas).
GATEWAY_API=$(cd tools/istio && go list -m -f '{{.Path}}@{{.Version}}' sigs.k8s.io/gateway-api)
(cd tools/istio && go mod download "$GATEWAY_API")

step "promtool from github.com/prometheus/prometheus (tools/promtool/go.mod)"
pkey=$( (cat tools/promtool/go.mod tools/promtool/go.sum; echo k8s-sd-only; go version) | sha256sum | cut -c1-16)
PROMTOOL="build/promtool/$pkey/promtool"
if [ ! -x "$PROMTOOL" ]; then
  start=$(date +%s)
  mkdir -p "$(dirname "$PROMTOOL")"
  # Only the Kubernetes service discovery (the one our config uses; static_configs is
  # always in): Prometheus' own build tags, skipping the cloud SDKs of the other SDs.
  (cd tools/promtool && nice -n 10 go build -tags remove_all_sd,enable_kubernetes_sd \
     -o "../../$PROMTOOL.tmp" github.com/prometheus/prometheus/cmd/promtool)
  mv "$PROMTOOL.tmp" "$PROMTOOL"
  echo "built in $(( $(date +%s) - start )) s"
fi
"$PROMTOOL" --version 2>&1 | sed -n 1p

mkdir -p build/k8s
cat > build/k8s/tools.json <<EOF
{"istioctl": "$PWD/$ISTIO_DIR/istioctl", "wasmfetch": "$PWD/$ISTIO_DIR/wasmfetch",
 "istiowasm": "$PWD/$ISTIO_DIR/istiowasm", "istioclusters": "$PWD/$ISTIO_DIR/istioclusters",
 "promtool": "$PWD/$PROMTOOL", "istio_module": "$ISTIO_MODULE_DIR",
 "kustomize": "$GOBIN_DIR/kustomize", "kubeconform": "$GOBIN_DIR/kubeconform", "crane": "$GOBIN_DIR/crane"}
EOF
echo "tools: build/k8s/tools.json"
