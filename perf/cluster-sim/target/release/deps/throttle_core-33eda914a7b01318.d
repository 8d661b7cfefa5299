/work/main/perf/cluster-sim/target/release/deps/throttle_core-33eda914a7b01318.d: /work/main/filters/throttle/core/src/lib.rs /work/main/filters/throttle/core/src/clock.rs /work/main/filters/throttle/core/src/cluster/mod.rs /work/main/filters/throttle/core/src/cluster/caller.rs /work/main/filters/throttle/core/src/cluster/grants.rs /work/main/filters/throttle/core/src/cluster/grid.rs /work/main/filters/throttle/core/src/cluster/sim.rs /work/main/filters/throttle/core/src/cluster/wire.rs /work/main/filters/throttle/core/src/config/mod.rs /work/main/filters/throttle/core/src/config/spec.rs /work/main/filters/throttle/core/src/config/strict_json.rs /work/main/filters/throttle/core/src/config/validate.rs /work/main/filters/throttle/core/src/gate.rs /work/main/filters/throttle/core/src/keys.rs /work/main/filters/throttle/core/src/matcher.rs /work/main/filters/throttle/core/src/path.rs /work/main/filters/throttle/core/src/queue.rs /work/main/filters/throttle/core/src/ratelimit.rs /work/main/filters/throttle/core/src/reply.rs /work/main/filters/throttle/core/src/schedule.rs /work/main/filters/throttle/core/src/stats.rs /work/main/filters/throttle/core/src/store.rs /work/main/filters/throttle/core/src/stream.rs /work/main/filters/throttle/core/src/units.rs /work/main/filters/throttle/core/src/wire.rs /work/main/filters/throttle/core/src/worker.rs /work/main/filters/throttle/core/src/testing.rs

/work/main/perf/cluster-sim/target/release/deps/libthrottle_core-33eda914a7b01318.rlib: /work/main/filters/throttle/core/src/lib.rs /work/main/filters/throttle/core/src/clock.rs /work/main/filters/throttle/core/src/cluster/mod.rs /work/main/filters/throttle/core/src/cluster/caller.rs /work/main/filters/throttle/core/src/cluster/grants.rs /work/main/filters/throttle/core/src/cluster/grid.rs /work/main/filters/throttle/core/src/cluster/sim.rs /work/main/filters/throttle/core/src/cluster/wire.rs /work/main/filters/throttle/core/src/config/mod.rs /work/main/filters/throttle/core/src/config/spec.rs /work/main/filters/throttle/core/src/config/strict_json.rs /work/main/filters/throttle/core/src/config/validate.rs /work/main/filters/throttle/core/src/gate.rs /work/main/filters/throttle/core/src/keys.rs /work/main/filters/throttle/core/src/matcher.rs /work/main/filters/throttle/core/src/path.rs /work/main/filters/throttle/core/src/queue.rs /work/main/filters/throttle/core/src/ratelimit.rs /work/main/filters/throttle/core/src/reply.rs /work/main/filters/throttle/core/src/schedule.rs /work/main/filters/throttle/core/src/stats.rs /work/main/filters/throttle/core/src/store.rs /work/main/filters/throttle/core/src/stream.rs /work/main/filters/throttle/core/src/units.rs /work/main/filters/throttle/core/src/wire.rs /work/main/filters/throttle/core/src/worker.rs /work/main/filters/throttle/core/src/testing.rs

/work/main/perf/cluster-sim/target/release/deps/libthrottle_core-33eda914a7b01318.rmeta: /work/main/filters/throttle/core/src/lib.rs /work/main/filters/throttle/core/src/clock.rs /work/main/filters/throttle/core/src/cluster/mod.rs /work/main/filters/throttle/core/src/cluster/caller.rs /work/main/filters/throttle/core/src/cluster/grants.rs /work/main/filters/throttle/core/src/cluster/grid.rs /work/main/filters/throttle/core/src/cluster/sim.rs /work/main/filters/throttle/core/src/cluster/wire.rs /work/main/filters/throttle/core/src/config/mod.rs /work/main/filters/throttle/core/src/config/spec.rs /work/main/filters/throttle/core/src/config/strict_json.rs /work/main/filters/throttle/core/src/config/validate.rs /work/main/filters/throttle/core/src/gate.rs /work/main/filters/throttle/core/src/keys.rs /work/main/filters/throttle/core/src/matcher.rs /work/main/filters/throttle/core/src/path.rs /work/main/filters/throttle/core/src/queue.rs /work/main/filters/throttle/core/src/ratelimit.rs /work/main/filters/throttle/core/src/reply.rs /work/main/filters/throttle/core/src/schedule.rs /work/main/filters/throttle/core/src/stats.rs /work/main/filters/throttle/core/src/store.rs /work/main/filters/throttle/core/src/stream.rs /work/main/filters/throttle/core/src/units.rs /work/main/filters/throttle/core/src/wire.rs /work/main/filters/throttle/core/src/worker.rs /work/main/filters/throttle/core/src/testing.rs

/work/main/filters/throttle/core/src/lib.rs:
/work/main/filters/throttle/core/src/clock.rs:
/work/main/filters/throttle/core/src/cluster/mod.rs:
/work/main/filters/throttle/core/src/cluster/caller.rs:
/work/main/filters/throttle/core/src/cluster/grants.rs:
/work/main/filters/throttle/core/src/cluster/grid.rs:
/work/main/filters/throttle/core/src/cluster/sim.rs:
/work/main/filters/throttle/core/src/cluster/wire.rs:
/work/main/filters/throttle/core/src/config/mod.rs:
/work/main/filters/throttle/core/src/config/spec.rs:
/work/main/filters/throttle/core/src/config/strict_json.rs:
/work/main/filters/throttle/core/src/config/validate.rs:
/work/main/filters/throttle/core/src/gate.rs:
/work/main/filters/throttle/core/src/keys.rs:
/work/main/filters/throttle/core/src/matcher.rs:
/work/main/filters/throttle/core/src/path.rs:
/work/main/filters/throttle/core/src/queue.rs:
/work/main/filters/throttle/core/src/ratelimit.rs:
/work/main/filters/throttle/core/src/reply.rs:
/work/main/filters/throttle/core/src/schedule.rs:
/work/main/filters/throttle/core/src/stats.rs:
/work/main/filters/throttle/core/src/store.rs:
/work/main/filters/throttle/core/src/stream.rs:
/work/main/filters/throttle/core/src/units.rs:
/work/main/filters/throttle/core/src/wire.rs:
/work/main/filters/throttle/core/src/worker.rs:
/work/main/filters/throttle/core/src/testing.rs:
