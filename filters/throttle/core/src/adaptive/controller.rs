//! The learner: from the answers of what it released, the rate to pace at.
//! Called once per round (the learner's tick, ~100 ms) with that round's
//! [`Tally`]; returns the interval to pace at and the reasons it moved.
//! See the module docs ([`super`]) for the design and its reasons.

use std::collections::VecDeque;

use super::tally::Tally;
use crate::NS_PER_S;

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

/// The start of a window of sums that ends at `now`.
fn w_from(w: &Sums, now: u64) -> u64 {
    now.saturating_sub(w.dur)
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
/// tests may vary them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Answers a window needs before they may move the rate; with fewer
    /// (low traffic) the rate is kept as it is.
    pub min_samples: u64,
    /// Overload answers (shed or failed) above this many per mille of all
    /// answers in a window cut the rate.
    pub overload_permille: u64,
    /// Cruise at this share (%) of the capacity measured when the upstream
    /// last fell behind or shed.
    pub cruise_pct: u64,
    /// Drain a queue the upstream built at most at this share (%) of its
    /// measured capacity, never below `drain_floor_pct`; a queue longer
    /// than `queue_budget_ns` (at that capacity) is drained faster, its
    /// excess within `drain_ns`. A drain ends when requests in flight stop
    /// falling (or after `drain_max_ns`).
    pub drain_pct: u64,
    pub drain_floor_pct: u64,
    pub queue_budget_ns: u64,
    pub drain_ns: u64,
    pub drain_max_ns: u64,
    /// Gain (%) of a probe; each probe kept in a row adds `gain_step_pct`,
    /// up to `max_gain_pct`.
    pub gain_pct: u64,
    pub gain_step_pct: u64,
    pub max_gain_pct: u64,
    /// Gain (%) over what the upstream answered well when it last shed, for
    /// a probe that would go above it (probing there costs answers clients
    /// see): gentle, judged over `slow_window_ns`.
    pub near_shed_gain_pct: u64,
    /// A short probe is kept if what it sent was delivered at more than this
    /// share (%) of the rate before it.
    pub delivered_pct: u64,
    /// ... and at more than this share (%) of the capacity last measured.
    pub delivered_over_capacity_pct: u64,
    /// The queue test: in each half of a window, the requests in flight
    /// grew by more than `growth_min` and by more than a share (%) of the
    /// requests sent in that half, and the mean latency of the second half
    /// is above the first's by `latency_rise_pct` of the reference latency. The fast window is twice
    /// the minimum-latency reference (400 ms to 1.6 s) with
    /// `growth_fast_pct`; the slow one `slow_window_ns` with `growth_slow_pct`.
    pub growth_min: u64,
    pub growth_fast_pct: u64,
    pub growth_slow_pct: u64,
    pub latency_rise_pct: u64,
    /// ... by more than this many standard errors (times 10) of the
    /// difference of the two means: a rise the sampling noise does not explain.
    pub latency_rise_z10: u64,
    pub slow_window_ns: u64,
    /// A short probe lasts this long (at least two reference latencies: what
    /// it delivered is measured over as long).
    pub probe_len_ns: u64,
    /// Wait before probing again after a probe that was not delivered.
    pub probe_wait_ns: u64,
    /// Wait before probing again after a cut for a queue.
    pub queue_wait_ns: u64,
    /// Wait before probing again after a cut for shed answers: starts at
    /// the first, doubles with each shed probe in a row, up to the second.
    pub shed_wait_min_ns: u64,
    pub shed_wait_max_ns: u64,
    /// The minimum-latency reference is the lowest mean latency of 500 ms
    /// chunks (of 20 answers at least) over this long.
    pub reference_ns: u64,
    /// How much history of rounds is kept.
    pub history_ns: u64,
    /// Whether the pacer brings held requests forward when the rate rises
    /// (then a higher rate goes out at once; otherwise only after what the
    /// schedule already holds, `ahead_ns`).
    pub retime_up: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            min_samples: 10,
            overload_permille: 10,
            cruise_pct: 96,
            drain_pct: 92,
            drain_floor_pct: 50,
            queue_budget_ns: 400 * MS,
            drain_ns: NS_PER_S,
            drain_max_ns: 5 * NS_PER_S,
            gain_pct: 125,
            gain_step_pct: 25,
            max_gain_pct: 150,
            near_shed_gain_pct: 105,
            delivered_pct: 112,
            delivered_over_capacity_pct: 106,
            growth_min: 2,
            growth_fast_pct: 5,
            growth_slow_pct: 3,
            latency_rise_pct: 10,
            latency_rise_z10: 30,
            slow_window_ns: 2 * NS_PER_S,
            probe_len_ns: 400 * MS,
            probe_wait_ns: 2 * NS_PER_S,
            queue_wait_ns: 500 * MS,
            shed_wait_min_ns: NS_PER_S,
            shed_wait_max_ns: 8 * NS_PER_S,
            reference_ns: 10 * NS_PER_S,
            history_ns: 3 * NS_PER_S,
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
    /// Cut: requests in flight kept growing (the upstream fell behind).
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

    /// Name of its counter (`throttle.rule.<name>.adaptive_<this>` in phase 2).
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Cruise,
    /// Probing at `before` times a gain since `start`, until `until`;
    /// judged at `judge` on what the upstream delivered of it (a gentle
    /// probe near a rate the upstream shed at: on whether it shed again).
    Up {
        before: u64,
        start: u64,
        until: u64,
        judge: u64,
        near_shed: bool,
    },
    /// A probe that was not delivered: pacing below `before` until
    /// `until`, to take back what it queued.
    Down {
        before: u64,
        until: u64,
    },
    /// Pacing below the capacity since `since` until the queue is gone;
    /// the drain rate went out at `from`. `verify`: pacing lower still
    /// since then, to tell a queue from a slower upstream, with the answers
    /// seen just before.
    Drain {
        since: u64,
        from: u64,
        verify: Option<(u64, Tally)>,
    },
}

#[derive(Debug, Clone, Copy)]
struct Round {
    end: u64,
    dur: u64,
    tally: Tally,
    in_flight_start: u64,
    in_flight_end: u64,
}

/// Sums over consecutive rounds.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    dur: u64,
    tally: Tally,
    growth: i64,
    rounds: u32,
}

impl Sums {
    fn good_rate(&self) -> u64 {
        per_s(self.tally.good, self.dur)
    }
}

/// The latency reference is the lowest mean of chunks of at least this many
/// timed requests over at least `REFERENCE_CHUNK_NS` (the minimum of noisy
/// small means would sit well below the true latency).
const REFERENCE_SAMPLES: u64 = 20;
const REFERENCE_CHUNK_NS: u64 = 500 * MS;

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
    /// Chunk mean latencies of the last `reference_ns`: their minimum is
    /// the latency without a queue; and the chunk being summed (since, tally).
    reference: VecDeque<(u64, u64)>,
    chunk: (u64, Tally),
    /// Cuts wait until the last change shows in the answers.
    settle_until: u64,
    /// No probe before this (the upstream's `Retry-After`).
    hold_until: u64,
    next_probe: u64,
    shed_wait_ns: u64,
    /// Probes kept in a row.
    streak: u64,
    /// What the upstream answered well when it last shed: probes above it
    /// go gently.
    shed_ceiling: Option<u64>,
    /// Overload answers tolerated (per mille): the tuned share, or more once
    /// a cut did not lower it (errors the rate cannot fix); and the share
    /// that caused the last cut for answers.
    tolerated_permille: u64,
    last_cut_permille: Option<u64>,
    /// Cuts in a row that did not lower the share of shed answers: a 429
    /// is the upstream asking for less, so two such cuts (not one) are
    /// needed before the shedding is taken as not the load's.
    futile_sheds: u32,
    /// The capacity measured when the upstream last fell behind, averaged
    /// with the one before when they agree (within 15%).
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
            reference: VecDeque::new(),
            chunk: (0, Tally::EMPTY),
            settle_until: 0,
            hold_until: 0,
            next_probe: 0,
            shed_wait_ns: tune.shed_wait_min_ns,
            streak: 0,
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
        self.reference.iter().map(|(_, l)| *l).min().unwrap_or(0)
    }

    /// One round ends at `now` with what was seen in it. `ahead_ns`: how far
    /// the rule's schedule already reaches beyond `now` (its TAT minus now):
    /// requests held for that long go out at the rate they were admitted at,
    /// so a change shows only after it.
    pub fn update(&mut self, now: u64, tally: &Tally, ahead_ns: u64) -> Update {
        let start = self.last.map_or(now, |l| l.min(now));
        self.last = Some(now.max(start));
        let in_flight_start = self.in_flight;
        self.in_flight = self
            .in_flight
            .saturating_add(tally.sent)
            .saturating_sub(tally.done());
        if self.rounds.len() >= MAX_ROUNDS {
            self.rounds.pop_front();
        }
        self.rounds.push_back(Round {
            end: now,
            dur: now.saturating_sub(start),
            tally: *tally,
            in_flight_start,
            in_flight_end: self.in_flight,
        });
        let keep = self.tune.history_ns.max(self.tune.slow_window_ns);
        while self
            .rounds
            .front()
            .is_some_and(|r| r.end.saturating_add(keep) < now)
        {
            self.rounds.pop_front();
        }
        if let Some(us) = tally.mean_latency_us() {
            let sample = us.saturating_mul(1_000);
            self.latency_ns = if self.latency_ns == 0 {
                sample
            } else {
                (self.latency_ns.saturating_mul(3)).saturating_add(sample) / 4
            };
        }
        if self.chunk.1.timed() == 0 {
            self.chunk.0 = start;
        }
        self.chunk.1.merge(tally);
        if self.chunk.1.timed() >= REFERENCE_SAMPLES
            && now.saturating_sub(self.chunk.0) >= REFERENCE_CHUNK_NS
        {
            if let Some(us) = self.chunk.1.mean_latency_us() {
                self.reference.push_back((now, us.saturating_mul(1_000)));
            }
            self.chunk = (now, Tally::EMPTY);
        }
        // The reference expires (the upstream may have become slower for
        // good), but not while a queue is being drained: a queue that lasts
        // longer than the reference's memory would become the reference.
        // (A slower upstream is told apart by the drain's verify step.)
        let draining = matches!(self.phase, Phase::Drain { .. });
        while !draining
            && self.reference.len() > 1
            && self
                .reference
                .front()
                .is_some_and(|(at, _)| at.saturating_add(self.tune.reference_ns) < now)
        {
            self.reference.pop_front();
        }
        let mut reasons = Reasons::default();
        if tally.retry_after_s > 0 {
            let until = now.saturating_add(tally.retry_after_s.saturating_mul(NS_PER_S));
            self.hold_until = self.hold_until.max(until);
            reasons.add(Reason::RetryAfter);
        }
        self.decide(now, ahead_ns, &mut reasons);
        Update {
            interval_ns: self.interval_ns(),
            rate: self.rate,
            reasons,
        }
    }

    /// Rounds that ended in `(from, to]`.
    fn sums(&self, from: u64, to: u64) -> Sums {
        let mut s = Sums::default();
        let mut first: Option<u64> = None;
        let mut last = 0;
        for r in self
            .rounds
            .iter()
            .filter(|r| r.end > from && r.end <= to && r.dur > 0)
        {
            s.dur = s.dur.saturating_add(r.dur);
            s.tally.merge(&r.tally);
            s.rounds += 1;
            first.get_or_insert(r.in_flight_start);
            last = r.in_flight_end;
        }
        if let Some(first) = first {
            s.growth = i64::try_from(last)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(first).unwrap_or(i64::MAX));
        }
        s
    }

    /// Whether the rounds kept reach back to `from`.
    fn known_since(&self, from: u64) -> bool {
        self.rounds
            .front()
            .is_some_and(|r| r.end.saturating_sub(r.dur) <= from)
    }

    fn set_rate(&mut self, rate: u64) {
        self.rate = rate.clamp(self.min_rate, self.max_rate);
    }

    fn decide(&mut self, now: u64, ahead_ns: u64, reasons: &mut Reasons) {
        let t = self.tune;
        let settled = now >= self.settle_until;
        if settled {
            // 1. The answers say "too much".
            let from = self.settle_until.max(now.saturating_sub(NS_PER_S));
            let w = self.sums(from, now);
            let done = w.tally.done();
            let share = w.tally.overload().saturating_mul(1000) / done.max(1);
            if done >= t.min_samples {
                if let Some(before) = self.last_cut_permille.take() {
                    // The first judgement after a cut: overload answers the
                    // cut did not lower do not come from the load (failures
                    // at once; shed answers after two such cuts in a row).
                    if share.saturating_mul(10) >= before.saturating_mul(7) {
                        let shed = w.tally.shed >= w.tally.failed;
                        self.futile_sheds = self.futile_sheds.saturating_add(u32::from(shed));
                        if !shed || self.futile_sheds >= 2 {
                            self.tolerated_permille =
                                self.tolerated_permille.max(share.saturating_mul(3) / 2);
                        }
                    } else {
                        self.futile_sheds = 0;
                    }
                } else if share <= t.overload_permille {
                    self.tolerated_permille = t.overload_permille;
                    self.futile_sheds = 0;
                }
            }
            if done >= t.min_samples && share > self.tolerated_permille {
                let good = w.good_rate();
                let mut target = pct(self.rate, 90).min(pct(good, t.cruise_pct));
                if w.tally.shed < w.tally.failed {
                    // Failures (5xx, resets) come from a queue or a broken
                    // backend as often as from too many requests: what was
                    // answered well may understate the capacity. At most
                    // halve per cut; the queue test does the rest.
                    target = target.max(self.rate / 2);
                }
                if w.tally.shed > 0 {
                    self.shed_ceiling = Some(good);
                }
                reasons.add(if w.tally.shed >= w.tally.failed {
                    Reason::Shed
                } else {
                    Reason::Failed
                });
                self.cut(now, ahead_ns, target, true);
                self.last_cut_permille = Some(share);
                return;
            }
            // 2. Requests in flight and latency keep growing: the upstream
            //    fell behind. Pace below what it delivers until its queue
            //    is gone. (Not while probing: a probe queues a little on
            //    purpose, and takes it back itself if it was too much.)
            //    Unless the upstream now delivers clearly less than before
            //    the probe: then it lost capacity meanwhile.
            let before_probe = match self.phase {
                Phase::Up { before, .. } | Phase::Down { before, .. } => Some(before),
                _ => None,
            };
            if let Some((w, recent)) = self
                .growing(now)
                .filter(|(_, recent)| before_probe.is_none_or(|b| recent.good_rate() < pct(b, 90)))
            {
                // The upstream was busy all through the window (its queue
                // grew): what it answered well is its capacity; the later
                // half, should the window reach back before a change.
                let earlier = self.sums(w_from(&w, now), now.saturating_sub(recent.dur));
                let (a, b) = (earlier.good_rate(), recent.good_rate());
                // Both halves when they agree; else the later one (after a
                // drop the earlier half still has answers from before it;
                // after a slower service the later half has too few: the
                // drain measures the capacity again while the upstream is
                // busy).
                let measured = if a > pct(b, 90) && a < pct(b, 110) {
                    w.good_rate()
                } else {
                    b
                };
                let c = self.capacity;
                let capacity = if c > 0 && measured > pct(c, 85) && measured < pct(c, 115) {
                    (c + measured) / 2
                } else {
                    measured
                };
                self.capacity = capacity;
                // What it queued, and what the schedule still sends at the old rate.
                let sent = per_s(w.tally.sent, w.dur).min(self.rate);
                let future = count_in(sent.saturating_sub(capacity), ahead_ns);
                let queued = u64::try_from(w.growth.max(0))
                    .unwrap_or(0)
                    .saturating_add(future);
                let beyond = queued.saturating_sub(count_in(capacity, t.queue_budget_ns));
                let drain = pct(capacity, t.drain_pct)
                    .saturating_sub(per_s(beyond, t.drain_ns))
                    .max(pct(capacity, t.drain_floor_pct));
                reasons.add(Reason::Queue);
                // At most to a quarter at once: a backend (or a machine)
                // that stalls for a moment answers next to nothing in the
                // later half, which is no measure of its capacity. A deeper
                // drop is cut again once the first cut shows.
                self.cut(now, ahead_ns, drain.max(self.rate / 4), false);
                self.phase = Phase::Drain {
                    since: now,
                    from: now.saturating_add(ahead_ns),
                    verify: None,
                };
                return;
            }
        }
        match self.phase {
            Phase::Drain {
                since,
                from,
                verify,
            } => self.drain(now, ahead_ns, since, from, verify, reasons),
            // A queue that stays without growing (a drain that ended early,
            // or a probe that went just above): drain it.
            Phase::Cruise if settled && self.standing_queue(now) => {
                let c = if self.capacity > 0 {
                    self.capacity
                } else {
                    self.rate
                };
                reasons.add(Reason::Queue);
                self.cut(now, ahead_ns, pct(c, t.drain_pct), false);
                self.phase = Phase::Drain {
                    since: now,
                    from: now.saturating_add(ahead_ns),
                    verify: None,
                };
            }
            Phase::Up {
                before,
                start,
                until,
                judge,
                near_shed,
            } => {
                if now < until {
                    return;
                }
                if self.rate > before && !near_shed {
                    // The probe's time is up: back to where it started
                    // while its answers come in.
                    self.set_rate(before);
                }
                if now < judge {
                    return;
                }
                self.judge_probe(now, before, start, until, near_shed, reasons);
            }
            Phase::Down { before, until } if now >= until => {
                self.set_rate(before);
                self.phase = Phase::Cruise;
                // The queue test waits until the dip shows.
                self.settle_until = now
                    .saturating_add(self.reference_latency_ns())
                    .saturating_add(self.round_ns());
            }
            // The latency fell: the upstream got room (at cruise it queues a
            // little; with more capacity it stops). Probe now.
            Phase::Cruise if settled && now < self.next_probe && self.latency_fell(now) => {
                self.next_probe = now;
            }
            Phase::Cruise
                if settled
                    && now >= self.next_probe
                    && now >= self.hold_until
                    && self.rate < self.max_rate
                    && self.binding(now)
                    && !self.latency_up(now) =>
            {
                // The gain grows after two probes delivered in a row.
                let gain = t
                    .gain_pct
                    .saturating_add(
                        self.streak
                            .saturating_sub(1)
                            .saturating_mul(t.gain_step_pct),
                    )
                    .min(t.max_gain_pct.max(t.gain_pct));
                let mut target = pct(self.rate, gain);
                let mut near_shed = false;
                if let Some(c) = self.shed_ceiling {
                    if target > pct(c, t.near_shed_gain_pct) {
                        target =
                            pct(c, t.near_shed_gain_pct).max(pct(self.rate, t.near_shed_gain_pct));
                        near_shed = true;
                    }
                }
                let before = self.rate;
                self.set_rate(target);
                // A higher rate goes out at once if the pacer brings held
                // requests forward, else once the schedule's backlog has.
                let start = if t.retime_up {
                    now
                } else {
                    now.saturating_add(ahead_ns)
                };
                let reference = self.reference_latency_ns();
                let (until, judge) = if near_shed {
                    // Gentle and long: a limiter's burst hides a small
                    // excess for a while.
                    let until = start.saturating_add(t.slow_window_ns);
                    (until, until.saturating_add(reference))
                } else {
                    // Short: what it sends too much is taken back after.
                    // Long enough to send twice the answers a judgement
                    // needs at the probe's rate (at low rates 400 ms holds
                    // too few to ever keep a probe).
                    let enough =
                        interval_of_rate(target).saturating_mul(t.min_samples.saturating_mul(2));
                    let len = t
                        .probe_len_ns
                        .max(reference.saturating_mul(2))
                        .max(enough.min(5 * NS_PER_S));
                    let until = start.saturating_add(len);
                    (
                        until,
                        until
                            .saturating_add(reference)
                            .saturating_add(self.round_ns()),
                    )
                };
                self.phase = Phase::Up {
                    before,
                    start,
                    until,
                    judge,
                    near_shed,
                };
                reasons.add(Reason::Probe);
            }
            _ => {}
        }
    }

    /// Judges a probe. A gentle one near a rate the upstream shed at, with
    /// no cut meanwhile, is kept. A short one is kept if the upstream
    /// delivered it: the good answers of what it sent (one reference
    /// latency later) came at clearly more than the rate before (BBR's
    /// delivery-rate probe); then the capacity is at least that, and the
    /// next probe goes further. Otherwise what it queued is taken back by
    /// as long a dip below the rate.
    fn judge_probe(
        &mut self,
        now: u64,
        before: u64,
        start: u64,
        until: u64,
        near_shed: bool,
        reasons: &mut Reasons,
    ) {
        let t = self.tune;
        if near_shed {
            self.set_rate(self.rate.max(before));
            if self.shed_ceiling.is_some_and(|c| self.rate > c) {
                self.shed_ceiling = None;
            }
            self.streak = 0;
            self.shed_wait_ns = t.shed_wait_min_ns;
            self.next_probe = now;
            self.phase = Phase::Cruise;
            reasons.add(Reason::Kept);
            return;
        }
        let reference = self.reference_latency_ns();
        let w = self.sums(
            start.saturating_add(reference),
            until
                .saturating_add(reference)
                .saturating_add(self.round_ns()),
        );
        let delivered = w.good_rate();
        // Clearly more than the rate before, and than the capacity last
        // measured: answers of a busy upstream vary by a few percent.
        let bar =
            pct(before, t.delivered_pct).max(pct(self.capacity, t.delivered_over_capacity_pct));
        if w.tally.good >= t.min_samples && delivered > bar {
            // At least this much; the next probe finds out whether more.
            self.capacity = self.capacity.max(delivered);
            self.set_rate(pct(delivered, t.cruise_pct).max(before));
            self.streak = self.streak.saturating_add(1);
            self.settle_until = now.saturating_add(self.round_ns());
            self.next_probe = now;
            self.phase = Phase::Cruise;
            reasons.add(Reason::Kept);
            return;
        }
        self.streak = 0;
        self.next_probe = now.saturating_add(t.probe_wait_ns);
        let sent = self.sums(start, until.saturating_add(self.round_ns()));
        if sent.growth <= i64::try_from(t.growth_min).unwrap_or(i64::MAX) {
            // It queued nothing (the demand did not reach the probe).
            self.set_rate(before);
            self.phase = Phase::Cruise;
            return;
        }
        let dip = until.saturating_sub(start);
        self.set_rate(pct(before, 200u64.saturating_sub(t.gain_pct)));
        self.phase = Phase::Down {
            before,
            until: now.saturating_add(dip),
        };
    }

    fn round_ns(&self) -> u64 {
        self.rounds.back().map_or(100 * MS, |r| r.dur.max(MS))
    }

    /// The drain: once its rate shows, it ends when the latency is back
    /// near the reference (the queue is gone). If requests in flight stop
    /// falling while the latency stays up, either the upstream got slower
    /// (no queue left: the latency stays) or the capacity was overestimated
    /// (the queue stays): pace 12% lower for a while and watch the latency.
    /// It falls: a queue, and the upstream, busy all along, answered its
    /// capacity meanwhile. It stays: a slower upstream, whose latency
    /// becomes the reference (a queue only lends latency, a slower service
    /// keeps it).
    fn drain(
        &mut self,
        now: u64,
        ahead_ns: u64,
        since: u64,
        from: u64,
        verify: Option<(u64, Tally)>,
        reasons: &mut Reasons,
    ) {
        let t = self.tune;
        let short = self.fast_window_ns() / 2;
        let long = self
            .latency_ns
            .saturating_mul(4)
            .clamp(NS_PER_S, 3 * NS_PER_S);
        let shows = from.saturating_add(self.latency_ns);
        if now < shows.saturating_add(short) {
            return;
        }
        let w = self.sums(now.saturating_sub(short), now);
        if w.tally.timed() == 0 {
            return;
        }
        let exit = |c: &mut Controller, reasons: &mut Reasons| {
            // The reference measured before the queue holds for its full
            // memory from now (the drain froze it).
            let reference = c.reference_latency_ns();
            if reference > 0 {
                c.reference.push_back((now, reference));
            }
            let cruise = pct(c.capacity, t.cruise_pct);
            c.set_rate(cruise.max(c.rate));
            c.phase = Phase::Cruise;
            c.next_probe = now.saturating_add(t.queue_wait_ns);
            reasons.add(Reason::Drained);
        };
        if !self.above_reference(&w.tally) {
            exit(self, reasons);
            return;
        }
        if let Some((started, before)) = verify {
            if now < started.saturating_add(self.latency_ns).saturating_add(long) {
                return;
            }
            let during = self.sums(now.saturating_sub(long / 2), now);
            if self.slower(&during.tally, &before) {
                // The latency fell: a queue. The upstream was busy
                // throughout: what it answered is its capacity.
                self.capacity = during.good_rate().max(self.rate);
                self.set_rate(pct(self.capacity, t.drain_pct).min(self.rate));
                self.phase = Phase::Drain {
                    since,
                    from: now.saturating_add(ahead_ns),
                    verify: None,
                };
                reasons.add(Reason::Queue);
            } else {
                if let Some(us) = during.tally.mean_latency_us() {
                    self.reference.clear();
                    self.reference.push_back((now, us.saturating_mul(1_000)));
                    self.chunk = (now, Tally::EMPTY);
                }
                exit(self, reasons);
            }
            return;
        }
        // While the latency shows a queue the upstream is busy: what it
        // answers is its capacity. A cut that went deeper than that (right
        // after a slower service, the answers paused) comes back up.
        let two = self.latency_ns.saturating_mul(2).max(400 * MS);
        if verify.is_none() && self.known_since(now.saturating_sub(two)) {
            let m = self.sums(now.saturating_sub(two), now);
            if m.tally.good >= t.min_samples && m.good_rate() > self.capacity {
                self.capacity = m.good_rate();
                let drain = pct(self.capacity, t.drain_pct);
                if drain > pct(self.rate, 105) {
                    self.set_rate(drain);
                }
            }
            // What is still queued, by Little's law: the latency above the
            // reference times the capacity. Beyond the budget it is drained
            // within `drain_ns`.
            let excess_ns = self
                .sums(now.saturating_sub(short), now)
                .tally
                .mean_latency_us()
                .unwrap_or(0)
                .saturating_mul(1_000)
                .saturating_sub(self.reference_latency_ns());
            let queued = count_in(self.capacity, excess_ns);
            let beyond = queued.saturating_sub(count_in(self.capacity, t.queue_budget_ns));
            let drain = pct(self.capacity, t.drain_pct)
                .saturating_sub(per_s(beyond, t.drain_ns))
                .max(pct(self.capacity, t.drain_floor_pct));
            if drain < pct(self.rate, 95) {
                self.set_rate(drain);
            }
        }
        // Over a long window, a queue drained at this rate falls by the
        // capacity minus the rate; without one, requests in flight stay put.
        let flat = now >= shows.saturating_add(long) && {
            let l = self.sums(now.saturating_sub(long), now);
            let expected = count_in(self.capacity.saturating_sub(self.rate), long);
            let fall = l.growth.min(0).unsigned_abs();
            fall < (expected / 4).max(t.growth_min)
        };
        if flat || now >= since.saturating_add(t.drain_max_ns) {
            let before = self.sums(now.saturating_sub(long / 2), now).tally;
            self.set_rate(pct(self.rate, 88));
            self.phase = Phase::Drain {
                since: now,
                from,
                verify: Some((now.saturating_add(ahead_ns), before)),
            };
        }
    }

    /// Whether the mean latency of `t` is above the reference by twice the
    /// tuned share, beyond the sampling noise.
    fn above_reference(&self, t: &Tally) -> bool {
        let reference = self.reference_latency_ns() / 1_000;
        let (Some(l), Some(v)) = (t.mean_latency_us(), t.latency_var_ms2()) else {
            return false;
        };
        let margin = pct(
            reference,
            100 + self.tune.latency_rise_pct.saturating_mul(2),
        );
        let se_us = (v / t.timed() as f64).sqrt() * 1_000.0;
        reference > 0 && l > margin && (l - margin) as f64 > se_us * 2.0
    }

    /// Whether the latency of the last long window stays above the reference.
    fn latency_up(&self, now: u64) -> bool {
        let long = self
            .latency_ns
            .saturating_mul(4)
            .clamp(NS_PER_S, 3 * NS_PER_S);
        self.above_reference(&self.sums(now.saturating_sub(long / 2), now).tally)
    }

    /// Whether the latency of the last fast half-window is clearly below the
    /// latency of the long window before it.
    fn latency_fell(&self, now: u64) -> bool {
        let short = self.fast_window_ns() / 2;
        let long = self
            .latency_ns
            .saturating_mul(4)
            .clamp(NS_PER_S, 3 * NS_PER_S);
        let mid = now.saturating_sub(short);
        let from = mid.saturating_sub(long);
        if from < self.settle_until || !self.known_since(from) {
            return false;
        }
        let before = self.sums(from, mid).tally;
        let recent = self.sums(mid, now).tally;
        self.slower(&recent, &before)
    }

    /// A queue that stays: the latency has been above the reference for a
    /// whole long window, in both its halves.
    fn standing_queue(&self, now: u64) -> bool {
        let long = self
            .latency_ns
            .saturating_mul(4)
            .clamp(NS_PER_S, 3 * NS_PER_S);
        let from = now.saturating_sub(long);
        if from < self.settle_until || !self.known_since(from) {
            return false;
        }
        let mid = now.saturating_sub(long / 2);
        self.above_reference(&self.sums(from, mid).tally)
            && self.above_reference(&self.sums(mid, now).tally)
    }

    /// Lowers the rate to `target` (never raises it) and waits for the
    /// change to show before judging again.
    fn cut(&mut self, now: u64, ahead_ns: u64, target: u64, shed: bool) {
        let t = self.tune;
        let was_probing = matches!(self.phase, Phase::Up { .. });
        self.set_rate(target.min(self.rate));
        let round = self.rounds.back().map_or(0, |r| r.dur);
        self.settle_until = now
            .saturating_add(ahead_ns)
            .saturating_add(self.latency_ns)
            .saturating_add(round);
        self.streak = 0;
        self.phase = Phase::Cruise;
        let wait = if shed {
            let w = self.shed_wait_ns;
            if was_probing || self.next_probe > now {
                self.shed_wait_ns = self.shed_wait_ns.saturating_mul(2).min(t.shed_wait_max_ns);
            }
            w
        } else {
            t.queue_wait_ns
        };
        self.next_probe = self.settle_until.saturating_add(wait);
    }

    /// The fast queue-test window: twice the latency without a queue (each
    /// half at least one such latency, and two rounds), 400 ms to 1.6 s.
    fn fast_window_ns(&self) -> u64 {
        self.reference_latency_ns()
            .saturating_mul(2)
            .clamp(400 * MS, 1_600 * MS)
    }

    /// The window in which requests in flight and latency kept growing, and
    /// its later half, if any.
    fn growing(&self, now: u64) -> Option<(Sums, Sums)> {
        let t = self.tune;
        for (len, share) in [
            (self.fast_window_ns(), t.growth_fast_pct),
            (t.slow_window_ns, t.growth_slow_pct),
        ] {
            let from = now.saturating_sub(len);
            if from < self.settle_until || !self.known_since(from) {
                continue;
            }
            let mid = now.saturating_sub(len / 2);
            let (a, b) = (self.sums(from, mid), self.sums(mid, now));
            let grows = |h: &Sums| {
                h.rounds > 0
                    && h.growth
                        > i64::try_from(t.growth_min.max(pct(h.tally.sent, share)))
                            .unwrap_or(i64::MAX)
            };
            // A step of the rate raises requests in flight once (by the
            // step times the latency) but not the latency; a queue raises
            // both, and keeps raising them.
            if a.tally.sent.saturating_add(b.tally.sent) >= t.min_samples
                && grows(&a)
                && grows(&b)
                && self.slower(&a.tally, &b.tally)
            {
                return Some((self.sums(from, now), b));
            }
        }
        None
    }

    /// Whether the mean latency of `b` is above `a`'s by the tuned share of
    /// the reference latency and by more than the sampling noise explains.
    fn slower(&self, a: &Tally, b: &Tally) -> bool {
        let t = self.tune;
        let (Some(la), Some(lb)) = (a.mean_latency_us(), b.mean_latency_us()) else {
            return false;
        };
        // A tenth of the latency without a queue: a queue of a tenth of the
        // capacity's worth of work more, whatever queue there already is.
        let reference = match self.reference_latency_ns() / 1_000 {
            0 => la,
            r => r,
        };
        if lb <= la.saturating_add(pct(reference, t.latency_rise_pct)) {
            return false;
        }
        let (Some(va), Some(vb)) = (a.latency_var_ms2(), b.latency_var_ms2()) else {
            return false;
        };
        let se_ms = (va / a.timed() as f64 + vb / b.timed() as f64).sqrt();
        let diff_ms = (lb - la) as f64 / 1_000.0;
        diff_ms * 10.0 > se_ms * t.latency_rise_z10 as f64
    }

    /// Whether demand reaches the rate (so a higher rate would be used).
    fn binding(&self, now: u64) -> bool {
        let w = self.sums(now.saturating_sub(300 * MS), now);
        w.tally.arrivals >= self.tune.min_samples
            && per_s(w.tally.arrivals, w.dur) >= pct(self.rate, 95)
    }
}
