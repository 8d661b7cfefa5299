# Priority classes under open-loop load (perf/priority/README.md).
.PHONY: perf-priority perf-priority-quick

perf-priority: setup tool-vegeta tool-haproxy build ## Priority classes vs strict priority vs HAProxy's set-priority-class, open loop (~5 min)
	$(PY) -m perf.priority.run --set full

perf-priority-quick: setup tool-vegeta tool-haproxy build ## The same, short (~1 min, CI): the tool works; numbers reported, not asserted
	$(PY) -m perf.priority.run --set quick

CI_EXTRA += perf-priority-quick
