/work/wt-filter/perf/noop-filter/target/wasm32-wasip1/release/deps/noop_filter.d: src/lib.rs

/work/wt-filter/perf/noop-filter/target/wasm32-wasip1/release/deps/noop_filter.wasm: src/lib.rs

src/lib.rs:
