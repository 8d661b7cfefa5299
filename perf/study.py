"""Latency tables in the shape of Istio's ambient-vs-no-mesh study, shared by the two mesh
families (perf/mesh on a cluster, perf/meshlab on one machine): avg, p50, p75, p90, p99
(ms) per configuration, and the difference of each to a baseline configuration in
percent. Input rows are `harness.fortio.Result.summary()` dicts (or the same keys), so
local runs and cluster runs print alike."""

from __future__ import annotations

from harness.tables import markdown, num

COLUMNS = ("avg_ms", "p50_ms", "p75_ms", "p90_ms", "p99_ms")
HEADERS = ("avg", "p50", "p75", "p90", "p99")


def diff_pct(value: float, base: float) -> float | None:
    """Relative difference in percent; None when the baseline is zero."""
    return None if not base else 100.0 * (value - base) / base


def table(rows: list[tuple[str, dict]], baseline: str, extra: tuple[str, ...] = ("qps", "errors")) -> str:
    """A Markdown table: one line of values per configuration, then one line of
    differences to `baseline` for every other configuration."""
    by_label = dict(rows)
    if baseline not in by_label:
        raise KeyError(f"baseline {baseline!r} not among {list(by_label)}")
    base = by_label[baseline]
    body = [[label, *(num(s[c], ".3f") for c in COLUMNS), *(num(s.get(e)) for e in extra)] for label, s in rows]
    body += [[f"{label} vs {baseline}", *(num(diff_pct(s[c], base[c]), "+.1f", "n/a") + ("%" if base[c] else "")
                                          for c in COLUMNS), *("" for _ in extra)]
             for label, s in rows if label != baseline]
    return markdown(["configuration", *(f"{h} (ms)" for h in HEADERS), *extra], body)
