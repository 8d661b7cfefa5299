# Priority classes under open-loop load (perf/priority/README.md).
.PHONY: perf-priority-setup perf-priority perf-priority-quick

perf-priority-setup: ## Install what the priority benchmark needs (Vegeta, HAProxy 2.6)
	@bash perf/priority/setup.sh

perf-priority: setup perf-priority-setup build ## Priority classes vs strict priority vs HAProxy's set-priority-class, open loop (~5 min)
	$(PY) -m perf.priority.run --set full

perf-priority-quick: setup perf-priority-setup build ## The same, short (~1 min, CI): the tool works; numbers reported, not asserted
	$(PY) -m perf.priority.run --set quick

CI_EXTRA += perf-priority-quick
