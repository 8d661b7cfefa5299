//! Pure logic of the throttle filter: configuration, request matching, keys,
//! the virtual schedule (GCRA), the concurrency gate, the per-worker queues
//! of held requests, and the decisions for a whole request ([`stream`]) and
//! for each tick ([`worker`]), returned as data for the glue to carry out.
//!
//! Nothing here talks to a host. Time is always passed in as integer
//! nanoseconds of a monotonic clock (the clock is injected), and shared state
//! is reached through the [`Store`] and [`SharedCell`] traits ([`store`], the
//! ground floor), so every behaviour is unit-tested exactly.
//!
//! Where a change goes (floors from the ground up; a module imports only
//! from its own floor or below):
//!
//! | to change | edit | tested in |
//! |---|---|---|
//! | a shared value, its key | [`store`] ([`CellId`], the key layout) | `store.rs` |
//! | a configuration field | [`config::spec`] (the table), `config/validate.rs`, [`Rule`] | `config/tests.rs` |
//! | a statistic | one row of the [`stats`] table (name, kind, feature, doc), and the stage or tick that counts it | `stream/tests.rs`, `wasm/src/tests.rs` (each rule kind) |
//! | a step of the request's decision | one stage file in `stream/`, one line in [`Stream::on_request`] | `stream/tests.rs` |
//! | what a tick does | [`worker`] (a waiting room: [`queue::Room`]) | `stream/tests.rs`, `tests/properties.rs` |
//! | where a rule's slots come from | [`rate`] (one [`rate::RateSource`] per kind) | `classes/tests.rs`, the stream and cluster tests |
//! | cluster scope, its engine | [`cluster`] (one file per engine beside `wire.rs`) | `cluster/tests.rs`, `tests/cluster_properties.rs` (the simulation) |
//!
//! Floors, from the ground up (held by `tests/floors.rs`: no arrow up a
//! floor, no circle): `clock`, `units`, `store`, `stats`, `reply`, `path`,
//! `lease` (and `testing`) < `schedule`, `queue`, `gate`, `matcher`, `keys`,
//! `ratelimit` < `config` < `adaptive`, `cluster` < `rate` (where a rule's
//! slots come from), `classes` (its lines) < `worker` < `stream`.

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
pub mod classes;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod gate;
pub mod keys;
pub mod lease;
pub mod matcher;
pub mod path;
pub mod queue;
pub mod rate;
pub mod ratelimit;
pub mod reply;
pub mod schedule;
pub mod stats;
pub mod store;
pub mod stream;
pub mod units;
pub mod worker;

#[cfg(any(test, feature = "testing"))]
pub mod sim;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use clock::{NS_PER_MS, NS_PER_S};
pub use config::{Config, ConfigError, Rule};
pub use queue::{Held, HeldQueue};
pub use schedule::{admit, admit_keyed, admit_with_quota, Admission, Schedule};
pub use stats::{Counts, Stat};
pub use store::{BlobId, CellId, SharedBlob, SharedCell, Store, StoreError};
pub use stream::{Decision, Env, Stream, Verdict};
pub use worker::{TickAction, TickPlan, Worker};
