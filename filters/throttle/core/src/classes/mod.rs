//! Priority classes inside a rule's paced queue: critical traffic leaves
//! first, no class starves below its floor, and the rule's total rate stays
//! one exact schedule.
//!
//! Release times are not fixed at admission (as they are for a rule without
//! classes): a request that cannot go at once takes a **ticket** of its class
//! and waits on its worker; the order of release is decided at release, slot
//! by slot ("pull"):
//!
//! * **One slot source** per rule ([`crate::rate`]): the rule's GCRA cell in process
//!   scope, its owned grid slots in cluster scope. Each release takes exactly
//!   one slot, so the total is exact whatever the mix of classes.
//! * **Tickets** ([`tickets`]), in one shared value per rule: per class, the
//!   tickets handed out (`next`), the tickets granted a slot in ticket order
//!   (`granted`), the abandoned tickets not yet granted, and recent arrivals.
//!   One value, so every change across classes is one compare-and-swap.
//! * **Grants**: on its tick, any worker with waiters of the rule takes every
//!   due slot and grants it ([`choose`]): slot `i` goes to class `c` if it is
//!   one of `c`'s **floor slots** and `c` has requests waiting, else to the
//!   highest class with requests waiting. Slot `i` is a floor slot of `c` when
//!   `frac(i * phi)` lies in `c`'s interval of the classes' cumulative
//!   `min_share` ([`floor_of`]): a low-discrepancy sequence, so over any run of
//!   `n` slots a class gets `min_share * n` of them give or take a few
//!   ([`floor_slots_at_most`]). A grant is to the class's next ticket, wherever
//!   it waits: the worker holding it resumes it at its own next tick. So no
//!   worker waits for another to tick before the schedule moves on, and a
//!   critical request held by one worker leaves before a batch request held by
//!   another.
//! * **Abandoned tickets** (client gone, or displaced) are counted in the
//!   shared value at once, so the grants see only live waiters ([`tickets::abandon`]);
//!   the class's next ticket is skipped at once. Its holder keeps any other
//!   until it is next in line (then skips it) or a grant reaches it (grants
//!   go in ticket order): then it passes the slot on to the class's next
//!   ticket, or gives it back to the slot source ([`tickets::settle`]). A
//!   slot is never used twice, and never lost to an abandoned ticket.
//! * **Admission** ([`estimate`]): a new request of class `c` goes at once only
//!   if no class at or above `c` has requests waiting and the due slot is not a
//!   floor slot of a lower class waiting. Else it queues, unless its estimated
//!   turn (from the waiting counts, the floors of the lower classes waiting and
//!   the recent arrival rate of the higher classes) lies beyond its class's
//!   `max_queue_delay`: then it is rejected at once.
//! * **Displacement**: a held request whose turn can no longer come before its
//!   deadline (even if no higher request arrived from now on), or whose
//!   deadline passed, is answered with the rule's rejection and counted
//!   `displaced`.
//!
//! The per-worker side (which tickets this worker holds) is
//! [`waiters::ClassWaiters`]; the stage that admits a request is
//! `stream/class.rs`; the tick's part is in [`crate::worker`].

pub mod estimate;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
mod tick;
pub mod tickets;
pub mod waiters;

pub use estimate::{cannot_make_it, turn_ns, Backlog};
pub use tickets::{Line, Tickets};
pub use waiters::{ClassWaiter, ClassWaiters};

use crate::config::Class;

/// Most classes of a rule (the shared value always holds this many).
pub const MAX: usize = crate::config::spec::MAX_CLASSES;

/// `2^64 / phi`: slot `i`'s point in `[0, 1)` is `i * GOLDEN mod 2^64`.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

pub use crate::rate::CATCH_UP_NS;

/// The class whose floor slot `slot` is, if that class has requests waiting.
pub fn floor_of(slot: u64, classes: &[Class], waiting: &[u64; MAX]) -> Option<usize> {
    let point = u128::from(slot.wrapping_mul(GOLDEN)) * 1_000_000;
    let mut lo: u128 = 0;
    for (c, class) in classes.iter().enumerate() {
        let hi = lo + u128::from(class.min_share_ppm);
        if point >= lo << 64 && point < hi << 64 {
            return (waiting.get(c).copied().unwrap_or(0) > 0).then_some(c);
        }
        lo = hi;
    }
    None
}

/// Which class slot `slot` goes to: its floor class if that one waits, else
/// the highest class waiting (None: nobody waits).
pub fn choose(slot: u64, classes: &[Class], waiting: &[u64; MAX]) -> Option<usize> {
    floor_of(slot, classes, waiting).or_else(|| highest_waiting(classes.len(), waiting))
}

/// The highest class (lowest index) with requests waiting.
pub fn highest_waiting(n: usize, waiting: &[u64; MAX]) -> Option<usize> {
    waiting.iter().take(n).position(|&w| w > 0)
}

/// Whether a new request of class `class` may take slot `slot` at once: no
/// class at or above it waits, and the slot is not a floor slot of a lower
/// class that waits.
pub fn may_go_now(slot: u64, class: usize, classes: &[Class], waiting: &[u64; MAX]) -> bool {
    let above_or_same = waiting.iter().take(class + 1).any(|&w| w > 0);
    !above_or_same && floor_of(slot, classes, waiting).is_none_or(|f| f <= class)
}

/// An upper bound on how many of `n` consecutive slots (any start) are
/// floor slots of a class with share `ppm`: `ppm * n` plus the sequence's
/// discrepancy, `2 + log2(n + 1) / 4` (checked exhaustively for windows up
/// to 40,000 slots in the tests; the observed worst is about 4).
pub fn floor_slots_at_most(ppm: u32, n: u64) -> u64 {
    if ppm == 0 || n == 0 {
        return 0;
    }
    let expected = (u128::from(ppm) * u128::from(n)).div_ceil(1_000_000) as u64;
    expected.saturating_add(discrepancy(n)).min(n)
}

/// How far the count of a class's floor slots in `n` consecutive slots may
/// stray from its share: `2 + log2(n + 1) / 4` (see [`floor_slots_at_most`]).
pub fn discrepancy(n: u64) -> u64 {
    2 + u64::from(64 - n.saturating_add(1).leading_zeros()) / 4
}

#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod tests;
