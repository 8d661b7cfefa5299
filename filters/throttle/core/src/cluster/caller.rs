//! The calling VM's side: when to call the engine, what to claim, what an
//! answer grants, and when the rules fall back.
//!
//! One call per process per epoch at most (all cluster rules' claims
//! batched), never two in flight, never closer than [`MIN_CALL_INTERVAL_NS`]:
//! at most 10 calls per second per process whatever the traffic, and none
//! while no rule has demand. Epochs are counted on the fleet's clock: this
//! process's wall clock less its offset from the others' ([`Skew`]). With
//! `k` = [`ahead_epochs`] (3 with the defaults) and `lag` = [`lag_epochs`]
//! (2), at epoch `e` a rule with demand sends:
//!
//! * `members(e+k) += 1` (once per counter) and `demand(e+k) += a` (its
//!   arrivals per epoch in 1/[`DEMAND_UNIT`]): the answer places its demand
//!   at `[D0, D1)` of epoch `e+k`'s demand total;
//! * a look at `demand(e+k-lag)`, complete by now whatever the clocks and
//!   call phases within `max_clock_skew`: `A`, the demand of all proxies;
//! * `gen += 1`, the hour's count of calls: it only grows within the hour,
//!   unless the engine lost its counters (then the slots granted ahead are
//!   dropped: they may be granted again);
//! * once per second, itself in that second's count of proxies under the
//!   rule's name and under its grid, and a look at both two seconds back:
//!   more under the name is another rate under the same name (counted,
//!   logged);
//! * four looks at member counters around `e+k` ([`Skew::probes`]): where
//!   the other proxies' clocks stand against ours;
//! * a look at `members(e+1)`: `N`, the proxies with demand (the fallback
//!   divides by the most seen over ~5 s), and a loss detector (it must include
//!   this proxy's own add);
//! * `slots(e+k) += floor(L*D1/A + phi) - floor(L*D0/A + phi)`, with
//!   `[D0, D1)` and `A` of epoch `y = e+k-1-lag` (both learned earlier), and
//!   `phi` the same offset for every proxy, spread evenly over `[0, 1)` epoch
//!   after epoch (the fractional part of the epoch times the golden ratio):
//!   its share, in proportion to its demand.
//!   Every proxy computes its share from the same `A` and `phi`, so the
//!   shares add up to exactly `L` whatever the order of the claims, and each
//!   proxy's shares add up to its proportion of `L` within about a slot even
//!   when `L` is 1 (rates of 10/s and less);
//! * `slots(e+1) += a + waiting + owed - owned(e+1)`: leftovers, first come
//!   first served (there are some only when a proxy did not claim its share:
//!   new, idle, gone, or its call failed). Shares of an epoch are claimed `k`
//!   epochs ahead and leftovers one epoch ahead, far enough apart that every
//!   share claim reaches the engine before any leftover claim on the same
//!   epoch, with clocks within `max_clock_skew` and calls in the first quarter
//!   of an epoch ([`ahead_epochs`]).
//!
//! `a` = requests of the rule that arrived per epoch (whatever became of
//! them), over the last 5 epochs ([`ARRIVAL_SAMPLES`]); `waiting` = requests
//! waiting for grants now; `owed` = requests that went on credit.
//! The limit is never reached, so each answer's counter `after` tells the
//! positions this claim of `n` holds: `[after - n, min(after, L))` of the
//! epoch, i.e. at most 8 ranges of global slots spread over the epoch
//! ([`Grid::position_ranges`]). Nothing is granted twice.
//!
//! Failures grant nothing and are counted by kind ([`Failure`]); once calls
//! have kept failing for `fallback_after`, every rule switches to its
//! `on_engine_failure` mode, the log says why and what usually fixes it (then
//! at most every [`WARN_EVERY_NS`] while it lasts), and the first good
//! answer switches them back.

use std::sync::Arc;

use crate::clock::NS_PER_S;
use crate::config::{EngineConfig, OnEngineFailure};

use super::engine::{Claim, Counted, Counter, Engine, Failure, Request};
use super::grants::Mode;
use super::grid::{Grid, WINDOW_NS};
use super::skew::Skew;

/// Arrival samples kept: arrivals per epoch are measured over up to 5 epochs.
/// The process counter they read moves when each worker hands its counts
/// over (at its ticks: every ~4 ms while requests are held, else every
/// 100 ms), so a single epoch's increment can read 0 or twice the truth;
/// over 5 epochs that lag is at most a fifth. A proxy whose estimate read 0
/// claimed nothing for that epoch: at 2 requests/s per proxy, measured over
/// one epoch, every request waited for grants (p50 29-104 ms).
pub const ARRIVAL_SAMPLES: usize = 6;

/// How many of its member adds a caller remembers: as far back as probes
/// look ([`super::skew::REACH_NS`] at the shortest epochs), and then as far
/// again (a clock that steps back adds to the same counters twice).
pub const OWN_ADDS_MEMORY: usize = 64;

/// The demand counter's unit: 1/64 of a request per epoch.
pub const DEMAND_UNIT: u64 = 64;

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
    /// Slots this process owes: requests that went on credit, repaid from
    /// its next grants ([`super::publish`]).
    pub owed: u64,
}

/// What the glue publishes for one rule (into its grants blob).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleUpdate {
    pub rule: usize,
    pub mode: Mode,
    /// Slots per second this process may expect (the fair share), 0 if unknown.
    pub grant_rate_per_s: u64,
    /// Newly granted global slot ranges `[start, end)`, in this process's
    /// time (the fleet's slots shifted by its clock's offset, [`Skew`]).
    pub ranges: Vec<(u64, u64)>,
    /// Drop every range granted before (their slots may be granted again
    /// after counters were lost, or the clock stepped under them).
    pub reset: bool,
    /// Move every range granted before by this many slots: this process's
    /// clock offset from the fleet's changed ([`Skew`]), and its grants are
    /// the same fleet slots at other local times.
    pub shift: i64,
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
    /// Failed calls by kind ([`Failure::KINDS`]).
    pub failed: [u64; 7],
    /// How far this process's clock was found from the other proxies', ms
    /// (whole epochs; its grid follows theirs).
    pub clock_offset_ms: u64,
    /// Seconds in which more proxies carried a rule of this name than this
    /// grid (another rate under the same name).
    pub mismatch: u64,
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
    /// Where the other proxies' clocks stand: a look at `members(e+k+j)`.
    Probe(i64),
    /// The per-hour count of calls: it only grows, or counters were lost.
    Gen,
    /// Once per second: this proxy in the second's counters of the rule's
    /// name (`any`) and of its grid, and a look at both two seconds back.
    NameAdd,
    GridAdd,
    NameLook,
    GridLook,
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
    /// total: `ceil((E/4 + timeout + max_clock_skew) / E)`, so that every
    /// proxy's add has been counted (whatever its clock and phase) before
    /// anyone reads it ([`lag_epochs`]).
    lag: u64,
    /// `k`: shares of epoch `X` are claimed in epoch `X - k`, leftovers in
    /// `X - 1`: far enough apart that every share claim on `X` reaches the
    /// engine before any leftover claim on it, whatever the clocks within
    /// `max_clock_skew` ([`ahead_epochs`]).
    ahead: u64,
    /// arrived_total samples (value, wall time), at least an epoch apart,
    /// the oldest first ([`ARRIVAL_SAMPLES`] at most).
    arrived_samples: Vec<(u64, u64)>,
    /// Requests arrived per epoch, over the samples' span, in 1/[`DEMAND_UNIT`]
    /// of a request (what the demand counter adds up: fine enough that a
    /// proxy with 0.4 requests per epoch and one with 1 get shares 2 to 5).
    demand: u64,
    mode: Mode,
    stats: RuleStats,
    /// This process's clock against the other proxies'.
    skew: Skew,
    /// The member counters this process added to (the last
    /// [`OWN_ADDS_MEMORY`]): a probe of one of them counts us too.
    own_adds: Vec<u64>,
    /// The last per-hour call count seen: (hour window, count).
    gen: Option<(u64, u64)>,
    /// The next update must drop every range granted before.
    reset: bool,
    /// The next update must move every range granted before by this many slots.
    shift: i64,
    /// The last second this proxy added itself to the per-second counters.
    second: Option<u64>,
    /// Proxies seen two seconds back: (second, of the name, of this grid).
    seen_second: (u64, Option<u64>, Option<u64>),
    /// When a mismatch was last logged.
    mismatch_warned: Option<u64>,
}

impl RuleState {
    /// The fleet's wall time for this rule at our wall time `now`.
    fn fleet_time(&self, now: u64) -> u64 {
        now.saturating_add_signed(-self.offset_ns())
    }

    /// Our clock's offset from the fleet's, ns.
    fn offset_ns(&self) -> i64 {
        let e = i64::try_from(self.spec.grid.epoch_ns).unwrap_or(i64::MAX);
        self.skew.offset_epochs.saturating_mul(e)
    }

    /// The grants were in another time frame (the clock stepped, or its
    /// offset from the fleet's changed): drop them, and plan afresh. What
    /// was added to or seen in each counter stays true (a counter's name
    /// does not change with the frame).
    fn forget_grants(&mut self) {
        self.last_epoch = None;
        self.granted.clear();
        self.reset = true;
    }

    /// The engine lost its counters: nothing seen or added there holds.
    fn forget_counters(&mut self) {
        self.forget_grants();
        self.member_adds.clear();
        self.seen.clear();
        self.demand_ranges.clear();
        self.demand_totals.clear();
        self.gen = None;
    }
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
    /// Where in each epoch this process calls, in thousandths of a quarter
    /// epoch: proxies pick different phases so their calls spread over the
    /// first quarter of the epoch instead of all coming at its start.
    phase_permille: u64,
    /// The engine block's cluster and domain, for the log.
    cluster: String,
    domain: String,
    /// What the log should say (at warn), taken by [`Caller::take_events`].
    events: Vec<String>,
    /// When the current run of failures was last logged.
    warned_at: Option<u64>,
}

/// A run of failures is logged when it starts the fallback, then at most once
/// per this long while it lasts.
pub const WARN_EVERY_NS: u64 = 10 * NS_PER_S;

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
                    lag: lag_epochs(epoch_ns, engine.timeout_ns, engine.max_clock_skew_ns),
                    ahead: ahead_epochs(epoch_ns, engine.timeout_ns, engine.max_clock_skew_ns),
                    arrived_samples: Vec::new(),
                    demand: 0,
                    mode: Mode::Grid,
                    stats: RuleStats::default(),
                    skew: Skew::new(epoch_ns),
                    own_adds: Vec::new(),
                    shift: 0,
                    second: None,
                    seen_second: (0, None, None),
                    mismatch_warned: None,
                    gen: None,
                    reset: false,
                })
                .collect(),
            call_due: None,
            in_flight: None,
            failing_since: None,
            phase_permille: 0,
            cluster: engine.cluster.clone(),
            domain: engine.domain.clone(),
            events: Vec::new(),
            warned_at: None,
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

    /// What happened that the log should say (at warn), since the last time.
    pub fn take_events(&mut self) -> Vec<String> {
        std::mem::take(&mut self.events)
    }

    /// Rule `i`'s slots per epoch.
    pub fn slots_per_epoch(&self, i: usize) -> Option<u64> {
        self.rules.get(i).map(|r| r.spec.grid.slots_per_epoch)
    }

    /// Rule `i`'s clock offset from the other proxies', in its epochs.
    pub fn clock_offset_epochs(&self, i: usize) -> Option<i64> {
        self.rules.get(i).map(|r| r.skew.offset_epochs)
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
        if self
            .call_due
            .is_some_and(|t| t > now.saturating_add(2 * MIN_CALL_INTERVAL_NS))
        {
            // A due time further ahead than the pace allows: the clock
            // stepped back. Pace from now.
            self.call_due = None;
        }
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
            // Epochs are counted on the fleet's clock.
            let now = r.fleet_time(now);
            let e = g.epoch_of(now);
            if r.last_epoch.is_some_and(|last| last > e + 1) {
                // The clock stepped back: grants planned ahead of it no
                // longer line up. Plan afresh from here.
                r.forget_grants();
                r.skew.restart();
            }
            if r.last_epoch.is_some_and(|last| last >= e) {
                continue;
            }
            let offset = phase_offset(g.epoch_ns, self.phase_permille);
            if now < g.epoch_start(e).saturating_add(offset) {
                continue;
            }
            r.granted.retain(|(f, _)| *f > e);
            // Shares of epoch e+k come from the demand of y = e+k-1-lag, whose
            // total was looked at in the last epoch (its adds complete by then).
            let (lag, k) = (r.lag, r.ahead);
            let ahead = e + k;
            let y = (ahead - 1).saturating_sub(lag);
            let look = ahead.saturating_sub(lag);
            r.demand_ranges.retain(|(f, ..)| *f >= y);
            r.demand_totals.retain(|(f, _)| *f >= y);
            r.seen.retain(|(f, _)| *f + 2 > e);
            r.member_adds.retain(|f| *f > e);
            let mut demand = r.demand;
            if demand == 0 && (r.mode != Mode::Grid || fact.waiting > 0 || fact.owed > 0) {
                // Waiting requests, slots owed, or a fallback that must probe
                // the engine every epoch count as demand before arrivals are
                // measured.
                demand = DEMAND_UNIT;
            }
            if demand == 0 {
                continue;
            }
            // Whole requests per epoch, for the leftover claim.
            let a = demand.div_ceil(DEMAND_UNIT);
            r.last_epoch = Some(e);
            let next = e + 1;
            let l = g.slots_per_epoch;
            let share = match (lookup3(&r.demand_ranges, y), lookup(&r.demand_totals, y)) {
                (Some((d0, d1)), total) if total > 0 => {
                    let total = total.max(d1);
                    let phi = epoch_phase(ahead);
                    rotated_floor(l, d1, total, phi) - rotated_floor(l, d0, total, phi)
                }
                _ => 0,
            };
            let need = a.saturating_add(fact.waiting).saturating_add(fact.owed);
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
                push(Purpose::Gen, look, 1);
            }
            // Once per second: count ourselves under the rule's name and
            // under this grid, and look two seconds back (complete by now).
            let sec = now / NS_PER_S;
            if r.second != Some(sec) && g.may_claim(g.epoch_of(now), now, skew, timeout) {
                r.second = Some(sec);
                for purpose in [Purpose::NameAdd, Purpose::GridAdd] {
                    push(purpose, sec, 1);
                }
                for purpose in [Purpose::NameLook, Purpose::GridLook] {
                    push(purpose, sec.saturating_sub(2), 0);
                }
            }
            for j in r.skew.probes() {
                let at = ahead.saturating_add_signed(j);
                if g.may_claim(at, now, skew, timeout) {
                    push(Purpose::Probe(j), at, 0);
                }
            }
            if g.may_claim(next, now, skew, timeout) {
                // Also the loss detector: it includes this proxy's own add.
                push(Purpose::MemberLook, next, 0);
                if leftover > 0 {
                    push(Purpose::Leftover, next, leftover);
                }
            }
            if g.may_claim(ahead, now, skew, timeout) {
                // Once per counter, even if the clock stepped back over it:
                // other proxies count the members there.
                if !r.own_adds.contains(&ahead) {
                    push(Purpose::MemberAdd, ahead, 1);
                }
                if lookup3(&r.demand_ranges, ahead).is_none() {
                    push(Purpose::DemandAdd, ahead, demand);
                }
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
                    Purpose::MemberAdd
                    | Purpose::MemberLook
                    | Purpose::Probe(_)
                    | Purpose::Gen
                    | Purpose::NameAdd
                    | Purpose::GridAdd
                    | Purpose::NameLook
                    | Purpose::GridLook => Counter::Members,
                    Purpose::DemandAdd | Purpose::DemandLook => Counter::Demand,
                };
                let key = match p.purpose {
                    Purpose::Gen => r.spec.grid.gen_key(&r.spec.name),
                    Purpose::NameAdd | Purpose::NameLook => {
                        r.spec.grid.second_keys(&r.spec.name, p.epoch).0
                    }
                    Purpose::GridAdd | Purpose::GridLook => {
                        r.spec.grid.second_keys(&r.spec.name, p.epoch).1
                    }
                    _ => r.spec.grid.counter_key(&r.spec.name, p.epoch),
                };
                Some(Claim {
                    rule: p.rule,
                    counter,
                    key,
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

    /// Consistency of a parsed answer with what this process knows: the
    /// per-hour call count grows, its own member adds show, slot counters
    /// never go back, and the service's hour is ours.
    fn check(&self, call: &InFlight, counted: &[Counted]) -> Result<(), Failure> {
        let tolerance = (self.skew_ns + self.timeout_ns).div_ceil(NS_PER_S) + 1;
        for (p, c) in call.plan.iter().zip(counted) {
            let Some(r) = self.rules.get(p.rule) else {
                continue;
            };
            let sent = r.fleet_time(call.sent_at);
            let ours = (WINDOW_NS - sent % WINDOW_NS).div_ceil(NS_PER_S);
            if c.reset_s.abs_diff(ours) > tolerance && c.reset_s.abs_diff(ours + 3600) > tolerance {
                return Err(Failure::Clock(format!(
                    "the service's hour ends in {} s, ours in {ours} s: clocks differ by more than max_clock_skew",
                    c.reset_s
                )));
            }
            let lost = |why: String| {
                Err(Failure::Lost(format!(
                    "{why}: counters were lost (Redis restarted?)"
                )))
            };
            match p.purpose {
                Purpose::Gen => {
                    let hour = sent / WINDOW_NS;
                    if let Some((h, last)) = r.gen {
                        if h == hour && c.after <= last {
                            return lost(format!(
                                "the hour's call count went back from {last} to {}",
                                c.after
                            ));
                        }
                    }
                }
                Purpose::MemberLook if c.after == 0 && r.member_adds.contains(&p.epoch) => {
                    return lost("a member counter this proxy added to reads 0".into());
                }
                Purpose::Share | Purpose::Leftover => {
                    let before = c.after - p.hits;
                    let seen = lookup(&r.seen, p.epoch);
                    if before < seen {
                        return lost(format!("slot counter went back from {seen} to {before}"));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn succeeded(&mut self, now: u64, call: &InFlight, counted: &[Counted]) -> Vec<RuleUpdate> {
        if let Some(since) = self.failing_since.take() {
            if self.rules.iter().any(|r| r.mode != Mode::Grid) {
                self.events.push(format!(
                    "the engine answers again after {} ms of failures: cluster rules are back on the grid",
                    now.saturating_sub(since) / crate::clock::NS_PER_MS
                ));
            }
        }
        self.warned_at = None;
        let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.rules.len()];
        for (p, c) in call.plan.iter().zip(counted) {
            let Some(r) = self.rules.get_mut(p.rule) else {
                continue;
            };
            let g = r.spec.grid;
            match p.purpose {
                Purpose::Probe(j) => {
                    let mine = r.own_adds.iter().filter(|&&f| f == p.epoch).count();
                    r.skew.record(j, c.after, mine as u64);
                }
                Purpose::Gen => r.gen = Some((r.fleet_time(call.sent_at) / WINDOW_NS, c.after)),
                Purpose::NameAdd | Purpose::GridAdd => {}
                Purpose::NameLook | Purpose::GridLook => {
                    if r.seen_second.0 != p.epoch {
                        r.seen_second = (p.epoch, None, None);
                    }
                    if p.purpose == Purpose::NameLook {
                        r.seen_second.1 = Some(c.after);
                    } else {
                        r.seen_second.2 = Some(c.after);
                    }
                    if let (_, Some(name), Some(grid)) = r.seen_second {
                        if name > grid {
                            r.stats.mismatch += 1;
                            let due = r
                                .mismatch_warned
                                .is_none_or(|t| now.saturating_sub(t) >= WARN_EVERY_NS);
                            if due {
                                r.mismatch_warned = Some(now);
                                self.events.push(format!(
                                    "rule {}: {name} proxies carry a rule of this name, {grid} of them at this rate ({}): the others count on another grid with its own full rate (a rollout of a new rate, or configurations that differ?) (said at most every {} s)",
                                    r.spec.name,
                                    r.spec.grid.interval_ns,
                                    WARN_EVERY_NS / NS_PER_S
                                ));
                            }
                        }
                        r.seen_second = (p.epoch, None, None);
                    }
                }
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
                Purpose::MemberAdd => {
                    r.member_adds.push(p.epoch);
                    r.own_adds.push(p.epoch);
                    if r.own_adds.len() > OWN_ADDS_MEMORY {
                        r.own_adds.remove(0);
                    }
                }
                Purpose::DemandAdd => r.demand_ranges.push((p.epoch, c.after - p.hits, c.after)),
                Purpose::Share | Purpose::Leftover => {
                    bump(&mut r.seen, p.epoch, |v| v.max(c.after));
                    let before = c.after - p.hits;
                    let end = c.after.min(g.slots_per_epoch);
                    if before < end {
                        // The fleet's slots, in this process's time.
                        let shift = r
                            .skew
                            .offset_epochs
                            .saturating_mul(i64::try_from(g.slots_per_epoch).unwrap_or(i64::MAX));
                        if let Some(list) = ranges.get_mut(p.rule) {
                            list.extend(g.position_ranges(p.epoch, before, end).into_iter().map(
                                |(a, b)| {
                                    (
                                        a.saturating_add_signed(shift),
                                        b.saturating_add_signed(shift),
                                    )
                                },
                            ));
                        }
                        bump(&mut r.granted, p.epoch, |v| v + (end - before));
                        r.stats.granted += end - before;
                    }
                }
            }
        }
        for (i, list) in ranges.iter_mut().enumerate() {
            let Some(r) = self.rules.get_mut(i) else {
                continue;
            };
            if let Some(delta) = r.skew.estimate() {
                r.skew.offset_epochs = r.skew.offset_epochs.saturating_add(delta);
                let ms = r.offset_ns().unsigned_abs() / crate::clock::NS_PER_MS;
                r.stats.clock_offset_ms = ms;
                if let Some(n) = r
                    .stats
                    .failed
                    .get_mut(Failure::Clock(String::new()).index())
                {
                    *n += 1;
                }
                self.events.push(format!(
                    "rule {}: this proxy's clock is about {ms} ms {} the other proxies' of the rule (max_clock_skew {} ms): its grid now follows theirs; set the clocks by NTP",
                    r.spec.name,
                    if r.skew.offset_epochs > 0 { "ahead of" } else { "behind" },
                    self.skew_ns / crate::clock::NS_PER_MS
                ));
                r.skew.restart();
                // The same fleet slots, at other local times: granted
                // before, and in this answer.
                let shift = delta
                    .saturating_mul(i64::try_from(r.spec.grid.slots_per_epoch).unwrap_or(i64::MAX));
                r.shift = r.shift.saturating_add(shift);
                r.last_epoch = None;
                for range in list.iter_mut() {
                    *range = (
                        range.0.saturating_add_signed(shift),
                        range.1.saturating_add_signed(shift),
                    );
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
                    reset: std::mem::take(&mut r.reset),
                    shift: std::mem::take(&mut r.shift),
                })
            })
            .collect()
    }

    fn failed(&mut self, now: u64, why: Failure) -> Vec<RuleUpdate> {
        let mut updates = Vec::new();
        if let Some(call) = self.in_flight.take() {
            for i in rules_of(&call.plan) {
                let Some(r) = self.rules.get_mut(i) else {
                    continue;
                };
                r.stats.failures += 1;
                if let Some(n) = r.stats.failed.get_mut(why.index()) {
                    *n += 1;
                }
                if matches!(why, Failure::Lost(_)) {
                    // Slots granted ahead may be granted again from the
                    // fresh counters: drop them, and start counting anew.
                    r.forget_counters();
                    updates.push(RuleUpdate {
                        rule: i,
                        mode: r.mode,
                        grant_rate_per_s: 0,
                        ranges: Vec::new(),
                        reset: std::mem::take(&mut r.reset),
                        shift: 0,
                    });
                }
            }
        }
        self.failing_since.get_or_insert(now);
        let fell_back = self.fallback_if_due(now);
        let due = self
            .warned_at
            .is_none_or(|t| now.saturating_sub(t) >= WARN_EVERY_NS);
        let in_fallback = self.rules.iter().any(|r| r.mode != Mode::Grid);
        if !fell_back.is_empty() || (in_fallback && due) {
            self.warned_at = Some(now);
            let since = self.failing_since.map_or(0, |t| now.saturating_sub(t));
            self.events.push(format!(
                "engine calls failing for {} ms ({}), cluster rules in their on_engine_failure fallback: {} (said at most every {} s while it lasts)",
                since / crate::clock::NS_PER_MS,
                why.kind(),
                why.explain(&self.cluster, &self.domain),
                WARN_EVERY_NS / NS_PER_S
            ));
        }
        updates.extend(fell_back);
        updates
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
            // The proxies the engine last counted (the most over ~5 s before
            // the failure), kept while it lasts; `expected_replicas` only if
            // it never counted any.
            let divisor = match r.stats.members_recent_max {
                0 => u64::from(r.spec.expected_replicas.max(1)),
                seen => seen,
            };
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
                reset: false,
                shift: 0,
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
        r.demand = div_ceil_u128(n.saturating_mul(DEMAND_UNIT), e_ns, now.saturating_sub(at));
    }
    r.arrived_samples.push((arrived_total, now));
    if r.arrived_samples.len() > ARRIVAL_SAMPLES {
        r.arrived_samples.remove(0);
    }
}

/// Epochs between a demand epoch's adds and the look at its total: adds to
/// `demand(X)` are sent in epoch `X - k` at a phase below `E/4` and reach the
/// engine within `timeout`; a look sent `lag` epochs later, by a clock up to
/// `skew` ahead, comes after all of them.
pub fn lag_epochs(epoch_ns: u64, timeout_ns: u64, skew_ns: u64) -> u64 {
    (epoch_ns / 4 + timeout_ns + skew_ns)
        .div_ceil(epoch_ns.max(1))
        .max(1)
}

/// `k`, how many epochs ahead shares are claimed: leftovers of epoch `X` are
/// claimed in `X - 1` (at a phase of 0 at the earliest), shares of `X` in
/// `X - k` (a phase below `E/4`, reaching the engine within `timeout`, by a
/// clock up to `skew` behind), and every share must come first:
/// `(k - 1) E > E/4 + timeout + skew`.
pub fn ahead_epochs(epoch_ns: u64, timeout_ns: u64, skew_ns: u64) -> u64 {
    2 + (epoch_ns / 4 + timeout_ns + skew_ns) / epoch_ns.max(1)
}

/// Where in an epoch of `epoch_ns` a process with phase `permille` calls:
/// within its first quarter, so that calls of different processes spread
/// out and still leave every share ahead of every leftover ([`ahead_epochs`]).
fn phase_offset(epoch_ns: u64, permille: u64) -> u64 {
    epoch_ns / 4 * permille / 1000
}

/// The offset (in 2^-64 units) of epoch `f`'s share boundaries: the
/// fractional part of `f` times the golden ratio. Every proxy computes the
/// same one; over consecutive epochs it is spread evenly over `[0, 1)` (a
/// Kronecker sequence), so a proxy's shares add up to its proportion of `L`
/// within about one slot however small `L` is. With a fixed offset, at
/// `L = 1` the proxy whose demand spans the boundary wins every epoch.
fn epoch_phase(f: u64) -> u64 {
    f.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// `floor(l * d / total + phi / 2^64)` (total > 0). Summed over proxies whose
/// demand ranges tile `[0, total)`, the differences give exactly `l`.
fn rotated_floor(l: u64, d: u64, total: u64, phi: u64) -> u64 {
    let total = u128::from(total.max(1));
    let ld = u128::from(l) * u128::from(d);
    // l * d < 2^64 for any real rate and demand; beyond it, no offset.
    match (
        ld.checked_shl(64).filter(|_| ld >> 64 == 0),
        total.checked_shl(64),
    ) {
        (Some(num), Some(den)) if total >> 64 == 0 => {
            u64::try_from((num + u128::from(phi) * total) / den).unwrap_or(u64::MAX)
        }
        _ => u64::try_from(ld / total).unwrap_or(u64::MAX),
    }
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
        total => l.min(div_ceil_u128(l, r.demand.max(1), total)),
    };
    div_ceil_u128(per_epoch, NS_PER_S, g.epoch_ns)
}
