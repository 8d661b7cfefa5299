//! The root context's glue (one per VM: each worker thread, and the main
//! thread): configuration, the tick that carries out the core's plan, and
//! the wake queue through which a returned concurrency slot reaches a waiter
//! at once.

use std::rc::Rc;

use throttle_core::adaptive::{add_tally, Learners};
use throttle_core::config;
use throttle_core::stats::Counts;
use throttle_core::store::WAKE_QUEUE_PREFIX;
use throttle_core::store::{BlobId, Store};
use throttle_core::stream::Env;
use throttle_core::worker::{TickAction, TickPlan};

use crate::caller::Calls;
use crate::host::{Host, HostClock, Level};
use crate::http::HttpStream;
use crate::plugin::Plugin;
use crate::shared::{add_wake_queue, shared_seed, wake_all, SharedStore};
use crate::worker::WorkerGlue;
use throttle_core::clock::Clock;

/// The glue of one root context.
pub struct Root<H: Host> {
    host: H,
    id: u32,
    plugin: Option<Rc<Plugin>>,
    worker: Rc<WorkerGlue>,
    /// This VM's wake queue, once registered.
    queue: Option<u32>,
    /// Cluster scope: this VM's side of the calls to the engine.
    calls: Option<Calls>,
    /// Adaptive rules: this VM's side of the learning (it learns while it
    /// holds the learner lease).
    learners: Option<Learners>,
}

impl<H: Host> Root<H> {
    pub fn new(host: H, id: u32) -> Self {
        Root {
            host,
            id,
            plugin: None,
            worker: Rc::default(),
            queue: None,
            calls: None,
            learners: None,
        }
    }

    fn log(&self, level: Level, msg: &str) {
        self.host
            .log(level, &format!("throttle[root {}]: {msg}", self.id));
    }

    /// A new plugin configuration. False refuses it (Envoy keeps the old one
    /// or refuses to start); nothing is half-applied.
    pub fn on_configure(&mut self, bytes: &[u8]) -> bool {
        let config = match config::parse(bytes) {
            Ok(c) => c,
            Err(errors) => {
                for e in &errors {
                    self.log(Level::Error, &format!("config refused: {e}"));
                }
                return false;
            }
        };
        let Some(seed) = shared_seed(self.host) else {
            self.log(
                Level::Error,
                "config refused: no key-hashing seed (shared data or randomness unavailable)",
            );
            return false;
        };
        let plugin = Plugin::new(self.host, config, seed, config_hash(bytes));
        for name in plugin.store(self.host).create_initial() {
            self.log(
                Level::Warn,
                &format!("rule {name}: could not initialise its shared cells"),
            );
        }
        // A returned concurrency slot, or a class grant passed on to another
        // worker's ticket, wakes the workers through their queues.
        let wakes =
            |r: &throttle_core::config::Rule| r.concurrency.is_some() || !r.classes.is_empty();
        if self.queue.is_none() && plugin.config.rules.iter().any(wakes) {
            let mut tag = [0u8; 8];
            let _ = self.host.random(&mut tag);
            let name = format!("{WAKE_QUEUE_PREFIX}{:016x}", u64::from_le_bytes(tag));
            self.queue = self.host.register_queue(&name);
            if !self.queue.is_some_and(|q| add_wake_queue(self.host, q)) {
                self.log(
                    Level::Warn,
                    "no wake queue: freed concurrency slots and passed-on grants reach waiters at the next tick",
                );
            }
        }
        let mut tag = [0u8; 16];
        let _ = self.host.random(&mut tag);
        let [me, phase] = [0usize, 8].map(|i| {
            u64::from_le_bytes(
                tag.get(i..i + 8)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0; 8]),
            )
        });
        self.calls = Calls::new(&plugin, me, phase % 1000);
        if self.calls.is_some() {
            self.worker.tick_for_calls(self.host);
        }
        // A newer configuration takes the learner leases of its rules at
        // once: its generation is when it was applied (ms, wrapping; the
        // clock is read only for adaptive rules).
        self.learners = if plugin.config.rules.iter().any(|r| r.adaptive.is_some()) {
            let generation = (self.host.monotonic_ns() / 1_000_000) as u32;
            Learners::new(&plugin.config, me as u32, generation)
        } else {
            None
        };
        if self.learners.is_some() {
            self.worker.tick_for_learner(self.host);
        }
        let summary = plugin.config.describe();
        self.log(
            Level::Info,
            &format!(
                "configured {} rule(s): {}",
                summary.len(),
                summary.join("; ")
            ),
        );
        for warning in plugin.config.warnings() {
            self.log(Level::Warn, &format!("configuration: {warning}"));
        }
        self.plugin = Some(Rc::new(plugin));
        true
    }

    /// The worker's state (tests hold it to simulate a busy borrow).
    #[cfg(test)]
    pub fn worker(&self) -> Rc<WorkerGlue> {
        Rc::clone(&self.worker)
    }

    /// Hands pending statistics to the host now (the tick does it too).
    /// Returns whether anything was counted since the last flush.
    pub fn flush(&self) -> bool {
        self.plugin
            .as_ref()
            .is_some_and(|p| p.metrics.flush(self.host))
    }

    /// A new HTTP context of this root.
    pub fn create_stream(&self, id: u32) -> HttpStream<H> {
        HttpStream::new(self.host, id, self.plugin.clone(), Rc::clone(&self.worker))
    }

    pub fn on_tick(&mut self) {
        let Some(plugin) = self.plugin.clone() else {
            self.host.set_tick_period_ms(0);
            return;
        };
        // Both clocks as the core reads them everywhere (`HostClock`: in the
        // test-clock build, the moved wall clock, as the calling side sees it).
        let mut host_clock = HostClock(self.host);
        let now = host_clock.mono();
        let mut clock = throttle_core::clock::Fixed {
            mono: now,
            wall: host_clock.wall(),
        };
        let plan = match self.worker.core.try_borrow_mut() {
            Ok(mut w) => w.plan_tick(&plugin.config, self.store(&plugin), &mut clock),
            Err(_) => TickPlan::default(),
        };
        let wake = plan.wake;
        self.carry_out(&plugin, plan);
        if wake {
            wake_all(self.host);
        }
        if self.learners.is_some() {
            self.learn(&plugin, now);
        }
        let had_traffic = plugin.metrics.flush(self.host);
        self.worker.after_tick(self.host, had_traffic);
        if let Some(calls) = self.calls.as_mut() {
            calls.on_tick(self.host, &plugin);
        }
    }

    /// Adaptive rules, on each tick: this worker's tallies go into the
    /// shared ones (one it cannot add stays for the next tick), and, every
    /// round, the VM holding the learner lease learns (statistics: the rate
    /// gauge and what moved it).
    fn learn(&mut self, plugin: &Plugin, now: u64) {
        let store = self.store(plugin);
        let tallies = match self.worker.core.try_borrow_mut() {
            Ok(mut w) => w.take_tallies(),
            Err(_) => Vec::new(),
        };
        for (rule, tally) in tallies {
            if !add_tally(&mut store.blob(BlobId::Tally(rule)), &tally) {
                if let Ok(mut w) = self.worker.core.try_borrow_mut() {
                    w.keep_tally(rule, &tally);
                }
            }
        }
        let Some(learners) = self.learners.as_mut() else {
            return;
        };
        for round in learners.on_tick(store, now) {
            if plugin.metrics.count(self.host, round.rule, &round.counts) {
                self.worker.tick_to_flush(self.host);
            }
            if let (Some(change), Some(rule)) = (round.change, plugin.config.rules.get(round.rule))
            {
                self.log(Level::Debug, &format!("rule '{}': {change}", rule.name));
            }
        }
    }

    /// The plugin is going away (its listener drained or its configuration
    /// replaced): hands the counts still pending to the host, so that the
    /// streams that ended last (cancelled by the drain) are counted and the
    /// `held` gauge comes back to zero. Envoy deletes the plugin after its
    /// last stream, and may do so before another tick would have flushed.
    pub fn on_done(&mut self) {
        self.flush();
    }

    /// The answer to a call to the engine.
    pub fn on_http_call_response(&mut self, token: u32, body_size: usize) {
        if let (Some(plugin), Some(calls)) = (self.plugin.clone(), self.calls.as_mut()) {
            calls.on_response(self.host, &plugin, token, body_size);
        }
    }

    /// A concurrency slot went back somewhere in the process, or another
    /// worker passed a grant on to a ticket here: the waiters whose turn
    /// came go now, not at the next tick (a grant passed on again wakes
    /// the workers again).
    pub fn on_queue_ready(&mut self, queue: u32) {
        while self.host.dequeue(queue).is_some() {}
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let mut host_clock = HostClock(self.host);
        let mut clock = throttle_core::clock::Fixed {
            mono: host_clock.mono(),
            wall: host_clock.wall(),
        };
        let plan = match self.worker.core.try_borrow_mut() {
            Ok(mut w) => w.plan_wake(&plugin.config, self.store(&plugin), &mut clock),
            Err(_) => TickPlan::default(),
        };
        let wake = plan.wake;
        self.carry_out(&plugin, plan);
        if wake {
            wake_all(self.host);
        }
    }

    fn store<'p>(&self, plugin: &'p Plugin) -> SharedStore<'p, H> {
        plugin.store(self.host)
    }

    /// Carries out a plan. No borrow of the worker is held while acting: a
    /// resume or a reply can re-enter this VM (the stream's own callbacks run
    /// at once).
    fn carry_out(&self, plugin: &Plugin, plan: TickPlan) {
        let host = self.host;
        let env = Env {
            config: &plugin.config,
            hasher: &plugin.hasher,
            store: self.store(plugin),
        };
        let count = |rule: usize, counts: &Counts| {
            if plugin.metrics.count(host, rule, counts) {
                self.worker.tick_to_flush(host);
            }
        };
        for (rule, counts) in &plan.counts {
            count(*rule, counts);
        }
        for action in plan.actions {
            let counts = match action {
                TickAction::Resume {
                    id,
                    rule,
                    waited_ns,
                } => {
                    if let Ok(mut w) = self.worker.core.try_borrow_mut() {
                        w.resuming(id, waited_ns);
                    }
                    let ok = host.resume_request(id).is_ok();
                    if !ok {
                        self.log(Level::Debug, &format!("request {id} was gone at its turn"));
                    }
                    self.worker
                        .core
                        .try_borrow_mut()
                        .ok()
                        .map(|mut w| (rule, w.resumed(env.config, env.store, id, ok)))
                }
                TickAction::Reply { id, rule, reply } => {
                    let ok = host.set_effective_context(id) && host.send_reply(&reply);
                    self.worker
                        .core
                        .try_borrow_mut()
                        .ok()
                        .map(|mut w| (rule, w.replied(id, ok)))
                }
            };
            if let Some((rule, c)) = counts {
                count(rule, &c);
            }
        }
        host.set_effective_context(self.id);
    }
}

/// A stable hash of a plugin configuration's bytes (names its caller lease).
fn config_hash(bytes: &[u8]) -> u64 {
    throttle_core::keys::KeyHasher::new((0x7468_726f, 0x746c_6500))
        .fingerprint("configuration", bytes)
}
