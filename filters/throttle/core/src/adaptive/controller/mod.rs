//! The learner: from the answers of what it released, the rate to pace at.
//! Called once per round (the learner's tick, ~100 ms) with that round's
//! [`Tally`]; returns the interval to pace at and the reasons it moved.
//!
//! One round: the bookkeeping (`history.rs`: rounds, requests in flight,
//! the latency reference), then the signals that cut (`signals.rs`: the
//! load's own bad answers, a queue that grows), else the step of the phase
//! it is in (`phases.rs`: cruise, probe, drain). The design and its
//! reasons: `../README.md`.

mod history;
mod phases;
mod signals;

use std::collections::VecDeque;

use super::tally::Tally;
use crate::NS_PER_S;
use history::{Reference, Round};

/// Rates are kept in micro-requests per second (1/h is 277; 1,000,000/s is
/// 10^12), so every rate the configuration accepts is exact to 0.1% or better.
pub const MICRO: u64 = 1_000_000;
/// Nanoseconds per second times [`MICRO`].
const NS_MICRO: u128 = NS_PER_S as u128 * MICRO as u128;

/// The rate (µreq/s) of one request every `interval_ns` (rounded down).
pub fn rate_of_interval(interval_ns: u64) -> u64 {
    u64::try_from(NS_MICRO / u128::from(interval_ns.max(1))).unwrap_or(u64::MAX)
}

/// The interval (ns) of a rate in µreq/s, rounded up (so the rate paced at
/// never exceeds it); `u64::MAX` for 0.
pub fn interval_of_rate(rate: u64) -> u64 {
    if rate == 0 {
        return u64::MAX;
    }
    u64::try_from(NS_MICRO.div_ceil(u128::from(rate))).unwrap_or(u64::MAX)
}

/// `count` events over `dur_ns`, in µreq/s (0 over no time).
fn per_s(count: u64, dur_ns: u64) -> u64 {
    if dur_ns == 0 {
        return 0;
    }
    u64::try_from(u128::from(count) * NS_MICRO / u128::from(dur_ns)).unwrap_or(u64::MAX)
}

/// How many requests a rate (µreq/s) sends in `dur_ns`.
fn count_in(rate: u64, dur_ns: u64) -> u64 {
    u64::try_from(u128::from(rate) * u128::from(dur_ns) / NS_MICRO).unwrap_or(u64::MAX)
}

/// `x` times `pct` percent.
fn pct(x: u64, pct: u64) -> u64 {
    u64::try_from(u128::from(x) * u128::from(pct) / 100).unwrap_or(u64::MAX)
}

const MS: u64 = crate::NS_PER_MS;

/// The controller's constants. [`Tuning::default`] is what the filter uses;
/// tests may vary them. The target they serve: after a change of capacity,
/// the rate paced at is within ±10% of it within 2 s and stays there, so
/// nothing the learner does on its own (cruise, probe, dip, drain) leaves
/// that band over a whole second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Answers a window needs before they may move the rate; with fewer
    /// (low traffic) the rate is kept as it is.
    pub min_samples: u64,
    /// The load's own bad answers (shed or failed, spread over the rule's
    /// paths and clients: [`Tally::load_bad`]) above this many per mille of
    /// the answers in a window cut the rate.
    pub overload_permille: u64,
    /// Cruise at this share (%) of the capacity measured when the upstream
    /// last fell behind, shed or delivered a probe: a small queue drains.
    pub cruise_pct: u64,
    /// Drain a queue the upstream built at this share (%) of its capacity:
    /// within the band, and the queue falls by the rest every second.
    pub drain_pct: u64,
    /// A queue longer than this (at the capacity) is drained faster: its
    /// excess within a second, never below half the capacity.
    pub queue_budget_ns: u64,
    /// Gain (%) of a probe above the rate; each probe in a row delivered far
    /// above the capacity known adds `gain_pct - 100` more, up to
    /// `max_gain_pct` (from the floor back to a demand ten times higher in a
    /// few seconds).
    pub gain_pct: u64,
    pub max_gain_pct: u64,
    /// Gain (%) of the first probe from a rate near the capacity measured
    /// (85% of it or more): +10% for 400 ms is +4% of a second's rate, so
    /// neither the probe nor the queue it leaves when the capacity has not
    /// moved takes the rate out of the ±10% band (+20% and its drain did).
    /// Kept at half its gain above the rate, as `delivered_pct` is to
    /// `gain_pct`; one delivered far above the capacity goes on at
    /// `gain_pct` and more.
    pub gentle_gain_pct: u64,
    /// Gain (%) over what the upstream answered well when it last shed, for
    /// a probe that would go above it (each probe there costs answers
    /// clients see): gentle, and judged over `slow_window_ns`.
    pub near_shed_gain_pct: u64,
    /// A probe lasts this long (at least two reference latencies, and long
    /// enough to send twice `min_samples`): long enough to measure, short
    /// enough that one not delivered stays within the band.
    pub probe_len_ns: u64,
    /// Wait before probing again after a probe that was not delivered, and
    /// after a cut (doubling, up to eight times, while probes keep being
    /// shed).
    pub probe_wait_ns: u64,
    /// A probe is kept if what it sent was served at more than this share
    /// (%) of the rate before it, and half as much above the capacity last
    /// measured (answers of a busy upstream vary by a few percent); the
    /// next one goes further only if it was this far above that capacity.
    pub delivered_pct: u64,
    /// The queue test: in each half of a window, requests in flight grew by
    /// more than 2 and this share (%) of what was sent in that half, and
    /// the mean latency rose by more than `latency_rise_pct` of the
    /// reference latency (and three standard errors). Windows: twice the
    /// reference latency (300 ms to 1.6 s), and `slow_window_ns` at half
    /// the share for slow growth.
    pub growth_pct: u64,
    pub latency_rise_pct: u64,
    pub slow_window_ns: u64,
    /// The latency reference is the lowest mean latency of 500 ms chunks
    /// (of 20 answers at least) over this long.
    pub reference_ns: u64,
    /// Whether the pacer brings held requests forward when the rate rises
    /// (then a higher rate goes out at once; otherwise only after what the
    /// schedule already holds, `ahead_ns`). The filter does; the simulation
    /// can show what happens without.
    pub retime_up: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            min_samples: 10,
            overload_permille: 10,
            cruise_pct: 95,
            drain_pct: 92,
            queue_budget_ns: 500 * MS,
            gain_pct: 120,
            max_gain_pct: 200,
            gentle_gain_pct: 110,
            near_shed_gain_pct: 105,
            probe_len_ns: 400 * MS,
            probe_wait_ns: NS_PER_S,
            delivered_pct: 110,
            growth_pct: 5,
            latency_rise_pct: 10,
            slow_window_ns: 2 * NS_PER_S,
            reference_ns: 10 * NS_PER_S,
            retime_up: true,
        }
    }
}

/// Why the rate moved (or was held), for the rule's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Cut: the upstream shed (429/503) more than the tolerance.
    Shed,
    /// Cut: other 5xx, resets, connection failures or upstream timeouts.
    Failed,
    /// Cut: requests in flight kept growing (the upstream fell behind), or
    /// a queue stood (latency above the reference, or beyond the route's
    /// timeout).
    Queue,
    /// The queue a cut found is drained: back to the rate it measured.
    Drained,
    /// A probe above the rate started.
    Probe,
    /// A probe ended well: its rate is kept.
    Kept,
    /// The upstream's `Retry-After` holds probing back.
    RetryAfter,
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::Shed,
        Reason::Failed,
        Reason::Queue,
        Reason::Drained,
        Reason::Probe,
        Reason::Kept,
        Reason::RetryAfter,
    ];

    /// Name of its counter (`throttle.rule.<name>.adaptive_<this>`).
    pub fn name(self) -> &'static str {
        match self {
            Reason::Shed => "shed",
            Reason::Failed => "failed",
            Reason::Queue => "queue",
            Reason::Drained => "drained",
            Reason::Probe => "probe",
            Reason::Kept => "kept",
            Reason::RetryAfter => "retry_after",
        }
    }
}

/// A set of [`Reason`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reasons(u16);

impl Reasons {
    pub fn add(&mut self, r: Reason) {
        self.0 |= 1 << (r as u16);
    }
    pub fn has(&self, r: Reason) -> bool {
        self.0 & (1 << (r as u16)) != 0
    }
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }
    pub fn iter(&self) -> impl Iterator<Item = Reason> + '_ {
        Reason::ALL.into_iter().filter(|r| self.has(*r))
    }
}

/// The answer of one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Update {
    /// Interval to pace at, ns, within the bounds.
    pub interval_ns: u64,
    /// The same as a rate, µreq/s.
    pub rate: u64,
    pub reasons: Reasons,
}

/// What the learner is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// At the rate, probing now and then while demand reaches it.
    Cruise,
    /// Probing at a gain above `before` since `start`, until `until`;
    /// judged at `judge` on what the upstream delivered of it (a gentle
    /// probe near a rate the upstream shed at: on whether it shed again).
    Up {
        before: u64,
        start: u64,
        until: u64,
        judge: u64,
        near_shed: bool,
        /// The probe's own rate, and whether its time is up and that was
        /// acted on (kept early, drained, or back to `before`).
        probe: u64,
        ended: bool,
    },
    /// Below the capacity since `since` until the queue is gone; the drain
    /// rate went out at `from`; `busy`: how many times the capacity was
    /// measured on the upstream working off its backlog meanwhile.
    Drain { since: u64, from: u64, busy: u64 },
}

/// Rounds kept at most (the learner is meant to be called every ~100 ms;
/// called far more often, it keeps less history rather than more memory).
const MAX_ROUNDS: usize = 1024;

/// The learner of one rule. Pure: time comes in as arguments.
#[derive(Debug, Clone)]
pub struct Controller {
    tune: Tuning,
    /// The bounds as given (intervals, exact) and as rates.
    min_interval_ns: u64,
    max_interval_ns: u64,
    min_rate: u64,
    max_rate: u64,
    rate: u64,
    rounds: VecDeque<Round>,
    in_flight: u64,
    last: Option<u64>,
    /// Recent mean latency (0 until seen).
    latency_ns: u64,
    reference: Reference,
    /// Cuts wait until the last change shows in the answers.
    settle_until: u64,
    /// No probe before this (the upstream's `Retry-After`, when its sheds
    /// were the load's).
    hold_until: u64,
    next_probe: u64,
    /// Wait after a cut before probing: grows while probes keep being shed.
    cut_wait_ns: u64,
    /// Probes delivered in a row.
    streak: u64,
    /// The gain (%) of the probe running or last run; whether the next
    /// probe is a full one (a gentle one was kept).
    probe_gain_pct: u64,
    escalate: bool,
    /// What the upstream answered well when it last shed: probes above it
    /// go gently.
    shed_ceiling: Option<u64>,
    /// Bad answers tolerated (per mille): the tuned share, or more once a
    /// cut did not lower it (errors the rate cannot fix); and the share
    /// that caused the last cut for answers.
    tolerated_permille: u64,
    last_cut_permille: Option<u64>,
    /// Cuts in a row that did not lower the share of shed answers: a 429
    /// is the upstream asking for less, so two such cuts (not one) are
    /// needed before the shedding is taken as not the load's.
    futile_sheds: u32,
    /// The capacity measured when the upstream last fell behind, shed, or
    /// delivered a probe (µreq/s; 0: not yet): where the evidence is.
    capacity: u64,
    phase: Phase,
}

impl Controller {
    /// A learner that starts at `start_interval_ns` and keeps the rate within
    /// the bounds, given as intervals (`max_interval_ns` is the interval of
    /// the lowest rate).
    pub fn new(
        start_interval_ns: u64,
        min_interval_ns: u64,
        max_interval_ns: u64,
        tune: Tuning,
    ) -> Self {
        let min_interval_ns = min_interval_ns.max(1);
        let max_interval_ns = max_interval_ns.max(min_interval_ns);
        let max_rate = rate_of_interval(min_interval_ns);
        let min_rate = rate_of_interval(max_interval_ns).min(max_rate);
        Controller {
            tune,
            min_interval_ns,
            max_interval_ns,
            min_rate,
            max_rate,
            rate: rate_of_interval(start_interval_ns).clamp(min_rate, max_rate),
            rounds: VecDeque::new(),
            in_flight: 0,
            last: None,
            latency_ns: 0,
            reference: Reference::default(),
            settle_until: 0,
            hold_until: 0,
            next_probe: 0,
            cut_wait_ns: tune.probe_wait_ns,
            streak: 0,
            probe_gain_pct: tune.gain_pct,
            escalate: false,
            shed_ceiling: None,
            tolerated_permille: tune.overload_permille,
            last_cut_permille: None,
            futile_sheds: 0,
            capacity: 0,
            phase: Phase::Cruise,
        }
    }

    /// The rate to pace at now, µreq/s.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The interval to pace at now, ns, within the bounds.
    pub fn interval_ns(&self) -> u64 {
        interval_of_rate(self.rate).clamp(self.min_interval_ns, self.max_interval_ns)
    }

    /// Requests sent and not yet ended, as far as the tallies tell.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The latency without a queue, as last seen (0: not yet), ns.
    pub fn reference_latency_ns(&self) -> u64 {
        self.reference.latency_ns()
    }

    /// One round ends at `now` with what was seen in it. `ahead_ns`: how far
    /// the rule's schedule already reaches beyond `now` (its TAT minus now):
    /// requests held for that long go out at the rate they were admitted at,
    /// so a change shows only after it.
    pub fn update(&mut self, now: u64, tally: &Tally, ahead_ns: u64) -> Update {
        self.record(now, tally);
        let mut reasons = Reasons::default();
        self.decide(now, ahead_ns, &mut reasons);
        Update {
            interval_ns: self.interval_ns(),
            rate: self.rate,
            reasons,
        }
    }

    /// A cut if the signals call for one, else the phase's step.
    fn decide(&mut self, now: u64, ahead_ns: u64, reasons: &mut Reasons) {
        if now >= self.settle_until {
            if let Some(cut) = self
                .overloaded(now, reasons)
                .or_else(|| self.queue_grew(now, ahead_ns))
            {
                self.apply(now, ahead_ns, cut, reasons);
                return;
            }
        }
        if self.idle(now) {
            self.return_to_evidence(now);
            return;
        }
        match self.phase {
            Phase::Cruise => self.cruise(now, ahead_ns, reasons),
            Phase::Up {
                before,
                start,
                until,
                judge,
                near_shed,
                probe,
                ended,
            } => self.probing(
                now,
                ahead_ns,
                (before, probe),
                (start, until, judge),
                (near_shed, ended),
                reasons,
            ),
            Phase::Drain { since, from, busy } => self.drain(now, (since, from), busy, reasons),
        }
    }

    fn set_rate(&mut self, rate: u64) {
        self.rate = rate.clamp(self.min_rate, self.max_rate);
    }

    /// The duration of the last round (100 ms before the first).
    fn round_ns(&self) -> u64 {
        self.rounds.back().map_or(100 * MS, |r| r.dur.max(MS))
    }
}
