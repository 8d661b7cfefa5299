#!/bin/bash
# Runs cargo inside one Bazel action (see bazel/cargo.bzl): offline, against the
# crates vendored by @crates (an archive of `cargo vendor`), with a fresh
# CARGO_HOME and target dir in the action's scratch space. Same Cargo.toml,
# Cargo.lock and profiles as `make build`.
#
#   cargo_build.sh build|test MANIFEST PACKAGE TRIPLE PROFILE ARTIFACT OUT VENDOR_TAR
set -euo pipefail
mode=$1 manifest=$2 package=$3 triple=$4 profile=$5 artifact=$6 out=$7 vendor=$8
: "${CARGO:?}" "${RUSTC:?}"

root=$PWD
scratch="$root/$out.cargo"
rm -rf "$scratch"
mkdir -p "$scratch/home"
trap 'rm -rf "$scratch"' EXIT
tar -xf "$vendor" -C "$scratch"

cat > "$scratch/home/config.toml" <<TOML
[source.crates-io]
replace-with = "bazel-vendored"

[source.bazel-vendored]
directory = "$scratch/vendor"
TOML

export CARGO_HOME="$scratch/home" CARGO_TARGET_DIR="$scratch/target"
export CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0
# Panic locations embed source paths; the scratch path differs per sandbox, so
# map it to a fixed prefix: the same inputs give the same bytes.
export CARGO_ENCODED_RUSTFLAGS="--remap-path-prefix=$scratch=/bazel-cargo"

flags=(--frozen --quiet --lib -p "$package" --manifest-path "$root/$manifest"
       --message-format=json-render-diagnostics)
profile_dir=debug
if [[ $profile == release ]]; then
  flags+=(--release)
  profile_dir=release
fi
if [[ -n $triple ]]; then
  flags+=(--target "$triple")
fi

case $mode in
  build)
    "$CARGO" build "${flags[@]}" >/dev/null
    cp "$CARGO_TARGET_DIR/${triple:+$triple/}$profile_dir/$artifact" "$out"
    ;;
  test)
    exe=$("$CARGO" test --no-run "${flags[@]}" | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
    if [[ -z $exe ]]; then
      echo "cargo test --no-run -p $package produced no test executable" >&2
      exit 1
    fi
    cp "$exe" "$out"
    ;;
  *)
    echo "cargo_build.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
