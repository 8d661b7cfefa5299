//! One worker's state as the glue keeps it: the core's [`Worker`], the tick
//! period in force, and counter changes not yet handed to the host.
//!
//! Counters and gauges are batched per worker and handed to Envoy at each
//! tick: every ~4 ms while requests are held, else every [`FLUSH_MS`] while
//! there is traffic. A request within the rate then makes no metric host
//! call. What it costs: Envoy's statistics lag the filter by at most
//! [`FLUSH_MS`] (plus a tick), which no scrape (Prometheus: 15 s) sees; the
//! totals are exact. The `wait_ms` histogram is recorded at once (held
//! requests only).

use throttle_core::stats::Counts;
use throttle_core::worker::Worker;

use crate::caller::CALLER_TICK_MS;
use crate::host::Host;
use crate::plugin::Plugin;

/// Tick period while requests are held. Envoy fires a 1 ms tick about every
/// 4 ms here; every request due by then is released at once, and the
/// schedule lives in virtual time, so late ticks shift no later release.
pub const TICK_MS: u32 = 1;

/// Tick period while only counters wait to be handed to the host.
pub const FLUSH_MS: u32 = 100;

/// A worker's state.
#[derive(Debug, Default)]
pub struct Local {
    pub worker: Worker,
    /// The tick period in force (0: no tick).
    tick_ms: u32,
    /// Counter changes by rule, not yet handed to the host.
    pending: Vec<Counts>,
    /// Whether anything was counted since the last flush.
    dirty: bool,
    /// Whether this VM may call the engine (cluster rules): it keeps a slow tick.
    pub calls: bool,
}

impl Local {
    fn set_tick<H: Host>(&mut self, host: H, ms: u32) {
        if self.tick_ms != ms && host.set_tick_period_ms(ms) {
            self.tick_ms = ms;
        }
    }

    /// Counts `counts` for rule `rule`, to be handed over at the next tick.
    pub fn count<H: Host>(&mut self, host: H, rule: usize, counts: &Counts) {
        if counts.is_empty() {
            return;
        }
        if self.pending.len() <= rule {
            self.pending.resize(rule + 1, Counts::NONE);
        }
        if let Some(p) = self.pending.get_mut(rule) {
            p.merge(counts);
        }
        self.dirty = true;
        if self.tick_ms == 0 || self.tick_ms > FLUSH_MS {
            self.set_tick(host, FLUSH_MS);
        }
    }

    /// Something is held: tick fast.
    pub fn tick_fast<H: Host>(&mut self, host: H) {
        self.set_tick(host, TICK_MS);
    }

    /// Hands every pending counter change to the host.
    pub fn flush<H: Host>(&mut self, host: H, plugin: &Plugin) {
        if !self.dirty {
            return;
        }
        for (rule, counts) in self.pending.iter_mut().enumerate() {
            plugin.apply(host, rule, counts);
            *counts = Counts::NONE;
        }
        self.dirty = false;
    }

    /// After a tick (and its flush): fast while something is held, slow while
    /// there was traffic in the last period, else no tick at all.
    pub fn after_tick<H: Host>(&mut self, host: H, had_traffic: bool) {
        let ms = if self.worker.needs_ticks() {
            TICK_MS
        } else if self.calls {
            CALLER_TICK_MS
        } else if had_traffic {
            FLUSH_MS
        } else {
            0
        };
        self.set_tick(host, ms);
    }

    /// Starts the tick of a VM with cluster rules.
    pub fn tick_for_calls<H: Host>(&mut self, host: H) {
        self.calls = true;
        if self.tick_ms == 0 || self.tick_ms > CALLER_TICK_MS {
            self.set_tick(host, CALLER_TICK_MS);
        }
    }

    /// Whether counts are waiting to be flushed.
    pub fn dirty(&self) -> bool {
        self.dirty
    }
}
