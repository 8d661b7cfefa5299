"""External repositories of the Bazel build, all local (no download from GitHub or mirrors).

WORKSPACE calls throttle_dependencies() and nothing else.
"""

load(":cargo.bzl", "cargo_vendor", "rust_host_toolchain")
load(":host_tools.bzl", "host_test_tools")
load(":test_tiers.bzl", "test_tiers")

# Where Debian 12's bazel-skylib and bazel-platforms packages put their sources.
DEBIAN_SKYLIB = "/usr/share/bazel/tools/skylib"
DEBIAN_PLATFORMS = "/usr/share/bazel/tools/platforms"

def throttle_dependencies(skylib_path = DEBIAN_SKYLIB, platforms_path = DEBIAN_PLATFORMS):
    """Declares every external repository the build and the tests use.

    Args:
      skylib_path: directory holding bazel-skylib's sources.
      platforms_path: directory holding the platforms repository's sources.
    """
    native.local_repository(name = "bazel_skylib", path = skylib_path)
    native.local_repository(name = "platforms", path = platforms_path)

    # Bazel 4.2.3's built-in WORKSPACE suffix would download these; a
    # definition here takes precedence. See bazel/standins/README.md.
    native.local_repository(name = "rules_cc", path = "bazel/standins/rules_cc")
    native.local_repository(name = "rules_java", path = "bazel/standins/rules_java")
    native.local_repository(name = "remote_coverage_tools", path = "bazel/standins/remote_coverage_tools")

    # The host's Rust toolchain (rustup), with the wasm32-wasip1 target.
    rust_host_toolchain(name = "rust_host")

    # The crates of Cargo.lock, fetched from crates.io once (`cargo vendor`),
    # so that build actions run cargo offline.
    cargo_vendor(
        name = "crates",
        manifests = [
            "//:Cargo.toml",
            "//filters/throttle:core/Cargo.toml",
            "//filters/throttle:wasm/Cargo.toml",
        ],
        lockfile = "//:Cargo.lock",
    )

    # Envoy, Python with pytest and Fortio, as installed by `make setup`.
    host_test_tools(name = "host_test_tools")

    # Which tests/test_*.py are fast: from their pytest markers (pyproject.toml).
    test_tiers(name = "test_tiers")
