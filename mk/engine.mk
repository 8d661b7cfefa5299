# Cluster scope's engine: Redis + envoyproxy/ratelimit on loopback,
# the facts the design relies on, and the many-proxy simulation.
# See engine/README.md.
.PHONY: setup-engine engine engine-test cluster-sim cluster-sim-quick demo-cluster

setup-engine: ## Install Redis (apt) and envoyproxy/ratelimit (go install) for cluster scope
	@bash tools/setup-engine.sh

# The integration tests (tests/engine) start the real engine.
integration: setup-engine

engine: setup setup-engine ## Run Redis + the rate limit service on loopback; prints the Envoy cluster (Ctrl-C stops)
	$(PY) -m harness.engine

engine-test: setup setup-engine ## Facts about the rate limit service, against the real one
	$(PY) -m pytest tests/engine -v

cluster-sim: setup setup-engine ## Many simulated proxies vs the real engine (and the in-memory one): perf/reports/cluster/<run-id>/summary.md (~3 min)
	$(PY) -m perf.cluster.sim

cluster-sim-quick: setup setup-engine ## The same, two short runs (~40 s)
	$(PY) -m perf.cluster.sim --quick

demo-cluster: setup setup-engine build ## Cluster scope: 3 Envoys share one rate through the engine; uneven Fortio loads at two rates
	$(PY) -m harness.demo_cluster
