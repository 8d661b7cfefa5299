# The fleet simulation's seeded sweep (filters/throttle/core/src/sim/, issue 29):
# scenarios drawn from seeds, run on the shipped Worker, stages and engine client
# over a store that behaves like Envoy's, every invariant checked on each run
# (engine/README.md, "Invariants"). Pure: cargo only.
.PHONY: fleet-sweep fleet-sweep-ci

# fleet-sweep: how long, from which seed, extra arguments (e.g. ARGS='--seed 7 --verbose',
# ARGS='--scenario all', ARGS='--seed 7 --trace 0').
SWEEP_SECONDS ?= 600
SWEEP_FROM ?= 1
ARGS ?=
SWEEP := cargo run --locked --release -q -p throttle-core --features testing --example fleet-sweep --

fleet-sweep: ## Sweep for SWEEP_SECONDS (600) from seed SWEEP_FROM; ARGS='--seed N --verbose' replays one
	$(SWEEP) $(if $(ARGS),$(ARGS),--seconds $(SWEEP_SECONDS) --from $(SWEEP_FROM))

fleet-sweep-ci: ## The named scenarios, stalls of `stalls` at 20 starts, a spread burst at 50 offsets, two clock splits at 20 starts over the hour, then seeds 1..60 against the known counterexamples (~2 min, CI)
	$(SWEEP) --scenario all
	$(SWEEP) --stall-search stalls --starts 20
	$(SWEEP) --offset-search burst-after-idle-spread --offsets 50
	$(SWEEP) --start-search clock-tie --starts 20
	$(SWEEP) --start-search skewed-at-hour --starts 20
	$(SWEEP) --seeds 60 --seconds 100000 --from 1 --known filters/throttle/core/sweep-known.txt

# The start searches run clock-tie and skewed-at-hour with the service's hour
# 7..140 s in: each failed at 1-2 of 60 starts until the service's clock became
# the reference (2026-12-02). The others are not here: sporadic and
# burst-after-idle fail at 1 of 60 starts (engine/README.md, "Invariants").
# The offset search moves burst-after-idle-spread's bursts 0..49 ms (half an
# epoch) over the engine calls' phases. Over 0..299 ms one run fails (offset
# 67: a request of the warm-up waits 76 ms, a no_wait of issue 29's kinds, not
# the burst).
CI_EXTRA += fleet-sweep-ci
