# Benchmarks (perf/): the throttle against plain Envoy, Envoy's native
# local_ratelimit and nginx limit_req, in one run. See perf/README.md.
.PHONY: perf perf-quick perf-setup

PERF_QUICK_DIR := perf/results/ci-quick

perf-setup: ## Install what the benchmarks need (nginx, ab, chromium, matplotlib)
	@bash tools/setup-perf.sh

perf: setup perf-setup build ## Benchmarks, standard set (< ~15 min): CSV, Markdown summary, HTML report
	$(PY) -m perf.run --set standard
	PERF_RUN_DIR=perf/results/latest $(PY) -m pytest perf/tests -q

perf-quick: setup perf-setup build ## Benchmarks, quick subset (~2 min, CI): numbers reported, not asserted
	rm -rf $(PERF_QUICK_DIR)
	$(PY) -m perf.run --set quick --out $(PERF_QUICK_DIR)
	PERF_RUN_DIR=$(PERF_QUICK_DIR) $(PY) -m pytest perf/tests -q

CI_EXTRA += perf-quick
