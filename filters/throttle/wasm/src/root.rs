//! Root context: configuration, the worker's queue, and releases on tick.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use throttle_core::{config, Config, HeldQueue, Released};

use crate::host;
use crate::http::ThrottleHttp;
use crate::metrics::RuleMetrics;

/// Tick period while requests are held. Envoy fires a 1 ms tick about every
/// 4 ms here; every request due by then is released at once, and the
/// schedule lives in virtual time, so late ticks shift no later release.
pub const TICK_MS: u32 = 1;

/// A validated configuration with its per-rule runtime handles, shared by all
/// HTTP contexts of one root context.
pub struct Plugin {
    pub config: Config,
    pub rules: Vec<RuleRuntime>,
}

/// Per-rule handles: the shared-data key of its schedule and its metrics.
pub struct RuleRuntime {
    pub shared_key: String,
    pub metrics: RuleMetrics,
}

impl Plugin {
    fn new(config: Config) -> Self {
        let rules = config
            .rules
            .iter()
            .map(|r| RuleRuntime {
                shared_key: format!("throttle/v1/rule/{}", r.name),
                metrics: RuleMetrics::define(&r.name),
            })
            .collect();
        Plugin { config, rules }
    }
}

/// State of one worker: its held requests and whether its tick runs.
#[derive(Default)]
pub struct Worker {
    pub queue: HeldQueue,
    pub ticking: bool,
}

/// One per VM (per worker thread, plus the main thread).
pub struct ThrottleRoot {
    id: u32,
    plugin: Option<Rc<Plugin>>,
    worker: Rc<RefCell<Worker>>,
    due: Vec<Released>,
}

impl ThrottleRoot {
    pub fn new(id: u32) -> Self {
        ThrottleRoot {
            id,
            plugin: None,
            worker: Rc::default(),
            due: Vec::new(),
        }
    }

    fn log(&self, level: LogLevel, msg: &str) {
        let _ = proxy_wasm::hostcalls::log(level, &format!("throttle[root {}]: {msg}", self.id));
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
        let plugin = Plugin::new(config);
        for (rule, rt) in plugin.config.rules.iter().zip(&plugin.rules) {
            if !host::ensure_shared_tat(&rt.shared_key) {
                self.log(
                    LogLevel::Warn,
                    &format!(
                        "rule {}: could not initialise its shared schedule",
                        rule.name
                    ),
                );
            }
        }
        let summary: Vec<String> = plugin
            .config
            .rules
            .iter()
            .map(|r| {
                let s = &r.schedule;
                format!(
                    "{} (interval {}ns, burst {}, max_queue_delay {}ms, path_prefix {:?})",
                    r.name,
                    s.interval_ns,
                    s.tau_ns.checked_div(s.interval_ns).unwrap_or(0),
                    s.max_delay_ns / throttle_core::NS_PER_MS,
                    r.matcher.path_prefix.as_deref().unwrap_or("*")
                )
            })
            .collect();
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
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        if let Ok(mut w) = self.worker.try_borrow_mut() {
            w.queue.pop_due(now, &mut due);
        }
        // No borrow is held while resuming: a resume can re-enter this VM
        // (a local reply ends the stream and runs its callbacks at once).
        for r in &due {
            let metrics = self
                .plugin
                .as_ref()
                .and_then(|p| p.rules.get(r.rule))
                .map(|rt| &rt.metrics);
            match host::resume_request(r.context_id) {
                Ok(()) => {
                    if let Some(m) = metrics {
                        RuleMetrics::inc(m.released);
                        m.record_wait(now.saturating_sub(r.held_at));
                    }
                }
                Err(status) => {
                    if let Some(m) = metrics {
                        RuleMetrics::inc(m.gone);
                    }
                    self.log(
                        LogLevel::Debug,
                        &format!(
                            "request {} was gone at its turn (status {status})",
                            r.context_id
                        ),
                    );
                }
            }
            if let Some(m) = metrics {
                m.on_unhold();
            }
        }
        host::set_effective_context(self.id);
        self.due = due;
        if let Ok(mut w) = self.worker.try_borrow_mut() {
            if w.queue.is_empty() && w.ticking {
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
