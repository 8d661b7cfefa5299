//! The learner against the simulated world (sim.rs): the anchors'
//! scenarios, deterministic (three seeds each). The thresholds are what the
//! design achieves here with a margin, not the targets where it falls
//! short of them; each message says which. `cargo run -p throttle-core
//! --release --example adaptive-sim --features testing` prints the figures.

use super::controller::{interval_of_rate, rate_of_interval, Controller, Reason, Tuning, MICRO};
use super::sim::{anchors, learner, run, Mode, Pacer, Phase, PhaseFigures, Report, Scenario};
use super::tally::Tally;
use crate::{NS_PER_MS, NS_PER_S};

const SEEDS: [u64; 3] = [1, 2, 3];

fn scenario(name: &str, pacer: Pacer, seed: u64) -> Scenario {
    anchors(pacer, seed)
        .into_iter()
        .find(|s| s.name == name)
        .expect("a scenario of that name")
}

fn adaptive(name: &str, seed: u64) -> (Report, Vec<PhaseFigures>) {
    scenario(name, learner(500.0, Mode::Enforce), seed).run()
}

/// Errors the clients saw: timeouts, the throttle's own 429s and the backend's.
fn errors(p: &PhaseFigures) -> u64 {
    p.figures.timeouts + p.figures.gateway_504 + p.figures.local_429 + p.figures.upstream_429
}

/// The first round after `at_s` whose reasons include `r`, in seconds after it.
fn first(r: &Report, reason: Reason, at_s: f64) -> Option<f64> {
    let from = (at_s * 10.0) as usize;
    r.buckets
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, b)| b.reasons.has(reason))
        .map(|(i, _)| (i - from) as f64 / 10.0)
}

#[test]
fn s1_fewer_workers_cut_fast_then_paced_near_capacity() {
    for seed in SEEDS {
        let (r, p) = adaptive("S1", seed);
        let drop = p[1];
        let cut = first(&r, Reason::Queue, 20.0).expect("a cut after the drop");
        assert!(cut <= 0.5, "seed {seed}: cut {cut} s after the drop");
        assert!(
            drop.figures.goodput_per_s >= 0.95 * 200.0,
            "seed {seed}: goodput {} (target >= 90% of 200)",
            drop.figures.goodput_per_s
        );
        assert_eq!(drop.figures.timeouts, 0, "seed {seed}");
        assert_eq!(drop.figures.upstream_429, 0, "seed {seed}");
        assert!(
            drop.figures.p99_ms < 1000.0,
            "seed {seed}: p99 {}",
            drop.figures.p99_ms
        );
        // The target is ±10% at all times once adapted (time to
        // adapt 2 s); here it is within the band 80-96% of the time, and
        // adapted in 0.2-9 s (a probe or the end of a drain now and then
        // leaves the band for a second).
        assert!(
            drop.in_band >= 0.75 && drop.lowest >= 0.8 && drop.highest <= 1.4,
            "seed {seed}: {:.0}% of 1 s windows within ±10% of 200/s, range {:.2}..{:.2}",
            drop.in_band * 100.0,
            drop.lowest,
            drop.highest
        );
        let back = p[2];
        let t = back.time_to_adapt_s.unwrap_or(f64::MAX);
        assert!(
            t <= 4.5,
            "seed {seed}: back to the offered 400/s after {t} s (target 2 s)"
        );
        assert!(back.figures.goodput_per_s >= 0.9 * 400.0, "seed {seed}");
    }
}

/// Issue 31, "react fast, then settle", over ten seeds: the first cut
/// within 500 ms of the drop, and the admitted rate within ±10% of the new
/// capacity (every 1 s window, held 5 s, 2xx p99 under 1 s) within 2 s.
/// Measured here: 0.2-2.0 s, within 2 s in every seed of 10 (before the
/// drain rate followed a capacity measured on a backlog up by 2% steps,
/// not only by 5%: 9 of 10, 2.3 s, a drain at 92% of a first measure 2-3%
/// low stayed just below the band for the 2-3 s the backlog took; the old
/// learner: 0.2-14.2 s, 4 of 10: its drain at 92% of a capacity taken low,
/// and +20% probes from there, left the band for a second now and then).
#[test]
fn s1_drop_is_cut_within_500_ms_and_held_within_10_percent_within_2_s() {
    let mut within = 0;
    for seed in 1..=10 {
        let (r, p) = adaptive("S1", seed);
        let cut = first(&r, Reason::Queue, 20.0).expect("a cut after the drop");
        assert!(cut <= 0.5, "seed {seed}: first cut {cut} s after the drop");
        let t = p[1].time_to_adapt_s.unwrap_or(f64::MAX);
        assert!(t <= 2.5, "seed {seed}: within ±10% after {t} s");
        within += u32::from(t <= 2.0 + 1e-9);
        assert!(
            p[1].in_band >= 0.85,
            "seed {seed}: {:.0}% of 1 s windows within ±10%",
            p[1].in_band * 100.0
        );
    }
    assert!(within >= 10, "within ±10% by 2 s in {within} seeds of 10");
}

/// The same for S2 (the service 2.5 times slower): the first cut within
/// 500 ms in every seed; the target of 2 s is met in 8 seeds of 10 here
/// (0.2-8.2 s; before a drain's growth test asked requests in flight to
/// grow beyond the noise, 7 of 10: a growth of 3-4 in flight at the slower
/// service's latency, with the latency flat, cut a drain at the capacity
/// to below the band; before the cut measured the capacity on the whole
/// window when its earlier half had too few answers, 3 of 10 and once
/// never; the old learner 0.8-19 s, twice never, once within 2 s). Where
/// it is missed, probes kept on noise that go above the capacity. What is
/// asserted is what it achieves: within 2 s in 8 seeds of 10, and the band
/// held in most 1 s windows (85% or more in 9 seeds of 10; the old
/// learner 6).
#[test]
fn s2_slower_service_is_cut_within_500_ms_and_mostly_held_within_10_percent() {
    let (mut within, mut held) = (0, 0);
    for seed in 1..=10 {
        let (r, p) = adaptive("S2", seed);
        let cut = first(&r, Reason::Queue, 20.0).expect("a cut after the change");
        assert!(
            cut <= 0.5,
            "seed {seed}: first cut {cut} s after the change"
        );
        within += u32::from(p[1].time_to_adapt_s.is_some_and(|t| t <= 2.0 + 1e-9));
        held += u32::from(p[1].in_band >= 0.85);
    }
    assert!(within >= 8, "within ±10% by 2 s in {within} seeds of 10");
    assert!(
        held >= 9,
        "85% of 1 s windows within ±10% in {held} seeds of 10"
    );
}

#[test]
fn s2_slower_service_is_learned_as_capacity_not_taken_for_a_queue() {
    for seed in SEEDS {
        let (r, p) = adaptive("S2", seed);
        let slow = p[1];
        // A latency gradient would read 250 ms against 100 ms as a queue and
        // pace at 40% until it re-measured: here the admitted rate stays at
        // the new capacity on average.
        let mean = r.figures(23.0, 40.0).admitted_per_s;
        assert!(
            (180.0..=215.0).contains(&mean),
            "seed {seed}: mean admitted {mean} after the change (capacity 200)"
        );
        assert!(slow.figures.goodput_per_s >= 0.9 * 200.0, "seed {seed}");
        assert_eq!(slow.figures.timeouts, 0, "seed {seed}");
        assert!(
            slow.figures.p99_ms < 1100.0,
            "seed {seed}: p99 {}",
            slow.figures.p99_ms
        );
        assert!(
            r.learned()[230..400].iter().all(|&l| l >= 0.5 * 200.0),
            "seed {seed}: never below half the capacity"
        );
        let t = p[2].time_to_adapt_s.unwrap_or(f64::MAX);
        assert!(t <= 5.0, "seed {seed}: back after {t} s (target 2 s)");
    }
}

#[test]
fn s2_slower_service_below_the_new_capacity_costs_at_most_one_brief_cut() {
    // Service 100 -> 250 ms with 50 workers (capacity 500 -> 200/s) while
    // only 150/s are offered: nothing needs to change.
    for seed in SEEDS {
        let step = |at_s: u64, service_ms: u64| Phase {
            at_ns: at_s * NS_PER_S,
            workers: 50,
            service_us: service_ms * 1000,
            limit_per_s: None,
            offered_per_s: 150,
        };
        let mut s = scenario("S2", learner(500.0, Mode::Enforce), seed);
        s.world.phases = vec![step(0, 100), step(20, 250)];
        s.world.duration_ns = 40 * NS_PER_S;
        let r = run(&s.world);
        let after = r.figures(20.0, 40.0);
        let cuts = r.buckets[200..]
            .iter()
            .filter(|b| b.reasons.has(Reason::Queue))
            .count();
        assert!(cuts <= 3, "seed {seed}: {cuts} cuts");
        assert!(
            after.admitted_per_s >= 0.95 * 150.0,
            "seed {seed}: {}",
            after.admitted_per_s
        );
        assert!(
            after.local_429 <= 200,
            "seed {seed}: {} rejected",
            after.local_429
        );
        assert_eq!(
            r.figures(26.0, 40.0).local_429,
            0,
            "seed {seed}: none once it recovered"
        );
    }
}

#[test]
fn s3_a_limit_seen_only_in_429s_is_learned_and_kept_to() {
    for seed in SEEDS {
        let (r, p) = adaptive("S3", seed);
        let s3 = p[0];
        assert!(
            first(&r, Reason::Shed, 0.0).is_some_and(|t| t <= 0.5),
            "seed {seed}"
        );
        assert!(
            r.reasons[Reason::RetryAfter as usize] > 0,
            "seed {seed}: Retry-After seen"
        );
        // Target: <= 1% after 2 s. The gentle probes (5% over what it
        // answered when it shed) cost 0.8-2.2% here.
        assert!(
            s3.upstream_429_after_2s <= 0.025,
            "seed {seed}: upstream 429s after 2 s {:.2}%",
            s3.upstream_429_after_2s * 100.0
        );
        assert!(s3.figures.goodput_per_s >= 0.95 * 200.0, "seed {seed}");
        assert_eq!(s3.figures.timeouts, 0, "seed {seed}");
    }
}

#[test]
fn s4_a_short_dip_is_absorbed_by_the_queue_with_zero_errors() {
    for seed in SEEDS {
        let (r, p) = adaptive("S4", seed);
        for ph in &p {
            assert_eq!(
                errors(ph),
                0,
                "seed {seed}: phase at {} s: {:?}",
                ph.at_s,
                ph.figures
            );
        }
        assert!(
            first(&r, Reason::Queue, 20.0).is_some(),
            "seed {seed}: the dip was seen"
        );
    }
}

#[test]
fn s9_a_retry_storm_does_not_collapse_and_recovers() {
    for seed in SEEDS {
        let (_, p) = adaptive("S9", seed);
        let storm = p[1];
        assert!(
            storm.figures.goodput_per_s >= 0.9 * 200.0,
            "seed {seed}: {:?}",
            storm.figures
        );
        assert!(
            storm.figures.timeouts <= 30,
            "seed {seed}: {} timeouts",
            storm.figures.timeouts
        );
        let t = p[2].time_to_adapt_s.unwrap_or(f64::MAX);
        assert!(
            t <= 5.5,
            "seed {seed}: back to the offered 400/s after {t} s (target 2 s)"
        );
    }
}

#[test]
fn s10_steady_state_costs_nothing() {
    for seed in SEEDS {
        let (r, p) = adaptive("S10", seed);
        let (_, fixed) = scenario("S10", Pacer::Static { rate_per_s: 500.0 }, seed).run();
        assert_eq!(p[0].figures.local_429, 0, "seed {seed}");
        assert_eq!(p[0].figures.sent, fixed[0].figures.sent, "seed {seed}");
        assert!(
            p[0].figures.p99_ms <= fixed[0].figures.p99_ms + 1.0,
            "seed {seed}: p99 {} against {} at a static 500/s",
            p[0].figures.p99_ms,
            fixed[0].figures.p99_ms
        );
        assert!(
            r.learned().iter().skip(1).all(|&l| l >= 350.0),
            "seed {seed}"
        );
    }
}

#[test]
fn observe_mode_paces_exactly_as_the_static_rate_and_still_learns() {
    let observe = learner(300.0, Mode::Observe);
    let fixed = Pacer::Static { rate_per_s: 300.0 };
    let (ro, _) = scenario("S1", observe, 1).run();
    let (rs, _) = scenario("S1", fixed, 1).run();
    assert_eq!(ro.buckets.len(), rs.buckets.len());
    for (a, b) in ro.buckets.iter().zip(&rs.buckets) {
        assert_eq!(
            (
                a.arrivals,
                a.sent,
                a.ok,
                a.local_429,
                a.timeouts,
                &a.ok_latency_us
            ),
            (
                b.arrivals,
                b.sent,
                b.ok,
                b.local_429,
                b.timeouts,
                &b.ok_latency_us
            )
        );
        assert_eq!(a.rate_per_s, b.rate_per_s);
    }
    // What it would pace at: under 300/s once the backend can take 200/s.
    let learned = ro.learned();
    assert!((learned[199] - 300.0).abs() < 0.01, "{}", learned[199]);
    assert!(
        learned[250] < 220.0 && learned[250] > 150.0,
        "{}",
        learned[250]
    );
}

#[test]
fn low_traffic_keeps_the_rate() {
    // 2 requests per second: never enough answers to judge.
    let mut s = scenario("S10", learner(300.0, Mode::Enforce), 1);
    s.world.phases[0].offered_per_s = 2;
    let r = run(&s.world);
    assert!(r
        .learned()
        .iter()
        .skip(1)
        .all(|&l| (l - 300.0).abs() < 0.01));
    // 503s that do not come from the load (one answer in ten, at any rate)
    // cost two cuts, not a walk down to the minimum.
    let mut c = Controller::new(
        interval_of_rate(300 * MICRO),
        1,
        u64::MAX,
        Tuning::default(),
    );
    let mut cuts = 0;
    for i in 1..=600u64 {
        let sent = (rate_of_interval(c.interval_ns()) / MICRO / 10).clamp(1, 30);
        let t = Tally {
            arrivals: 30,
            sent,
            good: sent - sent / 10,
            shed: sent / 10,
            latency_us: 50_000 * sent,
            latency_sq_ms2: 2_500 * sent,
            ..Tally::EMPTY
        };
        if c.update(i * 100 * NS_PER_MS, &t, 0)
            .reasons
            .has(Reason::Shed)
        {
            cuts += 1;
        }
    }
    assert_eq!(cuts, 2);
    assert!(c.rate() > 150 * MICRO, "{}", c.rate());
}

#[test]
fn the_rate_stays_within_its_bounds() {
    for (lo, hi) in [(250.0, 2000.0), (10.0, 300.0)] {
        let pacer = Pacer::Adaptive {
            start_per_s: 280.0,
            min_per_s: lo,
            max_per_s: hi,
            mode: Mode::Enforce,
        };
        let (r, _) = scenario("S1", pacer, 1).run();
        for l in r.learned().iter().skip(1) {
            assert!(*l >= lo - 0.01 && *l <= hi + 0.01, "{l} outside {lo}..{hi}");
        }
    }
}

#[test]
fn retry_after_holds_probes_back() {
    let mut c = Controller::new(
        interval_of_rate(100 * MICRO),
        1,
        u64::MAX,
        Tuning::default(),
    );
    let round = |good, shed, ra| Tally {
        arrivals: 20,
        sent: 10,
        good,
        shed,
        latency_us: good * 20_000,
        latency_sq_ms2: good * 400,
        retry_after_s: ra,
        ..Tally::EMPTY
    };
    let mut now = 0;
    let mut tick = |c: &mut Controller, t: Tally| {
        now += 100 * NS_PER_MS;
        (now, c.update(now, &t, 0))
    };
    for _ in 0..10 {
        tick(&mut c, round(10, 0, 0));
    }
    let (at, u) = tick(&mut c, round(5, 5, 7));
    assert!(u.reasons.has(Reason::Shed) && u.reasons.has(Reason::RetryAfter));
    assert!(c.rate() < 100 * MICRO);
    let mut probed = None;
    for _ in 0..150 {
        let (t, u) = tick(&mut c, round(10, 0, 0));
        if u.reasons.has(Reason::Probe) {
            probed = Some(t - at);
            break;
        }
    }
    let waited = probed.expect("it probes again");
    assert!(
        waited >= 7 * NS_PER_S,
        "probed {waited} ns after Retry-After: 7"
    );
}

#[test]
fn rates_and_intervals_convert_without_exceeding_the_rate() {
    assert_eq!(interval_of_rate(500 * MICRO), 2 * NS_PER_MS);
    assert_eq!(rate_of_interval(2 * NS_PER_MS), 500 * MICRO);
    assert_eq!(interval_of_rate(3 * MICRO), 333_333_334, "rounded up");
    assert_eq!(interval_of_rate(0), u64::MAX);
    assert_eq!(rate_of_interval(0), 1_000_000_000 * MICRO);
    for r in [1, 277, 3 * MICRO, 999_999 * MICRO, 1_000_000 * MICRO] {
        assert!(rate_of_interval(interval_of_rate(r)) <= r);
    }
}

#[test]
fn failures_at_most_halve_the_rate_per_cut() {
    // A backlog longer than the route's timeout: nearly every answer is
    // Envoy's 504, the few good ones say nothing of the capacity.
    let mut c = Controller::new(
        interval_of_rate(200 * MICRO),
        1,
        u64::MAX,
        Tuning::default(),
    );
    let ok = Tally {
        arrivals: 20,
        sent: 20,
        good: 20,
        latency_us: 20 * 100_000,
        latency_sq_ms2: 20 * 10_000,
        ..Tally::EMPTY
    };
    let timeouts = Tally {
        good: 1,
        failed: 19,
        latency_us: 1_400_000,
        latency_sq_ms2: 1_960_000,
        ..ok
    };
    let mut now = 0;
    for _ in 0..30 {
        now += 100 * NS_PER_MS;
        c.update(now, &ok, 0);
    }
    let mut cuts = 0;
    for _ in 0..30 {
        now += 100 * NS_PER_MS;
        let before = c.rate();
        if c.update(now, &timeouts, 0).reasons.has(Reason::Failed) {
            cuts += 1;
            assert!(
                c.rate() >= before / 2,
                "{} -> {}: at most halved, not cut to what was answered well",
                before,
                c.rate()
            );
        }
    }
    assert!(cuts >= 1);
}

/// A round of `sent` requests, `done` answered good in `latency_ms` each
/// (a 10 ms spread).
fn round(sent: u64, done: u64, latency_ms: u64) -> Tally {
    Tally {
        arrivals: sent,
        sent,
        good: done,
        latency_us: done * latency_ms * 1_000,
        latency_sq_ms2: done * (latency_ms * latency_ms + 100),
        ..Tally::EMPTY
    }
}

#[test]
fn a_queue_drained_for_longer_than_the_reference_lasts_does_not_become_it() {
    // 100 ms without a queue for 5 s; then the upstream falls behind
    // (requests in flight and latency grow), and the queue takes 15 s to
    // drain (latency 800 ms falling 5 ms per round): longer than the
    // reference's 10 s memory.
    let mut c = Controller::new(
        interval_of_rate(200 * MICRO),
        1,
        u64::MAX,
        Tuning::default(),
    );
    let mut now = 0;
    let mut tick = |c: &mut Controller, t: Tally| {
        now += 100 * NS_PER_MS;
        c.update(now, &t, 0)
    };
    for _ in 0..50 {
        tick(&mut c, round(20, 20, 100));
    }
    let mut queue = false;
    for i in 0..10 {
        queue |= tick(&mut c, round(20, 10, 150 + 50 * i))
            .reasons
            .has(Reason::Queue);
    }
    assert!(queue, "the queue was seen");
    for i in 0..150 {
        tick(&mut c, round(9, 10, 800 - 5 * i));
        assert!(
            c.reference_latency_ns() <= 110 * NS_PER_MS,
            "round {i}: reference {} ms",
            c.reference_latency_ns() / NS_PER_MS
        );
    }
}

#[test]
fn from_the_minimum_it_climbs_to_the_demand() {
    // Started (or cut by a stall) at 10/s with room for 500/s and 350/s
    // offered: probes at low rates last long enough to be judged.
    for seed in SEEDS {
        let (r, _) = scenario("S10", learner(10.0, Mode::Enforce), seed).run();
        let t = r
            .learned()
            .iter()
            .position(|&l| l >= 0.9 * 350.0)
            .map(|i| i as f64 / 10.0);
        assert!(
            t.is_some_and(|t| t <= 20.0),
            "seed {seed}: at 90% of the demand after {t:?} s"
        );
    }
}

#[test]
fn a_stall_cuts_at_most_to_a_quarter() {
    // 250/s answered in 100 ms; then answers slow down and stop while
    // requests keep going out (the backend, or the machine, stalls): the
    // later half of the queue test's window has next to no answers.
    let mut c = Controller::new(
        interval_of_rate(250 * MICRO),
        interval_of_rate(1_000 * MICRO),
        interval_of_rate(MICRO),
        Tuning::default(),
    );
    let round = |sent: u64, good: u64, latency_ms: u64| Tally {
        arrivals: 20,
        sent,
        good,
        latency_us: good * latency_ms * 1_000,
        latency_sq_ms2: good * (latency_ms * latency_ms + 100),
        ..Tally::EMPTY
    };
    let mut now = 0;
    for _ in 0..50 {
        now += 100 * NS_PER_MS;
        c.update(now, &round(20, 20, 100), 0);
    }
    let before = c.rate();
    let mut cut = false;
    for i in 0..8u64 {
        now += 100 * NS_PER_MS;
        let t = match i {
            0 => round(20, 12, 150),
            1 => round(20, 2, 300),
            _ => round(20, 0, 0),
        };
        cut |= c.update(now, &t, 0).reasons.has(Reason::Queue);
        assert!(
            c.rate() >= before / 4,
            "round {i}: {} from {before}",
            c.rate()
        );
    }
    assert!(cut, "the stall looks like a queue");
}

/// One scenario of `sim::more` (attacks, a stalled start).
fn more_of(name: &str, seed: u64) -> (Report, Vec<PhaseFigures>) {
    super::sim::more(learner(500.0, Mode::Enforce), seed)
        .into_iter()
        .find(|s| s.name == name)
        .expect("a scenario of that name")
        .run()
}

/// Red team 3, finding 1: a client whose own requests the backend answers
/// badly (20% of the rule's traffic, to one path from one client) cut the
/// rule's rate for everyone. Its errors stay with its path and client while
/// the others are answered well: they are not the load's, and cost the
/// others nothing, during the attack or after it (with `Retry-After: 3600`
/// too).
#[test]
fn an_attackers_errors_do_not_cut_the_rate_of_the_others() {
    for name in ["A503", "A500", "A429"] {
        for seed in SEEDS {
            let (r, p) = more_of(name, seed);
            for ph in &p[1..] {
                assert!(
                    ph.figures.goodput_per_s >= 0.95 * 350.0 && ph.figures.local_429 == 0,
                    "{name} seed {seed}: from {} s, goodput {:.0}/s of 350, {} rejected",
                    ph.at_s,
                    ph.figures.goodput_per_s,
                    ph.figures.local_429
                );
            }
            let cuts = r.reasons[Reason::Shed as usize] + r.reasons[Reason::Failed as usize];
            assert_eq!(cuts, 0, "{name} seed {seed}: {cuts} cuts for answers");
            assert_eq!(
                r.reasons[Reason::RetryAfter as usize],
                0,
                "{name} seed {seed}"
            );
            assert!(
                r.learned().iter().skip(1).all(|&l| l >= 350.0),
                "{name} seed {seed}: the learned rate stays above the demand"
            );
        }
    }
}

/// ... while a real drop of capacity under the same attacker is still cut
/// at once (within 500 ms), and the others keep their goodput.
#[test]
fn a_real_drop_under_an_attacker_is_still_cut_at_once() {
    for seed in SEEDS {
        let (r, p) = more_of("A503-drop", seed);
        let cut = first(&r, Reason::Queue, 30.0).expect("a cut after the drop");
        assert!(cut <= 0.5, "seed {seed}: cut {cut} s after the drop");
        assert!(
            p[2].figures.goodput_per_s >= 0.9 * 200.0 && p[2].figures.timeouts == 0,
            "seed {seed}: {:?}",
            p[2].figures
        );
    }
}

/// A start behind a backend that answers nothing for 1.5 s: the first
/// answers carry a queue beyond the route's timeout (504s). That is no
/// latency reference: it is learned again from the drain, and the rule is
/// paced at the capacity within seconds (it took the queued latency for
/// its reference, and lost 82% of the phase's goodput in perf/adaptive).
#[test]
fn after_a_stalled_start_the_latency_reference_is_learned_again() {
    for seed in SEEDS {
        let mut world = super::sim::more(learner(500.0, Mode::Enforce), seed)
            .into_iter()
            .find(|s| s.name == "S1-stall")
            .expect("S1-stall")
            .world;
        world.duration_ns = 12 * NS_PER_S;
        let r = run(&world);
        assert!(
            first(&r, Reason::Queue, 1.5).is_some_and(|t| t <= 0.5),
            "seed {seed}: the queue beyond the route's timeout is drained"
        );
        let after = r.figures(6.0, 12.0);
        assert!(
            after.goodput_per_s >= 0.95 * 400.0 && after.gateway_504 == 0 && after.p99_ms < 500.0,
            "seed {seed}: {after:?}"
        );
    }
}

/// Tallies of round `r` at `rate` per second answered in 100 ms from 20
/// clients on 4 paths: `bad` of them 503 (with `Retry-After` `ra`), from an
/// attacker of its own, or (`spread`) from whichever clients' turn it is.
fn round_with_origins(r: u64, rate: u64, bad: u64, ra: u64, spread: bool) -> Tally {
    use super::tally::{Observation, Origin, Outcome};
    let mut t = Tally::EMPTY;
    let n = rate / 10;
    let mix = |x: u64| {
        x.wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29)
    };
    for i in 0..n {
        let (path, client) = ((i / 5) % 4, i % 20);
        let (status, origin) = if !spread && i < bad {
            (503, Origin::new(mix(99), mix(999)))
        } else if spread && (i + r * 7) % n < bad {
            (503, Origin::new(mix(path), mix(client + 100)))
        } else {
            (200, Origin::new(mix(path), mix(client + 100)))
        };
        t.arrived();
        t.sent();
        t.record(&Observation {
            sent_at: 0,
            done_at: 100 * NS_PER_MS,
            outcome: Outcome::Answered {
                status,
                retry_after_s: (status == 503 && ra > 0).then_some(ra),
            },
            deadline_ns: None,
            origin: Some(origin),
            sampled: i % 8 == 0,
        });
    }
    t
}

#[test]
fn retry_after_counts_only_with_sheds_of_the_load_and_a_cut_does_not_stay_without_evidence() {
    // 200/s answered well; one client's requests (10%) answered 503 with
    // Retry-After: 3600: no cut, no hold.
    let mut c = Controller::new(
        interval_of_rate(200 * MICRO),
        interval_of_rate(200 * MICRO),
        u64::MAX,
        Tuning::default(),
    );
    let mut now = 0;
    for _ in 0..50 {
        now += 100 * NS_PER_MS;
        let u = c.update(now, &round_with_origins(0, 200, 2, 3600, false), 0);
        assert!(!u.reasons.has(Reason::Shed) && !u.reasons.has(Reason::RetryAfter));
    }
    assert!(c.rate() >= 200 * MICRO, "{}", c.rate());
    // The same share of 503s spread over every client and path: the load's.
    let mut cut = false;
    for r in 0..10 {
        now += 100 * NS_PER_MS;
        let u = c.update(now, &round_with_origins(r, 200, 4, 3600, true), 0);
        cut |= u.reasons.has(Reason::Shed) && u.reasons.has(Reason::RetryAfter);
    }
    assert!(cut && c.rate() < 200 * MICRO, "{}", c.rate());
    let after_cut = c.rate();
    // Then nothing comes (no demand, no answers): no evidence keeps the cut,
    // so the rate goes back to where the evidence was (the capacity it
    // measured), and probes may start as soon as demand returns.
    for _ in 0..30 {
        now += 100 * NS_PER_MS;
        c.update(now, &Tally::EMPTY, 0);
    }
    assert!(c.rate() >= after_cut, "{} < {after_cut}", c.rate());
}

/// The start of a load: requests in flight fill up to the rate times the
/// latency, and the quickest answers come first (the mean latency of the
/// answers rises while they fill): both grow, with no queue at all.
#[test]
fn the_start_of_a_load_is_not_taken_for_a_queue() {
    let mut c = Controller::new(
        interval_of_rate(300 * MICRO),
        1,
        u64::MAX,
        Tuning::default(),
    );
    let mut now = 0;
    // A load before: 200/s answered in 100 ms (the reference), then idle.
    for _ in 0..50 {
        now += 100 * NS_PER_MS;
        c.update(now, &round(20, 20, 100), 0);
    }
    for _ in 0..30 {
        now += 100 * NS_PER_MS;
        c.update(now, &Tally::EMPTY, 0);
    }
    // 250/s from now on, answered in 100 ms on average (lognormal): in the
    // first round only the quickest are back, then more and slower ones.
    let start = [(25, 10, 75), (25, 20, 90), (25, 23, 97), (25, 25, 100)];
    let rate = c.rate();
    for i in 0..20 {
        now += 100 * NS_PER_MS;
        let (s, d, l) = start.get(i).copied().unwrap_or((25, 25, 100));
        let u = c.update(now, &round(s, d, l), 0);
        assert!(
            !u.reasons.has(Reason::Queue),
            "round {i}: taken for a queue"
        );
    }
    assert!(c.rate() >= rate, "{} < {rate}", c.rate());
}

/// The way back up after a capacity returns (S1's workers, S2's service
/// time, S9's storm: 200/s back to the offered 400/s), seeds 1-10: within
/// ±10% within 2 s in 27 runs of 30 here, 2.4 s at most (19 before a full
/// probe that showed room was kept when its time was up, and a probe went
/// to the median round's demand; 21 before the drain
/// followed its capacity up by 2% steps: S9's fewer, S2's more; before
/// answers suddenly faster than the reference started a probe at once: 17; the
/// learner before issue 31's "settle" part: 1 of 30, 1.8-5.1 s). Probes
/// above the demand found no room but sent what the rule held all at once,
/// +15-20% over a second; a probe now goes no higher than 105% of the
/// demand.
#[test]
fn the_way_back_up_after_a_capacity_returns_is_mostly_within_2_s() {
    let mut within = 0;
    for (name, phase) in [("S1", 2), ("S2", 2), ("S9", 2)] {
        for seed in 1..=10 {
            let (_, p) = adaptive(name, seed);
            let t = p[phase].time_to_adapt_s.unwrap_or(f64::MAX);
            assert!(t <= 4.0, "{name} seed {seed}: back after {t} s");
            within += u32::from(t <= 2.0 + 1e-9);
        }
    }
    assert!(within >= 25, "back within 2 s in {within} runs of 30");
}

/// Within 2 s over sixty seeds, per scenario and phase (issue 31): the
/// drop and the way back of S1, S2 and S9. Measured at 60 seeds (and 200,
/// in the README) because the twenty of this test before were a sample:
/// their 18-20 of 20 were 47-58 of 60. A full probe that shows room when
/// its time is up is kept at once at what it sent (issue 31's "up" part);
/// a full probe admits at the rate before from the schedule's lead
/// before its time is up, so what it sends at its rate ends on time; and
/// a standing queue is drained below what the upstream served meanwhile,
/// not below a capacity last measured on a short window. Before those two
/// (seeds 1-60): S1 55 and 50, S2 46 and 58, S9 55 and 47.
fn drop_and_way_back_within_2_s_over_sixty_seeds(
    name: &str,
    drop_at_least: u32,
    back_at_least: u32,
) {
    let (mut within, mut worst) = ([0u32; 2], [0.0f64; 2]);
    for seed in 1..=60 {
        let (_, p) = adaptive(name, seed);
        for k in 0..2 {
            let t = p[k + 1].time_to_adapt_s.unwrap_or(f64::MAX);
            worst[k] = worst[k].max(t);
            within[k] += u32::from(t <= 2.0 + 1e-9);
        }
    }
    for (k, (what, at_least)) in [("drop", drop_at_least), ("way back", back_at_least)]
        .into_iter()
        .enumerate()
    {
        assert!(
            within[k] >= at_least,
            "{name} {what}: within 2 s in {} of 60 (at most {} s)",
            within[k],
            worst[k]
        );
    }
    // The way back: never more than 5.5 s (5.0 s measured, S9).
    assert!(worst[1] <= 5.5, "{name}: back after {} s", worst[1]);
}

#[test]
fn s1_drop_and_way_back_within_2_s_over_sixty_seeds() {
    drop_and_way_back_within_2_s_over_sixty_seeds("S1", 55, 52);
}

#[test]
fn s2_drop_and_way_back_within_2_s_over_sixty_seeds() {
    drop_and_way_back_within_2_s_over_sixty_seeds("S2", 47, 55);
}

#[test]
fn s9_drop_and_way_back_within_2_s_over_sixty_seeds() {
    drop_and_way_back_within_2_s_over_sixty_seeds("S9", 55, 48);
}

/// `arrivals` arrived in a round, `sent` of them went out and were answered
/// good in 100 ms each.
fn demand_round(arrivals: u64, sent: u64) -> Tally {
    Tally {
        arrivals,
        ..round(sent, sent, 100)
    }
}

/// A probe goes no higher than 105% of the demand: 310/s arrive, paced at
/// 300/s with room above (answers in 100 ms, no queue). Before, the first
/// probe went to 360/s, the gain's.
#[test]
fn a_probe_goes_no_higher_than_the_demand_and_the_band() {
    let mut c = Controller::new(
        interval_of_rate(300 * MICRO),
        1,
        u64::MAX,
        Tuning::default(),
    );
    let mut probes = 0;
    for i in 1..=50 {
        let u = c.update(i * 100 * NS_PER_MS, &demand_round(31, 30), 0);
        probes += u32::from(u.reasons.has(Reason::Probe));
        assert!(
            c.rate() <= 326 * MICRO,
            "round {i}: {} /s",
            c.rate() / MICRO
        );
    }
    assert!(probes >= 1, "it probed");
}

/// While the rule holds a queue (its schedule 400 ms ahead), a rate far
/// above the demand (500/s against 250/s arriving: the capacity came back
/// while it held what it could not send) comes down to 105% of it, so
/// the queue goes out within the band instead of all at once. Without a
/// queue held the rate stays where it is (a demand below the rate is no
/// reason to lower it: S10).
#[test]
fn a_queue_the_rule_holds_goes_out_at_the_demand_plus_the_band() {
    let start = || {
        Controller::new(
            interval_of_rate(500 * MICRO),
            1,
            u64::MAX,
            Tuning::default(),
        )
    };
    let (mut held, mut free) = (start(), start());
    for i in 1..=30 {
        let now = i * 100 * NS_PER_MS;
        held.update(now, &demand_round(25, 25), 400 * NS_PER_MS);
        free.update(now, &demand_round(25, 25), 0);
    }
    let r = held.rate() / MICRO;
    assert!((250..=263).contains(&r), "with a queue held: {r} /s");
    assert_eq!(free.rate(), 500 * MICRO, "without");
}

/// A capacity that comes back shows as answers that are suddenly faster
/// than the reference (the queue a cruise near the old capacity kept is
/// gone at once): a probe starts in the next round, without waiting for
/// the probe timer. A latency that falls a little each round (a queue
/// draining at the cruise's margin) starts none before its time. Paced at
/// 200/s with 400/s arriving, answers in 150 ms; after a probe that found
/// nothing (the next one waits 1 s), 100 ms at once, or 8 ms less each round.
#[test]
fn answers_suddenly_faster_than_the_reference_start_a_probe_at_once() {
    let probe_after = |fall: &dyn Fn(u64) -> u64| -> Option<u64> {
        let mut c = Controller::new(
            interval_of_rate(200 * MICRO),
            1,
            u64::MAX,
            Tuning::default(),
        );
        let mut now = 0;
        let mut tick = |c: &mut Controller, latency_ms: u64| {
            now += 100 * NS_PER_MS;
            c.update(
                now,
                &Tally {
                    arrivals: 40,
                    ..round(20, 20, latency_ms)
                },
                0,
            )
        };
        // Until a probe has run and been judged (not kept: no more sent).
        let mut probed = None;
        for i in 0..200 {
            if tick(&mut c, 150).reasons.has(Reason::Probe) && i >= 40 {
                probed = Some(i);
            }
            if probed.is_some_and(|p| i >= p + 8) {
                break;
            }
        }
        assert!(probed.is_some(), "a probe ran");
        assert_eq!(c.rate(), 200 * MICRO, "back to the rate after the probe");
        (1..=5).find(|&i| tick(&mut c, fall(i)).reasons.has(Reason::Probe))
    };
    let at_once = probe_after(&|_| 100);
    assert!(
        at_once.is_some_and(|i| i <= 3),
        "faster at once: probe in round {at_once:?}"
    );
    let gradual = probe_after(&|i| 150 - 8 * i);
    assert_eq!(gradual, None, "a gradual fall: probe in round {gradual:?}");
}

/// A probe is kept at no more than 105% of the demand: what it delivered
/// may be the rule's own queue going out (S9's retries), not what arrives.
/// 310/s arrive, 400/s go out and are answered in 100 ms (a queue held
/// going out); before, a probe kept 95% of the 400/s delivered, 380/s.
#[test]
fn a_probe_is_kept_at_no_more_than_the_demand_and_the_band() {
    let mut c = Controller::new(
        interval_of_rate(300 * MICRO),
        1,
        u64::MAX,
        Tuning::default(),
    );
    let mut kept = 0;
    for i in 1..=50 {
        let u = c.update(i * 100 * NS_PER_MS, &demand_round(31, 40), 0);
        kept += u32::from(u.reasons.has(Reason::Kept));
        assert!(
            c.rate() <= 326 * MICRO,
            "round {i}: {} /s",
            c.rate() / MICRO
        );
    }
    assert!(kept >= 1, "a probe was kept");
}
