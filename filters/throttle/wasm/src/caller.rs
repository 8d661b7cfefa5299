//! Cluster scope's calls to the engine, from this VM: the core's calling
//! side ([`cluster::Calls`]: the lease, the plan, publishing grants, the
//! statistics) decides; this sends its request as given to the engine's
//! Envoy cluster with `dispatch_http_call` and hands the answer back.

use throttle_core::clock::Once;
use throttle_core::cluster::{self, Call, Effects, Failure};
use throttle_core::stats::Stat;
use throttle_core::{NS_PER_MS, NS_PER_S};

use crate::host::{Host, HostClock, Level};
use crate::plugin::Plugin;

/// The calling side of one plugin configuration in one VM.
pub struct Calls {
    core: cluster::Calls,
    /// The token of the call in flight.
    pending: Option<u32>,
    /// When the host last refused a call and we said so (wall ns): once a minute at most.
    warned_at: Option<u64>,
}

impl Calls {
    /// The calling side of `plugin`, if it has cluster rules and an engine.
    pub fn new(plugin: &Plugin, me: u64, phase_permille: u64) -> Option<Calls> {
        Some(Calls {
            core: cluster::Calls::new(&plugin.config, me, phase_permille)?,
            pending: None,
            warned_at: None,
        })
    }

    /// One tick of this VM (the core plans only if it holds the lease).
    pub fn on_tick<H: Host>(&mut self, host: H, plugin: &Plugin) {
        let totals = |rule: usize, stat: Stat| plugin.metrics.total(host, rule, stat).unwrap_or(0);
        let out = self
            .core
            .on_tick(plugin.store(host), &mut Once::new(HostClock(host)), &totals);
        self.carry_out(host, plugin, out);
    }

    /// The answer to a call (`token`), delivered to this VM.
    pub fn on_response<H: Host>(&mut self, host: H, plugin: &Plugin, token: u32, body_size: usize) {
        if self.pending != Some(token) {
            return;
        }
        self.pending = None;
        // Envoy delivers a reset as an answer without headers, a timeout as
        // its own 504 (`parse_answer` reads both).
        let body;
        let answer = match host.http_call_status() {
            Some(status) => {
                body = host.http_call_body(body_size).unwrap_or_default();
                Ok((status, body.as_slice()))
            }
            None => Err(Failure::Transport),
        };
        self.answer(host, plugin, answer);
    }

    fn answer<H: Host>(&mut self, host: H, plugin: &Plugin, answer: Result<(u16, &[u8]), Failure>) {
        let totals = |rule: usize, stat: Stat| plugin.metrics.total(host, rule, stat).unwrap_or(0);
        let out = self.core.on_answer(
            plugin.store(host),
            &mut Once::new(HostClock(host)),
            answer,
            &totals,
        );
        self.carry_out(host, plugin, out);
    }

    fn carry_out<H: Host>(&mut self, host: H, plugin: &Plugin, out: Effects) {
        for problem in &out.problems {
            host.log(Level::Warn, &format!("throttle: {problem}"));
        }
        // Flushed at this VM's next tick (every CALLER_TICK_MS at least).
        for (rule, counts) in &out.counts {
            plugin.metrics.count(host, *rule, counts);
        }
        if let Some(call) = out.call {
            self.send(host, plugin, &call);
        }
    }

    fn send<H: Host>(&mut self, host: H, plugin: &Plugin, call: &Call) {
        let Some(engine) = plugin.config.engine.as_ref() else {
            return;
        };
        let timeout_ms = u32::try_from(call.timeout_ns.div_ceil(NS_PER_MS)).unwrap_or(u32::MAX);
        let headers: Vec<(&str, &str)> = call
            .request
            .headers
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        match host.http_call(&engine.cluster, &headers, &call.request.body, timeout_ms) {
            Ok(token) => self.pending = Some(token),
            Err(status) => {
                let now = host.wall_ns();
                if self
                    .warned_at
                    .is_none_or(|t| now.saturating_sub(t) >= 60 * NS_PER_S)
                {
                    self.warned_at = Some(now);
                    host.log(
                        Level::Warn,
                        &format!(
                            "throttle: the engine's cluster {:?} refused the call (status {status}); is it defined in this Envoy? (said at most once a minute)",
                            engine.cluster
                        ),
                    );
                }
                self.answer(host, plugin, Err(Failure::Transport));
            }
        }
    }
}
