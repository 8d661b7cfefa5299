//! The per-worker queue of held requests: a min-heap by release time, with
//! O(1) cancellation of a request whose client went away.
//!
//! Only the worker that holds a request can resume it, so each worker has its
//! own queue; the schedule that decides release times is shared.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A worker's waiting room: the requests it holds for one reason (a rate's
/// turn, [`HeldQueue`]; a concurrency slot, `gate::GateWaiters`; a ticket
/// of a rule's line, `classes::ClassWaiters`). The worker asks every room
/// alike; a new room is one more in `Worker::rooms`.
pub trait Room {
    /// Requests waiting here now.
    fn len(&self) -> usize;
    /// Whether nobody waits here.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether `context_id` waits here.
    fn contains(&self, context_id: u32) -> bool;
    /// Whether the room needs the worker's tick.
    fn needs_ticks(&self) -> bool {
        self.len() > 0
    }
}

impl Room for HeldQueue {
    fn len(&self) -> usize {
        HeldQueue::len(self)
    }
    fn contains(&self, context_id: u32) -> bool {
        HeldQueue::contains(self, context_id)
    }
}

/// A held request, as handed back when it is due or cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The host's id for the request's stream.
    pub context_id: u32,
    /// Index of the rule that held it.
    pub rule: usize,
    /// When it was held (monotonic ns).
    pub held_at: u64,
    /// When it is due (monotonic ns).
    pub release_at: u64,
    /// Cluster scope: held on the fallback schedule while the engine failed
    /// (at its turn, if the grid is back, it waits for grants instead).
    pub fallback: bool,
}

/// Held requests of one worker.
#[derive(Debug, Default)]
pub struct HeldQueue {
    /// (release_at, sequence, context id). Entries of cancelled requests stay
    /// until they surface and are skipped; see [`HeldQueue::compact`].
    heap: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// Live entries by context id, with the sequence number of their heap entry.
    live: HashMap<u32, (u64, Held)>,
    next_seq: u64,
}

impl HeldQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of requests held now.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Whether `context_id` is held now.
    pub fn contains(&self, context_id: u32) -> bool {
        self.live.contains_key(&context_id)
    }

    /// Holds a request until `release_at`. Holding a context id that is
    /// already held replaces its entry.
    pub fn hold(&mut self, context_id: u32, rule: usize, held_at: u64, release_at: u64) {
        self.insert(context_id, rule, held_at, release_at, false);
    }

    /// Holds a request of a cluster rule until its turn on the fallback
    /// schedule ([`Held::fallback`]).
    pub fn hold_fallback(&mut self, context_id: u32, rule: usize, held_at: u64, release_at: u64) {
        self.insert(context_id, rule, held_at, release_at, true);
    }

    fn insert(
        &mut self,
        context_id: u32,
        rule: usize,
        held_at: u64,
        release_at: u64,
        fallback: bool,
    ) {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.heap.push(Reverse((release_at, seq, context_id)));
        self.live.insert(
            context_id,
            (
                seq,
                Held {
                    context_id,
                    rule,
                    held_at,
                    release_at,
                    fallback,
                },
            ),
        );
        self.compact();
    }

    /// Removes a held request whose client went away. Returns it if it was
    /// still held (None: already released, or never held).
    pub fn cancel(&mut self, context_id: u32) -> Option<Held> {
        let removed = self.live.remove(&context_id).map(|(_, r)| r);
        self.compact();
        removed
    }

    /// Moves every request due at `now` (release_at <= now) into `out`, in
    /// release order.
    pub fn pop_due(&mut self, now: u64, out: &mut Vec<Held>) {
        while let Some(Reverse((release_at, seq, id))) = self.heap.peek().copied() {
            if release_at > now {
                break;
            }
            self.heap.pop();
            if self.live.get(&id).is_some_and(|(s, _)| *s == seq) {
                if let Some((_, r)) = self.live.remove(&id) {
                    out.push(r);
                }
            }
        }
    }

    /// The earliest release time of a live request.
    pub fn next_release(&mut self) -> Option<u64> {
        // Drop cancelled entries from the top so the answer is exact.
        while let Some(Reverse((release_at, seq, id))) = self.heap.peek().copied() {
            if self.live.get(&id).is_some_and(|(s, _)| *s == seq) {
                return Some(release_at);
            }
            self.heap.pop();
        }
        None
    }

    /// Bounds memory: when cancelled entries outnumber live ones, rebuild the
    /// heap from the live entries.
    fn compact(&mut self) {
        if self.heap.len() > 64 && self.heap.len() > 2 * self.live.len() {
            self.heap = self
                .live
                .iter()
                .map(|(&id, &(seq, r))| Reverse((r.release_at, seq, id)))
                .collect();
        }
    }

    /// A faster rate for rule `rule` (interval `old` -> `new`, shorter) at
    /// `now`: its held requests come forward by `new / old`, in order, never
    /// later than they were due ([`crate::schedule::retime`]). Whether any moved.
    pub fn retime(&mut self, rule: usize, now: u64, old: u64, new: u64) -> bool {
        let mut moved = false;
        for (_, held) in self.live.values_mut() {
            if held.rule == rule {
                let at = crate::schedule::retime(held.release_at, now, old, new);
                moved |= at != held.release_at;
                held.release_at = at;
            }
        }
        if moved {
            self.heap = self
                .live
                .iter()
                .map(|(&id, &(seq, r))| Reverse((r.release_at, seq, id)))
                .collect();
        }
        moved
    }

    /// Whether a request of rule `rule` is held.
    pub fn holds_rule(&self, rule: usize) -> bool {
        self.live.values().any(|(_, h)| h.rule == rule)
    }

    /// Entries in the heap, live or cancelled (for tests of the memory bound).
    pub fn heap_len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(q: &mut HeldQueue, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        q.pop_due(now, &mut out);
        out.iter().map(|r| r.context_id).collect()
    }

    #[test]
    fn releases_everything_due_in_order_and_nothing_early() {
        let mut q = HeldQueue::new();
        q.hold(7, 0, 100, 130);
        q.hold(5, 0, 100, 110);
        q.hold(6, 1, 100, 120);
        assert_eq!(q.len(), 3);
        assert_eq!(q.next_release(), Some(110));
        assert_eq!(due(&mut q, 109), Vec::<u32>::new());
        // A late tick releases all that are due at once.
        assert_eq!(due(&mut q, 125), vec![5, 6]);
        assert_eq!(q.len(), 1);
        let mut out = Vec::new();
        q.pop_due(130, &mut out);
        assert_eq!(
            out,
            vec![Held {
                context_id: 7,
                rule: 0,
                held_at: 100,
                release_at: 130,
                fallback: false,
            }]
        );
        assert!(q.is_empty());
        assert_eq!(q.next_release(), None);
    }

    #[test]
    fn a_cancelled_request_is_never_released() {
        let mut q = HeldQueue::new();
        q.hold(1, 0, 0, 10);
        q.hold(2, 0, 0, 20);
        assert_eq!(q.cancel(1).map(|r| r.release_at), Some(10));
        assert_eq!(q.cancel(1), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_release(), Some(20));
        assert_eq!(due(&mut q, 100), vec![2]);
        assert_eq!(q.cancel(2), None, "already released");
    }

    #[test]
    fn a_re_held_id_keeps_only_its_newest_entry() {
        let mut q = HeldQueue::new();
        q.hold(1, 0, 0, 10);
        q.cancel(1);
        q.hold(1, 0, 5, 50);
        assert_eq!(due(&mut q, 10), Vec::<u32>::new());
        assert_eq!(due(&mut q, 50), vec![1]);
    }

    #[test]
    fn cancelled_entries_do_not_accumulate() {
        let mut q = HeldQueue::new();
        for id in 0..10_000u32 {
            q.hold(id, 0, 0, 1_000_000 + u64::from(id));
            q.cancel(id);
        }
        assert!(q.is_empty());
        assert!(
            q.heap_len() <= 129,
            "heap holds {} stale entries",
            q.heap_len()
        );
        q.hold(1, 0, 0, 5);
        assert_eq!(due(&mut q, u64::MAX), vec![1]);
    }

    #[test]
    fn a_faster_rate_brings_a_rules_held_requests_forward_in_order() {
        let mut q = HeldQueue::new();
        q.hold(1, 0, 0, 100);
        q.hold(2, 0, 0, 200);
        q.hold(3, 1, 0, 150);
        assert!(q.retime(0, 0, 10, 5));
        assert_eq!(due(&mut q, 100), vec![1, 2], "rule 0 at 50 and 100");
        assert_eq!(due(&mut q, 150), vec![3], "rule 1 untouched");
        assert!(
            !q.retime(0, 0, 5, 10),
            "nothing held, or slower: nothing moves"
        );
        assert!(!q.holds_rule(0));
    }
}
