//! The learner's memory: the rounds of the last few seconds (sums over any
//! window of them), requests in flight, the recent latency, and the latency
//! reference (what the upstream takes without a queue).

use std::collections::VecDeque;

use super::{per_s, Controller, MAX_ROUNDS, MS};
use crate::adaptive::tally::Tally;

/// One round as it was seen.
#[derive(Debug, Clone, Copy)]
pub(super) struct Round {
    pub end: u64,
    pub dur: u64,
    pub tally: Tally,
    pub in_flight_start: u64,
    pub in_flight_end: u64,
}

/// Sums over consecutive rounds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Sums {
    pub dur: u64,
    pub tally: Tally,
    /// Requests in flight at the end minus at the start.
    pub growth: i64,
    pub rounds: u32,
}

impl Sums {
    /// Answers that the upstream served (good) or that failed for reasons
    /// of their own (bad, but not the load's), per second: what it can take.
    pub fn served_rate(&self) -> u64 {
        let t = &self.tally;
        let not_load = t.overload().saturating_sub(t.load_part(t.overload()));
        per_s(t.good.saturating_add(not_load), self.dur)
    }
}

/// The latency reference: the lowest mean latency of chunks of at least
/// `SAMPLES` timed answers over at least `CHUNK_NS` (the minimum of noisy
/// small means would sit well below the true latency), within its memory.
#[derive(Debug, Clone, Default)]
pub(super) struct Reference {
    chunks: VecDeque<(u64, u64)>,
    chunk: (u64, Tally),
}

const SAMPLES: u64 = 20;
const CHUNK_NS: u64 = 500 * MS;

impl Reference {
    /// The latency without a queue, ns (0: not yet seen).
    pub fn latency_ns(&self) -> u64 {
        self.chunks.iter().map(|(_, l)| *l).min().unwrap_or(0)
    }

    /// A round `(start, now]`: into the chunk being summed, which closes
    /// once it holds enough.
    fn add(&mut self, start: u64, now: u64, tally: &Tally) {
        if self.chunk.1.timed() == 0 {
            self.chunk.0 = start;
        }
        self.chunk.1.merge(tally);
        if self.chunk.1.timed() >= SAMPLES && now.saturating_sub(self.chunk.0) >= CHUNK_NS {
            if let Some(us) = self.chunk.1.mean_latency_us() {
                self.chunks.push_back((now, us.saturating_mul(1_000)));
            }
            self.chunk = (now, Tally::EMPTY);
        }
    }

    /// Forgets chunks older than `memory_ns` (keeping at least one).
    fn expire(&mut self, now: u64, memory_ns: u64) {
        while self.chunks.len() > 1
            && self
                .chunks
                .front()
                .is_some_and(|(at, _)| at.saturating_add(memory_ns) < now)
        {
            self.chunks.pop_front();
        }
    }

    /// The reference as it stands holds for its full memory from `now` (a
    /// drain kept it from expiring; it starts its memory again).
    pub fn renew(&mut self, now: u64) {
        let l = self.latency_ns();
        if l > 0 {
            self.chunks.push_back((now, l));
        }
    }

    /// A new reference: `latency_ns` from `now` (the upstream got slower),
    /// or none until the answers from `now` on give one (what was taken for
    /// it held a queue).
    pub fn reset(&mut self, now: u64, latency_ns: Option<u64>) {
        self.chunks.clear();
        if let Some(l) = latency_ns {
            self.chunks.push_back((now, l));
        }
        self.chunk = (now, Tally::EMPTY);
    }
}

impl Controller {
    /// Keeps what round `(last, now]` saw.
    pub(super) fn record(&mut self, now: u64, tally: &Tally) {
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
        let keep = self.tune.slow_window_ns.max(3_000 * MS);
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
        self.reference.add(start, now, tally);
        // The reference expires (the upstream may have become slower for
        // good), but not while a queue is being drained: a queue that lasts
        // longer than the reference's memory would become the reference.
        // (A slower upstream is told apart by the drain's verify step.)
        if !matches!(self.phase, super::Phase::Drain { .. }) {
            self.reference.expire(now, self.tune.reference_ns);
        }
    }

    /// Rounds that ended in `(from, to]`.
    pub(super) fn sums(&self, from: u64, to: u64) -> Sums {
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
    pub(super) fn known_since(&self, from: u64) -> bool {
        self.rounds
            .front()
            .is_some_and(|r| r.end.saturating_sub(r.dur) <= from)
    }

    /// The long window of the latency tests: four recent latencies, 1 to 3 s.
    pub(super) fn long_window_ns(&self) -> u64 {
        self.latency_ns
            .saturating_mul(4)
            .clamp(1_000 * MS, 3_000 * MS)
    }

    /// The fast queue-test window: twice the latency without a queue (each
    /// half at least one such latency), 300 ms to 1.6 s.
    pub(super) fn fast_window_ns(&self) -> u64 {
        self.reference
            .latency_ns()
            .saturating_mul(2)
            .clamp(300 * MS, 1_600 * MS)
    }
}
