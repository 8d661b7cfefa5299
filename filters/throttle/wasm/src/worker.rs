//! One worker's state as the glue keeps it: the core's [`Worker`] and the
//! worker's tick policy, with its three periods in one place.
//!
//! The tick carries out the core's plan (releases, gate turns, retries of
//! requests waiting for grants), hands the batched statistics to the host
//! ([`crate::metrics`]), and, in the VM that calls the engine, lets the
//! calling side plan its call. It runs only while it has work: fast while
//! anything is held, slow while statistics wait to be flushed or the VM
//! may call the engine, not at all otherwise.

use std::cell::{Cell, RefCell};

use throttle_core::worker::Worker;

use crate::host::Host;

/// Tick period while requests are held. Envoy fires a 1 ms tick about every
/// 4 ms here; every request due by then is released at once, and the
/// schedule lives in virtual time, so late ticks shift no later release.
pub const TICK_MS: u32 = 1;

/// Tick period while only statistics wait to be handed to the host.
pub const FLUSH_MS: u32 = 100;

/// Tick period of a VM with cluster rules while nothing is held: often
/// enough to call once per epoch (at least 100 ms) at the right phase.
pub const CALLER_TICK_MS: u32 = 20;

/// Tick period of a VM with adaptive rules while nothing is held: its
/// tally goes to the shared one, and the VM holding a rule's learner lease
/// learns every round (`adaptive::ROUND_NS`, 100 ms). Twice per round, so
/// that answers reach the learner within 50 ms of a round rather than 100
/// (a drop is cut within 500 ms: the queue test's 300 ms window, a round,
/// and this); the lease (300 ms) outlasts a few late ticks.
pub const LEARNER_TICK_MS: u32 = 50;

/// A worker's state and tick.
#[derive(Debug, Default)]
pub struct WorkerGlue {
    /// The core's state of this worker (borrowed for each decision; a busy
    /// borrow is answered by the glue, failing closed).
    pub core: RefCell<Worker>,
    /// The tick period in force (0: no tick).
    tick_ms: Cell<u32>,
    /// Whether this VM may call the engine (cluster rules): it keeps a slow tick.
    calls: Cell<bool>,
    /// Whether this VM has adaptive rules: it keeps a tick every
    /// `LEARNER_TICK_MS` (to hand over its tally and, holding the learner
    /// lease, to learn).
    learner: Cell<bool>,
}

impl WorkerGlue {
    fn set_tick<H: Host>(&self, host: H, ms: u32) {
        if self.tick_ms.get() != ms && host.set_tick_period_ms(ms) {
            self.tick_ms.set(ms);
        }
    }

    /// Ticks at least every `ms` (a running faster tick stays).
    fn at_least<H: Host>(&self, host: H, ms: u32) {
        let now = self.tick_ms.get();
        if now == 0 || now > ms {
            self.set_tick(host, ms);
        }
    }

    /// Something is held: tick fast.
    pub fn tick_fast<H: Host>(&self, host: H) {
        self.set_tick(host, TICK_MS);
    }

    /// Statistics wait to be flushed.
    pub fn tick_to_flush<H: Host>(&self, host: H) {
        self.at_least(host, FLUSH_MS);
    }

    /// Starts the tick of a VM with adaptive rules.
    pub fn tick_for_learner<H: Host>(&self, host: H) {
        self.learner.set(true);
        self.at_least(host, LEARNER_TICK_MS);
    }

    /// Starts the tick of a VM with cluster rules.
    pub fn tick_for_calls<H: Host>(&self, host: H) {
        self.calls.set(true);
        self.at_least(host, CALLER_TICK_MS);
    }

    /// After a tick (and its flush): fast while something is held, slow while
    /// there was traffic in the last period or the VM may call, else no tick.
    pub fn after_tick<H: Host>(&self, host: H, had_traffic: bool) {
        // A busy borrow (cannot happen) keeps the fast tick: the safe side.
        let held = self.core.try_borrow().map_or(true, |w| w.needs_ticks());
        let ms = if held {
            TICK_MS
        } else if self.calls.get() {
            CALLER_TICK_MS
        } else if self.learner.get() {
            LEARNER_TICK_MS
        } else if had_traffic {
            FLUSH_MS
        } else {
            0
        };
        self.set_tick(host, ms);
    }
}
