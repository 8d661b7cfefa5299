//! The process schedule as a slot source: the rule's GCRA cell
//! `[learned interval, tat]` ([`crate::schedule`]), at the interval the
//! learner keeps in its first word when the rule learns it.

use crate::schedule::Schedule;
use crate::store::{SharedCell, StoreError, MAX_CAS_ATTEMPTS};

use super::{Outlook, RateSource, CATCH_UP_NS};

/// The rule's GCRA cell `[learned interval, tat]`: a slot is due while
/// `tat - tau <= now`; taking it stores `tat + T`. `T` is the schedule's
/// interval, or, for a rule that learns its rate (`learned`), the interval
/// the learner keeps in the cell's first word (0 there: the schedule's
/// own). The first word is written back as it was read, in every mode: a
/// release order never undoes the learner (`admit_paced` does the same for
/// a rule without classes).
pub struct Gcra<C> {
    pub cell: C,
    pub schedule: Schedule,
    pub learned: bool,
}

impl<C: SharedCell> Gcra<C> {
    /// The schedule's position for a take at `now`: the stored TAT, or
    /// `now` if it lies in the past (less [`CATCH_UP_NS`] when busy).
    fn tat(&self, stored: Option<u64>, now: u64, busy: bool) -> u64 {
        let floor = if busy {
            now.saturating_sub(CATCH_UP_NS)
        } else {
            now
        };
        stored.map_or(now, |t| t.max(floor))
    }

    /// The schedule in force with the cell's first word.
    fn paced(&self, first: u64) -> Schedule {
        if self.learned {
            self.schedule.at_interval(first)
        } else {
            self.schedule
        }
    }
}

impl<C: SharedCell> RateSource for Gcra<C> {
    fn take_due(
        &mut self,
        now: u64,
        busy: bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>, StoreError> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (stored, token) = self.cell.load()?;
            let first = stored.map_or(0, |[w, _]| w);
            let s = self.paced(first);
            let tat = self.tat(stored.map(|[_, t]| t), now, busy);
            if tat.saturating_sub(s.tau_ns) > now {
                return Ok(None);
            }
            let slot = tat / s.interval_ns.max(1);
            if !ok(slot) {
                return Ok(None);
            }
            if self
                .cell
                .store([first, tat.saturating_add(s.interval_ns)], token)?
            {
                return Ok(Some(slot));
            }
        }
        Err(StoreError(u32::MAX))
    }

    fn give_back(&mut self, _slot: Option<u64>) -> Result<(), StoreError> {
        // The schedule counts slots, not which: one less taken is the latest.
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (stored, token) = self.cell.load()?;
            let Some([first, tat]) = stored else {
                return Ok(());
            };
            let back = tat.saturating_sub(self.paced(first).interval_ns);
            if self.cell.store([first, back], token)? {
                return Ok(());
            }
        }
        Err(StoreError(u32::MAX))
    }

    fn outlook(&mut self, now: u64, busy: bool) -> Result<Outlook, StoreError> {
        let (stored, _) = self.cell.load()?;
        let s = self.paced(stored.map_or(0, |[w, _]| w));
        let tat = self.tat(stored.map(|[_, t]| t), now, busy);
        let interval = s.interval_ns.max(1);
        let next_at = tat.saturating_sub(s.tau_ns).max(now);
        // The slot taken next is `tat / T` ([`Gcra::take_due`]); the slots
        // within the burst are due at once.
        Ok(Outlook {
            known: Some((tat / interval, u64::MAX, interval)),
            ..Outlook::every(next_at, interval)
        })
    }
}
