//! The invariants, as predicates over a run's trace ([`Trace`]). Each is
//! stated once here (and in engine/README.md, "Invariants"), with every
//! allowance and its reason; [`check`] returns every violation of a run.
//!
//! Notation: `R` a rule's rate, `b` its burst, `T = 1/R`, `E` its epoch,
//! `N` the proxies with requests of the rule, `J` the longest gap between a
//! VM's ticks (a held request leaves at the first tick after its turn: its
//! release may come up to `J` late, so a window can hold up to `R x J` more
//! releases than the schedule puts in it; a stall of the whole process is
//! such a gap, up to the catch-up, [`crate::rate::CATCH_UP_NS`]).
//!
//! 1. **Rate.** In every window `W` of 100 ms and of 1 s, the releases of a
//!    rule at the upstream are at most, in process scope (per process, and
//!    per key for a keyed rule), `R x (W + J) + b + 1` (GCRA); in cluster scope
//!    (the whole fleet), `R x (W + J + S) + b + 2 + N x (b + 3)`: the grid's
//!    bound, each proxy ahead of its grants by at most `b + 1` and taking
//!    a slot up to two of its own gaps early (two more), and `S` the
//!    spread of the proxies' clocks within `max_clock_skew`. Around an engine
//!    fault (from 1 s before it to 3 s after it ends), the fleet's releases
//!    over that episode exceed the rate by at most `R x (fallback_after + E)
//!    + b + N x (b + 1) + R x J`.
//! 2. **Early refusal.** A request is refused only at arrival, never after it
//!    was held, except a request of a lower priority class displaced by a
//!    higher class that arrived while it waited (the classes' design: counted
//!    `displaced`), and a request waiting for a concurrency slot (the gate
//!    cannot know when requests in flight end). In cluster scope a turn is
//!    reckoned from the share the proxy expects, so three spans are exempt
//!    where that expectation cannot be known: a proxy's first `(k + 2) E`
//!    (no share of its own computed yet: turns come from the even split
//!    `R / max(N, expected_replicas)`, and a busier, uneven fleet grants
//!    less), an engine fault episode (as in 1) in which the proxy fell back
//!    or Redis lost its counters (a blip shorter than `fallback_after` is
//!    not exempt: the shares it cost are forgiven at the deadline,
//!    [`crate::cluster::forgive`]), and, with clocks apart, until
//!    2 s after the fleet found them (as in 1: shares claimed on another
//!    proxy's epochs come to nothing). And every rule's counters
//!    keep `queued = released + cancelled + gone + timed_out + held` plus the
//!    late refusals allowed here.
//! 3. **Within the rate, no wait.** While the fleet asks for at most 80% of
//!    the rate (over the 2 s before a request and the second after), a
//!    request that an ideal limiter of the fleet's rate would let go at once
//!    (one GCRA at `R` with burst `N x (b + 1) - 1` over the fleet's requests
//!    of the rule), and its proxy's own would too, waits at most `J + 5 ms`
//!    plus, in cluster scope, its proxy's slot gap (the grid's slots are
//!    fixed instants: one arriving between two waits for the next), at
//!    most `E / LANES` (3 ms with 32 lanes).
//!    The proxy's own limiter is a GCRA with burst `b` at its demand of the
//!    last 2 s plus an even part of what the fleet left of the rate (`d +
//!    (R - A) / N`, `N` the proxies with demand then, itself included): in
//!    cluster scope a proxy holds its shares and its part of the spare, and
//!    more only by claiming it (an epoch or more); in process scope it would
//!    be `R`. Not in a proxy's first `(k + 2) E + 2 s` (its shares and its
//!    part of the spare are claimed from demand measured after the first
//!    second of answers) nor around engine faults.
//! 4. **Shares.** Over every 5 s after the first 3 s of a cluster rule whose
//!    fleet is offered more than its rate, each proxy is admitted at least
//!    85% of `min(its demand, R x its demand / the fleet's demand)` (its
//!    demand: the requests that its own limiter at the full rate would send
//!    within `max_queue_delay` and its clients' patience), less
//!    two requests, less half a second of that share for each start or
//!    stop of a load of the rule in the window or the second before it
//!    (shares are claimed `k` epochs ahead from the demand of the last few:
//!    what a proxy that stopped claimed goes unused); no proxy with demand
//!    gets nothing.
//! 5. **Rules are independent** ([`independent`], two more runs): without
//!    the other rules' requests, a rule's releases change by at most 2% (and
//!    3 requests) in all and on any proxy 10% (and 3, and `2 sqrt(2 n)` of
//!    its count `n`: its part moves with the order of the proxies' claims in
//!    each epoch, a random walk), or twice what they change by when that
//!    rule alone runs again with its ticks and calls timed a little
//!    differently.
//! 6. **Class floors.** Once a rule with classes is saturated, a class with a
//!    floor whose requests keep waiting gets at least its floor in every
//!    1 s window, less one request.
//! 7. **Clocks.** A proxy's grid moves at most once per skew event (its
//!    initial skew, each step of its clock).
//! 8. **Soundness of the run.** No grid slot is granted twice (unless Redis
//!    restarted and lost the counters); no cell but a
//!    key table's slot is written without a compare-and-swap token after
//!    configure; every slot the store saw taken is matched to a request.
//! 9. **Throughput.** While a cluster rule's fleet is offered at least 1.3 x
//!    its rate in each of the last 3 s, with no load starting or stopping,
//!    no engine fault and the clocks within `max_clock_skew`, each 1 s window
//!    holds at least `R x (1 s - J - S) - 2` releases: a saturated fleet
//!    uses its slots (a window's edges move by a tick's lateness and the
//!    clocks' spread). Not for rules with a key quota (each key's quota
//!    caps them) or below 20/s.
//! 10. **No needless refusal.** While the fleet asks for at most 80% of the
//!     rate (as in 3), a request of a cluster rule without classes or key
//!     quota is not refused at arrival if two ideal limiters, each holding
//!     every request, would both release it within `3/4 x (max_queue_delay -
//!     margin) - E`, and not at once (that is 3's, which counts a refusal as
//!     a wait): the fleet's of 3, and its proxy's own at its part of the rate
//!     (its part of the fleet's requests over the 2 s before and the second
//!     after, at least an even split over the proxies with requests then),
//!     with burst `b`. The filter reckons a turn at 3/4 of its expected
//!     share within `max_queue_delay` less its margin (an epoch, or its slot
//!     gap if longer), and a claim's slots lie anywhere in their epoch. Not
//!     in a proxy's first `(k + 2) E` and 2 s (as 3), nor around faults and
//!     stalls.

use std::collections::{BTreeMap, HashMap};

use crate::clock::{NS_PER_MS, NS_PER_S};
use crate::cluster::caller::SETTLING_NS;
use crate::cluster::grid::Grid;
use crate::stats::{ClassStat, Stat};

use super::fleet::Trace;
use super::process::End;
use super::scenario::{Fault, RuleSpec, Shape};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

fn v(invariant: &'static str, detail: String) -> Violation {
    Violation { invariant, detail }
}

/// Most items in any window of `w` ns over sorted `times`, and where it starts.
pub fn busiest(times: &[u64], w: u64) -> (usize, u64) {
    let mut best = (0, 0);
    let mut lo = 0;
    for (hi, &t) in times.iter().enumerate() {
        while times.get(lo).is_some_and(|&x| x + w <= t) {
            lo += 1;
        }
        if hi + 1 - lo > best.0 {
            best = (hi + 1 - lo, times.get(lo).copied().unwrap_or(t));
        }
    }
    best
}

/// What the checks need of a rule.
struct RuleView<'a> {
    index: usize,
    spec: &'a RuleSpec,
    rate: f64,
    interval_ns: u64,
    epoch_ns: u64,
}

impl<'a> RuleView<'a> {
    fn new(index: usize, spec: &'a RuleSpec) -> RuleView<'a> {
        let interval_ns = spec.interval_ns();
        RuleView {
            index,
            spec,
            rate: NS_PER_S as f64 / interval_ns as f64,
            interval_ns,
            epoch_ns: Grid::new(interval_ns).epoch_ns,
        }
    }
}

/// The facts of a run every check uses.
struct Facts<'a> {
    t: &'a Trace,
    /// The longest tick gap, ns.
    jitter_ns: u64,
    /// The longest stall of a process, ns (process scope catches up all of it).
    stall_ns: u64,
    /// Engine fault episodes, true ns.
    faults: Vec<(u64, u64)>,
    /// Of those, blips: calls timing out for less than `fallback_after`.
    blips: Vec<(u64, u64)>,
    /// Of those, the episodes in which Redis lost its counters.
    lost: Vec<(u64, u64)>,
    /// When each proxy's rules fell back (its log says so), true ns.
    fell_back: Vec<Vec<u64>>,
    /// Whether any proxy's clock is off by more than max_clock_skew, or steps.
    clocks_apart: bool,
    /// The spread of the clocks within max_clock_skew, ns.
    skew_spread_ns: u64,
    /// When a proxy's grid moved (its clock found apart from the fleet's), true ns.
    moves: Vec<u64>,
    start: u64,
    end: u64,
}

impl<'a> Facts<'a> {
    fn new(t: &'a Trace) -> Facts<'a> {
        let sc = &t.scenario;
        // A stall of a process makes its next tick late by the stall and
        // up to a tick gap (the last tick before it): in cluster scope up
        // to the catch-up its slots leave at once after it (beyond, they
        // are forfeited); in process scope every held request keeps its
        // turn and leaves then.
        let stall_ns = sc
            .proxies
            .iter()
            .flat_map(|p| p.stalls.iter().map(|s| s.1 * NS_PER_MS))
            .max()
            .unwrap_or(0);
        let jitter_ns = sc.tick_ms.1.max(sc.tick_ms.0) * NS_PER_MS;
        // The episodes (true ns) of the faults `which` picks.
        let spans = |which: &dyn Fn(&Fault) -> bool| -> Vec<(u64, u64)> {
            sc.faults
                .iter()
                .filter(|f| which(f))
                .map(|f| {
                    let (a, b) = f.span_ms();
                    (sc.at(a), sc.at(b))
                })
                .collect()
        };
        let faults = spans(&|_| true);
        let blips =
            spans(&|f| matches!(f, Fault::Slow { for_ms, .. } if *for_ms < sc.fallback_after_ms));
        let lost = spans(&|f| matches!(f, Fault::RedisRestart { .. }));
        let fell_back = t
            .processes
            .iter()
            .map(|p| {
                p.log
                    .iter()
                    .filter(|(_, l)| l.contains("on_engine_failure fallback"))
                    .map(|(at, _)| *at)
                    .collect()
            })
            .collect();
        let skews: Vec<i64> = sc.proxies.iter().map(|p| p.skew_ms).collect();
        let lo = skews.iter().copied().min().unwrap_or(0);
        let hi = skews.iter().copied().max().unwrap_or(0);
        let spread_ms = hi.saturating_sub(lo).unsigned_abs();
        let clocks_apart =
            spread_ms > sc.max_clock_skew_ms || sc.proxies.iter().any(|p| !p.steps.is_empty());
        Facts {
            t,
            jitter_ns,
            stall_ns,
            faults,
            blips,
            lost,
            fell_back,
            clocks_apart,
            skew_spread_ns: if clocks_apart {
                0
            } else {
                spread_ms * NS_PER_MS
            },
            moves: t
                .processes
                .iter()
                .flat_map(|p| p.log.iter())
                .filter(|(_, l)| l.contains("clock is about"))
                .map(|(at, _)| *at)
                .collect(),
            start: sc.start_ns(),
            end: t.end,
        }
    }

    /// Whether a proxy's grid moved in `[a, b)` while the clocks are apart:
    /// its owned slots then lie a whole offset later or earlier, and the
    /// shares it claimed twice or not at all move the others' too.
    fn moved(&self, a: u64, b: u64) -> bool {
        self.clocks_apart && self.moves.iter().any(|&m| m >= a && m < b)
    }

    /// Whether `[a, b)` touches an engine fault episode (from 1 s before
    /// it to 3 s after it ends): for the rate's windows.
    fn disturbed(&self, a: u64, b: u64) -> bool {
        self.faults
            .iter()
            .any(|&(fa, fb)| b > fa.saturating_sub(NS_PER_S) && a < fb + 3 * NS_PER_S)
    }

    /// As `disturbed`, but a blip only from its start to 1 s after its end
    /// (the shares it cost are for epochs up to `(k + lag + 2) E` = 700 ms
    /// after it): for what the fleet gives (no wait, shares, throughput,
    /// floors). Until 2026-11-30 blips were not drawn.
    fn shaken(&self, a: u64, b: u64) -> bool {
        self.faults.iter().any(|&(fa, fb)| {
            if self.blips.contains(&(fa, fb)) {
                b > fa && a < fb + NS_PER_S
            } else {
                b > fa.saturating_sub(NS_PER_S) && a < fb + 3 * NS_PER_S
            }
        })
    }

    /// Whether `[a, b)` touches an engine fault episode (as `disturbed`)
    /// in which proxy `p` fell back or Redis lost its counters. A blip, a
    /// few calls failing for less than `fallback_after`, is not one: the
    /// grants it cost are forgiven at the deadline.
    fn fell_back(&self, p: usize, a: u64, b: u64) -> bool {
        let near =
            |&&(fa, fb): &&(u64, u64)| b > fa.saturating_sub(NS_PER_S) && a < fb + 3 * NS_PER_S;
        let when = self.fell_back.get(p).map_or(&[][..], Vec::as_slice);
        self.lost.iter().any(|x| near(&x))
            || self.faults.iter().filter(near).any(|&(fa, fb)| {
                when.iter()
                    .any(|&t| t >= fa.saturating_sub(NS_PER_S) && t < fb + 3 * NS_PER_S)
            })
    }

    fn releases(&self, rule: usize, filter: impl Fn(usize, Option<u32>) -> bool) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .t
            .records
            .iter()
            .filter(|r| r.rule == rule && filter(r.proxy, r.key))
            .filter_map(|r| match r.end {
                End::Released { at, .. } => Some(at),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Until when proxy `p` has no share of its own computed: `(k + 2)`
    /// epochs from its start (`k` the epochs shares are claimed ahead).
    fn startup_until(&self, p: usize) -> u64 {
        let sc = &self.t.scenario;
        let e = crate::cluster::grid::EPOCH_NS;
        let k = crate::cluster::caller::ahead_epochs(
            e,
            sc.timeout_ms * NS_PER_MS,
            sc.max_clock_skew_ms * NS_PER_MS,
        );
        let start = sc.proxies.get(p).map_or(0, |x| x.start_ms);
        sc.at(start) + (k + 2) * e
    }

    /// Proxies with requests of rule `rule`.
    fn proxies_of(&self, rule: usize) -> usize {
        let mut seen: Vec<usize> = self
            .t
            .records
            .iter()
            .filter(|r| r.rule == rule)
            .map(|r| r.proxy)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

/// Every violation of one run.
pub fn check(t: &Trace) -> Vec<Violation> {
    let f = Facts::new(t);
    let mut out = Vec::new();
    for (i, spec) in t.scenario.rules.iter().enumerate() {
        let r = RuleView::new(i, spec);
        rate(&f, &r, &mut out);
        early_refusal(&f, &r, &mut out);
        if spec.cluster {
            no_wait(&f, &r, &mut out);
            if spec.classes.is_empty() {
                // Classes share by class, not by proxy.
                shares(&f, &r, &mut out);
            }
            throughput(&f, &r, &mut out);
        }
        floors(&f, &r, &mut out);
    }
    clocks(&f, &mut out);
    soundness(&f, &mut out);
    out
}

fn rate(f: &Facts<'_>, r: &RuleView<'_>, out: &mut Vec<Violation>) {
    let sc = &f.t.scenario;
    let b = r.spec.burst as f64;
    // A stall makes a tick late by its length: in cluster scope the slots
    // due meanwhile leave after it up to the catch-up (older ones are
    // forfeited); in process scope held requests keep their turns through
    // a stall of any length.
    let stall = if r.spec.cluster {
        f.stall_ns.min(crate::rate::CATCH_UP_NS)
    } else {
        f.stall_ns
    };
    let j = (f.jitter_ns + stall) as f64 / 1e9;
    let name = &r.spec.name;
    if !r.spec.cluster {
        // Per process (and per key of a keyed rule without a quota).
        for p in 0..sc.proxies.len() {
            let groups: Vec<Option<u32>> =
                if r.spec.keyed.is_some() && r.spec.key_quota_per_s.is_none() {
                    let mut keys: Vec<Option<u32>> =
                        f.t.records
                            .iter()
                            .filter(|x| x.rule == r.index && x.proxy == p)
                            .map(|x| x.key)
                            .collect();
                    keys.sort_unstable();
                    keys.dedup();
                    keys
                } else {
                    vec![None]
                };
            for k in groups {
                let times = f.releases(r.index, |proxy, key| {
                    proxy == p && (k.is_none() || key == k)
                });
                for w in [100 * NS_PER_MS, NS_PER_S] {
                    let bound = (r.rate * (w as f64 / 1e9 + j) + b + 1.0).floor() as usize;
                    let (n, at) = busiest(&times, w);
                    if n > bound {
                        out.push(v("rate", format!(
                            "rule {name} (process scope) proxy {p}{}: {n} releases in {} ms from {:.3} s, bound {bound}",
                            k.map(|k| format!(" key {k}")).unwrap_or_default(),
                            w / NS_PER_MS,
                            (at - f.start) as f64 / 1e9
                        )));
                    }
                }
            }
        }
        return;
    }
    let n = f.proxies_of(r.index) as f64;
    let s = f.skew_spread_ns as f64 / 1e9;
    let times = f.releases(r.index, |_, _| true);
    // Each proxy ahead of its grants by at most `b + 1` (credit), and a
    // slot taken up to two of its own gaps before its time: two more.
    let ahead = n * (b + 3.0);
    for w in [100 * NS_PER_MS, NS_PER_S] {
        let bound = (r.rate * (w as f64 / 1e9 + j + s) + b + 2.0 + ahead).floor() as usize;
        // Windows away from faults and (with clocks apart) after the fleet
        // found them: a window is judged if it is undisturbed.
        let mut lo = 0;
        for (hi, &t) in times.iter().enumerate() {
            while times.get(lo).is_some_and(|&x| x + w <= t) {
                lo += 1;
            }
            let count = hi + 1 - lo;
            let from = times.get(lo).copied().unwrap_or(t);
            if count > bound && !f.disturbed(from, t) && !clock_settling(f, t) {
                out.push(v("rate", format!(
                    "rule {name} (cluster, {n} proxies): {count} releases in {} ms from {:.3} s, bound {bound}",
                    w / NS_PER_MS,
                    (from - f.start) as f64 / 1e9
                )));
                break;
            }
        }
    }
    // The fault bound over each episode.
    let fb = sc.fallback_after_ms as f64 / 1e3;
    let e = r.epoch_ns as f64 / 1e9;
    if r.spec.on_failure == "local_full" {
        return; // documented: up to R x F more while F proxies fail
    }
    for &(a, bnd) in &f.faults {
        let from = a.saturating_sub(NS_PER_S);
        let to = (bnd + 3 * NS_PER_S).min(f.end);
        if to <= from {
            continue;
        }
        let count = times.iter().filter(|&&x| x >= from && x < to).count();
        let len = (to - from) as f64 / 1e9;
        let allowed = (r.rate * (len + fb + e + j) + b + ahead).floor() as usize;
        if count > allowed {
            out.push(v("rate", format!(
                "rule {name}: {count} releases over the fault episode [{:.1}, {:.1}) s, bound {allowed} (R x (len + fallback_after + E + J) + b + N(b+1))",
                (from - f.start) as f64 / 1e9,
                (to - f.start) as f64 / 1e9
            )));
        }
    }
}

/// With clocks apart: before 2 s after the last skew event the fleet could
/// find (and, if the probes paused for the hour before they found it, 2 s
/// after they could find it past the pause).
fn clock_settling(f: &Facts<'_>, t: u64) -> bool {
    if !f.clocks_apart {
        return false;
    }
    let sc = &f.t.scenario;
    // A skew is found within two sweeps of the probes (~1 s each), then 2 s.
    let last_event = sc
        .proxies
        .iter()
        .flat_map(|p| p.steps.iter().map(|s| s.0))
        .chain([0])
        .max()
        .unwrap_or(0);
    let settled = last_event + 2_000 + 2_000;
    // The probes pause within their reach either side of the service's
    // hour (their counters would cross it, [`crate::cluster::grid::Grid::may_claim`]):
    // a skew not found before that pause is found after it.
    let reach = crate::cluster::skew::REACH_NS / NS_PER_MS;
    let into = sc.start_s % 3600;
    let settled = match (3600 - into) * 1000 {
        hour if into > 0 && hour < settled + reach && hour + reach > last_event => {
            settled.max(hour + reach + 2_000 + 2_000)
        }
        _ => settled,
    };
    t < sc.at(settled)
}

fn early_refusal(f: &Facts<'_>, r: &RuleView<'_>, out: &mut Vec<Violation>) {
    let name = &r.spec.name;
    let mut late = 0;
    let mut first: Option<String> = None;
    for x in f.t.records.iter().filter(|x| x.rule == r.index) {
        let End::Refused {
            at,
            held: true,
            displaced,
        } = x.end
        else {
            continue;
        };
        // With clocks apart, requests held when a grid moves, or arriving
        // within 2 s of it, are not counted: the move is the detection, and
        // the invariant holds from 2 s after it (as the rate's does).
        if r.spec.cluster
            && (f.fell_back(x.proxy, x.arrived, at)
                || clock_settling(f, x.arrived)
                || f.moved(x.arrived.saturating_sub(2 * NS_PER_S), at)
                || x.arrived < f.startup_until(x.proxy))
        {
            continue;
        }
        if displaced {
            let c = x.class.unwrap_or(0);
            let higher_came = c > 0
                && f.t.records.iter().any(|y| {
                    y.rule == r.index
                        && y.class.is_some_and(|yc| yc < c)
                        && y.arrived > x.arrived
                        && y.arrived <= at
                });
            if higher_came {
                continue;
            }
        }
        late += 1;
        first.get_or_insert_with(|| {
            format!(
                "proxy {} class {:?} arrived {:.3} s, refused after {:.0} ms",
                x.proxy,
                x.class,
                (x.arrived - f.start) as f64 / 1e9,
                (at - x.arrived) as f64 / 1e6
            )
        });
    }
    if late > 0 {
        out.push(v(
            "early_refusal",
            format!(
                "rule {name}: {late} requests refused after they were held (first: {})",
                first.unwrap_or_default()
            ),
        ));
    }
    // The counters, per process: queued = released + cancelled + gone +
    // timed_out + held + the late refusals (each counted as it happened).
    for (p, proc_) in f.t.processes.iter().enumerate() {
        let st = |s: Stat| proc_.total(r.index, s);
        let late_here =
            f.t.records
                .iter()
                .filter(|x| x.rule == r.index && x.proxy == p)
                .filter(|x| matches!(x.end, End::Refused { held: true, .. }))
                .count() as i64;
        let rhs = st(Stat::Released)
            + st(Stat::Cancelled)
            + st(Stat::Gone)
            + st(Stat::TimedOut)
            + st(Stat::Held);
        if st(Stat::Queued) != rhs + late_here {
            out.push(v("early_refusal", format!(
                "rule {name} proxy {p}: queued {} != released {} + cancelled {} + gone {} + timed_out {} + held {} + late refusals {late_here}",
                st(Stat::Queued), st(Stat::Released), st(Stat::Cancelled), st(Stat::Gone), st(Stat::TimedOut), st(Stat::Held)
            )));
        }
    }
}

/// The wait an ideal GCRA at `interval_ns` with burst `burst` gives each of
/// `arrivals` (sorted), by index.
fn gcra_waits(arrivals: &[u64], interval_ns: u64, burst: u64) -> Vec<u64> {
    let tau = burst.saturating_mul(interval_ns);
    let mut tat = 0u64;
    arrivals
        .iter()
        .map(|&a| {
            let t = tat.max(a);
            let release = t.saturating_sub(tau).max(a);
            tat = t + interval_ns;
            release - a
        })
        .collect()
}

fn no_wait(f: &Facts<'_>, r: &RuleView<'_>, out: &mut Vec<Violation>) {
    let sc = &f.t.scenario;
    if f.clocks_apart {
        return;
    }
    let n = f.proxies_of(r.index) as u64;
    let b = r.spec.burst;
    let mut fleet: Vec<(u64, usize)> =
        f.t.records
            .iter()
            .enumerate()
            .filter(|(_, x)| x.rule == r.index)
            .map(|(i, x)| (x.arrived, i))
            .collect();
    fleet.sort_unstable();
    let times: Vec<u64> = fleet.iter().map(|x| x.0).collect();
    let fleet_waits = gcra_waits(&times, r.interval_ns, n * (b + 1) - 1);
    let mut fleet_wait: HashMap<usize, u64> = HashMap::new();
    for ((_, i), w) in fleet.iter().zip(fleet_waits) {
        fleet_wait.insert(*i, w);
    }
    // Demand over the 2 s before `at`: the fleet's, and who had some
    // (counted at 10 ms steps: a proxy's own by binary search).
    const LOOK: u64 = 2 * NS_PER_S;
    const STEP: u64 = 10 * NS_PER_MS;
    let by_proxy: Vec<Vec<u64>> = (0..sc.proxies.len())
        .map(|p| {
            fleet
                .iter()
                .filter(|&&(_, i)| f.t.records.get(i).is_some_and(|x| x.proxy == p))
                .map(|&(t, _)| t)
                .collect()
        })
        .collect();
    let window = |at: u64| (at.saturating_sub(LOOK).max(f.start), at);
    let count = |v: &[u64], (from, to): (u64, u64)| {
        v.partition_point(|&x| x < to) - v.partition_point(|&x| x < from)
    };
    let mut fleet_at: HashMap<u64, (f64, usize)> = HashMap::new();
    let mut fleet_now = |at: u64| {
        let step = at / STEP;
        *fleet_at.entry(step).or_insert_with(|| {
            let w = window(step * STEP);
            let all = count(&times, w);
            let members = by_proxy.iter().filter(|v| count(v, w) > 0).count();
            (all as f64, members)
        })
    };
    // The proxy's own limiter: its demand of the last 2 s plus an even part
    // of what the fleet left of the rate (what its shares and its part of
    // the spare give it), with burst `b`.
    let mut proc_wait: HashMap<usize, u64> = HashMap::new();
    let mut own_gap: HashMap<usize, u64> = HashMap::new();
    for (p, mine_t) in by_proxy.iter().enumerate() {
        let mine: Vec<(u64, usize)> = fleet
            .iter()
            .copied()
            .filter(|&(_, i)| f.t.records.get(i).is_some_and(|x| x.proxy == p))
            .collect();
        let mut tat = 0f64;
        for &(a, i) in &mine {
            let w = window((a / STEP) * STEP);
            let span = (w.1 - w.0).max(NS_PER_MS) as f64 / 1e9;
            let (all, members) = fleet_now(a);
            let own_n = count(mine_t, w);
            let members = (members + usize::from(own_n == 0)) as f64;
            let (all, own) = (all / span, own_n as f64 / span);
            let rate_p = (own + (r.rate - all).max(0.0) / members).max(1e-3);
            let interval = 1e9 / rate_p;
            let at = a as f64;
            let t = tat.max(at);
            let release = (t - b as f64 * interval).max(at);
            tat = t + interval;
            proc_wait.insert(i, (release - at).max(0.0) as u64);
            own_gap.insert(i, interval as u64);
        }
    }
    // The fleet clearly below the rate: at most 80% of it over the 2 s
    // before the request and the second after (within the run): a lull, not
    // the first instants of a rush, nor a fleet at its rate whose requests
    // come a little unevenly.
    let below = |at: u64| {
        let (from, to) = (
            at.saturating_sub(LOOK).max(f.start),
            (at + NS_PER_S).min(f.end),
        );
        let lo = times.partition_point(|&x| x < from);
        let hi = times.partition_point(|&x| x < to);
        ((hi - lo) as f64) <= 0.8 * r.rate * to.saturating_sub(from) as f64 / 1e9
    };
    let base = f.jitter_ns + 5 * NS_PER_MS;
    let block = r.epoch_ns / crate::cluster::grid::LANES;
    let mut waited = 0;
    let mut worst = (0u64, String::new());
    for (i, x) in f.t.records.iter().enumerate() {
        if x.rule != r.index
            || fleet_wait.get(&i).is_none_or(|&w| w > 0)
            || proc_wait.get(&i).is_none_or(|&w| w > 0)
        {
            continue;
        }
        if f.shaken(x.arrived, x.arrived)
            || !below(x.arrived)
            || x.arrived < f.startup_until(x.proxy) + SETTLING_NS + NS_PER_S
        {
            continue;
        }
        // The grid's slots are fixed instants: a request arriving between
        // two of its proxy's waits for the next (at most its own gap, and
        // the slots of a claim are spread over the epoch's lanes).
        let allowance = base + own_gap.get(&i).copied().unwrap_or(0).min(block);
        let wait = match x.end {
            End::Released { at, .. } => at - x.arrived,
            End::Refused { at, .. } => (at - x.arrived).max(allowance + 1),
            _ => continue,
        };
        if wait > allowance {
            waited += 1;
            if wait > worst.0 {
                worst = (
                    wait,
                    format!(
                        "proxy {} at {:.3} s",
                        x.proxy,
                        (x.arrived - f.start) as f64 / 1e9
                    ),
                );
            }
        }
    }
    needless_refusal(f, r, &fleet, &fleet_wait, &by_proxy, &below, out);
    if waited > 0 {
        out.push(v("no_wait", format!(
            "rule {}: {waited} requests within the fleet's rate waited over {} ms and their proxy's slot gap (worst {:.0} ms: {})",
            r.spec.name,
            base / NS_PER_MS,
            worst.0 as f64 / 1e6,
            worst.1
        )));
    }
}

/// Invariant 10 (see the module docs): in cluster scope, a request refused
/// at arrival that the ideal limiters would release well within
/// `max_queue_delay` is refused needlessly. `fleet` (arrival, record index)
/// sorted, `fleet_wait` each one's wait at the fleet's ideal limiter (by
/// record index), `by_proxy` each proxy's arrivals, sorted.
fn needless_refusal(
    f: &Facts<'_>,
    r: &RuleView<'_>,
    fleet: &[(u64, usize)],
    fleet_wait: &HashMap<usize, u64>,
    by_proxy: &[Vec<u64>],
    below: &dyn Fn(u64) -> bool,
    out: &mut Vec<Violation>,
) {
    // Classes order by class (a lower one waits behind a higher one), and
    // a key quota refuses on its own: neither is a fleet FIFO.
    if !r.spec.classes.is_empty() || r.spec.key_quota_per_s.is_some() {
        return;
    }
    let mqd = r.spec.max_queue_delay_ms * NS_PER_MS;
    let b = r.spec.burst as f64;
    // The proxy's part of the rate around `at` (2 s before, 1 s after):
    // its part of the fleet's demand, at least an even split over the
    // proxies with demand (a proxy that bursts beside others gets its part).
    let span = |at: u64| {
        (
            at.saturating_sub(2 * NS_PER_S).max(f.start),
            (at + NS_PER_S).min(f.end),
        )
    };
    let count = |v: &[u64], (from, to): (u64, u64)| {
        v.partition_point(|&x| x < to) - v.partition_point(|&x| x < from)
    };
    // One pass over the fleet's requests in order, a GCRA per proxy.
    let mut tat = vec![0f64; by_proxy.len()];
    let mut own_wait: HashMap<usize, (u64, u64)> = HashMap::new();
    for &(a, i) in fleet {
        let Some(p) = f.t.records.get(i).map(|x| x.proxy) else {
            continue;
        };
        let (Some(mine), Some(tat)) = (by_proxy.get(p), tat.get_mut(p)) else {
            continue;
        };
        let w = span(a);
        let all: usize = by_proxy.iter().map(|v| count(v, w)).sum();
        let members = by_proxy.iter().filter(|v| count(v, w) > 0).count().max(1);
        let part = (count(mine, w) as f64 / all.max(1) as f64).max(1.0 / members as f64);
        let interval = 1e9 / (r.rate * part).max(1e-3);
        let at = a as f64;
        let t = tat.max(at);
        let release = (t - b * interval).max(at);
        *tat = t + interval;
        own_wait.insert(i, ((release - at) as u64, interval as u64));
    }
    let mut needless = 0;
    let mut first = None;
    for (i, x) in f.t.records.iter().enumerate() {
        let End::Refused { held: false, .. } = x.end else {
            continue;
        };
        if x.rule != r.index
            || f.shaken(x.arrived, x.arrived)
            || !below(x.arrived)
            || x.arrived < f.startup_until(x.proxy) + SETTLING_NS + NS_PER_S
        {
            continue;
        }
        let Some(&(own, gap)) = own_wait.get(&i) else {
            continue;
        };
        // What the filter reckons: a turn at 3/4 of its expected share
        // (`cluster::DERATE`) within max_queue_delay less its margin (an
        // epoch, or its slot gap if longer), less an epoch for the grants'
        // granularity (a claim's slots lie anywhere in its epoch).
        let within = mqd.saturating_sub(r.epoch_ns.max(gap)) / 4 * 3;
        let within = within.saturating_sub(r.epoch_ns);
        let wait = own.max(fleet_wait.get(&i).copied().unwrap_or(u64::MAX));
        // A wait of 0 is invariant 3's (it counts a refusal as a wait).
        if wait > 0 && wait <= within {
            needless += 1;
            first.get_or_insert_with(|| {
                format!(
                    "proxy {} at {:.3} s, ideal wait {:.0} ms, within {:.0} ms",
                    x.proxy,
                    (x.arrived - f.start) as f64 / 1e9,
                    wait as f64 / 1e6,
                    within as f64 / 1e6
                )
            });
        }
    }
    if needless > 0 {
        out.push(v(
            "needless_refusal",
            format!(
                "rule {}: {needless} requests refused at arrival that the fleet's rate would hold well within max_queue_delay (first: {})",
                r.spec.name,
                first.unwrap_or_default()
            ),
        ));
    }
}

fn shares(f: &Facts<'_>, r: &RuleView<'_>, out: &mut Vec<Violation>) {
    let sc = &f.t.scenario;
    if f.clocks_apart {
        return;
    }
    // Per proxy: the requests a GCRA at the full rate, burst `b`, holding
    // each up to max_queue_delay (and its client's patience), would send;
    // all of them at a proxy whose loads are steady (no burst, no client
    // giving up): there the engine weighs every request it sees, so a
    // proxy offered more than the rate alone still claims in proportion.
    let mut servable: HashMap<usize, bool> = HashMap::new();
    for p in 0..sc.proxies.len() {
        let mine_loads = || {
            sc.loads
                .iter()
                .filter(|l| l.rule == r.index && l.proxy == p)
        };
        let steady = mine_loads()
            .all(|l| l.client_timeout_ms.is_none() && !matches!(l.shape, Shape::Burst { .. }));
        if steady {
            continue;
        }
        let patience = mine_loads()
            .filter_map(|l| l.client_timeout_ms)
            .min()
            .unwrap_or(u64::MAX)
            .min(r.spec.max_queue_delay_ms)
            .saturating_mul(NS_PER_MS);
        let mut mine: Vec<(u64, usize)> =
            f.t.records
                .iter()
                .enumerate()
                .filter(|(_, x)| x.rule == r.index && x.proxy == p)
                .map(|(i, x)| (x.arrived, i))
                .collect();
        mine.sort_unstable();
        let tau = r.spec.burst.saturating_mul(r.interval_ns);
        let mut tat = 0u64;
        for (at, i) in mine {
            let t = tat.max(at);
            let wait = t.saturating_sub(tau).max(at) - at;
            let ok = wait <= patience;
            if ok {
                tat = t + r.interval_ns;
            }
            servable.insert(i, ok);
        }
    }
    let w = 5 * NS_PER_S;
    let mut a = f.start + 3 * NS_PER_S;
    while a + w <= f.end {
        let b = a + w;
        if f.shaken(a, b) {
            a = b;
            continue;
        }
        let mut demand: BTreeMap<usize, u64> = BTreeMap::new();
        let mut admitted: BTreeMap<usize, u64> = BTreeMap::new();
        for (i, x) in f.t.records.iter().enumerate() {
            if x.rule != r.index || x.arrived < a || x.arrived >= b {
                continue;
            }
            // Demand that a limiter could serve at all: what the proxy's own
            // limiter at the full rate would send within its wait.
            if servable.get(&i).copied().unwrap_or(true) {
                *demand.entry(x.proxy).or_default() += 1;
            }
            if matches!(x.end, End::Released { .. }) {
                *admitted.entry(x.proxy).or_default() += 1;
            }
        }
        let total: u64 = demand.values().sum();
        let cap = r.rate * 5.0;
        // Each start or stop of a proxy's load (in the window or the second
        // before it) costs up to half a second of each proxy's share: shares
        // are claimed k epochs ahead from demand measured over the last few
        // epochs, and a slot claimed by a proxy that stopped goes unused.
        let changes = load_changes(sc, r.index)
            .filter(|&t| t + NS_PER_S >= a && t < b)
            .count() as f64;
        if (total as f64) > cap * 1.05 {
            for (&p, &d) in &demand {
                let fair = (d as f64).min(cap * d as f64 / total as f64);
                let got = admitted.get(&p).copied().unwrap_or(0) as f64;
                if got < 0.85 * fair - 2.0 - fair * 0.1 * changes {
                    out.push(v("shares", format!(
                        "rule {} [{:.0}, {:.0}) s: proxy {p} admitted {got} of demand {d}, its share {fair:.1} (fleet demand {total}, rate x 5 s {cap:.0}){}",
                        r.spec.name,
                        (a - f.start) as f64 / 1e9,
                        (b - f.start) as f64 / 1e9,
                        if sc.rules.len() > 1 { format!(", {} rules", sc.rules.len()) } else { String::new() }
                    )));
                    break;
                }
            }
        }
        a = b;
    }
}

/// When the loads of rule `rule` start, stop or burst within the run (true
/// ns; a load's start at 0 and end at the run's end are no change).
fn load_changes(sc: &super::Scenario, rule: usize) -> impl Iterator<Item = u64> + '_ {
    sc.loads
        .iter()
        .filter(move |l| l.rule == rule)
        .flat_map(|l| match l.shape {
            Shape::Burst { at_ms, .. } => vec![at_ms],
            _ => vec![l.from_ms, l.to_ms],
        })
        .filter(|&ms| ms > 0 && ms < sc.duration_ms)
        .map(|ms| sc.at(ms))
}

/// Whether every load of rule `rule` runs unchanged over `[a, b)`.
fn steady(sc: &super::Scenario, rule: usize, a: u64, b: u64) -> bool {
    load_changes(sc, rule).all(|t| t < a || t >= b)
}

fn throughput(f: &Facts<'_>, r: &RuleView<'_>, out: &mut Vec<Violation>) {
    let sc = &f.t.scenario;
    if f.clocks_apart || r.spec.key_quota_per_s.is_some() || r.rate < 20.0 {
        return;
    }
    let j = f.jitter_ns as f64 / 1e9;
    let s = f.skew_spread_ns as f64 / 1e9;
    let times = f.releases(r.index, |_, _| true);
    let mut arrivals: Vec<u64> =
        f.t.records
            .iter()
            .filter(|x| x.rule == r.index)
            .map(|x| x.arrived)
            .collect();
    arrivals.sort_unstable();
    let count =
        |v: &[u64], a: u64, b: u64| v.partition_point(|&x| x < b) - v.partition_point(|&x| x < a);
    let mut a = f.start + 3 * NS_PER_S;
    while a + NS_PER_S <= f.end {
        let b = a + NS_PER_S;
        let from = a - 2 * NS_PER_S;
        let overloaded = (0..3).all(|i| {
            let w = from + i * NS_PER_S;
            count(&arrivals, w, w + NS_PER_S) as f64 >= r.rate * 1.3
        });
        // A stall longer than the catch-up forfeits slots (stated).
        let long_stall = sc.proxies.iter().any(|p| {
            p.stalls.iter().any(|&(at, len)| {
                len * NS_PER_MS > crate::rate::CATCH_UP_NS
                    && sc.at(at + len) > from
                    && sc.at(at) < b
            })
        });
        if overloaded && !long_stall && !f.shaken(from, b) && steady(sc, r.index, from, b) {
            let got = count(&times, a, b);
            // A release may leave up to J late (its tick) and the clocks
            // differ by up to S: a window's edges can move that much rate
            // into its neighbours; two more for the edges' slots.
            let least = (r.rate * (1.0 - j - s) - 2.0).floor().max(0.0) as usize;
            if got < least {
                out.push(v("throughput", format!(
                    "rule {} (cluster, {} proxies): {got} released in [{:.0}, {:.0}) s under {} offered, at least {least} (R x (1 s - J - S) - 2)",
                    r.spec.name,
                    f.proxies_of(r.index),
                    (a - f.start) as f64 / 1e9,
                    (b - f.start) as f64 / 1e9,
                    count(&arrivals, a, b),
                )));
                return;
            }
        }
        a = b;
    }
}

fn floors(f: &Facts<'_>, r: &RuleView<'_>, out: &mut Vec<Violation>) {
    if r.spec.classes.is_empty() || f.clocks_apart {
        return;
    }
    let classes = r.spec.classes.len();
    let mut a = f.start + 2 * NS_PER_S;
    while a + NS_PER_S <= f.end {
        let b = a + NS_PER_S;
        if f.shaken(a, b) {
            a = b;
            continue;
        }
        let mut arrived = vec![0u64; classes];
        let mut released = vec![0u64; classes];
        for x in f.t.records.iter().filter(|x| x.rule == r.index) {
            let c = x.class.unwrap_or(classes - 1).min(classes - 1);
            if x.arrived >= a && x.arrived < b {
                arrived[c] += 1;
            }
            if let End::Released { at, .. } = x.end {
                if at >= a && at < b {
                    released[c] += 1;
                }
            }
        }
        let offered: u64 = arrived.iter().sum();
        let saturated = offered as f64 > r.rate * 1.2;
        for (c, (name, share, _)) in r.spec.classes.iter().enumerate() {
            let floor = share * r.rate;
            // The class keeps waiting: it is offered at least its floor.
            if !saturated || *share <= 0.0 || (arrived[c] as f64) < floor * 1.2 {
                continue;
            }
            if (released[c] as f64) < floor - 1.0 {
                out.push(v("floors", format!(
                    "rule {} class {name}: {} released in [{:.0}, {:.0}) s, floor {floor:.1} (offered {})",
                    r.spec.name,
                    released[c],
                    (a - f.start) as f64 / 1e9,
                    (b - f.start) as f64 / 1e9,
                    arrived[c]
                )));
                return;
            }
        }
        a = b;
    }
}

fn clocks(f: &Facts<'_>, out: &mut Vec<Violation>) {
    let sc = &f.t.scenario;
    for (p, proc_) in f.t.processes.iter().enumerate() {
        let moves = proc_
            .log
            .iter()
            .filter(|(_, l)| l.contains("clock is about"))
            .count();
        let events = 1 + sc.proxies.get(p).map_or(0, |s| s.steps.len());
        // Per rule a grid may move; count per rule by name.
        let rules = sc.rules.iter().filter(|r| r.cluster).count().max(1);
        if moves > events * rules {
            out.push(v("clocks", format!(
                "proxy {p}: {moves} grid moves for {events} skew event(s) and {rules} cluster rule(s): {:?}",
                proc_
                    .log
                    .iter()
                    .filter(|(_, l)| l.contains("clock is about"))
                    .map(|(t, l)| format!("{:.1}s {}", (*t - f.start) as f64 / 1e9, l.split(": this proxy").next().unwrap_or("")))
                    .take(6)
                    .collect::<Vec<_>>()
            )));
        }
        if let Some((_, l)) = proc_.log.iter().find(|(_, l)| l.contains("about 0 ms")) {
            out.push(v(
                "clocks",
                format!("proxy {p}: a move of 0 ms logged: {l}"),
            ));
        }
    }
}

fn soundness(f: &Facts<'_>, out: &mut Vec<Violation>) {
    for (p, proc_) in f.t.processes.iter().enumerate() {
        let w = proc_.unguarded_writes();
        if !w.is_empty() {
            out.push(v(
                "sound",
                format!("proxy {p}: cells written without a token after configure: {w:?}"),
            ));
        }
        if proc_.unmatched > 0 {
            out.push(v(
                "sound",
                format!("proxy {p}: {} takes matched to no request", proc_.unmatched),
            ));
        }
        if let Some((rule, stat)) = proc_.strays.first() {
            out.push(v(
                "sound",
                format!("proxy {p}: rule {rule} counted `{stat}`, which it does not define"),
            ));
        }
    }
    // No grid slot granted twice, per rule, across the fleet (caller rule
    // indexes are the cluster rules in order).
    // Per rule: each range granted, and to which proxy.
    type Granted = Vec<((u64, u64), usize)>;
    let mut by_rule: BTreeMap<usize, Granted> = BTreeMap::new();
    for (p, proc_) in f.t.processes.iter().enumerate() {
        for &(rule, range) in &proc_.granted {
            by_rule.entry(rule).or_default().push((range, p));
        }
    }
    // Unless Redis lost the counters (a restart): claims after it count
    // from zero again, and the bound over the fault episode (1) is what holds.
    for (rule, mut ranges) in by_rule {
        if !f.lost.is_empty() {
            break;
        }
        ranges.sort_unstable();
        if let Some([(a, p), (b, q)]) = ranges
            .windows(2)
            .find(|w| matches!(w, [(a, _), (b, _)] if b.0 < a.1))
        {
            out.push(v(
                "sound",
                format!(
                    "cluster rule #{rule}: a slot granted twice: {a:?} to proxy {p}, {b:?} to proxy {q}"
                ),
            ));
        }
    }
}

/// Invariant 5: rule 0's releases with and without the other rules'
/// requests (`alone`: the same scenario with only rule 0's loads).
pub fn independent(with: &Trace, alone: &Trace, again: &Trace) -> Vec<Violation> {
    let count = |t: &Trace, p: Option<usize>| {
        t.records
            .iter()
            .filter(|x| x.rule == 0 && p.is_none_or(|p| x.proxy == p))
            .filter(|x| matches!(x.end, End::Released { .. }))
            .count() as f64
    };
    // What the run itself varies by: rule 0 alone, its ticks and calls
    // timed a little differently (the same requests).
    let noise = |p: Option<usize>| (count(alone, p) - count(again, p)).abs();
    let name = with.scenario.rules.first().map_or("?", |r| r.name.as_str());
    let mut out = Vec::new();
    let (a, b) = (count(with, None), count(alone, None));
    if (a - b).abs() > (0.02 * b).max(3.0).max(2.0 * noise(None)) {
        out.push(v(
            "independent",
            format!("rule {name}: {a} released beside the other rules, {b} alone ({} alone, timed otherwise)", count(again, None)),
        ));
    }
    for p in 0..with.scenario.proxies.len() {
        let (a, b) = (count(with, Some(p)), count(alone, Some(p)));
        // A proxy's part moves with the order of the proxies' claims in each
        // epoch (its share is rounded at a place that order sets): a random
        // walk over the epochs, about the square root of its count apart
        // between two runs. Twice that is noise, not a rule's influence.
        let walk = 2.0 * (2.0 * b).sqrt();
        if (a - b).abs() > (0.10 * b).max(3.0).max(walk).max(2.0 * noise(Some(p))) {
            out.push(v(
                "independent",
                format!(
                    "rule {name} proxy {p}: {a} released beside the other rules, {b} alone ({} alone, timed otherwise)",
                    count(again, Some(p))
                ),
            ));
            break;
        }
    }
    out
}

/// The scenario with only rule 0's requests (for [`independent`]).
pub fn rule_zero_alone(sc: &super::Scenario) -> super::Scenario {
    let mut alone = sc.clone();
    alone.loads.retain(|l| l.rule == 0);
    alone
}

/// Offered requests per second of a rule over the whole run (for reports).
pub fn offered_per_s(sc: &super::Scenario, rule: usize) -> f64 {
    let secs = sc.duration_ms as f64 / 1e3;
    sc.loads
        .iter()
        .filter(|l| l.rule == rule)
        .map(|l| {
            let span = (l.to_ms.min(sc.duration_ms).saturating_sub(l.from_ms)) as f64 / 1e3;
            match l.shape {
                Shape::Uniform { per_s, .. } | Shape::Poisson { per_s } => per_s * span / secs,
                Shape::Burst { n, .. } => f64::from(n) / secs,
            }
        })
        .sum()
}

/// Class stats, for reports: (queued, released, displaced) of class `c`.
pub fn class_figures(t: &Trace, rule: usize, c: usize) -> (i64, i64, i64) {
    t.processes.iter().fold((0, 0, 0), |acc, p| {
        (
            acc.0 + p.class_total(rule, c, ClassStat::Queued),
            acc.1 + p.class_total(rule, c, ClassStat::Released),
            acc.2 + p.class_total(rule, c, ClassStat::Displaced),
        )
    })
}

/// A few lines of figures of a run, for `--verbose`: per rule, the releases
/// per second after the first 3 s (all, per proxy, per class) and each
/// proxy's calls.
pub fn figures(t: &Trace) -> Vec<String> {
    let sc = &t.scenario;
    let from = sc.start_ns() + 3 * NS_PER_S;
    let secs = (t.end.saturating_sub(from)) as f64 / 1e9;
    let mut out = Vec::new();
    for (i, r) in sc.rules.iter().enumerate() {
        let rel = |f: &dyn Fn(&super::Record) -> bool| {
            t.records
                .iter()
                .filter(|x| x.rule == i && f(x))
                .filter(|x| matches!(x.end, End::Released { at, .. } if at >= from))
                .count() as f64
                / secs
        };
        let per_proxy: Vec<String> = (0..sc.proxies.len())
            .map(|p| format!("{:.1}", rel(&|x| x.proxy == p)))
            .collect();
        let mine = || t.records.iter().filter(|x| x.rule == i);
        let count = |f: &dyn Fn(&End) -> bool| mine().filter(|x| f(&x.end)).count();
        let mut waits: Vec<u64> = mine()
            .filter_map(|x| match x.end {
                End::Released { at, held: true, .. } => Some((at - x.arrived) / NS_PER_MS),
                _ => None,
            })
            .collect();
        waits.sort_unstable();
        let q = |p: f64| {
            waits
                .get(((waits.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(0)
        };
        let mut line = format!(
            "rule {} ({:.1}/s): {:.2}/s released after 3 s; per proxy [{}]\n    ends: {} at once, {} after a hold (wait ms p50 {} p99 {} max {}), {} refused at once, {} refused late, {} cancelled, {} pending",
            r.name,
            r.rate_per_s,
            rel(&|_| true),
            per_proxy.join(" "),
            count(&|e| matches!(e, End::Released { held: false, .. })),
            count(&|e| matches!(e, End::Released { held: true, .. })),
            q(0.5),
            q(0.99),
            waits.last().copied().unwrap_or(0),
            count(&|e| matches!(e, End::Refused { held: false, .. })),
            count(&|e| matches!(e, End::Refused { held: true, .. })),
            count(&|e| matches!(e, End::Cancelled { .. })),
            count(&|e| matches!(e, End::Pending)),
        );
        if !r.classes.is_empty() {
            let mut per_s: Vec<Vec<usize>> = vec![Vec::new(); r.classes.len()];
            let mut s = sc.start_ns();
            while s + NS_PER_S <= t.end {
                for (c, row) in per_s.iter_mut().enumerate() {
                    row.push(
                        t.records
                            .iter()
                            .filter(|x| x.rule == i && x.class.unwrap_or(r.classes.len() - 1) == c)
                            .filter(|x| matches!(x.end, End::Released { at, .. } if at >= s && at < s + NS_PER_S))
                            .count(),
                    );
                }
                s += NS_PER_S;
            }
            for (c, row) in per_s.iter().enumerate() {
                line.push_str(&format!("\n    class {} per 1 s: {row:?}", r.classes[c].0));
            }
        }
        out.push(line);
    }
    let calls: Vec<String> = t.processes.iter().map(|p| p.calls.to_string()).collect();
    out.push(format!("engine calls per proxy: [{}]", calls.join(" ")));
    out
}
