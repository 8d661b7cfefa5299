//! One worker's state (its held requests, waiters at concurrency gates, slots
//! in flight) and the plan for each tick, returned as data: which requests to
//! resume and which to answer. The glue carries out the plan and reports each
//! outcome back ([`Worker::resumed`], [`Worker::replied`]), which returns the
//! counters to move.
//!
//! Only the worker that paused a request can resume it, so each worker has
//! its own state; the schedules and gates it consults are process-wide
//! ([`Store`]).

use std::collections::{HashMap, HashSet};

use crate::adaptive::learner::interval_in;
use crate::adaptive::{Mode, Tally};
use crate::classes::{tickets, ClassWaiter, ClassWaiters};
use crate::clock::Clock;
use crate::clock::NS_PER_MS;
use crate::cluster;
use crate::config::Config;
use crate::gate::{self, Enter, GateWaiters, Waiter};
use crate::queue::{Held, HeldQueue, Room};
use crate::reply::{rejection, Reply};
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Store};

mod lines;

pub use lines::{CHECK_EVERY_NS, GRANTS_IN_FLIGHT};

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
    /// A grant went on to a ticket another worker holds (an abandoned
    /// ticket's slot, passed on): the glue wakes the workers (their wake
    /// queues, [`Worker::plan_wake`]) so it leaves now, not at that
    /// worker's next tick (a run of abandoned tickets held by several
    /// workers in turn took a tick per worker, fleet sweep seed 294).
    pub wake: bool,
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

    /// The worker's waiting rooms: held for a rate's turn, for a
    /// concurrency slot, for a ticket of a rule's line.
    fn rooms(&self) -> [&dyn Room; 3] {
        [&self.queue, &self.gate, &self.classes]
    }

    /// Requests held now, in any room.
    pub fn held(&self) -> usize {
        self.rooms().iter().map(|r| r.len()).sum()
    }

    /// Whether `id` is held now.
    pub fn holds(&self, id: u32) -> bool {
        self.rooms().iter().any(|r| r.contains(id))
    }

    /// Whether anything needs the tick.
    pub fn needs_ticks(&self) -> bool {
        self.rooms().iter().any(|r| r.needs_ticks())
    }

    /// Stops holding `id` (its stream ended, or Envoy answered it): removes it
    /// from the queue, the gate (an abandoned ticket is counted at its turn)
    /// or its line (its ticket is abandoned). Returns whether it was held.
    pub fn unhold<S: Store>(&mut self, store: S, id: u32) -> bool {
        let from_queue = self.queue.cancel(id).is_some();
        let from_gate = self.gate.cancel(id).is_some();
        let from_classes = self.leave_class(store, id);
        self.releasing.remove(&id);
        self.grpc.remove(&id);
        self.learning_held.remove(&id);
        from_queue || from_gate || from_classes
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
    /// a concurrency limit send them on to their gate first); the lines grant
    /// their due slots and resume the waiters whose ticket was granted;
    /// waiters past their deadline go on credit (cluster scope) or are
    /// answered with a rejection.
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
        self.rate_releases(cfg, store, now, &mut plan);
        self.lines_and_gate(cfg, store, clock, now, &mut plan);
        plan
    }

    /// Only the rate part of a tick: requests whose turn came are resumed
    /// (rules with a concurrency limit send them on to their gate first).
    /// An exact timer can call it at each release time (the simulation
    /// does), leaving the retries and the gate to the regular tick.
    pub fn plan_releases<S: Store>(&mut self, cfg: &Config, store: S, now: u64) -> TickPlan {
        let mut plan = TickPlan::default();
        self.rate_releases(cfg, store, now, &mut plan);
        plan
    }

    /// The plan for a wake (the glue's wake queue): the lines (a grant
    /// another worker passed on to a ticket here leaves now, or goes on)
    /// and the gate (a concurrency slot was returned somewhere in the
    /// process), as on a tick.
    pub fn plan_wake<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        clock: &mut impl Clock,
    ) -> TickPlan {
        let mut plan = TickPlan::default();
        let now = clock.mono();
        self.lines_and_gate(cfg, store, clock, now, &mut plan);
        plan
    }

    /// The class lines' and the gate's part of a tick (`now`: the tick's
    /// monotonic time), also run on a wake.
    fn lines_and_gate<S: Store>(
        &mut self,
        cfg: &Config,
        store: S,
        clock: &mut impl Clock,
        now: u64,
        plan: &mut TickPlan,
    ) {
        self.class_turns(cfg, store, clock, plan);
        self.gate_turns(cfg, store, now, plan);
    }

    /// Only the gate part of a tick: waiters whose turn came (a slot was
    /// returned somewhere in the process) and expired waiters.
    pub fn plan_gate<S: Store>(&mut self, cfg: &Config, store: S, now: u64) -> TickPlan {
        let mut plan = TickPlan::default();
        self.gate_turns(cfg, store, now, &mut plan);
        plan
    }

    /// The rule's rejection of request `id`, answered on a tick (gRPC if
    /// the request was), with `Retry-After: retry_after_s`.
    pub(crate) fn reject(
        &self,
        cfg: &Config,
        id: u32,
        rule: usize,
        retry_after_s: u64,
    ) -> TickAction {
        let status = cfg.rules.get(rule).map_or(429, |r| r.reject_status);
        TickAction::Reply {
            id,
            rule,
            reply: rejection(status, retry_after_s, self.grpc.contains(&id), Vec::new()),
        }
    }

    /// Resumes the requests whose turn came; those held on a fallback
    /// schedule whose rule is back on the grid join the rule's line instead.
    fn rate_releases<S: Store>(&mut self, cfg: &Config, store: S, now: u64, plan: &mut TickPlan) {
        let mut due: Vec<Held> = Vec::new();
        self.queue.pop_due(now, &mut due);
        for r in due {
            let (id, index) = (r.context_id, r.rule);
            let Some(rule) = cfg.rules.get(index) else {
                continue;
            };
            if r.fallback && cluster::on_grid(&mut store.blob(BlobId::Grants(index))) {
                // Its turn was given on the fallback schedule, and the grid
                // is back: going now would add to the whole grid. It joins
                // the rule's line, within what is left of its max_queue_delay
                // (at its deadline, credit if the proxy may).
                let deadline = r.held_at.saturating_add(rule.max_delay_ns);
                let ticket =
                    tickets::take_ticket(&mut store.blob(BlobId::Classes(index)), 0, now, |_| true);
                match ticket {
                    Ok((_, Some(ticket))) => {
                        let _ = cluster::add_waiting(&mut store.cell(CellId::Cursor(index)), 1);
                        self.classes.wait(ClassWaiter {
                            context_id: id,
                            rule: index,
                            class: 0,
                            ticket,
                            since: r.held_at,
                            deadline,
                            dry: false,
                        });
                    }
                    _ => {
                        plan.count(index, Stat::Contention, 1);
                        plan.actions.push(self.reject(cfg, id, index, 1));
                    }
                }
                continue;
            }
            self.release(cfg, store, id, index, r.held_at, now, plan);
        }
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
                plan.actions.push(self.reject(cfg, id, index, 1));
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
            plan.actions.push(self.reject(cfg, x.context_id, x.rule, 1));
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
