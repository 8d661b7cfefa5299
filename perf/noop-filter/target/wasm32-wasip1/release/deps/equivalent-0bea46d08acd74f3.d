/work/wt-filter/perf/noop-filter/target/wasm32-wasip1/release/deps/equivalent-0bea46d08acd74f3.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/work/wt-filter/perf/noop-filter/target/wasm32-wasip1/release/deps/libequivalent-0bea46d08acd74f3.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/work/wt-filter/perf/noop-filter/target/wasm32-wasip1/release/deps/libequivalent-0bea46d08acd74f3.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs:
