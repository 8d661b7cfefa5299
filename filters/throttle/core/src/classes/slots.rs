//! Where a rule's releases come from: one slot per release. In process scope
//! the rule's GCRA cell ([`RateSlots`]); in cluster scope the grid slots this
//! proxy owns (`cluster::GridSlots`). An adaptive rate plugs in as one more
//! source (or as the interval of this one).

use crate::cluster::{self, Cursor, Grants, Mode, Reach};
use crate::config::Rule;
use crate::schedule::Schedule;
use crate::store::{
    Blob, BlobId, Cell, CellId, SharedBlob, SharedCell, Store, StoreError, MAX_CAS_ATTEMPTS,
};

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
    /// Nanoseconds between two slots (0: no slots).
    pub interval_ns: u64,
    /// Monotonic time up to which the slots are known, not reckoned (a
    /// schedule's: always; the grid's: its last owned slot).
    pub certain_until: u64,
    /// The next slots by index, if known: `(first, count, spacing_ns)`,
    /// `count` slots of consecutive indices from `first`, the first at
    /// `next_at` and each `spacing_ns` after the last (a schedule's, without
    /// end; the grid's current owned range). Which class a slot goes to
    /// depends on its index ([`super::floor_of`]).
    pub known: Option<(u64, u64, u64)>,
    /// How far beyond `certain_until` a turn may be reckoned
    /// ([`cluster::reckon_limit`]).
    pub reckon_ns: u64,
}

impl Outlook {
    /// An outlook of one slot every `interval_ns` (0: none) from `next_at`.
    pub fn every(next_at: u64, interval_ns: u64) -> Outlook {
        Outlook {
            next_at,
            per_s: if interval_ns == 0 {
                0.0
            } else {
                crate::clock::NS_PER_S as f64 / interval_ns as f64
            },
            interval_ns,
            certain_until: u64::MAX,
            known: None,
            reckon_ns: u64::MAX,
        }
    }

    /// Whether a turn `turn_ns` from `now` fits within `max_delay_ns`: at
    /// once if its slot is known by then; if reckoned, with `margin_ns` to
    /// spare and at most `reckon_ns` beyond the known slots.
    pub fn fits(&self, now: u64, turn_ns: u64, max_delay_ns: u64, margin_ns: u64) -> bool {
        let at = now.saturating_add(turn_ns);
        if turn_ns > max_delay_ns {
            return false;
        }
        at <= self.certain_until
            || (turn_ns.saturating_add(margin_ns) <= max_delay_ns
                && at - self.certain_until.max(now) <= self.reckon_ns)
    }
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
        let interval = self.schedule.interval_ns.max(1);
        let next_at = tat.saturating_sub(self.schedule.tau_ns).max(now);
        // The slot taken next is `tat / T` ([`RateSlots::take_due`]); the
        // slots within the burst are due at once.
        Ok(Outlook {
            known: Some((tat / interval, u64::MAX, interval)),
            ..Outlook::every(next_at, interval)
        })
    }
}

/// Cluster scope: the grid slots this proxy owns (see [`crate::cluster`]):
/// the rule's cursor over them, and its grants blob for the next range and
/// the engine's state. Grid times are wall-clock; `mono` and `wall` are the
/// same instant on the two clocks. While the engine fails, the fallback
/// schedule (the rule's `fallback` cell) is the source in `local_share` and
/// `local_full`, and `deny` has none.
pub struct GridSlots<C, B, F> {
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

impl<C: SharedCell, B: SharedBlob, F: SharedCell> GridSlots<C, B, F> {
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
        let back = if busy {
            self.reach.slack_ns.max(CATCH_UP_NS)
        } else {
            self.reach.slack_ns
        };
        self.reach.grid.slot_at_or_after(wall.saturating_sub(back))
    }

    fn grants(&mut self) -> Result<Grants, StoreError> {
        let (bytes, _) = self.blob.load()?;
        Ok(bytes
            .as_deref()
            .and_then(Grants::decode)
            .unwrap_or_default())
    }

    /// The next owned slot from the cursor's range, else from the blob.
    fn offer(&mut self, c: Cursor, min: u64) -> Result<Offer, StoreError> {
        let (next, end) = (c.next, c.end);
        if next < end && next >= min {
            return Ok(Offer::Slot(next, end));
        }
        let g = self.grants()?;
        Ok(match g.first_from(next.max(min)) {
            Some((slot, end)) => Offer::Slot(slot, end),
            None => match g.mode {
                Mode::Local { interval_ns } => Offer::Local(interval_ns),
                _ => Offer::None,
            },
        })
    }

    fn local(&mut self, interval_ns: u64) -> RateSlots<&mut F> {
        let burst = self.reach.slack_ns / self.reach.grid.interval_ns.max(1) - 1;
        RateSlots {
            cell: &mut self.fallback,
            schedule: Schedule::new(interval_ns, burst, self.reach.max_delay_ns),
        }
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

impl<C: SharedCell, B: SharedBlob, F: SharedCell> Slots for GridSlots<C, B, F> {
    fn take_due(
        &mut self,
        now: u64,
        busy: bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>, StoreError> {
        let wall = self.wall_at(now);
        let min = self.min_slot(wall, busy);
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (value, token) = self.cursor.load()?;
            let c = Cursor::decode(value);
            let (slot, end) = match self.offer(c, min)? {
                Offer::Slot(slot, end) => (slot, end),
                Offer::None => return Ok(None),
                Offer::Local(interval) => return self.local(interval).take_due(now, busy, ok),
            };
            if self.reach.grid.slot_time(slot) > wall || !ok(slot) {
                return Ok(None);
            }
            let moved = Cursor {
                next: slot.saturating_add(1),
                end,
                waiting: c.waiting,
            };
            if self.cursor.store(moved.encode(), token)? {
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
        let (value, _) = self.cursor.load()?;
        let g = self.grants()?;
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
        let next_at = match self.offer(Cursor::decode(value), min)? {
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
        Ok(Outlook {
            certain_until: last_owned.map_or(now, |t| now.saturating_add(t.saturating_sub(wall))),
            known,
            reckon_ns: cluster::reckon_limit(&g),
            ..Outlook::every(next_at, interval_ns)
        })
    }
}

/// A rule's slot source in a [`Store`].
pub enum Source<S: Store> {
    /// Process scope: the rule's GCRA cell.
    Rate(RateSlots<Cell<S>>),
    /// Cluster scope: the owned grid slots.
    Grid(GridSlots<Cell<S>, Blob<S>, Cell<S>>),
}

/// Rule `index`'s slot source (None for a rule without `rate`), at this
/// instant on both clocks.
pub fn source<S: Store>(
    store: S,
    index: usize,
    rule: &Rule,
    mono: u64,
    wall: u64,
) -> Option<Source<S>> {
    let schedule = rule.schedule?;
    Some(match (rule.cluster, cluster::rule_reach(rule)) {
        (Some(scope), Some(reach)) => Source::Grid(GridSlots {
            cursor: store.cell(CellId::Cursor(index)),
            blob: store.blob(BlobId::Grants(index)),
            fallback: store.cell(CellId::Fallback(index)),
            reach,
            expected_per_s: crate::clock::NS_PER_S as f64
                / schedule.interval_ns.max(1) as f64
                / f64::from(scope.expected_replicas.max(1)),
            mono,
            wall,
            taken: 0,
        }),
        _ => Source::Rate(RateSlots {
            cell: store.cell(CellId::Rate(index)),
            schedule,
        }),
    })
}

impl<S: Store> Source<S> {
    /// Grid slots taken since the last call (they count `slots_taken`).
    pub fn grid_taken(&mut self) -> u32 {
        match self {
            Source::Rate(_) => 0,
            Source::Grid(g) => std::mem::take(&mut g.taken),
        }
    }

    /// Whether the rule rejects while its engine fails (`on_engine_failure:
    /// "deny"`, and the engine failing): nothing will be granted to a waiter.
    pub fn denies(&mut self) -> Result<bool, StoreError> {
        match self {
            Source::Rate(_) => Ok(false),
            Source::Grid(g) => Ok(g.grants()?.mode == Mode::Deny),
        }
    }
}

impl<S: Store> Slots for Source<S> {
    fn take_due(
        &mut self,
        now: u64,
        busy: bool,
        ok: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>, StoreError> {
        match self {
            Source::Rate(r) => r.take_due(now, busy, ok),
            Source::Grid(g) => g.take_due(now, busy, ok),
        }
    }

    fn give_back(&mut self, slot: Option<u64>) -> Result<(), StoreError> {
        match self {
            Source::Rate(r) => r.give_back(slot),
            Source::Grid(g) => g.give_back(slot),
        }
    }

    fn outlook(&mut self, now: u64, busy: bool) -> Result<Outlook, StoreError> {
        match self {
            Source::Rate(r) => r.outlook(now, busy),
            Source::Grid(g) => g.outlook(now, busy),
        }
    }
}
