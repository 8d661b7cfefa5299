//! The calling VM's side: when to call the engine, what to claim, what an
//! answer grants, and when the rules fall back.
//!
//! One call per process per epoch at most (all cluster rules' claims
//! batched), never two in flight, never closer than [`MIN_CALL_INTERVAL_NS`]:
//! at most 10 calls per second per process whatever the traffic, and none
//! while no rule has demand. At epoch `e` a rule with demand sends:
//!
//! * `members(e+2) += 1` and `demand(e+2) += a` (its arrivals per epoch): the
//!   answer places its demand at `[D0, D1)` of epoch `e+2`'s demand total;
//! * a look at `demand(e+2-lag)`, complete by now: its adds were made
//!   `lag = 1 + ceil((max_clock_skew + timeout) / E)` epochs ago (2 or 3
//!   epochs with the defaults), so every proxy's add has been counted
//!   whatever its clock: `A`, the demand of all proxies;
//! * a look at `members(e+1)`: `N`, the proxies with demand (nearly all have
//!   added by now; the fallback uses the most seen in ~5 s), and a loss
//!   detector (it must include this proxy's own add);
//! * `slots(e+2) += floor(L*D1/A) - floor(L*D0/A)`, with `[D0, D1)` from its
//!   add to `demand(y)` and `A` from its look at `demand(y)`, `y = e+1-lag`
//!   (both made earlier): its share, in proportion to its demand. Every proxy computes
//!   its share from the same `A`, so the shares add up to exactly `L`
//!   whatever the order of the claims: no rounding goes against the last
//!   claimer, and a request's chance does not depend on which proxy it reached;
//! * `slots(e+1) += a + waiting - owned(e+1)`: leftovers, first come first
//!   served (there are some only when a proxy did not claim its share: new,
//!   idle, gone, or its call failed).
//!
//! `a` = requests of the rule that arrived per epoch (whatever became of
//! them), over the last 5 epochs ([`ARRIVAL_SAMPLES`]); `waiting` = requests
//! waiting for grants now.
//! The limit is never reached, so each answer's counter `after` tells the
//! positions this claim of `n` holds: `[after - n, min(after, L))` of the
//! epoch, i.e. at most 8 ranges of global slots spread over the epoch
//! ([`Grid::position_ranges`]). Nothing is granted twice.
//!
//! Failures (transport, non-200, timeout, nonsense) grant nothing; once calls
//! have kept failing for `fallback_after`, every rule switches to its
//! `on_engine_failure` mode, and the first good answer switches them back.

use std::sync::Arc;

use crate::clock::NS_PER_S;
use crate::config::{EngineConfig, OnEngineFailure};

use super::engine::{Claim, Counted, Counter, Engine, Failure, Request};
use super::grants::Mode;
use super::grid::{Grid, WINDOW_NS};

/// Arrival samples kept: arrivals per epoch are measured over up to 5 epochs.
/// The process counter they read moves when each worker hands its counts
/// over (at its ticks: every ~4 ms while requests are held, else every
/// 100 ms), so a single epoch's increment can read 0 or twice the truth;
/// over 5 epochs that lag is at most a fifth. A proxy whose estimate read 0
/// claimed nothing for that epoch: at 2 requests/s per proxy, measured over
/// one epoch, every request waited for grants (p50 29-104 ms).
pub const ARRIVAL_SAMPLES: usize = 6;

/// How many member looks (epochs) the `local_share` divisor remembers (~5 s).
pub const MEMBERS_MEMORY: usize = 50;

/// Calls are paced at one per this interval (at most 10 per second per
/// process, whatever the rules), with [`CALL_TOLERANCE_NS`] of tolerance.
pub const MIN_CALL_INTERVAL_NS: u64 = 100 * crate::clock::NS_PER_MS;

/// How early a call may come against its pace: a call that came late (the
/// calling VM's tick is late by up to its period) does not push the next
/// epoch's call into the epoch after, so no epoch goes without its call.
/// Over any second: at most 11 calls; over time: at most 10 per second.
pub const CALL_TOLERANCE_NS: u64 = 40 * crate::clock::NS_PER_MS;

/// One cluster rule as the calling VM sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub name: String,
    pub grid: Grid,
    pub expected_replicas: u32,
    pub on_engine_failure: OnEngineFailure,
}

/// What the glue reads for each rule before [`Caller::tick`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleFacts {
    /// Requests of the rule that arrived so far, whatever became of them: a
    /// monotonic, process-wide counter (the glue's metric).
    pub arrived_total: u64,
    /// Requests waiting for grants now.
    pub waiting: u64,
}

/// What the glue publishes for one rule (into its grants blob).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleUpdate {
    pub rule: usize,
    pub mode: Mode,
    /// Slots per second this process may expect (the fair share), 0 if unknown.
    pub grant_rate_per_s: u64,
    /// Newly granted global slot ranges `[start, end)`.
    pub ranges: Vec<(u64, u64)>,
}

/// A call to send to the engine's cluster, bounded by `engine.timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The request, as the engine builds it.
    pub request: Request,
    pub timeout_ns: u64,
}

/// Per-rule counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleStats {
    /// Calls that carried this rule.
    pub calls: u64,
    /// Of those, calls that failed.
    pub failures: u64,
    /// Grid slots granted to this process.
    pub granted: u64,
    /// Time spent in fallback before the current fallback, ns.
    pub fallback_ns: u64,
    /// When the current fallback began (None: on the grid).
    pub fallback_since: Option<u64>,
    /// Proxies with demand last seen by the engine (0: never seen).
    pub members: u64,
    /// The most proxies seen over the last [`MEMBERS_MEMORY`] looks: the
    /// `local_share` divisor (with `expected_replicas`). A maximum, because
    /// a count read while calls fail misses the proxies whose calls failed.
    pub members_recent_max: u64,
    /// Their demand in slots per epoch, last seen (0: never seen).
    pub demand: u64,
}

impl RuleStats {
    /// Total time in fallback up to `now`, ns (the gauge).
    pub fn fallback_total_ns(&self, now: u64) -> u64 {
        self.fallback_ns
            .saturating_add(self.fallback_since.map_or(0, |s| now.saturating_sub(s)))
    }
}

/// What one planned descriptor is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Share,
    Leftover,
    MemberAdd,
    MemberLook,
    DemandAdd,
    DemandLook,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Planned {
    rule: usize,
    purpose: Purpose,
    epoch: u64,
    hits: u64,
}

#[derive(Debug, Clone)]
struct InFlight {
    sent_at: u64,
    plan: Vec<Planned>,
    /// The plan's claims, as the engine got them.
    claims: Vec<Claim>,
}

#[derive(Debug, Clone)]
struct RuleState {
    spec: RuleSpec,
    /// Epoch in which this rule last planned a claim.
    last_epoch: Option<u64>,
    /// Epochs whose member counter this process added 1 to (recent ones).
    member_adds: Vec<u64>,
    /// Highest counter seen per slot epoch (recent ones), to catch counters going back.
    seen: Vec<(u64, u64)>,
    /// Slots granted per epoch (upcoming ones).
    granted: Vec<(u64, u64)>,
    /// Where this process's demand sits in each epoch's demand total: (epoch, D0, D1).
    demand_ranges: Vec<(u64, u64, u64)>,
    /// Demand totals looked at, per epoch.
    demand_totals: Vec<(u64, u64)>,
    /// The last member counts looked at.
    member_looks: Vec<u64>,
    /// Epochs between the start of a demand epoch's adds and the look at its
    /// total: `1 + ceil((max_clock_skew + timeout) / E)`, so that every
    /// proxy's add has been counted (whatever its clock) before anyone reads it.
    lag: u64,
    /// arrived_total samples (value, wall time), at least an epoch apart,
    /// the oldest first ([`ARRIVAL_SAMPLES`] at most).
    arrived_samples: Vec<(u64, u64)>,
    /// Requests arrived per epoch, over the samples' span.
    arrived_per_epoch: u64,
    mode: Mode,
    stats: RuleStats,
}

/// The calling VM's state for all cluster rules of one process.
#[derive(Debug, Clone)]
pub struct Caller {
    engine: Arc<dyn Engine>,
    timeout_ns: u64,
    fallback_after_ns: u64,
    skew_ns: u64,
    rules: Vec<RuleState>,
    /// The calls' pace (GCRA): the next call is due at this time.
    call_due: Option<u64>,
    in_flight: Option<InFlight>,
    /// When the current run of failures began (None: the last call succeeded).
    failing_since: Option<u64>,
    /// Where in each epoch this process calls, in thousandths of half an
    /// epoch: proxies pick different phases so their calls spread over the
    /// first half of the epoch instead of all coming at its start.
    phase_permille: u64,
}

/// How long a call may stay unanswered before it is counted as lost (the
/// host answers every call by its timeout; this only guards against a lost callback).
fn lost_after(timeout_ns: u64) -> u64 {
    timeout_ns
        .saturating_mul(2)
        .saturating_add(MIN_CALL_INTERVAL_NS)
}

fn bump(list: &mut Vec<(u64, u64)>, epoch: u64, f: impl FnOnce(u64) -> u64) {
    match list.iter_mut().find(|(e, _)| *e == epoch) {
        Some((_, v)) => *v = f(*v),
        None => list.push((epoch, f(0))),
    }
}

fn lookup3(list: &[(u64, u64, u64)], epoch: u64) -> Option<(u64, u64)> {
    list.iter()
        .find(|(e, ..)| *e == epoch)
        .map(|&(_, a, b)| (a, b))
}

fn lookup(list: &[(u64, u64)], epoch: u64) -> u64 {
    list.iter()
        .find(|(e, _)| *e == epoch)
        .map_or(0, |(_, v)| *v)
}

impl Caller {
    pub fn new(engine: &EngineConfig, rules: Vec<RuleSpec>) -> Caller {
        Caller {
            engine: super::engine(engine),
            timeout_ns: engine.timeout_ns,
            fallback_after_ns: engine.fallback_after_ns,
            skew_ns: engine.max_clock_skew_ns,
            rules: rules
                .into_iter()
                .map(|spec| (spec.grid.epoch_ns.max(1), spec))
                .map(|(epoch_ns, spec)| RuleState {
                    spec,
                    last_epoch: None,
                    member_adds: Vec::new(),
                    seen: Vec::new(),
                    granted: Vec::new(),
                    demand_ranges: Vec::new(),
                    demand_totals: Vec::new(),
                    member_looks: Vec::new(),
                    lag: 1 + (engine.max_clock_skew_ns + engine.timeout_ns).div_ceil(epoch_ns),
                    arrived_samples: Vec::new(),
                    arrived_per_epoch: 0,
                    mode: Mode::Grid,
                    stats: RuleStats::default(),
                })
                .collect(),
            call_due: None,
            in_flight: None,
            failing_since: None,
            phase_permille: 0,
        }
    }

    /// Sets this process's call phase (0..1000: thousandths of half an epoch;
    /// e.g. from a hash of the pod name, or random at start).
    pub fn with_phase(mut self, permille: u64) -> Caller {
        self.phase_permille = permille.min(999);
        self
    }

    /// How many rules it calls for.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Counters of rule `i`.
    pub fn stats(&self, i: usize) -> Option<RuleStats> {
        self.rules.get(i).map(|r| r.stats)
    }

    /// The mode rule `i` is in.
    pub fn mode(&self, i: usize) -> Option<Mode> {
        self.rules.get(i).map(|r| r.mode)
    }

    /// Whether a call is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Called on every tick of the calling VM with the wall time and one
    /// [`RuleFacts`] per rule. Returns the call to send, if any, and the
    /// rules whose mode changed (publish them).
    pub fn tick(&mut self, now: u64, facts: &[RuleFacts]) -> (Option<Call>, Vec<RuleUpdate>) {
        let mut updates = Vec::new();
        if let Some(f) = &self.in_flight {
            if now.saturating_sub(f.sent_at) > lost_after(self.timeout_ns) {
                updates = self.failed(now, Failure::Timeout);
            }
        }
        for (r, fact) in self.rules.iter_mut().zip(facts) {
            sample_arrivals(r, now, fact.arrived_total);
        }
        updates.extend(self.fallback_if_due(now));
        let call = self.plan(now, facts);
        (call, updates)
    }

    fn plan(&mut self, now: u64, facts: &[RuleFacts]) -> Option<Call> {
        if self.in_flight.is_some()
            || self
                .call_due
                .is_some_and(|t| now.saturating_add(CALL_TOLERANCE_NS) < t)
        {
            return None;
        }
        let (skew, timeout) = (self.skew_ns, self.timeout_ns);
        let mut plan = Vec::new();
        for (i, (r, fact)) in self.rules.iter_mut().zip(facts).enumerate() {
            let g = r.spec.grid;
            let e = g.epoch_of(now);
            if r.last_epoch.is_some_and(|last| last >= e) {
                continue;
            }
            let offset = g.epoch_ns / 2 * self.phase_permille / 1000;
            if now < g.epoch_start(e).saturating_add(offset) {
                continue;
            }
            r.granted.retain(|(f, _)| *f > e);
            // Demand of epoch `y` is complete for everyone `lag` epochs after
            // its adds began; shares of e+2 come from y = e+1-lag.
            let lag = r.lag;
            let y = (e + 1).saturating_sub(lag);
            let look = e + 2 - lag;
            r.demand_ranges.retain(|(f, ..)| *f >= y);
            r.demand_totals.retain(|(f, _)| *f >= y);
            r.seen.retain(|(f, _)| *f + 2 > e);
            r.member_adds.retain(|f| *f > e);
            let mut a = r.arrived_per_epoch;
            if r.mode != Mode::Grid || fact.waiting > 0 {
                // Waiting requests, or a fallback that must probe the engine
                // every epoch, count as demand even before arrivals are measured.
                a = a.max(1);
            }
            if a == 0 {
                continue;
            }
            r.last_epoch = Some(e);
            let (next, ahead) = (e + 1, e + 2);
            let l = g.slots_per_epoch;
            let share = match (lookup3(&r.demand_ranges, y), lookup(&r.demand_totals, y)) {
                (Some((d0, d1)), total) if total > 0 => {
                    let total = total.max(d1);
                    div_floor_u128(l, d1, total) - div_floor_u128(l, d0, total)
                }
                _ => 0,
            };
            let need = a.saturating_add(fact.waiting);
            let leftover = need.saturating_sub(lookup(&r.granted, next)).min(l);
            let mut push = |purpose, epoch, hits| {
                plan.push(Planned {
                    rule: i,
                    purpose,
                    epoch,
                    hits,
                })
            };
            if g.may_claim(look, now, skew, timeout) {
                push(Purpose::DemandLook, look, 0);
            }
            if g.may_claim(next, now, skew, timeout) {
                // Also the loss detector: it includes this proxy's own add.
                push(Purpose::MemberLook, next, 0);
                if leftover > 0 {
                    push(Purpose::Leftover, next, leftover);
                }
            }
            if g.may_claim(ahead, now, skew, timeout) {
                push(Purpose::MemberAdd, ahead, 1);
                push(Purpose::DemandAdd, ahead, a);
                if share > 0 {
                    push(Purpose::Share, ahead, share);
                }
            }
        }
        if plan.is_empty() {
            return None;
        }
        let claims: Vec<Claim> = plan
            .iter()
            .filter_map(|p| {
                let r = self.rules.get(p.rule)?;
                let counter = match p.purpose {
                    Purpose::Share | Purpose::Leftover => Counter::Slots,
                    Purpose::MemberAdd | Purpose::MemberLook => Counter::Members,
                    Purpose::DemandAdd | Purpose::DemandLook => Counter::Demand,
                };
                Some(Claim {
                    rule: p.rule,
                    counter,
                    key: r.spec.grid.counter_key(&r.spec.name, p.epoch),
                    hits: p.hits,
                })
            })
            .collect();
        for i in rules_of(&plan) {
            if let Some(r) = self.rules.get_mut(i) {
                r.stats.calls += 1;
            }
        }
        let request = self.engine.request(&claims);
        self.call_due = Some(
            self.call_due
                .map_or(now, |t| t.max(now))
                .saturating_add(MIN_CALL_INTERVAL_NS),
        );
        self.in_flight = Some(InFlight {
            sent_at: now,
            plan,
            claims,
        });
        Some(Call {
            request,
            timeout_ns: self.timeout_ns,
        })
    }

    /// The answer to the call in flight: `Ok((status, body))`, or the failure
    /// the host reported (transport error, timeout). Returns one update per
    /// rule (new grants, mode) to publish.
    pub fn on_answer(
        &mut self,
        now: u64,
        answer: Result<(u16, &[u8]), Failure>,
    ) -> Vec<RuleUpdate> {
        let Some(call) = self.in_flight.take() else {
            return Vec::new();
        };
        let counted = answer
            .and_then(|(status, body)| self.engine.read(status, body, &call.claims))
            .and_then(|c| {
                if now.saturating_sub(call.sent_at) > self.timeout_ns {
                    return Err(Failure::Timeout);
                }
                self.check(&call, &c).map(|()| c)
            });
        match counted {
            Ok(c) => self.succeeded(now, &call, &c),
            Err(f) => {
                self.in_flight = Some(call);
                self.failed(now, f)
            }
        }
    }

    /// Consistency of a parsed answer with what this process knows: its own
    /// member adds must show, slot counters never go back, and the service's
    /// hour must be ours.
    fn check(&self, call: &InFlight, counted: &[Counted]) -> Result<(), Failure> {
        let ours = (WINDOW_NS - call.sent_at % WINDOW_NS).div_ceil(NS_PER_S);
        let tolerance = (self.skew_ns + self.timeout_ns).div_ceil(NS_PER_S) + 1;
        for (p, c) in call.plan.iter().zip(counted) {
            let Some(r) = self.rules.get(p.rule) else {
                continue;
            };
            if c.reset_s.abs_diff(ours) > tolerance && c.reset_s.abs_diff(ours + 3600) > tolerance {
                return Err(Failure::Nonsense(format!(
                    "the service's hour ends in {} s, ours in {ours} s: clocks differ by more than max_clock_skew",
                    c.reset_s
                )));
            }
            match p.purpose {
                Purpose::MemberLook if c.after == 0 && r.member_adds.contains(&p.epoch) => {
                    return Err(Failure::Nonsense(
                        "a member counter this proxy added to reads 0: counters were lost (Redis restarted?)".into(),
                    ));
                }
                Purpose::Share | Purpose::Leftover => {
                    let before = c.after - p.hits;
                    let seen = lookup(&r.seen, p.epoch);
                    if before < seen {
                        return Err(Failure::Nonsense(format!(
                            "slot counter went back from {seen} to {before}: counters were lost (Redis restarted?)"
                        )));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn succeeded(&mut self, now: u64, call: &InFlight, counted: &[Counted]) -> Vec<RuleUpdate> {
        self.failing_since = None;
        let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.rules.len()];
        for (p, c) in call.plan.iter().zip(counted) {
            let Some(r) = self.rules.get_mut(p.rule) else {
                continue;
            };
            let g = r.spec.grid;
            match p.purpose {
                Purpose::MemberLook => {
                    r.stats.members = c.after.max(1);
                    r.member_looks.push(r.stats.members);
                    if r.member_looks.len() > MEMBERS_MEMORY {
                        r.member_looks.remove(0);
                    }
                    r.stats.members_recent_max = r.member_looks.iter().copied().max().unwrap_or(1);
                }
                Purpose::DemandLook => {
                    r.stats.demand = c.after;
                    bump(&mut r.demand_totals, p.epoch, |_| c.after);
                }
                Purpose::MemberAdd => r.member_adds.push(p.epoch),
                Purpose::DemandAdd => r.demand_ranges.push((p.epoch, c.after - p.hits, c.after)),
                Purpose::Share | Purpose::Leftover => {
                    bump(&mut r.seen, p.epoch, |v| v.max(c.after));
                    let before = c.after - p.hits;
                    let end = c.after.min(g.slots_per_epoch);
                    if before < end {
                        if let Some(list) = ranges.get_mut(p.rule) {
                            list.extend(g.position_ranges(p.epoch, before, end));
                        }
                        bump(&mut r.granted, p.epoch, |v| v + (end - before));
                        r.stats.granted += end - before;
                    }
                }
            }
        }
        ranges
            .into_iter()
            .enumerate()
            .filter_map(|(i, list)| {
                let r = self.rules.get_mut(i)?;
                if let Some(since) = r.stats.fallback_since.take() {
                    r.stats.fallback_ns += now.saturating_sub(since);
                }
                r.mode = Mode::Grid;
                Some(RuleUpdate {
                    rule: i,
                    mode: Mode::Grid,
                    grant_rate_per_s: grant_rate(r),
                    ranges: list,
                })
            })
            .collect()
    }

    fn failed(&mut self, now: u64, _why: Failure) -> Vec<RuleUpdate> {
        if let Some(call) = self.in_flight.take() {
            for i in rules_of(&call.plan) {
                if let Some(r) = self.rules.get_mut(i) {
                    r.stats.failures += 1;
                }
            }
        }
        self.failing_since.get_or_insert(now);
        self.fallback_if_due(now)
    }

    fn fallback_if_due(&mut self, now: u64) -> Vec<RuleUpdate> {
        let Some(since) = self.failing_since else {
            return Vec::new();
        };
        if now.saturating_sub(since) < self.fallback_after_ns {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, r) in self.rules.iter_mut().enumerate() {
            if r.mode != Mode::Grid {
                continue;
            }
            // Never faster than rate / expected_replicas; slower when more
            // proxies were seen recently (the autoscaler added some).
            let divisor =
                u64::from(r.spec.expected_replicas.max(1)).max(r.stats.members_recent_max);
            r.mode = match r.spec.on_engine_failure {
                OnEngineFailure::Deny => Mode::Deny,
                OnEngineFailure::LocalFull => Mode::Local {
                    interval_ns: r.spec.grid.interval_ns,
                },
                OnEngineFailure::LocalShare => Mode::Local {
                    interval_ns: r.spec.grid.interval_ns.saturating_mul(divisor),
                },
            };
            r.stats.fallback_since = Some(now);
            out.push(RuleUpdate {
                rule: i,
                mode: r.mode,
                grant_rate_per_s: 0,
                ranges: Vec::new(),
            });
        }
        out
    }
}

/// The rules a plan carries, each once.
fn rules_of(plan: &[Planned]) -> Vec<usize> {
    let mut out: Vec<usize> = plan.iter().map(|p| p.rule).collect();
    out.dedup();
    out
}

/// Updates the estimate of arrivals per epoch from the process counter,
/// over the span of the samples kept (one epoch at first, then up to
/// `ARRIVAL_SAMPLES - 1` epochs).
fn sample_arrivals(r: &mut RuleState, now: u64, arrived_total: u64) {
    let e_ns = r.spec.grid.epoch_ns;
    if let Some(&(_, at)) = r.arrived_samples.last() {
        if now.saturating_sub(at) < e_ns {
            return;
        }
    }
    if let Some(&(prev, at)) = r.arrived_samples.first() {
        let n = arrived_total.saturating_sub(prev);
        r.arrived_per_epoch = div_ceil_u128(n, e_ns, now.saturating_sub(at));
    }
    r.arrived_samples.push((arrived_total, now));
    if r.arrived_samples.len() > ARRIVAL_SAMPLES {
        r.arrived_samples.remove(0);
    }
}

/// `floor(a * b / c)` without overflow (c > 0), saturating at u64::MAX.
fn div_floor_u128(a: u64, b: u64, c: u64) -> u64 {
    let v = u128::from(a) * u128::from(b) / u128::from(c.max(1));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// `ceil(a * b / c)` without overflow (c > 0), saturating at u64::MAX.
fn div_ceil_u128(a: u64, b: u64, c: u64) -> u64 {
    let v = (u128::from(a) * u128::from(b)).div_ceil(u128::from(c.max(1)));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The share per second this process can expect: `L * a / A` slots per
/// epoch (`L / N` before the demand is known).
fn grant_rate(r: &RuleState) -> u64 {
    let g = r.spec.grid;
    let l = g.slots_per_epoch;
    let per_epoch = match r.stats.demand {
        0 => l.div_ceil(r.stats.members.max(1)),
        total => l.min(div_ceil_u128(l, r.arrived_per_epoch.max(1), total)),
    };
    div_ceil_u128(per_epoch, NS_PER_S, g.epoch_ns)
}
