//! Adaptive pacing: learn the rate the upstream can take from its answers
//! and pace at it. Pure: [`Tally`] is what one round of the learner saw,
//! [`Controller`] turns rounds into the interval to pace at (within the
//! bounds) and the reasons it moved; `sim` (feature `testing`) is a
//! simulated backend with the real schedule as the pacer. The design, the
//! simulated figures and how it is wired into the filter (phase 2 of
//! issue 21): `README.md` in this folder.

pub mod controller;
pub mod deadline;
pub mod learner;
pub mod retry_after;
pub mod tally;

#[cfg(any(test, feature = "testing"))]
pub mod sim;

#[cfg(test)]
mod tests;

pub use crate::config::adaptive::{Mode, Settings};

pub use controller::{
    interval_of_rate, rate_of_interval, Controller, Reason, Reasons, Tuning, Update, MICRO,
};
pub use learner::{add_tally, take_tally, Learners, Round, ROUND_NS};
pub use tally::{Class, Observation, Origin, Outcome, Tally};
