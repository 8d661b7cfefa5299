//! Cluster scope's calls to the engine, from one VM per process: the VM that
//! holds the caller lease in shared data (renewed on each of its ticks, taken
//! over by another VM when it lapses) reads each cluster rule's facts, lets
//! the core's [`Caller`] decide what to claim, sends the call with
//! `dispatch_http_call`, and publishes what the answer grants into shared
//! data, where every worker's requests take their slots.

use throttle_core::cluster::{self, Call, Caller, Failure, RuleFacts, RuleStats, RuleUpdate};
use throttle_core::stats::{Counts, Stat};
use throttle_core::store::{BlobId, CellId, Store};
use throttle_core::{SharedCell, NS_PER_MS};

use crate::host::{Host, Level};
use crate::plugin::Plugin;
use crate::shared::SharedStore;

/// How long the lease lasts without renewal (the holder renews it on every
/// tick, every few ms while it holds requests, else every
/// [`crate::worker::CALLER_TICK_MS`]).
pub const LEASE_NS: u64 = 300 * NS_PER_MS;

/// The calling side of one plugin configuration in one VM.
pub struct Calls {
    caller: Caller,
    /// The configuration's index of each of the caller's rules.
    rules: Vec<usize>,
    /// This root context's lease token (never 0).
    me: u64,
    /// The call in flight: its token and when it was sent (wall ns).
    pending: Option<u32>,
    /// Stats last handed to the host, per caller rule.
    reported: Vec<RuleStats>,
    /// When the host last refused a call and we said so (wall ns): once a minute at most.
    warned_at: Option<u64>,
}

impl Calls {
    /// The calling side of `plugin`, if it has cluster rules and an engine.
    pub fn new(plugin: &Plugin, me: u64, phase_permille: u64) -> Option<Calls> {
        let engine = plugin.config.engine.as_ref()?;
        let (rules, specs): (Vec<usize>, Vec<_>) = plugin
            .config
            .rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| cluster::rule_spec(r).map(|s| (i, s)))
            .unzip();
        if rules.is_empty() {
            return None;
        }
        let reported = vec![RuleStats::default(); rules.len()];
        Some(Calls {
            caller: Caller::new(engine, specs).with_phase(phase_permille),
            rules,
            me: me.max(1),
            pending: None,
            reported,
            warned_at: None,
        })
    }

    /// Whether this VM holds (or now takes) the lease at `mono`.
    fn lease<H: Host>(&self, store: SharedStore<'_, H>, mono: u64) -> bool {
        let mut cell = store.cell(CellId::Caller);
        for _ in 0..4 {
            let Ok((value, token)) = cell.load() else {
                return false;
            };
            let [holder, until] = value.unwrap_or([0, 0]);
            if holder != self.me && holder != 0 && until > mono {
                return false;
            }
            match cell.store([self.me, mono.saturating_add(LEASE_NS)], token) {
                Ok(true) => return true,
                Ok(false) => continue,
                Err(_) => return false,
            }
        }
        false
    }

    /// One tick of this VM: if it holds the lease, read the facts, let the
    /// core plan, send the call and publish any change.
    pub fn on_tick<H: Host>(&mut self, host: H, plugin: &Plugin) {
        let store = plugin.store(host);
        if !self.lease(store, host.monotonic_ns()) {
            return;
        }
        let facts: Vec<RuleFacts> = self
            .rules
            .iter()
            .map(|&i| RuleFacts {
                arrived_total: plugin.metrics.total(host, i, Stat::Requests).unwrap_or(0),
                waiting: store
                    .load(CellId::Waiting(i))
                    .ok()
                    .and_then(|(v, _)| v)
                    .map_or(0, |[n, _]| n),
            })
            .collect();
        let now = host.wall_ns();
        let (call, updates) = self.caller.tick(now, &facts);
        self.publish(host, plugin, now, &updates);
        if let Some(call) = call {
            self.send(host, plugin, &call);
        }
        self.report(host, plugin);
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
                    .is_none_or(|t| now.saturating_sub(t) >= 60 * throttle_core::NS_PER_S)
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
                let updates = self.caller.on_answer(now, Err(Failure::Transport));
                self.publish(host, plugin, now, &updates);
            }
        }
    }

    /// The answer to a call (`token`), delivered to this VM.
    pub fn on_response<H: Host>(&mut self, host: H, plugin: &Plugin, token: u32, body_size: usize) {
        if self.pending != Some(token) {
            return;
        }
        self.pending = None;
        let now = host.wall_ns();
        // Envoy delivers a timeout or a reset as an answer without headers.
        let answer = match host.http_call_status() {
            Some(status) => {
                let body = host.http_call_body(body_size).unwrap_or_default();
                self.caller.on_answer(now, Ok((status, &body)))
            }
            None => self.caller.on_answer(now, Err(Failure::Transport)),
        };
        self.publish(host, plugin, now, &answer);
        self.report(host, plugin);
    }

    /// Writes each update into its rule's grants.
    fn publish<H: Host>(&self, host: H, plugin: &Plugin, now: u64, updates: &[RuleUpdate]) {
        let store = plugin.store(host);
        for u in updates {
            let Some(&index) = self.rules.get(u.rule) else {
                continue;
            };
            let Some(reach) = plugin.config.rules.get(index).and_then(cluster::rule_reach) else {
                continue;
            };
            let usable = cluster::publish(
                &mut store.blob(BlobId::Grants(index)),
                &mut store.cell(CellId::Cursor(index)),
                &reach,
                now,
                u.mode,
                u.grant_rate_per_s,
                &u.ranges,
            );
            match usable {
                Ok(usable) => self.set_unused(host, plugin, u.rule, index, usable),
                Err(_) => host.log(
                    Level::Warn,
                    &format!("throttle: rule {index}: could not publish grants to shared data"),
                ),
            }
        }
    }

    /// `slots_unused` = granted - taken - still usable.
    fn set_unused<H: Host>(&self, host: H, plugin: &Plugin, i: usize, index: usize, usable: u64) {
        let granted = self.caller.stats(i).map_or(0, |s| s.granted);
        let taken = plugin
            .metrics
            .total(host, index, Stat::SlotsTaken)
            .unwrap_or(0);
        let unused = granted.saturating_sub(taken).saturating_sub(usable);
        plugin.metrics.set(host, index, Stat::SlotsUnused, unused);
    }

    /// Hands the caller's counters to the metrics (deltas since the last
    /// report; flushed at this VM's next tick, which runs every
    /// [`crate::worker::CALLER_TICK_MS`] at least).
    fn report<H: Host>(&mut self, host: H, plugin: &Plugin) {
        let now = host.wall_ns();
        for (i, &index) in self.rules.iter().enumerate() {
            let Some(stats) = self.caller.stats(i) else {
                continue;
            };
            let Some(last) = self.reported.get_mut(i) else {
                continue;
            };
            let mut counts = Counts::NONE;
            for (stat, new, old) in [
                (Stat::EngineCalls, stats.calls, last.calls),
                (Stat::EngineFailures, stats.failures, last.failures),
                (Stat::SlotsGranted, stats.granted, last.granted),
            ] {
                counts.add(
                    stat,
                    i32::try_from(new.saturating_sub(old)).unwrap_or(i32::MAX),
                );
            }
            counts.record(Stat::FallbackMs, stats.fallback_total_ns(now) / NS_PER_MS);
            plugin.metrics.count(host, index, &counts);
            *last = stats;
        }
    }
}
