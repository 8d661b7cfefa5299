//! The learner as it runs in the filter, all but the host calls.
//!
//! Every worker adds what it saw of an adaptive rule's traffic into the
//! rule's shared tally ([`add_tally`], on its tick). For each adaptive rule
//! one VM of the process holds the rule's learner lease
//! (`CellId::Learner`, renewed on each of its rounds, taken over 300 ms
//! after it lapses, and at once by a newer configuration) and, every
//! [`ROUND_NS`]: takes the tally (swapping it for zeros), reads how far the
//! rule's schedule reaches, updates the rule's [`Controller`], and, in
//! enforce mode, writes the interval to pace at into the first word of the
//! rule's schedule cell (`[interval, tat]`), where every admission reads it
//! at no extra cost. A faster rate also moves the schedule's end forward
//! ([`crate::schedule::retime`]), as each worker does with what it holds, so a higher rate
//! shows at once; a slower one applies to new admissions (a held request
//! keeps the time it was promised).
//!
//! A VM that takes a rule's lease starts its controller afresh from the
//! interval in the cell: the rate does not jump; what it learned of latency
//! and capacity is learned again within seconds. Unless the rule's settings
//! changed (`rate`, the `adaptive` block: `CellId::Learned` keeps their
//! fingerprint): a configuration that changes them starts at its `rate`.
//! A configuration change that leaves them alone (another rule, the
//! rule's `max_queue_delay`, ...) keeps the rate learned: the capacity
//! behind did not change with it. While the old configuration's listener
//! drains, its VM no longer learns the rule (the newer one holds it).

use super::controller::{rate_of_interval, Controller, Reason, Tuning};
use super::tally::{Tally, TALLY_WORDS};
use super::Mode;
use crate::clock::NS_PER_MS;
use crate::config::Config;
use crate::lease::LEASE_NS;
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

/// Writes `interval` into the first word of a rule's schedule cell (a
/// faster one also moves the schedule's end forward, see [`crate::schedule::retime`]).
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
        match cell.store(
            [interval, crate::schedule::retime(tat, now, old, interval)],
            token,
        ) {
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
    /// Of the settings it learns under (see `CellId::Learned`).
    settings: u64,
    controller: Option<Controller>,
}

/// The learning side of one configuration in one VM.
#[derive(Debug)]
pub struct Learners {
    /// Its lease token: the configuration's generation (newer wins) and
    /// the VM's random tag.
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
    /// The learners of `config`'s adaptive rules (None: it has none). `tag`:
    /// this VM's random tag; `generation`: when the configuration was
    /// applied (monotonic ms: a newer configuration takes the leases).
    pub fn new(config: &Config, tag: u32, generation: u32) -> Option<Learners> {
        let rules: Vec<Learned> = config
            .rules
            .iter()
            .enumerate()
            .filter_map(|(index, r)| {
                let a = r.adaptive?;
                let schedule = r.schedule?;
                let settings = [
                    schedule.interval_ns,
                    a.min_interval_ns,
                    a.max_interval_ns,
                    u64::from(a.mode == Mode::Enforce),
                ]
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
                    (h ^ w).wrapping_mul(0x0100_0000_01b3).rotate_left(23)
                })
                .max(1);
                Some(Learned {
                    index,
                    schedule,
                    min_interval_ns: a.min_interval_ns,
                    max_interval_ns: a.max_interval_ns,
                    mode: a.mode,
                    settings,
                    controller: None,
                })
            })
            .collect();
        (!rules.is_empty()).then_some(Learners {
            me: (u64::from(generation) << 32 | u64::from(tag)).max(1),
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
        let tune = self.tune;
        let me = self.me;
        let mut out = Vec::new();
        for r in &mut self.rules {
            if !hold(&mut store.cell(CellId::Learner(r.index)), me, now) {
                r.controller = None;
                continue;
            }
            let mut cell = store.cell(CellId::Rate(r.index));
            let configured = r.schedule.interval_ns;
            if r.controller.is_none() && !same_settings(store, r) {
                // New settings for the rule: start again at its `rate`.
                let _ = write_interval(&mut cell, configured, configured, now);
            }
            let Ok((value, _)) = cell.load() else {
                continue;
            };
            let [first, tat] = value.unwrap_or([0, 0]);
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
                    "adaptive rate {:.1}/s -> {:.1}/s ({}; {} sent, {} good, {} shed, {} failed, {} late ({} of those the load's), in flight {}, {} ms latency, reference {} ms){}",
                    before as f64 / super::MICRO as f64,
                    u.rate as f64 / super::MICRO as f64,
                    if why.is_empty() { "phase".to_string() } else { why.join(", ") },
                    tally.sent,
                    tally.good,
                    tally.shed,
                    tally.failed,
                    tally.late,
                    tally.load_bad(),
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

/// Whether `me` holds the learner lease of a rule at `now`: renews it, or
/// takes it if nobody holds it, its holder's lapsed ([`LEASE_NS`]), or its
/// holder is of an older configuration (the upper 32 bits: the
/// generation; wrapping, compared as a signed difference). False also if
/// the cell cannot be read or updated (nobody learns rather than two).
fn hold<C: SharedCell>(cell: &mut C, me: u64, now: u64) -> bool {
    let generation = |token: u64| (token >> 32) as u32;
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((value, token)) = cell.load() else {
            return false;
        };
        let [holder, until] = value.unwrap_or([0, 0]);
        let older = (generation(me).wrapping_sub(generation(holder)) as i32) > 0;
        if holder != me && holder != 0 && until > now && !older {
            return false;
        }
        match cell.store([me, now.saturating_add(LEASE_NS)], token) {
            Ok(true) => return true,
            Ok(false) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// Whether the rule's rate was learned under its current settings; if not,
/// records them (the caller then starts again at `rate`).
fn same_settings<S: Store>(store: S, r: &Learned) -> bool {
    let mut cell = store.cell(CellId::Learned(r.index));
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((value, token)) = cell.load() else {
            return true;
        };
        let [stored, _] = value.unwrap_or([0, 0]);
        if stored == r.settings {
            return true;
        }
        match cell.store([r.settings, 0], token) {
            Ok(true) => return stored == 0,
            Ok(false) => continue,
            Err(_) => return true,
        }
    }
    true
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
    use crate::schedule::retime;
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
        assert_eq!(
            crate::schedule::retime(1_000 * MS, 600 * MS, 10 * MS, 5 * MS),
            800 * MS
        );
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
        let mut a = Learners::new(&config, 7, 1).unwrap();
        let mut b = Learners::new(&config, 9, 1).unwrap();
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
        now += LEASE_NS + ROUND_NS;
        b.on_tick(store, now);
        assert!(b.learning());
        assert_eq!(b.rate_milli(0).unwrap(), rate_of_interval(first) / 1_000);
    }

    #[test]
    fn observe_mode_learns_but_never_writes_the_cell() {
        let config = adaptive_config("observe");
        let cells = initialised(&config);
        let store = MemStore(cells);
        let mut a = Learners::new(&config, 7, 1).unwrap();
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
            1,
            1
        )
        .is_none());
    }

    fn config_with(rate: &str, delay: &str) -> Config {
        crate::config::parse(
            format!(
                r#"{{"rules": [{{"name": "api", "rate": "{rate}", "max_queue_delay": "{delay}",
                   "adaptive": {{"min_rate": "10/s", "max_rate": "1000/s"}}}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    /// Red team 3, finding 8: after a configuration change the learner was
    /// said to start at `rate`, and two configurations' learners (the new
    /// one, and the old one while its listener drained) could both write
    /// the rule's rate. Now the newer configuration takes the rule's lease
    /// at once and the older stops; it keeps the rate learned when the
    /// rule's `rate` and `adaptive` block are unchanged, and starts at its
    /// `rate` when they changed.
    #[test]
    fn a_new_configuration_takes_over_and_restarts_only_when_the_rule_changed() {
        let old = config_with("100/s", "300ms");
        let cells = initialised(&old);
        let store = MemStore(cells);
        let mut a = Learners::new(&old, 7, 1_000).unwrap();
        let mut now = 1_000 * MS;
        a.on_tick(store, now);
        // It learned 40/s.
        let _ = write_interval(&mut store.cell(CellId::Rate(0)), 10 * MS, 25 * MS, now);
        // Another max_queue_delay only: the newer configuration takes the
        // lease at once and keeps 40/s; the old one stops learning.
        let mqd = config_with("100/s", "301ms");
        let mut b = Learners::new(&mqd, 9, 2_000).unwrap();
        now += ROUND_NS;
        b.on_tick(store, now);
        assert!(b.learning());
        assert_eq!(b.rate_milli(0), Some(40_000));
        now += ROUND_NS;
        assert!(a.on_tick(store, now).is_empty() && !a.learning());
        // A new rate: the next configuration starts there.
        let rate = config_with("150/s", "301ms");
        let mut c = Learners::new(&rate, 11, 3_000).unwrap();
        now += ROUND_NS;
        c.on_tick(store, now);
        // (150/s is an interval of 6,666,667 ns: 149.999/s.)
        assert_eq!(c.rate_milli(0), Some(149_999));
        let [first, _] = store.load(CellId::Rate(0)).unwrap().0.unwrap();
        assert!(first.abs_diff(6_666_667) <= 1, "{first}");
        // An older configuration never takes a newer one's lease back
        // while it is renewed.
        for _ in 0..5 {
            now += ROUND_NS;
            c.on_tick(store, now);
            assert!(b.on_tick(store, now).is_empty() && !b.learning());
        }
    }
}
