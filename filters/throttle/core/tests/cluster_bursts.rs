//! A burst after idle in cluster scope, its requests spread over a few
//! milliseconds as a client's are (Fortio opens its 50 connections over
//! 5-40 ms here), moved over the phases of the engine calls: none of it is
//! refused. CI (2026-12-01, tests/cluster/test_holds.py) saw 24 of 50
//! refused at arrival on one proxy: an answer that landed among the burst's
//! requests counted the burst's own demand against the spare of its lead.

use throttle_core::clock::NS_PER_S;
use throttle_core::sim::process::End;
use throttle_core::sim::scenario::{Load, ProxySpec, RuleSpec, Scenario, Shape};
use throttle_core::sim::{fleet, sweep};

#[test]
fn a_spread_burst_after_idle_is_held_whatever_the_phase_of_the_calls() -> Result<(), String> {
    let mut refused_runs = Vec::new();
    for by in 0..100 {
        let sc = sweep::with_offset("burst-after-idle-spread", by).ok_or("no such scenario")?;
        let t = fleet::run(&sc)?;
        // The bursts start at 6 s (the warm-up ends at 3 s).
        let from = sc.start_ns() + 5 * NS_PER_S;
        let refused = t
            .records
            .iter()
            .filter(|r| r.arrived >= from && matches!(r.end, End::Refused { .. }))
            .count();
        if refused > 0 {
            refused_runs.push((by, refused));
        }
    }
    assert!(
        refused_runs.is_empty(),
        "(offset ms, refused of 150) where the burst was refused: {refused_runs:?}"
    );
    Ok(())
}

/// A fleet idle since its start (its proxies make no engine call without
/// demand), then 20/s on each of 3 proxies of a 100/s rule: none refused.
/// Real Envoy (tests/cluster/test_holds.py's warm-up) refused 2-4 of the
/// first 60 on each (0-3 since: those before the first answer, which the
/// simulation does not show), the simulation 10 of 180: a proxy reckoned
/// its first second of answers with no spare, as at a fleet's start.
#[test]
fn first_traffic_on_an_idle_fleet_is_not_refused() -> Result<(), String> {
    for start_ms in [1_000, 2_500] {
        let mut sc = Scenario::new(1, "first-traffic");
        let mut r = RuleSpec::cluster("first", 100.0, 3);
        r.max_queue_delay_ms = 2000;
        sc.rules.push(r);
        sc.proxies = vec![ProxySpec::new(2); 3];
        for p in 0..3 {
            sc.loads.push(Load {
                rule: 0,
                proxy: p,
                shape: Shape::Uniform {
                    per_s: 20.0,
                    phase_ms: p as u64 * 7,
                },
                from_ms: start_ms,
                to_ms: start_ms + 3_000,
                class: None,
                keys: None,
                client_timeout_ms: None,
            });
        }
        sc.duration_ms = start_ms + 4_000;
        let t = fleet::run(&sc)?;
        let refused: Vec<f64> = t
            .records
            .iter()
            .filter(|r| matches!(r.end, End::Refused { .. }))
            .map(|r| r.arrived.saturating_sub(sc.start_ns()) as f64 / 1e9)
            .collect();
        assert!(
            refused.is_empty(),
            "traffic from {start_ms} ms: refused at (s) {refused:?}"
        );
    }
    Ok(())
}
