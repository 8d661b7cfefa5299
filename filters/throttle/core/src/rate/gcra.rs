//! The process schedule as a slot source: the rule's GCRA cell
//! `[learned interval, tat]` ([`crate::schedule`]), at the interval the
//! learner keeps in its first word when the rule learns it.

use crate::schedule::{update_paced, Schedule};
use crate::store::{SharedCell, StoreError};

use super::{Outlook, RateSource, CATCH_UP_NS};

/// The rule's GCRA cell `[learned interval, tat]`: a slot is due while
/// `tat - tau <= now`; taking it stores `tat + T`. `T` is the schedule's
/// interval, or, for a rule that learns its rate (`learned`), the interval
/// the learner keeps in the cell's first word (0 there: the schedule's
/// own). Taken and given back through [`update_paced`], as admission without
/// classes is (`schedule::admit_paced`): one compare-and-swap on the cell,
/// its first word written back as it was read, so no order undoes the
/// learner.
pub struct Gcra<C> {
    pub cell: C,
    pub schedule: Schedule,
    pub learned: bool,
}

/// The schedule's position for a take at `now`: the stored TAT, or `now`
/// if it lies in the past (less [`CATCH_UP_NS`] when busy).
fn position(stored: Option<u64>, now: u64, busy: bool) -> u64 {
    let floor = if busy {
        now.saturating_sub(CATCH_UP_NS)
    } else {
        now
    };
    stored.map_or(now, |t| t.max(floor))
}

impl<C: SharedCell> RateSource for Gcra<C> {
    fn take_due(
        &mut self,
        now: u64,
        busy: bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>, StoreError> {
        update_paced(&mut self.cell, &self.schedule, self.learned, |s, stored| {
            let tat = position(stored, now, busy);
            let slot = tat / s.interval_ns.max(1);
            if tat.saturating_sub(s.tau_ns) > now || !ok(slot) {
                return (None, None);
            }
            (Some(slot), Some(tat.saturating_add(s.interval_ns)))
        })
    }

    fn give_back(&mut self, _slot: Option<u64>) -> Result<(), StoreError> {
        // The schedule counts slots, not which: one less taken is the latest.
        update_paced(&mut self.cell, &self.schedule, self.learned, |s, stored| {
            ((), stored.map(|tat| tat.saturating_sub(s.interval_ns)))
        })
    }

    fn outlook(&mut self, now: u64, busy: bool) -> Result<Outlook, StoreError> {
        let (stored, _) = self.cell.load()?;
        let first = stored.map_or(0, |[w, _]| w);
        let s = self.schedule.in_force(self.learned, first);
        let tat = position(stored.map(|[_, t]| t), now, busy);
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
