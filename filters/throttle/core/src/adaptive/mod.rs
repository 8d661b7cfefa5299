//! Adaptive pacing: learn the rate the upstream can take from its answers.
//! (Design notes: README.md in this folder.)

pub mod controller;
pub mod tally;

#[cfg(any(test, feature = "testing"))]
pub mod sim;

#[cfg(test)]
mod tests;

pub use controller::{
    interval_of_rate, rate_of_interval, Controller, Reason, Reasons, Tuning, Update, MICRO,
};
pub use tally::{Class, Observation, Outcome, Tally};
