"""What clients see: dry-run decides and counts without holding or rejecting
(and is invisible unless asked); held requests say how long they waited;
rate-limit headers follow the IETF draft (`RateLimit-Policy`, `RateLimit`),
replace the upstream's own, are never doubled, and the legacy names are
there only when asked for."""

import http.client
import json

import pytest

from harness.net import http_get
from harness.procs import ROOT
from tests.support.clients import burst, grpc_headers, h2c

pytestmark = pytest.mark.integration


def test_dry_run_holds_and_rejects_nothing_and_its_counters_add_up(envoy_with):
    envoy = envoy_with({"dry_run": True, "rules": [{"name": "d", "rate": "10/s", "max_queue_delay": "500ms"}]})
    replies = burst(envoy.port, 20)
    stats = envoy.rule_stats("d")
    print(f"dry-run stats {stats}")
    assert [r.status for r in replies] == [200] * 20
    assert max(r.latency_ms for r in replies) < 200  # nothing held
    # Invisible to clients by default.
    assert all("x-throttle-dry-run" not in r.headers for r in replies)
    # 10/s, 500 ms of queue: 1 at once, 5 would wait, the rest would be rejected,
    # and only the one that would have gone at once counts as admitted. (The 20
    # connections arrive within a few ms; if they straggled past 100 ms one more
    # would find the schedule free, hence the ranges.)
    assert stats["admitted"] + stats["would_queue"] + stats["would_reject"] == 20, stats
    assert 1 <= stats["admitted"] <= 2 and 5 <= stats["would_queue"] <= 6, stats
    # A dry-run rule does not define the statistics of holding and rejecting.
    assert set(stats) == {"requests", "admitted", "contention", "would_queue", "would_reject"}, stats


def test_dry_run_headers_tell_what_would_have_happened_when_asked(envoy_with):
    envoy = envoy_with({"dry_run": True, "dry_run_headers": True, "rate_limit_headers": True,
                        "rules": [{"name": "d", "rate": "10/s", "max_queue_delay": "500ms"}]})
    replies = burst(envoy.port, 20)
    notes = [r.headers.get("x-throttle-dry-run") for r in replies]
    stats = envoy.rule_stats("d")
    queued = [n for n in notes if n and n.startswith("queued")]
    rejected = [n for n in notes if n and n.startswith("rejected")]
    assert len(queued) == stats["would_queue"] and len(rejected) == stats["would_reject"], (notes, stats)
    assert all(n == "rejected; status=429; retry_after=1" for n in rejected)
    assert all("ratelimit" in r.headers for r in replies)


def test_held_requests_carry_their_wait(envoy_with):
    envoy = envoy_with({"rules": [{"name": "w", "rate": "20/s", "max_queue_delay": "1s"}]})
    replies = sorted(burst(envoy.port, 6), key=lambda r: r.latency_ms)
    waits = [r.headers.get("x-throttle-wait-ms") for r in replies]
    print(f"waits {waits}, latencies {[round(r.latency_ms) for r in replies]}")
    assert waits[0] is None  # the first continued at once
    held = [int(w or -1) for w in waits[1:]]  # -1: no header, fails below
    # 50 ms apart; the tick fires about every 4 ms, so a release is up to one
    # tick late (a loaded machine adds scheduling delay: 30 ms of slack).
    for i, w in enumerate(held, start=1):
        assert 50 * i - 5 <= w <= 50 * i + 30, (i, w)


def get(envoy, path: str = "/", headers: dict | None = None) -> tuple[int, dict]:
    status, hdrs, _ = http_get(envoy.url + path, headers=headers)
    return status, {k.lower(): v for k, v in hdrs.items()}


def test_ietf_rate_limit_headers_a_client_can_act_on(envoy_with):
    envoy = envoy_with({"rate_limit_headers": True,
                        "rules": [{"name": "api", "rate": "500/s", "max_queue_delay": "0s"}]})
    status, h = get(envoy)
    assert status == 200
    assert h["ratelimit-policy"] == '"api";q=500;w=1'
    # An idle 500/s rule: 499 left (the legacy headers said "remaining: 0"
    # here, slowing a careful client to about 1/s); the last interval is paid
    # off within 2 ms (whole seconds, rounded up: 1).
    assert h["ratelimit"] in ('"api";r=499;t=1', '"api";r=500;t=0'), h["ratelimit"]
    assert not any(k.startswith("x-ratelimit") for k in h)


def test_fractional_rates_and_rejections_are_right(envoy_with):
    envoy = envoy_with({"rate_limit_headers": True,
                        "rules": [{"name": "slow", "rate": "0.5/s", "max_queue_delay": "0s"}]})
    s1, h1 = get(envoy)
    s2, h2 = get(envoy)
    print(h1, h2)
    assert (s1, s2) == (200, 429)
    # 0.5/s is 1 per 2 s (the legacy limit said "1", as if per second).
    assert h1["ratelimit-policy"] == h2["ratelimit-policy"] == '"slow";q=1;w=2'
    # After one request none is left, and the quota is back in 2 s.
    assert h1["ratelimit"] == '"slow";r=0;t=2'
    assert h2["ratelimit"] == '"slow";r=0;t=2'  # the rejection took nothing
    assert int(h2["retry-after"]) >= 1


def test_remaining_never_exceeds_the_limit_with_a_burst(envoy_with):
    envoy = envoy_with({"rate_limit_headers": True,
                        "rules": [{"name": "b", "rate": "1/s", "burst": 5, "max_queue_delay": "0s"}]})
    seen = [get(envoy) for _ in range(7)]
    print(seen)
    assert [s for s, _ in seen] == [200] * 6 + [429]
    # Six pass at once (the burst), but the quota is 1 per second: none is
    # left, and the schedule is idle again after 1, 2, ... 6 s.
    assert [h["ratelimit"] for _, h in seen] == [f'"b";r=0;t={t}' for t in (1, 2, 3, 4, 5, 6, 6)]
    assert all(h["ratelimit-policy"] == '"b";q=1;w=1' for _, h in seen)


def test_legacy_names_only_when_asked(envoy_with):
    envoy = envoy_with({"rate_limit_headers": "legacy",
                        "rules": [{"name": "m", "rate": "30/m", "max_queue_delay": "0s"}]})
    status, h = get(envoy)
    assert status == 200
    assert (h["x-ratelimit-limit"], h["x-ratelimit-remaining"], h["x-ratelimit-reset"]) == ("30", "29", "2")
    assert "ratelimit" not in h and "ratelimit-policy" not in h


def test_the_reset_of_a_held_request_is_true_when_its_response_leaves(envoy_with):
    # 2/s with 1.5 s of queue: four at once, the last held 1.5 s. Its `r` and
    # `t` are computed when its response leaves (the schedule it left is then
    # 0.5 s ahead: one interval owed, 1 left, idle within a second), not at
    # admission (when it was 2 s ahead: 0 left, t=2).
    envoy = envoy_with({"rate_limit_headers": True,
                        "rules": [{"name": "h", "rate": "2/s", "max_queue_delay": "1500ms"}]})
    replies = sorted(burst(envoy.port, 4), key=lambda r: r.latency_ms)
    last = replies[-1]
    print([(round(r.latency_ms), r.headers.get("ratelimit")) for r in replies])
    assert last.status == 200 and last.latency_ms > 1400
    assert last.headers["ratelimit"] == '"h";r=1;t=1', last.headers


def test_rate_limit_headers_replace_the_upstreams(envoy_with, upstream):
    envoy = envoy_with({"rate_limit_headers": "legacy",
                        "rules": [{"name": "r", "rate": "100/s"}]})
    # Fortio's echo server sets response headers from the query string.
    conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=5)
    conn.request("GET", "/echo?header=x-ratelimit-limit:999&header=ratelimit:upstream")
    resp = conn.getresponse()
    resp.read()
    limits = [v for k, v in resp.getheaders() if k.lower() == "x-ratelimit-limit"]
    assert limits == ["100"], resp.getheaders()
    # A header the filter does not own is left alone.
    assert [v for k, v in resp.getheaders() if k.lower() == "ratelimit"] == ["upstream"]


def test_rejections_carry_each_header_once_over_http1_http2_and_grpc(envoy_with):
    envoy = envoy_with({"rate_limit_headers": True,
                        "rules": [{"name": "x", "rate": "1/h", "max_queue_delay": "0s"}]})
    assert get(envoy)[0] == 200
    # HTTP/1.1: the raw header lines.
    conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=5)
    conn.request("GET", "/")
    resp = conn.getresponse()
    resp.read()
    names = [k.lower() for k, _ in resp.getheaders()]
    assert resp.status == 429
    for n in ("retry-after", "ratelimit", "ratelimit-policy"):
        assert names.count(n) == 1, (n, resp.getheaders())
    # HTTP/2 and gRPC.
    plain = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "t")]
    answers = h2c(envoy.port, [(plain, b""), (grpc_headers(envoy.port), b"")])
    for a in answers:
        for n in ("retry-after", "ratelimit", "ratelimit-policy"):
            assert len(a.all(n)) == 1, (n, a)
    assert answers[0].status == 429
    assert answers[1].all("grpc-status") == ["8"], answers[1]


def rate_limit_examples() -> list[tuple[dict, list[tuple[int, str, str]]]]:
    """The README's rate-limit header examples: (rule, [(status, policy, ratelimit)...])."""
    text = (ROOT / "filters/throttle/README.md").read_text()
    table = text[text.index("<!-- rate-limit-examples:start -->"):text.index("<!-- rate-limit-examples:end -->")]
    groups: list[tuple[dict, list[tuple[int, str, str]]]] = []
    for line in table.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[2].isdigit():
            continue
        rule, _request, status, policy, ratelimit = cells
        if rule != "same":
            groups.append((json.loads(rule), []))
        groups[-1][1].append((int(status), policy, ratelimit))
    return groups


def test_the_readme_rate_limit_examples_are_what_envoy_sends(envoy_with):
    groups = rate_limit_examples()
    assert len(groups) >= 3
    for rule, expected in groups:
        envoy = envoy_with({"rate_limit_headers": True, "rules": [rule]})
        seen = []
        for _ in expected:
            status, headers, _ = http_get(envoy.url + "/")
            h = {k.lower(): v for k, v in headers.items()}
            seen.append((status, h.get("ratelimit-policy"), h.get("ratelimit")))
        assert seen == expected, rule
