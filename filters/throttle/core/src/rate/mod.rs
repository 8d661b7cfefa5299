//! Where a rule's releases come from: one slot per release ([`RateSource`]).
//! In process scope the rule's GCRA cell ([`Gcra`], at the configured
//! interval or the learned one); in cluster scope the grid slots this proxy
//! owns ([`GridSource`], with the fallback's GCRA while the engine fails). A
//! release order takes slots from it: at admission (a rule without classes,
//! `admit_paced` and `cluster::take`) or at release (the rule's line,
//! [`crate::classes`]).

mod gcra;
mod grid;

pub use gcra::Gcra;
pub use grid::GridSource;

use crate::cluster;
use crate::config::Rule;
use crate::store::{Blob, BlobId, Cell, CellId, Store, StoreError};

pub use crate::schedule::CATCH_UP_NS;

/// A source of release slots.
pub trait RateSource {
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
    /// depends on its index ([`crate::classes::floor_of`]).
    pub known: Option<(u64, u64, u64)>,
    /// The owned slots after `known`'s, as `[start, end)` index ranges on
    /// the same spacing (the grid's later owned ranges, up to
    /// [`LATER_RANGES`]; `later_all`: every one up to `certain_until`).
    pub later: [(u64, u64); LATER_RANGES],
    pub later_len: usize,
    pub later_all: bool,
    /// How far beyond `certain_until` a turn may be reckoned
    /// ([`cluster::reckon_limit`]).
    pub reckon_ns: u64,
    /// Monotonic time before which no slot comes beyond `certain_until`
    /// (the grid's: a proxy's share is claimed `k` epochs ahead, and counts
    /// its demand `lag + 1` epochs after it is placed, `Grants::lead_ns`;
    /// leftovers may come sooner, and the reckoning errs on the side of
    /// refusing). 0: none.
    pub lead_at: u64,
}

/// Owned ranges an outlook lists beyond the current one: a proxy holds
/// shares for `k + 1` epochs (4 with the defaults), each in at most 8
/// ranges, and leftovers.
pub const LATER_RANGES: usize = 48;

impl Outlook {
    /// The known slots in order: `(index, monotonic time due)`, the
    /// current range's and then the later ones'.
    pub fn known_slots(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (first, count, spacing) = self.known.unwrap_or((0, 0, 0));
        let later = self.later.get(..self.later_len).unwrap_or_default();
        std::iter::once((first, first.saturating_add(count)))
            .chain(later.iter().copied())
            .flat_map(|(a, b)| a..b)
            .map(move |k| {
                let at = self
                    .next_at
                    .saturating_add(k.saturating_sub(first).saturating_mul(spacing));
                (k, at)
            })
    }

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
            later: [(0, 0); LATER_RANGES],
            later_len: 0,
            later_all: false,
            reckon_ns: u64::MAX,
            lead_at: 0,
        }
    }

    /// Whether a turn `turn_ns` from `now` fits within `max_delay_ns`: at
    /// once if its slot is known by then; if reckoned (from the known slots
    /// on, and from `lead_at` if later), with `margin_ns` to spare and at
    /// most `reckon_ns` beyond the known slots.
    pub fn fits(&self, now: u64, turn_ns: u64, max_delay_ns: u64, margin_ns: u64) -> bool {
        let at = now.saturating_add(turn_ns);
        if turn_ns > max_delay_ns {
            return false;
        }
        if at <= self.certain_until {
            return true;
        }
        // No slot comes between the known ones and `lead_at`: the reckoned
        // ones come that much later. That wait is known, not reckoned, so
        // `reckon_ns` counts from the later of the two.
        let from = self.certain_until.max(now);
        let at = at.saturating_add(self.lead_at.saturating_sub(from));
        at.saturating_sub(now).saturating_add(margin_ns) <= max_delay_ns
            && at.saturating_sub(from.max(self.lead_at)) <= self.reckon_ns
    }
}

/// A rule's slot source in a [`Store`].
pub enum Source<S: Store> {
    /// Process scope: the rule's GCRA cell.
    Rate(Gcra<Cell<S>>),
    /// Cluster scope: the owned grid slots.
    Grid(GridSource<Cell<S>, Blob<S>, Cell<S>>),
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
        (Some(scope), Some(reach)) => Source::Grid(GridSource {
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
        _ => Source::Rate(Gcra {
            cell: store.cell(CellId::Rate(index)),
            schedule,
            learned: rule.learns(),
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

    /// A grid source's next owned slot taken now, before its time, if the
    /// process may ([`GridSource::take_ahead`]); a GCRA has none to take.
    pub fn take_ahead(
        &mut self,
        now: u64,
        ok: &dyn Fn(u64) -> bool,
        ahead: &mut Cell<S>,
    ) -> Result<Option<u64>, StoreError> {
        match self {
            Source::Rate(_) => Ok(None),
            Source::Grid(g) => g.take_ahead(now, ok, ahead),
        }
    }

    /// Whether the rule rejects while its engine fails (`on_engine_failure:
    /// "deny"`, and the engine failing): nothing will be granted to a waiter.
    pub fn denies(&mut self) -> Result<bool, StoreError> {
        match self {
            Source::Rate(_) => Ok(false),
            Source::Grid(g) => Ok(cluster::load_grants(&mut g.blob)?.0.mode == cluster::Mode::Deny),
        }
    }
}

impl<S: Store> RateSource for Source<S> {
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
