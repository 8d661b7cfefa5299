"""Latency tables in the shape of Istio's ambient-vs-no-mesh study:
avg, p50, p75, p90, p99 (ms) per configuration, and the difference of each to
a baseline configuration in percent. Input rows are `harness.procs.summarize`
results (from Fortio JSON), so local runs and cluster runs print alike."""

from __future__ import annotations

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
    head = ["configuration", *(f"{h} (ms)" for h in HEADERS), *extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, s in rows:
        cells = [label, *(f"{s[c]:.3f}" for c in COLUMNS), *(_fmt(s.get(e)) for e in extra)]
        lines.append("| " + " | ".join(cells) + " |")
    for label, s in rows:
        if label == baseline:
            continue
        pcts = [diff_pct(s[c], base[c]) for c in COLUMNS]
        cells = [f"{label} vs {baseline}", *("n/a" if p is None else f"{p:+.1f}%" for p in pcts), *("" for _ in extra)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(v: object) -> str:
    if v is None:
        return ""
    return f"{v:.1f}" if isinstance(v, float) else str(v)
