//! Concurrency mode: at most `limit` requests of a rule in flight across the
//! whole process, the rest waiting in arrival order.
//!
//! One shared cell holds two counters: `next` (tickets handed out) and `done`
//! (tickets finished). A request takes ticket `t = next`; it may go when
//! `t < done + limit`. Tickets are handed out in arrival order, so when `t`
//! may go, every earlier ticket may too: FIFO across workers. In flight is at
//! most `limit`, because only tickets below `done + limit` go, and `done`
//! counts finished ones.
//!
//! A ticket that is abandoned while waiting (client gone, or waited longer
//! than `max_queue_delay`) counts as done only when its turn comes: counting
//! it earlier would let a later ticket go while an earlier one is in flight.
//! [`GateWaiters`] keeps those tickets until then.

use std::collections::{BTreeMap, HashMap};

use crate::queue::{Held, HeldQueue};
use crate::store::{SharedCell, StoreError, MAX_CAS_ATTEMPTS};

/// Outcome of entering the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enter {
    /// A slot is free: go now (and `leave` when done).
    Go,
    /// Wait for this ticket's turn.
    Wait { ticket: u64 },
    /// The worker cannot hold more requests: not entered, reject.
    Full,
    /// The shared cell could not be updated: not entered, reject (fail closed).
    Contention,
}

/// Takes a ticket. `can_wait`: whether the worker may hold one more request.
pub fn enter<C: SharedCell>(cell: &mut C, limit: u32, can_wait: bool) -> Enter {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((state, token)) = cell.load() else {
            return Enter::Contention;
        };
        let [next, done] = state.unwrap_or([0, 0]);
        let go = next < done.saturating_add(limit.into());
        if !go && !can_wait {
            return Enter::Full;
        }
        match cell.store([next.saturating_add(1), done], token) {
            Ok(true) => {
                return if go {
                    Enter::Go
                } else {
                    Enter::Wait { ticket: next }
                }
            }
            Ok(false) => continue,
            Err(_) => return Enter::Contention,
        }
    }
    Enter::Contention
}

/// Counts `count` tickets as finished (a request's response ended, or
/// abandoned tickets' turn came). Returns the cell as it was before.
pub fn leave<C: SharedCell>(cell: &mut C, count: u64) -> Result<[u64; 2], StoreError> {
    if count == 0 {
        return Ok([0, 0]);
    }
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (state, token) = cell.load()?;
        let [next, done] = state.unwrap_or([0, 0]);
        if cell.store([next, done.saturating_add(count)], token)? {
            return Ok([next, done]);
        }
    }
    Err(StoreError(u32::MAX))
}

/// Whether returning one slot to a gate that was at `before` (as [`leave`]
/// returns it) lets a waiting ticket go.
pub fn lets_a_waiter_go(before: [u64; 2], limit: u32) -> bool {
    let [next, done] = before;
    next > done.saturating_add(limit.into())
}

/// The bound below which tickets may go now: `done + limit`.
pub fn go_bound<C: SharedCell>(cell: &mut C, limit: u32) -> Result<u64, StoreError> {
    let (state, _) = cell.load()?;
    let [_, done] = state.unwrap_or([0, 0]);
    Ok(done.saturating_add(limit.into()))
}

/// Requests of one worker waiting at gates: by (rule, ticket) for turns, and
/// by deadline for `max_queue_delay`.
#[derive(Debug, Default)]
pub struct GateWaiters {
    by_ticket: BTreeMap<(usize, u64), u32>,
    ticket_of: HashMap<u32, (usize, u64)>,
    deadlines: HeldQueue,
    /// Abandoned tickets per rule, to count as done at their turn.
    abandoned: BTreeMap<(usize, u64), ()>,
}

/// A waiter leaving the gate's waiting room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub context_id: u32,
    pub rule: usize,
    pub ticket: u64,
    /// When it started waiting.
    pub since: u64,
}

impl crate::queue::Room for GateWaiters {
    fn len(&self) -> usize {
        GateWaiters::len(self)
    }
    fn contains(&self, context_id: u32) -> bool {
        GateWaiters::contains(self, context_id)
    }
    fn needs_ticks(&self) -> bool {
        GateWaiters::needs_ticks(self)
    }
}

impl GateWaiters {
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.ticket_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ticket_of.is_empty()
    }

    /// Whether anything needs ticks: waiters or abandoned tickets.
    pub fn needs_ticks(&self) -> bool {
        !self.ticket_of.is_empty() || !self.abandoned.is_empty()
    }

    pub fn contains(&self, context_id: u32) -> bool {
        self.ticket_of.contains_key(&context_id)
    }

    /// Rules that have waiters or abandoned tickets (to poll their cells).
    pub fn rules(&self) -> Vec<usize> {
        let mut r: Vec<usize> = self
            .by_ticket
            .keys()
            .chain(self.abandoned.keys())
            .map(|&(rule, _)| rule)
            .collect();
        r.dedup();
        r.sort_unstable();
        r.dedup();
        r
    }

    /// Starts waiting for `ticket` of `rule` until `deadline`.
    pub fn wait(&mut self, context_id: u32, rule: usize, ticket: u64, now: u64, deadline: u64) {
        self.by_ticket.insert((rule, ticket), context_id);
        self.ticket_of.insert(context_id, (rule, ticket));
        self.deadlines.hold(context_id, rule, now, deadline);
    }

    /// The client went away: its ticket is abandoned. Returns it if it was waiting.
    pub fn cancel(&mut self, context_id: u32) -> Option<Waiter> {
        let (rule, ticket) = self.ticket_of.remove(&context_id)?;
        self.by_ticket.remove(&(rule, ticket));
        let since = self.deadlines.cancel(context_id).map_or(0, |r| r.held_at);
        self.abandoned.insert((rule, ticket), ());
        Some(Waiter {
            context_id,
            rule,
            ticket,
            since,
        })
    }

    /// Waiters of `rule` whose ticket is below `bound` (their turn came), in
    /// ticket order; and the number of abandoned tickets of `rule` below
    /// `bound`, which are dropped (the caller counts them as done).
    pub fn turn_came(&mut self, rule: usize, bound: u64, out: &mut Vec<Waiter>) -> u64 {
        let ready: Vec<((usize, u64), u32)> = self
            .by_ticket
            .range((rule, 0)..(rule, bound))
            .map(|(&k, &v)| (k, v))
            .collect();
        for ((_, ticket), id) in ready {
            self.by_ticket.remove(&(rule, ticket));
            self.ticket_of.remove(&id);
            let since = self.deadlines.cancel(id).map_or(0, |r| r.held_at);
            out.push(Waiter {
                context_id: id,
                rule,
                ticket,
                since,
            });
        }
        let gone: Vec<(usize, u64)> = self
            .abandoned
            .range((rule, 0)..(rule, bound))
            .map(|(&k, _)| k)
            .collect();
        for k in &gone {
            self.abandoned.remove(k);
        }
        gone.len() as u64
    }

    /// Waiters whose deadline passed at `now`: they are answered with a
    /// rejection, and their tickets are abandoned.
    pub fn expired(&mut self, now: u64, out: &mut Vec<Waiter>) {
        let mut due: Vec<Held> = Vec::new();
        self.deadlines.pop_due(now, &mut due);
        for r in due {
            if let Some((rule, ticket)) = self.ticket_of.remove(&r.context_id) {
                self.by_ticket.remove(&(rule, ticket));
                self.abandoned.insert((rule, ticket), ());
                out.push(Waiter {
                    context_id: r.context_id,
                    rule,
                    ticket,
                    since: r.held_at,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::MemCell as Cell;

    #[test]
    fn at_most_limit_go_the_rest_wait_in_order() {
        let mut c = Cell::default();
        assert_eq!(enter(&mut c, 2, true), Enter::Go);
        assert_eq!(enter(&mut c, 2, true), Enter::Go);
        assert_eq!(enter(&mut c, 2, true), Enter::Wait { ticket: 2 });
        assert_eq!(enter(&mut c, 2, true), Enter::Wait { ticket: 3 });
        assert_eq!(enter(&mut c, 2, false), Enter::Full);
        assert_eq!(c.v, Some([4, 0]), "a full worker takes no ticket");
        assert_eq!(go_bound(&mut c, 2), Ok(2));
        leave(&mut c, 1).unwrap();
        assert_eq!(
            go_bound(&mut c, 2),
            Ok(3),
            "ticket 2 may go, ticket 3 still waits"
        );
    }

    #[test]
    fn waiters_go_in_ticket_order_when_their_turn_comes() {
        let mut w = GateWaiters::new();
        w.wait(10, 0, 5, 0, 1000);
        w.wait(11, 0, 3, 0, 1000);
        w.wait(12, 1, 4, 0, 1000);
        let mut out = Vec::new();
        assert_eq!(w.turn_came(0, 4, &mut out), 0);
        assert_eq!(
            out.iter().map(|x| x.context_id).collect::<Vec<_>>(),
            vec![11]
        );
        out.clear();
        w.turn_came(0, 100, &mut out);
        assert_eq!(
            out.iter()
                .map(|x| (x.context_id, x.ticket))
                .collect::<Vec<_>>(),
            vec![(10, 5)]
        );
        assert_eq!(w.len(), 1, "rule 1's waiter is untouched");
        assert_eq!(w.rules(), vec![1]);
    }

    /// The bug this design avoids: counting an abandoned ticket as done at
    /// once would let ticket 2 go while ticket 0 is still in flight (limit 1).
    #[test]
    fn an_abandoned_ticket_counts_as_done_only_at_its_turn() {
        let mut c = Cell::default();
        let mut w = GateWaiters::new();
        assert_eq!(enter(&mut c, 1, true), Enter::Go); // ticket 0 in flight
        let Enter::Wait { ticket: t1 } = enter(&mut c, 1, true) else {
            panic!()
        };
        let Enter::Wait { ticket: t2 } = enter(&mut c, 1, true) else {
            panic!()
        };
        w.wait(101, 0, t1, 0, 1000);
        w.wait(102, 0, t2, 0, 1000);
        // Ticket 2's client leaves.
        assert_eq!(w.cancel(102).map(|x| x.ticket), Some(2));
        let mut out = Vec::new();
        let bound = go_bound(&mut c, 1).unwrap();
        assert_eq!(
            w.turn_came(0, bound, &mut out),
            0,
            "not its turn yet: nothing counted"
        );
        assert!(
            out.is_empty(),
            "ticket 1 must still wait: ticket 0 is in flight"
        );
        // Ticket 0 finishes: ticket 1 goes; ticket 2 (abandoned) still not due.
        leave(&mut c, 1).unwrap();
        let bound = go_bound(&mut c, 1).unwrap();
        assert_eq!(w.turn_came(0, bound, &mut out), 0);
        assert_eq!(
            out.iter().map(|x| x.context_id).collect::<Vec<_>>(),
            vec![101]
        );
        // Ticket 1 finishes: ticket 2's turn comes, it is counted as done.
        leave(&mut c, 1).unwrap();
        out.clear();
        let bound = go_bound(&mut c, 1).unwrap();
        assert_eq!(w.turn_came(0, bound, &mut out), 1);
        leave(&mut c, 1).unwrap();
        assert_eq!(
            c.v,
            Some([3, 3]),
            "every ticket accounted for: nothing leaked"
        );
        assert!(!w.needs_ticks());
    }

    #[test]
    fn waiters_past_their_deadline_expire_and_abandon_their_ticket() {
        let mut w = GateWaiters::new();
        w.wait(1, 0, 7, 100, 200);
        w.wait(2, 0, 8, 150, 250);
        let mut out = Vec::new();
        w.expired(199, &mut out);
        assert!(out.is_empty());
        w.expired(200, &mut out);
        assert_eq!(
            out,
            vec![Waiter {
                context_id: 1,
                rule: 0,
                ticket: 7,
                since: 100
            }]
        );
        assert!(w.contains(2) && !w.contains(1));
        assert!(w.needs_ticks());
        let mut ready = Vec::new();
        assert_eq!(
            w.turn_came(0, 9, &mut ready),
            1,
            "the expired ticket is counted at its turn"
        );
        assert_eq!(ready.len(), 1);
    }
}
