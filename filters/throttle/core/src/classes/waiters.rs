//! One worker's requests waiting in class queues, by ticket, and the
//! abandoned tickets it must still pass on when their turn comes (as the
//! gate keeps its abandoned tickets, [`crate::gate::GateWaiters`]). Under
//! dry-run, a request that would have waited keeps its ticket here as a
//! `dry` waiter, which holds no stream: the line then runs as it would
//! have, so its grants and displacements are counted, not carried out.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A request waiting for its class's grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassWaiter {
    pub context_id: u32,
    pub rule: usize,
    pub class: usize,
    pub ticket: u64,
    /// When it started waiting (monotonic ns).
    pub since: u64,
    /// When its class's `max_queue_delay` runs out.
    pub deadline: u64,
    /// Dry-run: only its ticket waits (the request went on at once), so its
    /// grant or displacement is counted and nothing is resumed or answered.
    pub dry: bool,
}

impl ClassWaiter {
    /// Its place: (rule, class, ticket).
    pub fn place(&self) -> Place {
        (self.rule, self.class, self.ticket)
    }
}

/// (rule, class, ticket).
pub type Place = (usize, usize, u64);

/// One worker's class waiters and abandoned tickets.
#[derive(Debug, Default)]
pub struct ClassWaiters {
    by_place: BTreeMap<Place, ClassWaiter>,
    /// The held requests' places (a dry waiter holds no stream: not here).
    place_of: HashMap<u32, Place>,
    /// Abandoned tickets whose grant is still to pass on, with whether the
    /// shared value counts them as abandoned.
    abandoned: BTreeMap<Place, bool>,
    /// Waiters by deadline.
    deadlines: BTreeSet<(u64, Place)>,
    /// When each rule's waiters were last checked for displacement.
    checked: HashMap<usize, u64>,
}

impl crate::queue::Room for ClassWaiters {
    fn len(&self) -> usize {
        ClassWaiters::len(self)
    }
    fn contains(&self, context_id: u32) -> bool {
        ClassWaiters::contains(self, context_id)
    }
    fn needs_ticks(&self) -> bool {
        ClassWaiters::needs_ticks(self)
    }
}

impl ClassWaiters {
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests held now (dry waiters hold none).
    pub fn len(&self) -> usize {
        self.place_of.len()
    }

    /// Dry tickets waiting now (their requests went on).
    pub fn dry_len(&self) -> usize {
        self.by_place.len().saturating_sub(self.place_of.len())
    }

    /// Whether no ticket waits here (held or dry).
    pub fn is_empty(&self) -> bool {
        self.by_place.is_empty()
    }

    /// Whether anything needs ticks: waiters (held or dry), or abandoned
    /// tickets.
    pub fn needs_ticks(&self) -> bool {
        !self.by_place.is_empty() || !self.abandoned.is_empty()
    }

    pub fn contains(&self, context_id: u32) -> bool {
        self.place_of.contains_key(&context_id)
    }

    /// Rules with waiters or abandoned tickets here, ascending.
    pub fn rules(&self) -> Vec<usize> {
        let mut r: Vec<usize> = self
            .by_place
            .keys()
            .chain(self.abandoned.keys())
            .map(|&(rule, _, _)| rule)
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    }

    /// Starts waiting (a dry waiter: only its ticket).
    pub fn wait(&mut self, w: ClassWaiter) {
        let place = (w.rule, w.class, w.ticket);
        if !w.dry {
            self.remove(w.context_id);
            self.place_of.insert(w.context_id, place);
        }
        self.by_place.insert(place, w);
        self.deadlines.insert((w.deadline, place));
    }

    /// Stops holding `context_id` (its stream ended): its waiter, if held
    /// here; a dry waiter stays (the stream went on at once, and the ticket
    /// waits as the request would have).
    pub fn remove(&mut self, context_id: u32) -> Option<ClassWaiter> {
        let place = self.place_of.get(&context_id).copied()?;
        self.leave(place)
    }

    /// Removes the waiter of ticket `ticket` of `rule`'s class `class`
    /// (released or displaced), held or dry.
    pub fn leave(&mut self, place: Place) -> Option<ClassWaiter> {
        let w = self.by_place.remove(&place)?;
        if !w.dry {
            self.place_of.remove(&w.context_id);
        }
        self.deadlines.remove(&(w.deadline, place));
        Some(w)
    }

    /// Waiters of `rule` and `class` with a ticket below `granted` (their
    /// grant came), in ticket order.
    pub fn granted(&self, rule: usize, class: usize, granted: u64) -> Vec<ClassWaiter> {
        self.by_place
            .range((rule, class, 0)..(rule, class, granted))
            .map(|(_, w)| *w)
            .collect()
    }

    /// Waiters of `rule` whose deadline is at or before `now`.
    pub fn expired(&self, rule: usize, now: u64) -> Vec<ClassWaiter> {
        self.deadlines
            .range(..=(now, (usize::MAX, usize::MAX, u64::MAX)))
            .filter(|(_, p)| p.0 == rule)
            .filter_map(|(_, p)| self.by_place.get(p))
            .copied()
            .collect()
    }

    /// Whether `rule`'s waiters are due for a displacement check at `now`
    /// (at most every `every_ns`); records the check.
    pub fn check_due(&mut self, rule: usize, now: u64, every_ns: u64) -> bool {
        let last = self.checked.entry(rule).or_insert(0);
        if now < last.saturating_add(every_ns) && *last != 0 {
            return false;
        }
        *last = now;
        true
    }

    /// Whether this worker holds ticket `place` (waiting, or abandoned and
    /// not yet settled).
    pub fn holds(&self, place: Place) -> bool {
        self.by_place.contains_key(&place) || self.abandoned.contains_key(&place)
    }

    /// Keeps an abandoned ticket until its grant is passed on.
    pub fn abandon(&mut self, rule: usize, class: usize, ticket: u64, counted: bool) {
        self.abandoned.insert((rule, class, ticket), counted);
    }

    /// Abandoned tickets of `rule`: (class, ticket, counted), by class then ticket.
    pub fn abandoned_of(&self, rule: usize) -> Vec<(usize, u64, bool)> {
        self.abandoned
            .range((rule, 0, 0)..=(rule, usize::MAX, u64::MAX))
            .map(|(&(_, c, t), &counted)| (c, t, counted))
            .collect()
    }

    /// The grant of an abandoned ticket was passed on.
    pub fn passed_on(&mut self, rule: usize, class: usize, ticket: u64) {
        self.abandoned.remove(&(rule, class, ticket));
    }

    /// Waiters of `rule`, by class then ticket (oldest first within a class).
    pub fn of_rule(&self, rule: usize) -> Vec<ClassWaiter> {
        self.by_place
            .range((rule, 0, 0)..=(rule, usize::MAX, u64::MAX))
            .map(|(_, w)| *w)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: u32, rule: usize, class: usize, ticket: u64) -> ClassWaiter {
        ClassWaiter {
            context_id: id,
            rule,
            class,
            ticket,
            since: 0,
            deadline: 100,
            dry: false,
        }
    }

    #[test]
    fn waiters_by_rule_class_and_ticket() {
        let mut q = ClassWaiters::new();
        q.wait(w(1, 0, 1, 5));
        q.wait(w(2, 0, 0, 9));
        q.wait(w(3, 2, 0, 1));
        q.wait(w(4, 0, 1, 2));
        assert_eq!(q.len(), 4);
        let ids: Vec<u32> = q.of_rule(0).iter().map(|w| w.context_id).collect();
        assert_eq!(ids, vec![2, 4, 1]);
        assert_eq!(q.rules(), vec![0, 2]);
        assert_eq!(q.remove(4).map(|w| w.ticket), Some(2));
        assert_eq!(q.remove(4), None);
        assert!(!q.contains(4) && q.contains(1));
    }

    #[test]
    fn abandoned_tickets_keep_the_worker_ticking_until_passed_on() {
        let mut q = ClassWaiters::new();
        q.wait(w(1, 3, 0, 7));
        q.remove(1);
        assert!(!q.needs_ticks());
        q.abandon(3, 0, 7, true);
        q.abandon(3, 1, 2, false);
        assert!(q.needs_ticks() && q.is_empty());
        assert_eq!(q.rules(), vec![3]);
        assert_eq!(q.abandoned_of(3), vec![(0, 7, true), (1, 2, false)]);
        q.passed_on(3, 0, 7);
        q.passed_on(3, 1, 2);
        assert!(!q.needs_ticks());
    }
}
