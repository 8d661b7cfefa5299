/work/wt-filter/perf/noop-filter/target/wasm32-wasip1/release/noop_filter.wasm: /work/wt-filter/perf/noop-filter/src/lib.rs
