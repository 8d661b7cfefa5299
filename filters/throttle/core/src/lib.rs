//! Pure logic of the throttle filter: configuration, request matching, keys,
//! the virtual schedule (GCRA), the concurrency gate, and the per-worker
//! queues of held requests.
//!
//! Nothing here talks to a host. Time is always passed in as integer
//! nanoseconds of a monotonic clock (the clock is injected), and shared state
//! is reached through the [`schedule::SharedCell`] trait, so every behaviour is
//! unit-tested exactly.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod cluster;
pub mod config;
pub mod gate;
pub mod keys;
pub mod matcher;
pub mod queue;
pub mod schedule;
pub mod stats;
pub mod units;
pub mod wire;

#[cfg(test)]
mod testing;

pub use config::{Config, ConfigError, Rule};
pub use queue::{HeldQueue, Released};
pub use schedule::{admit, admit_keyed, admit_with_quota, Admission, Schedule, SharedCell};

/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;
/// Nanoseconds per second.
pub const NS_PER_S: u64 = 1_000_000_000;
