//! The learner as it runs in the filter, all but the host calls.
//!
//! Every worker adds what it saw of an adaptive rule's traffic into the
//! rule's shared tally ([`add_tally`], on its tick). One VM per process
//! holds the learner lease (`CellId::Learner`, as the cluster caller's) and,
//! every [`ROUND_NS`], for each adaptive rule: takes the tally (swapping it
//! for zeros), reads how far the rule's schedule reaches, updates the rule's
//! [`Controller`], and, in enforce mode, writes the interval to pace at into
//! the first word of the rule's schedule cell (`[interval, tat]`), where
//! every admission reads it at no extra cost. A faster rate also moves the
//! schedule's end forward ([`retime`]), as each worker does with what it
//! holds, so a higher rate shows at once; a slower one applies to new
//! admissions (a held request keeps the time it was promised).
//!
//! A VM that takes the lease over starts each rule's controller afresh from
//! the interval in the cell: the rate does not jump; what it learned of
//! latency and capacity is learned again within seconds.

use super::controller::{rate_of_interval, Controller, Reason, Tuning};
use super::tally::{Tally, TALLY_WORDS};
use super::Mode;
use crate::clock::NS_PER_MS;
use crate::config::Config;
use crate::lease;
use crate::schedule::Schedule;
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, SharedBlob, SharedCell, Store, MAX_CAS_ATTEMPTS};

/// How often the learner updates the rates.
pub const ROUND_NS: u64 = 100 * NS_PER_MS;

/// A tally as shared data: its words, little-endian.
pub fn encode(t: &Tally) -> Vec<u8> {
    t.to_words().iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A tally from shared data (missing or short: zeros).
pub fn decode(bytes: &[u8]) -> Tally {
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .take(TALLY_WORDS)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    Tally::from_words(&words)
}

/// Adds a worker's tally into the shared one. False if it could not (the
/// store failed, or lost every race): the worker keeps it for its next tick.
pub fn add_tally<B: SharedBlob>(blob: &mut B, t: &Tally) -> bool {
    if *t == Tally::EMPTY {
        return true;
    }
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((value, token)) = blob.load() else {
            return false;
        };
        let mut sum = value.as_deref().map_or(Tally::EMPTY, decode);
        sum.merge(t);
        match blob.store(&encode(&sum), token) {
            Ok(true) => return true,
            Ok(false) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// Takes the shared tally, leaving zeros. None if it could not be read or swapped.
pub fn take_tally<B: SharedBlob>(blob: &mut B) -> Option<Tally> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, token) = blob.load().ok()?;
        let t = value.as_deref().map_or(Tally::EMPTY, decode);
        if t == Tally::EMPTY {
            return Some(t);
        }
        match blob.store(&encode(&Tally::EMPTY), token) {
            Ok(true) => return Some(t),
            Ok(false) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// A time of the schedule re-timed at `now` for a change of interval from
/// `old` to a shorter `new`: what lies ahead comes forward by `new / old`
/// (order kept). Never later than it was; unchanged for a longer interval.
pub fn retime(at: u64, now: u64, old: u64, new: u64) -> u64 {
    if at <= now || old == 0 || new >= old {
        return at;
    }
    let ahead = u128::from(at - now) * u128::from(new) / u128::from(old);
    now.saturating_add(u64::try_from(ahead).unwrap_or(u64::MAX))
        .min(at)
}

/// Writes `interval` into the first word of a rule's schedule cell (a
/// faster one also moves the schedule's end forward, see [`retime`]).
/// Returns the interval in force before; None if the cell could not be
/// updated (the next round tries again).
pub fn write_interval<C: SharedCell>(
    cell: &mut C,
    configured: u64,
    interval: u64,
    now: u64,
) -> Option<u64> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, token) = cell.load().ok()?;
        let [first, tat] = value.unwrap_or([0, 0]);
        let old = if first == 0 { configured } else { first };
        if old == interval {
            return Some(old);
        }
        match cell.store([interval, retime(tat, now, old, interval)], token) {
            Ok(true) => return Some(old),
            Ok(false) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// What one round of the learner did for one rule.
#[derive(Debug)]
pub struct Round {
    pub rule: usize,
    /// The rate gauge and the counters of what moved it.
    pub counts: Counts,
    /// If the rate moved (or a reason was counted): from what to what, why,
    /// and the answers of the round.
    pub change: Option<String>,
}

/// One adaptive rule as the learner sees it.
#[derive(Debug)]
struct Learned {
    index: usize,
    schedule: Schedule,
    min_interval_ns: u64,
    max_interval_ns: u64,
    mode: Mode,
    controller: Option<Controller>,
}

/// The learning side of one configuration in one VM.
#[derive(Debug)]
pub struct Learners {
    me: u64,
    rules: Vec<Learned>,
    last_round: Option<u64>,
    tune: Tuning,
}

/// Statistics of a reason a controller moved.
fn stat_of(r: Reason) -> Stat {
    match r {
        Reason::Shed => Stat::AdaptiveShed,
        Reason::Failed => Stat::AdaptiveFailed,
        Reason::Queue => Stat::AdaptiveQueue,
        Reason::Drained => Stat::AdaptiveDrained,
        Reason::Probe => Stat::AdaptiveProbe,
        Reason::Kept => Stat::AdaptiveKept,
        Reason::RetryAfter => Stat::AdaptiveRetryAfter,
    }
}

impl Learners {
    /// The learners of `config`'s adaptive rules (None: it has none). `me`:
    /// this VM's lease token (not 0).
    pub fn new(config: &Config, me: u64) -> Option<Learners> {
        let rules: Vec<Learned> = config
            .rules
            .iter()
            .enumerate()
            .filter_map(|(index, r)| {
                let a = r.adaptive?;
                Some(Learned {
                    index,
                    schedule: r.schedule?,
                    min_interval_ns: a.min_interval_ns,
                    max_interval_ns: a.max_interval_ns,
                    mode: a.mode,
                    controller: None,
                })
            })
            .collect();
        (!rules.is_empty()).then_some(Learners {
            me: me.max(1),
            rules,
            last_round: None,
            tune: Tuning::default(),
        })
    }

    /// Whether this VM learns now (it held the lease at its last round).
    pub fn learning(&self) -> bool {
        self.rules.iter().any(|r| r.controller.is_some())
    }

    /// One tick of this VM: every [`ROUND_NS`], if it holds the lease, one
    /// round of every adaptive rule. Returns, by rule, the statistics to
    /// count and, if the rate moved, what moved it (for a debug log).
    pub fn on_tick<S: Store>(&mut self, store: S, now: u64) -> Vec<Round> {
        if self
            .last_round
            .is_some_and(|t| now < t.saturating_add(ROUND_NS) && now >= t)
        {
            return Vec::new();
        }
        self.last_round = Some(now);
        if !lease::hold(&mut store.cell(CellId::Learner), self.me, now) {
            for r in &mut self.rules {
                r.controller = None;
            }
            return Vec::new();
        }
        let tune = self.tune;
        let mut out = Vec::new();
        for r in &mut self.rules {
            let mut cell = store.cell(CellId::Rate(r.index));
            let Ok((value, _)) = cell.load() else {
                continue;
            };
            let [first, tat] = value.unwrap_or([0, 0]);
            let configured = r.schedule.interval_ns;
            let current = if first == 0 { configured } else { first };
            let Some(tally) = take_tally(&mut store.blob(BlobId::Tally(r.index))) else {
                continue;
            };
            let c = r.controller.get_or_insert_with(|| {
                Controller::new(current, r.min_interval_ns, r.max_interval_ns, tune)
            });
            let u = c.update(now, &tally, tat.saturating_sub(now));
            let mut counts = Counts::NONE;
            let mut why = Vec::new();
            for reason in u.reasons.iter() {
                counts.inc(stat_of(reason));
                why.push(reason.name());
            }
            let before = rate_of_interval(current);
            let change = (u.interval_ns != current || !why.is_empty()).then(|| {
                format!(
                    "adaptive rate {:.1}/s -> {:.1}/s ({}; {} sent, {} good, {} shed, {} failed, {} late, in flight {}, {} ms latency, reference {} ms){}",
                    before as f64 / super::MICRO as f64,
                    u.rate as f64 / super::MICRO as f64,
                    if why.is_empty() { "phase".to_string() } else { why.join(", ") },
                    tally.sent,
                    tally.good,
                    tally.shed,
                    tally.failed,
                    tally.late,
                    c.in_flight(),
                    tally.mean_latency_us().unwrap_or(0) / 1_000,
                    c.reference_latency_ns() / NS_PER_MS,
                    if r.mode == Mode::Observe { " [observe]" } else { "" },
                )
            });
            counts.record(Stat::AdaptiveRate, u.rate / 1_000);
            if r.mode == Mode::Enforce && u.interval_ns != current {
                let _ = write_interval(&mut cell, configured, u.interval_ns, now);
            }
            out.push(Round {
                rule: r.index,
                counts,
                change,
            });
        }
        out
    }

    /// The rate a rule is learned at now, per second x 1000 (None: not learning it).
    pub fn rate_milli(&self, rule: usize) -> Option<u64> {
        self.rules
            .iter()
            .find(|r| r.index == rule)?
            .controller
            .as_ref()
            .map(|c| c.rate() / 1_000)
    }
}

/// The interval a rule's schedule paces at, from its cell's first word.
pub fn interval_in(first: u64, configured: u64) -> u64 {
    if first == 0 {
        configured
    } else {
        first
    }
}

/// The rate (per second) of an interval, for logs.
pub fn per_second(interval_ns: u64) -> f64 {
    rate_of_interval(interval_ns) as f64 / super::MICRO as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::create_initial;
    use crate::testing::{MemBlob, MemCell, MemCells, MemStore};
    use std::cell::RefCell;

    const MS: u64 = NS_PER_MS;

    #[test]
    fn tallies_add_up_through_shared_data_and_are_taken_once() {
        let mut blob = MemBlob::default();
        let t = Tally {
            arrivals: 3,
            sent: 2,
            good: 1,
            retry_after_s: 4,
            ..Tally::EMPTY
        };
        assert!(add_tally(&mut blob, &t));
        assert!(add_tally(&mut blob, &t));
        assert_eq!(decode(blob.v.as_deref().unwrap()).arrivals, 6);
        let taken = take_tally(&mut blob).unwrap();
        assert_eq!(
            (taken.arrivals, taken.sent, taken.good, taken.retry_after_s),
            (6, 4, 2, 4)
        );
        assert_eq!(take_tally(&mut blob), Some(Tally::EMPTY), "taken once");
        assert_eq!(decode(&encode(&taken)), taken);
        assert_eq!(decode(&[1, 2, 3]), Tally::EMPTY, "short: zeros");
    }

    #[test]
    fn a_faster_rate_moves_the_schedule_forward_a_slower_one_does_not() {
        assert_eq!(retime(1_000 * MS, 600 * MS, 10 * MS, 5 * MS), 800 * MS);
        assert_eq!(retime(1_000 * MS, 600 * MS, 5 * MS, 10 * MS), 1_000 * MS);
        assert_eq!(
            retime(500 * MS, 600 * MS, 10 * MS, 5 * MS),
            500 * MS,
            "past"
        );
        let mut cell = MemCell {
            v: Some([0, 1_000 * MS]),
            version: 0,
        };
        // 0 in the first word is the configured 10 ms.
        assert_eq!(
            write_interval(&mut cell, 10 * MS, 5 * MS, 600 * MS),
            Some(10 * MS)
        );
        assert_eq!(cell.v, Some([5 * MS, 800 * MS]));
        assert_eq!(
            write_interval(&mut cell, 10 * MS, 20 * MS, 600 * MS),
            Some(5 * MS)
        );
        assert_eq!(cell.v, Some([20 * MS, 800 * MS]));
    }

    fn adaptive_config(mode: &str) -> Config {
        crate::config::parse(
            format!(
                r#"{{"rules": [{{"name": "api", "rate": "100/s", "max_queue_delay": "300ms",
                   "adaptive": {{"min_rate": "10/s", "max_rate": "1000/s", "mode": "{mode}"}}}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn initialised(config: &Config) -> &'static RefCell<MemCells> {
        let cells: &'static RefCell<MemCells> = Box::leak(Box::default());
        create_initial(MemStore(cells), config);
        cells
    }

    /// Two VMs: one learns (the lease), and a shed round cuts the rate in
    /// the shared cell, where admissions read it; the other does nothing
    /// until the lease lapses.
    #[test]
    fn one_vm_learns_and_writes_the_rate_where_admissions_read_it() {
        let config = adaptive_config("enforce");
        let cells = initialised(&config);
        let store = MemStore(cells);
        let mut a = Learners::new(&config, 7).unwrap();
        let mut b = Learners::new(&config, 9).unwrap();
        let shed = Tally {
            arrivals: 30,
            sent: 20,
            good: 10,
            shed: 10,
            latency_us: 10 * 20_000,
            latency_sq_ms2: 10 * 400,
            retry_after_s: 1,
            ..Tally::EMPTY
        };
        let mut now = 1_000 * MS;
        assert!(a.on_tick(store, now).is_empty() || a.learning());
        assert!(b.on_tick(store, now).is_empty(), "the lease is a's");
        for _ in 0..3 {
            now += ROUND_NS;
            assert!(add_tally(&mut store.blob(BlobId::Tally(0)), &shed));
            let out = a.on_tick(store, now);
            if out.iter().any(|r| r.counts.get(Stat::AdaptiveShed) > 0) {
                let change = out[0].change.as_deref().unwrap_or_default();
                assert!(change.contains("(shed"), "{change}");
                break;
            }
        }
        let [first, _] = store.load(CellId::Rate(0)).unwrap().0.unwrap();
        assert!(first > 10 * MS, "cut below 100/s: interval {first}");
        assert!(a.rate_milli(0).unwrap() < 100_000);
        // a stops ticking: b takes over after the lease lapses, from the cell.
        now += lease::LEASE_NS + ROUND_NS;
        b.on_tick(store, now);
        assert!(b.learning());
        assert_eq!(b.rate_milli(0).unwrap(), rate_of_interval(first) / 1_000);
    }

    #[test]
    fn observe_mode_learns_but_never_writes_the_cell() {
        let config = adaptive_config("observe");
        let cells = initialised(&config);
        let store = MemStore(cells);
        let mut a = Learners::new(&config, 7).unwrap();
        let shed = Tally {
            arrivals: 30,
            sent: 20,
            good: 10,
            shed: 10,
            ..Tally::EMPTY
        };
        let mut now = 1_000 * MS;
        for _ in 0..5 {
            let _ = add_tally(&mut store.blob(BlobId::Tally(0)), &shed);
            a.on_tick(store, now);
            now += ROUND_NS;
        }
        assert!(
            a.rate_milli(0).unwrap() < 100_000,
            "it learned a lower rate"
        );
        assert_eq!(store.load(CellId::Rate(0)).unwrap().0, Some([0, 0]));
        assert!(Learners::new(
            &crate::config::parse(br#"{"rules": [{"name": "a", "rate": 1}]}"#).unwrap(),
            1
        )
        .is_none());
    }
}
