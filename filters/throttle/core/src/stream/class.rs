//! Stage: a rule with priority classes (see [`crate::classes`]). The request
//! goes at once if a slot is due and no class at or above its own waits (and
//! the slot is no floor slot of a lower class waiting); else it takes a
//! ticket of its class and waits for a grant, unless its estimated turn lies
//! beyond its class's `max_queue_delay` (rejected at once). With `key_quota`,
//! the key's quota is taken first, as without classes. Under dry-run the
//! same: the ticket then waits without its request (`stream/enforce.rs`).

use crate::classes::{self, tickets, Backlog};
use crate::clock::{Clock, NS_PER_S};
use crate::cluster;
use crate::keys::candidates;
use crate::matcher::{Facts, Request};
use crate::rate::{self, RateSource};
use crate::schedule::{take_quota, Admission, Schedule};
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Store, StoreError};

use super::rate::Seen;
use super::{Ctx, Outcome, Wait};

/// Admits one request of class `class` (an index into the rule's classes).
/// `clock`'s wall time is read only for cluster rules; a grid slot taken
/// counts `slots_taken`.
pub(super) fn enter<S: Store, R: Request>(
    cx: &Ctx<'_, S>,
    class: usize,
    req: &mut Facts<R>,
    clock: &mut impl Clock,
    counts: &mut Counts,
) -> (Outcome, Option<Seen>) {
    match try_enter(cx, class, req, clock, counts) {
        Ok(out) => out,
        Err(_) => (Outcome::Contention, None),
    }
}

fn try_enter<S: Store, R: Request>(
    cx: &Ctx<'_, S>,
    c: usize,
    req: &mut Facts<R>,
    clock: &mut impl Clock,
    counts: &mut Counts,
) -> Result<(Outcome, Option<Seen>), StoreError> {
    let rule = cx.rule;
    let (Some(schedule), Some(k)) = (rule.schedule, rule.classes.get(c)) else {
        return Ok((Outcome::Go, None));
    };
    let (store, index, now) = (cx.env.store, cx.index, cx.now);
    let max_delay = k.max_delay_ns;
    let mut blob = store.blob(BlobId::Classes(index));
    let wall = if rule.cluster.is_some() {
        clock.wall()
    } else {
        0
    };
    let Some(mut slots) = rate::source(store, index, rule, now, wall) else {
        return Ok((Outcome::Go, None));
    };
    let (t, _) = tickets::load(&mut blob)?;
    let busy = t.anyone_waits();
    let waiting = t.waiting();
    let outlook = slots.outlook(now, busy)?;
    // The spacing of the slots in force: in process scope the source's (the
    // learned interval, for a rule that learns: a slot's index counts those);
    // on the grid the grid's, whose slot `k` lies at `k x T`.
    let interval = if rule.cluster.is_some() {
        schedule.interval_ns
    } else {
        outlook.interval_ns.max(1)
    };
    // On the grid, a turn reckoned from the share the proxy expects may be
    // off by a margin ([`cluster::margin_for`]): the request must fit within
    // its delay less that, so that it never waits first and fails later.
    let margin = match cluster::rule_reach(rule) {
        Some(reach) => {
            let reach = cluster::Reach {
                max_delay_ns: max_delay,
                ..reach
            };
            cluster::margin_for(&reach, outlook.interval_ns)
        }
        None => 0,
    };
    let limit = max_delay.saturating_sub(margin);
    let fits = |turn: Option<u64>| turn.is_some_and(|ns| outlook.fits(now, ns, max_delay, margin));
    let fast = outlook.next_at <= now && !waiting.iter().take(c + 1).any(|&w| w > 0);
    // On the grid with nobody waiting in any class and no owned slot within
    // the coming epoch (none known, or the next beyond it): the request may
    // go on credit, as for a rule without classes (`cluster::take`), before
    // its turn is weighed. Until issue 29 a class request went on credit
    // only with no owned slot known, and was refused first when its turn
    // could not be reckoned (fleet sweep seeds 72, 181: requests within the
    // rate waited or were refused).
    let credit_reach = cluster::rule_reach(rule).filter(|reach| {
        !busy
            && outlook.interval_ns > 0
            && (outlook.known.is_none()
                || outlook.next_at.saturating_sub(now) > reach.grid.epoch_ns)
    });
    if !fast {
        // Would it be rejected? Then nothing is touched (not even the quota).
        let b = Backlog {
            classes: &rule.classes,
            tickets: &t,
            outlook,
            now,
        };
        let turn = classes::turn_ns(&b, c, waiting.get(c).copied().unwrap_or(0) + 1, true);
        // The ahead cell is read only for a request that would be refused.
        let may_credit = |reach: &cluster::Reach| {
            cluster::credit_left(&mut store.cell(CellId::Ahead(index)), reach, wall)
        };
        let refused = !cx.can_hold || !fits(turn);
        if refused && !credit_reach.as_ref().map_or(Ok(false), may_credit)? {
            return Ok(reject(turn, limit, cx.can_hold, now, &t, c, interval));
        }
    }
    if let Some(quota) = rule.quota {
        let key = rule.key.as_ref().and_then(|k| k.extract(req));
        let fp = cx.key_fingerprint(key.as_deref());
        let quota = Schedule {
            max_delay_ns: max_delay,
            ..quota
        };
        let at = candidates(fp, rule.key_slots);
        match take_quota(&mut store.table(index), fp, at, &quota, now) {
            None => {}
            Some(Admission::Reject { retry_after_s, .. }) => {
                return Ok((
                    Outcome::Reject { retry_after_s },
                    Some(Seen::new(now, true)),
                ))
            }
            Some(_) => return Ok((Outcome::Contention, None)),
        }
    }
    let ok = |slot: u64| classes::may_go_now(slot, c, &rule.classes, &waiting);
    // A slot taken now: counted, and its arrival weighed by the classes below.
    let go = |slot: u64, slots: &mut rate::Source<S>, counts: &mut Counts, blob: &mut _| {
        counts.add(
            Stat::SlotsTaken,
            i32::try_from(slots.grid_taken()).unwrap_or(i32::MAX),
        );
        if c + 1 < rule.classes.len() {
            tickets::count_arrival(blob, c, now)?;
        }
        let tat = slot.saturating_mul(interval).saturating_add(interval);
        Ok((Outcome::Go, Some(Seen::new(tat.max(now), false))))
    };
    if fast {
        if let Some(slot) = slots.take_due(now, busy, &ok)? {
            return go(slot, &mut slots, counts, &mut blob);
        }
        // The slot went meanwhile, or it is a lower class's floor slot: queue.
    }
    // On the grid, its next owned slot not due yet and nobody waiting in
    // any class: that slot now, before its time, if the process may (near,
    // or early within the budget of credit), as for a rule without classes
    // (`cluster::take`). Until issue 29 a class request waited for it: at
    // 30% of a 5,000/s rule over 50 proxies, waits up to 83 ms (fleet
    // sweep seed 188).
    if !busy && outlook.known.is_some() && outlook.next_at > now {
        let ahead = &mut store.cell(CellId::Ahead(index));
        if let Some(slot) = slots.take_ahead(now, &ok, ahead)? {
            counts.inc(Stat::SlotsAhead);
            return go(slot, &mut slots, counts, &mut blob);
        }
    }
    // Credit (`credit_reach` above; the credit a waiter may need at its
    // deadline is not spent while one waits).
    if let Some(reach) = credit_reach {
        let ahead = &mut store.cell(CellId::Ahead(index));
        if cluster::on_credit(ahead, &reach, wall)? {
            counts.inc(Stat::SlotsTaken);
            counts.inc(Stat::SlotsAhead);
            if c + 1 < rule.classes.len() {
                tickets::count_arrival(&mut blob, c, now)?;
            }
            return Ok((Outcome::Go, Some(Seen::new(now, false))));
        }
    }
    if !cx.can_hold {
        return Ok((
            Outcome::Reject { retry_after_s: 1 },
            Some(Seen::new(now, true)),
        ));
    }
    let mut refused: Option<Option<u64>> = None;
    let read = t;
    let (t, ticket) = tickets::take_ticket(&mut blob, c, now, |t| {
        let b = Backlog {
            classes: &rule.classes,
            tickets: t,
            outlook,
            now,
        };
        // The tickets are read again here, after the slots (`outlook`).
        let ahead = t.waiting().get(c).copied().unwrap_or(0) + t.granted_since(&read);
        let turn = classes::turn_ns(&b, c, ahead + 1, true);
        let ok = fits(turn);
        refused = (!ok).then_some(turn);
        ok
    })?;
    match ticket {
        Some(ticket) => {
            // Its turn if nothing changes: behind the tickets at or above
            // its class (this one among them).
            let ahead: u64 = t.waiting().iter().take(c + 1).sum();
            let until = outlook
                .next_at
                .saturating_add(ahead.saturating_sub(1).saturating_mul(interval));
            let tat = until.saturating_add(interval);
            Ok((
                Outcome::Wait(Wait::Class {
                    class: c,
                    ticket,
                    deadline: now.saturating_add(max_delay),
                    until,
                }),
                Some(Seen::new(tat, false)),
            ))
        }
        None => Ok(reject(refused.flatten(), limit, true, now, &t, c, interval)),
    }
}

/// A rejection at once: its `retry-after` is how far the estimated turn lies
/// beyond `max_delay` (if there is no turn in sight, the time the backlog at
/// or above the class takes at the full rate), at least 1 s.
fn reject(
    turn: Option<u64>,
    max_delay: u64,
    can_hold: bool,
    now: u64,
    t: &classes::Tickets,
    c: usize,
    interval: u64,
) -> (Outcome, Option<Seen>) {
    let beyond = match turn {
        _ if !can_hold => 0,
        Some(ns) => ns.saturating_sub(max_delay),
        None => {
            let ahead: u64 = t.waiting().iter().take(c + 1).sum::<u64>() + 1;
            ahead.saturating_mul(interval).saturating_sub(max_delay)
        }
    };
    let retry_after_s = beyond.div_ceil(NS_PER_S).max(1);
    (
        Outcome::Reject { retry_after_s },
        Some(Seen::new(now, true)),
    )
}
