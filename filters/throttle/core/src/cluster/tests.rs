//! The caller against the in-memory engine (exact nanoseconds), and whole
//! simulated worlds of proxies.

use super::sim::{first_overlap, max_in_window, Fate, Net, SimProxy, SimRule, World};
use super::*;
use crate::clock::{NS_PER_MS, NS_PER_S};
use crate::config::{Config, EngineConfig, OnEngineFailure};
use crate::stats::Stat;

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

/// One cluster rule at `rate_per_s` (burst 0, max_queue_delay 2 s).
fn config(rate_per_s: u64, failure: OnEngineFailure, replicas: u32) -> Config {
    let rule = SimRule {
        name: "orders".into(),
        rate_per_s,
        burst: 0,
        max_queue_delay_ms: 2000,
        expected_replicas: replicas,
        on_engine_failure: failure,
    };
    super::sim::config(&engine(), &[rule]).unwrap()
}

/// Evenly spaced arrivals of rule 0 at `per_s`, in (from, to].
fn steady(per_s: u64) -> impl Fn(u64, u64) -> Vec<(usize, u64)> {
    move |from, to| {
        if per_s == 0 {
            return Vec::new();
        }
        let gap = NS_PER_S / per_s;
        let first = from / gap + 1;
        (first..)
            .map(|i| i * gap)
            .take_while(|&t| t <= to)
            .map(|t| (0, t))
            .collect()
    }
}

fn releases(world: &World, from: u64, to: u64) -> Vec<u64> {
    let mut t: Vec<u64> = world
        .proxies
        .iter()
        .flat_map(|p| p.releases.iter().map(|r| r.at))
        .filter(|&t| t >= from && t < to)
        .collect();
    t.sort_unstable();
    t
}

fn all_granted(world: &World) -> Vec<(u64, u64)> {
    world
        .proxies
        .iter()
        .flat_map(|p| p.granted.iter().map(|g| g.1))
        .collect()
}

#[test]
fn three_proxies_60_30_10_at_three_times_the_rate_share_it_exactly() {
    let config = config(300, OnEngineFailure::LocalShare, 3);
    let proxies = (0..3).map(|_| SimProxy::new(&config, 0).unwrap()).collect();
    let mut w = World::new(proxies, 50 * MS);
    let loads = [540, 270, 90]; // 60/30/10 of 900/s = 3 x 300/s
    let (start, end) = (T0, T0 + 12 * NS_PER_S);
    w.run(
        start,
        end,
        |p, from, to| steady(loads[p])(from, to),
        |_, _| Net::Latency(MS),
    );
    assert_eq!(
        first_overlap(&all_granted(&w)),
        None,
        "a slot granted twice"
    );
    // After 2 s of warm-up, 10 s: exactly 300/s within one epoch's slots at the ends.
    let r = releases(&w, start + 2 * NS_PER_S, start + 12 * NS_PER_S);
    let total = r.len() as f64 / 10.0;
    assert!((total - 300.0).abs() <= 3.0, "total {total}/s");
    // Every 100 ms window: at most R*W + burst + 2 = 32.
    assert!(
        max_in_window(&r, 100 * MS) <= 32,
        "worst 100 ms: {}",
        max_in_window(&r, 100 * MS)
    );
    let shares: Vec<usize> = w
        .proxies
        .iter()
        .map(|p| {
            p.releases
                .iter()
                .filter(|x| x.at >= start + 2 * NS_PER_S)
                .count()
        })
        .collect();
    for p in &w.proxies {
        let granted: u64 = p.granted.iter().map(|g| g.1 .1 - g.1 .0).sum();
        eprintln!("releases {} granted {granted} rejected {} timed out {} calls {} failures {} stats {:?}", p.releases.len(), p.rejected, p.timed_out, p.calls, p.failures, p.caller().stats(0));
    }
    eprintln!("shares {shares:?}");
    // Calls: at most 10 per second per proxy.
    assert!(w.proxies.iter().all(|p| p.calls <= 12 * 10 + 1));
}

// ---- the caller alone, against the in-memory engine, exact times ----------

use super::sim::FakeEngine;

/// 500/s: T = 2 ms, L = 50, E = 100 ms. T0 is the start of epoch E0.
const E0: u64 = T0 / (100 * MS);

fn spec500(name: &str, failure: OnEngineFailure) -> RuleSpec {
    RuleSpec {
        name: name.into(),
        grid: Grid::new(2 * MS),
        expected_replicas: 4,
        on_engine_failure: failure,
    }
}

/// A caller of one rule "orders" at 500/s (`spec500`, `local_share`).
fn orders() -> Caller {
    Caller::new(
        &engine(),
        vec![spec500("orders", OnEngineFailure::LocalShare)],
    )
}

/// The facts of one rule with `n` requests waiting and nothing else.
fn waiting(n: u64) -> [RuleFacts; 1] {
    [RuleFacts {
        arrived_total: 0,
        waiting: n,
        owed: 0,
        owned_soon: 0,
    }]
}

/// One tick and, if a call is due, its exchange with the engine (answered at once).
fn exchange(
    eng: &mut FakeEngine,
    c: &mut Caller,
    now: u64,
    facts: &[RuleFacts],
) -> (bool, Vec<RuleUpdate>) {
    let (call, mut updates) = c.tick(now, facts);
    let Some(call) = call else {
        return (false, updates);
    };
    assert_eq!(call.timeout_ns, 50 * MS);
    let (status, body) = eng.handle(&call.request.body, now);
    updates.extend(c.on_answer(now + MS, Ok((status, &body))));
    (true, updates)
}

fn ranges(updates: &[RuleUpdate]) -> Vec<(u64, u64)> {
    updates.iter().flat_map(|u| u.ranges.clone()).collect()
}

#[test]
fn the_first_call_claims_leftovers_for_the_next_epoch_and_registers_demand() {
    let mut c = orders();
    let waiting = [RuleFacts {
        arrived_total: 2,
        waiting: 2,
        owed: 0,
        owned_soon: 0,
    }];
    let (call, updates) = c.tick(T0, &waiting);
    assert!(updates.is_empty());
    let request = call.unwrap().request;
    assert_eq!(request.header(":path"), Some("/json"));
    let body = String::from_utf8(request.body).unwrap();
    let v = |f: u64| format!("orders:2000000:{f}");
    let d = |key: &str, f: u64, hits: u64| {
        format!(
            r#"{{"entries":[{{"key":"{key}","value":"{}"}}],"hitsAddend":"{hits}"}}"#,
            v(f)
        )
    };
    // Look at the demand total of e+1 (complete: lag = ceil((25 + 50 + 100)
    // ms / 100 ms) = 2 epochs before e+3, where adds go: k = 3), add one to
    // the hour's call count, probe the members one, two and three epochs
    // ahead of e+3 and behind it, look at e+1's proxies, take 3 leftovers of
    // e+1 (1 request per epoch, its demand while requests wait, plus 2
    // waiting), add itself and its demand to e+3: 1 arrival per epoch, in
    // 1/64, and the 2 waiting spread over the k + lag + 1 = 6 epochs before
    // that demand's shares come due (64 + 2 x 64 / 6 = 85: a proxy with a
    // line asks for a share of it). No share yet: it had no place in an
    // earlier demand total.
    let gen =
        r#"{"entries":[{"key":"throttle_members","value":"orders:2000000:gen"}],"hitsAddend":"1"}"#;
    // Once per second: itself in this second's count of the rule's name and
    // of its grid, and a look at both two seconds back.
    let sec = T0 / NS_PER_S;
    let m = |value: String, hits: u64| {
        format!(
            r#"{{"entries":[{{"key":"throttle_members","value":"{value}"}}],"hitsAddend":"{hits}"}}"#
        )
    };
    let seconds = [
        m(format!("orders:any:{sec}"), 1),
        m(format!("orders:2000000:sec:{sec}"), 1),
        m(format!("orders:any:{}", sec - 2), 0),
        m(format!("orders:2000000:sec:{}", sec - 2), 0),
    ]
    .join(",");
    assert_eq!(
        body,
        format!(
            r#"{{"descriptors":[{},{gen},{seconds},{},{},{},{},{},{},{},{},{},{}],"domain":"envoy_throttle"}}"#,
            d("throttle_demand", E0 + 1, 0),
            d("throttle_members", E0 + 4, 0),
            d("throttle_members", E0 + 2, 0),
            d("throttle_members", E0 + 5, 0),
            d("throttle_members", E0 + 1, 0),
            d("throttle_members", E0 + 6, 0),
            d("throttle_members", E0, 0),
            d("throttle_members", E0 + 1, 0),
            d("throttle_slots", E0 + 1, 3),
            d("throttle_members", E0 + 3, 1),
            d("throttle_demand", E0 + 3, 85),
        )
    );
    // Nothing more this epoch, and never two calls in flight.
    assert_eq!(c.tick(T0 + 10 * MS, &waiting).0, None);
}

/// The hits of the first `key` descriptor of epoch `f` in a call's body.
fn hits_of(body: &str, key: &str, f: u64) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["descriptors"].as_array()?.iter().find_map(|d| {
        let e = &d["entries"][0];
        let value = e["value"].as_str()?;
        (e["key"] == key && value.ends_with(&format!(":{f}")))
            .then(|| d["hitsAddend"].as_str()?.parse().ok())?
    })
}

#[test]
fn waiting_requests_claim_leftovers_only_beyond_this_epochs_owned_slots() {
    // 5 wait, and 3 owned slots of this epoch are still to come: they take
    // those first, so the leftover claim on e+1 is 1 arrival + 2 (until
    // issue 29: 1 + 5, claimed again every epoch while the last epoch's
    // leftovers served the line; first come, it took the slots other
    // proxies' requests within the rate needed: fleet sweep seed 10).
    let claim = |owned_soon| {
        let mut c = orders();
        let facts = [RuleFacts {
            arrived_total: 5,
            waiting: 5,
            owed: 0,
            owned_soon,
        }];
        let body = String::from_utf8(c.tick(T0, &facts).0.unwrap().request.body).unwrap();
        (
            hits_of(&body, "throttle_slots", E0 + 1),
            hits_of(&body, "throttle_demand", E0 + 3),
        )
    };
    assert_eq!(claim(0), (Some(6), Some(64 + 5 * 64 / 6)));
    assert_eq!(claim(3), (Some(3), Some(64 + 2 * 64 / 6)));
    assert_eq!(claim(9), (Some(1), Some(64)));
}

#[test]
fn answers_grant_exact_positions_and_a_second_proxy_gets_the_next_ones() {
    let mut eng = FakeEngine::default();
    let facts = waiting(3);
    let mut a = orders();
    let mut b = a.clone();
    let (_, ua) = exchange(&mut eng, &mut a, T0, &facts);
    let (_, ub) = exchange(&mut eng, &mut b, T0 + 2 * MS, &facts);
    let first = (E0 + 1) * 50; // slot 0 of epoch e+1
                               // Each needs 4: 3 waiting plus at least one arrival per epoch. a holds
                               // positions 0..4, b positions 4..8 of epoch e+1: at 500/s (L = 50, lanes
                               // of 7,7,6,6,6,6,6,6 slots, in time in the order of lanes 0,4,2,6,1,5,3,7)
                               // the first slot of lanes 0..4 and of lanes 4..8, spread over the epoch.
    let at = |offsets: &[u64]| -> Vec<(u64, u64)> {
        offsets
            .iter()
            .map(|&o| (first + o, first + o + 1))
            .collect()
    };
    assert_eq!(ranges(&ua), at(&[0, 13, 25, 38]));
    assert_eq!(ranges(&ub), at(&[7, 19, 32, 44]));
    assert_eq!(ua[0].mode, Mode::Grid);
    assert_eq!(
        a.stats(0).map(|s| (s.calls, s.granted, s.members)),
        Some((1, 4, 1))
    );
}

#[test]
fn a_counter_that_moves_in_steps_keeps_a_sparse_proxy_claiming() {
    // 2 requests every 500 ms, counted when the workers hand their counts
    // over: the counter moves once every 5 epochs. Measured over one epoch,
    // 4 epochs in 5 read 0 arrivals and the proxy claimed nothing for them
    // (every request then waited for grants); over up to 5 epochs it reads 1.
    let mut eng = FakeEngine::default();
    let mut c = orders();
    let mut calls = 0;
    for k in 0..30u64 {
        let facts = [RuleFacts {
            arrived_total: 2 * (k / 5),
            waiting: 0,
            owed: 0,
            owned_soon: 0,
        }];
        if exchange(&mut eng, &mut c, T0 + k * 101 * MS, &facts).0 && k >= 10 {
            calls += 1;
        }
    }
    assert_eq!(calls, 20, "a call every epoch");
    // None while nothing had arrived (the first 5 epochs).
    assert_eq!(c.stats(0).map(|s| s.calls), Some(25));
}

/// What a proxy that owes 2 slots and has no arrivals claims in its 12th
/// epoch, beside a busy proxy with `busy_per_epoch` arrivals an epoch (500/s:
/// 50 slots an epoch): its leftover claim on the next epoch and its demand
/// add (None: it places none).
fn owing_beside(busy_per_epoch: u64) -> (Option<u64>, Option<u64>) {
    let mut eng = FakeEngine::default();
    let (mut busy, mut owing) = (orders(), orders());
    let owes = [RuleFacts {
        arrived_total: 0,
        waiting: 0,
        owed: 2,
        owned_soon: 0,
    }];
    for k in 0..12u64 {
        let now = T0 + k * 100 * MS;
        let arrived = [RuleFacts {
            arrived_total: busy_per_epoch * k,
            ..Default::default()
        }];
        exchange(&mut eng, &mut busy, now, &arrived);
        if k < 11 {
            exchange(&mut eng, &mut owing, now + MS, &owes);
        }
    }
    let (call, _) = owing.tick(T0 + 1101 * MS, &owes);
    let body = String::from_utf8(call.unwrap().request.body).unwrap();
    (
        hits_of(&body, "throttle_slots", E0 + 12),
        hits_of(&body, "throttle_demand", E0 + 14),
    )
}

#[test]
fn slots_owed_alone_place_no_demand_while_the_fleet_asks_for_more_than_the_rate() {
    // Two requests went on credit and nothing arrives now: the debt is
    // claimed from the next epoch's leftovers either way (below the rate
    // with its half of the 40 spare slots). Beside a proxy asking twice
    // the rate it places no demand for a share; below the rate it places
    // the debt spread over k + lag + 1 = 6 epochs (2 x 64 / 6). Until issue 29 a debt placed a request an epoch (64) until
    // repaid: in a fleet of many sparse proxies over the rate, the debts
    // outweighed a busy proxy's arrivals (fleet sweep seed 146: it drew 7
    // of the 26 slots it was owed).
    assert_eq!(owing_beside(100), (Some(2), None));
    assert_eq!(owing_beside(10), (Some(2 + 20), Some(2 * 64 / 6)));
}

/// Two proxies with `per_a` and `per_b` arrivals per epoch, calling once
/// per epoch in turns: the shares each is granted, once demand is known.
fn shares_of(per_a: u64, per_b: u64) -> Vec<(u64, u64)> {
    let mut eng = FakeEngine::default();
    let mut a = orders();
    let mut b = a.clone();
    let mut granted: Vec<(u64, u64, u64)> = Vec::new(); // (epoch, a's, b's)
    for k in 0..10u64 {
        // Calls drift a little later each epoch (at least 100 ms apart).
        let now = T0 + k * 104 * MS;
        let fa = [RuleFacts {
            arrived_total: per_a * k,
            waiting: 0,
            owed: 0,
            owned_soon: 0,
        }];
        let fb = [RuleFacts {
            arrived_total: per_b * k,
            waiting: 0,
            owed: 0,
            owned_soon: 0,
        }];
        // b calls first in even epochs, a first in odd ones.
        let (ua, ub) = if k % 2 == 0 {
            let ub = exchange(&mut eng, &mut b, now + MS, &fb).1;
            (exchange(&mut eng, &mut a, now + 3 * MS, &fa).1, ub)
        } else {
            let ua = exchange(&mut eng, &mut a, now + MS, &fa).1;
            (ua, exchange(&mut eng, &mut b, now + 3 * MS, &fb).1)
        };
        let n = |u: &[RuleUpdate], f: u64| -> u64 {
            ranges(u)
                .iter()
                .filter(|r| r.0 / 50 == f)
                .map(|r| r.1 - r.0)
                .sum()
        };
        granted.push((E0 + k + 3, n(&ua, E0 + k + 3), n(&ub, E0 + k + 3)));
    }
    // Arrivals are measured from k = 1, so demand(E0+4) is the first with
    // both; shares of e+3 come from demand(e): from k = 4 (epoch E0+7) on.
    granted.iter().skip(4).map(|&(_, x, y)| (x, y)).collect()
}

#[test]
fn above_the_rate_shares_follow_demand_and_add_up_to_the_epoch_whatever_the_order() {
    // 80 asked of 50 slots: 50*60/80 = 37.5 -> the epoch's offset decides the rounding.
    let shares = shares_of(60, 20);
    assert_eq!(shares.len(), 6);
    for &(x, y) in &shares {
        assert_eq!(x + y, 50, "{shares:?}");
        assert!((37..=38).contains(&x), "{shares:?}");
    }
}

#[test]
fn below_the_rate_each_share_is_the_demand_and_the_rest_is_left_over() {
    // 40 asked of 50 slots: each proxy's share is its own demand; 10 slots
    // an epoch stay for leftover claims (bursts, credit repaid, new proxies).
    // (Calls 104 ms apart measure 30 arrivals per call as about 29 per epoch.)
    let shares = shares_of(30, 10);
    assert_eq!(shares.len(), 6);
    assert!(
        shares
            .iter()
            .all(|&(x, y)| (28..=30).contains(&x) && (9..=10).contains(&y)),
        "{shares:?}"
    );
}

#[test]
fn failing_calls_fall_back_after_fallback_after_and_the_first_good_answer_returns() {
    let mut eng = FakeEngine::default();
    let mut c = orders();
    let facts = waiting(1);
    exchange(&mut eng, &mut c, T0, &facts);
    assert_eq!(c.stats(0).map(|s| s.members), Some(1));
    // The engine goes away: a transport error at +100 ms...
    let (call, _) = c.tick(T0 + 100 * MS, &facts);
    assert!(call.is_some());
    assert!(c
        .on_answer(T0 + 101 * MS, Err(Failure::Transport))
        .is_empty());
    // ...the host's timeout at +250 ms (no answer within 50 ms)...
    let (call, _) = c.tick(T0 + 200 * MS, &facts);
    assert!(call.is_some());
    assert!(c.on_answer(T0 + 250 * MS, Err(Failure::Timeout)).is_empty());
    assert_eq!(c.mode(0), Some(Mode::Grid));
    // ...and another transport error at +350 ms: still within 250 ms of the first.
    let (call, updates) = c.tick(T0 + 300 * MS, &facts);
    assert!(call.is_some() && updates.is_empty());
    assert!(c
        .on_answer(T0 + 350 * MS, Err(Failure::Transport))
        .is_empty());
    // 250 ms after the first failure (+351 ms), on the tick: local pacing at
    // rate / the proxies the engine last counted (1: this one), not the
    // configured guess (expected_replicas 4).
    let (_, updates) = c.tick(T0 + 351 * MS, &facts);
    assert_eq!(
        updates,
        vec![RuleUpdate {
            rule: 0,
            mode: Mode::Local {
                interval_ns: 2 * MS
            },
            grant_rate_per_s: 0,
            spare_per_s: 0,
            // No demand placed since the failures: its next share that counts
            // it is epoch e+k+lag+1 after the next call's (T0 + 1 s).
            lead_ns: 649 * MS,
            ranges: vec![],
            reset: false,
            shift: 0,
        }]
    );
    // Calls go on (one per epoch) and the first good answer returns it to the grid.
    let (_, updates) = exchange(&mut eng, &mut c, T0 + 400 * MS, &facts);
    assert_eq!(updates.first().map(|u| u.mode), Some(Mode::Grid));
    let s = c.stats(0).unwrap();
    assert_eq!(
        (s.fallback_since, s.fallback_ns, s.failures, s.calls),
        (None, 50 * MS, 3, 5)
    );
}

#[test]
fn local_share_divides_by_expected_replicas_until_the_engine_has_counted_proxies() {
    let mut c = orders();
    let facts = waiting(1);
    c.tick(T0, &facts);
    c.on_answer(T0 + MS, Err(Failure::Transport));
    let (_, updates) = c.tick(T0 + 251 * MS, &facts);
    assert_eq!(
        updates[0].mode,
        Mode::Local {
            interval_ns: 4 * 2 * MS
        },
        "expected_replicas = 4"
    );
    for (failure, mode) in [
        (OnEngineFailure::Deny, Mode::Deny),
        (
            OnEngineFailure::LocalFull,
            Mode::Local {
                interval_ns: 2 * MS,
            },
        ),
    ] {
        let mut c = Caller::new(&engine(), vec![spec500("orders", failure)]);
        c.tick(T0, &facts);
        c.on_answer(T0 + MS, Err(Failure::Status(400)));
        assert_eq!(c.tick(T0 + 251 * MS, &facts).1[0].mode, mode);
    }
}

#[test]
fn a_failing_engine_is_logged_when_the_fallback_starts_then_every_10_s_with_its_reason_and_fix() {
    let mut c = orders();
    let facts = waiting(1);
    let mut logged: Vec<(u64, String)> = Vec::new();
    let mut t = T0;
    while t < T0 + 25 * NS_PER_S {
        if c.tick(t, &facts).0.is_some() {
            c.on_answer(
                t + MS,
                Err(Failure::Config("statuses[0]: no currentLimit".into())),
            );
        }
        logged.extend(c.take_events().into_iter().map(|e| (t, e)));
        t += 10 * MS;
    }
    // Fallback at +250 ms, then at most every 10 s: 3 lines in 25 s.
    let at: Vec<u64> = logged.iter().map(|(t, _)| (t - T0) / MS).collect();
    assert_eq!(at.len(), 3, "{logged:?}");
    assert!(at[0] >= 250 && at[0] <= 310, "{at:?}");
    assert!(at[1] - at[0] >= 10_000 && at[2] - at[1] >= 10_000, "{at:?}");
    let first = &logged[0].1;
    assert!(
        first.contains("(config)")
            && first.contains("no currentLimit")
            && first.contains("domain \"envoy_throttle\"")
            && first.contains("engine/config/throttle.yaml"),
        "{first}"
    );
    // Counted per reason.
    let failed = c.stats(0).unwrap().failed;
    assert_eq!(
        failed[Failure::Config(String::new()).index()],
        c.stats(0).unwrap().failures
    );
    assert!(failed.iter().sum::<u64>() > 200);
}

#[test]
fn counters_lost_after_others_added_again_are_still_caught_by_the_hours_call_count() {
    let mut eng = FakeEngine::default();
    let mut a = orders();
    let mut b = a.clone();
    let facts = waiting(5);
    for k in 0..3 {
        exchange(&mut eng, &mut a, T0 + k * 100 * MS, &facts);
        exchange(&mut eng, &mut b, T0 + k * 100 * MS + 2 * MS, &facts);
    }
    // Redis restarts empty. b calls in epochs 3 and 4 and adds itself to
    // members(6) and (7); a's next call, in epoch 5, looks at members(6): 1,
    // not 0, so its own lost add does not show there. Only the hour's call
    // count (2 + a's 1, below the 6 a saw) tells.
    eng.lose_counters();
    exchange(&mut eng, &mut b, T0 + 300 * MS, &facts);
    exchange(&mut eng, &mut b, T0 + 400 * MS, &facts);
    let (_, updates) = exchange(&mut eng, &mut a, T0 + 500 * MS, &facts);
    assert_eq!(c_failed(&a, "lost"), 1);
    // a drops what it was granted ahead: those slots may be granted again.
    assert!(
        updates.iter().any(|u| u.reset && u.ranges.is_empty()),
        "{updates:?}"
    );
    // And counts anew from there: the next answer is good.
    let (_, updates) = exchange(&mut eng, &mut a, T0 + 600 * MS, &facts);
    assert!(!ranges(&updates).is_empty());
    assert_eq!(c_failed(&a, "lost"), 1);
}

fn c_failed(c: &Caller, kind: &str) -> u64 {
    let i = Failure::KINDS.iter().position(|k| *k == kind).unwrap();
    c.stats(0).unwrap().failed[i]
}

#[test]
fn lost_counters_and_nonsense_grant_nothing() {
    let mut eng = FakeEngine::default();
    let mut c = orders();
    let facts = waiting(5);
    exchange(&mut eng, &mut c, T0, &facts);
    // Redis restarts: the counters this proxy added to read 0 again.
    eng.lose_counters();
    let (_, updates) = exchange(&mut eng, &mut c, T0 + 100 * MS, &facts);
    assert!(ranges(&updates).is_empty());
    assert_eq!(c.stats(0).map(|s| s.failures), Some(1));
    // Garbage, a wrong count: failures too.
    for body in [&b"<html>"[..], br#"{"overallCode":"OK","statuses":[]}"#] {
        let (call, _) = c.tick(
            T0 + 200 * MS + u64::from(body.len() as u8) * 100 * MS,
            &facts,
        );
        assert!(call.is_some());
        assert!(c
            .on_answer(T0 + 201 * MS, Ok((200, body)))
            .iter()
            .all(|u| u.ranges.is_empty()));
    }
    assert_eq!(c.stats(0).map(|s| s.failures), Some(3));
}

/// One call sent at `sent` (the first tick at or after it that calls) and
/// answered by the service at once, the answer reaching this process at
/// `sent + after`: the ranges it grants and the failures counted.
fn answered_after(sent: u64, after: u64) -> (Vec<(u64, u64)>, u64) {
    let mut eng = FakeEngine::default();
    let mut c = orders();
    let facts = waiting(3);
    let mut t = sent;
    let call = loop {
        if let (Some(call), _) = c.tick(t, &facts) {
            break call;
        }
        t += MS;
    };
    let (status, body) = eng.handle(&call.request.body, t);
    let updates = c.on_answer(t + after, Ok((status, &body)));
    (ranges(&updates), c.stats(0).map_or(0, |s| s.failures))
}

#[test]
fn an_answer_held_up_past_the_timeout_by_this_process_grants_its_slots() {
    // The host enforces the timeout: an answer it delivers after it waited
    // in the socket while the process was stopped (CI: three Envoys held up
    // 47 ms lost 18 of 300 slots in a second when it counted as a timeout).
    let (granted, failures) = answered_after(T0, 80 * MS);
    assert_eq!((granted.len(), failures), (4, 0));
    let (granted, failures) = answered_after(T0, 10 * MS);
    assert_eq!((granted.len(), failures), (4, 0));
}

#[test]
fn a_late_answer_that_may_have_been_counted_in_the_next_hour_grants_nothing() {
    // Claims are sent while the hour has max_clock_skew + timeout (150 ms)
    // left; answered later than the timeout, the service may have counted
    // them in the next hour unless max_clock_skew (100 ms) is still left.
    let h = 1_795_471_200 * NS_PER_S;
    let sent = h - 160 * MS;
    let (granted, failures) = answered_after(sent, 55 * MS);
    assert_eq!(
        (granted.len(), failures),
        (4, 0),
        "answered 105 ms before the hour"
    );
    let (granted, failures) = answered_after(sent, 70 * MS);
    assert_eq!(
        (granted.len(), failures),
        (0, 1),
        "answered 90 ms before the hour"
    );
}

#[test]
fn no_claim_lands_near_the_services_hour_boundary() {
    let h = 1_795_471_200 * NS_PER_S; // an hour boundary (T0's hour + 1)
    let mut eng = FakeEngine::default();
    let mut c = orders();
    let mut claimed: Vec<(u64, u64)> = Vec::new(); // (sent at, epoch claimed)
    let mut t = h - 2 * NS_PER_S;
    while t < h + 2 * NS_PER_S {
        let facts = [RuleFacts {
            arrived_total: t / (10 * MS),
            waiting: 1,
            owed: 0,
            owned_soon: 0,
        }];
        let (call, _) = c.tick(t, &facts);
        if let Some(call) = call {
            let body = String::from_utf8(call.request.body.clone()).unwrap();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            for d in v["descriptors"].as_array().unwrap() {
                let value = d["entries"][0]["value"].as_str().unwrap();
                // Epoch counters only (`<rule>:<T>:<epoch>`): the hour's
                // call count and the per-second member counts have none.
                let parts: Vec<&str> = value.split(':').collect();
                if let [_, kind, f] = parts[..] {
                    if kind == "any" {
                        continue;
                    }
                    if let Ok(f) = f.parse::<u64>() {
                        claimed.push((t, f));
                    }
                }
            }
            let (status, answer) = eng.handle(&call.request.body, t);
            c.on_answer(t + MS, Ok((status, &answer)));
        }
        t += 5 * MS;
    }
    let g = Grid::new(2 * MS);
    for &(sent, f) in &claimed {
        let start = g.epoch_start(f);
        // Same hour as the epoch's start, and clear of its edges.
        assert_eq!(
            sent / grid::WINDOW_NS,
            start / grid::WINDOW_NS,
            "epoch {f} claimed at {sent}"
        );
        assert!(
            sent < h - 150 * MS || sent >= h + 100 * MS,
            "claim at {}",
            sent as i64 - h as i64
        );
    }
    // Claims resume right after the guard.
    assert!(claimed
        .iter()
        .any(|&(sent, _)| sent >= h + 100 * MS && sent < h + 200 * MS));
}

#[test]
fn calls_are_at_most_ten_per_second_whatever_the_rules() {
    let rates = [1_000_000u64, 500, 300, 7, 15, 1];
    let specs: Vec<RuleSpec> = rates
        .iter()
        .enumerate()
        .map(|(i, r)| RuleSpec {
            name: format!("r{i}"),
            grid: Grid::new(NS_PER_S.div_ceil(*r)),
            expected_replicas: 1,
            on_engine_failure: OnEngineFailure::LocalShare,
        })
        .collect();
    let mut eng = FakeEngine::default();
    let mut c = Caller::new(&engine(), specs);
    let mut sent = Vec::new();
    let mut t = T0;
    while t < T0 + 10 * NS_PER_S {
        let facts: Vec<RuleFacts> = rates
            .iter()
            .map(|_| RuleFacts {
                arrived_total: t / MS,
                waiting: 10,
                owed: 0,
                owned_soon: 0,
            })
            .collect();
        if exchange(&mut eng, &mut c, t, &facts).0 {
            sent.push(t);
        }
        t += MS;
    }
    assert!(sent
        .windows(2)
        .all(|w| w[1] - w[0] >= MIN_CALL_INTERVAL_NS - CALL_TOLERANCE_NS));
    assert!(sent.len() <= 101, "{} calls in 10 s", sent.len());
    assert!(sent.len() >= 95, "{} calls in 10 s", sent.len());
    // Any second holds at most 11 calls (10 epochs, and one more when a
    // window catches the ends of two).
    for (i, &t) in sent.iter().enumerate() {
        let in_second = sent[i..].iter().take_while(|&&u| u < t + NS_PER_S).count();
        assert!(in_second <= 11, "{in_second} calls within 1 s from {t}");
    }
}

/// The calling VM ticks every 20 ms and each tick is up to 15 ms late (as an
/// idle Envoy's timer is): every epoch still gets its call.
#[test]
fn late_ticks_do_not_skip_epochs() {
    let specs = vec![spec500("a", OnEngineFailure::LocalShare)];
    let mut eng = FakeEngine::default();
    let mut c = Caller::new(&engine(), specs);
    let mut sent = Vec::new();
    let mut t = T0;
    let mut jitter: u64 = 7;
    while t < T0 + 10 * NS_PER_S {
        let facts = [RuleFacts {
            arrived_total: t / MS,
            waiting: 1,
            owed: 0,
            owned_soon: 0,
        }];
        if exchange(&mut eng, &mut c, t, &facts).0 {
            sent.push(t);
        }
        jitter = (jitter * 1_103_515_245 + 12_345) % 16;
        t += 20 * MS + jitter * MS;
    }
    assert!(
        sent.len() >= 97,
        "{} calls in 10 s: epochs were skipped",
        sent.len()
    );
    assert!(sent.len() <= 101, "{} calls in 10 s", sent.len());
}

#[test]
fn a_phase_spreads_calls_over_the_first_quarter_of_the_epoch() {
    let facts = waiting(1);
    let mut c = orders().with_phase(500);
    // Half of a quarter epoch (100 ms): not before 12.5 ms into the epoch.
    assert_eq!(c.tick(T0 + 12 * MS, &facts).0, None);
    assert!(c.tick(T0 + 13 * MS, &facts).0.is_some());
}

/// A first call late in its epoch (the first request came then) does not
/// hold the later calls late: from the next epoch on they come at the
/// proxy's phase, where the pace ran from the late call until 2026-12-02
/// (and the proxy called behind every other's leftover claims for good).
#[test]
fn a_late_first_call_does_not_hold_the_later_calls_late() {
    let mut eng = FakeEngine::default();
    let mut c = orders().with_phase(200); // 5 ms into each epoch
    let mut sent = Vec::new();
    for ms in 92..1_000 {
        if exchange(&mut eng, &mut c, T0 + ms * MS, &waiting(1)).0 {
            sent.push(ms);
        }
    }
    assert_eq!(sent.first(), Some(&92), "{sent:?}");
    let later: Vec<u64> = sent.iter().skip(1).map(|ms| ms % 100).collect();
    assert!(later.len() >= 8, "{sent:?}");
    assert!(later.iter().all(|&at| at == 5), "{sent:?}");
}

/// A lone proxy's calls over `epochs` epochs of 100 ms with the facts
/// `facts(k)` gives (none: no tick in that epoch): the slots each call from
/// epoch `from` on was granted.
fn lone_claims(
    epochs: u64,
    from: u64,
    facts: impl Fn(u64) -> Option<RuleFacts>,
) -> Vec<(u64, u64)> {
    let mut eng = FakeEngine::default();
    let mut c = orders();
    let mut claimed = Vec::new();
    for k in 0..epochs {
        let Some(f) = facts(k) else { continue };
        let (called, updates) = exchange(&mut eng, &mut c, T0 + k * 100 * MS + 30 * MS, &[f]);
        let granted: u64 = ranges(&updates).iter().map(|r| r.1 - r.0).sum();
        if called && k >= from {
            claimed.push((k, granted));
        }
    }
    claimed
}

#[test]
fn an_epoch_without_a_call_does_not_cost_a_lone_proxy_its_spare() {
    // A lone proxy at 500/s asking for 1 request an epoch of the 50 claims
    // the rest as its spare with every leftover claim (a request between its
    // demand's slots finds one at hand). One epoch goes without a call (its
    // ticks came late): its demand add is never sent, and the look at that
    // epoch's total, `lag` epochs later, reads 0. The fleet asking for
    // nothing is not a fleet without spare: until 2026-11-28 that epoch's
    // leftover claim took 1 slot of 50 (fleet sweep seed 4: a request within
    // the rate held 54 ms).
    let claimed = lone_claims(40, 20, |k| {
        // No tick in epoch 25.
        (k != 25).then_some(RuleFacts {
            arrived_total: k,
            waiting: 0,
            owed: 0,
            owned_soon: 0,
        })
    });
    let short: Vec<_> = claimed.iter().filter(|&&(_, n)| n < 40).collect();
    assert!(
        short.is_empty(),
        "calls that claimed little: {short:?} of {claimed:?}"
    );
}

#[test]
fn a_lone_proxy_back_from_idle_claims_its_spare_though_the_total_read_0() {
    // A lone proxy at 500/s asks for 1 request an epoch for 2 s, is idle
    // for 2 s (no call), then a request comes and goes on credit. Its first
    // call looks at a demand total of its idle spell: 0, and its own demand
    // still reads 0 (the arrivals counter moves at the workers' ticks). A
    // total seen to be 0 is a fleet asking for nothing, not one never seen:
    // until issue 29 the next leftover claim took the 1 slot owed and no
    // spare, and the requests of that epoch waited for the one after (fleet
    // sweep seed 54: a lone proxy at 19/s of 300/s, b0, waited 47 ms).
    // 1 request an epoch but in epochs 20-39: 20 in all by epoch 40.
    let claimed = lone_claims(46, 40, |k| {
        Some(RuleFacts {
            arrived_total: (k + 1).min(20),
            waiting: 0,
            owed: u64::from(k >= 40),
            owned_soon: 0,
        })
    });
    let short: Vec<_> = claimed.iter().filter(|&&(_, n)| n < 40).collect();
    assert!(
        !claimed.is_empty() && short.is_empty(),
        "calls back from idle that claimed little: {short:?} of {claimed:?}"
    );
}

/// The slots each of three proxies at 500/s (L = 50) is granted for each
/// epoch, by epoch, when all three ask for 2 requests an epoch for 3 s and
/// then for `after` an epoch (the fleet below the rate), calling in the
/// same order every epoch (phases 0, 400, 800: 0, 10 and 20 ms in).
fn grants_of_three(after: u64) -> Vec<std::collections::BTreeMap<u64, u64>> {
    let mut eng = FakeEngine::default();
    let mut proxies: Vec<Caller> = [0, 400, 800]
        .iter()
        .map(|&ph| orders().with_phase(ph))
        .collect();
    let mut arrived = [0u64; 3];
    let mut by_epoch = vec![std::collections::BTreeMap::new(); 3];
    for k in 0..40u64 {
        for (i, c) in proxies.iter_mut().enumerate() {
            arrived[i] += if k < 30 { 2 } else { after };
            let facts = [RuleFacts {
                arrived_total: arrived[i],
                waiting: 0,
                owed: 0,
                owned_soon: 0,
            }];
            let now = T0 + k * 100 * MS + (1 + 10 * i as u64) * MS;
            let (_, updates) = exchange(&mut eng, c, now, &facts);
            for (a, b) in ranges(&updates) {
                for slot in a..b {
                    *by_epoch[i].entry(slot * 2 / 100).or_insert(0) += 1;
                }
            }
        }
    }
    by_epoch
}

#[test]
#[ignore = "issue 29, not fixed: the leftover claims overdraw the epoch when demand rises"]
fn below_the_rate_a_proxys_spare_covers_its_rise_and_leaves_the_others_theirs() {
    // Three proxies rise at once from 2 to 10 requests an epoch of 50 (from
    // 12% of the rate to 60%). Their shares still follow the old demand (6
    // of 50) for the `k + lag + 1` epochs before the new demand counts, and
    // each one's part of the spare is (50 - 6) / 3 = 14: its rise of 8 fits
    // in it. Each claims its rise on top of its part of the spare (8 + 14),
    // first come first served: the third proxy finds the epoch taken and
    // gets 2, 2 and 8 slots for its 10 requests in the first three epochs,
    // its requests within the rate waiting for the next epoch's grants (the
    // kind of fleet sweep seeds 23 and 31: waits of 35-87 ms at a third to
    // a half of the rate). Not fixed: claiming the larger of the two (the
    // spare holds the rise) makes this pass, but over seeds 1-200 it took
    // from bursts the spare they were held on (invariant 10: 2,647 -> 2,702
    // requests, seed 52 new), engine/README.md, "Invariants", 3.
    let grants = grants_of_three(10);
    let first = E0 + 31;
    for (i, g) in grants.iter().enumerate() {
        let short: Vec<_> = (first..first + 8)
            .map(|f| (f - E0, g.get(&f).copied().unwrap_or(0)))
            .filter(|&(_, n)| n < 10)
            .collect();
        assert!(
            short.is_empty(),
            "proxy {i}: epochs (from the start) granted fewer than its 10 requests: {short:?}"
        );
    }
}

// ---- a dry-run class rule claims as its enforcing twin (issue 30) ----------

/// A 100/s cluster rule with classes over 2 replicas (50/s each), `dry_run`
/// as given; every request is of the default class (batch).
fn class_rule(dry_run: bool) -> Config {
    let json = r#"{"engine": {"cluster": "throttle_engine", "timeout": "50ms"},
      "rules": [{"name": "orders", "rate": "100/s", "max_queue_delay": "1s",
        "scope": "cluster", "expected_replicas": 2, "dry_run": DRY,
        "classes": [{"name": "critical", "match": {"headers": {"x-priority": "critical"}}},
                    {"name": "batch"}]}]}"#;
    json.replace("DRY", &dry_run.to_string()).parse().unwrap()
}

/// The slots a call claims (`throttle_slots`) and the demand it adds
/// (`throttle_demand`), summed over its epochs.
fn claimed(body: &[u8]) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let mut sums = (0, 0);
    for d in v["descriptors"].as_array().unwrap() {
        let e = &d["entries"][0];
        let hits: u64 = d["hitsAddend"].as_str().unwrap().parse().unwrap();
        match e["key"].as_str() {
            Some("throttle_slots") => sums.0 += hits,
            Some("throttle_demand") => sums.1 += hits,
            _ => {}
        }
    }
    sums
}

/// One proxy of `config` under 300/s (6 times its share) for 6 s, its
/// calls answered at once by the in-memory engine: each call's claims, the
/// requests queued and rejected at arrival (under dry-run: that would have
/// been), and the slots taken and taken ahead.
fn claims_under_overload(config: &Config) -> (Vec<(u64, u64)>, [u64; 4]) {
    let mut p = SimProxy::new(config, 0).unwrap();
    let mut eng = FakeEngine::default();
    let (start, end, gap) = (T0, T0 + 6 * NS_PER_S, NS_PER_S / 300);
    let mut next = start + gap;
    let mut claims = Vec::new();
    let (mut t, mut refused) = (start, 0);
    while t < end {
        t += MS;
        while next <= t {
            refused += u64::from(p.arrive(0, next) == Fate::Rejected);
            next += gap;
        }
        if (t - start) % (5 * MS) != 0 {
            continue;
        }
        if let Some(call) = p.tick(t) {
            claims.push(claimed(&call.request.body));
            let (status, body) = eng.handle(&call.request.body, t);
            p.answer(t, Ok((status, &body)));
        }
    }
    let st = |s| p.total(0, s);
    let (queued, rejected) = if config.rules[0].dry_run {
        (st(Stat::WouldQueue), st(Stat::WouldReject))
    } else {
        (st(Stat::Queued), refused)
    };
    let taken = (st(Stat::SlotsTaken), st(Stat::SlotsAhead));
    (claims, [queued, rejected, taken.0, taken.1])
}

#[test]
fn a_dry_run_class_rule_claims_as_its_enforcing_twin() {
    // The line of a class rule under dry-run is its tickets (no request is
    // held): until issue 30 the caller read the waiting count from the
    // cursor and the `held` gauge only, so a dry-run class rule claimed as
    // if nobody waited, and its would-be figures were not the enforced ones.
    let (enforced, enforced_counts) = claims_under_overload(&class_rule(false));
    let (dry, dry_counts) = claims_under_overload(&class_rule(true));
    let total = |c: &[(u64, u64)]| c.iter().fold((0, 0), |(a, b), &(x, y)| (a + x, b + y));
    assert!(
        enforced_counts[0] > 0 && enforced_counts[1] > 0,
        "overload: {enforced_counts:?}"
    );
    assert_eq!(total(&dry), total(&enforced), "claims: slots, demand");
    assert_eq!(dry, enforced, "each call's claims");
    assert_eq!(
        dry_counts, enforced_counts,
        "(would_)queued, (would_)rejected at arrival, slots taken, ahead"
    );
}
