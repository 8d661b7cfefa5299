//! The worker's part of its rules' lines (a rule's priority classes, or a
//! cluster rule's own line; see [`crate::classes`]) on each tick: grant the
//! due slots, pass on the grants of its abandoned tickets, release its
//! requests whose ticket was granted, and answer those whose turn can no
//! longer come in time (`displaced`). A dry-run rule's tickets wait here
//! without their requests: their grants and displacements are counted by
//! class, as they would have happened, and nothing is resumed or answered.
//! Here, not in `classes/`: the lines' shared value and waiting room live
//! below the worker, its tick above.

use crate::classes::tickets::{self, Abandoned, Settled, Tickets};
use crate::classes::{cannot_make_it, turn_ns, Backlog, ClassWaiter};
use crate::clock::{Clock, NS_PER_MS, NS_PER_S};
use crate::cluster;
use crate::config::{Config, Rule};
use crate::rate::{self, RateSource};
use crate::stats::{ClassStat, Counts, Stat};
use crate::store::{BlobId, CellId, Store, StoreError};

use super::{TickPlan, Worker};

/// Most rounds of granting and passing on in one tick.
const ROUNDS: usize = 64;

/// How often a worker checks its waiters of a rule for a turn that can no
/// longer come in time (deadlines themselves are kept at every tick).
pub const CHECK_EVERY_NS: u64 = 10 * crate::clock::NS_PER_MS;

/// Slots another worker may have taken and not yet granted when this one
/// reads the shared state (see the check in `class_turn`).
pub const GRANTS_IN_FLIGHT: u64 = 2;

impl Worker {
    /// The class queues' part of a tick, for every rule with waiters or
    /// abandoned tickets on this worker.
    pub(crate) fn class_turns<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        clock: &mut impl Clock,
        plan: &mut TickPlan,
    ) {
        let now = clock.mono();
        for index in self.classes.rules() {
            let Some(rule) = cfg.rules.get(index) else {
                continue;
            };
            let wall = if rule.cluster.is_some() {
                clock.wall()
            } else {
                0
            };
            if self
                .class_turn(cfg, rule, index, store, (now, wall), plan)
                .is_err()
            {
                // The shared value or the schedule failed: nothing is
                // granted this tick; waiters past their deadline still go.
                self.class_deadlines(cfg, index, store, (now, wall), plan);
            }
        }
    }

    fn class_turn<S: Store>(
        &mut self,
        cfg: &Config,
        rule: &Rule,
        index: usize,
        store: S,
        (now, wall): (u64, u64),
        plan: &mut TickPlan,
    ) -> Result<(), StoreError> {
        let Some(mut slots) = rate::source(store, index, rule, now, wall) else {
            return Ok(());
        };
        let line = rule.line();
        // A cluster rule's waiters, of its own line or of its classes, are
        // counted in the rule's cursor ([`cluster::Cursor::waiting`]): the
        // fast path of a line without classes queues behind them, and a
        // credit is repaid only while nobody waits ([`cluster::repay`]), so
        // that the repayment never takes the slot a held request counts on.
        // Until issue 29 an enforced class rule's tickets stayed out of it
        // (class requests went on credit only with no owned slot known);
        // with credit taken as without classes, a repayment then took the
        // slot a held batch request counted on, which was refused at its
        // deadline (fleet sweep seeds 10, 62, 147).
        let counted_in_cursor = rule.cluster.is_some();
        let mut blob = store.blob(BlobId::Classes(index));
        let mut t = Tickets::default();
        for _ in 0..ROUNDS {
            let g = tickets::grant_due(&mut blob, &mut slots, &line, now)?;
            t = g.tickets;
            let mut passed = false;
            for (c, ticket, counted) in self.classes.abandoned_of(index) {
                if t.lines.get(c).is_none_or(|l| ticket > l.granted) {
                    continue;
                }
                let (after, out) = tickets::settle(&mut blob, &mut slots, c, ticket, counted)?;
                t = after;
                if out != Settled::NotYet {
                    self.classes.passed_on(index, c, ticket);
                    passed = true;
                }
                // Its slot went to the class's next ticket: if another worker
                // holds it, that one is woken (it leaves, or passes it on in
                // turn, now); one of this worker's goes in this tick.
                let to = t.lines.get(c).map_or(0, |l| l.granted.saturating_sub(1));
                if out == Settled::PassedOn && !self.classes.holds((index, c, to)) {
                    plan.wake = true;
                }
            }
            if !passed {
                break;
            }
        }
        let taken = slots.grid_taken();
        if taken > 0 {
            plan.count(
                index,
                Stat::SlotsTaken,
                i32::try_from(taken).unwrap_or(i32::MAX),
            );
        }
        for (c, tickets_of) in t.lines.iter().enumerate().take(line.len()) {
            for w in self.classes.granted(index, c, tickets_of.granted) {
                self.classes.leave(w.place());
                self.granted_to(cfg, store, w, now, plan);
            }
        }
        let expired = self.classes.expired(index, now);
        let left = !expired.is_empty();
        for w in expired {
            self.expire(cfg, rule, store, w, (now, wall), plan);
        }
        if counted_in_cursor {
            // After the expired left (their tickets abandoned), so that the
            // count drops to 0 with the last waiter of the process.
            if left {
                t = tickets::load(&mut blob)?.0;
            }
            let waiting: u64 = t.waiting().iter().sum();
            let _ = cluster::set_waiting(&mut store.cell(CellId::Cursor(index)), waiting);
        }
        if slots.denies()? {
            // The engine fails and the rule denies: nobody waits for a grant
            // that cannot come.
            for w in self.classes.of_rule(index) {
                self.displace(cfg, store, w, 1, now, plan);
            }
            if counted_in_cursor {
                let waiting: u64 = tickets::load(&mut blob)?.0.waiting().iter().sum();
                let _ = cluster::set_waiting(&mut store.cell(CellId::Cursor(index)), waiting);
            }
            return Ok(());
        }
        if self.classes.is_empty() || !self.classes.check_due(index, now, CHECK_EVERY_NS) {
            return Ok(());
        }
        // The schedule first, then the tickets: a grant made by another worker in between
        // then shows in the tickets (fewer ahead) while the schedule read misses its slot
        // (more slots seem left), so a race only errs on the side of keeping a request. Only
        // a grant whose slot is taken and whose ticket is not yet marked (a few microseconds)
        // errs the other way, by one slot per worker granting at that instant:
        // `GRANTS_IN_FLIGHT` slots of tolerance cover it. (The deadline still bounds the wait.)
        let outlook = slots.outlook(now, true)?;
        let (t, _) = tickets::load(&mut blob)?;
        let b = Backlog {
            classes: &line,
            tickets: &t,
            outlook,
            now,
        };
        for w in self.classes.of_rule(index) {
            let line = t.lines.get(w.class).copied().unwrap_or_default();
            let position = w
                .ticket
                .saturating_sub(line.granted)
                .saturating_add(1)
                .saturating_sub(line.abandoned.into())
                .max(1);
            let beyond = position.saturating_sub(GRANTS_IN_FLIGHT).max(1);
            // The top class is displaced by nobody: it waits to its deadline.
            if w.class > 0
                && w.ticket >= line.granted
                && cannot_make_it(&b, w.class, beyond, w.deadline)
            {
                let retry = turn_ns(&b, w.class, position, true)
                    .unwrap_or(NS_PER_S)
                    .div_ceil(NS_PER_S)
                    .max(1);
                self.displace(cfg, store, w, retry, now, plan);
            }
        }
        Ok(())
    }

    /// Without the shared state: only the waiters past their deadline go.
    fn class_deadlines<S: Store>(
        &mut self,
        cfg: &Config,
        index: usize,
        store: S,
        (now, wall): (u64, u64),
        plan: &mut TickPlan,
    ) {
        let Some(rule) = cfg.rules.get(index) else {
            return;
        };
        for w in self.classes.expired(index, now) {
            self.expire(cfg, rule, store, w, (now, wall), plan);
        }
    }

    /// A waiter whose `max_queue_delay` ran out before its grant: in cluster
    /// scope its turn was reckoned on the share the proxy expected, and the
    /// grants came later: it goes on credit if the proxy may (at most
    /// `burst + 1` ahead of its grants), or on a slot a failed engine call
    /// cost the proxy ([`cluster::at_deadline`]); else (or in process scope)
    /// it is answered with the rule's rejection.
    fn expire<S: Store>(
        &mut self,
        cfg: &Config,
        rule: &Rule,
        store: S,
        w: ClassWaiter,
        (now, wall): (u64, u64),
        plan: &mut TickPlan,
    ) {
        if self.leave_line(cfg, store, w, now, plan) {
            return;
        }
        let went = cluster::rule_reach(rule).and_then(|reach| {
            let (mut ahead, mut forgiven) = (
                store.cell(CellId::Ahead(w.rule)),
                store.cell(CellId::Forgiven(w.rule)),
            );
            cluster::at_deadline(&mut ahead, &mut forgiven, &reach, wall)
                .ok()
                .flatten()
        });
        let counts: &[(Stat, i32)] = match went {
            Some(cluster::AtDeadline::Credit) => &[(Stat::SlotsTaken, 1), (Stat::SlotsAhead, 1)],
            Some(cluster::AtDeadline::Forgiven) => &[(Stat::SlotsForgiven, 1)],
            None => return self.refuse(cfg, w, 1, plan),
        };
        plan.merge(w.rule, &Counts::of(counts));
        self.granted_to(cfg, store, w, now, plan);
    }

    /// Answers a waiter whose turn cannot come in time; its ticket is abandoned.
    ///
    /// Another worker may have granted its ticket since this tick read the
    /// shared value: the abandonment tells (atomically), and such a request
    /// is released instead, on the slot it was granted.
    fn displace<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        w: ClassWaiter,
        retry_after_s: u64,
        now: u64,
        plan: &mut TickPlan,
    ) {
        if !self.leave_line(cfg, store, w, now, plan) {
            self.refuse(cfg, w, retry_after_s, plan);
        }
    }

    /// A waiter leaves its line: its ticket is abandoned, unless another
    /// worker granted it meanwhile (the abandonment tells, atomically): then
    /// it is released on the slot it was granted, and this returns true.
    fn leave_line<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        w: ClassWaiter,
        now: u64,
        plan: &mut TickPlan,
    ) -> bool {
        self.classes.leave(w.place());
        let blob = &mut store.blob(BlobId::Classes(w.rule));
        match tickets::abandon(blob, w.class, w.ticket) {
            Ok(Abandoned::Granted) => {
                self.granted_to(cfg, store, w, now, plan);
                return true;
            }
            Ok(Abandoned::Skipped) => {}
            Ok(Abandoned::Counted) => self.classes.abandon(w.rule, w.class, w.ticket, true),
            Err(_) => self.classes.abandon(w.rule, w.class, w.ticket, false),
        }
        false
    }

    /// A waiter's ticket was granted (or it goes on credit): a held request
    /// is resumed (or sent on to the rule's gate); a dry one is counted
    /// `released` in its class, with the time it would have waited.
    fn granted_to<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        w: ClassWaiter,
        now: u64,
        plan: &mut TickPlan,
    ) {
        let classes = cfg.rules.get(w.rule).is_some_and(|r| !r.classes.is_empty());
        if w.dry {
            if classes {
                let mut c = Counts::NONE;
                c.add_class(w.class, ClassStat::Released, 1);
                c.record_class(
                    w.class,
                    ClassStat::WaitMs,
                    now.saturating_sub(w.since) / NS_PER_MS,
                );
                plan.merge(w.rule, &c);
            }
            return;
        }
        if classes {
            self.releasing.insert(w.context_id, w.class);
        }
        self.release(cfg, store, w.context_id, w.rule, w.since, now, plan);
    }

    /// Answers a waiter with the rule's rejection (counted `displaced` in a
    /// rule with classes); a dry waiter is only counted.
    fn refuse(&mut self, cfg: &Config, w: ClassWaiter, retry_after_s: u64, plan: &mut TickPlan) {
        if !w.dry {
            plan.actions
                .push(self.reject(cfg, w.context_id, w.rule, retry_after_s));
        }
        if cfg.rules.get(w.rule).is_some_and(|r| !r.classes.is_empty()) {
            let mut c = Counts::NONE;
            c.add_class(w.class, ClassStat::Displaced, 1);
            plan.merge(w.rule, &c);
        }
    }

    /// A class waiter leaves (its stream ended, or Envoy answered it): its
    /// ticket is abandoned. Returns whether it was waiting.
    pub(crate) fn leave_class<S: Store>(&mut self, store: S, id: u32) -> bool {
        let Some(w) = self.classes.remove(id) else {
            return false;
        };
        self.abandon_ticket(store, w);
        true
    }

    /// Abandons a waiter's ticket in the shared value; keeps it here if it
    /// must still be settled. (If the store fails, it is kept as counted:
    /// settled once next in line or granted, whichever the value shows.)
    pub(crate) fn abandon_ticket<S: Store>(&mut self, store: S, w: ClassWaiter) {
        let how = tickets::abandon(&mut store.blob(BlobId::Classes(w.rule)), w.class, w.ticket);
        match how {
            Ok(Abandoned::Skipped) => {}
            Ok(Abandoned::Counted) => self.classes.abandon(w.rule, w.class, w.ticket, true),
            Ok(Abandoned::Granted) | Err(_) => {
                self.classes.abandon(w.rule, w.class, w.ticket, false)
            }
        }
    }
}
