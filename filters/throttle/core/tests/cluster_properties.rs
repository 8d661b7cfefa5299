//! Property tests of cluster scope: many simulated proxies (the real caller,
//! grants and cursor code) against the in-memory engine that models the
//! service's hourly counter windows, under random loads, clock skews, call
//! latencies, failures and start times near an hour boundary.
//!
//! Invariants:
//! * no grid slot is ever granted twice, across any number of proxies, even
//!   when claims straddle the service's hour boundary with clocks within
//!   `max_clock_skew` of each other and answers later than the timeout
//!   (the host's timeout, or an answer it delivers late);
//! * a slot is used at most `slack` after its time, and before it (at most
//!   an epoch early) by at most `burst + 1` requests of a proxy at a time
//!   (three for a burst below 2: two due within two gaps, one beyond);
//! * grid releases over any window W are at most `R*(W + skew spread) + burst + 2`
//!   plus `burst + 1` per proxy (those that may be ahead: until 2026-11-28
//!   one, when a slot went early one at a time whatever the burst);
//! * without engine failures the whole release stream keeps that bound plus
//!   what each proxy may release ahead of its grants (`burst + 1`, credit),
//!   and a saturated cluster gets the rate exactly (within one epoch's slots).
//!
//! Bounded (PROPTEST_CASES, default 24 here: each case simulates seconds of
//! several proxies); `make fuzz-long` style runs may raise it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use proptest::prelude::*;
use throttle_core::classes::CATCH_UP_NS;
use throttle_core::cluster::sim::{
    self, first_overlap, max_in_window, Net, SimProxy, SimRule, World,
};
use throttle_core::cluster::{rule_reach, Grid, Reach, RuleSpec};
use throttle_core::config::{EngineConfig, OnEngineFailure};

const MS: u64 = 1_000_000;
/// The simulated world's tick (`sim::World::tick_ns`).
const TICK: u64 = 5 * MS;
const S: u64 = 1_000_000_000;
/// An hour boundary of the service's window (2026-11-23 21:00 UTC).
const HOUR: u64 = 1_795_471_200 * S;

fn engine(skew: u64) -> EngineConfig {
    EngineConfig {
        cluster: "throttle_engine".into(),
        timeout_ns: 50 * MS,
        fallback_after_ns: 250 * MS,
        domain: "envoy_throttle".into(),
        max_clock_skew_ns: skew,
    }
}

#[derive(Debug, Clone)]
struct Case {
    rate: u64,
    burst: u64,
    /// Per proxy: requests per second (uneven), clock skew (ns, signed).
    proxies: Vec<(u64, i64)>,
    engine_skew: i64,
    /// Start, relative to the hour boundary (ms before it).
    start_before_hour_ms: u64,
    /// Per call: latency (ms, may exceed the 50 ms timeout) and whether it is refused.
    net: Vec<(u64, bool)>,
    duration_ms: u64,
}

const SKEW: u64 = 100 * MS;

fn case(failures: bool) -> impl Strategy<Value = Case> {
    let half = (SKEW / 2) as i64;
    (
        prop::sample::select(vec![20u64, 97, 300, 500, 1000]),
        0u64..4,
        prop::collection::vec((0u64..1500, -half..half), 1..7),
        -half..half,
        0u64..3000,
        prop::collection::vec(
            (
                0u64..120,
                prop::bool::weighted(if failures { 0.15 } else { 0.0 }),
            ),
            64,
        ),
        1500u64..3500,
    )
        .prop_map(
            move |(rate, burst, proxies, engine_skew, start, mut net, duration_ms)| {
                if !failures {
                    for n in &mut net {
                        n.0 %= 40; // always within the timeout
                    }
                }
                Case {
                    rate,
                    burst,
                    proxies,
                    engine_skew,
                    start_before_hour_ms: start,
                    net,
                    duration_ms,
                }
            },
        )
}

struct Outcome {
    world: World,
    start: u64,
    end: u64,
    reach: Reach,
}

fn run(c: &Case) -> Outcome {
    let rule = SimRule {
        name: "orders".into(),
        rate_per_s: c.rate,
        burst: c.burst,
        max_queue_delay_ms: 1000,
        expected_replicas: 3,
        on_engine_failure: OnEngineFailure::LocalShare,
    };
    let config = sim::config(&engine(SKEW), &[rule]).unwrap();
    let reach = rule_reach(&config.rules[0]).unwrap();
    let proxies = c
        .proxies
        .iter()
        .map(|&(_, skew)| SimProxy::new(&config, skew).unwrap())
        .collect();
    let mut world = World::new(proxies, 50 * MS);
    world.engine_skew_ns = c.engine_skew;
    let start = HOUR - c.start_before_hour_ms * MS;
    let end = start + c.duration_ms * MS;
    let loads: Vec<u64> = c.proxies.iter().map(|p| p.0).collect();
    let net = c.net.clone();
    world.run(
        start,
        end,
        |p, from, to| {
            let per_s = loads[p];
            if per_s == 0 {
                return Vec::new();
            }
            // Evenly spaced, each proxy with its own phase.
            let gap = S / per_s;
            let phase = (p as u64 * 7_919 * MS / 10) % gap;
            let first = (from.saturating_sub(phase)) / gap + 1;
            (first..)
                .map(|i| i * gap + phase)
                .take_while(|&t| t <= to)
                .filter(|&t| t > from)
                .map(|t| (0, t))
                .collect()
        },
        |_, n| {
            let (latency_ms, refused) = net[(n as usize) % net.len()];
            if refused {
                Net::Refused(MS)
            } else {
                Net::Latency(latency_ms * MS + MS / 2)
            }
        },
    );
    Outcome {
        world,
        start,
        end,
        reach,
    }
}

fn skew_spread(c: &Case) -> u64 {
    let skews: Vec<i64> = c.proxies.iter().map(|p| p.1).collect();
    (skews.iter().max().unwrap() - skews.iter().min().unwrap()) as u64
}

fn bound(c: &Case, w: u64) -> usize {
    // R * (W + spread) + burst + 2, with R*(...) rounded up.
    let interval = S.div_ceil(c.rate);
    ((w + skew_spread(c)).div_ceil(interval) + c.burst + 2) as usize
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        ..ProptestConfig::default()
    })]

    /// No slot twice, and grid releases within the bound, whatever fails.
    #[test]
    fn no_slot_is_granted_twice_and_grid_releases_keep_the_bound(c in case(true)) {
        let o = run(&c);
        let granted: Vec<(u64, u64)> = o.world.proxies.iter().flat_map(|p| p.granted.iter().map(|g| g.1)).collect();
        prop_assert_eq!(first_overlap(&granted), None, "a slot granted twice: {:?}", c);
        // The simulation saw which request took each slot.
        prop_assert!(o.world.proxies.iter().all(|p| p.unmatched == 0));
        // Every released grid slot was granted to the proxy that used it, and used once.
        let mut used: Vec<u64> = Vec::new();
        for p in &o.world.proxies {
            // A slot used before its time: at most an epoch early, and few
            // at once (as many as credit, `burst + 1`, or two due within two
            // of the proxy's gaps and one more beyond: the proxy is never far
            // ahead of its slots).
            let mut pending: Vec<u64> = Vec::new();
            let mut releases: Vec<_> = p.releases.iter().collect();
            releases.sort_by_key(|r| r.at);
            for r in releases {
                if let Some(slot) = r.slot {
                    prop_assert!(p.granted.iter().any(|g| g.1.0 <= slot && slot < g.1.1), "slot {} not granted", slot);
                    used.push(slot);
                    // Never later than the slack (taken at arrival) or the
                    // catch-up of a late tick (granted to the line); early
                    // at most `burst + 1` (or three) at a time.
                    let local_at = r.at.saturating_add_signed(p.skew_ns);
                    let slot_t = o.reach.grid.slot_time(slot);
                    prop_assert!(local_at <= slot_t + o.reach.slack_ns.max(CATCH_UP_NS) + MS);
                    if local_at < slot_t {
                        prop_assert!(slot_t - local_at <= o.reach.grid.epoch_ns, "more than an epoch early");
                        pending.retain(|&t| t > local_at + MS);
                        pending.push(slot_t);
                        let most = usize::try_from(c.burst + 1).unwrap().max(3);
                        prop_assert!(pending.len() <= most, "{} ahead at once at {}", pending.len(), local_at);
                    }
                }
            }
        }
        let n = used.len();
        used.sort_unstable();
        used.dedup();
        prop_assert_eq!(used.len(), n, "a slot used twice");
        let mut times: Vec<u64> = o.world.proxies.iter().flat_map(|p| p.releases.iter().filter(|r| r.slot.is_some()).map(|r| r.at)).collect();
        times.sort_unstable();
        // The line's requests leave at the world's tick (5 ms) after their
        // slot is due: a window may gain R x 5 ms.
        for w in [100 * MS, S] {
            let worst = max_in_window(&times, w);
            let ahead = c.proxies.len() * usize::try_from(c.burst + 1).unwrap();
            prop_assert!(worst <= bound(&c, w + TICK) + ahead, "window {} ms: {} > {} + {}", w / MS, worst, bound(&c, w + TICK), ahead);
        }
        let _ = (o.start, o.end);
    }

    /// With a healthy engine: every release keeps the bound, and a saturated
    /// cluster gets the rate (over the second half of the run: the hour
    /// boundary's pause is in the first half or absent).
    #[test]
    fn a_healthy_engine_gives_the_rate_within_the_bound(c in case(false)) {
        let o = run(&c);
        let mut times: Vec<u64> = o.world.proxies.iter().flat_map(|p| p.releases.iter().map(|r| r.at)).collect();
        times.sort_unstable();
        prop_assert!(o.world.proxies.iter().all(|p| p.releases.iter().all(|r| r.slot.is_some() || r.credit)), "no fallback without failures");
        // Each proxy may be ahead of its grants by burst + 1 (credit); the
        // line's requests leave at the world's tick after their slot is due.
        let credit = c.proxies.len() * (c.burst as usize + 1);
        for w in [100 * MS, S] {
            let worst = max_in_window(&times, w);
            prop_assert!(worst <= bound(&c, w + TICK) + credit, "window {} ms: {} > {} + {}", w / MS, worst, bound(&c, w + TICK), credit);
        }
        let offered: u64 = c.proxies.iter().map(|p| p.0).sum();
        let crossing = c.start_before_hour_ms < c.duration_ms;
        if offered >= 2 * c.rate && !crossing && c.duration_ms >= 2000 {
            let from = o.start + 1000 * MS;
            let to = o.end - 300 * MS;
            let got = times.iter().filter(|&&t| t >= from && t < to).count() as f64;
            let want = (to - from) as f64 / S as f64 * c.rate as f64;
            let slack = 2.0 * (o.reach.grid.epoch_ns as f64 / o.reach.grid.interval_ns as f64).ceil() + 2.0;
            prop_assert!((got - want).abs() <= slack.max(0.02 * want), "got {} want {} ({:?})", got, want, c);
        }
        // Calls: at most 10 per second per proxy (paced at 100 ms, up to
        // CALL_TOLERANCE_NS early: one more than the duration's tenths at most).
        for p in &o.world.proxies {
            prop_assert!(p.calls <= c.duration_ms / 100 + 2);
        }
    }
}

/// Callers alone, without requests: random facts (so leftovers are claimed
/// often), random call times around an hour boundary, clocks within the skew
/// allowance, requests that reach the service late (after the caller gave up).
#[derive(Debug, Clone)]
struct Calls {
    proxies: Vec<i64>,
    engine_skew: i64,
    /// (proxy, ms after the start, arrivals added, waiting, out ms, back ms)
    ticks: Vec<(usize, u64, u64, u64, u64, u64)>,
    start_before_hour_ms: u64,
    rate: u64,
}

fn calls() -> impl Strategy<Value = Calls> {
    let half = (SKEW / 2) as i64;
    // Skews at the extremes of the allowance half of the time.
    let skew = move || prop_oneof![Just(-half + 1), Just(half - 1), -half..half];
    (
        prop::collection::vec(skew(), 2..6),
        skew(),
        prop::collection::vec(
            (
                0usize..6,
                0u64..1500,
                0u64..80,
                0u64..40,
                0u64..70,
                0u64..30,
            ),
            50..400,
        ),
        0u64..1200,
        prop::sample::select(vec![20u64, 300, 1000, 5000]),
    )
        .prop_map(
            |(proxies, engine_skew, mut ticks, start_before_hour_ms, rate)| {
                let n = proxies.len();
                for t in &mut ticks {
                    t.0 %= n;
                }
                ticks.sort_by_key(|t| t.1);
                Calls {
                    proxies,
                    engine_skew,
                    ticks,
                    start_before_hour_ms,
                    rate,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn claims_around_the_hour_never_grant_a_slot_twice(c in calls()) {
        prop_assert_eq!(first_overlap(&simulate_calls(&c)), None);
    }
}

/// A call on its way: to the engine (`answer` None) or back with its answer.
struct Pending {
    proxy: usize,
    body: Vec<u8>,
    /// The answer, once served: (status, body).
    answer: Option<(u16, Vec<u8>)>,
    back_ns: u64,
    sent_true: u64,
}

type Events = std::collections::BTreeMap<(u64, u64), Pending>;

/// Runs the callers of a [`Calls`] case; returns every range granted.
fn simulate_calls(c: &Calls) -> Vec<(u64, u64)> {
    use throttle_core::cluster::sim::FakeEngine;
    use throttle_core::cluster::{Caller, Failure, RuleFacts};
    let grid = Grid::new(S.div_ceil(c.rate));
    let spec = RuleSpec {
        name: "orders".into(),
        grid,
        expected_replicas: 1,
        on_engine_failure: OnEngineFailure::LocalShare,
    };
    let mut callers: Vec<Caller> = c
        .proxies
        .iter()
        .map(|_| Caller::new(&engine(SKEW), vec![spec.clone()]))
        .collect();
    let mut arrived = vec![0u64; c.proxies.len()];
    let mut engine = FakeEngine::default();
    let start = HOUR - c.start_before_hour_ms * MS;
    let mut events = Events::new();
    let mut seq = 0u64;
    let mut granted: Vec<(u64, u64)> = Vec::new();
    let mut deliver = |events: &mut Events, upto: u64, callers: &mut [Caller], seq: &mut u64| {
        while let Some(entry) = events.first_entry() {
            let (at, _) = *entry.key();
            if at > upto {
                break;
            }
            let mut ev = entry.remove();
            match ev.answer.take() {
                None => {
                    // Served on the engine's clock, whether or not the proxy still waits.
                    let served = engine.handle(&ev.body, at.saturating_add_signed(c.engine_skew));
                    ev.answer = Some(served);
                    *seq += 1;
                    events.insert((at + ev.back_ns, *seq), ev);
                }
                Some((status, body)) => {
                    let p = ev.proxy;
                    let now = at.saturating_add_signed(c.proxies[p]);
                    // Later than the timeout, the host gives up on the call;
                    // or, as after a stall of the proxy with the answer in
                    // its socket, delivers the answer late (every other ms).
                    let answer = if at - ev.sent_true > 50 * MS && (at / MS) % 2 == 0 {
                        Err(Failure::Timeout)
                    } else {
                        Ok((status, body.as_slice()))
                    };
                    let updates = callers[p].on_answer(now, answer);
                    granted.extend(updates.iter().flat_map(|u| u.ranges.clone()));
                }
            }
        }
    };
    for &(p, at_ms, add, waiting, out_ms, back_ms) in &c.ticks {
        let t = start + at_ms * MS;
        deliver(&mut events, t, &mut callers, &mut seq);
        arrived[p] += add;
        let now = t.saturating_add_signed(c.proxies[p]);
        let facts = [RuleFacts {
            arrived_total: arrived[p],
            waiting,
            owed: 0,
            owned_soon: 0,
        }];
        if let (Some(call), _) = callers[p].tick(now, &facts) {
            seq += 1;
            let ev = Pending {
                proxy: p,
                body: call.request.body,
                answer: None,
                back_ns: back_ms * MS,
                sent_true: t,
            };
            events.insert((t + out_ms * MS, seq), ev);
        }
    }
    deliver(&mut events, u64::MAX, &mut callers, &mut seq);
    granted
}
