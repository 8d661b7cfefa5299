//! The seeded sweep: scenarios drawn from a seed over the whole space the
//! filter promises to hold in (1 to 50 proxies with 1 to 4 VMs each, 1 to 4
//! rules in cluster and process scope, keyed and with priority classes,
//! rates from 0.5/s to 5,000/s, bursts, queue delays, steady, Poisson,
//! sporadic, bursty and overloaded demand, uneven over the proxies, engine
//! faults, skewed and stepping clocks, stalled processes), each run on
//! what ships and checked against every invariant ([`super::invariants`]).
//! Same seed, same scenario, same trace: a failure prints its seed, and
//! `--seed` replays it.
//!
//! Named scenarios ([`named`]) are the red team's findings at their own
//! numbers.

use crate::clock::NS_PER_MS;

use super::fleet;
use super::invariants::{self, Violation};
use super::rng::{mix, Rng};
use super::scenario::{Fault, Load, ProxySpec, RuleSpec, Scenario, Shape};

/// The outcome of one seed (or named scenario).
#[derive(Debug)]
pub struct Outcome {
    pub scenario: Scenario,
    /// Err: the filter refused the drawn configuration (not a failure: the
    /// sweep counts them).
    pub refused: Option<String>,
    pub violations: Vec<Violation>,
    /// Requests simulated.
    pub requests: usize,
    /// A short signature of the configuration's kind, for counting how many
    /// distinct kinds a sweep covered.
    pub kind: String,
    /// Figures of the run, for `--verbose`.
    pub figures: Vec<String>,
}

/// Runs one scenario and checks it; with several rules and no faults, also
/// rule 0 alone (rules are independent).
pub fn run_checked(sc: &Scenario) -> Outcome {
    let kind = kind_of(sc);
    let trace = match fleet::run(sc) {
        Ok(t) => t,
        Err(e) => {
            return Outcome {
                scenario: sc.clone(),
                refused: Some(e),
                violations: Vec::new(),
                requests: 0,
                kind,
                figures: Vec::new(),
            }
        }
    };
    let mut violations = invariants::check(&trace);
    if sc.rules.len() > 1 && sc.faults.is_empty() && sc.loads.iter().any(|l| l.rule != 0) {
        let alone = invariants::rule_zero_alone(sc);
        let again = Scenario {
            noise: sc.noise ^ 0x5EED,
            ..alone.clone()
        };
        if let (Ok(a), Ok(b)) = (fleet::run(&alone), fleet::run(&again)) {
            violations.extend(invariants::independent(&trace, &a, &b));
        }
    }
    Outcome {
        scenario: sc.clone(),
        refused: None,
        violations,
        requests: trace.records.len(),
        kind,
        figures: invariants::figures(&trace),
    }
}

/// The kind of a configuration: its fleet size, scopes, keys, classes,
/// faults and clocks, coarsely.
pub fn kind_of(sc: &Scenario) -> String {
    let size = match sc.proxies.len() {
        1 => "1",
        2..=4 => "2-4",
        5..=12 => "5-12",
        _ => "13+",
    };
    let mut rules: Vec<String> = sc
        .rules
        .iter()
        .map(|r| {
            let band = match r.rate_per_s {
                x if x < 10.0 => "low",
                x if x < 500.0 => "mid",
                _ => "high",
            };
            format!(
                "{}{}{}{}{}",
                if r.cluster { "C" } else { "P" },
                band,
                if r.keyed.is_some() { "k" } else { "" },
                if r.classes.is_empty() { "" } else { "c" },
                if r.burst > 0 { "b" } else { "" }
            )
        })
        .collect();
    rules.sort();
    let faults: Vec<&str> = sc
        .faults
        .iter()
        .map(|f| match f {
            Fault::RedisRestart { .. } => "redis",
            Fault::EngineDown { .. } => "down",
            Fault::Slow { .. } => "slow",
            Fault::Nonsense { .. } => "nonsense",
        })
        .collect();
    let clocks = if sc.proxies.iter().any(|p| !p.steps.is_empty()) {
        "step"
    } else if sc
        .proxies
        .iter()
        .any(|p| p.skew_ms.unsigned_abs() > sc.max_clock_skew_ms)
    {
        "split"
    } else if sc.proxies.iter().any(|p| p.skew_ms != 0) {
        "skew"
    } else {
        "sync"
    };
    let stalls = if sc.proxies.iter().any(|p| !p.stalls.is_empty()) {
        "/stalls"
    } else {
        ""
    };
    format!(
        "{size}/{}/{}/{clocks}{stalls}",
        rules.join("+"),
        faults.join("+")
    )
}

const RATES: [f64; 16] = [
    0.5, 1.0, 2.0, 5.0, 7.0, 10.0, 20.0, 30.0, 97.0, 100.0, 150.0, 300.0, 450.0, 1000.0, 2000.0,
    5000.0,
];

/// `sc` started so that the service's hour ends 2-12 s into it (drawn from
/// its seed, without the seed's generator): `fleet-sweep --at-hour`.
pub fn at_hour(mut sc: Scenario) -> Scenario {
    sc.start_s = super::scenario::HOUR_S + 3600 - 2 - super::rng::mix(sc.seed ^ 0x4855_5552) % 11;
    sc
}

/// The scenario of `seed`.
pub fn draw(seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let mut sc = Scenario::new(seed, "");
    let n = rng.pick(&[1usize, 1, 2, 3, 3, 4, 4, 5, 6, 8, 12, 20, 30, 50]);
    let vms = rng.pick(&[1usize, 1, 2, 2, 3, 4]);
    sc.proxies = (0..n).map(|_| ProxySpec::new(vms)).collect();
    sc.duration_ms = rng.range(8, 16) * 1000;
    sc.tick_ms = rng.pick(&[(1, 2), (2, 6), (3, 5), (1, 8)]);
    sc.latency_ms = rng.pick(&[(1, 3), (1, 10), (5, 40)]);
    sc.service_ms = rng.range(1, 20);
    // Near an hour boundary now and then (claims pause near it).
    if rng.chance(0.1) {
        sc.start_s = super::scenario::HOUR_S + 3600 - rng.range(2, 12);
    }
    let rules = rng.pick(&[1usize, 1, 1, 2, 2, 3, 4]);
    // Keep the whole run within about 250,000 requests.
    let budget = 250_000.0 / (sc.duration_ms as f64 / 1e3) / rules as f64;
    for i in 0..rules {
        let cluster = rng.chance(0.65);
        let mut rate = rng.pick(&RATES);
        if rate * 3.0 > budget {
            rate = (budget / 3.0).max(1.0).floor();
        }
        let mut r = if cluster {
            RuleSpec::cluster(&format!("r{i}"), rate, n as u32)
        } else {
            RuleSpec::process(&format!("r{i}"), rate)
        };
        r.burst = rng.pick(&[0, 0, 0, 1, 2, 5]);
        r.max_queue_delay_ms = rng.pick(&[0, 200, 500, 1000, 1000, 2000, 3000]);
        if cluster {
            // What cluster scope accepts: a rate of 1/s or more, and a queue
            // delay of at least the engine's timeout.
            r.rate_per_s = r.rate_per_s.max(1.0);
            r.max_queue_delay_ms = r.max_queue_delay_ms.max(sc.timeout_ms);
            r.on_failure = rng.pick(&["local_share", "local_share", "deny"]);
        }
        if !cluster && rng.chance(0.25) {
            r.keyed = Some(rng.pick(&[64, 1024, 4096]));
            if rng.chance(0.3) {
                r.key_quota_per_s = Some((rate / 4.0).max(1.0));
            }
        }
        if r.keyed.is_none() && rng.chance(0.25) && r.max_queue_delay_ms > 0 {
            let floor = rng.pick(&[0.1, 0.2, 0.3]);
            r.classes = vec![
                ("critical".into(), 0.0, r.max_queue_delay_ms),
                ("batch".into(), floor, r.max_queue_delay_ms * 3),
            ];
            if rng.chance(0.3) {
                r.classes
                    .insert(1, ("normal".into(), 0.1, r.max_queue_delay_ms * 2));
            }
        }
        sc.rules.push(r);
    }
    for (i, r) in sc.rules.clone().iter().enumerate() {
        demand(&mut sc, &mut rng, i, r);
    }
    if sc.rules.iter().any(|r| r.cluster) {
        if rng.chance(0.25) {
            let at_ms = rng.range(3, sc.duration_ms / 1000 - 3) * 1000;
            sc.faults.push(match rng.range(0, 3) {
                0 => Fault::RedisRestart {
                    at_ms,
                    down_ms: rng.pick(&[0, 50, 300, 700]),
                },
                1 => Fault::EngineDown {
                    at_ms,
                    for_ms: rng.pick(&[100, 400, 1500]),
                },
                2 => Fault::Slow {
                    at_ms,
                    for_ms: rng.pick(&[300, 800]),
                    latency_ms: 80,
                },
                _ => Fault::Nonsense {
                    at_ms,
                    for_ms: rng.pick(&[200, 600]),
                },
            });
        }
        if n > 1 && rng.chance(0.3) {
            clocks(&mut sc, &mut rng);
        }
    }
    // Stalls of whole processes (the machine or a pod's CPU quota holding
    // them up), drawn apart: the rest of each seed's scenario is as before.
    let mut st = rng.fork(0x57A1_1000);
    if st.chance(0.25) {
        for _ in 0..st.range(1, 3) {
            let at_ms = st.range(2_000, sc.duration_ms - 1_000);
            let for_ms = if st.chance(0.8) {
                st.range(5, 45)
            } else {
                st.range(60, 200)
            };
            if st.chance(0.5) {
                for p in sc.proxies.iter_mut() {
                    p.stalls.push((at_ms, for_ms));
                }
            } else {
                let p = st.range(0, n as u64 - 1) as usize;
                if let Some(p) = sc.proxies.get_mut(p) {
                    p.stalls.push((at_ms, for_ms));
                }
            }
        }
    }
    // Blips, drawn apart too: a call or two timing out after the engine
    // counted it (less than `fallback_after`), as a busy machine makes them.
    let mut bl = rng.fork(0xB11B_0000);
    if sc.rules.iter().any(|r| r.cluster) && bl.chance(0.3) {
        sc.faults.push(Fault::Slow {
            at_ms: bl.range(2_000, sc.duration_ms - 1_500),
            for_ms: bl.pick(&[40, 90, 140]),
            latency_ms: 80,
        });
    }
    sc
}

/// The demand of rule `i`: a load factor of its rate, split over the proxies.
fn demand(sc: &mut Scenario, rng: &mut Rng, i: usize, r: &RuleSpec) {
    let n = sc.proxies.len();
    let factor = rng.pick(&[0.2, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0]);
    // Process scope: the rate is per process; cluster: for the fleet.
    let total = if r.cluster {
        r.rate_per_s * factor
    } else {
        r.rate_per_s * factor * n as f64
    };
    let split = rng.range(0, 2);
    let weights: Vec<f64> = (0..n)
        .map(|p| match split {
            0 => 1.0,
            1 => 1.0 / (p as f64 + 1.0).powf(0.9),
            _ => rng.unit() + 0.05,
        })
        .collect();
    let sum: f64 = weights.iter().sum();
    let dur = sc.duration_ms;
    let shape = rng.range(0, 4);
    for (p, w) in weights.iter().enumerate() {
        let per_s = total * w / sum;
        if per_s <= 0.0 {
            continue;
        }
        let class_of = |rng: &mut Rng| {
            (!r.classes.is_empty()).then(|| rng.range(0, r.classes.len() as u64 - 1) as usize)
        };
        let keys = r.keyed.map(|_| rng.pick(&[1u32, 10, 100, 1000]));
        let timeout = rng.chance(0.15).then(|| rng.range(50, 3000));
        let mut push = |shape: Shape, from_ms: u64, to_ms: u64, class: Option<usize>| {
            sc.loads.push(Load {
                rule: i,
                proxy: p,
                shape,
                from_ms,
                to_ms,
                class,
                keys,
                client_timeout_ms: timeout,
            })
        };
        match shape {
            // Steady, evenly spaced.
            0 => {
                let c = class_of(rng);
                push(
                    Shape::Uniform {
                        per_s,
                        phase_ms: rng.range(0, 1000),
                    },
                    0,
                    dur,
                    c,
                )
            }
            // Poisson.
            1 => {
                let c = class_of(rng);
                push(Shape::Poisson { per_s }, 0, dur, c)
            }
            // On and off: demand comes and goes.
            2 => {
                let on = rng.range(1, 4) * 1000;
                let off = rng.range(1, 3) * 1000;
                let mut t = 0;
                while t < dur {
                    let c = class_of(rng);
                    push(Shape::Poisson { per_s }, t, (t + on).min(dur), c);
                    t += on + off;
                }
            }
            // Bursts after idle, on top of a little steady traffic.
            _ => {
                let c = class_of(rng);
                push(Shape::Poisson { per_s: per_s / 4.0 }, 0, dur, c);
                let mut t = rng.range(1, 3) * 1000;
                while t < dur {
                    let n = (per_s * rng.range(1, 3) as f64).ceil().clamp(1.0, 2000.0) as u32;
                    let c = class_of(rng);
                    // Spread over 0-40 ms, drawn apart from `rng` (the
                    // seeds' other draws stay as they were).
                    let spread_ms = mix(t ^ ((p as u64) << 20) ^ (u64::from(n) << 40)) % 41;
                    push(
                        Shape::Burst {
                            n,
                            at_ms: t,
                            spread_ms,
                        },
                        0,
                        dur,
                        c,
                    );
                    t += rng.range(2, 5) * 1000;
                }
            }
        }
        // Classes: every class sends, the first the most.
        if !r.classes.is_empty() && rng.chance(0.5) {
            for c in 0..r.classes.len() {
                sc.loads.push(Load {
                    rule: i,
                    proxy: p,
                    shape: Shape::Poisson {
                        per_s: per_s / (c as f64 + 1.5),
                    },
                    from_ms: 0,
                    to_ms: dur,
                    class: Some(c),
                    keys,
                    client_timeout_ms: None,
                });
            }
        }
    }
}

/// Clock trouble: skews within `max_clock_skew`, a split of the fleet (ties
/// included), or a clock that steps while the fleet runs.
fn clocks(sc: &mut Scenario, rng: &mut Rng) {
    let n = sc.proxies.len();
    match rng.range(0, 2) {
        0 => {
            let half = sc.max_clock_skew_ms as i64 / 2;
            for p in &mut sc.proxies {
                p.skew_ms = rng.range(0, 2 * half as u64) as i64 - half;
            }
        }
        1 => {
            let k = rng.range(1, (n as u64 / 2).max(1)) as usize;
            let off = rng.range(200, 1500) as i64 * if rng.chance(0.5) { 1 } else { -1 };
            for p in sc.proxies.iter_mut().take(k) {
                p.skew_ms = off;
            }
        }
        _ => {
            let p = rng.range(0, n as u64 - 1) as usize;
            let at = rng.range(3, (sc.duration_ms / 1000).saturating_sub(5).max(3)) * 1000;
            let by = rng.range(200, 1500) as i64 * if rng.chance(0.5) { 1 } else { -1 };
            if let Some(x) = sc.proxies.get_mut(p) {
                x.steps.push((at, by));
            }
        }
    }
}

/// The named scenarios: red team 3's findings 2-6 at their own numbers, and
/// CI's own failures.
pub const NAMES: [&str; 21] = [
    "burst-after-idle",
    "burst-after-idle-spread",
    "low-rates",
    "late-refusals",
    "late-refusals-1.1",
    "late-refusals-blips",
    "two-rules",
    "two-rules-blips",
    "two-rules-hour",
    "skewed-at-hour",
    "two-rules-7-450",
    "clock-tie",
    "clock-tie-hour",
    "stalls",
    "stall-late-answer",
    "stall-prune",
    "sporadic",
    "class-floors",
    "skewed-joiner",
    "skewed-joiner-ahead",
    "class-burst",
];

/// Stall lengths the stall search tries (ms): up to the catch-up, where a
/// stall may cost no slot ([`crate::rate::CATCH_UP_NS`]).
pub const STALL_LENGTHS_MS: [u64; 7] = [10, 20, 30, 40, 45, 48, 50];

/// Named scenario `name` with one stall of `len_ms` at `at_ms`, of every
/// proxy (`proxy` None) or of one, instead of the stalls it has: a point of
/// the stall search (`fleet-sweep --stall-search NAME`), of which the named
/// scenarios `stall-late-answer` and `stall-prune` are two points that
/// failed before 2026-11-29 (seeds had not found them). Each point draws its
/// own noise.
pub fn with_stall(name: &str, len_ms: u64, at_ms: u64, proxy: Option<usize>) -> Option<Scenario> {
    let mut sc = named(name)?;
    if proxy.is_some_and(|p| p >= sc.proxies.len()) || at_ms + len_ms >= sc.duration_ms {
        return None;
    }
    for (i, p) in sc.proxies.iter_mut().enumerate() {
        p.stalls = if proxy.is_none_or(|q| q == i) {
            vec![(at_ms, len_ms)]
        } else {
            Vec::new()
        };
    }
    sc.noise ^= at_ms.wrapping_mul(0x9E37_79B9) ^ len_ms;
    Some(sc)
}

/// Named scenario `name` with its bursts `by_ms` later: a point of the
/// offset search (`fleet-sweep --offset-search NAME`), which moves a burst
/// over the phases of the engine calls (where an answer lands among its
/// requests). Each point draws its own noise.
pub fn with_offset(name: &str, by_ms: u64) -> Option<Scenario> {
    let mut sc = named(name)?;
    let (mut moved, end) = (false, sc.duration_ms);
    for l in &mut sc.loads {
        if let Shape::Burst { at_ms, .. } = &mut l.shape {
            *at_ms += by_ms;
            if *at_ms >= end {
                return None;
            }
            moved = true;
        }
    }
    if !moved {
        return None;
    }
    sc.noise ^= by_ms.wrapping_mul(0x9E37_79B9);
    Some(sc)
}

/// A named scenario (None: no such name).
pub fn named(name: &str) -> Option<Scenario> {
    let mut sc = Scenario::new(1, name);
    let uniform = |rule, proxy, per_s: f64, class| Load {
        rule,
        proxy,
        shape: Shape::Uniform {
            per_s,
            phase_ms: proxy as u64 * 7,
        },
        from_ms: 0,
        to_ms: u64::MAX,
        class,
        keys: None,
        client_timeout_ms: None,
    };
    match name {
        // Finding 2: under 1.35x (and 1.1x) overload every 429 came late.
        "late-refusals" | "late-refusals-1.1" => {
            let each = if name == "late-refusals" { 45.0 } else { 37.0 };
            sc.rules.push(RuleSpec::cluster("orders", 100.0, 3));
            sc.proxies = vec![ProxySpec::new(2); 3];
            for p in 0..3 {
                sc.loads.push(uniform(0, p, each, None));
            }
            sc.duration_ms = 14_000;
        }
        // CI's own (2026-11-29): under late-refusals' overload a call or
        // two timed out on one proxy (its engine counted them), and a
        // request held on the share they claimed was refused at its
        // deadline. Blips of one, two and three calls' length.
        // CI's (2026-12-01): two-rules' test ran over the top of the hour,
        // where claims pause (the service's counters start again): alpha
        // 25 and beta 120 in that second, 5 and 30 short.
        "two-rules-hour" => {
            let mut sc = named("two-rules")?;
            sc.name = name.into();
            sc.start_s = super::scenario::HOUR_S + 3600 - 6;
            return Some(sc);
        }
        // The sweep's (2026-12-02, --at-hour seeds 116, 30, 167): a proxy
        // 1.2 s ahead, not yet detected, took shares of the hour's first
        // epochs by a total it read before the other added to it: a slot
        // granted twice.
        "skewed-at-hour" => {
            sc.rules.push(RuleSpec::cluster("skew", 150.0, 2));
            sc.proxies = vec![ProxySpec::new(2); 2];
            sc.proxies[0].skew_ms = 1202;
            for p in 0..2 {
                sc.loads.push(uniform(0, p, 100.0, None));
            }
            sc.start_s = super::scenario::HOUR_S + 3600 - 4;
            sc.duration_ms = 10_000;
        }
        "late-refusals-blips" | "two-rules-blips" => {
            let mut sc = named(name.trim_end_matches("-blips"))?;
            sc.name = name.into();
            for (at_ms, for_ms) in [(4_000, 40), (7_000, 90), (10_000, 140)] {
                sc.faults.push(Fault::Slow {
                    at_ms,
                    for_ms,
                    latency_ms: 80,
                });
            }
            return Some(sc);
        }
        // CI's own (2026-11-30, tests/cluster/test_holds.py): 3 proxies at
        // 100/s (2 s), warmed at 20/s for 3 s, idle 3 s, then 50 at once on
        // each, started a few ms apart: 150 the fleet serves in 1.5 s. One
        // proxy refused 11 at arrival.
        // And CI's (2026-12-01): the same, one proxy refused 24 at
        // arrival. A client's 50 requests come over some milliseconds; an
        // answer that lands among them counted the burst's own demand, and
        // the rest were reckoned as if the fleet asked for the rate or more.
        // Here over 20 ms at 6,000 + 21 ms (`--offset-search` tries others).
        "burst-after-idle" | "burst-after-idle-spread" => {
            let (at, spread_ms) = if name == "burst-after-idle" {
                (6000, 0)
            } else {
                (6021, 20)
            };
            let mut r = RuleSpec::cluster("burst", 100.0, 3);
            r.max_queue_delay_ms = 2000;
            sc.rules.push(r);
            sc.proxies = vec![ProxySpec::new(2); 3];
            for p in 0..3 {
                let mut warm = uniform(0, p, 20.0, None);
                warm.to_ms = 3000;
                sc.loads.push(warm);
                let mut b = uniform(0, p, 0.0, None);
                b.shape = Shape::Burst {
                    n: 50,
                    at_ms: at + p as u64 * 12,
                    spread_ms,
                };
                sc.loads.push(b);
            }
            sc.duration_ms = 9_000;
        }
        // CI's low-rate test on real Envoy (2026-11-30): rules at 2/s and
        // 5/s (one slot every 5 or 2 epochs), max_queue_delay 2 s, three
        // proxies offered twice each rate split 50/30/20; at 5/s the 20%
        // proxy got 3 of 50 releases over 10 s.
        "low-rates" => {
            for (name, rate) in [("low2", 2.0), ("low5", 5.0)] {
                let mut r = RuleSpec::cluster(name, rate, 3);
                r.max_queue_delay_ms = 2000;
                sc.rules.push(r);
            }
            sc.proxies = vec![ProxySpec::new(2); 3];
            for (rule, rate) in [(0, 2.0), (1, 5.0)] {
                for (p, part) in [0.5, 0.3, 0.2].into_iter().enumerate() {
                    sc.loads.push(uniform(rule, p, 2.0 * rate * part, None));
                }
            }
            sc.duration_ms = 14_000;
        }
        // Finding 3: two cluster rules in one Envoy.
        "two-rules" => {
            sc.rules.push(RuleSpec::cluster("alpha", 30.0, 3));
            sc.rules.push(RuleSpec::cluster("beta", 150.0, 3));
            sc.proxies = vec![ProxySpec::new(2); 3];
            for p in 0..3 {
                sc.loads.push(uniform(0, p, 20.0, None));
                sc.loads
                    .push(uniform(1, p, 300.0 * (p as f64 + 1.0) / 6.0, None));
            }
            sc.duration_ms = 14_000;
        }
        "two-rules-7-450" => {
            sc.rules.push(RuleSpec::cluster("alpha", 7.0, 4));
            sc.rules.push(RuleSpec::cluster("beta", 450.0, 4));
            sc.proxies = vec![ProxySpec::new(2); 4];
            for p in 0..4 {
                sc.loads.push(uniform(0, p, 3.5, None));
                sc.loads.push(uniform(1, p, 90.0 * (p as f64 + 1.0), None));
            }
            sc.duration_ms = 14_000;
        }
        // Finding 4: two of four proxies 900 ms behind.
        // The tie with the service's hour 7 s in: until the service's
        // clock was the reference (2026-12-02) the two right proxies
        // followed the two 900 ms behind, and at the hour every call failed
        // for a second (140 released in it, 103.5/s over 15 s).
        "clock-tie-hour" => {
            let mut sc = named("clock-tie")?;
            sc.name = name.into();
            sc.start_s = super::scenario::HOUR_S + 3600 - 7;
            return Some(sc);
        }
        "clock-tie" => {
            sc.rules.push(RuleSpec::cluster("skew", 100.0, 4));
            sc.proxies = vec![ProxySpec::new(2); 4];
            for (p, x) in sc.proxies.iter_mut().enumerate() {
                x.skew_ms = if p >= 2 { -900 } else { 0 };
            }
            for p in 0..4 {
                sc.loads.push(uniform(0, p, 50.0, None));
            }
            sc.duration_ms = 18_000;
        }
        // Finding 5: one request per proxy every 1.3 s, staggered, at 7/s.
        "sporadic" => {
            let mut r = RuleSpec::cluster("orders", 7.0, 4);
            r.max_queue_delay_ms = 3000;
            sc.rules.push(r);
            sc.proxies = vec![ProxySpec::new(2); 4];
            for p in 0..4 {
                let mut l = uniform(0, p, 1.0 / 1.3, None);
                l.shape = Shape::Uniform {
                    per_s: 1.0 / 1.3,
                    phase_ms: p as u64 * 1300 / 4,
                };
                sc.loads.push(l);
            }
            sc.duration_ms = 12_000;
        }
        // Finding 6: a 20% floor in cluster scope while critical exceeds the rate.
        "class-floors" => {
            let mut r = RuleSpec::cluster("orders", 100.0, 3);
            r.classes = vec![("critical".into(), 0.0, 1000), ("batch".into(), 0.2, 3000)];
            sc.rules.push(r);
            sc.proxies = vec![ProxySpec::new(2); 3];
            sc.loads.push(uniform(0, 0, 120.0, Some(0)));
            sc.loads.push(uniform(0, 1, 60.0, Some(1)));
            sc.loads.push(uniform(0, 2, 30.0, Some(0)));
            sc.loads.push(uniform(0, 2, 30.0, Some(1)));
            sc.duration_ms = 14_000;
        }
        // The combination matrix on real Envoy (tests/test_combinations.py):
        // one proxy, 20/s with critical and batch (2 s each), steady batch
        // at a quarter of the rate, then 30 batch at once and, 0.3 s later,
        // 4 critical.
        "class-burst" => {
            let mut r = RuleSpec::cluster("orders", 20.0, 1);
            r.max_queue_delay_ms = 2000;
            r.classes = vec![("critical".into(), 0.0, 2000), ("batch".into(), 0.0, 2000)];
            sc.rules.push(r);
            sc.proxies = vec![ProxySpec::new(2)];
            let mut steady = uniform(0, 0, 5.0, Some(1));
            steady.to_ms = 2000;
            sc.loads.push(steady);
            for (class, n, at_ms) in [(1, 30, 2000), (0, 4, 2300)] {
                let mut l = uniform(0, 0, 0.0, Some(class));
                l.shape = Shape::Burst {
                    n,
                    at_ms,
                    spread_ms: 0,
                };
                sc.loads.push(l);
            }
            sc.duration_ms = 6_000;
        }
        // A proxy joining a running fleet with its clock 1.2 s behind (or
        // 0.7 s ahead): it moves its grid once and gets its share.
        "skewed-joiner" | "skewed-joiner-ahead" => {
            sc.rules.push(RuleSpec::cluster("skew", 100.0, 3));
            sc.proxies = vec![ProxySpec::new(2); 3];
            sc.proxies[2].start_ms = 2000;
            sc.proxies[2].skew_ms = if name == "skewed-joiner" { -1200 } else { 700 };
            for p in 0..3 {
                let mut l = uniform(0, p, 50.0, None);
                l.from_ms = if p == 2 { 2000 } else { 0 };
                sc.loads.push(l);
            }
            sc.duration_ms = 13_000;
        }
        // CI's uneven-load test on real Envoy (300/s over 3 proxies, 60:30:10
        // of 3x the rate) lost 7 slots in one second with the machine busy:
        // each process held up for tens of ms, one, then another, then all.
        "stalls" => {
            sc.rules.push(RuleSpec::cluster("uneven", 300.0, 3));
            sc.proxies = vec![ProxySpec::new(2); 3];
            for (p, share) in [0.6, 0.3, 0.1].into_iter().enumerate() {
                sc.loads.push(uniform(0, p, 900.0 * share, None));
            }
            sc.proxies[0].stalls = vec![(5_000, 40)];
            sc.proxies[1].stalls = vec![(7_020, 60)];
            for p in 0..3 {
                sc.proxies[p].stalls.push((9_010, 50));
            }
            sc.duration_ms = 12_000;
        }
        // A stall of the whole fleet below the catch-up, at two points of
        // the stall search (`with_stall`; CI's stall test on real Envoy: 282
        // of 300 in the second around a 47 ms stop). 50 ms as a call was in
        // flight, whose answer came after the timeout and counted as one
        // (281 in the second, on the code before); 45 ms, after which the
        // calling VM ran first and pruned the grants its line had not taken
        // yet (292).
        "stall-late-answer" => {
            sc = with_stall("stalls", 50, 3_231, None)?;
            sc.name = name.into();
        }
        "stall-prune" => {
            sc = with_stall("stalls", 45, 3_336, None)?;
            sc.name = name.into();
        }
        _ => return None,
    }
    for l in &mut sc.loads {
        l.to_ms = l.to_ms.min(sc.duration_ms);
    }
    let _ = NS_PER_MS;
    Some(sc)
}
