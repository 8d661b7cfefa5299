//! Property tests of the priority classes: a process of two workers
//! (`classes::sim`) under random arrivals of random classes, cancellations
//! and jittered ticks.
//!
//! Invariants:
//! * no request is released twice, and none is lost: when the run has
//!   drained, every request went at once, was released, rejected,
//!   displaced or cancelled, and the `held` gauge is back at 0;
//! * the rule's total rate holds over every window: at most
//!   `(W + 2 x tick gap) / T + burst + 1` releases in any `W` (a slot is
//!   granted at the first tick after its time and resumed at its holder's
//!   next tick);
//! * nobody waits past its class's `max_queue_delay` (plus a tick gap);
//! * with every class saturated, the total is the rate exactly (every due
//!   slot used, give or take the ticks at the ends), and each class gets at
//!   least its floor (`min_share` of the releases, less the discrepancy);
//! * with a single class, nobody is displaced (its estimate is exact).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::HashSet;

use proptest::prelude::*;
use throttle_core::classes::discrepancy;
use throttle_core::classes::sim::{Fate, Process};
use throttle_core::matcher::FakeRequest;
use throttle_core::stats::Stat;

const MS: u64 = 1_000_000;
const T0: u64 = 1_000_000 * MS;

/// A rule of `rate`/s with `shares` (ppm) classes named c0 (highest) .. cN,
/// matched by `x-class`; the last class is the default. Class `i` may wait
/// `delays[i]` ms.
fn config(rate: u64, burst: u64, shares: &[u32], delays: &[u64]) -> String {
    let classes: Vec<String> = shares
        .iter()
        .zip(delays)
        .enumerate()
        .map(|(i, (ppm, d))| {
            let m = if i + 1 == shares.len() {
                String::new()
            } else {
                format!(r#", "match": {{"headers": {{"x-class": "c{i}"}}}}"#)
            };
            format!(
                r#"{{"name": "c{i}"{m}, "min_share": {}, "max_queue_delay": "{d}ms"}}"#,
                f64::from(*ppm) / 1e6
            )
        })
        .collect();
    format!(
        r#"{{"rules": [{{"name": "r", "rate": "{rate}/s", "burst": {burst}, "max_queue_delay": "500ms",
            "classes": [{}]}}]}}"#,
        classes.join(", ")
    )
}

fn req(class: usize) -> FakeRequest {
    FakeRequest::get("/").with_header("x-class", &format!("c{class}"))
}

/// One step of a run.
#[derive(Debug, Clone)]
enum Step {
    /// `n` requests of class `class` on `worker`.
    Arrive { worker: usize, class: usize, n: u8 },
    /// The client of the `k`-th request so far (mod count) goes away.
    Cancel { k: usize },
    /// Time passes: each worker ticks once, `ms` later (jittered apart).
    Tick { ms: u64, jitter: u64 },
}

fn step(classes: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..2usize, 0..classes, 1..4u8).prop_map(|(worker, class, n)| Step::Arrive { worker, class, n }),
        1 => (0..10_000usize).prop_map(|k| Step::Cancel { k }),
        4 => (1..5u64, 0..3u64).prop_map(|(ms, jitter)| Step::Tick { ms, jitter }),
    ]
}

/// Runs `steps`, then drains (ticks until nothing is held); returns the
/// process and the largest gap between two ticks of one worker.
fn run(json: &str, steps: &[Step]) -> (Process, u64) {
    let mut p = Process::new(json, 2).unwrap();
    let mut now = T0;
    let mut id = 0u32;
    let mut last_tick = [T0; 2];
    let mut gap = 0;
    let mut tick = |p: &mut Process, w: usize, at: u64, gap: &mut u64| {
        *gap = (*gap).max(at - last_tick[w]);
        last_tick[w] = at;
        p.tick(w, at);
    };
    for s in steps {
        match *s {
            Step::Arrive { worker, class, n } => {
                for _ in 0..n {
                    id += 1;
                    p.request(worker, id, req(class), now);
                }
            }
            Step::Cancel { k } => {
                if id > 0 {
                    p.done(k as u32 % id + 1);
                }
            }
            Step::Tick { ms, jitter } => {
                now += ms * MS;
                tick(&mut p, 0, now, &mut gap);
                tick(&mut p, 1, now + jitter * MS, &mut gap);
                now += jitter * MS;
            }
        }
    }
    for _ in 0..20_000 {
        if !p.needs_ticks() {
            break;
        }
        now += MS;
        tick(&mut p, 0, now, &mut gap);
        tick(&mut p, 1, now, &mut gap);
    }
    (p, gap)
}

/// Release times, sorted.
fn release_times(p: &Process) -> Vec<u64> {
    let mut t: Vec<u64> = p.releases().into_iter().map(|(t, _)| t).collect();
    t.sort_unstable();
    t
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn nothing_twice_nothing_lost_rate_and_delays_hold(
        rate in prop::sample::select(vec![50u64, 200, 1000]),
        burst in 0..3u64,
        shares in prop::sample::select(vec![
            vec![0u32, 100_000], vec![0, 0], vec![0, 250_000, 100_000], vec![0, 0, 500_000],
            vec![0],
        ]),
        delays in prop::collection::vec(prop::sample::select(vec![0u64, 20, 100, 400]), 3),
        steps in prop::collection::vec(step(3), 1..300),
    ) {
        let n = shares.len();
        let json = config(rate, burst, &shares, &delays[..n]);
        let steps: Vec<Step> = steps.into_iter().map(|s| match s {
            Step::Arrive { worker, class, n: k } => Step::Arrive { worker, class: class % n, n: k },
            other => other,
        }).collect();
        let (p, gap) = run(&json, &steps);
        // Released at most once, in one order.
        let mut once = HashSet::new();
        prop_assert!(p.order.iter().all(|id| once.insert(*id)), "a request went twice");
        // Nothing lost.
        for (id, s) in &p.seen {
            prop_assert!(s.fate != Fate::Held, "request {id} still held: {s:?}");
        }
        prop_assert_eq!(p.totals.get(&(0, Stat::Held)).copied().unwrap_or(0), 0);
        // Nobody waited past its class's delay (plus a tick).
        for (id, s) in &p.seen {
            let waited = match s.fate {
                Fate::Released(t) | Fate::Displaced(t) => t - s.arrived,
                _ => 0,
            };
            let class = s.class.unwrap();
            prop_assert!(waited <= delays[class] * MS + gap, "request {id} waited {waited} ns: {s:?}");
        }
        // The rate over every window.
        let interval = 1_000_000_000 / rate;
        let times = release_times(&p);
        let window = 200 * MS;
        let most = (window + 2 * gap) / interval + burst + 1;
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi] - times[lo] > window {
                lo += 1;
            }
            prop_assert!((hi - lo + 1) as u64 <= most,
                "{} releases within {window} ns (at most {most})", hi - lo + 1);
        }
        if n == 1 {
            let displaced = p.seen.values().filter(|s| matches!(s.fate, Fate::Displaced(_))).count();
            prop_assert_eq!(displaced, 0, "a single class's turn is known exactly");
        }
    }

}

proptest! {
    // Few inputs (18 combinations), each a full second of saturation.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(8),
        ..ProptestConfig::default()
    })]

    #[test]
    fn saturated_the_total_is_the_rate_and_every_floor_holds(
        rate in prop::sample::select(vec![100u64, 500]),
        shares in prop::sample::select(vec![
            vec![0u32, 100_000], vec![0, 250_000, 100_000], vec![200_000, 0, 300_000],
        ]),
        jitter in 0..3u64,
    ) {
        let n = shares.len();
        let json = config(rate, 0, &shares, &vec![2000; n]);
        // Every class offered at twice the rate, split over both workers,
        // for one second; ticks every 1 + jitter ms.
        let per_ms = (2 * rate).div_ceil(1000);
        let mut steps = Vec::new();
        for ms in 0..1000u64 {
            for class in 0..n {
                steps.push(Step::Arrive { worker: (ms as usize + class) % 2, class, n: per_ms as u8 });
            }
            if ms % (1 + jitter) == 0 {
                steps.push(Step::Tick { ms: 1 + jitter, jitter: 0 });
            }
        }
        let mut p = Process::new(&json, 2).unwrap();
        let (mut now, mut id) = (T0, 0u32);
        let mut per_class = vec![0u64; n];
        for s in &steps {
            match *s {
                Step::Arrive { worker, class, n } => for _ in 0..n {
                    id += 1;
                    p.request(worker, id, req(class), now);
                },
                Step::Tick { ms, .. } => {
                    now += ms * MS;
                    p.tick(0, now);
                    p.tick(1, now);
                }
                Step::Cancel { .. } => {}
            }
        }
        let end = now;
        let mut total = 0;
        for s in p.seen.values() {
            if let Fate::Now | Fate::Released(_) = s.fate {
                total += 1;
                per_class[s.class.unwrap()] += 1;
            }
        }
        // Every slot due in [T0, end] used (the last granted one may still
        // await its holder's tick).
        let slots = (end - T0) / (1_000_000_000 / rate) + 1;
        prop_assert!(total <= slots && total + 2 >= slots, "{total} releases, {slots} slots");
        for (c, &ppm) in shares.iter().enumerate() {
            let floor = (u128::from(ppm) * u128::from(total) / 1_000_000) as u64;
            prop_assert!(per_class[c] + discrepancy(total) >= floor,
                "class {c} got {} of {total}, its floor is {floor}", per_class[c]);
        }
    }
}
