//! What cuts the rate, and the latency tests the phases share. Only what
//! the load produces counts: bad answers spread over the rule's paths and
//! clients ([`Tally::load_bad`]; a client's own errors, or one broken
//! endpoint's, do not), requests in flight and latency growing together (a
//! queue), and answers beyond the route's timeout that are the load's.

use super::history::Sums;
use super::{count_in, pct, per_s, Controller, Phase, Reason, Reasons, MS};
use crate::adaptive::tally::Tally;
use crate::NS_PER_S;

/// Probes go no higher, and a queue the rule holds goes out no faster,
/// than this share (%) of the demand: half the ±10% band (at 110% the
/// second's rate sat on the band's edge, and noise in the demand measured
/// took it out).
pub(super) const DEMAND_CEILING_PCT: u64 = 105;

/// A cut the signals call for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cut {
    /// The rate to pace at (never above the current one).
    pub target: u64,
    pub reason: Reason,
    /// For a cut for answers: the share (per mille) of the load's bad
    /// answers that caused it (was it futile? the next judgement tells).
    pub answers: Option<u64>,
    /// Whether a queue is to be drained (the drain phase follows).
    pub drain: bool,
}

impl Controller {
    /// 1. The load's own bad answers in the last second (since the last
    ///    change showed) beyond the tolerance: shed or failed, cut to what
    ///    the upstream served; late (Envoy's 504: a queue longer than the
    ///    route's timeout), drain. The upstream's `Retry-After` holds probes
    ///    back only when its sheds are the load's.
    pub(super) fn overloaded(&mut self, now: u64, reasons: &mut Reasons) -> Option<Cut> {
        let t = self.tune;
        let from = self.settle_until.max(now.saturating_sub(NS_PER_S));
        let w = self.sums(from, now);
        let done = w.tally.done();
        if done < t.min_samples {
            return None;
        }
        let (shed, failed) = (
            w.tally.load_part(w.tally.shed),
            w.tally.load_part(w.tally.failed),
        );
        let share = shed.saturating_add(failed).saturating_mul(1000) / done;
        self.judge_futility(share, shed >= failed);
        let served = w.served_rate();
        if share > self.tolerated_permille {
            let mut target = pct(self.rate, 90).min(pct(served, t.cruise_pct));
            if shed < failed {
                // Failures (5xx, resets) come from a queue or a broken
                // backend as often as from too many requests: what was
                // served may understate the capacity. At most halve per
                // cut; the queue test does the rest.
                target = target.max(self.rate / 2);
            }
            if shed > 0 {
                self.shed_ceiling = Some(served);
                if w.tally.retry_after_s > 0 && shed >= failed {
                    let until = now.saturating_add(w.tally.retry_after_s.saturating_mul(NS_PER_S));
                    self.hold_until = self.hold_until.max(until);
                    reasons.add(Reason::RetryAfter);
                }
            }
            return Some(Cut {
                target,
                reason: if shed >= failed {
                    Reason::Shed
                } else {
                    Reason::Failed
                },
                answers: Some(share),
                drain: false,
            });
        }
        let late = w.tally.load_part(w.tally.late);
        let draining = matches!(self.phase, Phase::Drain { .. });
        if !draining && late.saturating_mul(1000) / done > t.overload_permille {
            // A queue beyond the route's timeout: too long to have been
            // measured as the latency reference's, or one it grew up with
            // (a start behind a stalled machine). Learn the reference
            // again, from the answers of the drain.
            self.reference.reset(now, None);
            let c = served.max(self.capacity.min(self.rate));
            let queued = count_in(c, self.latency_ns);
            return Some(Cut {
                target: self.drain_rate(c, queued).max(self.rate / 4),
                reason: Reason::Queue,
                answers: None,
                drain: true,
            });
        }
        None
    }

    /// The first judgement after a cut for answers: bad answers the cut did
    /// not lower are not the load's (failures at once; sheds after two such
    /// cuts in a row): the tolerance rises to 1.5 times their share.
    fn judge_futility(&mut self, share: u64, shed: bool) {
        if let Some(before) = self.last_cut_permille.take() {
            if share.saturating_mul(10) >= before.saturating_mul(7) {
                self.futile_sheds = self.futile_sheds.saturating_add(u32::from(shed));
                if !shed || self.futile_sheds >= 2 {
                    self.tolerated_permille =
                        self.tolerated_permille.max(share.saturating_mul(3) / 2);
                }
            } else {
                self.futile_sheds = 0;
            }
        } else if share <= self.tune.overload_permille {
            self.tolerated_permille = self.tune.overload_permille;
            self.futile_sheds = 0;
        }
    }

    /// 2. Requests in flight and latency keep growing: the upstream fell
    ///    behind. Pace below what it serves until its queue is gone. (Not
    ///    while probing: a probe queues a little on purpose, and takes it
    ///    back itself if it was too much; unless the upstream now serves
    ///    clearly less (15%) than before the probe: it lost capacity.)
    pub(super) fn queue_grew(&mut self, now: u64, ahead_ns: u64) -> Option<Cut> {
        let before_probe = match self.phase {
            Phase::Up { before, .. } => Some(before),
            _ => None,
        };
        let (w, recent) = self
            .growing(now)
            .filter(|(_, recent)| before_probe.is_none_or(|b| recent.served_rate() < pct(b, 85)))?;
        // The upstream was busy all through the window (its queue grew):
        // what it served is its capacity. The lower of the two halves (after
        // a drop the earlier half still has answers from before it; each is
        // short and noisy, and a drain that overestimates the capacity
        // leaves a queue standing, so the lower errs on the safe side; the
        // drain measures it again while the upstream is busy, and probes
        // find any more). An earlier half with too few answers to measure
        // is no reason to trust the later one alone: after a slower
        // service the answers pause, then the requests all started at
        // once come back together, and the later half alone read 10%
        // above the capacity (a drain at 92% of it left the queue
        // standing, S2); the whole window, pause included, is the lower.
        let earlier = self.sums(now.saturating_sub(w.dur), now.saturating_sub(recent.dur));
        let (a, b) = (earlier.served_rate(), recent.served_rate());
        let measured = if earlier.tally.done() >= self.tune.min_samples {
            a.min(b)
        } else {
            b.min(w.served_rate())
        };
        let c = self.capacity;
        self.capacity = if c > 0 && measured > pct(c, 85) && measured < pct(c, 115) {
            (c + measured) / 2
        } else {
            measured
        };
        // What it queued, and what the schedule still sends at the old rate.
        let sent = per_s(w.tally.sent, w.dur).min(self.rate);
        let future = count_in(sent.saturating_sub(self.capacity), ahead_ns);
        let queued = u64::try_from(w.growth.max(0))
            .unwrap_or(0)
            .saturating_add(future);
        // At most to a quarter at once: a backend (or a machine) that stalls
        // for a moment answers next to nothing in the later half, which is
        // no measure of its capacity. A deeper drop is cut again once the
        // first cut shows.
        Some(Cut {
            target: self.drain_rate(self.capacity, queued).max(self.rate / 4),
            reason: Reason::Queue,
            answers: None,
            drain: true,
        })
    }

    /// The rate that drains `queued` requests at `capacity`: `drain_pct` of
    /// it (within the band), less the excess over the queue budget within
    /// a second, never below half of it.
    pub(super) fn drain_rate(&self, capacity: u64, queued: u64) -> u64 {
        let t = self.tune;
        let beyond = queued.saturating_sub(count_in(capacity, t.queue_budget_ns));
        pct(capacity, t.drain_pct)
            .saturating_sub(per_s(beyond, NS_PER_S))
            .max(capacity / 2)
    }

    /// The window in which requests in flight and latency kept growing, and
    /// its later half, if any.
    fn growing(&self, now: u64) -> Option<(Sums, Sums)> {
        let t = self.tune;
        for (len, share) in [
            (self.fast_window_ns(), t.growth_pct),
            (t.slow_window_ns, t.growth_pct.div_ceil(2)),
        ] {
            let from = now.saturating_sub(len);
            if from < self.settle_until || !self.known_since(from) {
                continue;
            }
            let mid = now.saturating_sub(len / 2);
            let (a, b) = (self.sums(from, mid), self.sums(mid, now));
            let grows = |h: &Sums| {
                h.rounds > 0
                    && h.growth > i64::try_from(2.max(pct(h.tally.sent, share))).unwrap_or(i64::MAX)
            };
            // A step of the rate raises requests in flight once (by the
            // step times the latency) but not the latency; a queue raises
            // both, and keeps raising them.
            // And a queue holds more in flight than what was sent keeps
            // there by itself (Little's law: the rate times the latency
            // without a queue, and a tenth): at the start of a load
            // requests in flight fill up to that while the quickest answers
            // come first, so both grow with no queue at all.
            let rate = per_s(
                a.tally.sent.saturating_add(b.tally.sent),
                a.dur.saturating_add(b.dur),
            );
            let little = count_in(rate, self.reference.latency_ns());
            let beyond =
                little == 0 || self.in_flight > little + 2 + pct(little, t.latency_rise_pct);
            if a.tally.sent.saturating_add(b.tally.sent) >= t.min_samples
                && grows(&a)
                && grows(&b)
                && beyond
                && self.slower(&a.tally, &b.tally)
            {
                return Some((self.sums(from, now), b));
            }
        }
        None
    }

    /// Whether the mean latency of `b` is above `a`'s by the tuned share of
    /// the reference latency and by more than three standard errors.
    pub(super) fn slower(&self, a: &Tally, b: &Tally) -> bool {
        let (Some(la), Some(lb)) = (a.mean_latency_us(), b.mean_latency_us()) else {
            return false;
        };
        // A tenth of the latency without a queue: a queue of a tenth of the
        // capacity's worth of work more, whatever queue there already is.
        let reference = match self.reference.latency_ns() / 1_000 {
            0 => la,
            r => r,
        };
        if lb <= la.saturating_add(pct(reference, self.tune.latency_rise_pct)) {
            return false;
        }
        let (Some(va), Some(vb)) = (a.latency_var_ms2(), b.latency_var_ms2()) else {
            return false;
        };
        let se_ms = (va / a.timed() as f64 + vb / b.timed() as f64).sqrt();
        (lb - la) as f64 / 1_000.0 > se_ms * 3.0
    }

    /// Whether the mean latency of `t` is above the reference by twice the
    /// tuned share, beyond the sampling noise.
    pub(super) fn above_reference(&self, t: &Tally) -> bool {
        let reference = self.reference.latency_ns() / 1_000;
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

    /// Whether the latency of the last fast half-window fell at once, below
    /// the half-window before it (by three standard errors) and below the
    /// reference, each by twice `latency_rise_pct` of the reference: the
    /// upstream got faster than it was (its capacity came back, or its
    /// service time fell), so there is room above the rate. (At once: a
    /// queue that drains at the cruise's margin lowers the latency a little
    /// each round, and below a reference learned while it stood, S1.)
    pub(super) fn faster(&self, now: u64) -> bool {
        let short = self.fast_window_ns() / 2;
        let from = now.saturating_sub(short);
        let before = from.saturating_sub(short);
        if before < self.settle_until || !self.known_since(before) {
            return false;
        }
        let (a, b) = (self.sums(before, from).tally, self.sums(from, now).tally);
        let reference = self.reference.latency_ns() / 1_000;
        let (Some(la), Some(lb), Some(va), Some(vb)) = (
            a.mean_latency_us(),
            b.mean_latency_us(),
            a.latency_var_ms2(),
            b.latency_var_ms2(),
        ) else {
            return false;
        };
        if reference == 0 || a.timed() < self.tune.min_samples || b.timed() < self.tune.min_samples
        {
            return false;
        }
        // Twice the share the queue test takes for a rise: tested every
        // round, a tenth let the noise of a draining queue through.
        let step = pct(reference, self.tune.latency_rise_pct.saturating_mul(2));
        let se_us = (va / a.timed() as f64 + vb / b.timed() as f64).sqrt() * 1_000.0;
        let fell = la.saturating_sub(lb);
        let below = reference.saturating_sub(lb);
        fell > step && fell as f64 > se_us * 3.0 && below > step
    }

    /// Whether the latency of the last fast half-window is above the
    /// reference (a queue now: no probe on top of it).
    pub(super) fn latency_up(&self, now: u64) -> bool {
        let short = self.fast_window_ns() / 2;
        self.above_reference(&self.sums(now.saturating_sub(short), now).tally)
    }

    /// A queue that stays: the latency has been above the reference for a
    /// whole long window, in both its halves, and still is (a queue the
    /// upstream drained by itself once its capacity came back is gone).
    pub(super) fn standing_queue(&self, now: u64) -> bool {
        let long = self.long_window_ns();
        let from = now.saturating_sub(long);
        if from < self.settle_until || !self.known_since(from) {
            return false;
        }
        let mid = now.saturating_sub(long / 2);
        self.above_reference(&self.sums(from, mid).tally)
            && self.above_reference(&self.sums(mid, now).tally)
            && self.latency_up(now)
    }

    /// Whether demand reaches the rate (so a higher rate would be used).
    pub(super) fn binding(&self, now: u64, ahead_ns: u64) -> bool {
        let w = self.sums(now.saturating_sub(300 * MS), now);
        w.tally.arrivals >= self.tune.min_samples
            && self.demand(now, ahead_ns) >= pct(self.rate, 95)
    }

    /// Whether the last 300 ms are known and saw enough arrivals to tell
    /// the demand.
    pub(super) fn demand_known(&self, now: u64) -> bool {
        let from = now.saturating_sub(300 * MS);
        self.known_since(from) && self.sums(from, now).tally.arrivals >= self.tune.min_samples
    }

    /// The highest rate the demand can use: `DEMAND_CEILING_PCT` of it.
    pub(super) fn demand_ceiling(&self, now: u64, ahead_ns: u64) -> u64 {
        pct(self.demand(now, ahead_ns), DEMAND_CEILING_PCT)
    }

    /// The demand a probe may go to: as [`Self::demand`], with the arrivals
    /// of the median round of the last 500 ms (a round of retries of the
    /// rule's own 429s arrives at twice the rest, S9: a probe to 105% of
    /// the last 300 ms went to 1.2-1.3x the offered rate and sent what the
    /// rule held at once, out of the band for a second; the rounds of the
    /// probe before, which took the rule's 429s away, are the clients'
    /// own).
    pub(super) fn steady_demand(&self, now: u64, ahead_ns: u64) -> u64 {
        let from = now.saturating_sub(500 * MS);
        let mut rates: Vec<u64> = self
            .rounds
            .iter()
            .filter(|r| r.end > from && r.end <= now && r.dur > 0)
            .map(|r| per_s(r.tally.arrivals, r.dur))
            .collect();
        rates.sort_unstable();
        let Some(&median) = rates.get(rates.len() / 2) else {
            return self.demand(now, ahead_ns);
        };
        let held = count_in(
            self.rate,
            ahead_ns.saturating_sub(self.tune.queue_budget_ns),
        );
        median.saturating_add(per_s(held, NS_PER_S))
    }

    /// The demand (µreq/s): what arrived over the last 300 ms, and what the
    /// rule's own queue holds beyond `queue_budget_ns` (`ahead_ns` at the
    /// rate) to be sent within a second. A queue within the budget is sent
    /// as the demand leaves room (at most `DEMAND_CEILING_PCT` of it,
    /// within the band); a longer one is sent at once, as a longer queue upstream is
    /// drained (its wait is the clients' latency).
    pub(super) fn demand(&self, now: u64, ahead_ns: u64) -> u64 {
        let w = self.sums(now.saturating_sub(300 * MS), now);
        let held = count_in(
            self.rate,
            ahead_ns.saturating_sub(self.tune.queue_budget_ns),
        );
        per_s(w.tally.arrivals, w.dur).saturating_add(per_s(held, NS_PER_S))
    }
}
