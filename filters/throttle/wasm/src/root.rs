//! Root context: configuration, and the tick that releases held requests.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use throttle_core::gate::{self, Enter, Waiter};
use throttle_core::{config, Released, NS_PER_MS};

use crate::host::{self, SharedData};
use crate::http::{send_rejection, ThrottleHttp};
use crate::metrics::RuleMetrics;
use crate::plugin::{Plugin, Worker, SEED_KEY};

/// Tick period while requests are held. Envoy fires a 1 ms tick about every
/// 4 ms here; every request due by then is released at once, and the
/// schedule lives in virtual time, so late ticks shift no later release.
pub const TICK_MS: u32 = 1;

/// One per VM (per worker thread, plus the main thread).
pub struct ThrottleRoot {
    id: u32,
    plugin: Option<Rc<Plugin>>,
    worker: Rc<RefCell<Worker>>,
}

/// What the tick does to one held request, decided while the worker state is
/// borrowed and carried out after (a resume can re-enter the VM).
enum Act {
    /// Resume it; it was held since `since`.
    Resume { id: u32, rule: usize, since: u64 },
    /// Answer it with the rule's reject status.
    Reject { id: u32, rule: usize },
}

impl ThrottleRoot {
    pub fn new(id: u32) -> Self {
        ThrottleRoot {
            id,
            plugin: None,
            worker: Rc::default(),
        }
    }

    fn log(&self, level: LogLevel, msg: &str) {
        let _ = proxy_wasm::hostcalls::log(level, &format!("throttle[root {}]: {msg}", self.id));
    }

    /// Rate releases: requests whose turn came. A rule that also has a
    /// concurrency limit sends them on to its gate.
    fn rate_releases(&self, plugin: &Plugin, w: &mut Worker, now: u64, acts: &mut Vec<Act>) {
        let mut due: Vec<Released> = Vec::new();
        w.queue.pop_due(now, &mut due);
        for r in due {
            let Some(rule) = plugin.config.rules.get(r.rule) else {
                continue;
            };
            let (Some(limit), Some(rt)) = (rule.concurrency, plugin.rules.get(r.rule)) else {
                acts.push(Act::Resume {
                    id: r.context_id,
                    rule: r.rule,
                    since: r.held_at,
                });
                continue;
            };
            match gate::enter(&mut SharedData { key: &rt.gate_key }, limit, true) {
                Enter::Go => {
                    w.in_flight.insert(r.context_id, r.rule);
                    RuleMetrics::add(rt.metrics.in_flight, 1);
                    acts.push(Act::Resume {
                        id: r.context_id,
                        rule: r.rule,
                        since: r.held_at,
                    });
                }
                Enter::Wait { ticket } => {
                    let deadline = r.held_at.saturating_add(rule.max_delay_ns);
                    w.gate
                        .wait(r.context_id, r.rule, ticket, r.held_at, deadline);
                }
                Enter::Full | Enter::Contention => {
                    RuleMetrics::inc(rt.metrics.contention);
                    acts.push(Act::Reject {
                        id: r.context_id,
                        rule: r.rule,
                    });
                }
            }
        }
    }

    /// Gate turns: waiters whose ticket may go; abandoned tickets whose turn
    /// came are counted as done. Then waiters past their deadline.
    fn gate_turns(&self, plugin: &Plugin, w: &mut Worker, now: u64, acts: &mut Vec<Act>) {
        let mut ready: Vec<Waiter> = Vec::new();
        for index in w.gate.rules() {
            let (Some(rule), Some(rt)) = (plugin.config.rules.get(index), plugin.rules.get(index))
            else {
                continue;
            };
            let Some(limit) = rule.concurrency else {
                continue;
            };
            let mut cell = SharedData { key: &rt.gate_key };
            let Ok(bound) = gate::go_bound(&mut cell, limit) else {
                continue;
            };
            let abandoned = w.gate.turn_came(index, bound, &mut ready);
            if gate::leave(&mut cell, abandoned).is_err() {
                self.log(
                    LogLevel::Warn,
                    &format!(
                        "rule {}: could not return {abandoned} abandoned slot(s)",
                        rule.name
                    ),
                );
            }
            for waiter in ready.drain(..) {
                w.in_flight.insert(waiter.context_id, index);
                RuleMetrics::add(rt.metrics.in_flight, 1);
                acts.push(Act::Resume {
                    id: waiter.context_id,
                    rule: index,
                    since: waiter.since,
                });
            }
        }
        let mut expired: Vec<Waiter> = Vec::new();
        w.gate.expired(now, &mut expired);
        acts.extend(expired.into_iter().map(|x| Act::Reject {
            id: x.context_id,
            rule: x.rule,
        }));
    }

    /// Carries out one act, with no borrow of the worker held.
    fn act(&self, plugin: &Plugin, act: Act, now: u64) {
        match act {
            Act::Resume { id, rule, since } => {
                let metrics = plugin.rules.get(rule).map(|rt| &rt.metrics);
                let waited = now.saturating_sub(since);
                if let Ok(mut w) = self.worker.try_borrow_mut() {
                    w.waited.insert(id, waited / NS_PER_MS);
                }
                match host::resume_request(id) {
                    Ok(()) => {
                        if let Some(m) = metrics {
                            RuleMetrics::inc(m.released);
                            m.record_wait(waited);
                        }
                    }
                    Err(status) => {
                        self.log(
                            LogLevel::Debug,
                            &format!("request {id} was gone at its turn (status {status})"),
                        );
                        if let Some(m) = metrics {
                            RuleMetrics::inc(m.gone);
                        }
                        self.forget(plugin, id);
                    }
                }
                if let Some(m) = metrics {
                    m.on_unhold();
                }
            }
            Act::Reject { id, rule } => {
                let metrics = plugin.rules.get(rule).map(|rt| &rt.metrics);
                let status = plugin
                    .config
                    .rules
                    .get(rule)
                    .map_or(429, |r| r.reject_status);
                if host::set_effective_context_checked(id) {
                    send_rejection(status, 1, None);
                    if let Some(m) = metrics {
                        RuleMetrics::inc(m.rejected);
                    }
                } else if let Some(m) = metrics {
                    RuleMetrics::inc(m.gone);
                }
                if let Some(m) = metrics {
                    m.on_unhold();
                }
            }
        }
    }

    /// A stream gone before its resume: drop its wait record and return any
    /// concurrency slot it was given.
    fn forget(&self, plugin: &Plugin, id: u32) {
        let slot = self.worker.try_borrow_mut().ok().and_then(|mut w| {
            w.waited.remove(&id);
            w.in_flight.remove(&id)
        });
        if let Some(index) = slot {
            crate::http::leave_gate(plugin, index);
        }
    }
}

impl Context for ThrottleRoot {}

impl RootContext for ThrottleRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config = match config::parse(&bytes) {
            Ok(c) => c,
            Err(errors) => {
                for e in &errors {
                    self.log(LogLevel::Error, &format!("config refused: {e}"));
                }
                return false;
            }
        };
        let Some(seed) = host::shared_seed(SEED_KEY) else {
            self.log(
                LogLevel::Error,
                "config refused: no key-hashing seed (shared data or randomness unavailable)",
            );
            return false;
        };
        let plugin = Plugin::new(config, seed);
        for name in plugin.init_cells() {
            self.log(
                LogLevel::Warn,
                &format!("rule {name}: could not initialise its shared cells"),
            );
        }
        let summary: Vec<String> = plugin.config.rules.iter().map(describe_rule).collect();
        self.log(
            LogLevel::Info,
            &format!(
                "configured {} rule(s): {}",
                summary.len(),
                summary.join("; ")
            ),
        );
        self.plugin = Some(Rc::new(plugin));
        true
    }

    fn on_tick(&mut self) {
        let now = host::monotonic_ns();
        let Some(plugin) = self.plugin.clone() else {
            host::set_tick_period_ms(0);
            return;
        };
        let mut acts: Vec<Act> = Vec::new();
        if let Ok(mut w) = self.worker.try_borrow_mut() {
            self.rate_releases(&plugin, &mut w, now, &mut acts);
            self.gate_turns(&plugin, &mut w, now, &mut acts);
        }
        // No borrow is held while acting: a resume can re-enter this VM
        // (a local reply ends the stream and runs its callbacks at once).
        for act in acts {
            self.act(&plugin, act, now);
        }
        host::set_effective_context(self.id);
        if let Ok(mut w) = self.worker.try_borrow_mut() {
            if w.ticking && !w.needs_ticks() {
                w.ticking = !host::set_tick_period_ms(0);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(ThrottleHttp::new(
            context_id,
            self.plugin.clone(),
            Rc::clone(&self.worker),
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn describe_rule(r: &throttle_core::Rule) -> String {
    let mut parts = vec![r.name.clone()];
    if let (Some(s), Some(w)) = (&r.schedule, &r.rate_window) {
        parts.push(format!(
            "rate {}/{}s (interval {}ns), burst {}",
            w.count,
            w.window_s,
            s.interval_ns,
            s.tau_ns.checked_div(s.interval_ns).unwrap_or(0)
        ));
    }
    if let Some(n) = r.concurrency {
        parts.push(format!("concurrency {n}"));
    }
    parts.push(format!("max_queue_delay {}ms", r.max_delay_ns / NS_PER_MS));
    if r.key.is_some() {
        parts.push(format!("keyed ({} slots)", r.key_slots));
    }
    if r.dry_run {
        parts.push("dry-run".into());
    }
    parts.join(", ")
}
