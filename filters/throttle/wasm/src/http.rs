//! HTTP context: admit, hold or reject one request.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};
use throttle_core::{admit, Admission};

use crate::host::{self, SharedTat};
use crate::metrics::RuleMetrics;
use crate::root::{Plugin, Worker, TICK_MS};

pub struct ThrottleHttp {
    id: u32,
    /// None when the root context has no valid configuration: pass through.
    plugin: Option<Rc<Plugin>>,
    worker: Rc<RefCell<Worker>>,
    /// Rule index, if this request was held (it may since have been released).
    held_rule: Option<usize>,
}

impl ThrottleHttp {
    pub fn new(id: u32, plugin: Option<Rc<Plugin>>, worker: Rc<RefCell<Worker>>) -> Self {
        ThrottleHttp {
            id,
            plugin,
            worker,
            held_rule: None,
        }
    }

    fn log(&self, level: LogLevel, msg: &str) {
        let _ = proxy_wasm::hostcalls::log(level, &format!("throttle[{}]: {msg}", self.id));
    }

    /// Whether this request is in the worker's queue now.
    fn still_held(&self) -> bool {
        self.held_rule.is_some()
            && self
                .worker
                .try_borrow()
                .map(|w| w.queue.contains(self.id))
                .unwrap_or(false)
    }

    fn reject(&self, status: u16, retry_after_s: u64) -> Action {
        let retry = retry_after_s.to_string();
        let headers = [
            ("retry-after", retry.as_str()),
            ("content-type", "text/plain"),
        ];
        if !host::send_local_response(
            status.into(),
            "throttle_rejected",
            &headers,
            "throttled: retry later\n",
        ) {
            self.log(LogLevel::Warn, "could not send the rejection");
        }
        Action::Pause
    }
}

impl Context for ThrottleHttp {
    fn on_done(&mut self) -> bool {
        // The stream ends: if it is still held, its client went away.
        if let (Some(rule), Some(plugin)) = (self.held_rule, &self.plugin) {
            let cancelled = self
                .worker
                .try_borrow_mut()
                .ok()
                .and_then(|mut w| w.queue.cancel(self.id));
            if cancelled.is_some() {
                if let Some(rt) = plugin.rules.get(rule) {
                    RuleMetrics::inc(rt.metrics.cancelled);
                    rt.metrics.on_unhold();
                }
            }
        }
        true
    }
}

impl HttpContext for ThrottleHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let config = &plugin.config;
        let index = if config.needs_path() {
            let path = self.get_http_request_header(":path");
            match config.find_rule(path.as_deref()) {
                Some(i) => i,
                None => return Action::Continue,
            }
        } else {
            0
        };
        let (Some(rule), Some(rt)) = (config.rules.get(index), plugin.rules.get(index)) else {
            return Action::Continue;
        };
        let max_held = usize::try_from(config.max_held_per_worker).unwrap_or(usize::MAX);
        let can_hold = self
            .worker
            .try_borrow()
            .map(|w| w.queue.len() < max_held)
            .unwrap_or(false);
        let now = host::monotonic_ns();
        match admit(
            &mut SharedTat {
                key: &rt.shared_key,
            },
            &rule.schedule,
            now,
            can_hold,
        ) {
            Admission::Now => {
                RuleMetrics::inc(rt.metrics.admitted);
                Action::Continue
            }
            Admission::Hold { release_at } => {
                let Ok(mut w) = self.worker.try_borrow_mut() else {
                    // Cannot happen (no borrow outlives a callback); never strand a request.
                    self.log(
                        LogLevel::Error,
                        "worker state busy; continuing without holding",
                    );
                    RuleMetrics::inc(rt.metrics.admitted);
                    return Action::Continue;
                };
                w.queue.hold(self.id, index, now, release_at);
                if !w.ticking {
                    w.ticking = host::set_tick_period_ms(TICK_MS);
                }
                drop(w);
                self.held_rule = Some(index);
                rt.metrics.on_hold();
                Action::Pause
            }
            Admission::Reject { retry_after_s, .. } => {
                RuleMetrics::inc(rt.metrics.rejected);
                self.reject(config.reject_status, retry_after_s)
            }
            Admission::Contention => {
                // Fail closed: the shared schedule could not be read or updated.
                RuleMetrics::inc(rt.metrics.contention);
                RuleMetrics::inc(rt.metrics.rejected);
                self.log(
                    LogLevel::Warn,
                    &format!("rule {}: shared schedule unavailable; rejecting", rule.name),
                );
                self.reject(config.reject_status, 1)
            }
        }
    }

    fn on_http_request_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        // A held request's body waits (buffered by Envoy) with its headers.
        if self.still_held() {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.still_held() {
            Action::Pause
        } else {
            Action::Continue
        }
    }
}
