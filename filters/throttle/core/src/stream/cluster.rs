//! Stage: a cluster rule's slot of the grid this proxy owns, or the
//! fallback while the engine fails (see [`crate::cluster`]). A request with
//! no owned slot near waits in the rule's line ([`crate::classes`]: one line,
//! first come first served across the process's workers, granted the owned
//! slots as they come due) if its turn comes within `max_queue_delay` less
//! a margin ([`cluster::turn_ns`], [`cluster::margin_ns`]); else it is refused
//! now, never after it waited. (No rate-limit headers: the grid has no
//! per-process schedule to report.)

use crate::classes::tickets;
use crate::clock::Clock;
use crate::cluster::{self, Attempt, Cursor, Reach, Take};
use crate::schedule::admit;
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Store, StoreError};

use super::{rate, Ctx, Outcome, Wait};

/// A request's first attempt at the grid. The grid is wall-clock time: the
/// monotonic clock is read only if the request does not go at once (to
/// hold it, or to pace it in the fallback).
pub(super) fn take<S: Store>(
    cx: &Ctx<'_, S>,
    clock: &mut impl Clock,
    counts: &mut Counts,
) -> Outcome {
    let Some(reach) = cluster::rule_reach(cx.rule) else {
        return Outcome::Go;
    };
    let (store, index) = (cx.env.store, cx.index);
    let wall = clock.wall();
    let taken = cluster::take(
        &mut store.cell(CellId::Cursor(index)),
        &mut store.blob(BlobId::Grants(index)),
        &mut store.cell(CellId::Ahead(index)),
        &reach,
        wall,
        cx.can_hold,
        Attempt::First,
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
                until: clock.mono().saturating_add(delay_ns),
            }
        }
        Take::Wait => {
            let now = clock.mono();
            match join_line(cx, &reach, now, wall) {
                Ok(outcome) => outcome,
                Err(_) => Outcome::Contention,
            }
        }
        Take::Reject { retry_after_s, .. } => Outcome::Reject { retry_after_s },
        Take::Local { interval_ns } => {
            let now = clock.mono();
            let local = cluster::local_schedule(&reach, interval_ns, Attempt::First);
            let admission = admit(
                &mut store.cell(CellId::Fallback(index)),
                &local,
                now,
                cx.can_hold,
            );
            // The fallback's schedule is not the rule's: no headers from it.
            match rate::outcome(admission).0 {
                Outcome::Hold { until } => Outcome::Wait(Wait::Fallback {
                    until,
                    deadline: now.saturating_add(reach.max_delay_ns),
                }),
                other => other,
            }
        }
        Take::Deny => Outcome::Reject { retry_after_s: 1 },
        Take::Contention => Outcome::Contention,
    }
}

/// No owned slot for the request now (or others wait): it takes a ticket
/// of the rule's line if its turn, behind those waiting, comes within
/// `max_queue_delay` less the margin; else it is refused now. Under
/// dry-run the same: its ticket then waits without its request
/// (`stream/enforce.rs`), so that later arrivals queue behind it.
fn join_line<S: Store>(
    cx: &Ctx<'_, S>,
    reach: &Reach,
    now: u64,
    wall: u64,
) -> Result<Outcome, StoreError> {
    let (store, index) = (cx.env.store, cx.index);
    if !cx.can_hold {
        return Ok(Outcome::Reject { retry_after_s: 1 });
    }
    // The tickets before the cursor: see `Tickets::granted_since`.
    let (read, _) = tickets::load(&mut store.blob(BlobId::Classes(index)))?;
    let (grants, _) = cluster::load_grants(&mut store.blob(BlobId::Grants(index)))?;
    let cursor = Cursor::decode(store.load(CellId::Cursor(index))?.0);
    let from = cursor.next.max(reach.min_slot(wall));
    let limit = reach
        .max_delay_ns
        .saturating_sub(cluster::margin_ns(reach, &grants));
    // In time, and not reckoned too far beyond the slots in hand.
    let turn_of = |t: &tickets::Tickets| {
        let waiting: u64 = t.waiting().iter().sum::<u64>() + t.granted_since(&read);
        let (turn, reckoned) = cluster::turn(&grants, reach, from, wall, waiting.saturating_add(1));
        let most = cluster::reckon_limit(&grants);
        if reckoned > most {
            turn.max(limit.saturating_add(reckoned - most))
        } else {
            turn
        }
    };
    let mut turn = 0;
    let (_, ticket) = tickets::take_ticket(&mut store.blob(BlobId::Classes(index)), 0, now, |t| {
        turn = turn_of(t);
        turn <= limit
    })?;
    let Some(ticket) = ticket else {
        return Ok(refused(turn, limit));
    };
    // The fast path sees that someone waits.
    let _ = cluster::add_waiting(&mut store.cell(CellId::Cursor(index)), 1);
    Ok(Outcome::Wait(Wait::Class {
        class: 0,
        ticket,
        deadline: now.saturating_add(reach.max_delay_ns),
        until: now.saturating_add(turn),
    }))
}

fn refused(turn: u64, limit: u64) -> Outcome {
    Outcome::Reject {
        retry_after_s: turn
            .saturating_sub(limit)
            .div_ceil(crate::clock::NS_PER_S)
            .max(1),
    }
}
