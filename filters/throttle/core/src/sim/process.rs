//! One simulated Envoy process on what ships: its VMs (one per worker, each
//! with the shipped [`Worker`] and, for cluster rules, its own calling side
//! [`Calls`] behind the process's lease) over one in-memory store that
//! behaves like Envoy's shared data, and every request's [`Stream`] driven
//! as the glue drives it (headers, tick actions, response, end of stream).
//!
//! The process has no decision logic of its own. It stands in for Envoy and
//! the glue only: it delivers callbacks, carries out tick plans, keeps the
//! counters as Envoy would (the process-wide sum of every VM's counts), and
//! records what became of each request ([`Record`]) for the invariants
//! ([`super::Trace`]). What each request took (a grid slot, a turn of the
//! fallback, credit) is read off the store's compare-and-swaps, as an
//! operator would read shared data.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use crate::clock::Fixed;
use crate::cluster::{Ahead, Call, Calls, Effects, Failure};
use crate::config::Config;
use crate::keys::KeyHasher;
use crate::matcher::{Facts, Request};
use crate::stats::{ClassStat, Counts, Stat};
use crate::store::{BlobId, CellId, Store, StoreError};
use crate::stream::{create_initial, Env, Stream, Verdict};
use crate::testing::host_clocks;
use crate::testing::{MemCells, MemStore};
use crate::worker::{TickAction, TickPlan, Worker};

/// What a compare-and-swap of the process's store took for a request: a
/// grid slot of a rule (its cursor moved past it), a turn of its fallback
/// schedule, or credit (the process's debt grew).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Slot(u64),
    Fallback,
    Credit,
    /// At its deadline, on a slot a failed call cost (one fewer forgiven).
    Forgiven,
}

/// The process's store: the in-memory cells, noting what each successful
/// compare-and-swap took.
#[derive(Clone, Copy)]
struct SimStore<'a> {
    mem: MemStore<'a>,
    taken: &'a RefCell<Vec<Taken>>,
}

impl std::fmt::Debug for SimStore<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimStore")
    }
}

impl Store for SimStore<'_> {
    fn load(&self, id: CellId) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        self.mem.load(id)
    }

    fn store(&self, id: CellId, value: [u64; 2], token: u32) -> Result<bool, StoreError> {
        let before = match id {
            CellId::Cursor(_) => self.mem.load(id)?.0.map_or(0, |[next, _]| next),
            CellId::Ahead(_) => Ahead::decode(self.mem.load(id)?.0).owed,
            CellId::Forgiven(_) => self.mem.load(id)?.0.map_or(0, |[count, _]| count),
            _ => 0,
        };
        let stored = self.mem.store(id, value, token)?;
        if stored {
            let taken = match id {
                CellId::Cursor(_) if value[0] > before => Some(Taken::Slot(value[0] - 1)),
                CellId::Fallback(_) => Some(Taken::Fallback),
                CellId::Ahead(_) if Ahead::decode(Some(value)).owed > before => Some(Taken::Credit),
                CellId::Forgiven(_) if value[0] < before => Some(Taken::Forgiven),
                _ => None,
            };
            self.taken.borrow_mut().extend(taken);
        }
        Ok(stored)
    }

    fn load_blob(&self, id: BlobId) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        self.mem.load_blob(id)
    }

    fn store_blob(&self, id: BlobId, value: &[u8], token: u32) -> Result<bool, StoreError> {
        self.mem.store_blob(id, value, token)
    }
}

/// A simulated request: `GET <path>` with the rule's header (`x-sim-rule`),
/// a key (`x-sim-key`) and a class (`x-priority`), as the scenario says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRequest {
    pub rule: usize,
    pub key: Option<u32>,
    pub class: Option<String>,
}

impl Request for SimRequest {
    fn path(&mut self) -> Option<Vec<u8>> {
        Some(b"/".to_vec())
    }
    fn method(&mut self) -> Option<Vec<u8>> {
        Some(b"GET".to_vec())
    }
    fn authority(&mut self) -> Option<Vec<u8>> {
        Some(b"sim".to_vec())
    }
    fn header(&mut self, name: &str) -> Option<Vec<u8>> {
        match name {
            "x-sim-rule" => Some(self.rule.to_string().into_bytes()),
            "x-sim-key" => self.key.map(|k| k.to_string().into_bytes()),
            "x-priority" => self.class.as_ref().map(|c| c.clone().into_bytes()),
            _ => None,
        }
    }
    fn source_address(&mut self) -> Option<String> {
        None
    }
    fn principal(&mut self) -> Option<String> {
        None
    }
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Not decided yet (held at the end of the run).
    Pending,
    /// Sent upstream at true time `at`: at once (`held` false) or at its turn.
    Released {
        at: u64,
        held: bool,
        slot: Option<u64>,
        credit: bool,
    },
    /// Answered by the filter with its rejection at true time `at`: at
    /// arrival (`held` false), or after it was held (a late refusal).
    Refused {
        at: u64,
        held: bool,
        displaced: bool,
    },
    /// Its client went away while it was held.
    Cancelled { at: u64 },
}

/// One request and what became of it (true times, ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub proxy: usize,
    pub vm: usize,
    /// The rule the scenario meant it for (the filter's rule is the same:
    /// the `x-sim-rule` header matches it).
    pub rule: usize,
    pub key: Option<u32>,
    /// Its class's index in the rule, if the rule has classes.
    pub class: Option<usize>,
    pub arrived: u64,
    pub end: End,
}

/// A request the process has not finished with.
#[derive(Debug)]
struct Live {
    stream: Stream,
    vm: usize,
    /// Index in the fleet's records.
    record: usize,
    held: bool,
    taken: Option<Taken>,
}

/// One VM: a worker's state and its calling side.
#[derive(Debug)]
pub struct Vm {
    pub worker: Worker,
    pub calls: Option<Calls>,
}

/// What the process asks the world to do after a callback.
#[derive(Debug, Default)]
pub struct Out {
    /// Calls to send: (vm, call).
    pub calls: Vec<(usize, Call)>,
    /// Requests sent upstream now: their stream ids (the world answers them).
    pub upstream: Vec<u32>,
    /// Records finished now: (record index, how).
    pub ended: Vec<(usize, End)>,
    /// The calling side's problems for the log.
    pub problems: Vec<String>,
}

/// One simulated Envoy process.
#[derive(Debug)]
pub struct Process {
    pub config: Config,
    hasher: KeyHasher,
    cells: RefCell<MemCells>,
    taken: RefCell<Vec<Taken>>,
    pub vms: Vec<Vm>,
    live: HashMap<u32, Live>,
    next_id: u32,
    /// The process's statistics by (rule, stat), as Envoy holds them (the sum
    /// of every VM's counts).
    totals: BTreeMap<(usize, Stat), i64>,
    /// Class statistics by (rule, class, stat).
    class_totals: BTreeMap<(usize, usize, ClassStat), i64>,
    /// Envoy's counters: what the VMs have flushed (at their ticks).
    flushed: BTreeMap<(usize, Stat), i64>,
    /// Per VM, its counts not flushed yet.
    pending: Vec<BTreeMap<(usize, Stat), i64>>,
    /// This host's wall clock minus the true time, ns.
    pub skew_ns: i64,
    /// Every range granted (caller rule index, [start, end)), in the fleet's frame.
    pub granted: Vec<(usize, (u64, u64))>,
    /// Engine calls sent, and failed.
    pub calls: u64,
    pub failures: u64,
    /// Takes the process could not match to a request (always 0 if sound).
    pub unmatched: u64,
    /// Changes to stats their rule does not define (the glue would drop
    /// them): (rule, stat). Always empty if the stats' feature column is
    /// right.
    pub strays: Vec<(usize, String)>,
    /// Log lines (warn) of the calling side: (true time, line).
    pub log: Vec<(u64, String)>,
}

impl Process {
    /// A process running `config` with `vms` worker VMs, its clock `skew_ns`
    /// off the true time. Each VM gets a calling side if the configuration
    /// has cluster rules (the lease picks the one that calls).
    pub fn new(config: &Config, vms: usize, skew_ns: i64, seed: u64) -> Process {
        // VM 0 is the main thread's: it never has a request, ticks every
        // 20 ms, and was configured first (it usually holds the lease).
        let n = vms.max(1) + 1;
        let vms = (0..n)
            .map(|i| Vm {
                worker: Worker::new(),
                calls: Calls::new(
                    config,
                    i as u64 + 1,
                    (seed.wrapping_mul(31) + i as u64 * 277) % 1000,
                ),
            })
            .collect();
        let p = Process {
            config: config.clone(),
            hasher: KeyHasher::new((seed | 1, 11)),
            cells: RefCell::default(),
            taken: RefCell::default(),
            vms,
            live: HashMap::new(),
            next_id: 1,
            totals: BTreeMap::new(),
            class_totals: BTreeMap::new(),
            flushed: BTreeMap::new(),
            pending: vec![BTreeMap::new(); n],
            skew_ns,
            granted: Vec::new(),
            calls: 0,
            failures: 0,
            unmatched: 0,
            strays: Vec::new(),
            log: Vec::new(),
        };
        // As the glue does on configure (the main thread's VM, first).
        create_initial(p.mem(), &p.config);
        p.cells.borrow_mut().configured();
        p
    }

    fn mem(&self) -> MemStore<'_> {
        MemStore(&self.cells)
    }

    /// This host's clock at true time `t`.
    pub fn clock(&self, t: u64) -> u64 {
        t.saturating_add_signed(self.skew_ns)
    }

    /// This host's monotonic clock at true time `t`.
    pub fn mono(&self, t: u64) -> u64 {
        self.clocks(t).mono
    }

    /// Both clocks at true time `t` ([`host_clocks`]).
    fn clocks(&self, t: u64) -> Fixed {
        host_clocks(t, self.skew_ns)
    }

    fn true_time(&self, local: u64) -> u64 {
        local.saturating_add_signed(-self.skew_ns)
    }

    /// The cells written without a token since configure, but key slots.
    pub fn unguarded_writes(&self) -> Vec<(String, u32)> {
        self.cells.borrow().unguarded_writes()
    }

    /// The store's faults: every access fails (the host's shared data broke).
    pub fn break_store(&self, broken: bool) {
        self.cells.borrow_mut().broken = broken;
    }

    /// A statistic's total (what Envoy would show), by rule.
    pub fn total(&self, rule: usize, stat: Stat) -> i64 {
        self.totals.get(&(rule, stat)).copied().unwrap_or(0)
    }

    /// A class statistic's total.
    pub fn class_total(&self, rule: usize, class: usize, stat: ClassStat) -> i64 {
        self.class_totals
            .get(&(rule, class, stat))
            .copied()
            .unwrap_or(0)
    }

    /// Requests held now (every VM).
    pub fn held(&self) -> usize {
        self.vms.iter().map(|v| v.worker.held()).sum()
    }

    /// Whether VM `vm` needs its fast tick (it holds something).
    pub fn needs_ticks(&self, vm: usize) -> bool {
        self.vms.get(vm).is_some_and(|v| v.worker.needs_ticks())
    }

    /// Counts of VM `vm`: the process's totals at once (what the checks
    /// read), and Envoy's counters when the VM next flushes (what the
    /// calling side reads, as the glue reads the host's counter).
    fn count(&mut self, vm: usize, rule: usize, counts: &Counts) {
        // The glue defines only the stats of the rule's features: a change
        // to another would be dropped.
        if let Some(stray) = self.config.rules.get(rule).and_then(|r| counts.stray(r)) {
            self.strays.push((rule, stray));
        }
        for (stat, delta) in counts.iter() {
            *self.totals.entry((rule, stat)).or_default() += i64::from(delta);
            if let Some(p) = self.pending.get_mut(vm) {
                *p.entry((rule, stat)).or_default() += i64::from(delta);
            }
        }
        for (class, stat, delta) in counts.iter_classes() {
            *self.class_totals.entry((rule, class, stat)).or_default() += i64::from(delta);
        }
    }

    /// A request arrives on VM `vm` at true time `t`; `record` is its index
    /// in the fleet's records. Returns what it became at once (None: held)
    /// and the stream id.
    pub fn arrive(
        &mut self,
        t: u64,
        vm: usize,
        req: SimRequest,
        record: usize,
        out: &mut Out,
    ) -> Option<u32> {
        let vm = vm.min(self.vms.len().saturating_sub(1));
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let mut stream = Stream::new(id);
        let mut clock = self.clocks(t);
        self.taken.borrow_mut().clear();
        let d = {
            let env = Env {
                config: &self.config,
                hasher: &self.hasher,
                store: sim_store(&self.cells, &self.taken),
            };
            let worker = &mut self.vms.get_mut(vm)?.worker;
            stream.on_request(env, worker, &mut Facts::new(req), &mut clock)
        };
        let taken = self.taken.borrow_mut().pop();
        self.taken.borrow_mut().clear();
        if let Some(rule) = d.rule {
            self.count(vm, rule, &d.counts);
        }
        match d.verdict {
            Verdict::Continue => {
                out.ended.push((
                    record,
                    End::Released {
                        at: t,
                        held: false,
                        slot: slot_of(taken),
                        credit: taken == Some(Taken::Credit),
                    },
                ));
                if d.rule.is_some() {
                    out.upstream.push(id);
                    self.live.insert(
                        id,
                        Live {
                            stream,
                            vm,
                            record,
                            held: false,
                            taken,
                        },
                    );
                }
            }
            Verdict::Hold => {
                self.live.insert(
                    id,
                    Live {
                        stream,
                        vm,
                        record,
                        held: true,
                        taken,
                    },
                );
            }
            Verdict::Reply(_) => {
                out.ended.push((
                    record,
                    End::Refused {
                        at: t,
                        held: false,
                        displaced: false,
                    },
                ));
                // The local reply's response, then the end of the stream.
                self.finish(t, stream, vm, out);
            }
        }
        Some(id)
    }

    /// The upstream answered stream `id` at true time `t` (its response
    /// ends with its headers), then the stream ends.
    pub fn answered(&mut self, t: u64, id: u32, out: &mut Out) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        self.finish(t, live.stream, live.vm, out);
    }

    /// The response and the end of a stream the filter no longer holds; a
    /// gate slot given back wakes the waiters of every VM (the glue's wake
    /// queue: they go now, not at their next tick).
    fn finish(&mut self, t: u64, mut stream: Stream, vm: usize, out: &mut Out) {
        let mut wake = false;
        let (counts_h, counts_d, rule) = {
            let env = Env {
                config: &self.config,
                hasher: &self.hasher,
                store: sim_store(&self.cells, &self.taken),
            };
            let Some(worker) = self.vms.get_mut(vm).map(|v| &mut v.worker) else {
                return;
            };
            let h = stream.on_response_headers(env, worker, || 0, true);
            let d = stream.on_done(env, worker);
            wake |= h.wake || d.wake;
            (h.counts, d.counts, stream.rule())
        };
        self.taken.borrow_mut().clear();
        if let Some(rule) = rule {
            self.count(vm, rule, &counts_h);
            self.count(vm, rule, &counts_d);
        }
        if wake {
            self.wake(t, out);
        }
    }

    /// The glue's wake queues: every VM runs its wake plan at true time `t`
    /// (a returned concurrency slot, or a grant passed on to another VM's
    /// ticket), again while a plan wakes them.
    fn wake(&mut self, t: u64, out: &mut Out) {
        // Each further wake settles an abandoned ticket: a bound only
        // against a loop.
        for _ in 0..1000 {
            let mut again = false;
            for v in 0..self.vms.len() {
                let mut clock = self.clocks(t);
                let plan = {
                    let store = sim_store(&self.cells, &self.taken);
                    let Some(worker) = self.vms.get_mut(v).map(|x| &mut x.worker) else {
                        continue;
                    };
                    worker.plan_wake(&self.config, store, &mut clock)
                };
                again |= plan.wake;
                self.taken.borrow_mut().clear();
                self.carry_out(t, v, plan, out);
            }
            if !again {
                break;
            }
        }
    }

    /// The client of stream `id` gives up at true time `t` (if the filter
    /// still holds it, it is cancelled).
    pub fn client_gone(&mut self, t: u64, id: u32, out: &mut Out) {
        let Some(live) = self.live.get(&id) else {
            return;
        };
        if !live.held {
            return;
        }
        let Some(mut live) = self.live.remove(&id) else {
            return;
        };
        let (counts, rule) = {
            let env = Env {
                config: &self.config,
                hasher: &self.hasher,
                store: sim_store(&self.cells, &self.taken),
            };
            let Some(worker) = self.vms.get_mut(live.vm).map(|v| &mut v.worker) else {
                return;
            };
            let d = live.stream.on_done(env, worker);
            (d.counts, live.stream.rule())
        };
        self.taken.borrow_mut().clear();
        if let Some(rule) = rule {
            self.count(live.vm, rule, &counts);
        }
        out.ended.push((live.record, End::Cancelled { at: t }));
    }

    /// One tick of VM `vm` at true time `t`: the worker's plan, carried out,
    /// its counts flushed to Envoy's counters, then the calling side's tick
    /// (the glue's order).
    pub fn tick(&mut self, t: u64, vm: usize, out: &mut Out) {
        if vm >= self.vms.len() {
            return;
        }
        let mut clock = self.clocks(t);
        self.taken.borrow_mut().clear();
        let plan = {
            let store = sim_store(&self.cells, &self.taken);
            let Some(worker) = self.vms.get_mut(vm).map(|v| &mut v.worker) else {
                return;
            };
            worker.plan_tick(&self.config, store, &mut clock)
        };
        // The lines' grants take slots for tickets, not for a request of
        // their own: a request released on a grant is not matched to a slot.
        self.taken.borrow_mut().clear();
        let wake = plan.wake;
        self.carry_out(t, vm, plan, out);
        if wake {
            self.wake(t, out);
        }
        if let Some(p) = self.pending.get_mut(vm) {
            for (k, d) in std::mem::take(p) {
                *self.flushed.entry(k).or_default() += d;
            }
        }
        self.calling_tick(t, vm, out);
    }

    fn carry_out(&mut self, t: u64, vm: usize, plan: TickPlan, out: &mut Out) {
        for (rule, counts) in &plan.counts {
            self.count(vm, *rule, counts);
        }
        for action in plan.actions {
            match action {
                TickAction::Resume {
                    id,
                    rule,
                    waited_ns,
                } => {
                    let c = {
                        let store = sim_store(&self.cells, &self.taken);
                        let Some(worker) = self.vms.get_mut(vm).map(|v| &mut v.worker) else {
                            continue;
                        };
                        worker.resuming(id, waited_ns);
                        worker.resumed(&self.config, store, id, true)
                    };
                    self.count(vm, rule, &c);
                    if let Some(l) = self.live.get_mut(&id) {
                        l.held = false;
                        out.ended.push((
                            l.record,
                            End::Released {
                                at: t,
                                held: true,
                                slot: slot_of(l.taken),
                                credit: l.taken == Some(Taken::Credit),
                            },
                        ));
                        out.upstream.push(id);
                    }
                }
                TickAction::Reply { id, rule, .. } => {
                    let c = {
                        let Some(worker) = self.vms.get_mut(vm).map(|v| &mut v.worker) else {
                            continue;
                        };
                        worker.replied(id, true)
                    };
                    self.count(vm, rule, &c);
                    if let Some(live) = self.live.remove(&id) {
                        // A class's waiter answered on tick was displaced
                        // (pushed back by higher classes, or its deadline passed).
                        let displaced = live.stream.class().is_some();
                        out.ended.push((
                            live.record,
                            End::Refused {
                                at: t,
                                held: true,
                                displaced,
                            },
                        ));
                        self.finish(t, live.stream, live.vm, out);
                    }
                }
            }
        }
        self.taken.borrow_mut().clear();
    }

    /// The calling side of VM `vm` on its tick (only the lease holder calls).
    fn calling_tick(&mut self, t: u64, vm: usize, out: &mut Out) {
        let mut clock = self.clocks(t);
        let totals = self.flushed.clone();
        let effects = {
            let store = sim_store(&self.cells, &self.taken);
            let Some(calls) = self.vms.get_mut(vm).and_then(|v| v.calls.as_mut()) else {
                return;
            };
            calls.on_tick(store, &mut clock, &|rule, stat| {
                u64::try_from(totals.get(&(rule, stat)).copied().unwrap_or(0)).unwrap_or(0)
            })
        };
        self.taken.borrow_mut().clear();
        self.apply(t, vm, effects, out);
    }

    /// The answer to VM `vm`'s call in flight, at true time `t`.
    pub fn answer(
        &mut self,
        t: u64,
        vm: usize,
        answer: Result<(u16, &[u8]), Failure>,
        out: &mut Out,
    ) {
        let mut clock = self.clocks(t);
        let totals = self.flushed.clone();
        let (effects, failed) = {
            let store = sim_store(&self.cells, &self.taken);
            let Some(calls) = self.vms.get_mut(vm).and_then(|v| v.calls.as_mut()) else {
                return;
            };
            if !calls.caller().in_flight() {
                return;
            }
            let before = failures_of(calls);
            let e = calls.on_answer(store, &mut clock, answer, &|rule, stat| {
                u64::try_from(totals.get(&(rule, stat)).copied().unwrap_or(0)).unwrap_or(0)
            });
            (e, failures_of(calls) > before)
        };
        if failed {
            self.failures += 1;
        }
        self.taken.borrow_mut().clear();
        self.apply(t, vm, effects, out);
    }

    /// Counts what a calling side reports, notes what it granted (in the
    /// fleet's frame) and passes its call on.
    fn apply(&mut self, t: u64, vm: usize, e: Effects, out: &mut Out) {
        for (rule, counts) in &e.counts {
            self.count(vm, *rule, counts);
        }
        for line in &e.problems {
            self.log.push((t, line.clone()));
        }
        out.problems.extend(e.problems.iter().cloned());
        if let Some(calls) = self.vms.get(vm).and_then(|v| v.calls.as_ref()) {
            for u in &e.published {
                let caller = calls.caller();
                let offset = caller.clock_offset_epochs(u.rule).unwrap_or(0);
                let shift = caller.grid(u.rule).map_or(0, |g| g.shift_slots(offset));
                self.granted.extend(u.ranges.iter().map(|&(a, b)| {
                    (
                        u.rule,
                        (
                            a.saturating_add_signed(-shift),
                            b.saturating_add_signed(-shift),
                        ),
                    )
                }));
            }
        }
        if let Some(call) = e.call {
            self.calls += 1;
            out.calls.push((vm, call));
        }
    }

    /// The calling side of VM `vm`, if any.
    pub fn calls(&self, vm: usize) -> Option<&Calls> {
        self.vms.get(vm).and_then(|v| v.calls.as_ref())
    }

    /// The true time of this host's clock reading `local`.
    pub fn true_of(&self, local: u64) -> u64 {
        self.true_time(local)
    }

    /// Requests the process still has (held, or upstream).
    pub fn live(&self) -> usize {
        self.live.len()
    }
}

fn sim_store<'a>(cells: &'a RefCell<MemCells>, taken: &'a RefCell<Vec<Taken>>) -> SimStore<'a> {
    SimStore {
        mem: MemStore(cells),
        taken,
    }
}

fn slot_of(t: Option<Taken>) -> Option<u64> {
    match t {
        Some(Taken::Slot(k)) => Some(k),
        _ => None,
    }
}

fn failures_of(calls: &Calls) -> u64 {
    let c = calls.caller();
    (0..c.rule_count())
        .filter_map(|i| c.stats(i))
        .map(|s| s.failures)
        .sum()
}
