"""harness.envoy's reading of Envoy's event-loop histograms (pure: JSON only)."""

import json

from harness import envoy

NAME = "listener_manager.worker_0.dispatcher.loop_duration_us"


def answer(counts: list[int], bounds: tuple[float, ...] = (1000, 5000, 10_000, 20_000)) -> str:
    """A `/stats?format=json&histogram_buckets=cumulative` answer with one histogram."""
    buckets = [{"upper_bound": b, "interval": 0, "cumulative": c} for b, c in zip(bounds, counts, strict=True)]
    return json.dumps({"stats": [{"histograms": [{"name": NAME, "buckets": buckets}]}]})


def test_the_longest_sample_between_two_reads_is_the_lower_bound_of_its_bucket():
    before = envoy.cumulative_buckets(answer([5, 6, 6, 6]))
    # Between the reads: 10 samples under 1 ms and one of 10-20 ms.
    after = envoy.cumulative_buckets(answer([15, 16, 16, 17]))
    assert envoy.longest_between(before, after) == 10_000


def test_samples_before_the_first_read_do_not_count():
    before = envoy.cumulative_buckets(answer([5, 6, 6, 7]))  # one of 10-20 ms, before
    after = envoy.cumulative_buckets(answer([9, 11, 11, 12]))  # since then: 4 under 1 ms, 1 of 1-5 ms
    assert envoy.longest_between(before, after) == 1000


def test_no_sample_or_only_the_first_bucket_is_zero():
    same = envoy.cumulative_buckets(answer([5, 6, 6, 6]))
    assert envoy.longest_between(same, same) == 0.0
    assert envoy.longest_between(same, envoy.cumulative_buckets(answer([8, 9, 9, 9]))) == 0.0


def test_measure_loops_sets_the_bootstrap_fields():
    cfg: dict = {}
    envoy.measure_loops(cfg)
    assert cfg["enable_dispatcher_stats"] is True
    (setting,) = cfg["stats_config"]["histogram_bucket_settings"]
    assert setting["buckets"] == envoy.LOOP_BUCKETS_US
    assert setting["match"]["safe_regex"]["regex"] == envoy.WORKER_LOOPS
