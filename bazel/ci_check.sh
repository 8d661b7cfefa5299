#!/usr/bin/env bash
# `make bazel-check` (CI): with Bazel 4.2.3 from Debian,
#   1. bazel build //filters/throttle:throttle.wasm
#   2. bazel test --config=fast //...   (core unit tests and the pure tests:
#      tests/test_*.py files whose pytest markers make them pure, @test_tiers)
#   3. envoy --mode validate of every shipped envoy/*.yaml pointed at the Bazel-built .wasm
#   4. the Bazel-built .wasm is byte-for-byte cargo's (`cargo build --release`,
#      same source-path prefix), i.e. the same crate with the same release profile
# and always `bazel shutdown` at the end, so no Bazel server is left running.
set -euo pipefail
cd "$(dirname "$0")/.."

BAZEL=(nice -n 10 bazel)   # the Bazel server inherits the lower priority
t0=$SECONDS
trap 'bazel shutdown >/dev/null 2>&1 || true' EXIT
step() { printf '\n== bazel-check: %s\n' "$*"; }

step "bazel build //filters/throttle:throttle.wasm"
t=$SECONDS
"${BAZEL[@]}" build //filters/throttle:throttle.wasm
build_s=$((SECONDS - t))
wasm="$(bazel info bazel-bin 2>/dev/null)/filters/throttle/throttle.wasm"
ls -l "$wasm"

step "bazel test --config=fast //...   (leaves out tag 'integration': files with a tier marker)"
t=$SECONDS
"${BAZEL[@]}" test --config=fast //...
test_s=$((SECONDS - t))

step "envoy --mode validate: every envoy/*.yaml with the Bazel-built .wasm"
.venv/bin/python - "$wasm" <<'PY'
import shutil
import sys
from pathlib import Path
from harness.configs import render
from harness.envoy import Envoy
from harness.procs import ROOT
failed = 0
for config in sorted(p.name for p in (ROOT / "envoy").glob("*.yaml")):
    envoy = Envoy(render(config, listen_port=10000, admin_port=9901, upstream_port=8080, wasm=Path(sys.argv[1])))
    rc, out = envoy.validate()
    shutil.rmtree(envoy.dir, ignore_errors=True)
    ok = rc == 0 and any(line.rstrip().endswith(" OK") for line in out.splitlines())
    print(f"{config}: {'OK' if ok else 'REFUSED'}" + ("" if ok else "\n" + out[-3000:]))
    failed += not ok
sys.exit(1 if failed else 0)
PY

step "same bytes as cargo's release build"
# cargo's own build embeds crates.io sources under CARGO_HOME; Bazel's under
# /bazel-cargo/vendor (bazel/cargo_build.sh). Same prefix here, then compare.
registry_src="${CARGO_HOME:-$HOME/.cargo}/registry/src"
cargo fetch --locked -q
index_dir="$(find "$registry_src" -mindepth 1 -maxdepth 1 -name 'index.crates.io-*' -print -quit)"
target_dir=build/bazel-check-cargo
CARGO_TARGET_DIR="$target_dir" CARGO_ENCODED_RUSTFLAGS="--remap-path-prefix=${index_dir}=/bazel-cargo/vendor" \
  nice -n 10 cargo build -q --locked --release --target wasm32-wasip1 -p throttle-wasm
cmp "$target_dir/wasm32-wasip1/release/throttle.wasm" "$wasm"
echo "identical: $(wc -c < "$wasm") bytes"

bazel shutdown
echo
echo "bazel-check: passed (bazel build ${build_s}s, bazel test --config=fast ${test_s}s, validate OK, same bytes as cargo; total $((SECONDS - t0))s)"
