//! Stage: the rule's concurrency gate (see [`crate::gate`]): a slot now, a
//! ticket to wait with, or no room.

use crate::gate::{self, Enter};
use crate::store::{CellId, Store};

use super::{Ctx, Outcome, Wait};

/// Takes a ticket at the rule's gate (`limit` slots).
pub(super) fn enter<S: Store>(cx: &Ctx<'_, S>, limit: u32) -> Outcome {
    let mut cell = cx.env.store.cell(CellId::Gate(cx.index));
    match gate::enter(&mut cell, limit, cx.can_hold) {
        Enter::Go => Outcome::Go,
        Enter::Wait { ticket } => Outcome::Wait(Wait::Gate {
            ticket,
            deadline: cx.now.saturating_add(cx.rule.max_delay_ns),
        }),
        // The worker cannot hold one more request.
        Enter::Full => Outcome::Reject { retry_after_s: 1 },
        Enter::Contention => Outcome::Contention,
    }
}
