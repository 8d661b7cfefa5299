#!/usr/bin/env bash
# Installs what `make k8s-check` needs, on a fresh Debian 12 machine with Go,
# Python 3 and Rust. Idempotent: everything is skipped when already present.
# Nothing is downloaded outside the package registries (apt, PyPI, Go proxy).
#
# - rows of tools/tools.tsv, into build/bin: docker-registry (local OCI registry for the
#   image test), prometheus (Debian's, a real Prometheus for the dashboard test);
#   kustomize, kubeconform, crane (go install, pinned there)
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
BIN=${THROTTLE_TOOLS_BIN:-$PWD/build/bin}  # where tools/install.sh puts the tools

step() { printf '\n== setup-k8s: %s\n' "$*"; }

step "docker-registry, prometheus (apt), kustomize, kubeconform, crane (go): tools/tools.tsv"
bash tools/install.sh docker-registry prometheus kustomize kubeconform crane
"$BIN/docker-registry" --version
"$BIN/prometheus" --version 2>&1 | sed -n 1p

step "Python packages (requirements.txt: kubernetes-validate, grafana-foundation-sdk)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

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
 "kustomize": "$BIN/kustomize", "kubeconform": "$BIN/kubeconform", "crane": "$BIN/crane"}
EOF
echo "tools: build/k8s/tools.json"
