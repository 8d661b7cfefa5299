//! Where this proxy's clock stands against the other proxies' of a rule, in
//! whole epochs, from the member counters every proxy adds to.
//!
//! Each proxy with demand adds 1 to `members(X)` in its own epoch `X - k`
//! ([`super::caller`]). So at our epoch `f`, a look at `members(f + k + j)`
//! (hits 0) counts, for `j >= 1`, the proxies whose clock is at least about
//! `j` epochs ahead of ours (they are already there), and for `j <= -1`
//! every proxy but those more than about `|j|` epochs behind (they are not
//! there yet). Our own add is taken out (we know which counters we added
//! to), so every count is of the other proxies only. "About": calls come within the first
//! quarter of an epoch, so each count is right to a quarter of an epoch.
//!
//! The caller probes three offsets per call, each ahead and behind (6 looks),
//! in turn over offsets out to about 2.5 s ([`Skew::new`]). After a full sweep
//! it asks [`Skew::estimate`]. Others' adds already in our future counters
//! can only mean they are ahead: if more than half of them have reached `j`
//! epochs past us but not the next offset probed, we are about halfway
//! between the two behind, and move forward (whatever their number). Others
//! missing from our recent past could also have started, gone idle or gone
//! away: we take it that we are ahead only with two others at least (with
//! one, it moves instead, so two proxies never chase each other), only if
//! they are present further back, and only once it is proven: the counter
//! where they were missing, looked at again after they would have reached it
//! had they been behind, counts them now ([`Skew::recheck_due`]). A proxy
//! that went idle never adds to a past counter, so its absence, however it
//! comes and goes, moves nobody (until issue 29 an answer that stayed put
//! over two sweeps was taken, and a fleet of 50 with demand that came and
//! went in step moved a proxy 400 ms and back: fleet sweep seed 48). Behind twice in a row,
//! the two answers at most an offset step apart (the larger: a count falls
//! short when an add was missed or a proxy idled, and lies beyond only by
//! the call phases; further apart, a count at half the fleet lost an add,
//! and the next sweep decides), or
//! ahead proven, is a correction: the caller
//! then counts epochs on the fleet's clock, that many epochs off its own, and
//! keeps the grants in its own time ([`super::caller`]). With offsets at most
//! 5 epochs apart, one correction leaves us within 2 epochs, which the grid's
//! ordering absorbs (and the next sweeps refine).

/// Offsets probed, in epochs (each also negated), as far as [`REACH_NS`]:
/// at most 2 apart, so that a move to the middle of the two offsets where
/// the others stand leaves at most about one epoch (plus the quarter epoch
/// of the call phases), which the next sweeps ignore (see [`Skew::min_move`]):
/// one move per skew event.
const OFFSETS: [i64; 15] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 18, 20, 22, 25];

/// How far probes reach, ns: a clock off by more is not seen here (others
/// beyond the reach look absent), and the service's hour check
/// ([`super::caller`]) catches it instead.
pub const REACH_NS: u64 = 2_600_000_000;

/// An answer "ahead by `m`" waiting for its proof: `members(epoch)`, where
/// more than half of the fleet was missing, looked at again once they would
/// have added to it had they been behind by `m` (our `e + k` at `due`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recheck {
    epoch: u64,
    due: u64,
    m: i64,
    /// The others counted there at the sweep, and the fleet.
    seen: u64,
    fleet: u64,
}

/// Epochs after its due time a proof is given up (its look never answered).
const RECHECK_GIVE_UP: u64 = 10;

/// One sweep's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Behind(i64),
    Ahead(Recheck),
}

/// One rule's view of its clock against the other proxies'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skew {
    /// The offsets probed (positive; each is probed ahead and behind).
    offsets: Vec<i64>,
    /// The last count seen at `+offsets[i]` and at `-offsets[i]`.
    ahead: Vec<Option<u64>>,
    behind: Vec<Option<u64>>,
    /// The next offset to probe.
    next: usize,
    /// The counter epoch of each look at `-offsets[i]`.
    behind_at: Vec<Option<u64>>,
    /// The last sweep's answer behind, waiting to be confirmed by the next.
    pending: Option<i64>,
    /// An answer ahead, waiting for its proof.
    recheck: Option<Recheck>,
    /// An answer ahead, proven: the next [`Skew::estimate`] returns it.
    proven: Option<i64>,
    /// Our clock's offset from the fleet's, in epochs (positive: ahead).
    pub offset_epochs: i64,
    /// The smallest correction made, in epochs: more than `max_clock_skew`
    /// (which the claim schedule absorbs) and at least 2, so that what a
    /// move leaves over never moves the grid again.
    min_move: i64,
}

impl Skew {
    /// The probes of a grid whose epochs last `epoch_ns`: every offset of
    /// the offsets probed (1 to 25 epochs) within [`REACH_NS`] (at least one);
    /// `skew_ns`: the engine's `max_clock_skew`, a difference that is no skew.
    pub fn new(epoch_ns: u64, skew_ns: u64) -> Skew {
        let mut offsets: Vec<i64> = OFFSETS
            .iter()
            .copied()
            .filter(|&j| j.unsigned_abs().saturating_mul(epoch_ns) <= REACH_NS)
            .collect();
        if offsets.is_empty() {
            offsets.push(1);
        }
        let n = offsets.len();
        Skew {
            offsets,
            ahead: vec![None; n],
            behind: vec![None; n],
            behind_at: vec![None; n],
            next: 0,
            pending: None,
            recheck: None,
            proven: None,
            offset_epochs: 0,
            min_move: i64::try_from(skew_ns / epoch_ns.max(1))
                .unwrap_or(i64::MAX)
                .saturating_add(1)
                .max(2),
        }
    }

    /// The offsets (epochs from `k` ahead of ours) to look at in this call:
    /// three, each ahead and behind (a sweep of the 15 offsets in 5 calls).
    pub fn probes(&mut self) -> [i64; 6] {
        let n = self.offsets.len().max(1);
        let at = |i: usize| self.offsets.get(i % n).copied().unwrap_or(1);
        let (a, b, c) = (at(self.next), at(self.next + 1), at(self.next + 2));
        self.next = (self.next + 3) % n;
        [a, -a, b, -b, c, -c]
    }

    /// The count seen at offset `j` (the counter of `epoch`), less our own
    /// adds to that counter (`mine`: more than one if our clock stepped back
    /// over it): only the other proxies count.
    pub fn record(&mut self, j: i64, epoch: u64, count: u64, mine: u64) {
        let count = count.saturating_sub(mine);
        let Some(i) = self.offsets.iter().position(|&o| o == j.abs()) else {
            return;
        };
        let slot = if j > 0 {
            self.ahead.get_mut(i)
        } else {
            if let Some(at) = self.behind_at.get_mut(i) {
                *at = Some(epoch);
            }
            self.behind.get_mut(i)
        };
        if let Some(slot) = slot {
            *slot = Some(count);
        }
    }

    /// The member counter to look at again now (our epoch `e + k` is
    /// `ahead`), if an answer ahead waits for its proof and it is due.
    pub fn recheck_due(&mut self, ahead: u64) -> Option<u64> {
        let r = self.recheck?;
        if ahead > r.due.saturating_add(RECHECK_GIVE_UP) {
            self.recheck = None;
            return None;
        }
        (ahead >= r.due).then_some(r.epoch)
    }

    /// The look again at `members(epoch)` ([`Skew::recheck_due`]): the
    /// proxies that added to it since the sweep were behind us (a proxy adds
    /// only to a counter ahead of its own epoch); if more than half of the
    /// fleet did, the answer ahead is proven. Idle or gone proxies never
    /// add to it; nor do proxies in step that were idle then (a split of
    /// the fleet in two, with some of the half in step idle, moves nobody:
    /// sweep seed 118, 24 of 50 proxies 1 s behind).
    pub fn rechecked(&mut self, epoch: u64, count: u64, mine: u64) {
        let Some(r) = self.recheck.filter(|r| r.epoch == epoch) else {
            return;
        };
        self.recheck = None;
        let arrived = count.saturating_sub(mine).saturating_sub(r.seen);
        if arrived.saturating_mul(2) > r.fleet {
            self.proven = Some(r.m);
        }
    }

    /// The last sweep's answer "behind", as a move (epochs), while it waits
    /// for the next sweep to confirm it.
    pub fn pending_move(&self) -> Option<i64> {
        self.pending.map(|b| -b)
    }

    /// The correction (epochs to add to the offset), if one is confirmed:
    /// behind, after a full sweep, if two sweeps in a row agree; ahead, once
    /// proven ([`Skew::rechecked`]). A full sweep starts a new one.
    pub fn estimate(&mut self) -> Option<i64> {
        if let Some(m) = self.proven.take() {
            self.restart();
            return Some(m);
        }
        if self.ahead.iter().chain(&self.behind).any(Option::is_none) {
            return None;
        }
        let now = self.sweep();
        self.ahead.iter_mut().for_each(|c| *c = None);
        self.behind.iter_mut().for_each(|c| *c = None);
        // A difference the claim schedule absorbs is no skew: what a move
        // leaves over (at most about an epoch) never moves the grid again.
        let min_move = self.min_move;
        let now = now.filter(|a| match a {
            Answer::Behind(m) => *m >= min_move,
            Answer::Ahead(r) => r.m >= min_move,
        });
        let confirmed = match (self.pending, now) {
            // Behind (others' adds are in our future: unambiguous): the same
            // twice, at most an offset step apart (2 epochs as far as 1.5 s),
            // the larger of the two. A count falls short of where the others
            // stand when an add was missed or a proxy went idle, and lies
            // beyond it only by the quarter epoch of the call phases: the
            // smaller of -7 and -9 left 2 epochs, which moved the grid again
            // (sweep seed 256: 700 ms, then 200 ms more), and their mean
            // left 1.1 epochs, beyond max_clock_skew (requests held for 1 s
            // were refused). Further apart, one sweep missed an add where
            // the count stood at half the fleet, and the next sweep decides
            // (sweep seed 69: -9 then -4).
            (Some(a), Some(Answer::Behind(b))) if a.abs_diff(b) <= 2 => Some(-(a.max(b))),
            _ => None,
        };
        self.pending = match now {
            Some(Answer::Behind(b)) if confirmed.is_none() => Some(b),
            _ => None,
        };
        // Ahead (others missing from our recent past): only once proven,
        // which a proxy that went idle or away never is.
        if let Some(Answer::Ahead(r)) = now {
            if self.recheck.is_none() {
                self.recheck = Some(r);
            }
        }
        confirmed
    }

    /// One sweep's answer (None: in step with the majority, or alone).
    fn sweep(&self) -> Option<Answer> {
        // A proxy skips an epoch's add now and then (a late call): one seen
        // at the next two offsets further has passed this one too. So a
        // count ahead is read as at least the smaller of the next two, and
        // those behind as the most seen at that offset or nearer. Not
        // further: a proxy ahead that has only just started adding shows at
        // the offsets near its own first (it has not added to the nearer
        // ones), and before it shows in our past; read as having passed
        // every nearer offset, it would be the whole majority of the others
        // in our future, and the proxies in step would move to its clock.
        let seen: Vec<u64> = self.ahead.iter().map(|c| c.unwrap_or(0)).collect();
        let ahead: Vec<u64> = (0..seen.len())
            .map(|i| {
                let next_two = match (seen.get(i + 1), seen.get(i + 2)) {
                    (Some(&a), Some(&b)) => a.min(b),
                    _ => 0,
                };
                seen.get(i).copied().unwrap_or(0).max(next_two)
            })
            .collect();
        let seen_behind: Vec<u64> = self.behind.iter().map(|c| c.unwrap_or(0)).collect();
        let mut behind = seen_behind.clone();
        for i in 1..behind.len() {
            let nearer = behind.get(i - 1).copied().unwrap_or(0);
            if let Some(c) = behind.get_mut(i) {
                *c = (*c).max(nearer);
            }
        }
        let in_future = ahead.first().copied().unwrap_or(0);
        let in_past = behind.last().copied().unwrap_or(0);
        let others = in_future.max(in_past);
        // The fleet counts us too: a split of it in two equal halves moves
        // only the half behind (forward, to the other's clock); the half
        // ahead stays. So in a tie nobody chases anybody (until 2026-11-28
        // every proxy of a 2-against-2 split moved, again and again).
        let fleet = others.saturating_add(1);
        // Behind: at least half of the fleet has reached j epochs past us.
        let ahead: Vec<bool> = ahead
            .iter()
            .map(|&c| c.saturating_mul(2) >= fleet)
            .collect();
        if let Some((m, ..)) = self.midway(&ahead) {
            return Some(Answer::Behind(m));
        }
        // Ahead: more than half of the fleet, present further back, has not
        // reached j epochs before us yet. With one other, it moves instead.
        if others < 2 || in_past < others {
            return None;
        }
        let missing: Vec<bool> = behind
            .iter()
            .map(|&c| in_past.saturating_sub(c).saturating_mul(2) > fleet)
            .collect();
        // The proof: the furthest counter where they were missing, looked
        // at again once they would have reached it had they been behind
        // (they reach it `m - last` epochs after the look, `next - last` at
        // most; 2 more for their call phase and the answer).
        let (m, last, next) = self.midway(&missing)?;
        let i = self.offsets.iter().position(|&o| o == last)?;
        let epoch = (*self.behind_at.get(i)?)?;
        let wait = u64::try_from(next - last).unwrap_or(0);
        Some(Answer::Ahead(Recheck {
            epoch,
            due: epoch
                .saturating_add(u64::try_from(last).unwrap_or(0))
                .saturating_add(wait + 2),
            m,
            seen: *seen_behind.get(i)?,
            fleet,
        }))
    }

    /// Where the majority stands, from which offsets it is beyond: halfway
    /// between the last offset it is beyond (of those in a row from the
    /// first) and the next one; the last offset if it is beyond all.
    /// With the last offset it is beyond and the next offset probed (the
    /// last again if none).
    fn midway(&self, beyond: &[bool]) -> Option<(i64, i64, i64)> {
        let n = beyond.iter().take_while(|&&b| b).count();
        let last = *self.offsets.get(n.checked_sub(1)?)?;
        Some(match self.offsets.get(n) {
            Some(&next) => (last + (next - last) / 2, last, next),
            None => (last, last, last),
        })
    }

    /// Forgets what was seen (the frame changed).
    pub fn restart(&mut self) {
        self.ahead.iter_mut().for_each(|c| *c = None);
        self.behind.iter_mut().for_each(|c| *c = None);
        self.pending = None;
        self.recheck = None;
        self.proven = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A full sweep of counts of the other proxies: `ahead(j)` at +j,
    /// `at_or_after(j)` at -j (our own add comes on top there, and is taken out).
    fn sweep(s: &mut Skew, ahead: impl Fn(i64) -> u64, at_or_after: impl Fn(i64) -> u64) {
        for _ in 0..s.offsets.len().div_ceil(3) {
            for j in s.probes() {
                // The counters of epochs `e + k + j`, with `e + k` at BASE.
                let epoch = BASE.saturating_add_signed(j);
                if j > 0 {
                    s.record(j, epoch, ahead(j), 0);
                } else {
                    // Our own add is in the count, and taken out.
                    s.record(j, epoch, at_or_after(-j) + 1, 1);
                }
            }
        }
    }

    const BASE: u64 = 1000;

    /// The proof of an answer ahead: the counter it names, looked at again
    /// once due, with `present` others in it now (and our own add); then
    /// the estimate. None if no proof was asked for.
    fn prove(s: &mut Skew, present: u64) -> Option<Option<i64>> {
        let (ahead, at) = (BASE..BASE + 40).find_map(|a| Some((a, s.recheck_due(a)?)))?;
        assert!(ahead > at, "looked at again only after it");
        s.rechecked(at, present + 1, 1);
        Some(s.estimate())
    }

    #[test]
    fn probes_reach_about_two_and_a_half_seconds_whatever_the_epoch() {
        assert_eq!(
            Skew::new(100 * MS, 100 * MS).offsets,
            vec![1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 18, 20, 22, 25]
        );
        assert_eq!(
            Skew::new(250 * MS, 100 * MS).offsets,
            vec![1, 2, 3, 4, 5, 6, 8, 10]
        );
        assert_eq!(Skew::new(1000 * MS, 100 * MS).offsets, vec![1, 2]);
        assert_eq!(Skew::new(5000 * MS, 100 * MS).offsets, vec![1]);
        let mut s = Skew::new(1000 * MS, 100 * MS);
        assert_eq!(
            [s.probes(), s.probes()],
            [[1, -1, 2, -2, 1, -1], [2, -2, 1, -1, 2, -2]]
        );
        let mut s = Skew::new(100 * MS, 100 * MS);
        assert_eq!(
            [s.probes(), s.probes(), s.probes(), s.probes(), s.probes()],
            [
                [1, -1, 2, -2, 3, -3],
                [4, -4, 5, -5, 6, -6],
                [8, -8, 10, -10, 12, -12],
                [14, -14, 16, -16, 18, -18],
                [20, -20, 22, -22, 25, -25]
            ]
        );
    }

    #[test]
    fn in_step_with_the_fleet_nothing_moves() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        // 5 proxies: 4 others, none ahead, all in at every offset behind.
        for _ in 0..3 {
            sweep(&mut s, |_| 0, |_| 4);
            assert_eq!(s.estimate(), None);
        }
    }

    #[test]
    fn a_proxy_ahead_that_just_started_does_not_move_the_ones_in_step() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        // One other in step (present at every offset behind), and one 8
        // epochs ahead that started adding 3 epochs ago: in our counters +6
        // to +8 only, not yet in our past. Not a majority of the two.
        let newcomer = |j: i64| u64::from((6..=8).contains(&j));
        for _ in 0..3 {
            sweep(&mut s, newcomer, |_| 1);
            assert_eq!(s.estimate(), None);
        }
        // Once it has been ahead for a while it shows at every offset up to
        // +8, and in our past too: still one of two, nothing moves.
        for _ in 0..3 {
            sweep(&mut s, |j| u64::from(j <= 8), |_| 2);
            assert_eq!(s.estimate(), None);
        }
        // A skipped add at one offset is read through: the two others both
        // 8 epochs ahead, one missing at +3: we move forward.
        let gap = |j: i64| if j == 3 { 1 } else { u64::from(j <= 8) * 2 };
        sweep(&mut s, gap, |_| 2);
        s.estimate();
        sweep(&mut s, gap, |_| 2);
        assert_eq!(s.estimate(), Some(-9));
    }

    /// Sweep seed 69 (8 proxies, 4 of them 800 ms behind the other 4, with
    /// demand that comes and goes): a proxy of the half behind saw the half
    /// ahead at +1..+8 in one sweep, and in the next missed one of them at +5
    /// and +6 (an epoch it had no demand). Half of the fleet is a tie at the
    /// threshold, so that sweep read the half ahead only 4 epochs away; the
    /// smaller of the two answers moved the proxy 4 epochs, not 9. The 5 left
    /// over then moved the half ahead back, and both halves chased each other
    /// (9 moves for one skew event). Two answers that are more than an offset
    /// step apart are not a confirmation: the next sweep decides.
    #[test]
    fn two_sweeps_far_apart_do_not_confirm_a_move() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        let whole = |j: i64| if j <= 8 { 4 } else { 0 };
        let missed = |j: i64| match j {
            5 | 6 => 3,
            j if j <= 8 => 4,
            _ => 0,
        };
        sweep(&mut s, whole, |_| 7);
        assert_eq!(s.estimate(), None, "one sweep is not enough");
        sweep(&mut s, missed, |_| 7);
        assert_eq!(s.estimate(), None, "-9 then -4: no move");
        sweep(&mut s, whole, |_| 7);
        assert_eq!(s.estimate(), None, "-4 then -9: no move");
        sweep(&mut s, whole, |_| 7);
        assert_eq!(s.estimate(), Some(-9), "-9 twice");
        // A count right at an offset tipping either way still confirms: the
        // larger of the two (-9 and -11: at about 10, one epoch over at most).
        let mut s = Skew::new(100 * MS, 100 * MS);
        sweep(&mut s, whole, |_| 7);
        s.estimate();
        sweep(&mut s, |j| if j <= 10 { 4 } else { 0 }, |_| 7);
        assert_eq!(s.estimate(), Some(-11));
    }

    /// Sweep seed 256 (12 proxies, one ~910 ms behind): its sweeps read the
    /// others beyond 8 (-9), and once not beyond 8 (-7, adds missing). The
    /// smaller of the two moved it 700 ms, and the 2 epochs left over moved
    /// it again 200 ms later. The larger moves it once, to within an epoch.
    #[test]
    fn two_answers_an_offset_step_apart_move_once() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        sweep(&mut s, |j| if j <= 8 { 11 } else { 0 }, |_| 11);
        assert_eq!(s.estimate(), None);
        sweep(&mut s, |j| if j <= 6 { 11 } else { 0 }, |_| 11);
        assert_eq!(s.estimate(), Some(-9));
        // In step now (within an epoch), whatever the sweeps read.
        for _ in 0..4 {
            sweep(&mut s, |j| if j <= 1 { 11 } else { 0 }, |_| 11);
            assert_eq!(s.estimate(), None);
        }
    }

    #[test]
    fn three_epochs_ahead_of_two_others_is_corrected_once_proven() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        // Us ahead by ~3.3 epochs: the two others have not reached -1, -2, -3
        // yet; at -4 and beyond they are in.
        let behind = |j: i64| if j <= 3 { 0 } else { 2 };
        sweep(&mut s, |_| 0, behind);
        assert_eq!(s.estimate(), None, "one sweep is not enough");
        // Both there now, where they were missing: proven.
        assert_eq!(prove(&mut s, 2), Some(Some(3)));
        assert_eq!(prove(&mut s, 2), None, "once");
        // Ahead by ~11-12: beyond 10, not 12: halfway, 11.
        let mut s = Skew::new(100 * MS, 100 * MS);
        let behind = |j: i64| if j <= 11 { 0 } else { 2 };
        sweep(&mut s, |_| 0, behind);
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 2), Some(Some(11)));
    }

    #[test]
    fn the_one_behind_moves_forward_and_with_one_other_the_one_ahead_stays() {
        let twice = |s: &mut Skew, ahead: &dyn Fn(i64) -> u64, behind: &dyn Fn(i64) -> u64| {
            sweep(s, ahead, behind);
            assert_eq!(s.estimate(), None, "one sweep is not enough");
            sweep(s, ahead, behind);
            s.estimate()
        };
        // Two others 8+ epochs ahead of us.
        let mut s = Skew::new(100 * MS, 100 * MS);
        let ahead = |j: i64| if j <= 8 { 2 } else { 0 };
        assert_eq!(twice(&mut s, &ahead, &|_| 2), Some(-9));
        // One other ahead: the one behind moves forward...
        let mut s = Skew::new(100 * MS, 100 * MS);
        let one = |j: i64| u64::from(j <= 8);
        assert_eq!(twice(&mut s, &one, &|_| 1), Some(-9));
        // ...and the one ahead of a single other stays (it cannot tell
        // that one from a proxy that started late or went idle).
        let mut s = Skew::new(100 * MS, 100 * MS);
        let alone_ahead = |j: i64| if j <= 8 { 0 } else { 1 };
        assert_eq!(twice(&mut s, &|_| 0, &alone_ahead), None);
    }

    #[test]
    fn ahead_of_two_others_is_taken_only_if_they_were_there_before_and_are_there_now() {
        // Two others missing from our last 8 epochs, present before: ahead by ~9.
        let mut s = Skew::new(100 * MS, 100 * MS);
        let behind = |j: i64| if j <= 8 { 0 } else { 2 };
        sweep(&mut s, |_| 0, behind);
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 2), Some(Some(9)));
        // Missing everywhere we look: not there at all (not started, idle).
        let mut s = Skew::new(100 * MS, 100 * MS);
        for _ in 0..3 {
            sweep(&mut s, |_| 0, |_| 0);
            assert_eq!(s.estimate(), None);
            assert_eq!(prove(&mut s, 0), None, "nothing to prove");
        }
        // Missing, and still missing from that counter later (they went
        // idle): never taken.
        let mut s = Skew::new(100 * MS, 100 * MS);
        for gone in [3, 6, 11, 15] {
            sweep(&mut s, |_| 0, move |j: i64| if j <= gone { 0 } else { 2 });
            assert_eq!(s.estimate(), None, "gone for {gone}");
            assert_eq!(prove(&mut s, 0), Some(None), "gone for {gone}");
        }
    }

    /// Sweep seed 48 (50 proxies, a 10/s rule, demand that comes and goes
    /// on most proxies at once, no clock apart): to one proxy most of the
    /// others were missing from its last 4 epochs in two sweeps in a row, so
    /// it took itself for 400 ms ahead and moved; 5 s later it moved back.
    /// Missing in step sweep after sweep is no proof: the counter where they
    /// were missing, looked at again, still misses them.
    #[test]
    fn others_idle_in_step_sweep_after_sweep_move_nobody() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        // 49 others: 30 present 5 epochs back and further, 10 in the last 4.
        let lull = |j: i64| if j <= 4 { 10 } else { 30 };
        for _ in 0..4 {
            sweep(&mut s, |_| 0, lull);
            assert_eq!(s.estimate(), None);
            assert_eq!(prove(&mut s, 10), Some(None));
        }
        // Were they behind, they would be there now: a move.
        sweep(&mut s, |_| 0, lull);
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 30), Some(Some(4)));
    }

    /// Sweep seed 118 (50 proxies, 24 of them 1 s behind the other 26):
    /// to one of the 26, the 24 behind and two idle ones of its own half
    /// were missing from its last 10 epochs: more than half, so it took
    /// itself for ahead, and the 24 did reach that counter later. Only those
    /// that reach it count: 24 of 50 is no majority, nobody moves.
    #[test]
    fn a_split_with_idle_proxies_in_step_moves_nobody_in_step() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        // 49 others: all present further back; in the last 10 epochs the
        // 23 in step that are busy.
        let split = |j: i64| if j <= 10 { 23 } else { 49 };
        sweep(&mut s, |_| 0, split);
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 47), Some(None));
        // The same with one more behind: 25 of 50 is no majority either...
        sweep(&mut s, |_| 0, |j: i64| if j <= 10 { 22 } else { 49 });
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 47), Some(None));
        // ...26 is.
        sweep(&mut s, |_| 0, |j: i64| if j <= 10 { 21 } else { 49 });
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 47), Some(Some(11)));
    }

    #[test]
    fn a_minority_out_of_step_moves_nobody_in_step() {
        // 5 proxies: 2 others ahead by 5, 2 in step: we stay.
        let mut s = Skew::new(100 * MS, 100 * MS);
        let ahead = |j: i64| if j <= 6 { 2 } else { 0 };
        for _ in 0..3 {
            sweep(&mut s, ahead, |_| 4);
            assert_eq!(s.estimate(), None);
        }
    }

    #[test]
    fn two_sweeps_must_agree_on_the_direction_and_the_smaller_is_taken() {
        let mut s = Skew::new(100 * MS, 100 * MS);
        // Ahead: one sweep, then the proof (a second sweep is not asked for).
        sweep(&mut s, |_| 0, |j| if j <= 2 { 0 } else { 2 });
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 2), Some(Some(2)));
        // Behind: the same direction twice, one offset step apart at most,
        // the larger; -3 then -7 is no confirmation, -7 twice is.
        let mut s = Skew::new(100 * MS, 100 * MS);
        sweep(&mut s, |j| if j <= 3 { 2 } else { 0 }, |_| 2);
        assert_eq!(s.estimate(), None);
        sweep(&mut s, |j| if j <= 4 { 2 } else { 0 }, |_| 2);
        assert_eq!(s.estimate(), Some(-4), "-3 then -4: the larger");
        sweep(&mut s, |j| if j <= 3 { 2 } else { 0 }, |_| 2);
        assert_eq!(s.estimate(), None);
        sweep(&mut s, |j| if j <= 6 { 2 } else { 0 }, |_| 2);
        assert_eq!(s.estimate(), None, "-3 then -7: apart");
        sweep(&mut s, |j| if j <= 6 { 2 } else { 0 }, |_| 2);
        assert_eq!(s.estimate(), Some(-7), "-7 twice");
        // Ahead, then behind: no answer; then behind twice.
        let mut s = Skew::new(100 * MS, 100 * MS);
        sweep(&mut s, |_| 0, |j| if j <= 3 { 0 } else { 2 });
        assert_eq!(s.estimate(), None);
        let two_ahead = |j: i64| if j <= 4 { 2 } else { 0 };
        sweep(&mut s, two_ahead, |_| 2);
        assert_eq!(s.estimate(), None, "ahead then behind");
        sweep(&mut s, two_ahead, |_| 2);
        assert_eq!(s.estimate(), Some(-4));
    }

    #[test]
    fn a_tie_moves_only_the_half_behind() {
        // 4 proxies, 2 of them 9 epochs behind the other 2 (red team 3,
        // finding 4). Seen from one behind: 3 others, 2 of them ahead: half
        // the fleet of 4, it moves forward.
        let mut s = Skew::new(100 * MS, 100 * MS);
        let two_ahead = |j: i64| if j <= 8 { 2 } else { 0 };
        sweep(&mut s, two_ahead, |_| 3);
        assert_eq!(s.estimate(), None);
        sweep(&mut s, two_ahead, |_| 3);
        assert_eq!(s.estimate(), Some(-9));
        // Seen from one ahead: 2 of 3 others missing from the last 8
        // epochs, present before: half the fleet, not more: it stays.
        let mut s = Skew::new(100 * MS, 100 * MS);
        let two_behind = |j: i64| if j <= 8 { 1 } else { 3 };
        for _ in 0..3 {
            sweep(&mut s, |_| 0, two_behind);
            assert_eq!(s.estimate(), None);
        }
        // Three behind of 4 is more than half: the one ahead moves back.
        let mut s = Skew::new(100 * MS, 100 * MS);
        let three_behind = |j: i64| if j <= 8 { 0 } else { 3 };
        sweep(&mut s, |_| 0, three_behind);
        assert_eq!(s.estimate(), None);
        assert_eq!(prove(&mut s, 3), Some(Some(9)));
    }

    #[test]
    fn what_a_move_leaves_over_moves_nothing_again() {
        // The others 1 epoch ahead (a move's remainder, or a skew within
        // max_clock_skew): no move, ever.
        let mut s = Skew::new(100 * MS, 100 * MS);
        for _ in 0..4 {
            sweep(&mut s, |j| if j <= 1 { 2 } else { 0 }, |_| 2);
            assert_eq!(s.estimate(), None);
        }
        // Two epochs is a skew beyond 100 ms: moved once.
        sweep(&mut s, |j| if j <= 2 { 2 } else { 0 }, |_| 2);
        assert_eq!(s.estimate(), None);
        sweep(&mut s, |j| if j <= 2 { 2 } else { 0 }, |_| 2);
        assert_eq!(s.estimate(), Some(-2));
        // With max_clock_skew 350 ms, 3 epochs are no skew.
        let mut s = Skew::new(100 * MS, 350 * MS);
        for _ in 0..3 {
            sweep(&mut s, |j| if j <= 3 { 2 } else { 0 }, |_| 2);
            assert_eq!(s.estimate(), None);
        }
    }
}
