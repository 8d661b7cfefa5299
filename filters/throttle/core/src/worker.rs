//! One worker's state (its held requests, waiters at concurrency gates, slots
//! in flight) and the plan for each tick, returned as data: which requests to
//! resume and which to answer. The glue carries out the plan and reports each
//! outcome back ([`Worker::resumed`], [`Worker::replied`]), which returns the
//! counters to move.
//!
//! Only the worker that paused a request can resume it, so each worker has
//! its own state; the schedules and gates it consults are process-wide
//! ([`Store`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::adaptive::learner::interval_in;
use crate::adaptive::{Mode, Tally};
use crate::classes::ClassWaiters;
use crate::clock::Clock;
use crate::clock::NS_PER_MS;
use crate::cluster;
use crate::config::Config;
use crate::gate::{self, Enter, GateWaiters, Waiter};
use crate::queue::{Held, HeldQueue};
use crate::reply::{rejection, Reply};
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Store};
use crate::stream::{retry_grants, Outcome, Wait};

/// Requests of cluster rules waiting for grants from the engine, by rule and
/// deadline. A rule's deadlines grow with its waiters' age (one
/// `max_queue_delay` per rule), so each rule's list is oldest first.
#[derive(Debug, Default)]
pub struct GrantWaiters {
    /// (rule, deadline, context id) -> since.
    by_rule: BTreeMap<(usize, u64, u32), u64>,
    /// context id -> (rule, deadline).
    index: HashMap<u32, (usize, u64)>,
}

/// A request waiting for grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantWaiter {
    pub id: u32,
    pub rule: usize,
    /// When it started waiting.
    pub since: u64,
    /// When its `max_queue_delay` runs out.
    pub deadline: u64,
}

impl GrantWaiters {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn contains(&self, id: u32) -> bool {
        self.index.contains_key(&id)
    }

    /// Starts waiting at `since` until `deadline`.
    pub fn wait(&mut self, id: u32, rule: usize, since: u64, deadline: u64) {
        if let Some(old) = self.index.insert(id, (rule, deadline)) {
            self.by_rule.remove(&(old.0, old.1, id));
        }
        self.by_rule.insert((rule, deadline, id), since);
    }

    /// Stops waiting; returns its rule if it was waiting.
    pub fn cancel(&mut self, id: u32) -> Option<usize> {
        let (rule, deadline) = self.index.remove(&id)?;
        self.by_rule.remove(&(rule, deadline, id));
        Some(rule)
    }

    /// The oldest waiter of the first rule at or after `rule`.
    pub fn first_from(&self, rule: usize) -> Option<GrantWaiter> {
        self.by_rule
            .range((rule, 0, 0)..)
            .next()
            .map(|(&(rule, deadline, id), &since)| GrantWaiter {
                id,
                rule,
                since,
                deadline,
            })
    }

    /// Every waiter, by rule, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = GrantWaiter> + '_ {
        self.by_rule
            .iter()
            .map(|(&(rule, deadline, id), &since)| GrantWaiter {
                id,
                rule,
                since,
                deadline,
            })
    }
}

/// State of one worker.
#[derive(Debug, Default)]
pub struct Worker {
    /// Requests held by a rate schedule until their release time.
    pub queue: HeldQueue,
    /// Requests waiting for a concurrency slot.
    pub gate: GateWaiters,
    /// Requests holding a concurrency slot: context id -> rule index.
    pub in_flight: HashMap<u32, usize>,
    /// Resumed requests: context id -> milliseconds held (`x-throttle-wait-ms`).
    pub waited: HashMap<u32, u64>,
    /// Requests of cluster rules waiting for grants from the engine.
    pub grants: GrantWaiters,
    /// Held gRPC requests (a tick-time rejection answers them the gRPC way).
    pub grpc: HashSet<u32>,
    /// Adaptive rules: what this worker saw of each rule's traffic since it
    /// last added it to the shared tally (by rule index).
    pub tallies: Vec<Tally>,
    /// Adaptive rules: answers seen that were not bad (one in
    /// `adaptive::tally::SAMPLE_EVERY` carries its origin).
    pub answers_seen: u64,
    /// Adaptive rules: held requests by context id -> rule (a release
    /// counts as sent upstream).
    pub learning_held: HashMap<u32, usize>,
    /// Adaptive rules: the interval this worker last saw each rule pace at
    /// while holding its requests (0: none seen).
    pub paced: Vec<u64>,
    /// Requests waiting in the class queues of rules with priority classes.
    pub classes: ClassWaiters,
    /// Class requests being resumed: context id -> class (its counters).
    pub releasing: HashMap<u32, usize>,
}

/// What a tick does to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TickAction {
    /// Resume it (it was held `waited_ns`); then report [`Worker::resumed`].
    Resume {
        id: u32,
        rule: usize,
        waited_ns: u64,
    },
    /// Answer it with this reply; then report [`Worker::replied`].
    Reply { id: u32, rule: usize, reply: Reply },
}

/// A tick's plan: the actions, and per-rule counters already moved while
/// planning (slots handed out, contention).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TickPlan {
    pub actions: Vec<TickAction>,
    pub counts: Vec<(usize, Counts)>,
}

impl TickPlan {
    pub(crate) fn count(&mut self, rule: usize, stat: Stat, delta: i32) {
        self.merge(rule, &Counts::of(&[(stat, delta)]));
    }

    pub(crate) fn merge(&mut self, rule: usize, counts: &Counts) {
        if counts.is_empty() {
            return;
        }
        match self.counts.iter_mut().find(|(r, _)| *r == rule) {
            Some((_, c)) => c.merge(counts),
            None => self.counts.push((rule, counts.clone())),
        }
    }
}

impl Worker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests held now, by rate, by gate or waiting for grants.
    pub fn held(&self) -> usize {
        self.queue.len() + self.gate.len() + self.grants.len() + self.classes.len()
    }

    /// Whether `id` is held now.
    pub fn holds(&self, id: u32) -> bool {
        self.queue.contains(id)
            || self.gate.contains(id)
            || self.grants.contains(id)
            || self.classes.contains(id)
    }

    /// Whether anything needs the tick.
    pub fn needs_ticks(&self) -> bool {
        !self.queue.is_empty()
            || self.gate.needs_ticks()
            || !self.grants.is_empty()
            || self.classes.needs_ticks()
    }

    /// Stops holding `id` (its stream ended, or Envoy answered it): removes it
    /// from the queue, the gate (an abandoned ticket is counted at its turn)
    /// or the grant waiters (the rule's waiting count goes down). Returns
    /// whether it was held.
    pub fn unhold<S: Store>(&mut self, store: S, id: u32) -> bool {
        let from_queue = self.queue.cancel(id).is_some();
        let from_gate = self.gate.cancel(id).is_some();
        let from_grants = match self.grants.cancel(id) {
            Some(rule) => {
                let _ = cluster::add_waiting(&mut store.cell(CellId::Cursor(rule)), -1);
                true
            }
            None => false,
        };
        let from_classes = self.leave_class(store, id);
        self.releasing.remove(&id);
        self.grpc.remove(&id);
        self.learning_held.remove(&id);
        from_queue || from_gate || from_grants || from_classes
    }

    /// Adaptive rule `rule`'s tally of this worker.
    pub fn tally(&mut self, rule: usize) -> Option<&mut Tally> {
        if self.tallies.len() <= rule {
            self.tallies.resize(rule.saturating_add(1), Tally::EMPTY);
        }
        self.tallies.get_mut(rule)
    }

    /// Every rule's tally with something in it, leaving zeros (the glue adds
    /// them to the shared ones; one it could not add goes back with
    /// [`Worker::keep_tally`]).
    pub fn take_tallies(&mut self) -> Vec<(usize, Tally)> {
        self.tallies
            .iter_mut()
            .enumerate()
            .filter(|(_, t)| **t != Tally::EMPTY)
            .map(|(i, t)| (i, std::mem::take(t)))
            .collect()
    }

    /// Puts back a tally that could not be added to the shared one.
    pub fn keep_tally(&mut self, rule: usize, t: &Tally) {
        if let Some(mine) = self.tally(rule) {
            mine.merge(t);
        }
    }

    /// Adaptive rules in enforce mode: a faster learned rate brings this
    /// worker's held requests of the rule forward (the learner moves the
    /// schedule's end alike, `adaptive::learner`); a slower one leaves them
    /// at the time they were promised. One load of the rule's cell per tick,
    /// only while the worker holds its requests.
    fn follow_learned_rates<S: Store>(&mut self, cfg: &Config, store: S, now: u64) {
        for (index, rule) in cfg.rules.iter().enumerate() {
            let (Some(a), Some(schedule)) = (rule.adaptive, rule.schedule) else {
                continue;
            };
            if a.mode != Mode::Enforce {
                continue;
            }
            if self.paced.len() <= index {
                self.paced.resize(index + 1, 0);
            }
            if !self.queue.holds_rule(index) {
                if let Some(p) = self.paced.get_mut(index) {
                    *p = 0;
                }
                continue;
            }
            let Ok((value, _)) = store.load(CellId::Rate(index)) else {
                continue;
            };
            let first = value.map_or(0, |[w, _]| w);
            let interval = interval_in(first, schedule.interval_ns);
            if let Some(p) = self.paced.get_mut(index) {
                if *p != 0 && interval < *p {
                    self.queue.retime(index, now, *p, interval);
                }
                *p = interval;
            }
        }
    }

    /// Returns `id`'s concurrency slot, if it holds one (idempotent). Returns
    /// the rule and whether a waiter's turn has come (so the glue can wake
    /// the workers at once instead of at their next tick).
    pub fn return_slot<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        id: u32,
    ) -> Option<(usize, bool)> {
        let rule = self.in_flight.remove(&id)?;
        let limit = cfg.rules.get(rule).and_then(|r| r.concurrency).unwrap_or(0);
        let woke = gate::leave(&mut store.cell(CellId::Gate(rule)), 1)
            .is_ok_and(|before| gate::lets_a_waiter_go(before, limit));
        Some((rule, woke))
    }

    /// The plan for a tick: requests whose turn came are resumed (rules with
    /// a concurrency limit send them on to their gate first); requests
    /// waiting for grants try again, oldest first; waiters whose ticket may
    /// go are resumed; waiters past their deadline are answered with a
    /// rejection.
    pub fn plan_tick<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        clock: &mut impl Clock,
    ) -> TickPlan {
        let mut plan = TickPlan::default();
        let now = clock.mono();
        if !self.queue.is_empty() {
            self.follow_learned_rates(cfg, store, now);
        }
        let back_on_grid = self.rate_releases(cfg, store, now, &mut plan);
        self.class_turns(cfg, store, clock, &mut plan);
        if !self.grants.is_empty() {
            self.grant_retries(cfg, store, clock, &mut plan);
        }
        // From the next tick on, with the others.
        self.wait_for_grants(back_on_grid);
        self.gate_turns(cfg, store, now, &mut plan);
        plan
    }

    /// Requests waiting for grants try again, each rule's oldest first; a
    /// rule stops at its first request that must still wait (later ones
    /// would too, and their deadlines are later). A request whose
    /// `max_queue_delay` ran out is rejected.
    fn grant_retries<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        clock: &mut impl Clock,
        plan: &mut TickPlan,
    ) {
        let now = clock.mono();
        let wall = clock.wall();
        let mut from = 0;
        while let Some(GrantWaiter {
            id,
            rule: index,
            since,
            deadline,
        }) = self.grants.first_from(from)
        {
            let Some(rule) = cfg.rules.get(index).filter(|r| r.cluster.is_some()) else {
                // Not a cluster rule of this configuration: left alone.
                from = index + 1;
                continue;
            };
            if now >= deadline {
                self.grants.cancel(id);
                let _ = cluster::add_waiting(&mut store.cell(CellId::Cursor(index)), -1);
                plan.actions.push(self.reject(cfg, id, index));
                continue;
            }
            let waited_ns = now.saturating_sub(since);
            let mut counts = Counts::NONE;
            let outcome = retry_grants(store, index, rule, now, wall, waited_ns, &mut counts);
            plan.merge(index, &counts);
            let (release_at, fallback) = match outcome {
                Outcome::Wait(Wait::Fallback { until, .. }) => (Some(until), true),
                Outcome::Wait(_) => {
                    from = index + 1;
                    continue;
                }
                Outcome::Go => (Some(now), false),
                Outcome::Hold { until } => (Some(until), false),
                Outcome::Reject { .. } | Outcome::Contention => (None, false),
            };
            self.grants.cancel(id);
            match release_at {
                Some(t) if t <= now => plan.actions.push(TickAction::Resume {
                    id,
                    rule: index,
                    waited_ns,
                }),
                Some(t) if fallback => self.queue.hold_fallback(id, index, since, t),
                Some(t) => self.queue.hold(id, index, since, t),
                None => plan.actions.push(self.reject(cfg, id, index)),
            }
        }
    }

    /// Only the rate part of a tick: requests whose turn came are resumed
    /// (rules with a concurrency limit send them on to their gate first).
    /// An exact timer can call it at each release time (the simulation
    /// does), leaving the retries and the gate to the regular tick.
    pub fn plan_releases<S: Store>(&mut self, cfg: &Config, store: S, now: u64) -> TickPlan {
        let mut plan = TickPlan::default();
        let back_on_grid = self.rate_releases(cfg, store, now, &mut plan);
        self.wait_for_grants(back_on_grid);
        plan
    }

    fn wait_for_grants(&mut self, waiters: Vec<GrantWaiter>) {
        for w in waiters {
            self.grants.wait(w.id, w.rule, w.since, w.deadline);
        }
    }

    /// Only the gate part of a tick: waiters whose turn came (a slot was
    /// returned somewhere in the process) and expired waiters.
    pub fn plan_gate<S: Store>(&mut self, cfg: &Config, store: S, now: u64) -> TickPlan {
        let mut plan = TickPlan::default();
        self.gate_turns(cfg, store, now, &mut plan);
        plan
    }

    pub(crate) fn reject(&self, cfg: &Config, id: u32, rule: usize) -> TickAction {
        let status = cfg.rules.get(rule).map_or(429, |r| r.reject_status);
        TickAction::Reply {
            id,
            rule,
            reply: rejection(status, 1, self.grpc.contains(&id), Vec::new()),
        }
    }

    /// Resumes the requests whose turn came; returns those held on a
    /// fallback schedule whose rule is back on the grid: they wait for
    /// grants (counted as waiting already).
    fn rate_releases<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        now: u64,
        plan: &mut TickPlan,
    ) -> Vec<GrantWaiter> {
        let mut back_on_grid = Vec::new();
        let mut due: Vec<Held> = Vec::new();
        self.queue.pop_due(now, &mut due);
        for r in due {
            let (id, index) = (r.context_id, r.rule);
            let Some(rule) = cfg.rules.get(index) else {
                continue;
            };
            if r.fallback && cluster::on_grid(&mut store.blob(BlobId::Grants(index))) {
                // Its turn was given on the fallback schedule, and the grid
                // is back: going now would add to the whole grid. It waits
                // for grants (first among them: it waited longest), within
                // what is left of its max_queue_delay.
                let deadline = r.held_at.saturating_add(rule.max_delay_ns);
                if cluster::add_waiting(&mut store.cell(CellId::Cursor(index)), 1).is_ok() {
                    back_on_grid.push(GrantWaiter {
                        id,
                        rule: index,
                        since: r.held_at,
                        deadline,
                    });
                } else {
                    plan.count(index, Stat::Contention, 1);
                    plan.actions.push(self.reject(cfg, id, index));
                }
                continue;
            }
            self.release(cfg, store, id, index, r.held_at, now, plan);
        }
        back_on_grid
    }

    /// A held request's turn came: resumed, or sent on to its rule's gate.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        id: u32,
        index: usize,
        held_at: u64,
        now: u64,
        plan: &mut TickPlan,
    ) {
        let Some(rule) = cfg.rules.get(index) else {
            return;
        };
        let resume = TickAction::Resume {
            id,
            rule: index,
            waited_ns: now.saturating_sub(held_at),
        };
        let Some(limit) = rule.concurrency else {
            plan.actions.push(resume);
            return;
        };
        match gate::enter(&mut store.cell(CellId::Gate(index)), limit, true) {
            Enter::Go => {
                self.in_flight.insert(id, index);
                plan.count(index, Stat::InFlight, 1);
                plan.actions.push(resume);
            }
            Enter::Wait { ticket } => {
                let deadline = held_at.saturating_add(rule.max_delay_ns);
                self.gate.wait(id, index, ticket, held_at, deadline);
            }
            Enter::Full | Enter::Contention => {
                plan.count(index, Stat::Contention, 1);
                plan.actions.push(self.reject(cfg, id, index));
            }
        }
    }

    fn gate_turns<S: Store>(&mut self, cfg: &Config, store: S, now: u64, plan: &mut TickPlan) {
        let mut ready: Vec<Waiter> = Vec::new();
        for index in self.gate.rules() {
            let Some(limit) = cfg.rules.get(index).and_then(|r| r.concurrency) else {
                continue;
            };
            let mut cell = store.cell(CellId::Gate(index));
            // Abandoned tickets whose turn came count as done, which may let
            // later tickets go: repeat until none is left below the bound.
            while let Ok(bound) = gate::go_bound(&mut cell, limit) {
                let abandoned = self.gate.turn_came(index, bound, &mut ready);
                // If this fails, the abandoned tickets stay counted as in
                // flight: the gate errs on the closed side.
                if abandoned == 0 || gate::leave(&mut cell, abandoned).is_err() {
                    break;
                }
            }
            for waiter in ready.drain(..) {
                self.in_flight.insert(waiter.context_id, index);
                plan.count(index, Stat::InFlight, 1);
                plan.actions.push(TickAction::Resume {
                    id: waiter.context_id,
                    rule: index,
                    waited_ns: now.saturating_sub(waiter.since),
                });
            }
        }
        let mut expired: Vec<Waiter> = Vec::new();
        self.gate.expired(now, &mut expired);
        for x in expired {
            plan.actions.push(self.reject(cfg, x.context_id, x.rule));
        }
    }

    /// Call just before carrying out a [`TickAction::Resume`]: records the
    /// wait for the response's `x-throttle-wait-ms` (the response may come
    /// while the resume is still running).
    pub fn resuming(&mut self, id: u32, waited_ns: u64) {
        self.waited.insert(id, waited_ns / NS_PER_MS);
    }

    /// The outcome of a [`TickAction::Resume`]: `ok` if the host resumed the
    /// stream (its wait is a `wait_ms` sample), false if it was gone (its
    /// slot, if any, is returned).
    pub fn resumed<S: Store>(&mut self, cfg: &Config, store: S, id: u32, ok: bool) -> Counts {
        self.grpc.remove(&id);
        let learning = self.learning_held.remove(&id);
        let mut c = Counts::of(&[(Stat::Held, -1)]);
        let class = self.releasing.remove(&id);
        if ok {
            if let Some(t) = learning.and_then(|rule| self.tally(rule)) {
                t.sent();
            }
            c.inc(Stat::Released);
            let waited = self.waited.get(&id).copied();
            if let Some(ms) = waited {
                c.record(Stat::WaitMs, ms);
            }
            if let Some(k) = class {
                c.add_class(k, crate::stats::ClassStat::Released, 1);
                if let Some(ms) = waited {
                    c.record_class(k, crate::stats::ClassStat::WaitMs, ms);
                }
            }
        } else {
            c.inc(Stat::Gone);
            self.waited.remove(&id);
            if self.return_slot(cfg, store, id).is_some() {
                c.add(Stat::InFlight, -1);
            }
        }
        c
    }

    /// The outcome of a [`TickAction::Reply`]: `ok` if the reply was sent,
    /// false if the stream was gone.
    pub fn replied(&mut self, id: u32, ok: bool) -> Counts {
        self.grpc.remove(&id);
        self.releasing.remove(&id);
        Counts::of(&[
            (Stat::Held, -1),
            (if ok { Stat::Rejected } else { Stat::Gone }, 1),
        ])
    }
}
