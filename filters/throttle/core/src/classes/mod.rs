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
//!   highest class with requests waiting. The floor slots are a Beatty
//!   sequence of the classes' summed `min_share` (any run of `n` slots holds
//!   that share of `n`, rounded down or up), split among the classes with a
//!   floor the same way, one after the other ([`floor_of`]): over any run of
//!   `n` slots a class gets `min_share * n` of them, less less than one when
//!   it is the only class with a floor, give or take a few when several
//!   have one ([`floor_slots_at_most`]). A grant is to the class's next ticket, wherever
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
//!   slot is never used twice, and never lost to an abandoned ticket. A slot
//!   passed on to a ticket another worker holds wakes the workers (the
//!   glue's wake queues): else it went on one worker's tick at a time
//!   through a run of abandoned tickets held by several workers, and left
//!   ticks after its time (fleet sweep seed 294: 219 in 100 ms at 2,000/s).
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
//! `stream/class.rs`; the tick's part is `worker/lines.rs`.

pub mod estimate;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
pub mod tickets;
pub mod waiters;

pub use estimate::{cannot_make_it, turn_ns, Backlog};
pub use tickets::{Line, Tickets};
pub use waiters::{ClassWaiter, ClassWaiters};

use crate::config::Class;

/// Most classes of a rule (the shared value always holds this many).
pub const MAX: usize = crate::config::spec::MAX_CLASSES;

pub use crate::rate::CATCH_UP_NS;

/// The class whose floor slot `slot` is, if that class has requests waiting.
///
/// Two steps, each a pure function of the slot's index (the same sequence
/// on every proxy): whether `slot` is a floor slot at all, and whose. The
/// floor slots are a Beatty sequence of the classes' summed `min_share` `P`
/// (slot `i` is one when `floor((i + 1) P) > floor(i P)`), so any `n`
/// consecutive slots hold `floor(n P)` or `ceil(n P)` of them: a single
/// class with a floor gets its share of every run of slots, less less than
/// one (until 2026-11-29 `frac(i phi)` in the class's interval, which
/// strayed by 2 in 300 slots: 58 of 60 in one second at 300/s). Several
/// classes with floors split the floor slots the same way, one after the
/// other: the first takes its part of them as a Beatty sequence, the next
/// its part of the rest, and so on (each step strays by less than one more).
pub fn floor_of(slot: u64, classes: &[Class], waiting: &[u64; MAX]) -> Option<usize> {
    let total: u128 = classes.iter().map(|c| u128::from(c.min_share_ppm)).sum();
    if total == 0 {
        return None;
    }
    let total = total.min(1_000_000);
    let before = u128::from(slot) * total / 1_000_000;
    let after = (u128::from(slot) + 1) * total / 1_000_000;
    if after == before {
        return None;
    }
    // Whose: the `k`-th floor slot goes to the first class with a floor if
    // it is one of that class's Beatty sequence over the floor slots (its
    // part of `P`), else on to the next class, over the floor slots the
    // first did not take, and so on.
    let mut k = before;
    let mut rest = total;
    for (c, class) in classes.iter().enumerate() {
        let ppm = u128::from(class.min_share_ppm);
        if ppm == 0 {
            continue;
        }
        let ppm = ppm.min(rest);
        let (lo, hi) = (k * ppm / rest, (k + 1) * ppm / rest);
        if hi > lo || ppm == rest {
            return (waiting.get(c).copied().unwrap_or(0) > 0).then_some(c);
        }
        // Its index among the floor slots this class did not take.
        k -= lo;
        rest -= ppm;
        if rest == 0 {
            break;
        }
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
