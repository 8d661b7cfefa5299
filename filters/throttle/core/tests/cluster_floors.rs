//! Class floors in cluster scope (issue 29): known defects, kept as tests
//! that fail while the defect lasts (`#[ignore]`d, so `make check` passes;
//! run them with `cargo test -p throttle-core --test cluster_floors --
//! --ignored`). When one passes, take its `#[ignore]` off.
//!
//! Each proxy chooses which class a slot goes to among its own waiters
//! (`classes::choose` in `classes::tickets::grant_due`), from the slots it
//! owns, and it owns them in proportion to its demand. So a proxy whose
//! waiters are all of the top class gives no floor slot at all, and a class
//! with a floor waiting on proxies that also hold critical gets only its
//! `min_share` of those proxies' slots: across the fleet it gets its floor of
//! the slots of the proxies where it waits, not of the rule's rate. The
//! fleet sweep's seed 35 fails invariant 6 this way (batch 109-127 a second
//! for a floor of 135, and an exact 30% of the mixed proxies' releases would
//! give 113-130).

use throttle_core::clock::NS_PER_S;
use throttle_core::sim::fleet;
use throttle_core::sim::process::End;
use throttle_core::sim::scenario::{Load, ProxySpec, RuleSpec, Scenario, Shape};

fn uniform(proxy: usize, per_s: f64, class: usize) -> Load {
    Load {
        rule: 0,
        proxy,
        shape: Shape::Uniform {
            per_s,
            phase_ms: proxy as u64 * 7,
        },
        from_ms: 0,
        to_ms: 12_000,
        class: Some(class),
        keys: None,
        client_timeout_ms: None,
    }
}

/// Batch's releases in each whole second from 2 s to the end.
fn batch_per_second(sc: &Scenario) -> Result<Vec<u64>, String> {
    let t = fleet::run(sc)?;
    let start = sc.start_ns();
    let seconds = sc.duration_ms / 1000;
    let mut per_s = vec![0u64; seconds as usize];
    for r in t.records.iter().filter(|r| r.class == Some(1)) {
        if let End::Released { at, .. } = r.end {
            if let Some(n) = per_s.get_mut(((at - start) / NS_PER_S) as usize) {
                *n += 1;
            }
        }
    }
    Ok(per_s.split_off(2))
}

/// A 100/s rule with critical and batch (`min_share` 0.2) on two proxies:
/// p0 critical 150/s, p1 critical 50/s + batch 50/s. p1 owns about 40% of
/// the slots (its share of the demand) and gives batch 20% of them, 8 a
/// second; p0 gives batch none. Batch's floor is 20 a second (19 with
/// invariant 6's one request less).
#[test]
#[ignore = "known defect (issue 29): floors are chosen per proxy, from the slots it owns"]
fn a_floor_holds_when_the_top_class_also_waits_on_other_proxies() -> Result<(), String> {
    let mut sc = Scenario::new(1, "class-floors-mixed");
    let mut r = RuleSpec::cluster("orders", 100.0, 2);
    r.classes = vec![("critical".into(), 0.0, 1000), ("batch".into(), 0.2, 3000)];
    sc.rules.push(r);
    sc.proxies = vec![ProxySpec::new(2); 2];
    sc.loads.push(uniform(0, 150.0, 0));
    sc.loads.push(uniform(1, 50.0, 0));
    sc.loads.push(uniform(1, 50.0, 1));
    sc.duration_ms = 12_000;
    let batch = batch_per_second(&sc)?;
    assert!(
        batch.iter().all(|&n| n >= 19),
        "batch per second from 2 s: {batch:?}, floor 20"
    );
    Ok(())
}

/// A 100/s rule with critical and batch on two proxies: p0 critical 150/s
/// throughout, p1 a burst of `n` batch requests at 3 s and nothing after.
/// Returns batch's requests released and refused (at arrival or later).
fn a_burst_of_batch_alone(n: u32) -> Result<(u64, u64), String> {
    let mut sc = Scenario::new(1, "class-burst-then-silence");
    let mut r = RuleSpec::cluster("orders", 100.0, 2);
    r.classes = vec![("critical".into(), 0.0, 1000), ("batch".into(), 0.2, 3000)];
    sc.rules.push(r);
    sc.proxies = vec![ProxySpec::new(2); 2];
    sc.loads.push(uniform(0, 150.0, 0));
    let mut burst = uniform(1, 0.0, 1);
    burst.shape = Shape::Burst {
        n,
        at_ms: 3000,
        spread_ms: 0,
    };
    sc.loads.push(burst);
    sc.duration_ms = 12_000;
    let t = fleet::run(&sc)?;
    let (mut released, mut refused) = (0, 0);
    for r in t.records.iter().filter(|r| r.class == Some(1)) {
        match r.end {
            End::Released { .. } => released += 1,
            End::Refused { .. } => refused += 1,
            _ => {}
        }
    }
    Ok((released, refused))
}

/// Requests held in a class line count as demand once their proxy's
/// arrivals stop: the proxy keeps claiming slots for them. Until issue 29 a
/// cluster rule with classes never told its engine caller how many waited
/// (the count in the rule's cursor was kept for rules without classes only),
/// so a proxy whose arrivals stopped claimed nothing, and its held requests
/// waited for no slot until they were displaced: on real Envoy, p1 of the
/// class-floors test held 16 batch requests from its Fortio warm-up with no
/// slot granted for 2.6 s, and 15 were displaced.
#[test]
fn held_class_requests_keep_their_proxy_claiming() -> Result<(), String> {
    let (released, refused) = a_burst_of_batch_alone(12)?;
    assert_eq!(
        (released, refused),
        (12, 0),
        "batch: released, refused of a burst of 12"
    );
    Ok(())
}
