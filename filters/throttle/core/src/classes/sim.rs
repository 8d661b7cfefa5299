//! An Envoy process in memory for tests of the class queues (feature
//! `testing`): several workers over one in-memory store, each request on
//! one worker, driven as the glue drives them (the request's decision, the
//! worker's ticks carried out, the stream's end), with every outcome
//! recorded: who went when, who was rejected or displaced.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use crate::clock::Fixed;
use crate::config::{self, Config};
use crate::keys::KeyHasher;
use crate::matcher::{Facts, FakeRequest};
use crate::stats::{ClassStat, Counts, Stat};
use crate::stream::{Env, Stream, Verdict};
use crate::testing::{MemCells, MemStore};
use crate::worker::{TickAction, Worker};

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Continued at once.
    Now,
    /// Held, and still held.
    Held,
    /// Held, then resumed at this time.
    Released(u64),
    /// Answered at once with a rejection.
    Rejected,
    /// Held, then answered with a rejection at this time.
    Displaced(u64),
    /// Its client went away while held.
    Cancelled,
}

/// One request as the simulation saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub worker: usize,
    /// Its class (None: its rule has no classes, or no rule applied).
    pub class: Option<usize>,
    pub arrived: u64,
    pub fate: Fate,
}

/// A process of workers sharing one store.
pub struct Process {
    pub config: Config,
    hasher: KeyHasher,
    pub cells: RefCell<MemCells>,
    pub workers: Vec<Worker>,
    streams: HashMap<u32, (usize, Stream)>,
    /// Every request by id.
    pub seen: BTreeMap<u32, Seen>,
    /// Totals per (rule, stat) and per (rule, class, class stat).
    pub totals: BTreeMap<(usize, Stat), i64>,
    pub class_totals: BTreeMap<(usize, usize, ClassStat), i64>,
    /// Ids in the order they went on (at once, or resumed).
    pub order: Vec<u32>,
}

impl Process {
    /// `workers` workers (at least 1) with this configuration (JSON).
    pub fn new(json: &str, workers: usize) -> Result<Process, String> {
        let config = config::parse(json.as_bytes()).map_err(|e| {
            let lines: Vec<String> = e.iter().map(ToString::to_string).collect();
            format!("configuration refused: {}", lines.join("; "))
        })?;
        let workers = workers.max(1);
        Ok(Process {
            config,
            hasher: KeyHasher::new((1, 2)),
            cells: RefCell::default(),
            workers: (0..workers).map(|_| Worker::new()).collect(),
            streams: HashMap::new(),
            seen: BTreeMap::new(),
            totals: BTreeMap::new(),
            class_totals: BTreeMap::new(),
            order: Vec::new(),
        })
    }

    fn count(&mut self, rule: usize, c: &Counts) {
        // The glue defines only the stats of the rule's features.
        let stray = self.config.rules.get(rule).and_then(|r| c.stray(r));
        assert!(stray.is_none(), "rule {rule} counted {stray:?}");
        for (s, d) in c.iter() {
            *self.totals.entry((rule, s)).or_default() += i64::from(d);
        }
        for (k, s, d) in c.iter_classes() {
            *self.class_totals.entry((rule, k, s)).or_default() += i64::from(d);
        }
    }

    /// A request's headers arrive on `worker` at `now`.
    pub fn request(&mut self, worker: usize, id: u32, req: FakeRequest, now: u64) -> Verdict {
        let env = Env {
            config: &self.config,
            hasher: &self.hasher,
            store: MemStore(&self.cells),
        };
        let mut stream = Stream::new(id);
        let mut clock = Fixed {
            mono: now,
            wall: now,
        };
        let n = self.workers.len().max(1);
        let Some(w) = self.workers.get_mut(worker % n) else {
            return Verdict::Continue;
        };
        let d = stream.on_request(env, w, &mut Facts::new(req), &mut clock);
        let class = stream.class();
        if let Some(rule) = d.rule {
            self.count(rule, &d.counts);
        }
        let fate = match &d.verdict {
            Verdict::Continue => Fate::Now,
            Verdict::Hold => Fate::Held,
            Verdict::Reply(_) => Fate::Rejected,
        };
        if fate == Fate::Now {
            self.order.push(id);
        }
        self.seen.insert(
            id,
            Seen {
                worker,
                class,
                arrived: now,
                fate,
            },
        );
        self.streams.insert(id, (worker, stream));
        d.verdict
    }

    /// A tick of `worker` at `now`, carried out; a plan that wakes the
    /// workers (the glue's wake queues) runs each one's wake plan at once,
    /// until none wakes them again.
    pub fn tick(&mut self, worker: usize, now: u64) {
        let mut clock = Fixed {
            mono: now,
            wall: now,
        };
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        let plan = w.plan_tick(&self.config, MemStore(&self.cells), &mut clock);
        let mut wake = plan.wake;
        self.carry_out(worker, now, plan);
        // Each wake settles at least one abandoned ticket: a bound only
        // against a loop.
        for _ in 0..1000 {
            if !wake {
                break;
            }
            wake = false;
            for v in 0..self.workers.len() {
                let Some(w) = self.workers.get_mut(v) else {
                    continue;
                };
                let plan = w.plan_wake(&self.config, MemStore(&self.cells), &mut clock);
                wake |= plan.wake;
                self.carry_out(v, now, plan);
            }
        }
    }

    fn carry_out(&mut self, worker: usize, now: u64, plan: crate::worker::TickPlan) {
        for (rule, c) in &plan.counts {
            self.count(*rule, c);
        }
        for action in plan.actions {
            let store = MemStore(&self.cells);
            match action {
                TickAction::Resume {
                    id,
                    rule,
                    waited_ns,
                } => {
                    let Some(w) = self.workers.get_mut(worker) else {
                        continue;
                    };
                    w.resuming(id, waited_ns);
                    let c = w.resumed(&self.config, store, id, true);
                    self.count(rule, &c);
                    if let Some(s) = self.seen.get_mut(&id) {
                        s.fate = Fate::Released(now);
                    }
                    self.order.push(id);
                }
                TickAction::Reply { id, rule, .. } => {
                    let Some(w) = self.workers.get_mut(worker) else {
                        continue;
                    };
                    let c = w.replied(id, true);
                    self.count(rule, &c);
                    if let Some(s) = self.seen.get_mut(&id) {
                        s.fate = Fate::Displaced(now);
                    }
                }
            }
        }
    }

    /// The stream of request `id` ends (its client went away, if still held).
    pub fn done(&mut self, id: u32) {
        let Some((worker, mut stream)) = self.streams.remove(&id) else {
            return;
        };
        let env = Env {
            config: &self.config,
            hasher: &self.hasher,
            store: MemStore(&self.cells),
        };
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        let out = stream.on_done(env, w);
        if let Some(rule) = stream.rule() {
            self.count(rule, &out.counts);
        }
        if out.counts.get(Stat::Cancelled) > 0 {
            if let Some(s) = self.seen.get_mut(&id) {
                s.fate = Fate::Cancelled;
            }
        }
    }

    /// Ids in the order of their release (at once or resumed), with the time.
    pub fn releases(&self) -> Vec<(u64, u32)> {
        let mut out: Vec<(u64, u32)> = self
            .seen
            .iter()
            .filter_map(|(&id, s)| match s.fate {
                Fate::Now => Some((s.arrived, id)),
                Fate::Released(t) => Some((t, id)),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether any worker needs ticks.
    pub fn needs_ticks(&self) -> bool {
        self.workers.iter().any(Worker::needs_ticks)
    }
}
