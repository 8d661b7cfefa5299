//! Pure logic of the throttle filter: configuration, request matching, keys,
//! the virtual schedule (GCRA), the concurrency gate, the per-worker queues
//! of held requests, and the decisions for a whole request ([`stream`]) and
//! for each tick ([`worker`]), returned as data for the glue to carry out.
//!
//! Nothing here talks to a host. Time is always passed in as integer
//! nanoseconds of a monotonic clock (the clock is injected), and shared state
//! is reached through the [`Store`] and [`SharedCell`] traits, so every
//! behaviour is unit-tested exactly.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod adaptive;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod gate;
pub mod keys;
pub mod matcher;
pub mod path;
pub mod queue;
pub mod ratelimit;
pub mod reply;
pub mod schedule;
pub mod stats;
pub mod store;
pub mod stream;
pub mod units;
pub mod wire;
pub mod worker;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use config::{Config, ConfigError, Rule};
pub use queue::{Held, HeldQueue};
pub use schedule::{admit, admit_keyed, admit_with_quota, Admission, Schedule, SharedCell};
pub use stats::{Counts, Stat};
pub use store::{CellId, Store};
pub use stream::{Decision, Env, Stream, Verdict};
pub use worker::{TickAction, TickPlan, Worker};

/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;
/// Nanoseconds per second.
pub const NS_PER_S: u64 = 1_000_000_000;
