"""The study's tables (perf/study.py), shared by the mesh lab's report and perf/mesh's results."""

from perf.study import diff_pct, table


def row(avg, p50, p75, p90, p99, qps=100.0, errors=0):
    return {"avg_ms": avg, "p50_ms": p50, "p75_ms": p75, "p90_ms": p90, "p99_ms": p99, "qps": qps, "errors": errors}


def test_table_has_values_then_differences_to_the_baseline():
    t = table([("no mesh", row(1, 1, 2, 2, 4)), ("sidecar", row(1.5, 1.1, 2, 3, 5, 99.5, 1))], "no mesh")
    lines = [" ".join(line.split()) for line in t.splitlines()]  # tabulate pads the columns
    assert lines[0] == "| configuration | avg (ms) | p50 (ms) | p75 (ms) | p90 (ms) | p99 (ms) | qps | errors |"
    assert lines[2] == "| no mesh | 1.000 | 1.000 | 2.000 | 2.000 | 4.000 | 100.0 | 0 |"
    assert lines[3] == "| sidecar | 1.500 | 1.100 | 2.000 | 3.000 | 5.000 | 99.5 | 1 |"
    assert lines[4] == "| sidecar vs no mesh | +50.0% | +10.0% | +0.0% | +50.0% | +25.0% | | |"
    assert len(lines) == 5


def test_zero_baseline_is_not_a_division_error():
    assert diff_pct(1.0, 0.0) is None
    d = diff_pct(0.9, 1.0)
    assert d is not None and round(d, 9) == -10.0
