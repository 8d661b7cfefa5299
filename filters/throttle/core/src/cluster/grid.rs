//! The grid every proxy computes alike from a rule's interval `T`: slot `k`
//! (a global index) is at wall-clock time `k * T` ns since the Unix epoch.
//! Epochs are the same for every rule of every proxy: epoch `f` is the wall
//! time `[f*E, (f+1)*E)` with `E` = [`EPOCH_NS`] (100 ms), and holds the slots
//! whose times fall in it, `[ceil(f*E/T), ceil((f+1)*E/T))`: `E/T` of them
//! on average, the count differing by one from epoch to epoch when `T` does
//! not divide `E`, and none in most epochs of rates below 10/s. One epoch
//! for all rules lets one call per epoch carry every rule's claims at the
//! right moment (until 2026-11-28 each rule had its own epoch of `L` whole
//! slots, `E = L*T`, so two rules' epochs drifted apart and the calls,
//! paced for both, skipped or delayed one rule's: red team 3, finding 3).
//!
//! Positions are not times. The engine hands out *positions* `0..L` of an
//! epoch (`L` its slots) in the order claims arrive, so one claim holds a
//! run of positions. Were position `p` the epoch's slot `p`, each proxy's
//! slots would be one run of time, and a request arriving outside its
//! proxy's run would wait for the next epoch even well within the rate.
//! Positions are therefore dealt over [`LANES`] lanes (`p mod LANES`), and
//! the lanes laid out in time in bit-reversed order
//! ([`Grid::position_ranges`]): a run of positions covers a share of every
//! lane, so each proxy's slots are spread over the whole epoch in at most
//! [`LANES`] short runs, and any run of positions is still at most [`LANES`]
//! ranges of slots. Every proxy computes the same bijection from `L` alone.
//!
//! The service appends the hour of *its own* clock to every counter's key
//! (engine/README.md). All claims on one epoch must land on one counter, so a
//! claim for epoch `f` is sent only while the caller's clock is inside the hour
//! holding the epoch's start, and at least `max_clock_skew` from its start and
//! `max_clock_skew + timeout` from its end ([`Grid::may_claim`]).

use crate::clock::NS_PER_MS;

/// The epoch of every rule: 10 epochs (at most 10 calls) per second.
pub const EPOCH_NS: u64 = 100 * NS_PER_MS;
/// The service's counter window (`unit: hour` in engine/config/throttle.yaml).
pub const WINDOW_NS: u64 = 3600 * crate::clock::NS_PER_S;

/// Lanes an epoch's positions are dealt over (a power of two).
pub const LANES: u64 = 32;
const LANE_BITS: u32 = LANES.trailing_zeros();

/// Lane `j`'s place in time among the lanes (bit reversal of `j`; its own inverse).
fn block_of_lane(j: u64) -> u64 {
    (j.reverse_bits() >> (u64::BITS - LANE_BITS)) & (LANES - 1)
}

/// One rule's grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// `T`: ns between two slots (the rule's interval).
    pub interval_ns: u64,
    /// `E`: ns per epoch ([`EPOCH_NS`] for every rule).
    pub epoch_ns: u64,
}

impl Grid {
    /// The grid of a rule released every `interval_ns` (> 0).
    pub fn new(interval_ns: u64) -> Grid {
        Grid {
            interval_ns: interval_ns.max(1),
            epoch_ns: EPOCH_NS,
        }
    }

    /// Wall time of slot `k`.
    pub fn slot_time(&self, k: u64) -> u64 {
        k.saturating_mul(self.interval_ns)
    }

    /// The first slot at or after wall time `t`.
    pub fn slot_at_or_after(&self, t: u64) -> u64 {
        t.div_ceil(self.interval_ns)
    }

    /// The epoch holding wall time `t`.
    pub fn epoch_of(&self, t: u64) -> u64 {
        t / self.epoch_ns
    }

    /// Wall time at which epoch `f` starts.
    pub fn epoch_start(&self, f: u64) -> u64 {
        f.saturating_mul(self.epoch_ns)
    }

    /// Global index of epoch `f`'s first slot (position 0).
    pub fn first_slot(&self, f: u64) -> u64 {
        self.slot_at_or_after(self.epoch_start(f))
    }

    /// `L`: the slots of epoch `f` (0 in most epochs of rates below 10/s).
    pub fn slots_in(&self, f: u64) -> u64 {
        self.first_slot(f.saturating_add(1))
            .saturating_sub(self.first_slot(f))
    }

    /// The epoch holding slot `k`.
    pub fn epoch_of_slot(&self, k: u64) -> u64 {
        self.epoch_of(self.slot_time(k))
    }

    /// Slots a run of `epochs` epochs holds, rounded: how far a clock offset
    /// of that many epochs moves the grid's slots.
    pub fn shift_slots(&self, epochs: i64) -> i64 {
        let ns = i128::from(epochs) * i128::from(self.epoch_ns);
        let t = i128::from(self.interval_ns);
        let slots = (ns + ns.signum() * t / 2) / t;
        i64::try_from(slots).unwrap_or(if epochs < 0 { i64::MIN } else { i64::MAX })
    }

    /// Positions of lane `j` in an epoch of `l` slots (those `p < l` with
    /// `p mod LANES = j`).
    fn lane_len(l: u64, j: u64) -> u64 {
        l.saturating_sub(j).div_ceil(LANES)
    }

    /// Offset from the epoch's first slot at which lane `j`'s slots start:
    /// the lanes placed before it in time, in bit-reversed order.
    fn lane_offset(l: u64, j: u64) -> u64 {
        (0..block_of_lane(j))
            .map(|b| Self::lane_len(l, block_of_lane(b)))
            .sum()
    }

    /// The global slots of positions `[a, b)` of epoch `f` (`b <= L`), as
    /// sorted, disjoint ranges `[start, end)`: at most [`LANES`] of them.
    /// Position `p` is slot `first + lane_offset(p mod LANES) + p div LANES`.
    pub fn position_ranges(&self, f: u64, a: u64, b: u64) -> Vec<(u64, u64)> {
        let l = self.slots_in(f);
        let b = b.min(l);
        let first = self.first_slot(f);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for block in 0..LANES {
            let j = block_of_lane(block);
            let start = first + Self::lane_offset(l, j);
            // Lane indices i with a <= i*LANES + j < b.
            let lo = a.saturating_sub(j).div_ceil(LANES);
            let hi = b.saturating_sub(j).div_ceil(LANES);
            if lo < hi {
                match out.last_mut() {
                    Some(last) if last.1 == start + lo => last.1 = start + hi,
                    _ => out.push((start + lo, start + hi)),
                }
            }
        }
        out
    }

    /// The key naming this grid's counters for rule `name` at epoch `f`:
    /// `<name>:<T>:<f>`. Proxies whose rule differs in name or rate never
    /// share a counter (nor with filters older than 2026-11-28, whose keys
    /// were `<name>:<T>:<L>:<f>`, on epochs of their own).
    pub fn counter_key(&self, name: &str, f: u64) -> String {
        format!("{name}:{}:{f}", self.interval_ns)
    }

    /// The name of this grid's per-hour count of calls (`<name>:<T>:gen`):
    /// it only grows within the service's hour, unless counters were lost.
    pub fn gen_key(&self, name: &str) -> String {
        format!("{name}:{}:gen", self.interval_ns)
    }

    /// The per-second member counters of rule `name`: of every proxy that
    /// carries a rule of that name, whatever its rate (`<name>:any:<s>`),
    /// and of those on this grid (`<name>:<T>:sec:<s>`).
    pub fn second_keys(&self, name: &str, s: u64) -> (String, String) {
        (
            format!("{name}:any:{s}"),
            format!("{name}:{}:sec:{s}", self.interval_ns),
        )
    }

    /// Whether a claim for epoch `f` may be sent at the caller's wall time
    /// `now`: `now` is in the service's window holding the epoch's start, at
    /// least `skew` after that window starts and `skew + timeout` before it ends.
    ///
    /// Why it suffices: the service's clock reads within `skew` of `now` when
    /// the claim is sent, and an answer is used only if it comes back within
    /// `timeout`, so every claim whose answer is used is counted inside the
    /// window holding the epoch's start. A late claim that lands in the next
    /// window touches a counter no used claim ever reads.
    pub fn may_claim(&self, f: u64, now: u64, skew: u64, timeout: u64) -> bool {
        let start = self.epoch_start(f);
        let w = start / WINDOW_NS;
        if now / WINDOW_NS != w {
            return false;
        }
        let w_start = w * WINDOW_NS;
        let w_end = w_start.saturating_add(WINDOW_NS);
        now >= w_start.saturating_add(skew)
            && now.saturating_add(skew).saturating_add(timeout) < w_end
    }

    /// Whether epoch `f` opens the service's hour: its start lies within the
    /// hour's first `max_clock_skew + span x E`, where `span = 1 + lag + k`
    /// (epochs from the demand add behind a share to the share's epoch).
    /// The claims behind such an epoch's share cross the hour: its share
    /// claim (`k` epochs before it), or the demand add of the total it is
    /// computed from (`1 + lag + k` before it), is due in the hour before
    /// or within the new hour's first `max_clock_skew`, where
    /// [`Grid::may_claim`] sends none. So every proxy takes its share of
    /// these epochs by one total read before the hour ([`Grid::reference`])
    /// without a claim, and nobody claims leftovers on them, which would be
    /// counted from 0 over those shares ([`super::caller`]). Every proxy
    /// reckons the same epochs from the grid and the configuration alone.
    /// Until 2026-12-01 the hour's first two epochs went unclaimed and
    /// released nothing, and the next five were first come (CI, two cluster
    /// rules overloaded over the top of the hour: 25 of 30 and 120 of 150
    /// in that second; requests held on those slots refused at their
    /// deadline).
    pub fn opens_hour(&self, f: u64, skew: u64, span: u64) -> bool {
        let into = self.epoch_start(f) % WINDOW_NS;
        into < skew.saturating_add(span.saturating_mul(self.epoch_ns))
    }

    /// The epoch whose demand total places the shares of an epoch that
    /// opens the hour ([`Grid::opens_hour`]): `back` epochs before the one
    /// behind the hour's first epoch's share (`1 + lag` before it). Its
    /// total is looked at again just before those shares are planned
    /// ([`super::caller`]): `back` is wide enough that every proxy's add
    /// to it has been counted by then, whatever the clocks within reach.
    pub fn reference(&self, f: u64, lag: u64, back: u64) -> u64 {
        let start = self.epoch_start(f);
        self.epoch_of(start - start % WINDOW_NS)
            .saturating_sub(1 + lag + back)
    }

    /// Epochs from the hour's first to the same epoch of the next hour.
    pub fn epochs_per_hour(&self) -> u64 {
        WINDOW_NS / self.epoch_ns.max(1)
    }
}

/// Hour window (as the service numbers it: seconds since the Unix epoch,
/// rounded down to the hour) holding wall time `t`.
pub fn window_of(t: u64) -> u64 {
    t / WINDOW_NS * 3600
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NS_PER_S;

    const MS: u64 = NS_PER_MS;

    #[test]
    fn every_rule_counts_in_100ms_epochs_of_whole_slots() {
        // 500/s: T = 2 ms, 50 slots in every epoch.
        let g = Grid::new(2 * MS);
        assert_eq!(g.epoch_ns, 100 * MS);
        assert!((0..100).all(|f| g.slots_in(f) == 50));
        // 300/s: T = 3,333,334 ns (rounded up): 30 slots, now and then 29.
        let g = Grid::new(3_333_334);
        let counts: Vec<u64> = (1_000_000..1_000_100).map(|f| g.slots_in(f)).collect();
        assert!(counts.iter().all(|&l| l == 29 || l == 30));
        // 30/s: T = 33,333,334 ns: 3 slots, or 4 when one falls at an epoch's start.
        let g = Grid::new(33_333_334);
        let total: u64 = (0..30).map(|f| g.slots_in(f)).sum();
        assert_eq!(total, g.first_slot(30) - g.first_slot(0));
        // 7/s: T = 142,857,143 ns: one slot in 7 epochs of 10, none in the others.
        let g = Grid::new(142_857_143);
        let ones = (0..700).filter(|&f| g.slots_in(f) == 1).count();
        assert!((0..700).all(|f| g.slots_in(f) <= 1));
        assert_eq!(ones, 490);
        // 1/s: one slot every 10 epochs.
        let g = Grid::new(NS_PER_S);
        assert_eq!((0..100).map(|f| g.slots_in(f)).sum::<u64>(), 10);
        // Every slot is in exactly one epoch, the one its time falls in.
        for t in [2 * MS, 3_333_334, 33_333_334, 142_857_143] {
            let g = Grid::new(t);
            for k in 1_000..1_200 {
                let f = g.epoch_of_slot(k);
                assert!(
                    g.first_slot(f) <= k && k < g.first_slot(f + 1),
                    "T {t} slot {k}"
                );
            }
        }
    }

    #[test]
    fn a_clock_offset_moves_the_slots_by_its_time() {
        let g = Grid::new(2 * MS);
        assert_eq!(g.shift_slots(9), 450);
        assert_eq!(g.shift_slots(-9), -450);
        let g = Grid::new(33_333_334);
        assert_eq!(g.shift_slots(1), 3); // 100 ms = 2.99999994 slots
        assert_eq!(g.shift_slots(-10), -30);
        assert_eq!(Grid::new(NS_PER_S).shift_slots(9), 1);
    }

    /// The global slot of position `p` (< L) of epoch `f`, one at a time.
    fn slot_of_position(g: &Grid, f: u64, p: u64) -> u64 {
        let l = g.slots_in(f);
        g.first_slot(f) + Grid::lane_offset(l, p % LANES) + p / LANES
    }

    #[test]
    fn positions_map_one_to_one_onto_the_epochs_slots() {
        for l in (1..=70).chain([97, 100, 128, 1000]) {
            let g = Grid::new(EPOCH_NS / l);
            for f in [12_345, 12_346, 17_954_676_001] {
                let l = g.slots_in(f);
                let mut slots: Vec<u64> = (0..l).map(|p| slot_of_position(&g, f, p)).collect();
                slots.sort_unstable();
                let want: Vec<u64> = (g.first_slot(f)..g.first_slot(f + 1)).collect();
                assert_eq!(slots, want, "L = {l}");
            }
        }
    }

    #[test]
    fn a_run_of_positions_is_at_most_lanes_ranges_of_the_same_slots() {
        for l in [1, 2, 3, 7, 8, 9, 15, 16, 17, 30, 50, 97] {
            let g = Grid::new(EPOCH_NS / l);
            let f = 7;
            let l = g.slots_in(f);
            for a in 0..=l {
                for b in a..=l + 2 {
                    let ranges = g.position_ranges(f, a, b);
                    assert!(ranges.len() as u64 <= LANES);
                    assert!(
                        ranges.windows(2).all(|w| w[0].1 < w[1].0),
                        "sorted, disjoint, merged"
                    );
                    let mut got: Vec<u64> = ranges.iter().flat_map(|&(s, e)| s..e).collect();
                    got.sort_unstable();
                    let mut want: Vec<u64> =
                        (a..b.min(l)).map(|p| slot_of_position(&g, f, p)).collect();
                    want.sort_unstable();
                    assert_eq!(got, want, "L = {l}, [{a}, {b})");
                }
            }
        }
    }

    #[test]
    fn a_third_of_the_positions_is_spread_over_the_whole_epoch() {
        // 300/s at T = 10/3 ms exactly every 3 epochs: epoch 3 holds slots
        // 90..120 (L = 30): 30 of the 32 lanes hold one slot each, placed in
        // time in bit-reversed order of the lanes.
        let g = Grid::new(3_333_333);
        let f = 3;
        assert_eq!(g.slots_in(f), 30);
        let first = g.first_slot(f);
        let rel = |a, b| -> Vec<(u64, u64)> {
            g.position_ranges(f, a, b)
                .into_iter()
                .map(|(s, e)| (s - first, e - first))
                .collect()
        };
        // Positions 0..10: lanes 0..9, one slot each.
        let owned = rel(0, 10);
        assert_eq!(owned.iter().map(|r| r.1 - r.0).sum::<u64>(), 10);
        assert!(owned.len() as u64 <= LANES);
        // The longest stretch of the epoch without a slot of positions 0..10
        // is a few slots, where positions in order of time would leave 20.
        let longest_gap = owned.windows(2).map(|w| w[1].0 - w[0].1).max();
        assert!(longest_gap.is_some_and(|g| g <= 4), "{owned:?}");
        assert_eq!(slot_of_position(&g, f, 0), first);
        // Any run of positions is spread too: 10..20 and 20..30.
        for (a, b) in [(10, 20), (20, 30)] {
            let o = rel(a, b);
            let gap = o.windows(2).map(|w| w[1].0 - w[0].1).max();
            assert!(gap.is_some_and(|g| g <= 6), "{a}..{b}: {o:?}");
        }
    }

    #[test]
    fn slots_and_epochs_line_up() {
        let g = Grid::new(2 * MS);
        let now = 1_795_467_600_123 * MS; // a wall-clock time in ns
        let f = g.epoch_of(now);
        assert_eq!(f, 17_954_676_001);
        assert_eq!(g.epoch_start(f), 1_795_467_600_100 * MS);
        assert_eq!(g.first_slot(f), f * 50);
        assert_eq!(g.slot_time(g.first_slot(f)), g.epoch_start(f));
        assert_eq!(g.slot_at_or_after(now), 897_733_800_062); // 123 ms -> slot 62 (124 ms)
        assert_eq!(g.slot_at_or_after(now - MS), g.slot_at_or_after(now) - 1);
        assert_eq!(g.epoch_of_slot(g.first_slot(f) + 49), f);
        assert_eq!(g.epoch_of_slot(g.first_slot(f) + 50), f + 1);
        assert_eq!(g.counter_key("orders", f), "orders:2000000:17954676001");
    }

    #[test]
    fn claims_stay_clear_of_the_hour_boundary() {
        let g = Grid::new(2 * MS);
        let h = 1_795_467_600 * NS_PER_S; // an hour boundary
        let (skew, timeout) = (100 * MS, 50 * MS);
        let f_before = g.epoch_of(h - MS); // the last epoch starting before h
        let f_after = g.epoch_of(h); // the first epoch of the new hour
        assert_eq!(g.epoch_start(f_after), h);
        // An epoch before the boundary: claimable until h - skew - timeout (exclusive).
        assert!(g.may_claim(f_before, h - 151 * MS, skew, timeout));
        assert!(!g.may_claim(f_before, h - 150 * MS, skew, timeout));
        assert!(!g.may_claim(f_before, h + 200 * MS, skew, timeout));
        // The first epochs after it: only from h + skew on, never from the old hour.
        assert!(!g.may_claim(f_after, h - 300 * MS, skew, timeout));
        assert!(!g.may_claim(f_after, h + 99 * MS, skew, timeout));
        assert!(g.may_claim(f_after, h + 100 * MS, skew, timeout));
        // The epochs whose shares cross the hour: its first skew + 6 E
        // (k = 3, lag = 2), each placed by the total behind the hour's first.
        let opens: Vec<bool> = (-2i64..9)
            .map(|j| g.opens_hour(f_after.saturating_add_signed(j), skew, 6))
            .collect();
        assert_eq!(
            opens,
            [false, false, true, true, true, true, true, true, true, false, false]
        );
        assert_eq!(g.reference(f_after + 6, 2, 0), f_after - 3);
        assert_eq!(g.reference(f_after + 6, 2, 28), f_after - 31);
        assert_eq!(g.epochs_per_hour(), 36_000);
        for f in f_after..f_after + 7 {
            // Share claim, or the demand add behind it, crosses the hour.
            let (share_due, add_due) = (g.epoch_start(f - 3), g.epoch_start(f - 6));
            for phase in [0, 25 * MS] {
                assert!(
                    !g.may_claim(f, share_due + phase, skew, timeout)
                        || !g.may_claim(f - 3, add_due + phase, skew, timeout)
                );
            }
        }
        assert!(g.may_claim(f_after + 7, g.epoch_start(f_after + 4), skew, timeout));
        assert!(g.may_claim(f_after + 4, g.epoch_start(f_after + 1), skew, timeout));
        assert_eq!(window_of(h - 1), 1_795_464_000);
        assert_eq!(window_of(h), 1_795_467_600);
    }
}
