//! Stage: a cluster rule's slot of the grid this proxy owns, or the
//! fallback while the engine fails (see [`crate::cluster`]). The same
//! mapping serves a request's first attempt and the worker's retries of the
//! requests waiting for grants ([`retry_grants`]). (No rate-limit headers:
//! the grid has no per-process schedule to report.)

use crate::clock::Clock;
use crate::cluster::{self, Attempt, Take};
use crate::config::Rule;
use crate::schedule::admit;
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Store};

use super::{rate, Ctx, Outcome, Wait};

/// A request's first attempt at the grid. The grid is wall-clock time: the
/// monotonic clock is read only if the request does not go at once (to
/// hold it, or to pace it in the fallback).
pub(super) fn take<S: Store>(
    cx: &Ctx<'_, S>,
    clock: &mut impl Clock,
    counts: &mut Counts,
) -> Outcome {
    let wall = clock.wall();
    attempt(
        cx.env.store,
        cx.index,
        cx.rule,
        || clock.mono(),
        wall,
        cx.can_hold,
        Attempt::First,
        counts,
    )
}

/// A retry, on tick, of a request that has waited `waited_ns` for grants
/// (its queue place is known to exist). `Wait`: it must still wait (and
/// so must every later request of the rule).
pub fn retry_grants<S: Store>(
    store: S,
    index: usize,
    rule: &Rule,
    now: u64,
    wall: u64,
    waited_ns: u64,
    counts: &mut Counts,
) -> Outcome {
    let attempt = Attempt::Retry { waited_ns };
    self::attempt(store, index, rule, || now, wall, true, attempt, counts)
}

/// Takes a slot (or the fallback's turn) at wall time `wall`; `now` (the
/// monotonic time) is read only for an outcome that needs it.
/// A slot taken counts `slots_taken`.
#[allow(clippy::too_many_arguments)]
fn attempt<S: Store>(
    store: S,
    index: usize,
    rule: &Rule,
    now: impl FnOnce() -> u64,
    wall: u64,
    can_hold: bool,
    attempt: Attempt,
    counts: &mut Counts,
) -> Outcome {
    let Some(reach) = cluster::rule_reach(rule) else {
        return Outcome::Go;
    };
    let taken = cluster::take(
        &mut store.cell(CellId::Cursor(index)),
        &mut store.blob(BlobId::Grants(index)),
        &mut store.cell(CellId::Ahead(index)),
        &reach,
        wall,
        can_hold,
        attempt,
    );
    match taken {
        Take::Now { .. } => {
            counts.inc(Stat::SlotsTaken);
            Outcome::Go
        }
        Take::Early { .. } | Take::Credit => {
            // Counted as taken: its slot is taken now (early), or the one that
            // repays it later (credit).
            counts.inc(Stat::SlotsTaken);
            counts.inc(Stat::SlotsAhead);
            Outcome::Go
        }
        Take::Hold { delay_ns, .. } => {
            counts.inc(Stat::SlotsTaken);
            Outcome::Hold {
                until: now().saturating_add(delay_ns),
            }
        }
        Take::Wait => Outcome::Wait(Wait::Grants {
            deadline: now().saturating_add(attempt.max_delay(&reach)),
        }),
        Take::Reject { retry_after_s, .. } => Outcome::Reject { retry_after_s },
        Take::Local { interval_ns } => {
            let now = now();
            let local = cluster::local_schedule(&reach, interval_ns, attempt);
            let admission = admit(
                &mut store.cell(CellId::Fallback(index)),
                &local,
                now,
                can_hold,
            );
            // The fallback's schedule is not the rule's: no headers from it.
            match rate::outcome(admission).0 {
                Outcome::Hold { until } => Outcome::Wait(Wait::Fallback {
                    until,
                    deadline: now.saturating_add(attempt.max_delay(&reach)),
                }),
                other => other,
            }
        }
        Take::Deny => Outcome::Reject { retry_after_s: 1 },
        Take::Contention => Outcome::Contention,
    }
}
