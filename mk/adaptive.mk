# The adaptive-pacing benchmark (perf/adaptive/): the backend emulator whose
# capacity changes while it runs, Vegeta open-loop load (harness/vegeta.py), and
# the arms (no limiter, Envoy adaptive_concurrency default and tuned,
# admission_control, the throttle at a static high and low rate, the adaptive
# throttle). Runs write perf/reports/adaptive/<run-id>/ and link
# perf/reports/adaptive/latest. See perf/adaptive/README.md.
.PHONY: perf-adaptive perf-adaptive-quick

# perf-adaptive: extra arguments, e.g. PERF_ADAPTIVE_ARGS='--scenarios S1 S3 --arms none throttle-low'
PERF_ADAPTIVE_ARGS ?=

perf-adaptive: setup tool-vegeta build ## Adaptive pacing benchmark, every scenario x arm (~30 min): summary.md, report.html, charts
	$(PY) -m perf.adaptive.run --set full $(PERF_ADAPTIVE_ARGS)
	PERF_ADAPTIVE_DIR=perf/reports/adaptive/latest $(PYTEST) -m perf perf/tests/test_adaptive_report.py -q

perf-adaptive-quick: setup tool-vegeta build ## The same, one short scenario and three arms (~1 min, CI): checks the tools, asserts no figure
	$(PY) -m perf.adaptive.run --set quick
	PERF_ADAPTIVE_DIR=perf/reports/adaptive/latest $(PYTEST) -m perf perf/tests/test_adaptive_report.py -q

CI_EXTRA += perf-adaptive-quick
