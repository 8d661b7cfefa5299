//! Going ahead of the grants, bounded: a process with no owned slot near
//! may let a request go now on credit (at most `burst + 1` owed), or take its
//! next owned slot before its time (within the epoch, as many as credit); the
//! calling VM repays the credit from the earliest owned slots after it
//! publishes ([`repay`]). So a request within the rate does not wait for the
//! engine after a lull, and at any instant the process is ahead of its
//! grants by at most `burst + 1` requests (the bound in `engine/README.md`).
//! The state lives in the rule's ahead cell ([`crate::CellId::Ahead`]), read
//! only off the fast path.

use crate::clock::NS_PER_MS;
use crate::store::{SharedBlob, SharedCell, StoreError, MAX_CAS_ATTEMPTS};

use super::cursor::{advance, next_owned, Attempt, Grants, Reach, Take};

/// How far a process is ahead of its grants, kept in the rule's ahead cell
/// ([`crate::CellId::Ahead`], `[gap_us << 32 | known[1] << 24 | known[0] << 16
/// | owed, pending << 48 | until_ms]`): slots owed (requests that went on
/// credit), and slots taken for a request before their time or to repay a
/// credit that are not yet due (`pending`, the latest of them due at
/// `until_ms`, wall-clock ms; the earliest two known apart, due `known` ms
/// before it, the rest counted until `until_ms`). Owed and pending together
/// stay within `burst + 1` (credit), whether a request goes on credit or
/// before its slot's time; so at any instant the process is ahead of its
/// grants by at most `burst + 1` requests. Until issue 29 every pending slot
/// counted until the latest was due: after a burst took six slots early,
/// none gave its credit back until the sixth was due, and a request within
/// the rate waited 42 ms for its own slot (fleet sweep seed 26).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ahead {
    pub owed: u64,
    pub pending: u64,
    pub until_ms: u64,
    /// Of `pending`, up to two due apart: each `until_ms - known[i]` ms
    /// (0: none; the earlier first).
    pub known: [u64; 2],
    /// The expected gap between the process's slots, µs (1 / its grant
    /// rate; 0: unknown), as the calling VM last published it: a slot due
    /// within it may be taken now (`go_ahead`).
    pub gap_us: u64,
}

impl Ahead {
    const MS_BITS: u32 = 48;
    const OWED_BITS: u32 = 16;
    const KNOWN_BITS: u32 = 8;

    /// The state of a cell's value (a cell never stored: nothing ahead).
    pub fn decode(value: Option<[u64; 2]>) -> Ahead {
        let [first, packed] = value.unwrap_or([0, 0]);
        let field = |shift: u32, bits: u32| (first >> shift) & ((1 << bits) - 1);
        let k = Self::KNOWN_BITS;
        let pending = packed >> Self::MS_BITS;
        let mut a = Ahead {
            owed: field(0, Self::OWED_BITS),
            known: [field(Self::OWED_BITS, k), field(Self::OWED_BITS + k, k)],
            gap_us: first >> 32,
            pending,
            until_ms: packed & ((1 << Self::MS_BITS) - 1),
        };
        a.known = a.known_sorted();
        a
    }

    /// The cell's value. A field too large for its bits is stored as the
    /// bound that errs on the safe side: owed and pending at their most, a
    /// slot known apart due at most 255 ms before the latest.
    pub fn encode(self) -> [u64; 2] {
        let max = |bits: u32| (1u64 << bits) - 1;
        let ms = self.until_ms.min(max(Self::MS_BITS));
        let pending = self.pending.min(u64::from(u16::MAX));
        let owed = self.owed.min(max(Self::OWED_BITS));
        let [k0, k1] = self.known_sorted().map(|k| k.min(max(Self::KNOWN_BITS)));
        let gap = self.gap_us.min(u64::from(u32::MAX));
        [
            gap << 32 | k1 << (Self::OWED_BITS + Self::KNOWN_BITS) | k0 << Self::OWED_BITS | owed,
            pending << Self::MS_BITS | ms,
        ]
    }

    /// The slots known apart, the earlier (larger offset) first, no more
    /// than are pending.
    fn known_sorted(self) -> [u64; 2] {
        let [a, b] = self.known;
        let mut k = [a.max(b), a.min(b)];
        if self.pending < 2 {
            k[1] = 0;
        }
        if self.pending < 1 {
            k[0] = 0;
        }
        k
    }

    /// Nothing taken ahead is still ahead at wall time `now`.
    fn clear_at(self, now: u64) -> bool {
        self.until_ms.saturating_mul(NS_PER_MS) <= now
    }

    /// Wall time at which a slot known apart `off` ms before the latest is due.
    fn due(self, off: u64) -> u64 {
        self.until_ms.saturating_sub(off).saturating_mul(NS_PER_MS)
    }

    /// The state at `now`: the slots due by then dropped.
    fn settled(self, now: u64) -> Ahead {
        if self.clear_at(now) {
            return Ahead {
                pending: 0,
                known: [0, 0],
                ..self
            };
        }
        let mut a = self;
        let mut left = [0; 2];
        let mut slots = left.iter_mut();
        for off in self.known_sorted() {
            if off == 0 {
                continue;
            }
            if a.due(off) <= now {
                a.pending = a.pending.saturating_sub(1);
            } else if let Some(slot) = slots.next() {
                *slot = off;
            }
        }
        a.known = left;
        a
    }

    /// The slots taken ahead still not due at `now`.
    fn pending_at(self, now: u64) -> u64 {
        self.settled(now).pending
    }

    /// The state at `now` with one more slot, due at wall time `t`, taken
    /// ahead: known apart while fewer than two are (and it, or the one it
    /// comes after, is not due with the latest), else counted until the
    /// latest.
    fn with_pending(self, now: u64, t: u64) -> Ahead {
        let mut a = self.settled(now);
        let t_ms = t.div_ceil(NS_PER_MS);
        let known = a.known.iter().filter(|&&k| k > 0).count() as u64;
        let free = a.known.iter().position(|&k| k == 0);
        if a.pending > 0 && t_ms > a.until_ms {
            let later = t_ms - a.until_ms;
            for k in a.known.iter_mut().filter(|k| **k > 0) {
                *k = k.saturating_add(later);
            }
            // The one slot counted until the old latest becomes known apart.
            if let (1, Some(slot)) = (
                a.pending.saturating_sub(known),
                free.and_then(|i| a.known.get_mut(i)),
            ) {
                *slot = later;
            }
            a.until_ms = t_ms;
        } else if a.pending > 0 && t_ms < a.until_ms {
            if let Some(slot) = free.and_then(|i| a.known.get_mut(i)) {
                *slot = a.until_ms - t_ms;
            }
        } else {
            a.until_ms = a.until_ms.max(t_ms);
        }
        a.pending += 1;
        a.known = a.known_sorted();
        a
    }

    /// Whether one more may go ahead at `now`: fewer than `reach.credit`
    /// owed or taken ahead and not yet due.
    fn has_credit(self, reach: &Reach, now: u64) -> bool {
        self.owed + self.pending_at(now) < reach.credit
    }
}

/// Slots due within two of the process's gaps that may be taken before
/// their time at once (so it is ahead by at most `burst + 1 + NEAR_AHEAD`).
pub const NEAR_AHEAD: u64 = 2;

/// Lets a request go ahead of its grants, if the process may: `early` (the
/// slot it will take is due at `slot_time`, beyond one interval) and credit
/// (no slot at all) both need fewer than `reach.credit` owed or ahead (slots
/// due within two gaps may also go while fewer than [`NEAR_AHEAD`] are
/// ahead). A new request never goes ahead while others wait for
/// grants (`queued`: the requests waiting, as the cursor counts them for a
/// first attempt). None: it may not; `Contention`: the cell failed.
pub(super) fn go_ahead<A: SharedCell>(
    cell: &mut A,
    reach: &Reach,
    attempt: Attempt,
    queued: u64,
    now: u64,
    early: Option<u64>,
) -> Option<Take> {
    if attempt == Attempt::First && queued > 0 {
        return None;
    }
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((v, token)) = cell.load() else {
            return Some(Take::Contention);
        };
        let mut ahead = Ahead::decode(v);
        if let Some(t) = early {
            // Due within two of its own gaps (its slots come unevenly: the
            // lanes of a claim): its slot is as good as now, as a GCRA's next
            // release would be; two such at most pending.
            let near = t.saturating_sub(now) <= ahead.gap_us.saturating_mul(2000);
            if near && ahead.pending_at(now) < NEAR_AHEAD {
                ahead = ahead.with_pending(now, t);
                match cell.store(ahead.encode(), token) {
                    Ok(true) => return Some(Take::Credit),
                    Ok(false) => continue,
                    Err(_) => return Some(Take::Contention),
                }
            }
        }
        let may = match early {
            // Before its slot's time, beyond one interval (within one it is
            // held for its slot): as credit, while less than `burst + 1`
            // are owed or ahead.
            Some(t) => t.saturating_sub(now) > reach.grid.interval_ns,
            None => true,
        } && ahead.has_credit(reach, now);
        if !may {
            return None;
        }
        match early {
            Some(t) => ahead = ahead.with_pending(now, t),
            None => ahead.owed += 1,
        }
        match cell.store(ahead.encode(), token) {
            Ok(true) => return Some(Take::Credit),
            Ok(false) => continue,
            Err(_) => return Some(Take::Contention),
        }
    }
    Some(Take::Contention)
}

/// Records the expected gap between the process's slots (`gap_ns`; 0:
/// none expected) for `go_ahead`; written by the calling VM as it
/// publishes, only when it changed by a tenth or more.
pub fn set_gap<A: SharedCell>(cell: &mut A, gap_ns: u64) -> Result<(), StoreError> {
    let gap_us = gap_ns / 1000;
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = cell.load()?;
        let mut ahead = Ahead::decode(v);
        if ahead.gap_us.abs_diff(gap_us) <= ahead.gap_us / 10
            && (gap_us == 0) == (ahead.gap_us == 0)
        {
            return Ok(());
        }
        ahead.gap_us = gap_us;
        if cell.store(ahead.encode(), token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

/// A new request with no owned slot in reach (and nobody ahead of it in its
/// rule's line or classes) goes now on credit, if the process may (less
/// than `burst + 1` owed or being repaid): as `take` does for a rule
/// without classes. True if it went.
pub fn on_credit<A: SharedCell>(
    ahead: &mut A,
    reach: &Reach,
    now: u64,
) -> Result<bool, StoreError> {
    match go_ahead(ahead, reach, Attempt::First, 0, now, None) {
        Some(Take::Credit) => Ok(true),
        Some(Take::Contention) => Err(StoreError(0)),
        _ => Ok(false),
    }
}

/// Whether a new request could go on credit now ([`on_credit`]): less than
/// `burst + 1` owed or ahead. Only reads the cell: a stage that would refuse
/// a request whose turn it cannot reckon asks this first, so that a request
/// the process may let go on credit is not refused at once.
pub fn credit_left<A: SharedCell>(
    ahead: &mut A,
    reach: &Reach,
    now: u64,
) -> Result<bool, StoreError> {
    Ok(Ahead::decode(ahead.load()?.0).has_credit(reach, now))
}

/// A new request with nobody ahead of it takes its next owned slot, due at
/// wall time `slot_time`, now, before its time, if the process may (near:
/// within two of its gaps; early: within the epoch, beyond one interval,
/// within the budget of credit), as `take` does for a rule without classes.
/// True if it may (the slot counts as ahead until its time); the caller
/// then takes the slot.
pub fn before_its_time<A: SharedCell>(
    ahead: &mut A,
    reach: &Reach,
    now: u64,
    slot_time: u64,
) -> Result<bool, StoreError> {
    if slot_time <= now || slot_time - now > reach.grid.epoch_ns {
        return Ok(false);
    }
    match go_ahead(ahead, reach, Attempt::First, 0, now, Some(slot_time)) {
        Some(Take::Credit) => Ok(true),
        Some(Take::Contention) => Err(StoreError(0)),
        _ => Ok(false),
    }
}

/// How a request whose `max_queue_delay` ran out went ([`at_deadline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtDeadline {
    /// On credit: the slot that repays it comes from the next grants ([`repay`]).
    Credit,
    /// On a slot a failed call cost the process ([`forgive`]): repaid by nothing.
    Forgiven,
}

/// A request that waited for grants until its `max_queue_delay` ran out:
/// its turn was reckoned on the share the process expected, and the grants
/// came later. It goes on credit if the process may (nothing ahead, less
/// than `burst + 1` owed), else on a slot a failed call cost the process
/// if one is still forgiven (`forgiven`, [`forgive`]; one fewer then).
/// None: it may not (it is refused); Err: the forgiven cell failed.
pub fn at_deadline<A: SharedCell, F: SharedCell>(
    ahead: &mut A,
    forgiven: &mut F,
    reach: &Reach,
    now: u64,
) -> Result<Option<AtDeadline>, StoreError> {
    // (The ahead cell in contention: no credit, a forgiven slot may go.)
    if go_ahead(ahead, reach, Attempt::Retry { waited_ns: 0 }, 0, now, None) == Some(Take::Credit) {
        return Ok(Some(AtDeadline::Credit));
    }
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = forgiven.load()?;
        let [count, until_ms] = v.unwrap_or([0, 0]);
        if count == 0 || until_ms.saturating_mul(NS_PER_MS) <= now {
            return Ok(None);
        }
        if forgiven.store([count - 1, until_ms], token)? {
            return Ok(Some(AtDeadline::Forgiven));
        }
    }
    Err(StoreError(0))
}

/// Adds `slots` to what the process is forgiven until wall time `until`
/// ([`crate::CellId::Forgiven`], `[count, until_ms]`): the share an engine
/// call that failed claimed for it. The call may have been counted (a
/// timeout) and its positions are unknown, or not, and its slots go to
/// whoever claims the leftovers; either way the requests held on the turns
/// reckoned from that share would be refused at their deadline, after the
/// hold. Forgiven, that many go then instead ([`at_deadline`]):
/// the fleet releases at most the lost share more, and only around a
/// failed call (engine/README.md, "Failures"). What is still forgiven when
/// `until` passes lapses.
pub fn forgive<A: SharedCell>(
    cell: &mut A,
    slots: u64,
    until: u64,
    now: u64,
) -> Result<(), StoreError> {
    let until_ms = until.div_ceil(NS_PER_MS);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = cell.load()?;
        let [count, old_until] = v.unwrap_or([0, 0]);
        let live = old_until.saturating_mul(NS_PER_MS) > now;
        let value = if live {
            [count.saturating_add(slots), old_until.max(until_ms)]
        } else {
            [slots, until_ms]
        };
        if cell.store(value, token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

/// Repays what the process owes (requests that went on credit): takes its
/// earliest owned slots, through the cursor as a request would, but only
/// slots due within the coming epoch, and only while no request of the
/// process waits for one: waiting requests go first, and the credit is made
/// up for by slots nobody needs, as a GCRA's burst refills only while the
/// rate is not used (so the request after a burst waits for the next slot,
/// not for the burst to be repaid). What cannot be repaid yet stays owed,
/// and no new credit is taken meanwhile. Called by the calling VM after it
/// publishes. Returns how many were repaid.
pub fn repay<C: SharedCell, A: SharedCell, B: SharedBlob>(
    cursor: &mut C,
    blob: &mut B,
    ahead: &mut A,
    reach: &Reach,
    now: u64,
) -> Result<u64, StoreError> {
    let owed = Ahead::decode(ahead.load()?.0).owed;
    let mut repaid = 0;
    while repaid < owed {
        let Some(slot) = take_near(cursor, blob, reach, now)? else {
            break;
        };
        // Still ahead until the slot that repays it is due.
        repaid_by(ahead, reach.grid.slot_time(slot), now)?;
        repaid += 1;
    }
    Ok(repaid)
}

/// Takes the earliest owned slot not yet taken if it is due within the
/// coming epoch (None: there is none).
fn take_near<C: SharedCell, B: SharedBlob>(
    cursor: &mut C,
    blob: &mut B,
    reach: &Reach,
    now: u64,
) -> Result<Option<u64>, StoreError> {
    let horizon = now.saturating_add(reach.grid.epoch_ns);
    let min_slot = reach.min_slot(now);
    let mut grants: Option<Grants> = None;
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (walk, token) = next_owned(cursor, blob, &mut grants, min_slot)?;
        if walk.cursor.waiting > 0 {
            return Ok(None);
        }
        let Some(found) = walk.found else {
            return Ok(None);
        };
        if reach.grid.slot_time(found.0) > horizon {
            return Ok(None);
        }
        if advance(cursor, token, walk.cursor, found)? {
            return Ok(Some(found.0));
        }
    }
    Err(StoreError(0))
}

/// One slot owed is repaid by a slot due at wall time `t`.
fn repaid_by<A: SharedCell>(cell: &mut A, t: u64, now: u64) -> Result<(), StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = cell.load()?;
        let mut ahead = Ahead::decode(v).with_pending(now, t);
        ahead.owed = ahead.owed.saturating_sub(1);
        if cell.store(ahead.encode(), token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::cursor::{Cursor, Mode};
    use crate::cluster::grants::tests::{ahead, at, cur, reach, setup, waiting_in, FIRST, MS};
    use crate::cluster::grants::{publish, take};
    use crate::testing::{MemBlob, MemCell};

    #[test]
    fn a_failed_calls_share_is_forgiven_once_each_and_lapses() {
        let r = reach(); // burst 0: credit 1
        let mut cell = MemCell::default();
        let mut owed = MemCell::default();
        // Credit first, while the process may: the forgiven slots stay.
        forgive(&mut cell, 2, 1_500 * MS, 1_000 * MS).unwrap();
        let went = |owed: &mut MemCell, cell: &mut MemCell, t: u64| {
            at_deadline(owed, cell, &r, t * MS).unwrap()
        };
        assert_eq!(went(&mut owed, &mut cell, 1_000), Some(AtDeadline::Credit));
        assert_eq!(cell.load().unwrap().0, Some([2, 1_500]));
        // Credit spent. A failed call cost 2 slots, forgiven until 1.5 s;
        // another, 1 more until 1.8 s: three go, the fourth is refused.
        forgive(&mut cell, 1, 1_800 * MS, 1_100 * MS).unwrap();
        for t in [1_200, 1_300, 1_790] {
            assert_eq!(
                went(&mut owed, &mut cell, t),
                Some(AtDeadline::Forgiven),
                "at {t} ms"
            );
        }
        assert_eq!(went(&mut owed, &mut cell, 1_795), None);
        // What is left when its time passes lapses; a new failure starts anew.
        forgive(&mut cell, 5, 2_500 * MS, 2_000 * MS).unwrap();
        assert_eq!(went(&mut owed, &mut cell, 2_500), None);
        forgive(&mut cell, 1, 3_500 * MS, 3_000 * MS).unwrap();
        assert_eq!(cell.load().unwrap().0, Some([1, 3_500]));
        assert_eq!(
            went(&mut owed, &mut cell, 3_100),
            Some(AtDeadline::Forgiven)
        );
        assert_eq!(went(&mut owed, &mut cell, 3_200), None);
    }

    #[test]
    fn without_grants_a_request_goes_on_credit_then_waits_and_repays_first() {
        let mut blob = MemBlob::default();
        let mut c = MemCell::default();
        let mut ahead_cell = MemCell::default();
        let r = reach(); // 500/s (T = 2 ms), burst 0 (credit 1), hold up to 10 ms
        let first = |c: &mut MemCell, blob: &mut MemBlob, a: &mut MemCell, now| {
            take(c, blob, a, &r, now, true, FIRST)
        };
        // Nothing owned: the first goes at once on credit; the process owes 1.
        assert_eq!(
            first(&mut c, &mut blob, &mut ahead_cell, at(1000)),
            Take::Credit
        );
        assert_eq!((waiting_in(&c), ahead_cell.v), (0, Some(ahead(1, 0))));
        // The credit is spent: the next ones have no slot (the stream's
        // stage puts them in the rule's line, or refuses them now: `turn_ns`).
        assert_eq!(
            first(&mut c, &mut blob, &mut ahead_cell, at(1000)),
            Take::Wait
        );
        // Grants arrive (slots 1002..1010): the first repays the credit.
        publish(
            &mut blob,
            &mut c,
            &r,
            0,
            Mode::Grid,
            (0, 0, 0),
            &[(1002, 1010)],
        )
        .unwrap();
        assert_eq!(
            repay(&mut c, &mut blob, &mut ahead_cell, &r, at(1000)),
            Ok(1)
        );
        assert_eq!(
            ahead_cell.v,
            Some(ahead(0, at(1002) / MS)),
            "repaid by the earliest slot, ahead until its time"
        );
        assert_eq!(cur(&c), (1003, 1010));
        // Until slot 1002's time (4 ms), nothing goes ahead: a new request is
        // held for the cursor's next slot.
        assert_eq!(
            first(&mut c, &mut blob, &mut ahead_cell, at(1000)),
            Take::Hold {
                slot: 1003,
                delay_ns: 6 * MS
            }
        );
        // While others wait in the line (counted in the cursor), a new
        // request queues behind them, even with an owned slot at hand.
        let mut x = Cursor::decode(c.v);
        x.waiting = 2;
        c.v = Some(x.encode());
        assert_eq!(
            first(&mut c, &mut blob, &mut ahead_cell, at(1002)),
            Take::Wait
        );
        // Once 1002's time has passed and nobody waits, one may go ahead:
        // on its slot (1004, 4 ms away), before its time.
        x.waiting = 0;
        c.v = Some(x.encode());
        assert_eq!(
            first(&mut c, &mut blob, &mut ahead_cell, at(1002)),
            Take::Early { slot: 1004 }
        );
    }

    #[test]
    fn credit_is_repaid_from_slots_due_within_the_coming_epoch_only() {
        // Owed 1; owned: 1100 (200 ms away: beyond the epoch) only.
        let (mut c, mut b) = setup(&[(1100, 1101)]);
        let mut ahead_cell = MemCell {
            v: Some(ahead(1, 0)),
            version: 1,
        };
        let r = reach();
        assert_eq!(repay(&mut c, &mut b, &mut ahead_cell, &r, at(1000)), Ok(0));
        assert_eq!(
            (waiting_in(&c), ahead_cell.v),
            (0, Some(ahead(1, 0))),
            "still owed"
        );
        // 150 ms later it is due within the epoch: taken, and the debt goes
        // (still ahead until that slot's time).
        assert_eq!(repay(&mut c, &mut b, &mut ahead_cell, &r, at(1075)), Ok(1));
        assert_eq!(
            (ahead_cell.v, cur(&c)),
            (Some(ahead(0, at(1100) / MS)), (1101, 1101))
        );
        // Nothing owed: nothing taken.
        let (mut c, mut b) = setup(&[(1000, 1010)]);
        let mut none = MemCell::default();
        let before = c.v;
        assert_eq!(repay(&mut c, &mut b, &mut none, &r, at(1000)), Ok(0));
        assert_eq!(c.v, before);
    }

    #[test]
    fn one_request_at_a_time_goes_ahead_of_its_slot_within_the_epoch() {
        // Owned: 1000 (now), 1004 and 1005 (8 and 10 ms away).
        let (mut c, mut b) = setup(&[(1000, 1001), (1004, 1006)]);
        let mut ahead_cell = MemCell::default();
        let r = reach();
        let now = at(1000);
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, now, true, FIRST),
            Take::Now { slot: 1000 }
        );
        // The next owned slot is 4 intervals away: taken now, before its time...
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, now, true, FIRST),
            Take::Early { slot: 1004 }
        );
        assert_eq!(
            (waiting_in(&c), ahead_cell.v),
            (0, Some(ahead(0, at(1004) / MS)))
        );
        // ...as many as credit (burst 0: one): until 1004's time the next one
        // holds for its slot.
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, now, true, FIRST),
            Take::Hold {
                slot: 1005,
                delay_ns: 10 * MS
            }
        );
        // Within one interval, a slot is held for, not taken early.
        let (mut c, mut b) = setup(&[(1001, 1002)]);
        let mut ahead_cell = MemCell::default();
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, now, true, FIRST),
            Take::Hold {
                slot: 1001,
                delay_ns: 2 * MS
            }
        );
        assert_eq!(ahead_cell.v, None, "nothing ahead");
    }

    #[test]
    fn with_a_burst_as_many_go_ahead_of_their_slots_as_would_go_on_credit() {
        // Burst 2 (credit 3); owned: 1010, 1020, 1030, 1040 (20 to 80 ms away,
        // within the epoch). A process-scope GCRA with burst 2 lets three go
        // at once; so does the grid, taking their slots before their time
        // (until 2026-11-28 one at a time whatever the burst: fleet sweep
        // seed 26, requests within the rate held up to 47 ms at burst 5).
        let (mut c, mut b) = setup(&[(1010, 1011), (1020, 1021), (1030, 1031), (1040, 1041)]);
        let r = Reach::new(reach().grid, 2, 100 * MS);
        let mut ahead_cell = MemCell::default();
        let now = at(1000);
        let mut took = Vec::new();
        for _ in 0..4 {
            took.push(take(&mut c, &mut b, &mut ahead_cell, &r, now, true, FIRST));
        }
        assert_eq!(
            took,
            vec![
                Take::Early { slot: 1010 },
                Take::Early { slot: 1020 },
                Take::Early { slot: 1030 },
                Take::Hold {
                    slot: 1040,
                    delay_ns: 80 * MS
                }
            ]
        );
        // Ahead by three: 1010 and 1020 known apart (40 and 20 ms before
        // 1030), 1030 itself; nothing owed. (The held one takes no credit: a
        // request in the line at its deadline may still need it.)
        assert_eq!(
            Ahead::decode(ahead_cell.v),
            Ahead {
                owed: 0,
                pending: 3,
                until_ms: at(1030) / MS,
                known: [40, 20],
                gap_us: 0
            }
        );
        // Nothing goes on credit meanwhile; once the first is due, one may.
        let (mut c, mut b) = setup(&[]);
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, at(1009), true, FIRST),
            Take::Wait
        );
        let (mut c, mut b) = setup(&[]);
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, at(1010), true, FIRST),
            Take::Credit
        );
    }

    #[test]
    fn the_credit_of_the_slots_taken_ahead_comes_back_as_each_is_due() {
        // Burst 2 (credit 3), T = 2 ms; owned: 1010, 1020, 1030, 1050. Three go
        // ahead at 1000; at 1012 the first is due, so one more may go ahead of its slot
        // at once (until issue 29 none counted as due until 1030, and the
        // request waited for 1050: fleet sweep seed 26).
        let (mut c, mut b) = setup(&[(1010, 1011), (1020, 1021), (1030, 1031), (1050, 1051)]);
        let r = Reach::new(reach().grid, 2, 100 * MS);
        let mut ahead_cell = MemCell::default();
        for _ in 0..3 {
            assert!(matches!(
                take(&mut c, &mut b, &mut ahead_cell, &r, at(1000), true, FIRST),
                Take::Early { .. }
            ));
        }
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, at(1012), true, FIRST),
            Take::Early { slot: 1050 }
        );
        // Three ahead again (1020, 1030, 1050), each known apart.
        let a = Ahead::decode(ahead_cell.v);
        assert_eq!(a.pending_at(at(1012)), 3);
        assert_eq!(a.pending_at(at(1020)), 2);
        assert_eq!(a.pending_at(at(1030)), 1);
        assert_eq!(a.pending_at(at(1050)), 0);
    }

    /// Whatever the order and spacing of the slots taken ahead (within the
    /// epoch of when they are taken, as `take` and `repay` take them), the
    /// cell never counts fewer pending than are not yet due, and none once
    /// all are due: the bound of `burst + 1` ahead rests on it.
    #[test]
    fn the_ahead_cell_never_counts_fewer_than_are_pending() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let t0 = 1_795_467_600 * 1000 * MS;
        for _ in 0..2000 {
            let mut cell = Ahead::default();
            let mut dues: Vec<u64> = Vec::new();
            let mut now = t0;
            for _ in 0..(1 + next(12)) {
                now += next(30) * MS + next(MS);
                let t = now + 1 + next(100 * MS);
                cell = Ahead::decode(Some(cell.with_pending(now, t).encode()));
                dues.push(t);
                for probe in [now, now + next(50 * MS), now + next(120 * MS)] {
                    let exact = dues.iter().filter(|&&d| d > probe).count() as u64;
                    assert!(
                        cell.pending_at(probe) >= exact,
                        "{cell:?} at {probe}: {exact} pending of {dues:?}"
                    );
                }
            }
            let last = dues.iter().max().copied().unwrap_or(now);
            assert_eq!(cell.pending_at(last.div_ceil(MS) * MS), 0);
        }
    }

    #[test]
    fn the_ahead_cell_keeps_its_fields_and_clamps_to_the_safe_side() {
        let a = Ahead {
            owed: 5,
            pending: 9,
            until_ms: 1_795_467_600_123,
            known: [77, 12],
            gap_us: 12_345,
        };
        assert_eq!(Ahead::decode(Some(a.encode())), a);
        // Too large for their bits: more owed and pending, a slot known
        // apart due later; never less ahead than it is.
        let big = Ahead {
            owed: 1 << 40,
            pending: 1 << 20,
            known: [1000, 300],
            ..a
        };
        let b = Ahead::decode(Some(big.encode()));
        assert!(b.owed == u64::from(u16::MAX) && b.pending == u64::from(u16::MAX));
        assert_eq!(b.known, [255, 255]);
        let now = a.until_ms * MS - 256 * MS;
        assert_eq!(b.pending_at(now), b.pending);
        // Known apart in either order, decoded earlier first.
        let c = Ahead {
            known: [12, 77],
            ..a
        };
        assert_eq!(Ahead::decode(Some(c.encode())).known, [77, 12]);
    }

    #[test]
    fn a_slot_beyond_the_coming_epoch_lets_one_request_go_on_credit() {
        // Owned: 1100 and 1101 only (200 ms away at 1000's time; the epoch
        // is 100 ms); hold up to 300 ms.
        let (mut c, mut b) = setup(&[(1100, 1102)]);
        let r = Reach::new(reach().grid, 0, 300 * MS);
        let mut ahead_cell = MemCell::default();
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, at(1000), true, FIRST),
            Take::Credit
        );
        assert_eq!(ahead_cell.v, Some(ahead(1, 0)), "owed, the slot kept");
        // The credit is spent: the next one holds for the far slot.
        assert_eq!(
            take(&mut c, &mut b, &mut ahead_cell, &r, at(1000), true, FIRST),
            Take::Hold {
                slot: 1100,
                delay_ns: 200 * MS
            }
        );
        // The repayment takes the other slot once it is due within the epoch.
        assert_eq!(repay(&mut c, &mut b, &mut ahead_cell, &r, at(1000)), Ok(0));
        assert_eq!(repay(&mut c, &mut b, &mut ahead_cell, &r, at(1060)), Ok(1));
        assert_eq!(cur(&c), (1102, 1102));
    }
}
