//! The vocabulary of a cluster rule's owned slots in one process, and the
//! one walk over them ([`next_owned`]).
//!
//! * The **grants blob** ([`Grants`], one per rule) is written only by the
//!   VM that calls the engine: a short header (mode, local interval, grant
//!   rate, lead, spare) and a sorted list of owned global slot ranges
//!   `[start, end)`; read here only ([`load_grants`]).
//! * The **cursor** ([`Cursor`], one cell per rule) is shared by every
//!   worker: `next` is the next owned slot not yet taken, `end` the end of
//!   the owned range it lies in, and `waiting` the requests waiting in the
//!   rule's line. Workers move it forward ([`advance`]); the calling VM moves
//!   it back when it publishes a range below it (`grants::publish`).
//!
//! Who walks it: a request's take (`grants::take`), the calling VM's
//! repayment of credit (`ahead::repay`) and the line's grid source
//! (`rate::GridSource`), each through [`next_owned`]: nothing here imports
//! from them.

use crate::store::{SharedBlob, SharedCell, StoreError, MAX_CAS_ATTEMPTS};

use super::Grid;

/// How a rule admits requests now, as published by the calling VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Take owned slots of the shared grid.
    Grid,
    /// The engine fails: pace locally (GCRA) one request every `interval_ns`.
    Local { interval_ns: u64 },
    /// The engine fails: reject.
    Deny,
}

/// Most ranges a blob holds; beyond it the oldest are dropped (forfeited).
/// A proxy holds at most a few epochs of grants, at most two claims per epoch
/// of at most [`super::grid::LANES`] ranges each (64 per epoch).
pub const MAX_RANGES: usize = 512;

const MAGIC: u32 = 0x5447_5233; // "TGR3"

/// The decoded grants blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    pub mode: Mode,
    /// Slots per second this process may expect from the grid (its fair
    /// share), for the reject-at-once estimate; 0 if unknown.
    pub grant_rate_per_s: u64,
    /// How far ahead of now a share slot it does not own yet may come: `k`
    /// epochs (the claims' reach), or, for a process whose demand is new,
    /// until the first share that counts it (`lag + 1` epochs after its
    /// first demand place). No share slot comes before that but those it
    /// owns; only leftovers may.
    pub lead_ns: u64,
    /// The part of `grant_rate_per_s` that is its part of what the fleet
    /// leaves of the rate (0: the fleet asks for the rate or more).
    pub spare_per_s: u64,
    /// Owned global slot ranges `[start, end)`, sorted, disjoint.
    pub ranges: Vec<(u64, u64)>,
}

impl Default for Grants {
    fn default() -> Self {
        Grants {
            mode: Mode::Grid,
            grant_rate_per_s: 0,
            lead_ns: 0,
            spare_per_s: 0,
            ranges: Vec::new(),
        }
    }
}

impl Grants {
    /// Bytes: magic u32, mode u32, local interval u64, grant rate u64,
    /// lead u64, spare u64, count u32, then (start u64, end u64) per range;
    /// little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let (mode, interval) = match self.mode {
            Mode::Grid => (0u32, 0u64),
            Mode::Local { interval_ns } => (1, interval_ns),
            Mode::Deny => (2, 0),
        };
        let mut out = Vec::with_capacity(44 + 16 * self.ranges.len());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&mode.to_le_bytes());
        out.extend_from_slice(&interval.to_le_bytes());
        out.extend_from_slice(&self.grant_rate_per_s.to_le_bytes());
        out.extend_from_slice(&self.lead_ns.to_le_bytes());
        out.extend_from_slice(&self.spare_per_s.to_le_bytes());
        out.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        for (a, b) in &self.ranges {
            out.extend_from_slice(&a.to_le_bytes());
            out.extend_from_slice(&b.to_le_bytes());
        }
        out
    }

    /// Decodes a blob; None if it is not one (treated as no grants).
    pub fn decode(bytes: &[u8]) -> Option<Grants> {
        let mut r = Reader(bytes);
        if r.u32()? != MAGIC {
            return None;
        }
        let mode = r.u32()?;
        let interval_ns = r.u64()?;
        let grant_rate_per_s = r.u64()?;
        let lead_ns = r.u64()?;
        let spare_per_s = r.u64()?;
        let n = r.u32()? as usize;
        if n > MAX_RANGES {
            return None;
        }
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            ranges.push((r.u64()?, r.u64()?));
        }
        let mode = match mode {
            0 => Mode::Grid,
            1 => Mode::Local { interval_ns },
            2 => Mode::Deny,
            _ => return None,
        };
        Some(Grants {
            mode,
            grant_rate_per_s,
            lead_ns,
            spare_per_s,
            ranges,
        })
    }

    /// Adds a range (kept sorted; adjacent ranges merged; overlaps never
    /// happen since the engine grants each slot once: an overlapping part is
    /// dropped rather than trusted).
    pub fn add(&mut self, (a, b): (u64, u64)) {
        if a >= b {
            return;
        }
        let i = self.ranges.partition_point(|r| r.0 < a);
        let lo = if i > 0 {
            self.ranges.get(i - 1).map_or(a, |p| p.1.max(a))
        } else {
            a
        };
        let hi = self.ranges.get(i).map_or(b, |n| n.0.min(b));
        if lo >= hi {
            return;
        }
        self.ranges.insert(i, (lo, hi));
        // Merge with neighbours that touch.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for r in self.ranges.drain(..) {
            match merged.last_mut() {
                Some(last) if last.1 == r.0 => last.1 = r.1,
                _ => merged.push(r),
            }
        }
        self.ranges = merged;
    }

    /// Drops ranges (or their parts) below slot `k`.
    pub fn prune_below(&mut self, k: u64) {
        self.ranges.retain(|r| r.1 > k);
        if let Some(first) = self.ranges.first_mut() {
            first.0 = first.0.max(k);
        }
    }

    /// Owned slots at or above `k`.
    pub fn owned_from(&self, k: u64) -> u64 {
        self.ranges
            .iter()
            .map(|&(a, b)| b.saturating_sub(a.max(k)))
            .sum()
    }

    /// The `n`-th owned slot at or above `k` (1: the first), if owned.
    pub fn nth_from(&self, k: u64, n: u64) -> Option<u64> {
        let mut left = n.max(1);
        for &(a, b) in &self.ranges {
            let a = a.max(k);
            if a >= b {
                continue;
            }
            if b - a >= left {
                return Some(a + left - 1);
            }
            left -= b - a;
        }
        None
    }

    /// The first owned slot at or above `k`, with the end of its range.
    pub fn first_from(&self, k: u64) -> Option<(u64, u64)> {
        self.ranges
            .iter()
            .find(|r| r.1 > k)
            .map(|&(a, b)| (a.max(k), b))
    }
}

/// The rule's grants as stored (None: none yet, or not a grants blob) and
/// the blob's token for a compare-and-swap: the one place the blob is read.
pub fn read_grants<B: SharedBlob>(blob: &mut B) -> Result<(Option<Grants>, B::Token), StoreError> {
    let (bytes, token) = blob.load()?;
    Ok((bytes.as_deref().and_then(Grants::decode), token))
}

/// [`read_grants`], none read as empty, on the grid.
pub fn load_grants<B: SharedBlob>(blob: &mut B) -> Result<(Grants, B::Token), StoreError> {
    let (g, token) = read_grants(blob)?;
    Ok((g.unwrap_or_default(), token))
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

/// What a rule's requests may reach on the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub grid: Grid,
    /// `(burst + 1) * T`: how old an untaken slot may be and still be used at once.
    pub slack_ns: u64,
    /// `max_queue_delay`.
    pub max_delay_ns: u64,
    /// `burst + 1`: how many requests this process may let go ahead of its
    /// grants, on credit, before slots granted to it repay them ([`super::repay`]).
    pub credit: u64,
}

impl Reach {
    pub fn new(grid: Grid, burst: u64, max_delay_ns: u64) -> Reach {
        Reach {
            grid,
            slack_ns: burst.saturating_add(1).saturating_mul(grid.interval_ns),
            max_delay_ns,
            credit: burst.saturating_add(1),
        }
    }

    /// The oldest slot still usable at `now`.
    pub fn min_slot(&self, now: u64) -> u64 {
        self.grid
            .slot_at_or_after(now.saturating_sub(self.slack_ns))
    }

    /// The oldest slot the line of waiting requests may take at `now`
    /// ([`crate::schedule::CATCH_UP_NS`]), and so the oldest the grants keep,
    /// so that the calling VM, if it runs first after a stall of the process,
    /// does not drop the slots that came due in it before the workers' ticks
    /// grant them (until 2026-11-29 it pruned at [`Reach::min_slot`]: fleet
    /// sweep, a 40 ms stall of three saturated proxies forfeited 10 of the
    /// 30 slots of its 100 ms).
    pub fn min_kept(&self, now: u64) -> u64 {
        self.grid
            .slot_at_or_after(now.saturating_sub(self.slack_ns.max(crate::schedule::CATCH_UP_NS)))
    }
}

/// First try of a request, or a retry of one waiting for grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// A new request.
    First,
    /// A request waiting for grants, retried on tick; it has waited
    /// `waited_ns` already, so it may be held only the rest of `max_queue_delay`.
    Retry { waited_ns: u64 },
}

impl Attempt {
    /// How long this attempt may still hold its request: `max_queue_delay`
    /// less what a retry has waited already.
    pub fn max_delay(self, reach: &Reach) -> u64 {
        match self {
            Attempt::First => reach.max_delay_ns,
            Attempt::Retry { waited_ns } => reach.max_delay_ns.saturating_sub(waited_ns),
        }
    }
}

/// A cluster rule's cursor cell ([`crate::CellId::Cursor`]): where this
/// process's requests take their next owned slot (`[next, end)`, part of a
/// range of the grants) and how many requests wait for grants, in one cell,
/// so that a request reads both with one load: `[next, (end - next) |
/// waiting << 32]`. A range longer than 2^32 - 1 slots is cut there (the rest
/// is reached through the grants blob).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub next: u64,
    pub end: u64,
    pub waiting: u64,
}

impl Cursor {
    const LOW: u64 = u32::MAX as u64;

    /// The cursor of a cell's value (a cell never stored: `[0, 0)`, none waiting).
    pub fn decode(value: Option<[u64; 2]>) -> Cursor {
        let [next, packed] = value.unwrap_or([0, 0]);
        Cursor {
            next,
            end: next.saturating_add(packed & Self::LOW),
            waiting: packed >> 32,
        }
    }

    /// The same cursor pointing at no range (workers look in the grants).
    pub fn nowhere(self) -> Cursor {
        Cursor {
            next: 0,
            end: 0,
            waiting: self.waiting,
        }
    }

    /// The cell's value.
    pub fn encode(self) -> [u64; 2] {
        let len = self.end.saturating_sub(self.next).min(Self::LOW);
        [self.next, len | (self.waiting.min(Self::LOW) << 32)]
    }
}

/// The decision for one request of a cluster rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Continue now on grid slot `slot`.
    Now { slot: u64 },
    /// Continue now on grid slot `slot`, which is due later within the
    /// epoch: the process lets one request go ahead of its slot at a time.
    Early { slot: u64 },
    /// Continue now on credit: no owned slot was at hand, and the process
    /// owed fewer than `burst + 1`; it is repaid from its earliest slots
    /// once granted ([`super::repay`]).
    Credit,
    /// Hold `delay_ns` (until grid slot `slot`'s wall time).
    Hold { slot: u64, delay_ns: u64 },
    /// No owned slot for it now (or others wait): it may queue in the
    /// rule's line for grants, if its turn (`grants::turn_ns`) comes in time.
    Wait,
    /// Reject now. `queue_full`: the slot was within reach but the worker's queue is full.
    Reject {
        retry_after_s: u64,
        queue_full: bool,
    },
    /// The engine fails and the rule paces locally: admit with the process
    /// schedule at this interval (see [`super::local_schedule`]).
    Local { interval_ns: u64 },
    /// The engine fails and the rule denies.
    Deny,
    /// The cursor could not be updated (store error or endless races): fail closed.
    Contention,
}

/// Where the walk found the next owned slot at or above `min`: the cursor
/// as read (for the compare-and-swap that takes it) and the slot with the
/// end of its owned range, if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    pub cursor: Cursor,
    pub found: Option<(u64, u64)>,
}

/// The one walk over a rule's owned slots: the next owned slot at or above
/// `min`, from the cursor's range while it reaches `min`, else from the
/// grants blob (read once per caller: `grants` caches it across retries of
/// a compare-and-swap). Returns the walk and the cursor's token.
pub fn next_owned<C: SharedCell, B: SharedBlob>(
    cursor: &mut C,
    blob: &mut B,
    grants: &mut Option<Grants>,
    min: u64,
) -> Result<(Walk, C::Token), StoreError> {
    let (value, token) = cursor.load()?;
    let c = Cursor::decode(value);
    let found = if c.next < c.end && c.next >= min {
        Some((c.next, c.end))
    } else if c.next < min && min < c.end {
        // The range is owned and still reaches the oldest usable slot.
        Some((min, c.end))
    } else {
        cached_grants(blob, grants)?.first_from(c.next.max(min))
    };
    Ok((Walk { cursor: c, found }, token))
}

/// The grants, read from the blob at most once per caller (`cache`).
pub fn cached_grants<'g, B: SharedBlob>(
    blob: &mut B,
    cache: &'g mut Option<Grants>,
) -> Result<&'g Grants, StoreError> {
    if cache.is_none() {
        *cache = Some(load_grants(blob)?.0);
    }
    cache.as_ref().ok_or(StoreError(0))
}

/// Takes slot `slot` (of the owned range ending at `end`) found by a walk
/// that read `from`: moves the cursor past it by compare-and-swap. False if
/// another worker moved it meanwhile (walk again).
pub fn advance<C: SharedCell>(
    cursor: &mut C,
    token: C::Token,
    from: Cursor,
    (slot, end): (u64, u64),
) -> Result<bool, StoreError> {
    let moved = Cursor {
        next: slot.saturating_add(1),
        end,
        waiting: from.waiting,
    };
    cursor.store(moved.encode(), token)
}

/// Sets the count of requests waiting (a worker that granted slots to the
/// rule's line sets it to what the line holds: the count is a hint for the
/// fast path, kept true by every worker that serves the line).
pub fn set_waiting<C: SharedCell>(cursor: &mut C, waiting: u64) -> Result<(), StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = cursor.load()?;
        let mut c = Cursor::decode(v);
        if c.waiting == waiting {
            return Ok(());
        }
        c.waiting = waiting;
        if cursor.store(c.encode(), token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

/// Requests of a rule waiting for grants, counted in its cursor cell
/// ([`Cursor::waiting`]): `+1` when a request starts waiting, `-1` when it
/// leaves (slot taken, rejected at its deadline, or gone). Returns the count
/// after the change.
pub fn add_waiting<C: SharedCell>(cursor: &mut C, delta: i64) -> Result<u64, StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = cursor.load()?;
        let mut c = Cursor::decode(v);
        c.waiting = if delta >= 0 {
            c.waiting.saturating_add(delta.unsigned_abs())
        } else {
            c.waiting.saturating_sub(delta.unsigned_abs())
        };
        if cursor.store(c.encode(), token)? {
            return Ok(c.waiting);
        }
    }
    Err(StoreError(0))
}
