# Bazel build of the filter and the tests (bazel/README.md): Bazel 4.2.3
# from Debian (bazel-bootstrap), cargo driven by bazel/cargo.bzl.
.PHONY: bazel-setup bazel-build bazel-test bazel-test-all bazel-check

bazel-setup: ## Install Bazel 4.2.3 (Debian bazel-bootstrap, bazel-skylib, bazel-platforms)
	@bash tools/setup-bazel.sh

bazel-build: bazel-setup ## bazel build //filters/throttle:throttle.wasm
	nice -n 10 bazel build //filters/throttle:throttle.wasm

bazel-test: setup bazel-setup ## bazel test of the fast targets (pure tests, by their pytest markers)
	nice -n 10 bazel test --config=fast //...

bazel-test-all: setup bazel-setup ## bazel test //... including the Envoy+Fortio integration tests
	bazel test //...

bazel-check: setup bazel-setup ## CI: Bazel build, fast Bazel tests, envoy validate + same bytes as cargo
	@bash bazel/ci_check.sh

CI_EXTRA += bazel-check
