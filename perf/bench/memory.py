"""Envoy's memory while it holds requests: open N connections that each send
one request the throttle holds (a low rate, long max_queue_delay), read VmRSS
from /proc, then close them all (the filter counts them as cancelled)."""

from __future__ import annotations

import socket
import time
from functools import partial

from harness.envoy import Envoy
from harness.net import wait_until
from harness.procs import raise_open_files
from harness.procstats import rss_kib
from harness.rawhttp import close_all, open_held, request_bytes

REQUEST = request_bytes("/details.json", host="perf")


def _decided_at_least(envoy: Envoy, n: int) -> bool:
    """Whether the throttle decided at least n requests (admitted, queued or rejected)."""
    return sum(envoy.rule_stats().get(k, 0) for k in ("admitted", "queued", "rejected")) >= n


def settle_rss(pid: int, seconds: float = 1.0) -> float:
    """RSS (MB) after it stops moving for a moment (max of a few samples)."""
    time.sleep(seconds)
    return max(rss_kib(pid) for _ in range(3)) / 1024


def measure(envoy: Envoy, steps: list[int], throttled: bool, timeout_s: float = 60) -> dict:
    """RSS idle, then with each cumulative number of held requests (throttled)
    or of idle open connections (not throttled: the connection cost alone)."""
    assert envoy.proc is not None
    pid = envoy.proc.pid
    if raise_open_files(need := max(steps) + 1024) < need:
        raise RuntimeError(f"need {need} open files, the hard limit is lower")
    points = [{"held": 0, "rss_mb": settle_rss(pid)}]
    socks: list[socket.socket] = []
    try:
        for target in steps:
            socks += open_held(envoy.port, target - len(socks), REQUEST if throttled else None)
            if throttled:
                # every request decided (the first passes at once, a few are
                # released meanwhile at the low rate, the others are held)
                wait_until(partial(_decided_at_least, envoy, target), timeout_s, f"{target} requests decided")
                held = envoy.rule_stats().get("held", 0)
            else:
                held = target
            points.append({"held": held, "connections": len(socks), "rss_mb": settle_rss(pid)})
    finally:
        close_all(socks)
    if throttled:
        wait_until(lambda: envoy.rule_stats().get("held", 1) == 0, timeout_s, "held requests cancelled")
    after = settle_rss(pid)
    base = points[0]["rss_mb"]
    last = points[-1]
    first = points[1]
    # marginal cost between the first and the last step (first-use costs excluded)
    span = last["held"] - first["held"]
    per_1000 = (last["rss_mb"] - first["rss_mb"]) / span * 1000 if span > 0 else None
    from_idle = (last["rss_mb"] - base) / last["held"] * 1000 if last["held"] else None
    return {"points": points, "idle_rss_mb": base, "after_close_rss_mb": after,
            "mb_per_1000": per_1000, "mb_per_1000_from_idle": from_idle,
            "stats": envoy.rule_stats() if throttled else {}}
