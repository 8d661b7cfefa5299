//! The grid every proxy computes alike from a rule's interval `T`: slot `k`
//! (a global index) is at wall-clock time `k * T` ns since the Unix epoch;
//! epoch `f` holds slots `[f*L, (f+1)*L)` with `L = ceil(100 ms / T)` (at
//! least 1) and lasts `E = L*T` (`E` in [100 ms, 200 ms) for `T <= 100 ms`,
//! `E = T` for slower rates).
//!
//! Positions are not times. The engine hands out *positions* `0..L` of an
//! epoch in the order claims arrive, so one claim holds a run of positions.
//! Were position `p` the slot `f*L + p`, each proxy's slots would be one
//! run of time, and a request arriving outside its proxy's run would wait
//! for the next epoch even well within the rate. Positions are therefore
//! dealt over [`LANES`] lanes (`p mod LANES`), and the lanes laid out in time
//! in bit-reversed order ([`Grid::position_ranges`]): a run of positions
//! covers a share of every lane, so each proxy's slots are spread over the
//! whole epoch in at most [`LANES`] short runs, and any run of positions is
//! still at most [`LANES`] ranges of slots. Every proxy computes the same
//! bijection from `L` alone.
//!
//! The service appends the hour of *its own* clock to every counter's key
//! (engine/README.md). All claims on one epoch must land on one counter, so a
//! claim for epoch `f` is sent only while the caller's clock is inside the hour
//! holding the epoch's start, and at least `max_clock_skew` from its start and
//! `max_clock_skew + timeout` from its end ([`Grid::may_claim`]).

use crate::clock::{NS_PER_MS, NS_PER_S};

/// Target epoch length: at most 10 epochs (10 calls) per second per rule.
pub const EPOCH_TARGET_NS: u64 = 100 * NS_PER_MS;
/// The service's counter window (`unit: hour` in engine/config/throttle.yaml).
pub const WINDOW_NS: u64 = 3600 * NS_PER_S;

/// Lanes an epoch's positions are dealt over (a power of two).
pub const LANES: u64 = 8;
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
    /// `L`: slots per epoch.
    pub slots_per_epoch: u64,
    /// `E = L*T`: ns per epoch.
    pub epoch_ns: u64,
}

impl Grid {
    /// The grid of a rule released every `interval_ns` (> 0).
    pub fn new(interval_ns: u64) -> Grid {
        let t = interval_ns.max(1);
        let l = EPOCH_TARGET_NS.div_ceil(t).max(1);
        Grid {
            interval_ns: t,
            slots_per_epoch: l,
            epoch_ns: l.saturating_mul(t),
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

    /// Global index of position 0 of epoch `f`.
    pub fn first_slot(&self, f: u64) -> u64 {
        f.saturating_mul(self.slots_per_epoch)
    }

    /// The epoch holding slot `k`.
    pub fn epoch_of_slot(&self, k: u64) -> u64 {
        k / self.slots_per_epoch
    }

    /// Positions of lane `j` (those `p < L` with `p mod LANES = j`).
    fn lane_len(&self, j: u64) -> u64 {
        self.slots_per_epoch.saturating_sub(j).div_ceil(LANES)
    }

    /// Offset from the epoch's first slot at which lane `j`'s slots start:
    /// the lanes placed before it in time, in bit-reversed order.
    fn lane_offset(&self, j: u64) -> u64 {
        (0..block_of_lane(j))
            .map(|b| self.lane_len(block_of_lane(b)))
            .sum()
    }

    /// The global slots of positions `[a, b)` of epoch `f` (`b <= L`), as
    /// sorted, disjoint ranges `[start, end)`: at most [`LANES`] of them.
    /// Position `p` is slot `first + lane_offset(p mod LANES) + p div LANES`.
    pub fn position_ranges(&self, f: u64, a: u64, b: u64) -> Vec<(u64, u64)> {
        let b = b.min(self.slots_per_epoch);
        let first = self.first_slot(f);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for block in 0..LANES {
            let j = block_of_lane(block);
            let start = first + self.lane_offset(j);
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
    /// `<name>:<T>:<L>:<f>`. Proxies whose rule differs in name or rate never
    /// share a counter.
    pub fn counter_key(&self, name: &str, f: u64) -> String {
        format!("{name}:{}:{}:{f}", self.interval_ns, self.slots_per_epoch)
    }

    /// The name of this grid's per-hour count of calls (`<name>:<T>:<L>:gen`):
    /// it only grows within the service's hour, unless counters were lost.
    pub fn gen_key(&self, name: &str) -> String {
        format!("{name}:{}:{}:gen", self.interval_ns, self.slots_per_epoch)
    }

    /// The per-second member counters of rule `name`: of every proxy that
    /// carries a rule of that name, whatever its rate (`<name>:any:<s>`),
    /// and of those on this grid (`<name>:<T>:<L>:sec:<s>`).
    pub fn second_keys(&self, name: &str, s: u64) -> (String, String) {
        (
            format!("{name}:any:{s}"),
            format!(
                "{name}:{}:{}:sec:{s}",
                self.interval_ns, self.slots_per_epoch
            ),
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
}

/// Hour window (as the service numbers it: seconds since the Unix epoch,
/// rounded down to the hour) holding wall time `t`.
pub fn window_of(t: u64) -> u64 {
    t / WINDOW_NS * 3600
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = NS_PER_MS;

    #[test]
    fn epochs_are_about_100ms_and_whole_slots() {
        // 300/s: T = 3,333,334 ns (rounded up), L = 30, E = 100,000,020 ns.
        let g = Grid::new(3_333_334);
        assert_eq!((g.slots_per_epoch, g.epoch_ns), (30, 100_000_020));
        // 500/s: T = 2 ms, L = 50, E = 100 ms exactly.
        let g = Grid::new(2 * MS);
        assert_eq!((g.slots_per_epoch, g.epoch_ns), (50, 100 * MS));
        // 7/s: T = 142,857,143 ns > 100 ms: one slot per epoch.
        let g = Grid::new(142_857_143);
        assert_eq!((g.slots_per_epoch, g.epoch_ns), (1, 142_857_143));
        // 15/s: T = 66,666,667 ns: L = 2, E = 133,333,334 ns (in [100, 200) ms).
        let g = Grid::new(66_666_667);
        assert_eq!((g.slots_per_epoch, g.epoch_ns), (2, 133_333_334));
        // 1,000,000/s: L = 100,000.
        assert_eq!(Grid::new(1000).slots_per_epoch, 100_000);
    }

    /// The global slot of position `p` (< L) of epoch `f`, one at a time.
    fn slot_of_position(g: &Grid, f: u64, p: u64) -> u64 {
        g.first_slot(f) + g.lane_offset(p % LANES) + p / LANES
    }

    #[test]
    fn positions_map_one_to_one_onto_the_epochs_slots() {
        for l in (1..=70).chain([97, 100, 128, 1000]) {
            let g = Grid::new(EPOCH_TARGET_NS.div_ceil(l));
            assert_eq!(g.slots_per_epoch, l);
            let f = 12_345;
            let mut slots: Vec<u64> = (0..l).map(|p| slot_of_position(&g, f, p)).collect();
            slots.sort_unstable();
            let want: Vec<u64> = (g.first_slot(f)..g.first_slot(f + 1)).collect();
            assert_eq!(slots, want, "L = {l}");
        }
    }

    #[test]
    fn a_run_of_positions_is_at_most_lanes_ranges_of_the_same_slots() {
        for l in [1, 2, 3, 7, 8, 9, 15, 16, 17, 30, 50, 97] {
            let g = Grid::new(EPOCH_TARGET_NS.div_ceil(l));
            let f = 7;
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
        // 300/s: L = 30 in lanes of 4,4,4,4,4,4,3,3 slots, placed in time in
        // the order of lanes 0,4,2,6,1,5,3,7.
        let g = Grid::new(3_333_334);
        let first = g.first_slot(3);
        let rel = |a, b| -> Vec<(u64, u64)> {
            g.position_ranges(3, a, b)
                .into_iter()
                .map(|(s, e)| (s - first, e - first))
                .collect()
        };
        // Positions 0..10: lanes 0 and 1 twice, the others once.
        assert_eq!(
            rel(0, 10),
            vec![
                (0, 2),
                (4, 5),
                (8, 9),
                (12, 13),
                (15, 17),
                (19, 20),
                (23, 24),
                (27, 28)
            ]
        );
        assert_eq!(
            rel(10, 20),
            vec![
                (2, 3),
                (5, 6),
                (9, 11),
                (13, 14),
                (17, 18),
                (20, 21),
                (24, 26),
                (28, 29)
            ]
        );
        // The longest stretch of the epoch without a slot of positions 0..10:
        // 3 slots (10 ms), where positions in order of time would leave 20.
        let owned = rel(0, 10);
        let longest_gap = owned.windows(2).map(|w| w[1].0 - w[0].1).max();
        assert_eq!(longest_gap, Some(3));
        // Positions in time order, position 0 first.
        assert_eq!(slot_of_position(&g, 3, 0), first);
        assert_eq!(slot_of_position(&g, 3, 4), first + 4);
        assert_eq!(slot_of_position(&g, 3, 7), first + 27);
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
        assert_eq!(g.counter_key("orders", f), "orders:2000000:50:17954676001");
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
        assert_eq!(window_of(h - 1), 1_795_464_000);
        assert_eq!(window_of(h), 1_795_467_600);
    }
}
