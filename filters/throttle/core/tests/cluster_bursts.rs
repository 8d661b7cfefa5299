//! A burst after idle in cluster scope, its requests spread over a few
//! milliseconds as a client's are (Fortio opens its 50 connections over
//! 5-40 ms here), moved over the phases of the engine calls: none of it is
//! refused. CI (2026-12-01, tests/cluster/test_holds.py) saw 24 of 50
//! refused at arrival on one proxy: an answer that landed among the burst's
//! requests counted the burst's own demand against the spare of its lead.

use throttle_core::clock::NS_PER_S;
use throttle_core::sim::process::End;
use throttle_core::sim::{fleet, sweep};

#[test]
fn a_spread_burst_after_idle_is_held_whatever_the_phase_of_the_calls() {
    let mut refused_runs = Vec::new();
    for by in 0..100 {
        let sc = sweep::with_offset("burst-after-idle-spread", by).expect("a named scenario");
        let t = fleet::run(&sc).expect("a valid configuration");
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
}
