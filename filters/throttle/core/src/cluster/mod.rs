//! Cluster scope: one rate across many Envoy processes, through
//! envoyproxy/ratelimit + Redis used as an atomic fetch-and-add
//! (engine/README.md). Pure: no host calls; wall-clock time comes in as
//! nanoseconds since the Unix epoch.
//!
//! * [`grid`]: the slot grid every proxy computes alike, and the hourly guard.
//! * [`caller`]: the calling VM — what to claim, when, what an answer grants,
//!   fallback and return.
//! * [`mod@engine`]: the engine as a trait (build the request for the caller's
//!   claims, read the answer); [`wire`]: envoyproxy/ratelimit's `POST /json`,
//!   its one implementation.
//! * [`crate::lease`]: which VM of a process calls; [`calls`]: that VM's side as a
//!   whole (lease, plan, request, publish, statistics), all but the I/O.
//! * [`grants`]: owned slots in shared data — the grants blob
//!   ([`crate::SharedBlob`]), the cursor ([`crate::SharedCell`]) and [`take`].
//! * `sim` (feature `testing`): an in-memory engine that models the service
//!   (window suffix included), and simulated proxies that run the shipped
//!   [`crate::Worker`], [`crate::Stream`] and [`Calls`] on the in-memory
//!   store, for tests and the simulation driver.
//!
//! How it runs (the order matters):
//!
//! 1. On configure: per rule, shared data for the grants blob, the cursor,
//!    the waiting count and the fallback schedule's TAT
//!    ([`crate::stream::initial_values`]); in every VM, one [`Calls`].
//! 2. On each VM's tick (every 20 ms at least): [`Calls::on_tick`]. The VM
//!    holding the lease reads [`RuleFacts`] (the rule's `requests` counter
//!    and the waiting count), lets the [`Caller`] plan, [`publish`]es every
//!    returned [`RuleUpdate`], and returns the [`Call`] to send (the glue:
//!    `dispatch_http_call` of the engine's request to `engine.cluster`,
//!    timeout `call.timeout_ns`).
//! 3. On the call's answer: [`Calls::on_answer`] with `(status, body)`, or
//!    `Failure::Transport` / `Failure::Timeout`; every update is published.
//! 4. Per request, on any worker: the stream's cluster stage, [`take`] with
//!    the rule's [`Reach`] and `Attempt::First`. `Now`: continue; `Hold`:
//!    hold `delay_ns`; both count as taken (metric). `Wait`: no owned slot
//!    near; the request joins the rule's line (the process's queue, one
//!    ticket each, granted the owned slots as they come due) if its turn
//!    ([`turn`]) comes within `max_queue_delay` less a margin, else it is
//!    refused now; one still waiting at its deadline goes on credit if the
//!    process may, else on a slot a failed call cost the process
//!    ([`at_deadline`]), else it is refused
//!    (counted; the invariants in engine/README.md say when that can
//!    happen).
//!    `Local`: [`crate::admit`] on the rule's fallback TAT with
//!    [`local_schedule`] (a retry: what is left of `max_queue_delay`).
//!    `Deny`, `Reject`, `Contention`: reject. Every request of the rule
//!    counts as arrived (the metric [`RuleFacts`] reads).
//! 5. Statistics per rule, returned by [`Calls`] as counts: calls, failures,
//!    slots granted, time in fallback ([`RuleStats::fallback_total_ns`]);
//!    slots unused = granted - taken - the usable count [`publish`] returns.
//!
//! Shared data per rule (proxy-wasm shared data, written with CAS; the keys
//! are the layout of [`crate::store`]: [`CellId::key`](crate::store::CellId::key)):
//!
//! | key | value | written by |
//! |---|---|---|
//! | `throttle/v2/rule/<rule>/grants` | [`Grants`] blob: 44 bytes + 16 per range, at most [`cursor::MAX_RANGES`] ranges | the calling VM ([`publish`]) |
//! | `throttle/v2/rule/<rule>/cursor` | `[next_slot, end_of_range]` (16 bytes) | every worker ([`take`]) |
//! | `throttle/v2/rule/<rule>/waiting` | `[count, 0]` | every worker ([`take`], [`add_waiting`]) |
//! | `throttle/v2/rule/<rule>/fallback` | the fallback schedule's `[0, tat]`, as a process rule's cell | every worker ([`crate::admit`]) |
//! | `t3/<rule>/x` | `[count, until_ms]`: slots a failed call cost, forgiven at deadlines ([`forgive`]) | the calling VM, and workers at a deadline ([`at_deadline`]) |
//! | `throttle/v2/caller/<hash of the configuration>` | the caller lease `[holder, until]` | the VMs that may call |

pub mod ahead;
pub mod caller;
pub mod calls;
pub mod cursor;
pub mod engine;
pub mod grants;
pub mod grid;
pub mod service_clock;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
pub mod skew;
pub mod wire;

pub use ahead::{
    at_deadline, before_its_time, credit_left, forgive, on_credit, repay, set_gap, Ahead,
    AtDeadline,
};
pub use caller::{
    Call, Caller, RuleFacts, RuleSpec, RuleStats, RuleUpdate, CALL_TOLERANCE_NS,
    MIN_CALL_INTERVAL_NS,
};
pub use calls::{Calls, Effects};
pub use cursor::{
    add_waiting, advance, cached_grants, load_grants, next_owned, read_grants, set_waiting,
    Attempt, Cursor, Grants, Mode, Reach, Take, Walk,
};
pub use engine::{Claim, Counted, Counter, Engine, Failure, Request};
pub use grants::{
    fallback_after_grants, margin_for, margin_ns, on_grid, owned_this_epoch, publish, reckon_limit,
    reset_grants, shift_grants, spare_in_lead, take, turn, turn_ns, DERATE, RECKON_NS,
};
pub use grid::Grid;

use std::sync::Arc;

use crate::config::{EngineConfig, Rule};
use crate::schedule::Schedule;

/// The engine of a configuration's `engine` block (today always
/// envoyproxy/ratelimit's JSON API; another engine is chosen here).
pub fn engine(config: &EngineConfig) -> Arc<dyn Engine> {
    Arc::new(wire::RatelimitJson {
        domain: config.domain.clone(),
    })
}

/// The calling VM's view of a validated cluster rule (None for process scope).
pub fn rule_spec(rule: &Rule) -> Option<RuleSpec> {
    let scope = rule.cluster?;
    let schedule = rule.schedule?;
    Some(RuleSpec {
        name: rule.name.clone(),
        grid: Grid::new(schedule.interval_ns),
        expected_replicas: scope.expected_replicas,
        on_engine_failure: scope.on_engine_failure,
    })
}

/// What a cluster rule's requests may reach on the grid (None for process scope).
pub fn rule_reach(rule: &Rule) -> Option<Reach> {
    rule.cluster?;
    let s = rule.schedule?;
    let burst = s.tau_ns / s.interval_ns.max(1);
    Some(Reach::new(
        Grid::new(s.interval_ns),
        burst,
        rule.max_delay_ns,
    ))
}

/// The process schedule of a rule in local fallback: one request every
/// `interval_ns`, the rule's burst, and what is left of its max_queue_delay
/// for this attempt (all of it for a first attempt).
pub fn local_schedule(reach: &Reach, interval_ns: u64, attempt: Attempt) -> Schedule {
    let burst = reach.slack_ns / reach.grid.interval_ns.max(1) - 1;
    Schedule::new(interval_ns, burst, attempt.max_delay(reach))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod holds;
