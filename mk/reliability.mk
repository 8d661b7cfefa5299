# Reliability and security: faults, floods, reloads, bad input, failure
# policy, property tests, across Envoy versions (tests/reliability/README.md).
# Tests are chosen by marker: `reliability`, plus `slow` for the long runs.

# Oldest Envoy on PyPI (close to what recent Istio embeds) and the newest.
ENVOY_MATRIX ?= 1.36 1.40

.PHONY: envoy-versions reliability reliability-slow reliability-ci test-matrix fuzz-long

envoy-versions: ## Install the Envoy test matrix (1.36.4, 1.40.0) into .venv-envoy-<version>
	@bash tools/setup-envoy-versions.sh

reliability: setup build ## Reliability suite, bounded (2,000 held, storm, faults, reload, bad input, 45 s soak)
	$(PYTEST) -m "reliability and not slow" -v -s

reliability-slow: setup build ## 10,000 held connections and a 10-minute soak (about 12 minutes)
	$(PYTEST) -m "reliability and slow" -v -s

test-matrix: setup setup-engine tool-vegeta build envoy-versions ## Integration + bounded reliability tests against each Envoy in ENVOY_MATRIX
	@set -e; for v in $(ENVOY_MATRIX); do \
	  echo "== Envoy $$v"; \
	  ENVOY_BIN=$(CURDIR)/.venv-envoy-$$v/bin/envoy $(PYTEST) -m "(integration or reliability) and not slow" -q; \
	done; echo "test-matrix: passed on Envoy $(ENVOY_MATRIX)"

# What CI runs (fresh clone, after `make integration` on .venv's Envoy 1.40):
# the integration tests again on the oldest Envoy, and the bounded reliability
# suite on the oldest and the newest. The property tests run in `make check`.
reliability-ci: setup setup-engine tool-vegeta build envoy-versions
	@set -e; start=$$(date +%s); \
	echo "== Envoy 1.36: integration + reliability"; \
	ENVOY_BIN=$(CURDIR)/.venv-envoy-1.36/bin/envoy $(PYTEST) -m "(integration or reliability) and not slow" -q; \
	echo "== Envoy 1.40: reliability"; \
	ENVOY_BIN=$(CURDIR)/.venv-envoy-1.40/bin/envoy $(PYTEST) -m "reliability and not slow" -q; \
	echo "reliability-ci: passed on Envoy 1.36 and 1.40 in $$(( $$(date +%s) - start )) s"

fuzz-long: ## Property tests of the core with 100,000 cases each (PROPTEST_CASES)
	PROPTEST_CASES=100000 cargo test --locked --release -p throttle-core --test properties --test nginx_differential

CI_EXTRA += reliability-ci
