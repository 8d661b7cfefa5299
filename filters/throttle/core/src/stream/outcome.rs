//! The one answer every stage gives about a request (the rate, the cluster's
//! grid, the gate, and the worker's retries of them), carried out by
//! [`super::enforce`] (or, on tick, by the worker).

/// What a stage decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Within the stage's limit: on to the next stage, or continue.
    Go,
    /// Its turn is at this monotonic time: hold it until then (a rate
    /// schedule's turn, a grid slot's time).
    Hold { until: u64 },
    /// It has no turn yet: wait, until a deadline at most.
    Wait(Wait),
    /// Answer now with the rule's rejection and this `retry-after`.
    Reject { retry_after_s: u64 },
    /// The shared state could not be read or updated: fail closed.
    Contention,
}

/// What a request without a turn waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A concurrency slot: this gate ticket's turn.
    Gate { ticket: u64, deadline: u64 },
    /// Cluster scope while the engine fails: the fallback schedule's turn at
    /// `until`; should the grid be back by then, the rule's line instead
    /// (until `deadline`), so that a turn given during a blip never goes out
    /// on top of the whole grid after it.
    Fallback { until: u64, deadline: u64 },
    /// A slot of the rule's rate, granted in ticket order: this ticket of
    /// class `class` of the rule's line (its priority classes, or a cluster
    /// rule's own line, class 0).
    Class {
        class: usize,
        ticket: u64,
        deadline: u64,
        /// When its turn is expected, if nothing changes (the dry-run note).
        until: u64,
    },
}
