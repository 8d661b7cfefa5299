//! Simulation support: an engine that models the rate limit service, and
//! simulated proxies that run what ships — the [`Stream`] of each request,
//! the [`Worker`] and its ticks, the calling side ([`Calls`]) — on the
//! in-memory store, with a virtual-time world for property tests. The driver
//! in `perf/cluster-sim` runs the same [`SimProxy`] against the real service
//! in real time.
//!
//! The simulation has no decision logic of its own. Two things stand in for
//! the glue and Envoy: the timer (a proxy's worker ticks at every tick of the
//! world while it holds anything, and releases exactly at each held
//! request's release time: the glue's tick jitter is measured against real
//! Envoy instead), and the observation of which grid slot each request used
//! (read from the cursor's compare-and-swap in the store, as an operator
//! would read shared data).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use serde_json::{json, Value};

pub use crate::sim::engine::FakeEngine;

use crate::clock::{Fixed, NS_PER_MS};
use crate::config::{self, Config, EngineConfig, OnEngineFailure};
use crate::keys::KeyHasher;
use crate::matcher::{Facts, Request};
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Store, StoreError};
use crate::stream::{create_initial, Env, Stream, Verdict};
use crate::testing::{host_clocks, MemCells, MemStore, MONO_BEHIND_NS};
use crate::worker::{TickAction, TickPlan, Worker};

use super::ahead::Ahead;
use super::caller::{Call, Caller};
use super::calls::{Calls, Effects};
use super::engine::Failure;
use super::grid::WINDOW_NS;

/// One cluster rule of a simulated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRule {
    pub name: String,
    pub rate_per_s: u64,
    pub burst: u64,
    pub max_queue_delay_ms: u64,
    pub expected_replicas: u32,
    pub on_engine_failure: OnEngineFailure,
}

fn duration(ns: u64) -> String {
    if ns % NS_PER_MS == 0 {
        format!("{}ms", ns / NS_PER_MS)
    } else {
        format!("{}ms", ns as f64 / NS_PER_MS as f64)
    }
}

/// The configuration of `rules` (all `scope: cluster`) with `engine`, as a
/// user would write it, validated as the filter validates it. With several
/// rules, a request of rule `i` carries the header `x-sim-rule: i`.
pub fn config(engine: &EngineConfig, rules: &[SimRule]) -> Result<Config, String> {
    let several = rules.len() > 1;
    let rules: Vec<Value> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut rule = json!({
                "name": r.name,
                "rate": format!("{}/s", r.rate_per_s),
                "burst": r.burst,
                "max_queue_delay": format!("{}ms", r.max_queue_delay_ms),
                "scope": "cluster",
                "expected_replicas": r.expected_replicas,
                "on_engine_failure": match r.on_engine_failure {
                    OnEngineFailure::LocalShare => "local_share",
                    OnEngineFailure::Deny => "deny",
                    OnEngineFailure::LocalFull => "local_full",
                },
            });
            if several {
                if let Some(obj) = rule.as_object_mut() {
                    obj.insert(
                        "match".into(),
                        json!({"headers": {"x-sim-rule": i.to_string()}}),
                    );
                }
            }
            rule
        })
        .collect();
    let json = json!({
        "engine": {
            "cluster": engine.cluster,
            "timeout": duration(engine.timeout_ns),
            "fallback_after": duration(engine.fallback_after_ns),
            "domain": engine.domain,
            "max_clock_skew": duration(engine.max_clock_skew_ns),
        },
        "rules": rules,
    });
    config::parse(json.to_string().as_bytes()).map_err(|errors| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// What happened to one request when it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Continued at once, on grid slot `slot` (None: local fallback).
    Released { slot: Option<u64> },
    /// Held: until its turn, or waiting for grants (released or rejected later).
    Held,
    /// Rejected at once.
    Rejected,
}

/// A released request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub rule: usize,
    /// True wall time the upstream sees it.
    pub at: u64,
    /// True wall time it arrived.
    pub arrived: u64,
    pub slot: Option<u64>,
    /// It went on credit (no slot: the process's next grants repay it).
    pub credit: bool,
}

/// What a compare-and-swap of a proxy's store took: a grid slot of a rule
/// (the cursor moved past it), or a turn of a rule's fallback schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    Slot(u64),
    Fallback,
    /// A request went on credit (the process's debt grew).
    Credit,
    /// A request went at its deadline on a slot a failed call cost (one
    /// fewer forgiven).
    Forgiven,
}

/// The in-memory store of one proxy, noting what each successful
/// compare-and-swap took. Workers only move a cursor forward (a take); the
/// calling VM only moves it back (publishing ranges below it).
#[derive(Clone, Copy)]
struct SimStore<'a> {
    mem: MemStore<'a>,
    taken: &'a RefCell<Vec<Taken>>,
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

/// A request of rule `.0`: `GET /` with the header `x-sim-rule: <rule>`,
/// nothing allocated unless a rule reads it.
struct SimRequest(usize);

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
        (name == "x-sim-rule").then(|| self.0.to_string().into_bytes())
    }
    fn source_address(&mut self) -> Option<String> {
        None
    }
    fn principal(&mut self) -> Option<String> {
        None
    }
}

/// A request the worker holds: its true arrival time, and what it took
/// (None: nothing yet, it waits for grants).
#[derive(Debug, Clone, Copy)]
struct HeldRequest {
    arrived: u64,
    taken: Option<Taken>,
}

/// One simulated Envoy process with one worker: its shared data, the
/// worker's state, its requests' streams, and its calling VM.
#[derive(Debug)]
pub struct SimProxy {
    config: Config,
    hasher: KeyHasher,
    cells: RefCell<MemCells>,
    taken: RefCell<Vec<Taken>>,
    worker: Worker,
    calling: Calls,
    held: HashMap<u32, HeldRequest>,
    next_id: u32,
    /// The process's statistics by (rule, stat), as Envoy would hold them.
    totals: BTreeMap<(usize, Stat), u64>,
    /// This host's wall clock minus the true time, ns.
    pub skew_ns: i64,
    pub releases: Vec<Release>,
    /// Every range granted to this proxy: (caller rule, [start, end)).
    pub granted: Vec<(usize, (u64, u64))>,
    /// Requests rejected: at once, or when a retry found their turn too far.
    pub rejected: u64,
    /// Requests that waited for grants until max_queue_delay and were rejected then.
    pub timed_out: u64,
    pub calls: u64,
    pub failures: u64,
    /// Takes the simulation could not match to a request (always 0: checked by the tests).
    pub unmatched: u64,
}

impl std::fmt::Debug for SimStore<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimStore")
    }
}

impl SimProxy {
    /// A proxy running `config` (its cluster rules), its clock `skew_ns`
    /// off the true time. Err: the configuration has no cluster rule or no
    /// engine.
    pub fn new(config: &Config, skew_ns: i64) -> Result<SimProxy, String> {
        let calling = Calls::new(config, 1, 0)
            .ok_or("the configuration has no cluster rule with an engine")?;
        let proxy = SimProxy {
            config: config.clone(),
            hasher: KeyHasher::new((7, 11)),
            cells: RefCell::default(),
            taken: RefCell::default(),
            worker: Worker::new(),
            calling,
            held: HashMap::new(),
            next_id: 1,
            totals: BTreeMap::new(),
            skew_ns,
            releases: Vec::new(),
            granted: Vec::new(),
            rejected: 0,
            timed_out: 0,
            calls: 0,
            failures: 0,
            unmatched: 0,
        };
        // As the glue does on configure.
        create_initial(proxy.store(), &proxy.config);
        proxy.cells.borrow_mut().configured();
        proxy.taken.borrow_mut().clear();
        Ok(proxy)
    }

    /// Sets the calling VM's phase (see [`Caller::with_phase`]).
    pub fn with_phase(mut self, permille: u64) -> SimProxy {
        if let Some(calling) = Calls::new(&self.config, 1, permille) {
            self.calling = calling;
        }
        self
    }

    /// The calling VM's caller (its statistics, whether a call is in flight).
    pub fn caller(&self) -> &Caller {
        self.calling.caller()
    }

    /// This host's wall clock at true time `t`.
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

    /// Requests waiting in the rules' lines now.
    pub fn waiting(&self) -> usize {
        self.worker.classes.len()
    }

    fn store(&self) -> SimStore<'_> {
        SimStore {
            mem: MemStore(&self.cells),
            taken: &self.taken,
        }
    }

    fn count(&mut self, rule: usize, counts: &Counts) {
        // The glue defines only the stats of the rule's features.
        let stray = self.config.rules.get(rule).and_then(|r| counts.stray(r));
        assert!(stray.is_none(), "rule {rule} counted {stray:?}");
        for (stat, delta) in counts.iter() {
            let t = self.totals.entry((rule, stat)).or_default();
            *t = t.saturating_add_signed(delta.into());
        }
    }

    /// A request of rule `rule` arrives at true time `t`.
    pub fn arrive(&mut self, rule: usize, t: u64) -> Fate {
        self.release_due(t);
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let req = SimRequest(rule);
        let env = Env {
            config: &self.config,
            hasher: &self.hasher,
            store: SimStore {
                mem: MemStore(&self.cells),
                taken: &self.taken,
            },
        };
        let mut clock = self.clocks(t);
        let d = Stream::new(id).on_request(env, &mut self.worker, &mut Facts::new(req), &mut clock);
        let taken = self.taken.borrow_mut().pop();
        self.taken.borrow_mut().clear();
        let Some(rule) = d.rule else {
            return Fate::Rejected;
        };
        self.count(rule, &d.counts);
        match d.verdict {
            Verdict::Continue => {
                let slot = match taken {
                    Some(Taken::Slot(k)) => Some(k),
                    _ => None,
                };
                self.releases.push(Release {
                    rule,
                    at: t,
                    arrived: t,
                    slot,
                    credit: taken == Some(Taken::Credit),
                });
                Fate::Released { slot }
            }
            Verdict::Hold => {
                self.held.insert(id, HeldRequest { arrived: t, taken });
                Fate::Held
            }
            Verdict::Reply(_) => {
                self.rejected += 1;
                Fate::Rejected
            }
        }
    }

    /// The worker's releases at each held request's release time up to
    /// `now` (this host's clock): an exact timer. (Retries of requests
    /// waiting for grants run on the regular tick.)
    fn release_due(&mut self, t: u64) {
        let now = self.mono(t);
        while let Some(at) = self.worker.queue.next_release().filter(|&at| at <= now) {
            let store = SimStore {
                mem: MemStore(&self.cells),
                taken: &self.taken,
            };
            let plan = self.worker.plan_releases(&self.config, store, at);
            self.carry_out(at.saturating_add(MONO_BEHIND_NS), plan);
        }
    }

    /// One tick of the worker at `now` (this host's clock), carried out.
    fn worker_tick(&mut self, t: u64) {
        let mut clock = self.clocks(t);
        let store = SimStore {
            mem: MemStore(&self.cells),
            taken: &self.taken,
        };
        // The line's grants take slots for tickets, in ticket order, and the
        // worker (one here) releases the granted tickets in that order: the
        // requests it resumes without a slot of their own took what the
        // store saw taken, in that order.
        let plan = self.worker.plan_tick(&self.config, store, &mut clock);
        let takes: Vec<Taken> = self.taken.borrow_mut().drain(..).collect();
        let waiting: Vec<u32> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                TickAction::Resume { id, .. } => Some(*id),
                TickAction::Reply { .. } => None,
            })
            .filter(|id| self.held.get(id).is_some_and(|h| h.taken.is_none()))
            .collect();
        // (More takes than releases: a slot taken and given back, or passed
        // on to an abandoned ticket's successor later.)
        if takes.len() < waiting.len() {
            self.unmatched += 1;
        }
        for (id, t) in waiting.iter().zip(takes) {
            if let Some(h) = self.held.get_mut(id) {
                h.taken = Some(t);
            }
        }
        self.carry_out(t, plan);
    }

    /// Carries out `plan` at true time `t`.
    fn carry_out(&mut self, t: u64, plan: TickPlan) {
        for (rule, counts) in &plan.counts {
            self.count(*rule, counts);
        }
        let at = t;
        for action in plan.actions {
            let store = SimStore {
                mem: MemStore(&self.cells),
                taken: &self.taken,
            };
            match action {
                TickAction::Resume {
                    id,
                    rule,
                    waited_ns,
                } => {
                    self.worker.resuming(id, waited_ns);
                    let c = self.worker.resumed(&self.config, store, id, true);
                    self.worker.waited.remove(&id);
                    self.count(rule, &c);
                    let held = self.held.remove(&id);
                    self.releases.push(Release {
                        rule,
                        at,
                        arrived: held.map_or(at, |h| h.arrived),
                        slot: match held.and_then(|h| h.taken) {
                            Some(Taken::Slot(k)) => Some(k),
                            _ => None,
                        },
                        credit: held.and_then(|h| h.taken) == Some(Taken::Credit),
                    });
                }
                TickAction::Reply { id, rule, .. } => {
                    let c = self.worker.replied(id, true);
                    self.count(rule, &c);
                    // Its max_queue_delay ran out while it waited, or a
                    // retry found its turn too far away.
                    let max_delay = self.config.rules.get(rule).map_or(0, |r| r.max_delay_ns);
                    let held = self.held.remove(&id);
                    if held.is_some_and(|h| t >= h.arrived.saturating_add(max_delay)) {
                        self.timed_out += 1;
                    } else {
                        self.rejected += 1;
                    }
                }
            }
        }
    }

    /// The calling VM's tick and the worker's, at true time `t`. Returns the
    /// call to send.
    pub fn tick(&mut self, t: u64) -> Option<Call> {
        self.release_due(t);
        // As the glue: the worker ticks while it holds anything.
        if self.worker.needs_ticks() {
            self.worker_tick(t);
        }
        let mut clock = self.clocks(t);
        let store = SimStore {
            mem: MemStore(&self.cells),
            taken: &self.taken,
        };
        let totals = &self.totals;
        let out = self.calling.on_tick(store, &mut clock, &|rule, stat| {
            totals.get(&(rule, stat)).copied().unwrap_or(0)
        });
        // What the calling side stored is none of a request's.
        self.taken.borrow_mut().clear();
        let call = self.apply(out);
        if call.is_some() {
            self.calls += 1;
        }
        call
    }

    /// The answer to the call in flight, at true time `t`.
    pub fn answer(&mut self, t: u64, answer: Result<(u16, &[u8]), Failure>) {
        self.release_due(t);
        let failures = |c: &Caller| {
            (0..c.rule_count())
                .filter_map(|i| c.stats(i))
                .map(|s| s.failures)
                .sum::<u64>()
        };
        let before = failures(self.calling.caller());
        let store = SimStore {
            mem: MemStore(&self.cells),
            taken: &self.taken,
        };
        let totals = &self.totals;
        let mut clock = self.clocks(t);
        let out = self
            .calling
            .on_answer(store, &mut clock, answer, &|rule, stat| {
                totals.get(&(rule, stat)).copied().unwrap_or(0)
            });
        if failures(self.calling.caller()) > before {
            self.failures += 1;
        }
        self.taken.borrow_mut().clear();
        self.apply(out);
    }

    /// Counts what the calling side reports and notes what it granted.
    fn apply(&mut self, out: Effects) -> Option<Call> {
        for (rule, counts) in &out.counts {
            self.count(*rule, counts);
        }
        for u in &out.published {
            // In the fleet's frame, so that proxies' grants compare.
            let caller = self.calling.caller();
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
        out.call
    }

    /// Releases what is due by true time `t` (the end of a run).
    pub fn settle(&mut self, t: u64) {
        self.release_due(t);
    }

    /// A statistic's total (what Envoy would show), by rule.
    pub fn total(&self, rule: usize, stat: Stat) -> u64 {
        self.totals.get(&(rule, stat)).copied().unwrap_or(0)
    }
}

/// How the network and the engine treat one call in the virtual world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// Reaches the engine after `ns / 2`, answered after `ns` (a timeout if beyond it).
    Latency(u64),
    /// Never reaches the engine: a transport error after `ns`.
    Refused(u64),
    /// The engine answers this nonsense instead (garbage, 500...).
    Nonsense(u16, &'static [u8]),
}

/// A virtual-time run: proxies with their own arrivals, one fake engine.
pub struct World {
    pub proxies: Vec<SimProxy>,
    pub engine: FakeEngine,
    /// The engine's clock minus the true time, ns.
    pub engine_skew_ns: i64,
    /// Glue tick period of the calling VM and of the workers' retries.
    pub tick_ns: u64,
    /// Time step of arrivals.
    pub step_ns: u64,
    timeout_ns: u64,
    /// Events: (true time, sequence, proxy, what).
    events: BinaryHeap<Reverse<(u64, u64, usize, Ev)>>,
    seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The call reaches the engine; its answer takes `back_ns` more, unless
    /// the proxy gave up (`late`: a timeout was already scheduled).
    Serve {
        body: Vec<u8>,
        back_ns: u64,
        late: bool,
    },
    /// The answer reaches the proxy.
    Answer(u16, Vec<u8>),
    /// The call fails: a timeout (true) or a transport error.
    Fail(bool),
}

impl World {
    pub fn new(proxies: Vec<SimProxy>, timeout_ns: u64) -> World {
        World {
            proxies,
            engine: FakeEngine::default(),
            engine_skew_ns: 0,
            tick_ns: 5 * crate::clock::NS_PER_MS,
            step_ns: crate::clock::NS_PER_MS,
            timeout_ns,
            events: BinaryHeap::new(),
            seq: 0,
        }
    }

    fn push(&mut self, at: u64, proxy: usize, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, proxy, ev)));
    }

    /// Runs from true time `start` to `end`. `arrivals(proxy, from, to)`
    /// gives the arrivals of each proxy in `(from, to]` as (rule, true time);
    /// `net(proxy, call number)` how each call fares.
    pub fn run(
        &mut self,
        start: u64,
        end: u64,
        mut arrivals: impl FnMut(usize, u64, u64) -> Vec<(usize, u64)>,
        mut net: impl FnMut(usize, u64) -> Net,
    ) {
        let mut t = start;
        let mut next_tick = start;
        let mut calls = 0u64;
        while t < end {
            let to = t + self.step_ns;
            while self
                .events
                .peek()
                .is_some_and(|Reverse((at, ..))| *at <= to)
            {
                let Some(Reverse((at, _, p, ev))) = self.events.pop() else {
                    break;
                };
                self.deliver(at, p, ev);
            }
            for p in 0..self.proxies.len() {
                for (rule, at) in arrivals(p, t, to) {
                    if let Some(proxy) = self.proxies.get_mut(p) {
                        proxy.arrive(rule, at);
                    }
                }
            }
            if to >= next_tick {
                next_tick += self.tick_ns;
                for p in 0..self.proxies.len() {
                    let Some(call) = self.proxies.get_mut(p).and_then(|x| x.tick(to)) else {
                        continue;
                    };
                    calls += 1;
                    match net(p, calls) {
                        Net::Latency(ns) => {
                            let late = ns > self.timeout_ns;
                            let body = call.request.body;
                            self.push(
                                to + ns / 2,
                                p,
                                Ev::Serve {
                                    body,
                                    back_ns: ns - ns / 2,
                                    late,
                                },
                            );
                            if late {
                                self.push(to + self.timeout_ns, p, Ev::Fail(true));
                            }
                        }
                        Net::Refused(ns) => self.push(to + ns, p, Ev::Fail(false)),
                        Net::Nonsense(status, body) => self.push(
                            to + crate::clock::NS_PER_MS,
                            p,
                            Ev::Answer(status, body.to_vec()),
                        ),
                    }
                }
            }
            t = to;
        }
        for p in &mut self.proxies {
            p.settle(end);
        }
    }

    fn deliver(&mut self, at: u64, p: usize, ev: Ev) {
        match ev {
            Ev::Serve {
                body,
                back_ns,
                late,
            } => {
                let server_now = at.saturating_add_signed(self.engine_skew_ns);
                let (status, answer) = self.engine.handle(&body, server_now);
                if !late {
                    self.push(at + back_ns, p, Ev::Answer(status, answer));
                }
            }
            Ev::Answer(status, body) => {
                if let Some(proxy) = self.proxies.get_mut(p) {
                    if proxy.caller().in_flight() {
                        proxy.answer(at, Ok((status, &body)));
                    }
                }
            }
            Ev::Fail(timeout) => {
                if let Some(proxy) = self.proxies.get_mut(p) {
                    if proxy.caller().in_flight() {
                        let f = if timeout {
                            Failure::Timeout
                        } else {
                            Failure::Transport
                        };
                        proxy.answer(at, Err(f));
                    }
                }
            }
        }
    }
}

/// Most releases in any window of `w` ns (`times` sorted).
pub fn max_in_window(times: &[u64], w: u64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for (hi, &t) in times.iter().enumerate() {
        while times.get(lo).is_some_and(|&x| x + w <= t) {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best
}

/// Whether any two ranges overlap (a slot granted twice).
pub fn first_overlap(ranges: &[(u64, u64)]) -> Option<((u64, u64), (u64, u64))> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .find(|w| matches!(w, [a, b] if b.0 < a.1))
        .and_then(|w| Some((*w.first()?, *w.get(1)?)))
}

/// The hour (service window) of true time `t`, for reports.
pub fn hour_of(t: u64) -> u64 {
    t / WINDOW_NS
}
