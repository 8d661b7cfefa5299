//! What the root context hands to every HTTP context: the validated
//! configuration with per-rule handles, and the worker's state.

use std::collections::HashMap;

use throttle_core::gate::GateWaiters;
use throttle_core::keys::KeyHasher;
use throttle_core::{Config, HeldQueue};

use crate::host;
use crate::metrics::RuleMetrics;

/// Shared-data key of the key-hashing seed.
pub const SEED_KEY: &str = "throttle/v2/seed";

/// A validated configuration with its per-rule runtime handles.
pub struct Plugin {
    pub config: Config,
    pub rules: Vec<RuleRuntime>,
    pub hasher: KeyHasher,
}

/// Per-rule shared-data keys and metrics.
pub struct RuleRuntime {
    /// The rule's unkeyed rate schedule.
    pub rate_key: String,
    /// Prefix of the rule's key table slots (`<prefix><slot>`).
    pub slot_prefix: String,
    /// The rule's concurrency gate.
    pub gate_key: String,
    pub metrics: RuleMetrics,
}

impl Plugin {
    pub fn new(config: Config, seed: (u64, u64)) -> Self {
        let rules = config
            .rules
            .iter()
            .map(|r| {
                let base = format!("throttle/v2/rule/{}/", r.name);
                RuleRuntime {
                    rate_key: format!("{base}rate"),
                    slot_prefix: format!("{base}k/"),
                    gate_key: format!("{base}gate"),
                    metrics: RuleMetrics::define(&r.name),
                }
            })
            .collect();
        Plugin {
            config,
            rules,
            hasher: KeyHasher::new(seed),
        }
    }

    /// Creates the rules' shared cells so that updates always carry a CAS
    /// token. Returns the names of rules whose cells could not be created.
    pub fn init_cells(&self) -> Vec<&str> {
        self.config
            .rules
            .iter()
            .zip(&self.rules)
            .filter(|(r, rt)| {
                let rate_ok = r.schedule.is_none() || host::ensure_cell(&rt.rate_key, [0, 0]);
                let gate_ok = r.concurrency.is_none() || host::ensure_cell(&rt.gate_key, [0, 0]);
                !(rate_ok && gate_ok)
            })
            .map(|(r, _)| r.name.as_str())
            .collect()
    }
}

/// State of one worker: its held requests, waiters at concurrency gates,
/// requests holding a gate slot, and the waits of resumed requests.
#[derive(Default)]
pub struct Worker {
    /// Requests held by a rate schedule until their release time.
    pub queue: HeldQueue,
    /// Requests waiting for a concurrency slot.
    pub gate: GateWaiters,
    /// Requests holding a concurrency slot: context id -> rule index.
    pub in_flight: HashMap<u32, usize>,
    /// Resumed requests: context id -> milliseconds held (for `x-throttle-wait-ms`).
    pub waited: HashMap<u32, u64>,
    /// Whether the root context's tick runs.
    pub ticking: bool,
}

impl Worker {
    /// Requests held now, by rate or by gate.
    pub fn held(&self) -> usize {
        self.queue.len() + self.gate.len()
    }

    /// Whether `id` is held now.
    pub fn holds(&self, id: u32) -> bool {
        self.queue.contains(id) || self.gate.contains(id)
    }

    /// Whether anything needs the tick.
    pub fn needs_ticks(&self) -> bool {
        !self.queue.is_empty() || self.gate.needs_ticks()
    }

    /// Starts the tick if it is not running.
    pub fn ensure_ticking(&mut self, period_ms: u32) {
        if !self.ticking {
            self.ticking = host::set_tick_period_ms(period_ms);
        }
    }
}
