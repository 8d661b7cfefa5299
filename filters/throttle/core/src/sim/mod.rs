//! The fleet simulation on what ships (feature `testing`): simulated Envoy
//! processes ([`process`]) that run the shipped [`crate::Stream`],
//! [`crate::Worker`] and calling side ([`crate::cluster::Calls`]) on a store
//! that behaves like Envoy's shared data, against an in-memory rate limit
//! service ([`engine`]), in virtual time ([`fleet`]); the invariants every run
//! must keep ([`invariants`]), and the seeded sweep that searches the space of
//! fleets, rates, rules, demand, faults and clocks for a run that breaks one
//! ([`sweep`]).
//!
//! Test support only (never in the `.wasm`): indexing is allowed here.
#![allow(clippy::indexing_slicing)]

pub mod engine;
pub mod fleet;
pub mod invariants;
pub mod process;
pub mod rng;
pub mod scenario;
pub mod sweep;

pub use fleet::{run, Trace};
pub use process::{End, Record};
pub use scenario::{Fault, Load, ProxySpec, RuleSpec, Scenario, Shape};
