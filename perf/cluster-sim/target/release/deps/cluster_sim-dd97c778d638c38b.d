/work/main/perf/cluster-sim/target/release/deps/cluster_sim-dd97c778d638c38b.d: src/main.rs src/http.rs

/work/main/perf/cluster-sim/target/release/deps/cluster_sim-dd97c778d638c38b: src/main.rs src/http.rs

src/main.rs:
src/http.rs:
