# Benchmarks (perf/): the throttle against plain Envoy, Envoy's native
# local_ratelimit and nginx limit_req, in one run. See perf/README.md.
# Every run writes perf/reports/<family>/<run-id>/ and links perf/reports/<family>/latest to it.
.PHONY: perf perf-quick perf-setup perf-noop perf-cpu perf-cpu-quick perf-cluster perf-icount perf-icount-quick

# perf-icount: extra arguments, e.g. PERF_ICOUNT_ARGS='--wasm before=git:9cbb678 --only noop unkeyed-before unkeyed-after'
PERF_ICOUNT_ARGS ?=
# perf-cpu: extra arguments, e.g. PERF_CPU_ARGS='--wasm before=git:8f14453 --wasm after=/path/to/throttle.wasm --skip smoothness'
PERF_CPU_ARGS ?=

perf-setup: ## Install what the benchmarks need (nginx, ab, chromium, matplotlib)
	@bash tools/setup-perf.sh

perf-noop: ## Build the no-op Wasm filter (the Wasm ABI's floor, run beside the throttle)
	CARGO_TARGET_DIR=target/noop-filter cargo build --release --target wasm32-wasip1 --manifest-path perf/noop-filter/Cargo.toml

perf: setup perf-setup build perf-noop ## Benchmarks, standard set (< ~15 min): CSV, Markdown summary, HTML report
	$(PY) -m perf.bench.run --set standard
	PERF_RUN_DIR=perf/reports/bench/latest $(PYTEST) -m perf -q

perf-quick: setup setup-engine perf-setup build perf-noop ## Benchmarks, quick subset (~2 min, CI): numbers reported, not asserted
	$(PY) -m perf.bench.run --set quick
	PERF_RUN_DIR=perf/reports/bench/latest $(PYTEST) -m perf -q

perf-cpu: setup perf-setup build perf-noop ## Envoy CPU µs/request side by side in one Envoy, before (main) vs after, runtimes, hand-off, smoothness (~15 min)
	$(PY) -m perf.cpu.run --profile full $(PERF_CPU_ARGS)
	$(PY) -m pytest perf/tests/test_cpu.py -q

perf-cpu-quick: setup perf-setup build perf-noop ## The same, short (< 2 min, CI): checks the tool works, asserts no timing
	$(PY) -m perf.cpu.run --profile quick
	$(PY) -m pytest perf/tests/test_cpu.py -q

perf-icount: setup setup-engine perf-setup build perf-noop ## Instructions per request under valgrind (callgrind): every variant, before (main) vs after (~25 min)
	$(PY) -m perf.icount.run --profile full $(PERF_ICOUNT_ARGS)

perf-icount-quick: setup setup-engine perf-setup build perf-noop ## The same, short (~2 min, CI): checks the tool works, asserts nothing about cost
	$(PY) -m perf.icount.run --profile quick

perf-cluster: setup setup-engine perf-setup build ## Three proxies, one rate: process vs cluster scope vs Envoy's native global rate limit, steady and under faults, low rates, idle, bursts (~7 min)
	$(PY) -m perf.bench.run --set cluster
	PERF_RUN_DIR=perf/reports/cluster/latest $(PYTEST) -m perf -q

CI_EXTRA += perf-quick perf-cpu-quick perf-icount-quick
