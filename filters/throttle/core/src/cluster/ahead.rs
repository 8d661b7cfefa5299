//! Going ahead of the grants, bounded: a process with no owned slot near
//! may let a request go now on credit (at most `burst + 1` owed), or take its
//! next owned slot before its time (one at a time, within the epoch); the
//! calling VM repays the credit from the earliest owned slots after it
//! publishes ([`repay`]). So a request within the rate does not wait for the
//! engine after a lull, and at any instant the process is ahead of its
//! grants by at most `burst + 1` requests (the bound in `engine/README.md`).
//! The state lives in the rule's ahead cell ([`crate::CellId::Ahead`]), read
//! only off the fast path.

use crate::clock::NS_PER_MS;
use crate::store::{SharedBlob, SharedCell, StoreError, MAX_CAS_ATTEMPTS};

use super::grants::{load_grants, Attempt, Cursor, Grants, Reach, Take};

/// How far a process is ahead of its grants, kept in the rule's ahead cell
/// ([`crate::CellId::Ahead`], `[owed, until_ms]`): slots owed (requests that went on
/// credit) and, in wall-clock ms, the time of the latest slot that was
/// taken before its time or repays a credit. While that time lies ahead, or
/// anything is owed, no request goes early; so at any instant the process
/// is ahead of its grants by at most `burst + 1` requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ahead {
    pub owed: u64,
    pub until_ms: u64,
}

impl Ahead {
    /// The state of a cell's value (a cell never stored: nothing ahead).
    pub fn decode(value: Option<[u64; 2]>) -> Ahead {
        let [owed, until_ms] = value.unwrap_or([0, 0]);
        Ahead { owed, until_ms }
    }

    /// The cell's value.
    pub fn encode(self) -> [u64; 2] {
        [self.owed, self.until_ms]
    }

    /// Nothing taken ahead is still ahead at wall time `now`.
    fn clear_at(self, now: u64) -> bool {
        self.until_ms.saturating_mul(NS_PER_MS) <= now
    }
}

/// Lets a request go ahead of its grants, if the process may: `early` (the
/// slot it will take is due at `slot_time`) needs nothing owed and nothing
/// ahead; credit (no slot at all) needs fewer than `reach.credit` owed and
/// nothing ahead. A new request never goes ahead while others wait for
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
        let limit = if early.is_some() { 1 } else { reach.credit };
        if !ahead.clear_at(now) || ahead.owed >= limit {
            return None;
        }
        match early {
            Some(t) => ahead.until_ms = t.div_ceil(NS_PER_MS),
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

/// Repays what the process owes (requests that went on credit): takes its
/// earliest owned slots, through the cursor as a request would, but only
/// slots due within the coming epoch, so that a request let go early on
/// credit is made up for within about two epochs (the call after it, and
/// that epoch); what cannot be repaid yet stays owed, and no new credit is
/// taken meanwhile. Called by the calling VM after it publishes. Returns how
/// many were repaid.
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
        repaid_by(ahead, reach.grid.slot_time(slot))?;
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
        let (value, token) = cursor.load()?;
        let c = Cursor::decode(value);
        let (slot, range_end) = if c.next < c.end && c.next >= min_slot {
            (c.next, c.end)
        } else {
            if grants.is_none() {
                grants = Some(load_grants(blob)?.0);
            }
            match grants
                .as_ref()
                .and_then(|g| g.first_from(c.next.max(min_slot)))
            {
                Some(found) => found,
                None => return Ok(None),
            }
        };
        if reach.grid.slot_time(slot) > horizon {
            return Ok(None);
        }
        let moved = Cursor {
            next: slot + 1,
            end: range_end,
            waiting: c.waiting,
        };
        if cursor.store(moved.encode(), token)? {
            return Ok(Some(slot));
        }
    }
    Err(StoreError(0))
}

/// One slot owed is repaid by a slot due at wall time `t`.
fn repaid_by<A: SharedCell>(cell: &mut A, t: u64) -> Result<(), StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = cell.load()?;
        let mut ahead = Ahead::decode(v);
        ahead.owed = ahead.owed.saturating_sub(1);
        ahead.until_ms = ahead.until_ms.max(t.div_ceil(NS_PER_MS));
        if cell.store(ahead.encode(), token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::grants::tests::{ahead, at, cur, reach, setup, waiting_in, FIRST, MS};
    use crate::cluster::grants::{publish, take, Mode};
    use crate::testing::{MemBlob, MemCell};

    #[test]
    fn without_grants_a_request_goes_on_credit_then_waits_unless_the_fleets_rate_cannot_serve_it() {
        let mut blob = MemBlob::default();
        let mut c = MemCell::default();
        let mut ahead_cell = MemCell::default();
        let r = reach(); // 500/s (T = 2 ms), burst 0 (credit 1), hold up to 10 ms
                         // Nothing owned: the first goes at once on credit; the process owes 1.
        assert_eq!(
            take(
                &mut c,
                &mut blob,
                &mut ahead_cell,
                &r,
                at(1000),
                true,
                FIRST
            ),
            Take::Credit
        );
        assert_eq!((waiting_in(&c), ahead_cell.v), (0, Some(ahead(1, 0))));
        // The credit is spent: the next ones wait (counted) while the fleet's
        // rate could serve them within max_queue_delay: 5 slots in 10 ms.
        for n in 1..=4 {
            assert_eq!(
                take(
                    &mut c,
                    &mut blob,
                    &mut ahead_cell,
                    &r,
                    at(1000),
                    true,
                    FIRST
                ),
                Take::Wait
            );
            assert_eq!((waiting_in(&c), ahead_cell.v), (n, Some(ahead(1, 0))));
        }
        // A fifth behind four would get the fleet's 5th slot: 10 ms, just in
        // reach; a sixth would not: rejected now, with what it lacks.
        assert_eq!(
            take(
                &mut c,
                &mut blob,
                &mut ahead_cell,
                &r,
                at(1000),
                true,
                FIRST
            ),
            Take::Wait
        );
        assert_eq!(
            take(
                &mut c,
                &mut blob,
                &mut ahead_cell,
                &r,
                at(1000),
                true,
                FIRST
            ),
            Take::Reject {
                retry_after_s: 1,
                queue_full: false
            }
        );
        assert_eq!((waiting_in(&c), ahead_cell.v), (5, Some(ahead(1, 0))));
        // A retry is never rejected early: the worker rejects it at its deadline.
        let retry = Attempt::Retry { waited_ns: MS };
        assert_eq!(
            take(
                &mut c,
                &mut blob,
                &mut ahead_cell,
                &r,
                at(1000),
                true,
                retry
            ),
            Take::Wait
        );
        // Grants arrive (slots 1002..1010): the first repays the credit, the
        // rest go to the waiting requests first (retries), oldest first.
        publish(&mut blob, &mut c, &r, 0, Mode::Grid, 0, &[(1002, 1010)]).unwrap();
        assert_eq!(
            repay(&mut c, &mut blob, &mut ahead_cell, &r, at(1000)),
            Ok(1)
        );
        assert_eq!(
            (waiting_in(&c), ahead_cell.v),
            (5, Some(ahead(0, at(1002) / MS))),
            "repaid by the earliest slot, ahead until its time"
        );
        assert_eq!(cur(&c), (1003, 1010));
        // Until slot 1002's time (4 ms), nothing goes ahead: the retries of
        // the waiting take the next slots, oldest first, leaving the count...
        let retry = Attempt::Retry { waited_ns: 2 * MS };
        assert_eq!(
            take(
                &mut c,
                &mut blob,
                &mut ahead_cell,
                &r,
                at(1000),
                true,
                retry
            ),
            Take::Hold {
                slot: 1003,
                delay_ns: 6 * MS
            }
        );
        assert_eq!(waiting_in(&c), 4);
        // ...and a new request, while others wait, takes the cursor's next
        // slot (a slot in the cursor's range goes to whoever comes) and never
        // goes ahead.
        assert_eq!(
            take(
                &mut c,
                &mut blob,
                &mut ahead_cell,
                &r,
                at(1000),
                true,
                FIRST
            ),
            Take::Hold {
                slot: 1004,
                delay_ns: 8 * MS
            }
        );
        // Once 1002's time has passed, the oldest retry may go ahead again:
        // on its slot (1005, 6 ms away at 1002's time), before its time.
        assert_eq!(
            take(
                &mut c,
                &mut blob,
                &mut ahead_cell,
                &r,
                at(1002),
                true,
                retry
            ),
            Take::Early { slot: 1005 }
        );
        assert_eq!(
            (waiting_in(&c), ahead_cell.v),
            (3, Some(ahead(0, at(1005) / MS)))
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
        // ...one at a time: until 1004's time the next one holds for its slot.
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
