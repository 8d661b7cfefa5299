//! What the learner does between cuts, one function per phase: cruise
//! (probe while demand reaches the rate), a probe and its judgement, and
//! the drain of a queue. And
//! the two ways back when there is no fresh evidence: an idle rule returns
//! to the capacity last measured, and probes as soon as demand returns.

use super::signals::{Cut, DEMAND_CEILING_PCT};
use super::{count_in, interval_of_rate, pct, per_s, Controller, Phase, Reason, Reasons, MS};
use crate::NS_PER_S;

/// A drain lasts at most this long before it is verified.
const DRAIN_MAX_NS: u64 = 5 * NS_PER_S;

impl Controller {
    /// Lowers the rate as the signals said (never raises it), and waits for
    /// the change to show before judging again.
    pub(super) fn apply(&mut self, now: u64, ahead_ns: u64, cut: Cut, reasons: &mut Reasons) {
        let t = self.tune;
        let was_probing = matches!(self.phase, Phase::Up { .. });
        self.set_rate(cut.target.min(self.rate));
        self.settle_until = now
            .saturating_add(ahead_ns)
            .saturating_add(self.latency_ns)
            .saturating_add(self.round_ns());
        self.streak = 0;
        let wait = if cut.answers.is_some() {
            // Probes shed again wait longer each time (up to eight times).
            let w = self.cut_wait_ns;
            if was_probing || self.next_probe > now {
                self.cut_wait_ns = w.saturating_mul(2).min(t.probe_wait_ns.saturating_mul(8));
            }
            w
        } else {
            t.probe_wait_ns
        };
        self.next_probe = self.settle_until.saturating_add(wait);
        self.last_cut_permille = cut.answers;
        self.phase = if cut.drain {
            Phase::Drain {
                since: now,
                from: now.saturating_add(ahead_ns),
                busy: 0,
            }
        } else {
            Phase::Cruise
        };
        reasons.add(cut.reason);
    }

    /// Cruise: a queue that stands is drained; while demand reaches the rate
    /// and nothing holds probes back, probe.
    pub(super) fn cruise(&mut self, now: u64, ahead_ns: u64, reasons: &mut Reasons) {
        let t = self.tune;
        if now < self.settle_until {
            return;
        }
        if self.standing_queue(now) {
            // A drain that ended early, or a probe that went just above.
            // The upstream was busy all along the window (a queue stood in
            // both its halves): what it served is its capacity, measured
            // anew. (The capacity last measured may be that of a probe's
            // short window, or a drain's: 5-10% low, and a drain at 92%
            // of it left the band, S2's slower service.)
            let w = self.sums(now.saturating_sub(self.long_window_ns()), now);
            let c = if w.tally.good >= t.min_samples {
                w.served_rate()
            } else if self.capacity > 0 {
                self.capacity
            } else {
                self.rate
            };
            self.capacity = c;
            let cut = Cut {
                target: pct(c, t.drain_pct),
                reason: Reason::Queue,
                answers: None,
                drain: true,
            };
            self.apply(now, ahead_ns, cut, reasons);
            return;
        }
        // The rule's own queue goes out at the demand's pace plus half the
        // band (and what it holds beyond its budget within a second): a rate
        // far above the demand would only send it all at once.
        let ceiling = self.demand_ceiling(now, ahead_ns);
        if ahead_ns > self.round_ns() && self.rate > ceiling && self.demand_known(now) {
            self.set_rate(ceiling);
            return;
        }
        // The upstream got faster than the reference (a capacity came
        // back): probe now, a full one (no wait, no gentle first step).
        let faster = self.faster(now);
        if (now >= self.next_probe || faster)
            && now >= self.hold_until
            && self.rate < self.max_rate
            && self.binding(now, ahead_ns)
            && !self.latency_up(now)
        {
            self.escalate |= faster;
            self.start_probe(now, ahead_ns, reasons);
        }
    }

    /// A probe above the rate: the gain grows with each probe delivered in
    /// a row (from the floor back up to the demand in a few seconds); near a
    /// rate the upstream shed at, gently and for longer.
    fn start_probe(&mut self, now: u64, ahead_ns: u64, reasons: &mut Reasons) {
        let t = self.tune;
        // Gentle near the capacity measured, when the demand would more than
        // fill a full probe (below that, a full one sends no more than the
        // demand, and the rate reaches it sooner).
        let near = self.capacity > 0 && self.rate >= pct(self.capacity, 85);
        let demand = self.demand(now, ahead_ns);
        let full = demand >= pct(self.rate, t.gain_pct.saturating_add(10));
        let gentle = self.streak == 0 && near && full && !self.escalate;
        self.escalate = false;
        let gain = if gentle {
            t.gentle_gain_pct.min(t.gain_pct)
        } else {
            t.gain_pct
                .saturating_add(self.streak.saturating_mul(t.gain_pct.saturating_sub(100)))
                .min(t.max_gain_pct.max(t.gain_pct))
        };
        self.probe_gain_pct = gain;
        // Never above the demand by more than half the band:
        // a probe cannot find room beyond what arrives (and what the
        // rule's queue holds beyond its budget), and above it the rate
        // only empties that queue, all at once (after a capacity returned,
        // 1.8x of a demand it nearly reached sent what was held for
        // 300 ms within a fraction of a second: +20% over that second).
        let steady = self.steady_demand(now, ahead_ns).min(demand);
        let mut target = pct(self.rate, gain).min(pct(steady, DEMAND_CEILING_PCT).max(self.rate));
        let mut near_shed = false;
        if let Some(c) = self.shed_ceiling {
            if target > pct(c, t.near_shed_gain_pct) {
                target = pct(c, t.near_shed_gain_pct).max(pct(self.rate, t.near_shed_gain_pct));
                near_shed = true;
            }
        }
        let before = self.rate;
        self.set_rate(target);
        // A higher rate goes out at once if the pacer brings held requests
        // forward, else once the schedule's backlog has.
        let start = if t.retime_up {
            now
        } else {
            now.saturating_add(ahead_ns)
        };
        let reference = self.reference.latency_ns();
        let (until, judge) = if near_shed {
            // Gentle and long: a limiter's burst hides a small excess for a while.
            let until = start.saturating_add(t.slow_window_ns);
            (until, until.saturating_add(reference))
        } else {
            // Long enough to send twice the answers a judgement needs at the
            // probe's rate (at low rates 400 ms holds too few to ever keep
            // a probe), and to measure past two reference latencies.
            let enough = interval_of_rate(target).saturating_mul(t.min_samples.saturating_mul(2));
            // (A gentle one no longer than `probe_len_ns` and what it needs
            // to send: after a queue was taken for the reference, two of
            // them would hold +10% for over a second.)
            let span = if gentle {
                0
            } else {
                reference.saturating_mul(2)
            };
            let len = t.probe_len_ns.max(span).max(enough.min(5 * NS_PER_S));
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
            probe: self.rate,
            ended: false,
        };
        reasons.add(Reason::Probe);
    }

    /// A probe runs until its time is up, then back to where it started
    /// while its answers come in, then it is judged.
    pub(super) fn probing(
        &mut self,
        now: u64,
        ahead_ns: u64,
        (before, probe): (u64, u64),
        (start, until, judge): (u64, u64, u64),
        (near_shed, ended): (bool, bool),
        reasons: &mut Reasons,
    ) {
        if now < until {
            // The rule's held requests keep the times the probe's rate
            // gave them: what it admits now goes out `ahead_ns` later. So
            // it admits at the rate before from `ahead_ns` before its time
            // is up (at most its second half), and what it sends at its
            // own rate ends when its time is up, as judged. (Admitting at
            // its rate until then, a probe held by a full rule's queue of
            // 300 ms sent 0.8 s instead of 0.5 s: 60 more requests for a
            // probe of +40% just above the capacity, a queue that stood
            // at the rate before until the queue test cut below the band,
            // S2's slower service.)
            let tail = until
                .saturating_sub(ahead_ns)
                .max(start.saturating_add(until.saturating_sub(start) / 2));
            if now >= tail
                && !near_shed
                && self.rate > before
                && self.probe_gain_pct >= self.tune.gain_pct
            {
                self.set_rate(before);
            }
            return;
        }
        if probe > before && !near_shed && !ended {
            if let Phase::Up { ended, .. } = &mut self.phase {
                *ended = true;
            }
            // What the probe queued, if the upstream had no room for it, is
            // drained while its answers come in (BBR's drain after
            // ProbeBW's up phase): below the rate by as much as the probe
            // went above it, so the second's rate is where it was (the
            // queue test would otherwise find the probe's queue a second
            // later and cut below the band). A probe that queued nothing
            // (room above, or a demand that did not reach it) goes back to
            // the rate.
            // (Judged on the recent latency if higher than the reference:
            // one not yet learned again after a slower service would take
            // the step for a queue, and a drain below a demand the
            // upstream serves costs 429s.)
            let latency = self.latency_ns.max(self.reference.latency_ns());
            let (_, queued) = self.probe_sent(before, (start, now), latency);
            // And the latency rose during it (a demand that did not reach
            // the probe fills requests in flight in bursts, not a queue).
            let len = now.saturating_sub(start);
            let queued = queued
                && self.slower(
                    &self.sums(start.saturating_sub(len), start).tally,
                    &self.sums(start, now).tally,
                );
            let g = self.probe_gain_pct.saturating_sub(100).min(50);
            if queued {
                self.set_rate(pct(before, 100 - g));
            } else if self.room_so_far(before, start, now, latency) {
                // Room already: kept now, at its rate, and the next one
                // starts at once (slow start's pace: one round trip, not
                // one round trip and a wait back at the rate before).
                self.keep_early(now, ahead_ns, (before, probe), start, latency, reasons);
                return;
            } else {
                self.set_rate(before);
            }
        }
        if now < judge {
            return;
        }
        self.judge_probe(now, ahead_ns, before, (start, until), near_shed, reasons);
    }

    /// Whether a full probe whose time is up shows room already: it went
    /// out clearly above the rate before, queued nothing, its answers came
    /// no slower, and what it sent one latency ago was all served.
    fn room_so_far(&self, before: u64, start: u64, now: u64, latency_ns: u64) -> bool {
        let t = self.tune;
        // (Its answers over two thirds of it at least: over less, a probe
        // just above the capacity has not queued enough to show, S2.)
        let len = now.saturating_sub(start);
        if self.probe_gain_pct < t.gain_pct || len < latency_ns.saturating_mul(3) {
            return false;
        }
        let (sent_rate, _) = self.probe_sent(before, (start, now), latency_ns);
        let answered = self.sums(start.saturating_add(latency_ns), now);
        answered.tally.good >= t.min_samples
            && sent_rate > pct(before, t.delivered_pct)
            && answered.served_rate() >= pct(sent_rate, 90)
            && !self.slower(
                &self.sums(start.saturating_sub(len), start).tally,
                &self.sums(start, now).tally,
            )
    }

    /// A full probe kept as soon as its time is up (`room_so_far`).
    fn keep_early(
        &mut self,
        now: u64,
        ahead_ns: u64,
        (before, probe): (u64, u64),
        start: u64,
        latency_ns: u64,
        reasons: &mut Reasons,
    ) {
        let delivered = self
            .sums(start.saturating_add(latency_ns), now)
            .served_rate();
        let (sent_rate, _) = self.probe_sent(before, (start, now), latency_ns);
        self.escalate = false;
        self.streak = self.streak.saturating_add(1);
        self.capacity = self.capacity.max(delivered);
        // At what it sent: it queued nothing, so no queue needs the
        // cruise's margin to drain.
        self.keep(now, ahead_ns, sent_rate.min(probe), before, reasons);
    }

    /// A probe kept at `rate` (no more than the demand's ceiling, no less
    /// than the rate `before` it): cruise from now, the next probe due.
    fn keep(&mut self, now: u64, ahead_ns: u64, rate: u64, before: u64, reasons: &mut Reasons) {
        let mut keep = rate;
        if self.demand_known(now) {
            keep = keep.min(self.demand_ceiling(now, ahead_ns));
        }
        self.set_rate(keep.max(before));
        self.settle_until = now.saturating_add(self.round_ns());
        self.next_probe = now;
        self.phase = Phase::Cruise;
        reasons.add(Reason::Kept);
    }

    /// What a probe sent over `(start, end]` (per second), and whether it
    /// queued: requests in flight grew beyond what its higher rate keeps in
    /// flight by itself (Little's law: the step times `latency_ns`), 2,
    /// and `growth_pct` of what it sent.
    fn probe_sent(&self, before: u64, (start, end): (u64, u64), latency_ns: u64) -> (u64, bool) {
        let sent = self.sums(start, end);
        let sent_rate = per_s(sent.tally.sent, sent.dur);
        let step = count_in(sent_rate.saturating_sub(before), latency_ns);
        let queued = sent.growth
            > i64::try_from(2 + step + pct(sent.tally.sent, self.tune.growth_pct))
                .unwrap_or(i64::MAX);
        (sent_rate, queued)
    }

    /// A probe's time is up and its answers are in: kept (the rate it
    /// found, and the next probe at once) or not (back to the rate).
    fn judge_probe(
        &mut self,
        now: u64,
        ahead_ns: u64,
        before: u64,
        (start, until): (u64, u64),
        near_shed: bool,
        reasons: &mut Reasons,
    ) {
        let t = self.tune;
        if near_shed {
            // No cut for shed answers meanwhile: the upstream takes it.
            self.set_rate(self.rate.max(before));
            if self.shed_ceiling.is_some_and(|c| self.rate > c) {
                self.shed_ceiling = None;
            }
            self.streak = 0;
            self.cut_wait_ns = t.probe_wait_ns;
            self.next_probe = now;
            self.phase = Phase::Cruise;
            reasons.add(Reason::Kept);
            return;
        }
        // Delivered: the answers of what it sent (one reference latency
        // later) came at clearly more than the rate before, and than the
        // capacity last measured (BBR's delivery-rate probe). Then the
        // capacity is at least that, and the next probe goes further.
        let reference = self.reference.latency_ns();
        let w = self.sums(
            start.saturating_add(reference),
            until
                .saturating_add(reference)
                .saturating_add(self.round_ns()),
        );
        let delivered = w.served_rate();
        // The bar of a gentle probe is as far below its gain as
        // `delivered_pct` is below `gain_pct` (half-way: 105% for +10%).
        let delivered_pct = if self.probe_gain_pct < t.gain_pct {
            100 + t.delivered_pct.saturating_sub(100) * self.probe_gain_pct.saturating_sub(100)
                / t.gain_pct.saturating_sub(100).max(1)
        } else {
            t.delivered_pct
        };
        let bar = pct(before, delivered_pct)
            .max(pct(self.capacity, delivered_pct.saturating_add(100) / 2));
        // Or it went out clearly above the rate before, queued nothing, and
        // all of it was served: room above (the capacity came back).
        // (A higher rate keeps more in flight by itself, Little's law: the
        // step times the latency; a queue adds beyond that.)
        let (sent_rate, queued) = self.probe_sent(
            before,
            (start, until.saturating_add(self.round_ns())),
            reference,
        );
        let room =
            !queued && sent_rate > pct(before, delivered_pct) && delivered >= pct(sent_rate, 95);
        if w.tally.good >= t.min_samples && (delivered > bar || room) {
            // Far above the capacity known: it grew (or was never known);
            // the next probe goes further, until one is not delivered.
            // A gentle probe cannot tell room from noise (+10% at the
            // capacity queues too little to see, and is served within a
            // few percent): it grows the gain only if delivered beyond the
            // full bar, and when kept the next probe is a full one.
            let gentle = self.probe_gain_pct < t.gain_pct;
            let grew = (room && !gentle) || delivered > pct(self.capacity, t.delivered_pct);
            // (And only if its answers came no slower than those before
            // it: one kept on a backlog served found no room.)
            let len = until.saturating_sub(start);
            self.escalate = gentle
                && !self.slower(&self.sums(start.saturating_sub(len), start).tally, &w.tally);
            self.streak = if grew {
                self.streak.saturating_add(1)
            } else {
                0
            };
            self.capacity = self.capacity.max(delivered);
            // Kept at no more than the demand's ceiling: what it delivered
            // may be what the rule held going out at once (S9's retries:
            // kept at 95% of that, +13% over the offered rate for a second).
            self.keep(now, ahead_ns, pct(delivered, t.cruise_pct), before, reasons);
            return;
        }
        self.streak = 0;
        self.next_probe = now.saturating_add(t.probe_wait_ns);
        if !queued {
            // It queued nothing (the demand did not reach the probe).
            self.set_rate(before);
            self.phase = Phase::Cruise;
            return;
        }
        // It queued: what it delivered is the capacity now (BBR's delivery
        // rate), if the upstream was busy. Back to the rate before (what the
        // probe queued drains by the cruise's margin): lowering it here
        // would read a demand that did not reach the probe as the
        // capacity (S10 in perf/adaptive: 429s at 70% of the capacity);
        // a cruise above the capacity is the queue tests' to find.
        if w.tally.good >= t.min_samples {
            self.capacity = delivered;
        }
        self.set_rate(before);
        self.phase = Phase::Cruise;
        // A standing queue is judged on a window after it.
        self.settle_until = now.saturating_add(self.round_ns());
    }

    /// The drain: below the capacity (`drain_rate`), so a queue falls by
    /// the rest every second. It ends when the latency is back near the
    /// reference (the queue is gone), or stops falling over a long window
    /// (then no queue is left: the upstream got slower, and its latency is
    /// the new reference; a queue at a rate below the capacity cannot stay
    /// put). Meanwhile, while the latency shows a queue the upstream is
    /// busy: what it serves is its capacity, and a cut that went deeper
    /// than needed to drain the queue left (right after a slower service,
    /// a stall, the answers paused) comes back up.
    pub(super) fn drain(
        &mut self,
        now: u64,
        (since, from): (u64, u64),
        busy: u64,
        reasons: &mut Reasons,
    ) {
        let t = self.tune;
        let short = self.fast_window_ns() / 2;
        let long = self.long_window_ns();
        let w = self.sums(now.saturating_sub(short), now);
        if w.tally.timed() == 0 {
            return;
        }
        // What is still queued, by Little's law: the latency above the
        // reference times the capacity.
        let excess_ns = w
            .tally
            .mean_latency_us()
            .unwrap_or(0)
            .saturating_mul(1_000)
            .saturating_sub(self.reference.latency_ns());
        // The capacity, measured again on the drain's own answers (a latency
        // after the cut: before, the upstream may have had its capacity of
        // before the drop, or its service time before it slowed down; over
        // the last second, at least 400 ms: a shorter window is noisy).
        // While requests in flight fall (it answers faster than it is sent)
        // the upstream is working off its backlog, busy: what it served is
        // its capacity. The first such measure replaces the cut's (taken on
        // two short halves, noisy, and on the lower of them: 5-30% off
        // after a drop, and a drain at 92% of that leaves the ±10% band);
        // later ones only raise it (a window that reaches past the
        // backlog's end measures less: the latest, or a mean, ends the
        // drain low). Without a backlog worked off, only
        // clearly more served (10%) while the latency shows a queue moves it
        // (less served is no measure: with a slower service the latency
        // stays above the reference with no queue left).
        let m = self.sums(
            since
                .saturating_add(self.latency_ns)
                .max(now.saturating_sub(NS_PER_S)),
            now,
        );
        if m.dur >= 400 * MS && m.tally.good >= t.min_samples {
            let served = m.served_rate();
            let noise = i64::try_from(2 + pct(m.tally.sent, t.growth_pct)).unwrap_or(i64::MAX);
            if m.growth < -noise {
                if busy == 0 || served > self.capacity {
                    self.capacity = served;
                }
                self.phase = Phase::Drain {
                    since,
                    from,
                    busy: busy.saturating_add(1),
                };
            } else if self.above_reference(&m.tally) && served > pct(self.capacity, 110) {
                self.capacity = served;
            }
        }
        let drain = self.drain_rate(self.capacity, count_in(self.capacity, excess_ns));
        // The drain rate follows the capacity up: by 2% steps once it was
        // measured on a backlog worked off (a first measure 2-3% low put
        // the drain just below the ±10% band for the seconds the backlog
        // took, S1; steps of 1% let the highest of many noisy measures
        // raise it round by round above the capacity, A503-drop), by 5%
        // before.
        let measured = matches!(self.phase, Phase::Drain { busy, .. } if busy > 0);
        if drain > pct(self.rate, if measured { 102 } else { 105 }) {
            self.set_rate(drain);
        }
        let shows = from.saturating_add(self.latency_ns);
        if now < shows.saturating_add(short) || self.reference.latency_ns() == 0 {
            // The cut does not show yet; or the reference is learned anew
            // (a queue beyond the route's timeout was found): drain on.
            return;
        }
        if !self.above_reference(&w.tally) {
            self.drained(now, reasons);
            return;
        }
        let settled =
            now >= shows.saturating_add(long) && self.known_since(now.saturating_sub(long));
        if settled || now >= since.saturating_add(DRAIN_MAX_NS) {
            self.drain_settled(now, (since, long), busy, reasons);
        }
    }

    /// A drain that has shown for a long window (or lasted 5 s) and still
    /// sees latency above the reference: requests in flight still grow
    /// (the capacity was taken too high), or the latency stopped falling
    /// (a slower upstream, or a queue stuck at the drain rate).
    fn drain_settled(
        &mut self,
        now: u64,
        (since, long): (u64, u64),
        busy: u64,
        reasons: &mut Reasons,
    ) {
        let t = self.tune;
        let half = long / 2;
        let earlier = self.sums(now.saturating_sub(long), now.saturating_sub(half));
        let recent = self.sums(now.saturating_sub(half), now);
        let l = self.sums(now.saturating_sub(long), now);
        let (e, r) = (
            earlier.tally.mean_latency_us().unwrap_or(0),
            recent.tally.mean_latency_us().unwrap_or(0),
        );
        // Flat: within a twentieth of the reference, or two standard errors.
        let se_us = recent.tally.latency_var_ms2().map_or(0.0, |v| {
            (v / recent.tally.timed().max(1) as f64).sqrt() * 1_000.0
        });
        let flat = e.abs_diff(r) as f64
            <= (self.reference.latency_ns() as f64 / 20_000.0).max(2.0 * se_us);
        // (Beyond 2 with the latency still rising, or beyond the noise
        // (2 and `growth_pct` of what was sent) with it flat: requests in
        // flight at a slower service's latency vary by more than 2 from
        // one round to the next, and a bare 2 with a flat latency cut a
        // drain at the capacity measured to below the band, S2; a queue
        // that grows slowly raises the latency as it grows.)
        let noise = i64::try_from(2 + pct(l.tally.sent, t.growth_pct)).unwrap_or(i64::MAX);
        if l.growth > noise || (l.growth > 2 && !flat && r > e) {
            // Requests in flight still grow: the capacity was taken too
            // high. What it served meanwhile, busy all along, is it.
            self.capacity = l.served_rate();
            self.set_rate(self.drain_rate(self.capacity, u64::try_from(l.growth).unwrap_or(0)));
            self.phase = Phase::Drain {
                since: now,
                from: now,
                busy: 1,
            };
            reasons.add(Reason::Queue);
        } else if flat {
            // The latency stopped falling: it is the upstream's own (a
            // slower service), or a queue stuck at a drain rate that is
            // the capacity (measured too high at the cut, with answers
            // from before a change). Either way what it served
            // meanwhile is safe to cruise at: below it, a stuck queue
            // drains too (and the reference follows the latency down);
            // probes wait until it would have, then measure it again.
            if let Some(us) = recent.tally.mean_latency_us() {
                self.reference.reset(now, Some(us.saturating_mul(1_000)));
            }
            // If it worked off a backlog since the cut (requests in flight
            // fell), the queue is gone and what it served meanwhile is what
            // was sent (the drain rate), not its capacity: the capacity
            // measured on that backlog stands (else the cruise would be 95%
            // of the drain's 92%, below the band). If not, the queue may
            // be stuck at a drain rate that is the capacity: what it served,
            // busy all along, is the capacity.
            let served = l.served_rate();
            if busy == 0 || served > self.capacity || !self.worked_off(since, now) {
                self.capacity = served;
            }
            self.set_rate(pct(self.capacity, t.cruise_pct));
            self.drained(now, reasons);
            self.next_probe = now.saturating_add(long.saturating_mul(2));
        }
    }

    /// Whether requests in flight fell over `(from, now]` beyond the noise
    /// (2, and `growth_pct` of what was sent): the upstream answered faster
    /// than it was sent, working off a backlog.
    fn worked_off(&self, from: u64, now: u64) -> bool {
        let w = self.sums(from, now);
        w.growth < -i64::try_from(2 + pct(w.tally.sent, self.tune.growth_pct)).unwrap_or(i64::MAX)
    }

    /// The queue is gone: cruise at the capacity measured.
    fn drained(&mut self, now: u64, reasons: &mut Reasons) {
        // The reference measured before the queue holds for its full memory
        // from now (the drain froze it).
        self.reference.renew(now);
        let cruise = pct(self.capacity, self.tune.cruise_pct);
        self.set_rate(cruise.max(self.rate));
        self.phase = Phase::Cruise;
        self.next_probe = now.saturating_add(self.tune.probe_wait_ns / 2);
        reasons.add(Reason::Drained);
    }

    /// Whether the last second had too few requests sent and answered to
    /// say anything: no fresh evidence.
    pub(super) fn idle(&self, now: u64) -> bool {
        let from = now.saturating_sub(NS_PER_S);
        if !self.known_since(from) {
            return false;
        }
        let w = self.sums(from, now);
        w.tally.sent < self.tune.min_samples && w.tally.done() < self.tune.min_samples
    }

    /// No fresh evidence: the rate goes back to where the evidence last was
    /// (cruise at the capacity measured), and the next probe may start as
    /// soon as demand returns. A cut stays only while answers show why.
    pub(super) fn return_to_evidence(&mut self, now: u64) {
        let cruise = pct(self.capacity, self.tune.cruise_pct);
        if cruise > self.rate {
            self.set_rate(cruise);
        }
        if !matches!(self.phase, Phase::Cruise) {
            self.reference.renew(now);
        }
        self.phase = Phase::Cruise;
        self.streak = 0;
        self.cut_wait_ns = self.tune.probe_wait_ns;
        self.next_probe = self.next_probe.min(now);
    }
}
