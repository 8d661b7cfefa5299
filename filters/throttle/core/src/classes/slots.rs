//! Where a rule's releases come from: one slot per release. In process scope
//! the rule's GCRA cell ([`RateSlots`]); in cluster scope the grid slots this
//! proxy owns (`cluster::GridSlots`). An adaptive rate plugs in as one more
//! source (or as the interval of this one).

use crate::schedule::Schedule;
use crate::store::{SharedCell, StoreError, MAX_CAS_ATTEMPTS};

use super::CATCH_UP_NS;

/// A source of release slots.
pub trait Slots {
    /// Takes the next slot if it is due at `now` and `ok(slot)` accepts its
    /// index; Ok(None) if none is due (or `ok` refused it: nothing taken).
    /// `busy`: requests are waiting, so a due slot the ticks came late for
    /// is still taken at its own time (up to [`CATCH_UP_NS`]).
    fn take_due(
        &mut self,
        now: u64,
        busy: bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>, StoreError>;

    /// Gives back a slot taken and not used (`slot`: its index, if known).
    /// Best effort: a source that cannot take it back forfeits it.
    fn give_back(&mut self, slot: Option<u64>) -> Result<(), StoreError>;

    /// When the next slot is due (at `now` or later), and how many slots per
    /// second this source gives (for estimates).
    fn outlook(&mut self, now: u64, busy: bool) -> Result<Outlook, StoreError>;
}

/// What a slot source expects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outlook {
    /// Monotonic time the next slot is due (>= now).
    pub next_at: u64,
    /// Slots per second.
    pub per_s: f64,
}

/// The rule's GCRA cell (`[0, tat]`), as the rule without classes uses it:
/// a slot is due while `tat - tau <= now`; taking it stores `tat + T`.
pub struct RateSlots<C> {
    pub cell: C,
    pub schedule: Schedule,
}

impl<C: SharedCell> RateSlots<C> {
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
}

impl<C: SharedCell> Slots for RateSlots<C> {
    fn take_due(
        &mut self,
        now: u64,
        busy: bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>, StoreError> {
        let s = self.schedule;
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (stored, token) = self.cell.load()?;
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
                .store([0, tat.saturating_add(s.interval_ns)], token)?
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
            let Some([_, tat]) = stored else {
                return Ok(());
            };
            let back = tat.saturating_sub(self.schedule.interval_ns);
            if self.cell.store([0, back], token)? {
                return Ok(());
            }
        }
        Err(StoreError(u32::MAX))
    }

    fn outlook(&mut self, now: u64, busy: bool) -> Result<Outlook, StoreError> {
        let (stored, _) = self.cell.load()?;
        let tat = self.tat(stored.map(|[_, t]| t), now, busy);
        Ok(Outlook {
            next_at: tat.saturating_sub(self.schedule.tau_ns).max(now),
            per_s: crate::clock::NS_PER_S as f64 / self.schedule.interval_ns.max(1) as f64,
        })
    }
}
