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
//!   arrivals per epoch in 1/[`DEMAND_UNIT`], plus its line beyond this
//!   epoch's owned slots over `k + lag + 1` epochs): the answer places its demand
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
//! * six looks at member counters around `e+k` ([`Skew::probes`]): where
//!   the other proxies' clocks stand against ours; and, when it seems ahead
//!   of them, a look again at a past counter they were missing from, for
//!   the proof ([`Skew::recheck_due`]);
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
//! * `slots(e+1) += a + (waiting - owned_soon) + owed - owned(e+1)`:
//!   leftovers (`owned_soon`: this epoch's owned slots still to come, which
//!   the waiting take first), first come
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

use super::cursor::Mode;
use super::engine::{Claim, Counted, Counter, Engine, Failure, Request};
use super::grid::{Grid, WINDOW_NS};
use super::service_clock::{Decision, ServiceClock};
use super::skew::Skew;

mod answer;
mod shares;

pub use shares::{ahead_epochs, lag_epochs};
use shares::{
    deficit_hits, div_ceil_u128, epoch_phase, fair_share, grant_rate, over_rate, phase_offset,
    reference_back, share, share_positions, spare, spare_phase,
};

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

/// How many epochs of shares granted the expected share is averaged over at
/// least (one second); at low rates, as many as hold 20 of the rule's slots
/// (an epoch holds one slot or none, and a proxy's part of it comes unevenly).
pub const SHARE_MEMORY: usize = 10;

/// Shares holding this many slots tell a proxy's share rate well enough
/// (`shares::grant_rate`).
pub const SHARE_SLOTS: u64 = 20;

/// The epochs of shares a rule's expected share is averaged over.
fn share_memory(g: &Grid) -> usize {
    let epochs = (20 * g.interval_ns).div_ceil(g.epoch_ns.max(1));
    usize::try_from(epochs)
        .unwrap_or(usize::MAX)
        .max(SHARE_MEMORY)
}

/// For this long after the first answer, the demand totals are partial (the
/// proxies started at different moments): no room is expected from them
/// (`shares::grant_rate`).
pub const SETTLING_NS: u64 = NS_PER_S;

/// The demand counter's unit: 1/64 of a request per epoch.
pub const DEMAND_UNIT: u64 = 64;

/// A slot in the unit of a rule's share deficit (`shares::deficit_hits`).
pub const DEFICIT_UNIT: i64 = 1 << 16;

/// The most a proxy's share deficit counts, either way: 3 slots.
pub const DEFICIT_CAP: i64 = 3 * DEFICIT_UNIT;

/// Epochs over which a share deficit is made up (`shares::deficit_hits`).
pub const DEFICIT_EPOCHS: i64 = 10;

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
    /// Owned slots still usable from now to the end of this epoch: the
    /// waiting requests take them before any leftover of the next epoch
    /// (read only while requests wait).
    pub owned_soon: u64,
}

/// What the glue publishes for one rule (into its grants blob).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleUpdate {
    pub rule: usize,
    pub mode: Mode,
    /// Slots per second this process may expect (the fair share), 0 if unknown.
    pub grant_rate_per_s: u64,
    /// How far ahead a share slot it does not own yet may come, ns
    /// ([`super::Grants::lead_ns`]).
    pub lead_ns: u64,
    /// The part of `grant_rate_per_s` that is spare ([`super::Grants::spare_per_s`]).
    pub spare_per_s: u64,
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

/// The share a failed call claimed for a rule: the turns of the requests
/// held on it were reckoned with those slots, which will not come
/// ([`super::forgive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forgiven {
    pub rule: usize,
    pub slots: u64,
    /// Until when those turns can fall due: the end of the epoch the share
    /// was for (a deadline within `max_queue_delay` after it may still have
    /// counted on it).
    pub epoch_end: u64,
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
    /// The proof of an answer ahead: a look again at a member counter
    /// where the others were missing ([`Skew::recheck_due`]).
    Recheck,
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
    /// The look again at the total that places the hour's first shares
    /// ([`Grid::reference`]), just before they are planned.
    ReferenceLook,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Planned {
    rule: usize,
    purpose: Purpose,
    epoch: u64,
    hits: u64,
    /// Positions of the epoch below the counter's (a leftover claim on an
    /// epoch that opens the hour: the shares taken there without a claim).
    base: u64,
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
    /// The epoch this tick plans a claim for ([`Caller::plan_epoch`], read
    /// at the start of the tick), if any.
    plan_for: Option<u64>,
    /// Epochs whose member counter this process added 1 to (recent ones).
    member_adds: Vec<u64>,
    /// Highest counter seen per slot epoch (recent ones), to catch counters going back.
    seen: Vec<(u64, u64)>,
    /// Slots granted per epoch (upcoming ones).
    granted: Vec<(u64, u64)>,
    /// The shares granted by the last answers: (epoch claimed, `k` epochs
    /// ahead of the call, slots, and this proxy's part of the spare by the
    /// same demand total), the last [`share_memory`]; and when the first
    /// answer came.
    shares: Vec<(u64, u64, u64)>,
    first_answer: Option<u64>,
    /// When this process first planned for the rule (its configuration is
    /// in force from then), for [`RuleState::settled`].
    born: Option<u64>,
    /// The other proxies' demand in the last demand total looked at (the
    /// total less this proxy's own add to it), for the spare a proxy whose
    /// demand is new reckons with ([`shares::grant_rate`]).
    others_demand: u64,
    /// Where this process's demand sits in each epoch's demand total: (epoch, D0, D1).
    demand_ranges: Vec<(u64, u64, u64)>,
    /// This process's own demand behind each demand add (epoch, demand),
    /// before its deficit weighed in: what its shares are owed by.
    demand_owed: Vec<(u64, u64)>,
    /// Demand totals looked at, per epoch.
    demand_totals: Vec<(u64, u64)>,
    /// Whether a demand total was looked at since the counters were last
    /// lost: `stats.demand` is the fleet's demand then, even when it is 0.
    demand_seen: bool,
    /// The reference epoch of the hour's first shares whose total was
    /// looked at again before them ([`Purpose::ReferenceLook`]).
    reference_read: Option<u64>,
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
    /// The shares this process was owed by its part of the demand and did
    /// not get (negative: got beyond it), in 1/[`DEFICIT_UNIT`] of a slot,
    /// within [`DEFICIT_CAP`] (`deficit_hits`).
    deficit: i64,
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
    /// The last grid offset (epochs) a vote proposed and the service's
    /// clock refused, as logged.
    move_refused: Option<i64>,
}

impl RuleState {
    /// How far ahead of `now` (our wall time) this proxy's next share slot
    /// it does not own yet can come: `k` epochs, the claims' reach; and, for
    /// a proxy whose demand is new (after an idle spell, or at its start),
    /// the first epoch whose share counts it: a share of epoch `f + 1 +
    /// lag` comes from the demand placed in epoch `f`, so a proxy that first
    /// places demand at `e + k` gets no share before `e + k + lag + 1`
    /// (fleet sweep seed 126: turns reckoned 300 ms out came 500-600 ms out,
    /// and the requests were refused after their hold).
    fn lead_ns(&self, now: u64) -> u64 {
        let g = self.spec.grid;
        let reach = self.ahead.saturating_mul(g.epoch_ns);
        let now = self.fleet_time(now);
        let e = g.epoch_of(now);
        // The demand epoch of the next share not claimed yet (epoch e+k+1).
        let next = (e + self.ahead).saturating_sub(self.lag);
        let placed = self
            .demand_ranges
            .iter()
            .map(|&(f, ..)| f)
            .filter(|&f| f >= next)
            .min()
            .unwrap_or(e + 1 + self.ahead);
        if placed <= next {
            return reach;
        }
        reach.max(g.epoch_start(placed + 1 + self.lag).saturating_sub(now))
    }

    /// Whether the demand totals this process reads are the fleet's whole
    /// demand: [`SETTLING_NS`] after its first answer, or after it first
    /// planned, once answered. At a fleet's start the first totals miss the
    /// proxies that have not placed their demand yet, and would show room
    /// that is not there; a proxy whose first traffic comes later reads
    /// totals every proxy with demand has been adding to. Until 2026-12-01
    /// only the first answer counted, and a proxy that sat idle since its
    /// start (it makes no call without demand) reckoned its first second
    /// of traffic with no spare: real Envoy, a 100/s rule over 3 idle
    /// proxies, 20/s each: 2-4 of the first 60 refused at arrival on each
    /// (tests/cluster/test_holds.py's warm-up; 0-3 since, those before the
    /// first answer); the simulation of it, 10 of 180 (now none).
    fn settled(&self, now: u64) -> bool {
        let since = |t: Option<u64>| t.is_some_and(|t| now.saturating_sub(t) >= SETTLING_NS);
        since(self.first_answer) || (self.first_answer.is_some() && since(self.born))
    }

    /// An update of rule `rule` (this one) that grants nothing: its mode,
    /// no expected rate, no new ranges, no shift.
    fn no_grants(&self, rule: usize, now: u64, reset: bool) -> RuleUpdate {
        RuleUpdate {
            rule,
            mode: self.mode,
            grant_rate_per_s: 0,
            spare_per_s: 0,
            lead_ns: self.lead_ns(now),
            ranges: Vec::new(),
            reset,
            shift: 0,
        }
    }

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

    /// Grants positions `[a, b)` of epoch `f` (the fleet's slots, in this
    /// process's time: shifted by its clock's offset, [`Skew`]), counted.
    fn grant_positions(&mut self, f: u64, a: u64, b: u64) -> Vec<(u64, u64)> {
        let g = self.spec.grid;
        let shift = g.shift_slots(self.skew.offset_epochs);
        bump(&mut self.granted, f, |v| v + (b - a));
        self.stats.granted += b - a;
        g.position_ranges(f, a, b)
            .into_iter()
            .map(|(x, y)| {
                (
                    x.saturating_add_signed(shift),
                    y.saturating_add_signed(shift),
                )
            })
            .collect()
    }

    /// The engine lost its counters: nothing seen or added there holds.
    fn forget_counters(&mut self) {
        self.forget_grants();
        self.member_adds.clear();
        self.seen.clear();
        self.demand_ranges.clear();
        self.demand_owed.clear();
        self.demand_totals.clear();
        self.demand_seen = false;
        self.reference_read = None;
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
    /// Shares failed calls claimed, to forgive ([`Caller::take_forgiven`]).
    forgiven: Vec<Forgiven>,
    /// When the current run of failures was last logged.
    warned_at: Option<u64>,
    /// Where the service's clock stands against ours: the reference a
    /// clock vote may not move a grid away from.
    service: ServiceClock,
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
                    plan_for: None,
                    member_adds: Vec::new(),
                    seen: Vec::new(),
                    granted: Vec::new(),
                    shares: Vec::new(),
                    first_answer: None,
                    born: None,
                    others_demand: 0,
                    demand_ranges: Vec::new(),
                    demand_owed: Vec::new(),
                    demand_totals: Vec::new(),
                    demand_seen: false,
                    reference_read: None,
                    member_looks: Vec::new(),
                    lag: lag_epochs(epoch_ns, engine.timeout_ns, engine.max_clock_skew_ns),
                    ahead: ahead_epochs(epoch_ns, engine.timeout_ns, engine.max_clock_skew_ns),
                    arrived_samples: Vec::new(),
                    demand: 0,
                    deficit: 0,
                    mode: Mode::Grid,
                    stats: RuleStats::default(),
                    skew: Skew::new(epoch_ns, engine.max_clock_skew_ns),
                    own_adds: Vec::new(),
                    shift: 0,
                    second: None,
                    seen_second: (0, None, None),
                    mismatch_warned: None,
                    move_refused: None,
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
            forgiven: Vec::new(),
            warned_at: None,
            service: ServiceClock::default(),
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

    /// The shares claimed by calls that failed since the last take, to
    /// forgive ([`super::forgive`]).
    pub fn take_forgiven(&mut self) -> Vec<Forgiven> {
        std::mem::take(&mut self.forgiven)
    }

    /// Rule `i`'s grid.
    pub fn grid(&self, i: usize) -> Option<Grid> {
        self.rules.get(i).map(|r| r.spec.grid)
    }

    /// Rule `i`'s clock offset from the other proxies', in its epochs.
    pub fn clock_offset_epochs(&self, i: usize) -> Option<i64> {
        self.rules.get(i).map(|r| r.skew.offset_epochs)
    }

    /// Called on every tick of the calling VM with the wall time and one
    /// [`RuleFacts`] per rule. Returns the call to send, if any, and the
    /// rules whose mode changed (publish them).
    pub fn tick(&mut self, now: u64, facts: &[RuleFacts]) -> (Option<Call>, Vec<RuleUpdate>) {
        // The gates of the planning, read before anything changes: the very
        // reading [`Caller::may_plan`] gave the glue for these facts.
        let held_back = self.held_back(now);
        for i in 0..self.rules.len() {
            let e = self.plan_epoch(now, i);
            if let Some(r) = self.rules.get_mut(i) {
                r.plan_for = e;
            }
        }
        let mut updates = Vec::new();
        if self.call_lost(now) {
            updates = self.failed(now, Failure::Timeout);
        }
        for (r, fact) in self.rules.iter_mut().zip(facts) {
            sample_arrivals(r, now, fact.arrived_total);
        }
        updates.extend(self.fallback_if_due(now));
        let call = self.plan(now, facts, held_back, &mut updates);
        (call, updates)
    }

    /// Whether `tick(now, ..)` sends no call: one in flight, or the pace's
    /// due time not reached. Read before the tick changes anything: a call
    /// given up as lost is dropped by then, and a due time further ahead
    /// than the pace allows (the clock stepped back) is reset.
    fn held_back(&self, now: u64) -> bool {
        (self.in_flight.is_some() && !self.call_lost(now))
            || (!self.pace_stepped_back(now)
                && self
                    .call_due
                    .is_some_and(|t| now.saturating_add(CALL_TOLERANCE_NS) < t))
    }

    /// The epoch `tick(now, ..)` plans a claim of caller rule `i` for, or
    /// `None` if it plans none for the rule: the call not held back
    /// ([`Caller::held_back`]) and the rule's epoch on the fleet's clock due
    /// ([`epoch_due`]; a rule whose epoch clock stepped back forgets what it
    /// planned first). Read without changing anything. The one reading of
    /// the planning gates: `tick` reads it first and plans for exactly these
    /// epochs, and [`Caller::may_plan`] is whether it is `Some`.
    fn plan_epoch(&self, now: u64, i: usize) -> Option<u64> {
        if self.held_back(now) {
            return None;
        }
        let r = self.rules.get(i)?;
        let now = r.fleet_time(now);
        let e = r.spec.grid.epoch_of(now);
        let last = if epoch_stepped_back(r, e) {
            None
        } else {
            r.last_epoch
        };
        epoch_due(&r.spec.grid, last, e, now, self.phase_permille).then_some(e)
    }

    /// Whether `tick(now, ..)` plans a claim for caller rule `i`: the facts
    /// that cost a host read (`owned_soon`) are needed only then. Cheap: it
    /// reads only the caller's own state. Both this and the planning in
    /// `tick` are `plan_epoch` on the same state, so they cannot
    /// disagree (testing builds no longer check it on every tick).
    pub fn may_plan(&self, now: u64, i: usize) -> bool {
        self.plan_epoch(now, i).is_some()
    }

    /// Whether the call in flight is given up as lost by `now`.
    fn call_lost(&self, now: u64) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|f| now.saturating_sub(f.sent_at) > lost_after(self.timeout_ns))
    }

    /// Whether the pace's due time lies further ahead than the pace allows
    /// (the clock stepped back).
    fn pace_stepped_back(&self, now: u64) -> bool {
        self.call_due
            .is_some_and(|t| t > now.saturating_add(2 * MIN_CALL_INTERVAL_NS))
    }

    /// Plans the call of this tick: `held_back` is [`Caller::held_back`],
    /// and each rule's `plan_for` [`Caller::plan_epoch`], read at the start
    /// of the tick. A rule's share of an epoch that opens the hour ([`Grid::opens_hour`]) needs
    /// no call: it is granted at once, in `updates`.
    fn plan(
        &mut self,
        now: u64,
        facts: &[RuleFacts],
        held_back: bool,
        updates: &mut Vec<RuleUpdate>,
    ) -> Option<Call> {
        if self.pace_stepped_back(now) {
            // A due time further ahead than the pace allows: the clock
            // stepped back. Pace from now.
            self.call_due = None;
        }
        if held_back {
            return None;
        }
        let (skew, timeout) = (self.skew_ns, self.timeout_ns);
        let wall = now;
        let permille = self.phase_permille;
        // When this call was due by the phase of the epochs it plans (local
        // time): the pace counts from there, not from a late tick.
        let mut phase_at: Option<u64> = None;
        let mut plan = Vec::new();
        for (i, (r, fact)) in self.rules.iter_mut().zip(facts).enumerate() {
            let g = r.spec.grid;
            r.born.get_or_insert(now);
            // Epochs are counted on the fleet's clock.
            let now = r.fleet_time(now);
            let e = g.epoch_of(now);
            if epoch_stepped_back(r, e) {
                // The clock stepped back: grants planned ahead of it no
                // longer line up. Plan afresh from here.
                r.forget_grants();
                r.skew.restart();
            }
            // Planned only for the epoch `plan_epoch` named at the start of
            // the tick (`e`, if due).
            if r.plan_for != Some(e) {
                continue;
            }
            let due = wall.saturating_sub(now.saturating_sub(phase_due(&g, e, permille)));
            phase_at = Some(phase_at.map_or(due, |t| t.min(due)));
            r.granted.retain(|(f, _)| *f > e);
            // Shares of epoch e+k come from the demand of y = e+k-1-lag, whose
            // total was looked at in the last epoch (its adds complete by then).
            let (lag, k) = (r.lag, r.ahead);
            let ahead = e + k;
            let y = (ahead - 1).saturating_sub(lag);
            let look = ahead.saturating_sub(lag);
            // An epoch that opens the service's hour takes its share by the
            // hour before's last total, without a claim ([`Grid::opens_hour`]).
            let span = k + lag + 1;
            let back = reference_back(&g);
            let opens = g.opens_hour(ahead, skew, span);
            let by = if opens {
                g.reference(ahead, lag, back)
            } else {
                y
            };
            let next = e + 1;
            let next_by = g
                .opens_hour(next, skew, span)
                .then(|| g.reference(next, lag, back));
            // The next hour's reference, kept from when it is placed.
            let coming = g.reference(ahead.saturating_add(g.epochs_per_hour()), lag, back);
            let keep =
                y.min(by)
                    .min(next_by.unwrap_or(y))
                    .min(if coming <= ahead { coming } else { y });
            // Its total, looked at again in the last plan before the hour's
            // first share: every add to it is counted by then.
            let reference_look = (!opens && g.opens_hour(ahead + 1, skew, span))
                .then(|| g.reference(ahead + 1, lag, back));
            r.demand_ranges.retain(|(f, ..)| *f >= keep);
            r.demand_owed.retain(|(f, _)| *f >= keep);
            r.demand_totals.retain(|(f, _)| *f >= keep);
            r.seen.retain(|(f, _)| *f + 2 > e);
            r.member_adds.retain(|f| *f > e);
            let mut demand = r.demand;
            if demand == 0 && (r.mode != Mode::Grid || fact.waiting > 0 || fact.owed > 0) {
                // Waiting requests, slots owed, or a fallback that must probe
                // the engine every epoch count as demand before arrivals are
                // measured.
                demand = DEMAND_UNIT;
            }
            // Slots owed alone (requests that went on credit, none arriving
            // or waiting now) are a debt, not an arrival rate: placed spread
            // over the `k + lag + 1` epochs before their shares come due,
            // and not at all while the fleet asks for the rate or more (a
            // share taken to repay it is taken from proxies with arrivals;
            // it is repaid from leftovers). Until issue 29 a debt placed a
            // request an epoch until repaid: in an oversubscribed fleet of
            // many proxies with a request every few seconds, the debts
            // outweighed a busy proxy's arrivals, which drew 7 of the 26
            // slots it was owed (fleet sweep seed 146).
            let owes_only =
                r.mode == Mode::Grid && r.demand == 0 && fact.waiting == 0 && fact.owed > 0;
            let places = !owes_only || !over_rate(&g, r.stats.demand);
            if owes_only {
                let spread = r.ahead.saturating_add(r.lag).saturating_add(1).max(1);
                demand = (fact.owed.saturating_mul(DEMAND_UNIT) / spread).max(1);
            }
            if demand == 0 {
                // A proxy that stopped starts afresh when its demand returns.
                r.deficit = 0;
                continue;
            }
            // Whole requests per epoch, for the leftover claim (a fraction
            // of one claims nothing ahead: it goes on credit, and what it
            // owes is claimed next).
            let a = demand / DEMAND_UNIT;
            r.last_epoch = Some(e);
            let mut positions = (0, 0);
            let share = match (lookup3(&r.demand_ranges, by), lookup(&r.demand_totals, by)) {
                (Some(place), total) if total > 0 => {
                    let (l, total) = (g.slots_in(ahead), total.max(place.1));
                    let phi = epoch_phase(&g, ahead);
                    positions = share_positions(&g, l, place, total, phi);
                    let share = share(&g, l, place, total, phi);
                    // Owed by its own demand, whatever its deficit added.
                    let own = r
                        .demand_owed
                        .iter()
                        .find(|(f, _)| *f == by)
                        .map_or(place.1 - place.0, |&(_, d)| d);
                    let owed = fair_share(&g, l, (0, own), total);
                    r.deficit = if over_rate(&g, total) {
                        r.deficit
                            .saturating_add(owed)
                            .saturating_sub(
                                i64::try_from(share)
                                    .unwrap_or(i64::MAX)
                                    .saturating_mul(DEFICIT_UNIT),
                            )
                            .clamp(-DEFICIT_CAP, DEFICIT_CAP)
                    } else {
                        // Below the rate a share is the demand: no lottery.
                        0
                    };
                    share
                }
                _ => 0,
            };
            // Below the rate, once the demand totals have settled: this
            // proxy's part of the spare too ([`spare`]).
            let settled = r.settled(now);
            // The part of epoch `e+k`'s spare that goes with its share (the
            // same total), for the rate this proxy can expect
            // ([`shares::grant_rate`]).
            let spare_of_share = match lookup(&r.demand_totals, by) {
                total if settled && r.mode == Mode::Grid && total > 0 => spare(
                    &g,
                    g.slots_in(ahead),
                    total,
                    r.stats.members,
                    spare_phase(&g, ahead, self.phase_permille),
                ),
                _ => 0,
            };
            // A total seen to be 0 is a fleet asking for nothing, not one
            // never seen: a lone proxy back from idle looks first at a total
            // of its idle spell while its own demand still reads 0 (the
            // arrivals counter moves at the workers' ticks). Until issue 29
            // it then claimed no spare, only the slot it owed, for the next
            // two epochs, and their requests waited for the one after
            // (fleet sweep seed 54: a lone proxy at 19/s of 300/s, b0,
            // waited 47 ms at 6.26 s).
            let extra = if settled && r.mode == Mode::Grid && r.demand_seen {
                let phi = spare_phase(&g, next, self.phase_permille);
                spare(&g, g.slots_in(next), r.stats.demand, r.stats.members, phi)
            } else {
                0
            };
            // Waiting requests take this epoch's owned slots first: only
            // those beyond them need the next epoch's leftovers. Until
            // issue 29 a proxy with a line claimed it again every epoch
            // while the last epoch's leftovers served it, took all of `L`
            // first come, left its surplus unused and others with none
            // (fleet sweep seed 10: a request within the rate waited 179 ms).
            let need = a
                .saturating_add(fact.waiting.saturating_sub(fact.owned_soon))
                .saturating_add(fact.owed)
                .saturating_add(extra);
            let leftover = need
                .saturating_sub(lookup(&r.granted, next))
                .min(g.slots_in(next));
            // Leftovers of an epoch that opens the hour come after the
            // positions its shares took without a claim: all of them, by
            // the one total every proxy placed them by (unknown here: no
            // leftover claim).
            let leftover_base = match next_by {
                None => Some(0),
                Some(f) if r.reference_read != Some(f) => None,
                Some(f) => r
                    .demand_totals
                    .iter()
                    .find(|(x, _)| *x == f)
                    .map(|&(_, t)| {
                        let l = g.slots_in(next);
                        share_positions(&g, l, (0, t), t, epoch_phase(&g, next)).1
                    }),
            };
            let mut push = |purpose, epoch, hits| {
                plan.push(Planned {
                    rule: i,
                    purpose,
                    epoch,
                    hits,
                    base: match purpose {
                        Purpose::Leftover => leftover_base.unwrap_or(0),
                        _ => 0,
                    },
                })
            };
            if let Some(f) = reference_look.filter(|&f| g.may_claim(f, now, skew, timeout)) {
                push(Purpose::ReferenceLook, f, 0);
            }
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
            if let Some(at) = r.skew.recheck_due(ahead) {
                if g.may_claim(at, now, skew, timeout) {
                    push(Purpose::Recheck, at, 0);
                }
            }
            if g.may_claim(next, now, skew, timeout) {
                // Also the loss detector: it includes this proxy's own add.
                push(Purpose::MemberLook, next, 0);
                if leftover > 0 && leftover_base.is_some() {
                    push(Purpose::Leftover, next, leftover);
                }
            }
            if g.may_claim(ahead, now, skew, timeout) {
                // Once per counter, even if the clock stepped back over it:
                // other proxies count the members there.
                if !r.own_adds.contains(&ahead) {
                    push(Purpose::MemberAdd, ahead, 1);
                }
                if lookup3(&r.demand_ranges, ahead).is_none() && places {
                    let backlog = fact.waiting.saturating_sub(fact.owned_soon);
                    let spread = k.saturating_add(lag).saturating_add(1).max(1);
                    let base = demand.saturating_add(backlog.saturating_mul(DEMAND_UNIT) / spread);
                    let total = lookup(&r.demand_totals, y);
                    r.demand_owed.retain(|(f, _)| *f != ahead);
                    r.demand_owed.push((ahead, base));
                    push(
                        Purpose::DemandAdd,
                        ahead,
                        deficit_hits(&g, base, r.deficit, total),
                    );
                }
                if share > 0 && !opens {
                    push(Purpose::Share, ahead, share);
                }
                if lookup3(&r.demand_ranges, y).is_some() && !opens {
                    // The share is known now, before the engine answers (a
                    // share of nothing counts as nothing); and with it what
                    // the same total leaves over, this proxy's part of which
                    // it claims with the leftovers: the two add up to `L`
                    // for a lone proxy however its demand moves.
                    r.shares.push((ahead, share, spare_of_share));
                }
            }
            if opens
                && r.mode == Mode::Grid
                && r.reference_read == Some(by)
                && lookup3(&r.demand_ranges, by).is_some()
            {
                // Every proxy takes the positions its place in the same
                // total gives it: they tile the epoch without a claim. The
                // same total: one looked at again seconds after the adds
                // to it. Until 2026-12-02 the total was the one behind the
                // hour's first share, looked at `lag` epochs after its adds:
                // a proxy 1.2 s ahead, its skew not yet found, read it
                // before the others added to it, and its positions overlap
                // theirs (fleet sweep --at-hour seeds 30, 116, 167, scenario
                // skewed-at-hour: a slot granted twice).
                r.shares.push((ahead, share, spare_of_share));
                if share > 0 {
                    let ranges = r.grant_positions(ahead, positions.0, positions.1);
                    let rates = grant_rate(r, wall);
                    updates.push(RuleUpdate {
                        rule: i,
                        mode: Mode::Grid,
                        grant_rate_per_s: rates.0,
                        spare_per_s: rates.1,
                        lead_ns: r.lead_ns(wall),
                        ranges,
                        reset: std::mem::take(&mut r.reset),
                        shift: std::mem::take(&mut r.shift),
                    });
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
                    | Purpose::Recheck
                    | Purpose::Gen
                    | Purpose::NameAdd
                    | Purpose::GridAdd
                    | Purpose::NameLook
                    | Purpose::GridLook => Counter::Members,
                    Purpose::DemandAdd | Purpose::DemandLook | Purpose::ReferenceLook => {
                        Counter::Demand
                    }
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
        // The pace runs from when the call was due by its phase: one sent
        // late (the first call of a rule, a late tick) does not hold every
        // later call as late. Until 2026-12-02 it ran from the late call,
        // and a proxy whose first call came 92 ms into an epoch called ~60
        // ms in ever after, behind every other proxy's leftover claims (the
        // fleet sweep's `sporadic` with the hour 98 s in: its credit went
        // unrepaid for 1.3 s). Calls stay at least the interval apart.
        let anchor = phase_at.unwrap_or(now).min(now);
        self.call_due = Some(
            self.call_due
                .map_or(anchor, |t| t.max(anchor))
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
}

/// The rules a plan carries, each once.
fn rules_of(plan: &[Planned]) -> Vec<usize> {
    let mut out: Vec<usize> = plan.iter().map(|p| p.rule).collect();
    out.dedup();
    out
}

/// Requests in the last spacing that tell a rush from chance (Poisson: 8
/// expected, fewer than 2 seen, or more than 16, is rare).
const RUSH_EVIDENCE: u64 = 8;

/// Updates the estimate of arrivals per epoch from the process counter,
/// over the span of the samples kept (one epoch, or slot, at first, then up
/// to `ARRIVAL_SAMPLES - 1` of them).
fn sample_arrivals(r: &mut RuleState, now: u64, arrived_total: u64) {
    let e_ns = r.spec.grid.epoch_ns;
    // Samples an epoch apart, or a slot apart for rates below 10/s: a
    // rule's demand is measured over about five of its slots at least.
    let spacing = e_ns.max(r.spec.grid.interval_ns);
    if let Some(&(_, at)) = r.arrived_samples.last() {
        if now.saturating_sub(at) < spacing {
            return;
        }
    }
    if let Some(&(prev, at)) = r.arrived_samples.first() {
        let n = arrived_total.saturating_sub(prev);
        r.demand = div_ceil_u128(n.saturating_mul(DEMAND_UNIT), e_ns, now.saturating_sub(at));
        // A rush that starts or stops shows in the last spacing at once:
        // with enough requests to tell (8 in it, or 8 expected), a rate
        // there above twice the average or below a quarter of it is the
        // demand now (a proxy that stopped no longer claims its shares for
        // half a second, nor does one that started wait that long for its).
        if let Some(&(last, last_at)) = r.arrived_samples.last() {
            let span = now.saturating_sub(last_at);
            let recent_n = arrived_total.saturating_sub(last);
            let recent = div_ceil_u128(recent_n.saturating_mul(DEMAND_UNIT), e_ns, span);
            let expected = u128::from(r.demand) * u128::from(span)
                / (u128::from(DEMAND_UNIT) * u128::from(e_ns.max(1)));
            let telling = recent_n >= RUSH_EVIDENCE || expected >= u128::from(RUSH_EVIDENCE);
            if r.arrived_samples.len() > 1
                && telling
                && (recent > r.demand.saturating_mul(2) || recent < r.demand / 4)
            {
                r.demand = recent;
            }
        }
    }
    r.arrived_samples.push((arrived_total, now));
    if r.arrived_samples.len() > ARRIVAL_SAMPLES {
        r.arrived_samples.remove(0);
    }
}

/// Whether a rule on grid `g` that last planned epoch `last` plans epoch `e`
/// now (fleet time): not yet planned, and this proxy's phase of the epoch
/// reached.
fn epoch_due(g: &Grid, last: Option<u64>, e: u64, now: u64, phase_permille: u64) -> bool {
    last.is_none_or(|last| last < e) && now >= phase_due(g, e, phase_permille)
}

/// When (fleet time) a process with phase `phase_permille` calls in epoch
/// `e` of grid `g`.
fn phase_due(g: &Grid, e: u64, phase_permille: u64) -> u64 {
    g.epoch_start(e)
        .saturating_add(phase_offset(g.epoch_ns, phase_permille))
}

/// Whether rule `r` planned epochs beyond `e + 1` (the clock stepped back).
fn epoch_stepped_back(r: &RuleState, e: u64) -> bool {
    r.last_epoch.is_some_and(|last| last > e + 1)
}
