//! Cluster scope as a slot source: the grid slots this proxy owns, taken
//! through the rule's cursor ([`cluster::next_owned`]), and the fallback's
//! schedule while the engine fails.

use crate::cluster::{self, Cursor, Grants, Mode, Reach};
use crate::schedule::Schedule;
use crate::store::{SharedBlob, SharedCell, StoreError, MAX_CAS_ATTEMPTS};

use super::{Gcra, Outlook, RateSource};

/// Cluster scope: the grid slots this proxy owns (see [`crate::cluster`]):
/// the rule's cursor over them, and its grants blob for the next range and
/// the engine's state. Grid times are wall-clock; `mono` and `wall` are the
/// same instant on the two clocks. While the engine fails, the fallback
/// schedule (the rule's `fallback` cell) is the source in `local_share` and
/// `local_full`, and `deny` has none.
pub struct GridSource<C, B, F> {
    pub cursor: C,
    pub blob: B,
    pub fallback: F,
    pub reach: Reach,
    /// The rule's rate in slots per second, and its expected proxies (for
    /// the outlook before the engine has said anything).
    pub expected_per_s: f64,
    pub mono: u64,
    pub wall: u64,
    /// Grid slots taken through this handle (not the fallback's), net of
    /// those given back (`slots_taken`).
    pub taken: u32,
}

/// What the grid offers now.
enum Offer {
    /// This owned slot (with the end of its range), at this wall time.
    Slot(u64, u64),
    /// No owned slot at or after the oldest usable one.
    None,
    /// The engine fails and the rule paces locally at this interval.
    Local(u64),
}

impl<C: SharedCell, B: SharedBlob, F: SharedCell> GridSource<C, B, F> {
    /// Wall time at mono time `now`.
    fn wall_at(&self, now: u64) -> u64 {
        self.wall
            .saturating_add(now.saturating_sub(self.mono))
            .saturating_sub(self.mono.saturating_sub(now))
    }

    /// The oldest usable slot at wall `wall`: as old as the grid's slack
    /// allows, or, while requests wait, as old as the catch-up (a late tick
    /// takes its due slots at their own time, as held requests would have).
    fn min_slot(&self, wall: u64, busy: bool) -> u64 {
        if busy {
            self.reach.min_kept(wall)
        } else {
            self.reach.min_slot(wall)
        }
    }

    /// The next owned slot at or above `min` ([`cluster::next_owned`]),
    /// else what the grants say instead, with the cursor for a take.
    fn offer(
        &mut self,
        min: u64,
        cache: &mut Option<Grants>,
    ) -> Result<(Offer, Cursor, C::Token), StoreError> {
        let (walk, token) = cluster::next_owned(&mut self.cursor, &mut self.blob, cache, min)?;
        let offer = match walk.found {
            Some((slot, end)) => Offer::Slot(slot, end),
            None => match cluster::cached_grants(&mut self.blob, cache)?.mode {
                Mode::Local { interval_ns } => Offer::Local(interval_ns),
                _ => Offer::None,
            },
        };
        Ok((offer, walk.cursor, token))
    }

    fn local(&mut self, interval_ns: u64) -> Gcra<&mut F> {
        let burst = self.reach.slack_ns / self.reach.grid.interval_ns.max(1) - 1;
        Gcra {
            cell: &mut self.fallback,
            schedule: Schedule::new(interval_ns, burst, self.reach.max_delay_ns),
            learned: false,
        }
    }

    /// Takes the next owned slot now, before its time, if `ok(slot)`
    /// accepts it and the process may go ahead of its grants
    /// ([`cluster::before_its_time`], the rule's ahead cell `ahead`): for a
    /// request nobody waits ahead of, as a rule without classes does.
    /// Ok(None): no such slot, or not now.
    pub fn take_ahead<A: SharedCell>(
        &mut self,
        now: u64,
        ok: &dyn Fn(u64) -> bool,
        ahead: &mut A,
    ) -> Result<Option<u64>, StoreError> {
        let wall = self.wall_at(now);
        let min = self.min_slot(wall, false);
        let mut cache = None;
        let (slot, end, c, token) = match self.offer(min, &mut cache)? {
            (Offer::Slot(slot, end), c, token) => (slot, end, c, token),
            _ => return Ok(None),
        };
        let t = self.reach.grid.slot_time(slot);
        if t <= wall || !ok(slot) || !cluster::before_its_time(ahead, &self.reach, wall, t)? {
            return Ok(None);
        }
        // Counted ahead already: if the cursor moved meanwhile, the slot is
        // forfeited (the safe side), as a rule without classes would.
        if cluster::advance(&mut self.cursor, token, c, (slot, end))? {
            self.taken = self.taken.saturating_add(1);
            return Ok(Some(slot));
        }
        Ok(None)
    }
}

impl<C: SharedCell> SharedCell for &mut C {
    type Token = C::Token;
    fn load(&mut self) -> Result<(Option<[u64; 2]>, Self::Token), StoreError> {
        (**self).load()
    }
    fn store(&mut self, value: [u64; 2], token: Self::Token) -> Result<bool, StoreError> {
        (**self).store(value, token)
    }
}

impl<C: SharedCell, B: SharedBlob, F: SharedCell> RateSource for GridSource<C, B, F> {
    fn take_due(
        &mut self,
        now: u64,
        busy: bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>, StoreError> {
        let wall = self.wall_at(now);
        let min = self.min_slot(wall, busy);
        let mut cache = None;
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (slot, end, c, token) = match self.offer(min, &mut cache)? {
                (Offer::Slot(slot, end), c, token) => (slot, end, c, token),
                (Offer::None, ..) => return Ok(None),
                (Offer::Local(interval), ..) => {
                    return self.local(interval).take_due(now, busy, ok)
                }
            };
            if self.reach.grid.slot_time(slot) > wall || !ok(slot) {
                return Ok(None);
            }
            if cluster::advance(&mut self.cursor, token, c, (slot, end))? {
                self.taken = self.taken.saturating_add(1);
                return Ok(Some(slot));
            }
        }
        Err(StoreError(u32::MAX))
    }

    fn give_back(&mut self, slot: Option<u64>) -> Result<(), StoreError> {
        // Only the slot just taken can go back, and only if nobody moved the
        // cursor since; else it is forfeited (the safe side).
        let Some(slot) = slot else {
            return Ok(());
        };
        let (value, token) = self.cursor.load()?;
        if value.is_some() {
            let c = Cursor::decode(value);
            let back = Cursor { next: slot, ..c };
            if c.next == slot.saturating_add(1) && self.cursor.store(back.encode(), token)? {
                self.taken = self.taken.saturating_sub(1);
            }
        }
        Ok(())
    }

    fn outlook(&mut self, now: u64, busy: bool) -> Result<Outlook, StoreError> {
        let wall = self.wall_at(now);
        let min = self.min_slot(wall, busy);
        let mut cache = None;
        let (offer, ..) = self.offer(min, &mut cache)?;
        let g = cluster::cached_grants(&mut self.blob, &mut cache)?.clone();
        let per_s = if g.grant_rate_per_s > 0 {
            g.grant_rate_per_s as f64
        } else {
            self.expected_per_s
        };
        // Reckoned slower than expected, as a line's turn is
        // ([`cluster::DERATE`]).
        let interval_ns = if per_s > 0.0 {
            let i = (crate::clock::NS_PER_S as f64 / per_s).ceil() as u64;
            i.saturating_add(i / cluster::DERATE)
        } else {
            0
        };
        let mut known = None;
        let next_at = match offer {
            Offer::Slot(slot, end) => {
                known = Some((slot, end.saturating_sub(slot), self.reach.grid.interval_ns));
                now.saturating_add(self.reach.grid.slot_time(slot).saturating_sub(wall))
            }
            Offer::Local(interval) => return self.local(interval).outlook(now, busy),
            Offer::None if g.mode == Mode::Deny => return Ok(Outlook::every(now, 0)),
            // No owned slot yet: the next claim's (within two epochs).
            Offer::None => now.saturating_add(self.reach.grid.epoch_ns),
        };
        let last_owned = g
            .ranges
            .last()
            .filter(|r| r.1 > min)
            .map(|r| self.reach.grid.slot_time(r.1 - 1));
        // The spare of the lead, as a line's turn counts it
        // ([`cluster::spare_in_lead`]): its slots there at the reckoned
        // share gap (a spare gap is no shorter: the turns err later).
        let mine = last_owned.unwrap_or(0).max(self.reach.grid.slot_time(min));
        let in_lead = cluster::spare_in_lead(&g, &self.reach, mine, wall.saturating_add(g.lead_ns))
            .saturating_mul(interval_ns);
        let mut out = Outlook {
            certain_until: last_owned.map_or(now, |t| now.saturating_add(t.saturating_sub(wall))),
            known,
            reckon_ns: cluster::reckon_limit(&g),
            lead_at: now.saturating_add(g.lead_ns.saturating_sub(in_lead)),
            ..Outlook::every(next_at, interval_ns)
        };
        // The owned ranges after the current one, for a walk over them all.
        if let Some((slot, count, _)) = known {
            let end = slot.saturating_add(count);
            let mut later = g.ranges.iter().filter(|r| r.0 >= end && r.1 > r.0);
            for (to, from) in out.later.iter_mut().zip(later.by_ref()) {
                *to = *from;
                out.later_len += 1;
            }
            out.later_all = later.next().is_none();
        }
        Ok(out)
    }
}
