//! HTTP context: pick the rule, then admit, hold or reject the request.
//!
//! A rule with a `rate` decides first (continue, hold until the release
//! time, or reject at once); a rule with `concurrency` then takes a slot or
//! waits for one. Dry-run rules make every decision and count it, but hold
//! and reject nothing.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};
use throttle_core::gate::{self, Enter};
use throttle_core::keys::candidate_slots;
use throttle_core::schedule::rate_limit_headers;
use throttle_core::{admit, admit_keyed, admit_with_quota, Admission, Rule, NS_PER_MS};

use crate::host::{self, SharedData, SharedTable};
use crate::metrics::RuleMetrics;
use crate::plugin::{Plugin, RuleRuntime, Worker};
use crate::request::HostRequest;
use crate::root::TICK_MS;

/// Draft rate-limit header values: (limit, remaining, reset seconds).
type RateLimitHeaders = (u64, u64, u64);

pub struct ThrottleHttp {
    id: u32,
    /// None when the root context has no valid configuration: pass through.
    plugin: Option<Rc<Plugin>>,
    worker: Rc<RefCell<Worker>>,
    /// The rule that applied, if it held this request at some point.
    held_rule: Option<usize>,
    /// Whether the matched rule has a concurrency gate (so this request may
    /// hold a slot to return); requests of other rules skip that bookkeeping.
    gated: bool,
    /// Dry-run: what would have happened (for `x-throttle-dry-run`).
    dry_run_note: Option<String>,
    /// Draft rate-limit headers for the response.
    rate_limit: Option<RateLimitHeaders>,
}

/// Answers the effective stream with a rejection.
pub fn send_rejection(status: u16, retry_after_s: u64, rate_limit: Option<RateLimitHeaders>) {
    let retry = retry_after_s.to_string();
    let (limit, remaining, reset) = rate_limit
        .map(|(l, r, s)| (l.to_string(), r.to_string(), s.to_string()))
        .unwrap_or_default();
    let mut headers = vec![
        ("retry-after", retry.as_str()),
        ("content-type", "text/plain"),
    ];
    if rate_limit.is_some() {
        headers.extend([
            ("x-ratelimit-limit", limit.as_str()),
            ("x-ratelimit-remaining", remaining.as_str()),
            ("x-ratelimit-reset", reset.as_str()),
        ]);
    }
    let _ = host::send_local_response(
        status.into(),
        "throttle_rejected",
        &headers,
        "throttled: retry later\n",
    );
}

/// Returns one concurrency slot of rule `index`.
pub fn leave_gate(plugin: &Plugin, index: usize) {
    if let Some(rt) = plugin.rules.get(index) {
        let _ = gate::leave(&mut SharedData { key: &rt.gate_key }, 1);
        RuleMetrics::add(rt.metrics.in_flight, -1);
    }
}

impl ThrottleHttp {
    pub fn new(id: u32, plugin: Option<Rc<Plugin>>, worker: Rc<RefCell<Worker>>) -> Self {
        ThrottleHttp {
            id,
            plugin,
            worker,
            held_rule: None,
            gated: false,
            dry_run_note: None,
            rate_limit: None,
        }
    }

    fn log(&self, level: LogLevel, msg: &str) {
        let _ = proxy_wasm::hostcalls::log(level, &format!("throttle[{}]: {msg}", self.id));
    }

    fn still_held(&self) -> bool {
        self.held_rule.is_some()
            && self
                .worker
                .try_borrow()
                .map(|w| w.holds(self.id))
                .unwrap_or(false)
    }

    /// Returns this request's concurrency slot, if it holds one (idempotent).
    fn release_slot(&self) {
        if !self.gated {
            return;
        }
        let Some(plugin) = &self.plugin else { return };
        let slot = self
            .worker
            .try_borrow_mut()
            .ok()
            .and_then(|mut w| w.in_flight.remove(&self.id));
        if let Some(index) = slot {
            leave_gate(plugin, index);
        }
    }

    fn note(&mut self, what: String) {
        self.dry_run_note = Some(what);
    }

    /// Holds this request in the worker's queue (rate) until `release_at`.
    fn hold(&mut self, index: usize, rt: &RuleRuntime, now: u64, release_at: u64) -> Action {
        let Ok(mut w) = self.worker.try_borrow_mut() else {
            // Cannot happen (no borrow outlives a callback); never strand a request.
            self.log(
                LogLevel::Error,
                "worker state busy; continuing without holding",
            );
            return Action::Continue;
        };
        w.queue.hold(self.id, index, now, release_at);
        w.ensure_ticking(TICK_MS);
        drop(w);
        self.held_rule = Some(index);
        rt.metrics.on_hold();
        Action::Pause
    }

    /// Stage 1: the rule's rate schedule (per key if keyed).
    fn admit_rate(
        &self,
        plugin: &Plugin,
        rule: &Rule,
        rt: &RuleRuntime,
        req: &mut HostRequest,
        now: u64,
        can_hold: bool,
    ) -> Option<(Admission, Option<RateLimitHeaders>)> {
        let schedule = rule.schedule.as_ref()?;
        let key = rule.key.as_ref().and_then(|k| k.extract(req));
        let admission = match (key, &rule.quota) {
            // Fairness: the shared schedule decides, each key within its quota
            // (requests without a key value count as one key).
            (key, Some(quota)) => {
                let fp = plugin
                    .hasher
                    .fingerprint(&rule.name, key.as_deref().unwrap_or_default());
                let slots = candidate_slots(fp, rule.key_slots);
                let mut shared = SharedData { key: &rt.rate_key };
                let mut table = SharedTable {
                    prefix: &rt.slot_prefix,
                };
                admit_with_quota(
                    &mut shared,
                    &mut table,
                    fp,
                    slots,
                    schedule,
                    quota,
                    now,
                    can_hold,
                )
            }
            (Some(value), None) => {
                let fp = plugin.hasher.fingerprint(&rule.name, &value);
                let slots = candidate_slots(fp, rule.key_slots);
                admit_keyed(
                    &mut SharedTable {
                        prefix: &rt.slot_prefix,
                    },
                    fp,
                    slots,
                    schedule,
                    now,
                    can_hold,
                )
            }
            (None, None) => admit(
                &mut SharedData { key: &rt.rate_key },
                schedule,
                now,
                can_hold,
            ),
        };
        let headers = match (plugin.config.rate_limit_headers, rule.rate_window) {
            (true, Some(w)) => match admission {
                Admission::Now { tat } | Admission::Hold { tat, .. } => {
                    Some(rate_limit_headers(schedule, w.count, tat, now))
                }
                Admission::Reject { retry_after_s, .. } => Some((w.count, 0, retry_after_s)),
                Admission::Contention => None,
            },
            _ => None,
        };
        Some((admission, headers))
    }

    fn on_request(&mut self) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let config = &plugin.config;
        let mut req = HostRequest::default();
        let index = if config.first_rule_takes_all() {
            0
        } else {
            match config
                .rules
                .iter()
                .position(|r| r.matcher.matches(&mut req))
            {
                Some(i) => i,
                None => return Action::Continue,
            }
        };
        let (Some(rule), Some(rt)) = (config.rules.get(index), plugin.rules.get(index)) else {
            return Action::Continue;
        };
        // Set before any early return: a request held by the rate takes its
        // gate slot later, on tick, and must still give it back.
        self.gated = rule.concurrency.is_some();
        let m = &rt.metrics;
        let max_held = usize::try_from(config.max_held_per_worker).unwrap_or(usize::MAX);
        let can_hold = rule.dry_run
            || self
                .worker
                .try_borrow()
                .map(|w| w.held() < max_held)
                .unwrap_or(false);
        let now = host::monotonic_ns();

        if let Some((admission, headers)) =
            self.admit_rate(&plugin, rule, rt, &mut req, now, can_hold)
        {
            self.rate_limit = headers;
            match admission {
                Admission::Now { .. } => {}
                Admission::Hold { release_at, .. } if rule.dry_run => {
                    RuleMetrics::inc(m.would_queue);
                    self.note(format!(
                        "queued; wait_ms={}",
                        (release_at - now) / NS_PER_MS
                    ));
                }
                // A rule with concurrency takes its slot at release time (on tick).
                Admission::Hold { release_at, .. } => return self.hold(index, rt, now, release_at),
                Admission::Reject { retry_after_s, .. } if rule.dry_run => {
                    RuleMetrics::inc(m.would_reject);
                    self.note(format!(
                        "rejected; status={}; retry_after={retry_after_s}",
                        rule.reject_status
                    ));
                }
                Admission::Reject { retry_after_s, .. } => {
                    RuleMetrics::inc(m.rejected);
                    send_rejection(rule.reject_status, retry_after_s, self.rate_limit);
                    return Action::Pause;
                }
                Admission::Contention => {
                    // Fail closed: the shared schedule could not be read or updated.
                    RuleMetrics::inc(m.contention);
                    self.log(
                        LogLevel::Warn,
                        &format!("rule {}: shared schedule unavailable; rejecting", rule.name),
                    );
                    if rule.dry_run {
                        self.note("rejected; contention".into());
                    } else {
                        RuleMetrics::inc(m.rejected);
                        send_rejection(rule.reject_status, 1, None);
                        return Action::Pause;
                    }
                }
            }
        }

        if let Some(limit) = rule.concurrency {
            match gate::enter(&mut SharedData { key: &rt.gate_key }, limit, can_hold) {
                Enter::Go => self.take_slot(index, rt),
                Enter::Wait { .. } if rule.dry_run => {
                    // Dry-run goes at once, but keeps its slot so in-flight stays true.
                    self.take_slot(index, rt);
                    RuleMetrics::inc(m.would_queue);
                    self.note("queued; waiting for a concurrency slot".into());
                }
                Enter::Wait { ticket } => {
                    let Ok(mut w) = self.worker.try_borrow_mut() else {
                        return Action::Continue;
                    };
                    w.gate.wait(
                        self.id,
                        index,
                        ticket,
                        now,
                        now.saturating_add(rule.max_delay_ns),
                    );
                    w.ensure_ticking(TICK_MS);
                    drop(w);
                    self.held_rule = Some(index);
                    m.on_hold();
                    return Action::Pause;
                }
                Enter::Full => {
                    RuleMetrics::inc(m.rejected);
                    send_rejection(rule.reject_status, 1, self.rate_limit);
                    return Action::Pause;
                }
                Enter::Contention => {
                    RuleMetrics::inc(m.contention);
                    if !rule.dry_run {
                        RuleMetrics::inc(m.rejected);
                        send_rejection(rule.reject_status, 1, None);
                        return Action::Pause;
                    }
                }
            }
        }
        RuleMetrics::inc(m.admitted);
        Action::Continue
    }

    fn take_slot(&self, index: usize, rt: &RuleRuntime) {
        if let Ok(mut w) = self.worker.try_borrow_mut() {
            w.in_flight.insert(self.id, index);
        }
        RuleMetrics::add(rt.metrics.in_flight, 1);
    }
}

impl Context for ThrottleHttp {
    fn on_done(&mut self) -> bool {
        // The stream ends. If it is still held, its client went away.
        if let (Some(rule), Some(plugin)) = (self.held_rule, &self.plugin) {
            let cancelled = self.worker.try_borrow_mut().ok().and_then(|mut w| {
                let from_queue = w.queue.cancel(self.id).is_some();
                let from_gate = w.gate.cancel(self.id).is_some();
                if from_gate {
                    // Its abandoned ticket is counted at its turn, on tick.
                    w.ensure_ticking(TICK_MS);
                }
                w.waited.remove(&self.id);
                (from_queue || from_gate).then_some(())
            });
            if cancelled.is_some() {
                if let Some(rt) = plugin.rules.get(rule) {
                    RuleMetrics::inc(rt.metrics.cancelled);
                    rt.metrics.on_unhold();
                }
            }
        }
        self.release_slot();
        true
    }
}

impl HttpContext for ThrottleHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.on_request()
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

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // Only a request that was held has a recorded wait.
        let waited = self.held_rule.and_then(|_| {
            self.worker
                .try_borrow_mut()
                .ok()
                .and_then(|mut w| w.waited.remove(&self.id))
        });
        if let Some(ms) = waited {
            host::add_response_header("x-throttle-wait-ms", &ms.to_string());
        }
        if let Some(note) = &self.dry_run_note {
            host::add_response_header("x-throttle-dry-run", note);
        }
        if let Some((limit, remaining, reset)) = self.rate_limit {
            host::add_response_header("x-ratelimit-limit", &limit.to_string());
            host::add_response_header("x-ratelimit-remaining", &remaining.to_string());
            host::add_response_header("x-ratelimit-reset", &reset.to_string());
        }
        if end_of_stream {
            self.release_slot();
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            self.release_slot();
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.release_slot();
        Action::Continue
    }
}
