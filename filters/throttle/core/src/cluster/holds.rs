//! Cluster scope under what a mesh meets every week (the red team of
//! 2026-11-25): an engine blip, rates of a few per second, a skewed clock,
//! idle traffic, a burst. Each scenario runs the shipped `Stream`, `Worker`
//! and `Calls` of every proxy in the simulated world, against the in-memory
//! engine, in virtual time.

use super::sim::{first_overlap, max_in_window, Net, SimProxy, SimRule, World};
use crate::clock::{NS_PER_MS, NS_PER_S};
use crate::config::{Config, EngineConfig, OnEngineFailure};

const MS: u64 = NS_PER_MS;
/// 2026-11-23 20:00:00 UTC + 10 min: well inside an hour.
const T0: u64 = 1_795_467_600 * NS_PER_S + 600 * NS_PER_S;

fn engine() -> EngineConfig {
    EngineConfig {
        cluster: "throttle_engine".into(),
        timeout_ns: 50 * MS,
        fallback_after_ns: 250 * MS,
        domain: "envoy_throttle".into(),
        max_clock_skew_ns: 100 * MS,
    }
}

fn config(rate_per_s: u64, burst: u64, mqd_ms: u64, replicas: u32) -> Config {
    let rule = SimRule {
        name: "orders".into(),
        rate_per_s,
        burst,
        max_queue_delay_ms: mqd_ms,
        expected_replicas: replicas,
        on_engine_failure: OnEngineFailure::LocalShare,
    };
    super::sim::config(&engine(), &[rule]).unwrap()
}

/// `n` proxies of `config`, proxy `i` skewed by `skews[i]` ns, call phases
/// spread as different processes pick them.
fn world(config: &Config, skews: &[i64]) -> World {
    let proxies = skews
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            SimProxy::new(config, s)
                .unwrap()
                .with_phase((i as u64 * 377 + 123) % 1000)
        })
        .collect();
    World::new(proxies, 50 * MS)
}

/// Arrivals of rule 0 at `per_s` (fractional rates allowed), evenly spaced,
/// offset by `offset_ns`, in (from, to].
fn even(per_s: f64, offset_ns: u64) -> impl Fn(u64, u64) -> Vec<(usize, u64)> {
    move |from, to| {
        if per_s <= 0.0 {
            return Vec::new();
        }
        let gap = (NS_PER_S as f64 / per_s) as u64;
        let first = from.saturating_sub(offset_ns) / gap + 1;
        (first..)
            .map(|i| i * gap + offset_ns)
            .take_while(|&t| t <= to)
            .filter(|&t| t > from)
            .map(|t| (0, t))
            .collect()
    }
}

fn released(w: &World, p: usize, from: u64, to: u64) -> usize {
    w.proxies[p]
        .releases
        .iter()
        .filter(|r| r.at >= from && r.at < to)
        .count()
}

fn all_releases(w: &World, from: u64, to: u64) -> Vec<u64> {
    let mut t: Vec<u64> = w
        .proxies
        .iter()
        .flat_map(|p| p.releases.iter().map(|r| r.at))
        .filter(|&t| t >= from && t < to)
        .collect();
    t.sort_unstable();
    t
}

fn no_slot_granted_twice(w: &World) {
    let all: Vec<(u64, u64)> = w
        .proxies
        .iter()
        .flat_map(|p| p.granted.iter().map(|g| g.1))
        .collect();
    assert_eq!(first_overlap(&all), None, "a slot granted twice");
}

/// Finding 2: at 1, 2, 5 and 10/s, three proxies offered twice the rate
/// split 50/30/20: the total is at least 95% of the rate and each proxy's
/// share of what went out is within 10 points of its share of demand.
#[test]
fn low_rates_are_shared_in_proportion_to_demand() {
    for rate in [1u64, 2, 5, 10] {
        let cfg = config(rate, 0, 2000, 3);
        let mut w = world(&cfg, &[0, 0, 0]);
        let split = [0.5, 0.3, 0.2];
        let (start, end) = (T0, T0 + 24 * NS_PER_S);
        w.run(
            start,
            end,
            |p, from, to| even(2.0 * rate as f64 * split[p], 7 * MS * p as u64)(from, to),
            |_, _| Net::Latency(MS),
        );
        no_slot_granted_twice(&w);
        let (from, to) = (start + 4 * NS_PER_S, end);
        let secs = ((to - from) / NS_PER_S) as f64;
        let each: Vec<usize> = (0..3).map(|p| released(&w, p, from, to)).collect();
        let total: usize = each.iter().sum();
        let per_s = total as f64 / secs;
        for (p, x) in w.proxies.iter().enumerate() {
            let granted: u64 = x.granted.iter().map(|g| g.1 .1 - g.1 .0).sum();
            eprintln!(
                "{rate}/s p{p}: released {} granted {granted} ahead {} rejected {} timed out {}",
                x.releases.len(),
                x.total(0, crate::stats::Stat::SlotsAhead),
                x.rejected,
                x.timed_out
            );
        }
        assert!(
            per_s >= 0.95 * rate as f64,
            "{rate}/s: total {per_s:.2}/s, per proxy {each:?}"
        );
        for (p, &n) in each.iter().enumerate() {
            let share = n as f64 / total.max(1) as f64;
            assert!(
                (share - split[p]).abs() <= 0.10,
                "{rate}/s: proxy {p} got {:.0}% of the releases for {:.0}% of the demand ({each:?})",
                share * 100.0,
                split[p] * 100.0
            );
        }
    }
}

/// Finding 6: after idle, a burst that the fleet's rate can serve within
/// max_queue_delay is held, not rejected on a stale share: 3 proxies, 100/s,
/// max_queue_delay 2 s, each warmed at 20/s for 3 s, idle 3 s, then 50 at once
/// on each (150 in all: 1.5 s at the fleet's rate).
#[test]
fn a_burst_after_idle_waits_for_its_turn_at_the_fleets_rate() {
    for burst in [0u64, 50] {
        let cfg = config(100, burst, 2000, 3);
        let mut w = world(&cfg, &[0, 0, 0]);
        let warm_end = T0 + 3 * NS_PER_S;
        let at = warm_end + 3 * NS_PER_S;
        w.run(
            T0,
            warm_end,
            |p, from, to| even(20.0, 3 * MS * p as u64)(from, to),
            |_, _| Net::Latency(MS),
        );
        let before: Vec<u64> = w.proxies.iter().map(|p| p.rejected + p.timed_out).collect();
        w.run(
            warm_end,
            at + 4 * NS_PER_S,
            |p, from, to| {
                let t = at + MS * p as u64;
                if from < t && t <= to {
                    vec![(0, t); 50]
                } else {
                    Vec::new()
                }
            },
            |_, _| Net::Latency(MS),
        );
        let rejected: Vec<u64> = w
            .proxies
            .iter()
            .zip(&before)
            .map(|(p, b)| p.rejected + p.timed_out - b)
            .collect();
        assert_eq!(rejected, vec![0, 0, 0], "burst {burst}: rejected per proxy");
        let out = all_releases(&w, at, at + 4 * NS_PER_S);
        assert_eq!(out.len(), 150, "burst {burst}: all served");
    }
}

/// Finding 5: a proxy that sees one request every 0.5, 2 or 5 s lets it go
/// at once: it does not wait for the engine (the rule is far below its rate).
#[test]
fn sporadic_requests_do_not_wait_for_the_engine() {
    for gap_ms in [500u64, 2000, 5000] {
        let cfg = config(300, 0, 1000, 3);
        let mut w = world(&cfg, &[0, 0, 0]);
        let (start, end) = (T0, T0 + 30 * NS_PER_S);
        let per_s = 1000.0 / gap_ms as f64;
        w.run(
            start,
            end,
            |p, from, to| even(per_s, 111 * MS * p as u64)(from, to),
            |_, _| Net::Latency(MS),
        );
        for (p, proxy) in w.proxies.iter().enumerate() {
            let waits: Vec<u64> = proxy.releases.iter().map(|r| r.at - r.arrived).collect();
            let slow = waits.iter().filter(|&&d| d > 5 * MS).count();
            assert_eq!(
                slow,
                0,
                "gap {gap_ms} ms: proxy {p}: {slow} of {} waited over 5 ms ({:?} ms)",
                waits.len(),
                waits.iter().map(|d| d / MS).collect::<Vec<_>>()
            );
        }
    }
}

/// Finding 1: Redis restarted empty (counters lost, calls refused for 60 ms)
/// at 300/s with three proxies offered 150/s each: the busiest second at the
/// upstream stays within the stated bound, whatever max_queue_delay is.
#[test]
fn an_engine_blip_over_admits_at_most_the_stated_bound() {
    for (mqd_ms, down_ms) in [(1000u64, 60u64), (1000, 400), (2000, 400), (10_000, 400)] {
        let cfg = config(300, 0, mqd_ms, 3);
        let mut w = world(&cfg, &[0, 0, 0]);
        let blip = T0 + 6 * NS_PER_S;
        let load = |p: usize, from: u64, to: u64| even(150.0, 2 * MS * p as u64)(from, to);
        w.run(T0, blip, load, |_, _| Net::Latency(MS));
        w.engine.lose_counters();
        w.run(blip, blip + down_ms * MS, load, |_, _| Net::Refused(MS));
        let end = blip + 6 * NS_PER_S;
        w.run(blip + down_ms * MS, end, load, |_, _| Net::Latency(MS));
        let r = all_releases(&w, T0 + 2 * NS_PER_S, end);
        let worst = max_in_window(&r, NS_PER_S);
        // Stated bound: rate x (fallback_after + one epoch) + burst + 2 over
        // the grid's R*W + 2 (300 * 0.35 = 105).
        assert!(
            worst <= 302 + 105,
            "max_queue_delay {mqd_ms} ms, down {down_ms} ms: worst 1 s window {worst}"
        );
        let around = all_releases(&w, blip - NS_PER_S, blip + 3 * NS_PER_S).len();
        assert!(
            around <= 1200 + 105,
            "max_queue_delay {mqd_ms} ms, down {down_ms} ms: {around} in the 4 s around the blip"
        );
    }
}

/// Finding 3: one proxy's clock off by -1.5 s .. +1.5 s: no proxy is starved
/// (each gets at least half its share of demand) and the total stays within
/// 5% of the rate.
#[test]
fn one_skewed_clock_starves_nobody() {
    for skew_ms in std::env::var("SKEWS")
        .map(|v| {
            v.split(',')
                .map(|x| x.parse().unwrap())
                .collect::<Vec<i64>>()
        })
        .unwrap_or(vec![
            -1500i64, -1000, -700, -300, -150, -80, 80, 150, 300, 700, 1000, 1500,
        ])
    {
        let cfg = config(300, 0, 1000, 3);
        let mut w = world(&cfg, &[skew_ms * MS as i64, 0, 0]);
        let (start, end) = (T0, T0 + 14 * NS_PER_S);
        w.run(
            start,
            end,
            |p, from, to| even(150.0, 3 * MS * p as u64)(from, to),
            |_, _| Net::Latency(MS),
        );
        no_slot_granted_twice(&w);
        let (from, to) = (start + 4 * NS_PER_S, end);
        let secs = ((to - from) / NS_PER_S) as f64;
        let each: Vec<f64> = (0..3)
            .map(|p| released(&w, p, from, to) as f64 / secs)
            .collect();
        let total: f64 = each.iter().sum();
        assert!(
            (total - 300.0).abs() <= 15.0,
            "skew {skew_ms} ms: total {total:.1}/s ({each:?})"
        );
        for (p, &x) in each.iter().enumerate() {
            assert!(
                x >= 50.0,
                "skew {skew_ms} ms: proxy {p} starved at {x:.1}/s ({each:?})"
            );
        }
    }
}

/// Finding 3, the other half: a proxy whose clock steps away from the
/// others' (while the fleet runs) by more than its grid absorbs finds it
/// within 2 s, moves its grid to theirs (counted), and the others do not move.
#[test]
fn a_clock_that_steps_away_is_found_within_two_seconds_and_only_that_proxy_moves() {
    let skews = std::env::var("SKEWS2")
        .map(|v| {
            v.split(',')
                .map(|x| x.parse().unwrap())
                .collect::<Vec<i64>>()
        })
        .unwrap_or(vec![-1500, -600, 300, 900, 1500]);
    for skew_ms in skews {
        let cfg = config(300, 0, 1000, 3);
        let mut w = world(&cfg, &[0, 0, 0]);
        let load = |p: usize, from: u64, to: u64| even(150.0, 3 * MS * p as u64)(from, to);
        let jump = T0 + 3 * NS_PER_S;
        w.run(T0, jump, load, |_, _| Net::Latency(MS));
        w.proxies[0].skew_ns = skew_ms * MS as i64;
        let mut found_at = None;
        let mut t = jump;
        while t < jump + 6 * NS_PER_S {
            w.run(t, t + 50 * MS, load, |_, _| Net::Latency(MS));
            t += 50 * MS;
            let moved = w.proxies[0].caller().clock_offset_epochs(0).unwrap_or(0);
            if found_at.is_none() && moved != 0 {
                found_at = Some(t - jump);
            }
        }
        let found_at = found_at.unwrap_or_else(|| panic!("skew {skew_ms} ms: not found in 6 s"));
        if std::env::var("SKEW_DEBUG").is_ok() {
            let per: Vec<usize> = (0..24)
                .map(|i| {
                    all_releases(
                        &w,
                        jump - 2 * NS_PER_S + i * 500 * MS,
                        jump - 2 * NS_PER_S + (i + 1) * 500 * MS,
                    )
                    .len()
                })
                .collect();
            eprintln!(
                "skew {skew_ms}: found at {} ms; per 500 ms from -2 s: {per:?}",
                found_at / MS
            );
        }
        assert!(
            found_at <= 2 * NS_PER_S,
            "skew {skew_ms} ms: found {} ms after the step",
            found_at / MS
        );
        // Its grid follows the others' within an epoch.
        let moved_ms = w.proxies[0].caller().clock_offset_epochs(0).unwrap() * 100;
        assert!(
            (moved_ms - skew_ms).abs() <= 150,
            "skew {skew_ms} ms: moved {moved_ms} ms"
        );
        assert!(
            w.proxies[0].total(0, crate::stats::Stat::FailuresClock) > 0,
            "counted"
        );
        for p in 1..3 {
            assert_eq!(
                w.proxies[p].caller().clock_offset_epochs(0),
                Some(0),
                "proxy {p} moved"
            );
        }
        // Until it is found, a proxy whose clock stepped ahead by s claims
        // epochs up to s ahead on demand totals read too early (alone in
        // them): the fleet's releases dip while those epochs pass. From 3 s
        // after the step on, the rate and the shares hold.
        let (from, to) = (jump + 3 * NS_PER_S, jump + 6 * NS_PER_S);
        let each: Vec<usize> = (0..3).map(|p| released(&w, p, from, to)).collect();
        let total = each.iter().sum::<usize>() as f64 / 3.0;
        assert!(
            (total - 300.0).abs() <= 15.0,
            "skew {skew_ms} ms: total {total}/s ({each:?})"
        );
        assert!(
            each.iter().all(|&n| n as f64 / 3.0 >= 50.0),
            "skew {skew_ms} ms: {each:?}"
        );
    }
}

/// Finding 7: the same rule name at two rates (a rollout of a new rate) is
/// two grids whose rates add up; each proxy sees that more proxies carry the
/// name than its grid, counts it and says so. One rate: nothing.
#[test]
fn the_same_name_at_two_rates_is_seen_and_counted_and_one_rate_is_not() {
    let (old, new) = (config(300, 0, 1000, 3), config(100, 0, 1000, 3));
    for (configs, mismatch) in [([&old, &old, &old], false), ([&old, &new, &new], true)] {
        let proxies = configs
            .iter()
            .enumerate()
            .map(|(i, c)| SimProxy::new(c, 0).unwrap().with_phase(i as u64 * 300))
            .collect();
        let mut w = World::new(proxies, 50 * MS);
        w.run(
            T0,
            T0 + 6 * NS_PER_S,
            |p, from, to| even(150.0, 3 * MS * p as u64)(from, to),
            |_, _| Net::Latency(MS),
        );
        let seen: Vec<u64> = w
            .proxies
            .iter()
            .map(|p| p.total(0, crate::stats::Stat::GridMismatch))
            .collect();
        if mismatch {
            // Every second from the third on, on both grids.
            assert!(seen.iter().all(|&n| n >= 3), "{seen:?}");
        } else {
            assert_eq!(seen, vec![0, 0, 0]);
        }
    }
}
