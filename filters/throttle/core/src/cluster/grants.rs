//! Taking owned slots for requests, and what the calling VM publishes
//! (the vocabulary and the one walk over the cursor are [`super::cursor`]).
//! The fast path is one cursor read and one compare-and-swap, as in process
//! scope; the blob is read only when the current range runs out or lies in
//! the past.
//!
//! A request at wall time `now` takes the earliest owned, untaken slot whose
//! time is at least `now - slack` (slack = `(burst + 1) * T`; older untaken
//! slots are forfeited): at once if that time has come, held until then if it
//! is within `max_queue_delay`, rejected at once if further. With no owned slot
//! left it waits for grants (bounded by `max_queue_delay`; the glue retries on
//! tick) unless the grant rate says it cannot be served in time.
//!
//! Bound: a slot is used at most once, never before its time and at most
//! `slack` after it, so the releases of any window `[t, t + W]` use slots with
//! times in `[t - slack, t + W]`: at most `R*W + burst + 2` across all proxies
//! (plus the glue's tick jitter on held requests, and clock skew between hosts).

use crate::clock::NS_PER_S;
use crate::store::{SharedBlob, SharedCell, StoreError, MAX_CAS_ATTEMPTS};

use super::ahead::go_ahead;
use super::cursor::{advance, load_grants, read_grants, MAX_RANGES};
use super::cursor::{cached_grants, next_owned, Attempt, Cursor, Grants, Mode, Reach, Take};

fn retry_after(beyond_ns: u64) -> u64 {
    beyond_ns.div_ceil(NS_PER_S).max(1)
}

/// Takes a slot for one request at wall time `now` (see the module docs).
/// `can_hold`: the worker's queue has room. The cursor cell ([`Cursor`])
/// carries the rule's count of requests waiting in its line: while others
/// wait, a new request queues behind them (`Wait`: the stream's cluster
/// stage puts it in the line, or refuses it now), so waiting requests are
/// served first. `ahead`: the rule's [`super::Ahead`] cell, read only off the
/// fast path (+1 owed when it answers `Credit`).
///
/// The fast path reads and writes the cursor cell only: its range is owned,
/// so while it reaches the oldest usable slot (`min_slot`), that slot (or the
/// cursor's next, if later) is the slot the grants would give. Only when the
/// range is used up or in the past are the grants read.
pub fn take<C: SharedCell, A: SharedCell, B: SharedBlob>(
    cursor: &mut C,
    blob: &mut B,
    ahead: &mut A,
    reach: &Reach,
    now: u64,
    can_hold: bool,
    attempt: Attempt,
) -> Take {
    take_inner(cursor, blob, ahead, reach, now, can_hold, attempt)
}

fn take_inner<C: SharedCell, A: SharedCell, B: SharedBlob>(
    cursor: &mut C,
    blob: &mut B,
    ahead: &mut A,
    reach: &Reach,
    now: u64,
    can_hold: bool,
    attempt: Attempt,
) -> Take {
    let max_delay = attempt.max_delay(reach);
    let min_slot = reach.min_slot(now);
    let mut grants: Option<Grants> = None;
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((walk, token)) = next_owned(cursor, blob, &mut grants, min_slot) else {
            return Take::Contention;
        };
        let c = walk.cursor;
        let queued = match attempt {
            Attempt::First => c.waiting,
            Attempt::Retry { .. } => 0,
        };
        let (slot, range_end) = match walk.found {
            Some(found) if queued == 0 => found,
            _ => {
                let Ok(g) = cached_grants(blob, &mut grants) else {
                    return Take::Contention;
                };
                return no_slot(g, ahead, reach, now, attempt, queued);
            }
        };
        let t = reach.grid.slot_time(slot);
        let mut delay_ns = t.saturating_sub(now);
        let mut early = false;
        if delay_ns > 0 && delay_ns <= reach.grid.epoch_ns {
            // The next owned slot is ahead but within the epoch: the process
            // is within its share (a saturated one holds its requests for
            // slots further ahead). Within two of its gaps it goes now; and
            // beyond one interval it may take its slot now, before its time,
            // within the budget of credit ([`super::ahead`]).
            match go_ahead(ahead, reach, attempt, queued, now, Some(t)) {
                Some(Take::Contention) => return Take::Contention,
                Some(_) => {
                    early = true;
                    delay_ns = 0;
                }
                None => {}
            }
        } else if delay_ns > reach.grid.epoch_ns {
            // The next owned slot lies beyond the coming epoch (the shares
            // of the epochs nearer went to others, or were not claimed after
            // a lull): a request may go now on credit, as with no slot at
            // all, and the slot stays for the credit's repayment.
            match go_ahead(ahead, reach, attempt, queued, now, None) {
                Some(Take::Contention) => return Take::Contention,
                Some(_) => return Take::Credit,
                None => {}
            }
        }
        if delay_ns > max_delay {
            return match attempt {
                Attempt::First => Take::Reject {
                    retry_after_s: retry_after(delay_ns - max_delay),
                    queue_full: false,
                },
                // A request already held is never refused here: its slot
                // came later than its turn was reckoned; it keeps waiting
                // (at its deadline, credit if the process may take it).
                Attempt::Retry { .. } => Take::Wait,
            };
        }
        if delay_ns > 0 && !can_hold {
            return Take::Reject {
                retry_after_s: retry_after(delay_ns),
                queue_full: true,
            };
        }
        match advance(cursor, token, c, (slot, range_end)) {
            Ok(true) if early => return Take::Early { slot },
            Ok(true) if delay_ns == 0 => return Take::Now { slot },
            Ok(true) => return Take::Hold { slot, delay_ns },
            Ok(false) => continue,
            Err(_) => return Take::Contention,
        }
    }
    Take::Contention
}

/// No owned slot for this request (or others wait for one): the engine's
/// state decides. On the grid, a request goes on credit if it may (nobody
/// waits), else it has no slot now (`Wait`: the stream's stage puts it in
/// the rule's line if its turn, [`turn_ns`], comes in time, and refuses it
/// now otherwise).
fn no_slot<A: SharedCell>(
    g: &Grants,
    ahead: &mut A,
    reach: &Reach,
    now: u64,
    attempt: Attempt,
    queued: u64,
) -> Take {
    match g.mode {
        Mode::Local { interval_ns } => Take::Local { interval_ns },
        Mode::Deny => Take::Deny,
        Mode::Grid if queued == 0 => {
            go_ahead(ahead, reach, attempt, queued, now, None).unwrap_or(Take::Wait)
        }
        Mode::Grid => Take::Wait,
    }
}

/// How long until the `position`-th request in this process's line for
/// grants (1: the next) would get a slot: the slot itself if the process
/// owns that many from `from` on; else one more every `1 / grant rate` (the
/// share this process can expect, [`Grants::grant_rate_per_s`]) after the
/// last slot it owns and the last its requests took (none if it expects no
/// share).
pub fn turn_ns(g: &Grants, reach: &Reach, from: u64, now: u64, position: u64) -> u64 {
    turn(g, reach, from, now, position).0
}

/// [`turn_ns`], and how much of it is reckoned rather than owned: the time
/// from the last owned slot (or from now, owning none) to the turn.
pub fn turn(g: &Grants, reach: &Reach, from: u64, now: u64, position: u64) -> (u64, u64) {
    let grid = reach.grid;
    if let Some(k) = g.nth_from(from, position) {
        return (grid.slot_time(k).saturating_sub(now), 0);
    }
    let owned = g.owned_from(from);
    // After the slots it owns, and after those its requests hold already
    // (the cursor is past them): the next grants are for later epochs, and
    // no share slot comes before `lead` from now ([`Grants::lead_ns`]); its
    // part of the spare may come sooner ([`spare_in_lead`]).
    let mine = g
        .ranges
        .last()
        .filter(|r| r.1 > from)
        .map_or(0, |r| grid.slot_time(r.1 - 1))
        .max(grid.slot_time(from));
    let lead_at = now.saturating_add(g.lead_ns);
    // The share rate is an average over the last second or so of shares,
    // and shares follow the fleet's demand as it moves: reckoned 1/[`DERATE`]
    // slower, a turn beyond the owned slots errs on the side of refusing now.
    let derated = |gap: u64| gap.saturating_add(gap / DERATE);
    let gap = derated(expected_gap(reach, g));
    let beyond = position.saturating_sub(owned);
    let in_lead = spare_in_lead(g, reach, mine, lead_at);
    let at = if beyond <= in_lead {
        mine.saturating_add(derated(spare_gap(reach, g)).saturating_mul(beyond))
    } else {
        mine.max(lead_at)
            .saturating_add(gap.saturating_mul(beyond - in_lead))
    };
    // What is reckoned: from the last owned slot through the spare of the
    // lead, else from the later of that slot and the lead.
    let reckoned_from = match (owned, in_lead) {
        (0, _) => now,
        (_, 0) => mine.max(lead_at),
        _ => mine,
    };
    (at.saturating_sub(now), at.saturating_sub(reckoned_from))
}

/// How far beyond its owned slots a process reckons a turn while the fleet
/// asks for its rate or more: its shares follow the fleet's demand, which
/// another proxy's rush changes within a few epochs, so a turn reckoned
/// further out is refused now rather than risked (a request refused after
/// it waited is worse than one refused at once). Requests held are then
/// within about this much of the slots in hand, whatever `max_queue_delay`
/// allows. While the fleet leaves some of the rate (a burst after a lull),
/// the spare is there to claim and turns are reckoned as far as
/// `max_queue_delay` ([`reckon_limit`]).
pub const RECKON_NS: u64 = 600 * crate::clock::NS_PER_MS;

/// How far beyond the owned slots a turn may be reckoned ([`RECKON_NS`]).
pub fn reckon_limit(g: &Grants) -> u64 {
    if g.spare_per_s > 0 {
        u64::MAX
    } else {
        RECKON_NS
    }
}

/// A turn beyond the owned slots is reckoned at the expected share rate
/// less `1/DERATE` of it (sweeps at steady overload found turns up to 8%
/// late at an exact average; 20% leaves room for demand that moves).
pub const DERATE: u64 = 3;

/// What a turn reckoned from the expected share may be off by: an epoch
/// (grants come an epoch at a time, their slots anywhere in it), or the
/// expected gap between two of the process's slots if longer (a share of a
/// few slots a second comes unevenly), at most `max_queue_delay`. A request
/// waits only if its turn comes that much before it would have to leave:
/// where the gap is as long as `max_queue_delay` (a share below one slot per
/// `max_queue_delay`), only a turn on a slot the process owns is certain
/// enough to wait for.
pub fn margin_ns(reach: &Reach, g: &Grants) -> u64 {
    margin_for(reach, expected_gap(reach, g))
}

/// [`margin_ns`] for an expected gap of `gap_ns` between slots.
pub fn margin_for(reach: &Reach, gap_ns: u64) -> u64 {
    reach.grid.epoch_ns.max(gap_ns).min(reach.max_delay_ns)
}

/// The expected gap between two slots of this process: `1 / grant rate`
/// (a rate of 0: no slot is expected beyond those it owns).
fn expected_gap(reach: &Reach, g: &Grants) -> u64 {
    gap_at(reach, g.grant_rate_per_s)
}

/// The gap between two slots at `per_s` a second (0: none expected), at
/// least the grid's interval.
fn gap_at(reach: &Reach, per_s: u64) -> u64 {
    match per_s {
        0 => u64::MAX / 4,
        rate => (NS_PER_S / rate).max(reach.grid.interval_ns),
    }
}

/// The expected gap between two of this process's slots from its part of
/// the spare alone (none: no spare).
fn spare_gap(reach: &Reach, g: &Grants) -> u64 {
    gap_at(reach, g.spare_per_s)
}

/// How many slots beyond those it owns (the last at `mine`) a process
/// reckons before `lead_at`, when its next share comes: its part of the
/// spare, which it claims epoch by epoch within its reach ([`DERATE`]d as
/// the shares are). Only where the lead is at most half of
/// `max_queue_delay`: a spare that another proxy's rush takes moves those
/// turns to the shares after the lead, which a short `max_queue_delay`
/// cannot absorb (fleet sweep seeds 31, 121, 136, mqd 200 ms: 56, 27, 87
/// requests refused after their hold when the spare was counted there
/// too). A burst after a lull (fleet-sweep scenario `burst-after-idle`;
/// real Envoy, tests/cluster/test_holds.py: 11 of 150 refused at arrival
/// on CI with no spare counted) has the lead's slots to take.
pub fn spare_in_lead(g: &Grants, reach: &Reach, mine: u64, lead_at: u64) -> u64 {
    if g.lead_ns.saturating_mul(2) > reach.max_delay_ns {
        return 0;
    }
    let gap = spare_gap(reach, g);
    lead_at.saturating_sub(mine) / gap.saturating_add(gap / DERATE)
}

/// Owned slots still usable from `now` to the end of its epoch, at or
/// above the cursor's `next` (what lies below it was taken): the slots the
/// requests waiting now take before the next epoch's. 0 if none are known.
pub fn owned_this_epoch<B: SharedBlob>(blob: &mut B, reach: &Reach, next: u64, now: u64) -> u64 {
    let Ok((Some(g), _)) = read_grants(blob) else {
        return 0;
    };
    let grid = reach.grid;
    let from = reach.min_slot(now).max(next);
    let end = grid
        .first_slot(grid.epoch_of(now).saturating_add(1))
        .max(from);
    g.owned_from(from).saturating_sub(g.owned_from(end))
}

/// Writes the calling VM's news into the blob: the mode and grant rate, new
/// ranges, and drops what lies below the cursor or out of reach. Returns the
/// owned slots still usable (for the unused count: granted - taken - usable).
///
/// New ranges may lie *below* the cursor: positions are spread over the
/// epoch ([`super::Grid::position_ranges`]), so leftovers of the next epoch can come
/// before slots that held requests have taken already. Workers look in the
/// blob only at or above the cursor, so such ranges are reachable only if the
/// cursor moves back to them. The order keeps every slot taken at most once:
/// the blob is stored first, pruned at the cursor it was computed against;
/// the cursor then moves back by compare-and-swap against that very value.
/// If a worker moved the cursor meanwhile, the blob is pruned again at the new
/// cursor (what workers took since lies below it) and the new ranges that
/// were below the first cursor (which no worker could reach) are added back.
pub fn publish<C: SharedCell, B: SharedBlob>(
    blob: &mut B,
    cursor: &mut C,
    reach: &Reach,
    now: u64,
    mode: Mode,
    (grant_rate_per_s, lead_ns, spare_per_s): (u64, u64, u64),
    new_ranges: &[(u64, u64)],
) -> Result<u64, StoreError> {
    let min = reach.min_kept(now);
    // The new ranges below the cursor of the first stored blob, once stored.
    let mut unreachable: Option<Vec<(u64, u64)>> = None;
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (mut g, token) = load_grants(blob)?;
        let (value, cursor_token) = cursor.load()?;
        let c = Cursor::decode(value);
        let next = c.next;
        g.mode = mode;
        g.grant_rate_per_s = grant_rate_per_s;
        g.lead_ns = lead_ns;
        g.spare_per_s = spare_per_s;
        g.prune_below(next.max(min));
        let adding: Vec<(u64, u64)> = match &unreachable {
            None => new_ranges.to_vec(),
            Some(low) => low.clone(),
        };
        for &(a, b) in &adding {
            g.add((a.max(min), b));
        }
        while g.ranges.len() > MAX_RANGES {
            g.ranges.remove(0);
        }
        let usable = g.owned_from(0);
        if !blob.store(&g.encode(), token)? {
            continue;
        }
        if unreachable.is_none() {
            unreachable = Some(
                new_ranges
                    .iter()
                    .map(|&(a, b)| (a.max(min), b.min(next)))
                    .filter(|r| r.0 < r.1)
                    .collect(),
            );
        }
        match g.ranges.first() {
            Some(&(a, b)) if a < next => {
                let back = Cursor {
                    next: a,
                    end: b,
                    waiting: c.waiting,
                };
                if cursor.store(back.encode(), cursor_token)? {
                    return Ok(usable);
                }
            }
            _ => return Ok(usable),
        }
    }
    Err(StoreError(0))
}

/// Moves every owned range by `shift` slots (the process's clock offset from
/// the fleet's changed: the same fleet slots lie at other local times), and
/// points the cursor nowhere, so that workers look in the moved blob. What
/// workers took (below the cursor) is pruned first; if one takes more before
/// the cursor is reset, the blob is pruned again at where it moved the cursor.
pub fn shift_grants<C: SharedCell, B: SharedBlob>(
    blob: &mut B,
    cursor: &mut C,
    shift: i64,
) -> Result<(), StoreError> {
    let mut moved = false;
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, cursor_token) = cursor.load()?;
        let c = Cursor::decode(value);
        let next = c.next;
        let (mut g, token) = load_grants(blob)?;
        if moved {
            g.prune_below(next.saturating_add_signed(shift));
        } else {
            g.prune_below(next);
            for r in &mut g.ranges {
                *r = (
                    r.0.saturating_add_signed(shift),
                    r.1.saturating_add_signed(shift),
                );
            }
        }
        if !blob.store(&g.encode(), token)? {
            continue;
        }
        moved = true;
        if cursor.store(c.nowhere().encode(), cursor_token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

/// Drops every owned range and points the cursor nowhere: the slots granted
/// so far may be granted again (counters lost), or lie in another time frame.
pub fn reset_grants<C: SharedCell, B: SharedBlob>(
    blob: &mut B,
    cursor: &mut C,
) -> Result<(), StoreError> {
    let mut cleared = false;
    for _ in 0..MAX_CAS_ATTEMPTS {
        if !cleared {
            let (mut g, token) = load_grants(blob)?;
            g.ranges.clear();
            cleared = blob.store(&g.encode(), token)?;
            continue;
        }
        let (value, token) = cursor.load()?;
        if cursor.store(Cursor::decode(value).nowhere().encode(), token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

/// Whether the rule takes slots of the grid now (the calling VM's last
/// word). False if the grants cannot be read: a request keeps its turn.
pub fn on_grid<B: SharedBlob>(blob: &mut B) -> bool {
    read_grants(blob)
        .ok()
        .and_then(|(g, _)| g)
        .is_some_and(|g| g.mode == Mode::Grid)
}

/// When a rule falls back to its local schedule: the schedule's next turn
/// moves to the end of the grid slots this process still owns (they stay
/// valid and are taken first), so that the two never run at once. `mono` and
/// `wall`: the same instant on both clocks.
pub fn fallback_after_grants<C: SharedCell, B: SharedBlob>(
    fallback: &mut C,
    blob: &mut B,
    reach: &Reach,
    mono: u64,
    wall: u64,
) -> Result<(), StoreError> {
    let Some(end) = read_grants(blob)?
        .0
        .and_then(|g| g.ranges.last().map(|r| r.1))
    else {
        return Ok(());
    };
    let start = mono.saturating_add(reach.grid.slot_time(end).saturating_sub(wall));
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (v, token) = fallback.load()?;
        let [fp, tat] = v.unwrap_or([0, 0]);
        if tat >= start || fallback.store([fp, start], token)? {
            return Ok(());
        }
    }
    Err(StoreError(0))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::clock::NS_PER_MS;
    use crate::cluster::ahead::Ahead;
    use crate::cluster::cursor::add_waiting;
    use crate::cluster::Grid;
    use crate::testing::{MemBlob, MemCell};

    pub(crate) const MS: u64 = NS_PER_MS;

    // 500/s: T = 2 ms, L = 50, E = 100 ms; no burst (slack 2 ms); hold up to 10 ms.
    pub(crate) fn reach() -> Reach {
        Reach::new(Grid::new(2 * MS), 0, 10 * MS)
    }

    /// Wall time of slot k at 500/s.
    pub(crate) fn at(k: u64) -> u64 {
        k * 2 * MS
    }

    pub(crate) fn setup(ranges: &[(u64, u64)]) -> (MemCell, MemBlob) {
        let mut blob = MemBlob::default();
        let mut cursor = MemCell::default();
        let r = reach();
        publish(&mut blob, &mut cursor, &r, 0, Mode::Grid, (0, 0, 0), ranges).unwrap();
        (cursor, blob)
    }

    pub(crate) const FIRST: Attempt = Attempt::First;

    /// The ahead cell: `owed` slots, ahead until `until_ms`.
    pub(crate) fn ahead(owed: u64, until_ms: u64) -> [u64; 2] {
        Ahead {
            owed,
            pending: u64::from(until_ms > 0),
            until_ms,
            gap_us: 0,
            ..Default::default()
        }
        .encode()
    }

    /// The cursor's range `[next, end)`.
    pub(crate) fn cur(c: &MemCell) -> (u64, u64) {
        let x = Cursor::decode(c.v);
        (x.next, x.end)
    }

    /// The cursor's count of requests waiting for grants.
    pub(crate) fn waiting_in(c: &MemCell) -> u64 {
        Cursor::decode(c.v).waiting
    }

    /// The ahead cell of a process that owes all the credit it may take:
    /// requests take only the slots they own (the tests of credit below).
    pub(crate) fn owing() -> MemCell {
        MemCell {
            v: Some(
                Ahead {
                    owed: u64::MAX,
                    pending: u64::MAX,
                    until_ms: u64::MAX,
                    gap_us: 0,
                    ..Default::default()
                }
                .encode(),
            ),
            version: 0,
        }
    }

    #[test]
    fn owned_this_epoch_counts_usable_slots_before_the_next_epoch() {
        // Epoch 10 holds slots 500..550 at 500/s. Owned: 505..510 (gone by
        // 520's time), 530..540 and 548..552 (two in epoch 11).
        let (_, mut blob) = setup(&[(505, 510), (530, 540), (548, 552)]);
        let r = reach();
        let mut n = |next, k| owned_this_epoch(&mut blob, &r, next, at(k));
        assert_eq!(n(0, 520), 12, "530..540 and 548, 549");
        assert_eq!(n(535, 520), 7, "not below the cursor");
        assert_eq!(
            n(0, 507),
            16,
            "505 is past (one slot of slack), 506.. usable"
        );
        assert_eq!(
            n(0, 545),
            2,
            "548, 549: the rest is past, 550.. in epoch 11"
        );
        assert_eq!(n(0, 552), 1, "in epoch 11: 551");
        let mut empty = MemBlob::default();
        assert_eq!(owned_this_epoch(&mut empty, &r, 0, at(520)), 0);
    }

    #[test]
    fn the_blob_round_trips_and_rejects_garbage() {
        let g = Grants {
            mode: Mode::Local {
                interval_ns: 6 * MS,
            },
            grant_rate_per_s: 167,
            lead_ns: 300_000_000,
            spare_per_s: 20,
            ranges: vec![(10, 20), (30, 35)],
        };
        assert_eq!(Grants::decode(&g.encode()), Some(g.clone()));
        assert_eq!(g.encode().len(), 44 + 32);
        assert_eq!(Grants::decode(b"nonsense"), None);
        assert_eq!(Grants::decode(&g.encode()[..40]), None);
    }

    #[test]
    fn a_turn_is_an_owned_slot_or_one_more_every_expected_gap_after_them() {
        let r = Reach::new(Grid::new(2 * MS), 0, 1000 * MS);
        // Its shares claimed as far as its owned slots reach (40 ms).
        let g = Grants {
            grant_rate_per_s: 100, // a 10 ms gap
            lead_ns: 40 * MS,
            ranges: vec![(1010, 1012), (1020, 1021)],
            ..Grants::default()
        };
        // The 1st, 2nd and 3rd in line get the owned slots 1010, 1011, 1020.
        assert_eq!(turn_ns(&g, &r, 1000, at(1000), 1), 20 * MS);
        assert_eq!(turn_ns(&g, &r, 1000, at(1000), 3), 40 * MS);
        // The 5th: two beyond the last owned slot (40 ms), each the expected
        // 10 ms gap reckoned 1/DERATE longer.
        let gap = 10 * MS + 10 * MS / DERATE;
        assert_eq!(turn_ns(&g, &r, 1000, at(1000), 5), 40 * MS + 2 * gap);
        assert_eq!(
            turn(&g, &r, 1000, at(1000), 5),
            (40 * MS + 2 * gap, 2 * gap),
            "the reckoned part"
        );
        assert_eq!(
            turn(&g, &r, 1000, at(1000), 3),
            (40 * MS, 0),
            "owned: nothing reckoned"
        );
        // Its next shares start `lead` from now: past the owned slots (the
        // cursor at 1021), owning nothing ahead, or owning slots short of it
        // (a proxy whose demand is new: only leftovers come before its first
        // share that counts it).
        let new = Grants {
            lead_ns: 300 * MS,
            ..g.clone()
        };
        assert_eq!(turn_ns(&new, &r, 1021, at(1000), 1), 300 * MS + gap);
        assert_eq!(turn_ns(&new, &r, 1000, at(1000), 3), 40 * MS, "owned");
        assert_eq!(turn_ns(&new, &r, 1000, at(1000), 4), 300 * MS + gap);
        let none = Grants {
            ranges: Vec::new(),
            ..new.clone()
        };
        assert_eq!(turn_ns(&none, &r, 1000, at(1000), 1), 300 * MS + gap);
        // With a spare of 30/s (a 33 ms gap, 44 ms derated), the lead's
        // 300 ms hold 5 of its slots after the owned ones (40 ms to 262 ms);
        // the 6th beyond them is the first share slot's.
        let spare = Grants {
            spare_per_s: 30,
            ..new.clone()
        };
        let sgap = 33_333_333 + 33_333_333 / DERATE;
        assert_eq!(turn(&spare, &r, 1000, at(1000), 4), (40 * MS + sgap, sgap));
        assert_eq!(turn_ns(&spare, &r, 1000, at(1000), 8), 40 * MS + 5 * sgap);
        assert_eq!(turn_ns(&spare, &r, 1000, at(1000), 9), 300 * MS + gap);
        // Not where the lead is over half of max_queue_delay (a spare
        // another proxy takes moves the turn past a short one).
        let short = Reach::new(Grid::new(2 * MS), 0, 500 * MS);
        assert_eq!(turn_ns(&spare, &short, 1000, at(1000), 4), 300 * MS + gap);
        // Expecting no share: no turn in sight.
        let nothing = Grants {
            grant_rate_per_s: 0,
            ..none
        };
        assert!(turn_ns(&nothing, &r, 1000, at(1000), 1) > 10 * 1000 * MS);
        // The margin: an epoch, or the gap if longer, at most the delay.
        assert_eq!(margin_ns(&r, &g), 100 * MS);
        let slow = Grants {
            grant_rate_per_s: 4,
            ..g.clone()
        };
        assert_eq!(margin_ns(&r, &slow), 250 * MS);
        assert_eq!(
            margin_ns(&Reach::new(Grid::new(2 * MS), 0, 200 * MS), &slow),
            200 * MS
        );
    }

    #[test]
    fn ranges_stay_sorted_merged_and_never_overlap() {
        let mut g = Grants::default();
        g.add((30, 35));
        g.add((10, 20));
        g.add((20, 25)); // touches (10, 20): merged
        assert_eq!(g.ranges, vec![(10, 25), (30, 35)]);
        g.add((24, 31)); // overlaps both: only the gap (25, 30) is added
        assert_eq!(g.ranges, vec![(10, 35)]);
        g.add((5, 5));
        assert_eq!(g.ranges, vec![(10, 35)]);
        g.prune_below(12);
        assert_eq!(
            (g.ranges.clone(), g.owned_from(0), g.owned_from(30)),
            (vec![(12, 35)], 23, 5)
        );
        assert_eq!(g.first_from(40), None);
        assert_eq!(g.first_from(3), Some((12, 35)));
    }

    #[test]
    fn slots_are_taken_in_order_now_or_held_until_their_time() {
        // Owned: slots 1000..1003 (2000, 2002, 2004 ms) and 1010..1012.
        let (mut c, mut b) = setup(&[(1000, 1003), (1010, 1012)]);
        let r = reach();
        let now = at(1000);
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, now, true, FIRST),
            Take::Now { slot: 1000 }
        );
        assert_eq!(cur(&c), (1001, 1003), "the fast path moved the cursor");
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, now, true, FIRST),
            Take::Hold {
                slot: 1001,
                delay_ns: 2 * MS
            }
        );
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, now, true, FIRST),
            Take::Hold {
                slot: 1002,
                delay_ns: 4 * MS
            }
        );
        // The next owned slot, 1010, is 20 ms away: beyond max_queue_delay (10 ms).
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, now, true, FIRST),
            Take::Reject {
                retry_after_s: 1,
                queue_full: false
            }
        );
        assert_eq!(cur(&c), (1003, 1003), "a rejection takes nothing");
        // 10 ms later it is within reach.
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, now + 10 * MS, true, FIRST),
            Take::Hold {
                slot: 1010,
                delay_ns: 10 * MS
            }
        );
        assert_eq!(cur(&c), (1011, 1012));
    }

    #[test]
    fn slots_older_than_the_slack_are_forfeited() {
        let (mut c, mut b) = setup(&[(1000, 1010)]);
        let r = reach(); // slack: one interval (2 ms)
                         // At slot 1005's time + 1 ms: 1004 (3 ms old) is out of reach, 1005 (1 ms old) is not.
        let now = at(1005) + MS;
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, now, true, FIRST),
            Take::Now { slot: 1005 }
        );
        // With burst 2 (slack 6 ms), 1003 would still do: (3 ms)->1004 is the oldest usable...
        let (mut c, mut b) = setup(&[(1000, 1010)]);
        let r3 = Reach::new(Grid::new(2 * MS), 2, 10 * MS);
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r3, now, true, FIRST),
            Take::Now { slot: 1003 }
        );
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r3, now, true, FIRST),
            Take::Now { slot: 1004 }
        );
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r3, now, true, FIRST),
            Take::Now { slot: 1005 }
        );
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r3, now, true, FIRST),
            Take::Hold {
                slot: 1006,
                delay_ns: MS
            }
        );
    }

    #[test]
    fn a_full_queue_rejects_what_would_be_held() {
        let (mut c, mut b) = setup(&[(1000, 1003)]);
        let r = reach();
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, at(1000), false, FIRST),
            Take::Now { slot: 1000 }
        );
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, at(1000), false, FIRST),
            Take::Reject {
                retry_after_s: 1,
                queue_full: true
            }
        );
        assert_eq!(cur(&c), (1001, 1003));
    }

    #[test]
    fn a_shift_moves_the_untaken_slots_and_sends_workers_to_the_blob() {
        // Owned 1000..1010 and 1020..1030; workers took 1000..1004.
        let (mut c, mut b) = setup(&[(1000, 1010), (1020, 1030)]);
        c.v = Some(
            Cursor {
                next: 1004,
                end: 1010,
                waiting: 0,
            }
            .encode(),
        );
        shift_grants(&mut b, &mut c, 500).unwrap();
        assert_eq!(
            Grants::decode(b.v.as_ref().unwrap()).unwrap().ranges,
            vec![(1504, 1510), (1520, 1530)]
        );
        assert_eq!(cur(&c), (0, 0));
        // A worker now takes the first moved slot.
        let r = Reach::new(Grid::new(2 * MS), 0, 10 * MS);
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, at(1504), true, FIRST),
            Take::Now { slot: 1504 }
        );
    }

    #[test]
    fn in_fallback_granted_slots_still_go_first() {
        let (mut c, mut b) = setup(&[(1000, 1001)]);
        let r = reach();
        publish(
            &mut b,
            &mut c,
            &r,
            0,
            Mode::Local {
                interval_ns: 6 * MS,
            },
            (0, 0, 0),
            &[],
        )
        .unwrap();
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, at(1000), true, FIRST),
            Take::Now { slot: 1000 }
        );
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, at(1000), true, FIRST),
            Take::Local {
                interval_ns: 6 * MS
            }
        );
        publish(&mut b, &mut c, &r, 0, Mode::Deny, (0, 0, 0), &[]).unwrap();
        assert_eq!(
            take(&mut c, &mut b, &mut owing(), &r, at(1000), true, FIRST),
            Take::Deny
        );
    }

    #[test]
    fn publish_prunes_what_is_taken_or_out_of_reach() {
        let (mut c, mut b) = setup(&[(1000, 1010), (1020, 1030)]);
        let r = reach();
        take(&mut c, &mut b, &mut owing(), &r, at(1000), true, FIRST);
        take(&mut c, &mut b, &mut owing(), &r, at(1000), true, FIRST);
        // Cursor at 1002; at slot 1005's time the oldest usable slot is 1004,
        // but the line may still take slots the catch-up old (50 ms: 25 slots).
        let usable = publish(
            &mut b,
            &mut c,
            &r,
            at(1005),
            Mode::Grid,
            (0, 0, 0),
            &[(1040, 1045)],
        )
        .unwrap();
        let g = Grants::decode(b.v.as_ref().unwrap()).unwrap();
        assert_eq!(g.ranges, vec![(1002, 1010), (1020, 1030), (1040, 1045)]);
        assert_eq!(usable, 8 + 10 + 5);
        // At slot 1033's time, what lies more than the catch-up back is gone.
        let usable = publish(&mut b, &mut c, &r, at(1033), Mode::Grid, (0, 0, 0), &[]).unwrap();
        let g = Grants::decode(b.v.as_ref().unwrap()).unwrap();
        assert_eq!(g.ranges, vec![(1008, 1010), (1020, 1030), (1040, 1045)]);
        assert_eq!(usable, 2 + 10 + 5);
    }

    #[test]
    fn new_ranges_below_the_cursor_are_reached_and_nothing_is_taken_twice() {
        // Owned 1000..1010 and 1020..1030; held requests took 1000..1025.
        let (mut c, mut b) = setup(&[(1000, 1010), (1020, 1030)]);
        let r = Reach::new(Grid::new(2 * MS), 0, 100 * MS);
        let mut taken = Vec::new();
        let take_one = |c: &mut MemCell, b: &mut MemBlob| match take(
            c,
            b,
            &mut owing(),
            &r,
            at(1000),
            true,
            FIRST,
        ) {
            Take::Now { slot } | Take::Hold { slot, .. } => slot,
            other => panic!("{other:?}"),
        };
        for _ in 0..15 {
            taken.push(take_one(&mut c, &mut b));
        }
        assert_eq!(cur(&c), (1025, 1030));
        // Leftovers granted at 1012..1014 (below the cursor) and 1040..1042.
        let usable = publish(
            &mut b,
            &mut c,
            &r,
            at(1000),
            Mode::Grid,
            (0, 0, 0),
            &[(1012, 1014), (1040, 1042)],
        )
        .unwrap();
        assert_eq!(usable, 2 + 5 + 2);
        assert_eq!(
            cur(&c),
            (1012, 1014),
            "the cursor came back to the new range"
        );
        for _ in 0..9 {
            taken.push(take_one(&mut c, &mut b));
        }
        let want: Vec<u64> = (1000..1010)
            .chain(1020..1025)
            .chain([1012, 1013])
            .chain(1025..1030)
            .chain([1040, 1041])
            .collect();
        assert_eq!(taken, want);
    }

    #[test]
    fn a_cursor_moved_while_publishing_prunes_again_and_keeps_the_unreachable() {
        // The blob is stored, then a worker takes a slot before the cursor
        // moves back: the compare-and-swap fails, and the second attempt
        // prunes at the new cursor and keeps the range below the first one.
        struct Racing {
            inner: MemCell,
            loads: u32,
        }
        impl SharedCell for Racing {
            type Token = u32;
            fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
                self.loads += 1;
                let seen = self.inner.load();
                if self.loads == 1 {
                    // A worker takes slot 1025 right after this load.
                    let (v, t) = self.inner.load()?;
                    let x = Cursor::decode(v);
                    let taken = Cursor {
                        next: x.next + 1,
                        ..x
                    };
                    assert!(self.inner.store(taken.encode(), t)?);
                }
                seen
            }
            fn store(&mut self, value: [u64; 2], token: u32) -> Result<bool, StoreError> {
                self.inner.store(value, token)
            }
        }
        let (c, mut b) = setup(&[(1020, 1030)]);
        let mut c = Racing { inner: c, loads: 0 };
        let r = Reach::new(Grid::new(2 * MS), 0, 100 * MS);
        c.inner.v = Some(
            Cursor {
                next: 1025,
                end: 1030,
                waiting: 0,
            }
            .encode(),
        );
        publish(
            &mut b,
            &mut c,
            &r,
            at(1000),
            Mode::Grid,
            (0, 0, 0),
            &[(1012, 1014), (1027, 1027)],
        )
        .unwrap();
        assert_eq!(c.loads, 2, "a second attempt");
        assert_eq!(cur(&c.inner), (1012, 1014));
        let g = Grants::decode(b.v.as_ref().unwrap()).unwrap();
        assert_eq!(
            g.ranges,
            vec![(1012, 1014), (1026, 1030)],
            "1025 was taken meanwhile"
        );
    }

    #[test]
    fn the_waiting_count_never_goes_below_zero() {
        let mut cell = MemCell::default();
        assert_eq!(add_waiting(&mut cell, 1), Ok(1));
        assert_eq!(add_waiting(&mut cell, 1), Ok(2));
        assert_eq!(add_waiting(&mut cell, -1), Ok(1));
        assert_eq!(add_waiting(&mut cell, -5), Ok(0));
    }
}
