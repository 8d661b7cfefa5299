//! The virtual schedule (GCRA, "theoretical arrival time"), decided once at
//! admission (as nginx `limit_req` and Sentinel's pacing controller): interval `T = 1/rate`, burst tolerance
//! `tau = burst * T`; on arrival at `now`, `tat = max(stored, now)` and
//! `release_at = tat - tau`:
//!
//! * `release_at <= now`: continue now, store `tat + T`;
//! * `release_at - now > max_queue_delay`: reject now, store nothing;
//! * otherwise: store `tat + T` and hold the request until `release_at`.
//!
//! The stored TAT is shared by all workers of the process and updated with
//! compare-and-swap ([`SharedCell`]), so the rate holds for the whole process.

use crate::clock::NS_PER_S;
use crate::keys::{Bucket, Candidates, Place};
use crate::store::{KeyTable, SharedBlob, SharedCell, StoreError, MAX_CAS_ATTEMPTS};

/// How long a due slot may wait for a worker's tick and still be granted at
/// its own time: the ticks of a worker that holds requests come every few
/// milliseconds, but a busy machine (or a pod's CPU quota) holds the whole
/// process up for tens of ms now and then; a slot older than this is
/// forfeited (the safe side: fewer releases). It bounds the releases a late
/// tick sends at once to `R x CATCH_UP_NS` more than the schedule's, as for
/// held requests released at the first tick after their turn. Until
/// 2026-11-28 250 ms (a tick after a long stall sent a quarter second of
/// slots at once); then 20 ms, which lost the slots of a 43 ms stall of the
/// three proxies of CI's uneven-load test (one 1 s window at 293 of 300; the
/// fleet simulation's scenario `stalls`).
pub const CATCH_UP_NS: u64 = 50 * crate::clock::NS_PER_MS;

/// Parameters of one schedule, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Time between two requests at the configured rate.
    pub interval_ns: u64,
    /// Burst tolerance: `burst * interval_ns`.
    pub tau_ns: u64,
    /// Longest a request may be held.
    pub max_delay_ns: u64,
}

/// The outcome of one admission attempt against a given stored TAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Within the rate: continue now and store `new_tat`.
    Now { new_tat: u64 },
    /// Hold until `release_at` and store `new_tat`.
    Hold { release_at: u64, new_tat: u64 },
    /// Its turn is `wait_ns` away, beyond what may be held: reject, store nothing.
    Reject { wait_ns: u64, queue_full: bool },
}

impl Schedule {
    /// A schedule for one request every `interval_ns`, `burst` extra requests
    /// admitted at once, and holds of at most `max_delay_ns`.
    pub fn new(interval_ns: u64, burst: u64, max_delay_ns: u64) -> Self {
        Schedule {
            interval_ns,
            tau_ns: burst.saturating_mul(interval_ns),
            max_delay_ns,
        }
    }

    /// Decides one request arriving at `now` given the stored TAT. `can_hold`
    /// is false when the worker's queue is full: a request that would be held
    /// is rejected instead (and takes no slot).
    pub fn step(&self, stored_tat: Option<u64>, now: u64, can_hold: bool) -> Step {
        let tat = stored_tat.map_or(now, |t| t.max(now));
        let release_at = tat.saturating_sub(self.tau_ns);
        let new_tat = tat.saturating_add(self.interval_ns);
        if release_at <= now {
            return Step::Now { new_tat };
        }
        let wait_ns = release_at - now;
        if wait_ns > self.max_delay_ns || !can_hold {
            return Step::Reject {
                wait_ns,
                queue_full: wait_ns <= self.max_delay_ns,
            };
        }
        Step::Hold {
            release_at,
            new_tat,
        }
    }

    /// The same schedule at another interval (a learned rate), keeping its
    /// burst in requests and its longest hold; itself for 0 (nothing learned).
    pub fn at_interval(&self, interval_ns: u64) -> Schedule {
        if interval_ns == 0 || interval_ns == self.interval_ns {
            return *self;
        }
        let burst = self.tau_ns.checked_div(self.interval_ns).unwrap_or(0);
        Schedule::new(interval_ns, burst, self.max_delay_ns)
    }

    /// The schedule in force with a rate cell's first word `first`: at the
    /// interval the learner keeps there if the rule learns its rate
    /// (`learned`), else itself.
    pub fn in_force(&self, learned: bool, first: u64) -> Schedule {
        if learned {
            self.at_interval(first)
        } else {
            *self
        }
    }

    /// Seconds a rejected client should wait before its retry could be held
    /// (the `retry-after` header): rounded up, at least 1.
    pub fn retry_after_s(&self, wait_ns: u64, queue_full: bool) -> u64 {
        let beyond = if queue_full {
            wait_ns
        } else {
            wait_ns.saturating_sub(self.max_delay_ns)
        };
        beyond.div_ceil(NS_PER_S).max(1)
    }
}

/// The decision for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Continue now (fast path). `tat`: the schedule after this request.
    Now { tat: u64 },
    /// Hold until `release_at` (monotonic ns).
    Hold { release_at: u64, tat: u64 },
    /// Answer now with the reject status and `retry-after`. `tat`: the
    /// schedule as it stands (for the rate-limit headers).
    Reject {
        retry_after_s: u64,
        queue_full: bool,
        tat: u64,
    },
    /// The shared schedule could not be updated (store error, or
    /// [`MAX_CAS_ATTEMPTS`] lost races). The filter fails closed: it rejects.
    Contention,
}

/// One admission step against a loaded TAT; returns the TAT to store.
fn decide(
    schedule: &Schedule,
    stored_tat: Option<u64>,
    now: u64,
    can_hold: bool,
) -> (Admission, Option<u64>) {
    match schedule.step(stored_tat, now, can_hold) {
        Step::Reject {
            wait_ns,
            queue_full,
        } => {
            let retry_after_s = schedule.retry_after_s(wait_ns, queue_full);
            (
                Admission::Reject {
                    retry_after_s,
                    queue_full,
                    tat: stored_tat.map_or(now, |t| t.max(now)),
                },
                None,
            )
        }
        Step::Now { new_tat } => (Admission::Now { tat: new_tat }, Some(new_tat)),
        Step::Hold {
            release_at,
            new_tat,
        } => (
            Admission::Hold {
                release_at,
                tat: new_tat,
            },
            Some(new_tat),
        ),
    }
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

/// Admits one request at `now` against a rule's shared schedule.
pub fn admit<C: SharedCell>(
    cell: &mut C,
    schedule: &Schedule,
    now: u64,
    can_hold: bool,
) -> Admission {
    admit_paced(cell, schedule, false, now, can_hold, &mut || None)
}

/// [`admit`], at the interval the learner keeps in the cell's first word
/// (`learned`; 0 there: `schedule`'s own interval). The first word is
/// written back as it was loaded, so admissions never undo the learner, and
/// reading the interval costs no extra load (an unkeyed cell's first word
/// is 0 otherwise). `deadline`, asked only when the request would be held
/// (and at most once), bounds its hold below `max_queue_delay`: a turn
/// beyond it is rejected at once, taking no slot.
pub fn admit_paced<C: SharedCell>(
    cell: &mut C,
    schedule: &Schedule,
    learned: bool,
    now: u64,
    can_hold: bool,
    deadline: &mut dyn FnMut() -> Option<u64>,
) -> Admission {
    let mut asked: Option<Option<u64>> = None;
    let taken = update_paced(cell, schedule, learned, |paced, stored_tat| {
        let mut paced = *paced;
        if let Step::Hold { release_at, .. } = paced.step(stored_tat, now, can_hold) {
            let own = *asked.get_or_insert_with(&mut *deadline);
            if let Some(d) = own.filter(|d| release_at.saturating_sub(now) > *d) {
                paced.max_delay_ns = paced.max_delay_ns.min(d);
            }
        }
        decide(&paced, stored_tat, now, can_hold)
    });
    taken.unwrap_or(Admission::Contention)
}

/// One compare-and-swap on a rule's rate cell `[learned interval, tat]`,
/// the one way every user of the cell reads and updates it (admission
/// here and its peek before a key's quota, a release order's take and
/// give-back in `rate::Gcra`): `step` sees the
/// schedule in force (at the interval in word 0 when the rule learns it,
/// 0 there: `schedule`'s own) and the stored TAT, and answers with its
/// result and the TAT to store (None: store nothing). Word 0 is written
/// back as it was loaded, so nothing but the learner moves the learned
/// rate. Errs on a store error or after [`MAX_CAS_ATTEMPTS`] lost races.
pub fn update_paced<C: SharedCell, T>(
    cell: &mut C,
    schedule: &Schedule,
    learned: bool,
    mut step: impl FnMut(&Schedule, Option<u64>) -> (T, Option<u64>),
) -> Result<T, StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (stored, token) = cell.load()?;
        let first = stored.map_or(0, |[w, _]| w);
        let paced = schedule.in_force(learned, first);
        let (out, new) = step(&paced, stored.map(|[_, tat]| tat));
        let Some(tat) = new else {
            return Ok(out);
        };
        if cell.store([first, tat], token)? {
            return Ok(out);
        }
    }
    Err(StoreError(u32::MAX))
}

/// Admits one request of key `fingerprint` (non-zero) against a per-key rule's
/// table ([`crate::keys`]): the entry holding this key's schedule in either
/// candidate bucket; else a free one ([`Bucket::place`]); else the schedule
/// that ends soonest, shared with the key that holds it. Reads one bucket
/// when the key's entry is in the first (most keys), two otherwise; writes
/// the one it changed.
pub fn admit_keyed<T: KeyTable>(
    table: &mut T,
    fingerprint: u64,
    at: Candidates,
    schedule: &Schedule,
    now: u64,
    can_hold: bool,
) -> Admission {
    let mut a = table.bucket(at.first);
    let mut b = (at.first != at.second).then(|| table.bucket(at.second));
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((va, ta)) = a.load() else {
            return Admission::Contention;
        };
        let mut first = Bucket::decode(va.as_deref(), at.ways);
        // Which bucket, which entry, and the fingerprint it keeps.
        let (in_second, entry, fp, mut second, tb) = match first.find(fingerprint) {
            Some(i) => (false, i, fingerprint, None, None),
            None => {
                let (second, tb) = match b.as_mut().map(|b| b.load()) {
                    None => (None, None),
                    Some(Ok((vb, token))) => {
                        (Some(Bucket::decode(vb.as_deref(), at.ways)), Some(token))
                    }
                    Some(Err(_)) => return Admission::Contention,
                };
                match second.as_ref().and_then(|s| s.find(fingerprint)) {
                    Some(j) => (true, j, fingerprint, second, tb),
                    None => match Bucket::place(&first, second.as_ref(), now) {
                        Place::Free { second: s, entry } => (s, entry, fingerprint, second, tb),
                        Place::Share { second: s, entry } => {
                            let holder = if s { second.as_ref() } else { Some(&first) };
                            let f = holder
                                .and_then(|h| h.get(entry))
                                .map_or(fingerprint, |[f, _]| f);
                            (s, entry, f, second, tb)
                        }
                    },
                }
            }
        };
        let bucket = if in_second {
            second.as_mut()
        } else {
            Some(&mut first)
        };
        let Some(bucket) = bucket else {
            return Admission::Contention;
        };
        // The entry's schedule: its own or the one it shares (a free
        // entry's past schedule is the same as none).
        let stored = bucket.get(entry).filter(|[f, _]| *f == fp).map(|[_, t]| t);
        let (admission, new) = decide(schedule, stored, now, can_hold);
        let Some(tat) = new else { return admission };
        bucket.set(entry, [fp, tat]);
        let bytes = bucket.encode();
        let result = match (in_second, b.as_mut(), tb) {
            (true, Some(b), Some(tb)) => b.store(bytes, tb),
            _ => a.store(bytes, ta),
        };
        match result {
            Ok(true) => return admission,
            Ok(false) => continue,
            Err(_) => return Admission::Contention,
        }
    }
    Admission::Contention
}

/// Admits one request of key `fingerprint` under a shared rate with a per-key
/// quota (fairness): the shared schedule alone decides when requests go, so
/// the shared rate stays exact; the key's quota schedule only admits or
/// rejects, so one key can hold at most `quota rate x max_queue_delay + 1`
/// places of the shared queue and takes at most its quota on average.
///
/// Order: peek at the shared schedule (reject at once if it is full, touching
/// nothing), take a place in the key's quota (reject if the key is over it),
/// then take the shared place. If the shared schedule filled up in between (a
/// race of microseconds), the quota place is spent: the conservative side.
#[allow(clippy::too_many_arguments)]
pub fn admit_with_quota<C: SharedCell, T: KeyTable>(
    shared: &mut C,
    table: &mut T,
    fingerprint: u64,
    at: Candidates,
    schedule: &Schedule,
    quota: &Schedule,
    now: u64,
    can_hold: bool,
) -> Admission {
    admit_with_quota_paced(
        shared,
        table,
        fingerprint,
        at,
        (schedule, false),
        quota,
        now,
        can_hold,
    )
}

/// [`admit_with_quota`] whose shared schedule may be learned (see
/// [`admit_paced`]); each key's quota stays as configured.
#[allow(clippy::too_many_arguments)]
pub fn admit_with_quota_paced<C: SharedCell, T: KeyTable>(
    shared: &mut C,
    table: &mut T,
    fingerprint: u64,
    at: Candidates,
    (schedule, learned): (&Schedule, bool),
    quota: &Schedule,
    now: u64,
    can_hold: bool,
) -> Admission {
    // The peek stores nothing.
    let peek = update_paced(shared, schedule, learned, |paced, tat| {
        (decide(paced, tat, now, can_hold).0, None)
    });
    match peek {
        Err(_) => return Admission::Contention,
        Ok(refused @ Admission::Reject { .. }) => return refused,
        Ok(_) => {}
    }
    match take_quota(table, fingerprint, at, quota, now) {
        Some(refused) => refused,
        None => admit_paced(shared, schedule, learned, now, can_hold, &mut || None),
    }
}

/// A place in key `fingerprint`'s quota: the key's own schedule, which only
/// admits or rejects (the rule's source decides when the request goes).
/// None: within its quota; else the answer for a key over it (or the
/// table's contention). Every order takes it the same way: FIFO here
/// ([`admit_with_quota_paced`]), classes in `stream/class.rs`.
pub fn take_quota<T: KeyTable>(
    table: &mut T,
    fingerprint: u64,
    at: Candidates,
    quota: &Schedule,
    now: u64,
) -> Option<Admission> {
    match admit_keyed(table, fingerprint, at, quota, now, true) {
        Admission::Now { .. } | Admission::Hold { .. } => None,
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NS_PER_MS;
    use crate::store::StoreError;

    const MS: u64 = NS_PER_MS;
    const NOW: Admission = Admission::Now { tat: 0 };

    /// The decision without the schedule's new TAT (asserted separately).
    fn k(a: Admission) -> Admission {
        match a {
            Admission::Now { .. } => NOW,
            Admission::Hold { release_at, .. } => hold(release_at),
            Admission::Reject {
                retry_after_s,
                queue_full,
                ..
            } => Admission::Reject {
                retry_after_s,
                queue_full,
                tat: 0,
            },
            other => other,
        }
    }

    fn hold(release_at: u64) -> Admission {
        Admission::Hold { release_at, tat: 0 }
    }

    /// A TAT cell; `conflicts` simulates other workers winning the race.
    #[derive(Default)]
    struct Cell {
        tat: Option<u64>,
        version: u32,
        conflicts: u32,
        fail: bool,
    }

    impl SharedCell for Cell {
        type Token = u32;
        fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
            if self.fail {
                return Err(StoreError(10));
            }
            Ok((self.tat.map(|t| [0, t]), self.version))
        }
        fn store(&mut self, [_, tat]: [u64; 2], token: u32) -> Result<bool, StoreError> {
            if self.conflicts > 0 {
                self.conflicts -= 1;
                self.version += 1;
                // The other worker took one slot.
                self.tat = Some(self.tat.unwrap_or(0) + 2 * MS);
                return Ok(false);
            }
            if token != self.version {
                return Ok(false);
            }
            self.tat = Some(tat);
            self.version += 1;
            Ok(true)
        }
    }

    // 500/s: one every 2 ms, no burst, hold at most 10 ms.
    fn s500() -> Schedule {
        Schedule::new(2 * MS, 0, 10 * MS)
    }

    #[test]
    fn requests_within_the_rate_continue_at_once() {
        let mut c = Cell::default();
        let s = s500();
        for i in 0..5 {
            assert_eq!(k(admit(&mut c, &s, 1000 * MS + i * 2 * MS, true)), NOW);
        }
        assert_eq!(c.tat, Some(1010 * MS));
    }

    #[test]
    fn a_burst_is_spaced_exactly_one_interval_apart() {
        let mut c = Cell::default();
        let s = s500();
        let now = 1000 * MS;
        assert_eq!(k(admit(&mut c, &s, now, true)), NOW);
        for i in 1..=5 {
            assert_eq!(k(admit(&mut c, &s, now, true)), hold(now + i * 2 * MS));
        }
        // 6th in the same instant: its turn (12 ms away) is beyond max_queue_delay.
        assert_eq!(
            k(admit(&mut c, &s, now, true)),
            Admission::Reject {
                retry_after_s: 1,
                queue_full: false,
                tat: 0
            }
        );
        // The rejection took no slot: 1 ms later the next is due at now+12ms = 11 ms away.
        assert_eq!(
            k(admit(&mut c, &s, now + MS, true)),
            Admission::Reject {
                retry_after_s: 1,
                queue_full: false,
                tat: 0
            }
        );
        assert_eq!(
            k(admit(&mut c, &s, now + 2 * MS, true)),
            hold(now + 12 * MS)
        );
    }

    #[test]
    fn exactly_max_queue_delay_is_held() {
        let mut c = Cell {
            tat: Some(110 * MS),
            ..Default::default()
        };
        assert_eq!(k(admit(&mut c, &s500(), 100 * MS, true)), hold(110 * MS));
        let mut c = Cell {
            tat: Some(110 * MS + 1),
            ..Default::default()
        };
        assert!(matches!(
            k(admit(&mut c, &s500(), 100 * MS, true)),
            Admission::Reject { .. }
        ));
    }

    #[test]
    fn burst_allows_extra_requests_at_once_then_paces() {
        let mut c = Cell::default();
        let s = Schedule::new(2 * MS, 3, 100 * MS);
        let now = 50 * MS;
        for _ in 0..4 {
            assert_eq!(k(admit(&mut c, &s, now, true)), NOW);
        }
        assert_eq!(k(admit(&mut c, &s, now, true)), hold(now + 2 * MS));
        assert_eq!(k(admit(&mut c, &s, now, true)), hold(now + 4 * MS));
    }

    #[test]
    fn an_idle_schedule_forgets_its_past() {
        let mut c = Cell {
            tat: Some(5 * MS),
            ..Default::default()
        };
        assert_eq!(k(admit(&mut c, &s500(), 1000 * MS, true)), NOW);
        assert_eq!(c.tat, Some(1002 * MS));
    }

    #[test]
    fn a_full_queue_rejects_what_would_be_held_without_taking_a_slot() {
        let mut c = Cell {
            tat: Some(104 * MS),
            ..Default::default()
        };
        assert_eq!(
            k(admit(&mut c, &s500(), 100 * MS, false)),
            Admission::Reject {
                retry_after_s: 1,
                queue_full: true,
                tat: 0
            }
        );
        assert_eq!(c.tat, Some(104 * MS));
        // Within the rate, a full queue does not matter.
        assert_eq!(k(admit(&mut c, &s500(), 104 * MS, false)), NOW);
    }

    #[test]
    fn retry_after_counts_whole_seconds_beyond_the_queue() {
        let s = Schedule::new(NS_PER_S, 0, 2 * NS_PER_S); // 1/s, hold up to 2 s
        assert_eq!(s.retry_after_s(2 * NS_PER_S + 1, false), 1);
        assert_eq!(s.retry_after_s(5 * NS_PER_S, false), 3);
        assert_eq!(s.retry_after_s(5 * NS_PER_S + 1, false), 4);
        assert_eq!(s.retry_after_s(1, true), 1);
        assert_eq!(s.retry_after_s(1500 * MS, true), 2);
        let mut c = Cell {
            tat: Some(10 * NS_PER_S),
            ..Default::default()
        };
        assert_eq!(
            k(admit(&mut c, &s, 0, true)),
            Admission::Reject {
                retry_after_s: 8,
                queue_full: false,
                tat: 0
            }
        );
    }

    #[test]
    fn lost_races_are_retried_against_the_new_value() {
        let mut c = Cell {
            conflicts: 3,
            tat: Some(100 * MS),
            ..Default::default()
        };
        // Three other admissions win first (each takes 2 ms of schedule).
        assert_eq!(k(admit(&mut c, &s500(), 100 * MS, true)), hold(106 * MS));
        assert_eq!(c.tat, Some(108 * MS));
    }

    #[test]
    fn endless_contention_or_a_broken_store_fails_closed() {
        // Every race is lost; the queue is long enough that each attempt wants to hold.
        let patient = Schedule::new(2 * MS, 0, 10_000 * MS);
        let mut c = Cell {
            conflicts: MAX_CAS_ATTEMPTS,
            ..Default::default()
        };
        assert_eq!(k(admit(&mut c, &patient, 0, true)), Admission::Contention);
        // One race fewer and the last attempt wins.
        let mut c = Cell {
            conflicts: MAX_CAS_ATTEMPTS - 1,
            ..Default::default()
        };
        assert!(matches!(
            k(admit(&mut c, &patient, 0, true)),
            Admission::Hold { .. }
        ));
        let mut c = Cell {
            fail: true,
            ..Default::default()
        };
        assert_eq!(k(admit(&mut c, &s500(), 0, true)), Admission::Contention);
    }

    #[test]
    fn a_clock_that_goes_back_never_releases_early() {
        let mut c = Cell::default();
        let s = s500();
        assert_eq!(k(admit(&mut c, &s, 100 * MS, true)), NOW);
        assert_eq!(k(admit(&mut c, &s, 100 * MS, true)), hold(102 * MS));
        // Time appears to go back 50 ms: the schedule is still in the future.
        assert_eq!(
            k(admit(&mut c, &s, 50 * MS, true)),
            Admission::Reject {
                retry_after_s: 1,
                queue_full: false,
                tat: 0
            }
        );
        assert_eq!(c.tat, Some(104 * MS));
    }

    #[test]
    fn saturating_at_the_end_of_time() {
        let s = Schedule::new(u64::MAX / 2, u64::MAX, u64::MAX);
        assert_eq!(s.tau_ns, u64::MAX);
        assert_eq!(
            s.step(Some(u64::MAX), u64::MAX, true),
            Step::Now { new_tat: u64::MAX }
        );
    }

    #[test]
    fn zero_max_delay_is_a_pure_limiter() {
        let mut c = Cell::default();
        let s = Schedule::new(2 * MS, 0, 0);
        assert_eq!(k(admit(&mut c, &s, 0, true)), NOW);
        assert!(matches!(
            k(admit(&mut c, &s, 0, true)),
            Admission::Reject { .. }
        ));
        assert_eq!(k(admit(&mut c, &s, 2 * MS, true)), NOW);
    }

    /// A learned rate lives in the cell's first word: admissions pace at it
    /// and write it back untouched; 0 there is the configured interval.
    #[test]
    fn a_learned_interval_in_the_first_word_paces_and_survives() {
        #[derive(Default)]
        struct Both(Option<[u64; 2]>, u32);
        impl SharedCell for Both {
            type Token = u32;
            fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
                Ok((self.0, self.1))
            }
            fn store(&mut self, v: [u64; 2], t: u32) -> Result<bool, StoreError> {
                if t != self.1 {
                    return Ok(false);
                }
                self.0 = Some(v);
                self.1 += 1;
                Ok(true)
            }
        }
        let s = Schedule::new(2 * MS, 1, 100 * MS); // 500/s, burst 1
        let mut c = Both(Some([0, 0]), 0);
        let none = &mut || None;
        assert_eq!(k(admit_paced(&mut c, &s, true, 1000 * MS, true, none)), NOW);
        assert_eq!(c.0, Some([0, 1002 * MS]), "0: the configured interval");
        // The learner stores 10 ms (100/s): burst 1 means tau 10 ms now.
        c.0 = Some([10 * MS, 1002 * MS]);
        assert_eq!(k(admit_paced(&mut c, &s, true, 1000 * MS, true, none)), NOW);
        assert_eq!(
            k(admit_paced(&mut c, &s, true, 1000 * MS, true, none)),
            hold(1002 * MS)
        );
        assert_eq!(c.0, Some([10 * MS, 1022 * MS]), "the first word is kept");
        // Not learned (observe mode, or another rule): the word is kept, not used.
        assert_eq!(
            k(admit_paced(&mut c, &s, false, 1000 * MS, true, none)),
            hold(1020 * MS)
        );
        assert_eq!(c.0, Some([10 * MS, 1024 * MS]));
        // A request's own deadline shorter than its turn: rejected at once,
        // no slot taken, retry-after from the learned rate; asked only once,
        // and only because it would have been held.
        let mut asked = 0;
        let mut deadline = || {
            asked += 1;
            Some(10 * MS) // its turn is 14 ms away (tat 1024 ms - tau 10 ms)
        };
        let tat_before = c.0;
        assert_eq!(
            k(admit_paced(
                &mut c,
                &s,
                true,
                1000 * MS,
                true,
                &mut deadline
            )),
            Admission::Reject {
                retry_after_s: 1,
                queue_full: false,
                tat: 0
            }
        );
        assert_eq!((asked, c.0), (1, tat_before));
        let mut never = || -> Option<u64> { panic!("asked on the fast path") };
        assert_eq!(
            k(admit_paced(&mut c, &s, true, 2000 * MS, true, &mut never)),
            NOW
        );
        assert_eq!(s.at_interval(0), s);
        assert_eq!(s.at_interval(10 * MS).tau_ns, 10 * MS);
    }

    /// Over any window the schedule admits at most rate x window + burst + 1.
    #[test]
    fn rate_over_a_long_window_is_exact() {
        let mut c = Cell::default();
        let s = Schedule::new(2 * MS, 0, 1000 * MS);
        let mut released = Vec::new();
        // 2,000 requests offered at 4x the rate, 0.5 ms apart.
        for i in 0..2000u64 {
            let now = i * MS / 2;
            match k(admit(&mut c, &s, now, true)) {
                Admission::Now { .. } => released.push(now),
                Admission::Hold { release_at, .. } => released.push(release_at),
                _ => {}
            }
        }
        released.sort_unstable();
        for w in released.windows(2) {
            assert!(w[1] - w[0] >= 2 * MS, "{} then {}", w[0], w[1]);
        }
        // Slots 0, 2, ..., 1998 ms: the last arrival (999.5 ms) may wait until 1999.5 ms.
        assert_eq!(released.len(), 1000);
        assert_eq!(released.last(), Some(&(1998 * MS)));
    }
}

#[cfg(test)]
mod keyed_tests {
    use super::*;
    use crate::clock::NS_PER_MS;
    use crate::keys::WAYS;
    use crate::store::{BlobId, Store};
    use crate::testing::{MemCell as SingleCell, MemCells, MemStore};
    use std::cell::RefCell;

    const MS: u64 = NS_PER_MS;

    /// Rule 0's key table in the crate's in-memory store.
    struct Table {
        cells: &'static RefCell<MemCells>,
    }

    impl Default for Table {
        fn default() -> Self {
            Table {
                cells: Box::leak(Box::default()),
            }
        }
    }

    impl KeyTable for Table {
        type Bucket = crate::store::Blob<MemStore<'static>>;
        fn bucket(&mut self, n: u32) -> Self::Bucket {
            MemStore(self.cells).blob(BlobId::Bucket(0, n))
        }
    }

    impl Table {
        /// The first entry of bucket `n` (these tests use buckets of one
        /// entry, as single slots: the choices between two candidates).
        fn get(&self, n: u32) -> Option<[u64; 2]> {
            let c = self.cells.borrow();
            let (bytes, _) = c.blobs.get(&BlobId::Bucket(0, n))?;
            Bucket::decode(Some(bytes), 1).get(0)
        }
    }

    /// Candidate buckets `a` and `b` of one entry each.
    fn c(a: u32, b: u32) -> Candidates {
        Candidates {
            first: a,
            second: b,
            ways: 1,
        }
    }

    fn s500() -> Schedule {
        Schedule::new(2 * MS, 0, 1000 * MS)
    }

    fn release(a: Admission, now: u64) -> u64 {
        match a {
            Admission::Now { .. } => now,
            Admission::Hold { release_at, .. } => release_at,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_key_has_its_own_schedule() {
        let mut t = Table::default();
        let now = 100 * MS;
        // Key 11 in slots (0, 1), key 22 in slots (2, 3): both start at once.
        assert_eq!(
            release(admit_keyed(&mut t, 11, c(0, 1), &s500(), now, true), now),
            now
        );
        assert_eq!(
            release(admit_keyed(&mut t, 22, c(2, 3), &s500(), now, true), now),
            now
        );
        assert_eq!(
            release(admit_keyed(&mut t, 11, c(0, 1), &s500(), now, true), now),
            now + 2 * MS
        );
        assert_eq!(
            release(admit_keyed(&mut t, 22, c(2, 3), &s500(), now, true), now),
            now + 2 * MS
        );
        assert_eq!(t.get(0), Some([11, now + 4 * MS]));
        assert_eq!(t.get(2), Some([22, now + 4 * MS]));
    }

    #[test]
    fn a_key_finds_its_schedule_in_its_second_slot() {
        let mut t = Table::default();
        let now = 100 * MS;
        // Slot 0 is busy with key 33; key 11 takes slot 1.
        admit_keyed(&mut t, 33, c(0, 9), &s500(), now, true);
        admit_keyed(&mut t, 11, c(0, 1), &s500(), now, true);
        assert_eq!(t.get(1), Some([11, now + 2 * MS]));
        // Later, key 11 finds its own schedule in slot 1, not a fresh one in 0.
        assert_eq!(
            release(admit_keyed(&mut t, 11, c(0, 1), &s500(), now, true), now),
            now + 2 * MS
        );
    }

    #[test]
    fn a_slot_whose_schedule_is_past_is_taken_over_losslessly() {
        let mut t = Table::default();
        admit_keyed(&mut t, 33, c(0, 1), &s500(), 100 * MS, true);
        admit_keyed(&mut t, 44, c(1, 0), &s500(), 100 * MS, true);
        // 10 ms later both schedules are in the past: key 11 takes slot 0.
        let now = 110 * MS;
        assert_eq!(
            release(admit_keyed(&mut t, 11, c(0, 1), &s500(), now, true), now),
            now
        );
        assert_eq!(t.get(0), Some([11, now + 2 * MS]));
    }

    #[test]
    fn when_both_slots_are_busy_keys_share_a_rate_never_exceed_it() {
        let mut t = Table::default();
        let now = 100 * MS;
        admit_keyed(&mut t, 33, c(0, 5), &s500(), now, true); // slot 0 busy until +2ms
        admit_keyed(&mut t, 44, c(1, 5), &s500(), now, true); // slot 1 busy until +2ms
                                                              // Key 11 (slots 0, 1): shares slot 0 with key 33, which keeps the slot.
        assert_eq!(
            release(admit_keyed(&mut t, 11, c(0, 1), &s500(), now, true), now),
            now + 2 * MS
        );
        assert_eq!(t.get(0), Some([33, now + 4 * MS]));
    }

    #[test]
    fn a_noisy_key_cannot_fill_the_shared_schedule() {
        // Shared 10/s (100 ms), hold up to 1 s: 11 places. Each key's quota: 2/s.
        let shared_s = Schedule::new(100 * MS, 0, 1000 * MS);
        let quota = Schedule::new(500 * MS, 0, 1000 * MS);
        let mut shared = SingleCell::default();
        let mut t = Table::default();
        let now = 10_000 * MS;
        let go = |t: &mut Table, shared: &mut SingleCell, fp: u64, at| {
            admit_with_quota(shared, t, fp, at, &shared_s, &quota, now, true)
        };
        // Key A sends 20 at once: its quota admits 3 (at 0, 0.5 s, 1 s of its
        // own schedule), which take the first 3 shared places, 100 ms apart.
        let a: Vec<Admission> = (0..20)
            .map(|_| go(&mut t, &mut shared, 11, c(0, 1)))
            .collect();
        assert_eq!(
            a.iter()
                .filter(|x| !matches!(x, Admission::Reject { .. }))
                .count(),
            3
        );
        assert_eq!(
            release(a[2], now),
            now + 200 * MS,
            "released by the shared schedule, not the quota"
        );
        // Key B still finds room: its 3 go right after A's.
        let b: Vec<Admission> = (0..3)
            .map(|_| go(&mut t, &mut shared, 22, c(2, 3)))
            .collect();
        assert_eq!(
            b.iter().map(|x| release(*x, now) - now).collect::<Vec<_>>(),
            vec![300 * MS, 400 * MS, 500 * MS]
        );
        // A's rejected requests took no shared place: the shared schedule holds 6.
        assert_eq!(shared.v.map(|[_, tat]| tat), Some(now + 600 * MS));
    }

    #[test]
    fn a_full_shared_schedule_rejects_without_spending_quota() {
        let shared_s = Schedule::new(100 * MS, 0, 0); // no queue: one place per 100 ms
        let quota = Schedule::new(500 * MS, 0, 1000 * MS);
        let mut shared = SingleCell::default();
        let mut t = Table::default();
        let now = 10_000 * MS;
        assert!(matches!(
            admit_with_quota(
                &mut shared,
                &mut t,
                11,
                c(0, 1),
                &shared_s,
                &quota,
                now,
                true
            ),
            Admission::Now { .. }
        ));
        assert!(matches!(
            admit_with_quota(
                &mut shared,
                &mut t,
                22,
                c(2, 3),
                &shared_s,
                &quota,
                now,
                true
            ),
            Admission::Reject { .. }
        ));
        assert_eq!(t.get(2), None, "the rejected key's quota is untouched");
    }

    #[test]
    fn sixteen_entries_in_two_buckets_before_a_key_shares() {
        let s = Schedule::new(100 * MS, 0, 0); // no queue: sharing is a 429
        let mut t = Table::default();
        let now = 1_000 * MS;
        let both = Candidates {
            first: 0,
            second: 1,
            ways: WAYS,
        };
        // Sixteen keys with the same two buckets all start at once.
        for fp in 1..=16u64 {
            assert!(
                matches!(
                    admit_keyed(&mut t, fp, both, &s, now, true),
                    Admission::Now { .. }
                ),
                "key {fp}"
            );
        }
        // Both buckets fill before anyone shares.
        let free = |t: &Table, n| {
            let c = t.cells.borrow();
            let bytes = c.blobs.get(&BlobId::Bucket(0, n)).map(|(v, _)| v.clone());
            Bucket::decode(bytes.as_deref(), WAYS).free(now)
        };
        assert_eq!((free(&t, 0), free(&t, 1)), (0, 0));
        // A seventeenth shares a schedule: rejected, nothing taken.
        assert!(matches!(
            admit_keyed(&mut t, 17, both, &s, now, true),
            Admission::Reject { .. }
        ));
        // Each of the sixteen finds its own schedule (one interval on).
        for fp in 1..=16u64 {
            assert!(matches!(
                admit_keyed(&mut t, fp, both, &s, now, true),
                Admission::Reject { .. }
            ));
            assert!(matches!(
                admit_keyed(&mut t, fp, both, &s, now + 100 * MS, true),
                Admission::Now { .. }
            ));
        }
    }
}
