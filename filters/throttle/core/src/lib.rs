//! Pure logic of the throttle filter: configuration, the virtual schedule (GCRA),
//! and the per-worker queue of held requests.
//!
//! Nothing here talks to a host. Time is always passed in as integer nanoseconds
//! of a monotonic clock (the clock is injected), so every behaviour is unit-tested
//! to the nanosecond.

pub mod config;
pub mod queue;
pub mod schedule;
pub mod units;
pub mod wire;

pub use config::{Config, ConfigError, Rule};
pub use queue::{HeldQueue, Released};
pub use schedule::{admit, Admission, Schedule, TatStore};

/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;
/// Nanoseconds per second.
pub const NS_PER_S: u64 = 1_000_000_000;
