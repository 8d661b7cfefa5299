//! A rule's validated `adaptive` block, as the configuration holds it (the
//! learner in [`crate::adaptive`] uses it; the validation is
//! `validate/adaptive.rs`).

/// Whether the learned rate paces, or is only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Pace at the learned rate.
    Enforce,
    /// Learn and report it, pace at the configured `rate`.
    Observe,
}

/// A rule's validated `adaptive` block: the bounds as intervals (the
/// interval of `max_rate` is the shortest), and the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub min_interval_ns: u64,
    pub max_interval_ns: u64,
    pub mode: Mode,
}
