"""The controls of test_other_numbers.py: each scenario run where its defect
cannot occur, through the same scenario function and the same checks, to show
that a failure of the test is the filter's and not the test's.

    nice -n 10 .venv/bin/python -m tests.cluster.controls [late classes_one two clock sporadic floor]

- late, classes_one: the rule in process scope at a third of the rate on each
  proxy (no grid: a process schedule refuses at arrival);
- two: each rule as the only cluster rule, the other in process scope at
  rate / N a proxy, judging the cluster rule only;
- clock: the same four proxies and builds (two on the test-clock build) with
  no offset;
- sporadic: the rule in process scope (7/s on each proxy);
- floor: process scope, one proxy at 100/s carrying all four loads.

Not collected by pytest (not a test file): CI runs the tests, not their
controls (they would double the file's time). Prints each outcome and PASS or
FAIL; exits 1 if any control failed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from harness.cluster import ClusterLab
from harness.procs import ROOT, WASM
from tests.cluster import test_other_numbers as t
from tests.cluster.conftest import CLOCK_WASM


def _report(name: str, outcome: t.Outcome) -> bool:
    ok = not outcome.problems and not outcome.lab_problems
    print(f"\n[{name}] {'PASS' if ok else 'FAIL'}\n  {outcome.report}")
    for p in outcome.lab_problems + outcome.problems:
        print(f"  PROBLEM: {p}")
    return ok


def late() -> bool:
    rule = t.process_rule(t.cluster_rule("orders", f"{t.LATE_RATE}/s"), f"{t.LATE_RATE / 3:g}/s")
    with ClusterLab(t.plugin([rule]), refusal_log=True) as lab:
        return all(_report(f"late {q:g}/s a proxy, process scope", t.late_refusals(lab, "orders", q))
                   for q in (45.0, 37.0))


def classes_one() -> bool:
    rule = t.process_rule(t.cluster_rule("orders", f"{t.CLASS_RATE}/s", classes=t.CLASSES),
                          f"{t.CLASS_RATE / 3:g}/s")
    with ClusterLab(t.plugin([rule]), refusal_log=True) as lab:
        return _report("classes_one, process scope", t.late_refusals(lab, "orders", 0.5 * t.CLASS_RATE,
                                                                     rate=t.CLASS_RATE, headers=(t.CRITICAL,)))


def two() -> bool:
    ok = []
    for alone in ("alpha", "beta"):
        rules = []
        for name, rate in (("alpha", 30.0), ("beta", 150.0)):
            r = t.cluster_rule(name, f"{rate:g}/s", prefix=f"/{name[0]}/")
            rules.append(r if name == alone else t.process_rule(r, f"{rate / 3:g}/s"))
        with ClusterLab(t.plugin(rules)) as lab:
            ok.append(_report(f"two rules, 30/s + 150/s, {alone} the only cluster rule",
                              t.two_rules(lab, 30.0, 150.0, cluster=(alone,))))
    return all(ok)


def clock() -> bool:
    if not CLOCK_WASM.is_file():
        subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip1", "-p", "throttle-wasm",
                        "--features", "test-clock", "--target-dir", "target/test-clock"], cwd=ROOT, check=True)
    rule = t.cluster_rule("skew", f"{t.SKEW_RATE}/s", replicas=4)
    with ClusterLab(t.plugin([rule]), proxies=2, wasm=WASM) as lab:
        for _ in range(2):
            lab.add_proxy(wasm=CLOCK_WASM, vm_env={"THROTTLE_TEST_WALL_OFFSET_MS": "0"})
        return _report("clock, no offset (same builds)", t.clock_split(lab, [0, 0, 0, 0]))


def sporadic() -> bool:
    rule = t.process_rule(t.cluster_rule("sporadic", f"{t.SPORADIC_RATE}/s", mqd="3s", replicas=4),
                          f"{t.SPORADIC_RATE}/s")
    with ClusterLab(t.plugin([rule]), proxies=4) as lab:
        return _report("sporadic, process scope", t.sporadic(lab))


def floor() -> bool:
    rule = t.process_rule(t.cluster_rule("orders", f"{t.CLASS_RATE}/s", classes=t.CLASSES), f"{t.CLASS_RATE}/s")
    with ClusterLab(t.plugin([rule]), proxies=1) as lab:
        return _report("floor, process scope, all loads through one proxy", t.class_floor(lab))


CONTROLS: dict[str, Callable[[], bool]] = {"late": late, "classes_one": classes_one, "two": two, "clock": clock,
                                           "sporadic": sporadic, "floor": floor}


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in CONTROLS]
    if unknown:
        print(f"unknown controls {unknown}; known: {list(CONTROLS)}", file=sys.stderr)
        return 2
    results = {n: CONTROLS[n]() for n in names or list(CONTROLS)}
    print("\ncontrols: " + ", ".join(f"{n} {'PASS' if ok else 'FAIL'}" for n, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
