//! The arithmetic of shares: how far ahead shares are claimed, where in
//! an epoch a process calls, the rotated floor that makes shares add up to
//! exactly `L` and each proxy's add up to its proportion however small `L`
//! is, and the share rate a process can expect.

use super::*;

/// Epochs between a demand epoch's adds and the look at its total: adds to
/// `demand(X)` are sent in epoch `X - k` at a phase below `E/4` and reach the
/// engine within `timeout`; a look sent `lag` epochs later, by a clock up to
/// `skew` ahead, comes after all of them.
pub fn lag_epochs(epoch_ns: u64, timeout_ns: u64, skew_ns: u64) -> u64 {
    (epoch_ns / 4 + timeout_ns + skew_ns)
        .div_ceil(epoch_ns.max(1))
        .max(1)
}

/// `k`, how many epochs ahead shares are claimed: leftovers of epoch `X` are
/// claimed in `X - 1` (at a phase of 0 at the earliest), shares of `X` in
/// `X - k` (a phase below `E/4`, reaching the engine within `timeout`, by a
/// clock up to `skew` behind), and every share must come first:
/// `(k - 1) E > E/4 + timeout + skew`.
pub fn ahead_epochs(epoch_ns: u64, timeout_ns: u64, skew_ns: u64) -> u64 {
    2 + (epoch_ns / 4 + timeout_ns + skew_ns) / epoch_ns.max(1)
}

/// Where in an epoch of `epoch_ns` a process with phase `permille` calls:
/// within its first quarter, so that calls of different processes spread
/// out and still leave every share ahead of every leftover ([`ahead_epochs`]).
pub(super) fn phase_offset(epoch_ns: u64, permille: u64) -> u64 {
    epoch_ns / 4 * permille / 1000
}

/// The offset (in 2^-64 units) of epoch `f`'s share boundaries: the
/// fractional part of `f` times the golden ratio. Every proxy computes the
/// same one; over consecutive epochs it is spread evenly over `[0, 1)` (a
/// Kronecker sequence), so a proxy's shares add up to its proportion of `L`
/// within about one slot however small `L` is. With a fixed offset, at
/// `L = 1` the proxy whose demand spans the boundary wins every epoch.
pub(super) fn epoch_phase(f: u64) -> u64 {
    f.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The offset of this proxy's part of epoch `f`'s spare ([`spare`]): the
/// epoch's share offset turned by its call phase (`permille`), so that each
/// proxy's floor is rotated apart from the others' and their parts do not
/// round up at once.
pub(super) fn spare_phase(f: u64, permille: u64) -> u64 {
    epoch_phase(f).wrapping_add(permille.wrapping_mul(u64::MAX / 1000))
}

/// `floor(num / den + phi / 2^64)` (den > 0), exactly, for num and den
/// below 2^64 times anything.
pub(super) fn rotated_div(num: u128, den: u128, phi: u64) -> u64 {
    let den = den.max(1);
    let (q, r) = (num / den, num % den);
    // r/den + phi/2^64 >= 1  <=>  phi * den >= (den - r) * 2^64.
    let carry = match (u128::from(phi).checked_mul(den), (den - r).checked_shl(64)) {
        (Some(lhs), Some(rhs)) => u64::from(lhs >= rhs),
        _ => 0,
    };
    u64::try_from(q).unwrap_or(u64::MAX).saturating_add(carry)
}

/// A proxy's share of epoch `f`'s `l` slots, its demand at `[d0, d1)` of the
/// fleet's `total` (in 1/[`DEMAND_UNIT`] of a request per epoch): in
/// proportion to demand when the fleet asks for more than the rate, and its
/// demand when it asks for less (the rest is left over for whoever needs it:
/// a burst, a proxy whose demand rose, one that owes credit). Over the
/// proxies, the shares add up to exactly `l x min(1, A / (R x E))`, whatever
/// the order of the claims.
pub(super) fn share(g: &Grid, l: u64, (d0, d1): (u64, u64), total: u64, phi: u64) -> u64 {
    let t = u128::from(g.interval_ns);
    // The rate per epoch in demand units: DEMAND_UNIT * E / T.
    let capacity = u128::from(DEMAND_UNIT) * u128::from(g.epoch_ns);
    let den = (u128::from(total) * t).max(capacity);
    let at = |d: u64| rotated_div(u128::from(l) * u128::from(d) * t, den, phi);
    at(d1).saturating_sub(at(d0))
}

/// This proxy's part of what the fleet leaves over of epoch `f`'s `l`
/// slots while it asks for less than the rate: `l x (1 - A T / (64 E)) / N`
/// (a floor rotated by `phi`), with `A` the fleet's demand last seen and
/// `N` the proxies with demand. Claimed with the leftovers, so that a proxy
/// below the rate owns slots beyond its demand (a lone proxy owns them all)
/// and a request that arrives between its demand's slots finds one at hand,
/// as it would in process scope; what one proxy leaves unclaimed stays for
/// the others. The floor rotates over epochs (and differs between proxies,
/// `phi`) so that a part below one slot an epoch adds up to its proportion:
/// until issue 29 a plain floor left 8 proxies at 0.93 slot each an epoch
/// with none (fleet sweep seed 396: requests at half the rate waited up to
/// 192 ms).
pub(super) fn spare(g: &Grid, l: u64, total: u64, members: u64, phi: u64) -> u64 {
    let capacity = u128::from(DEMAND_UNIT) * u128::from(g.epoch_ns);
    let used = u128::from(total) * u128::from(g.interval_ns);
    let den = capacity * u128::from(members.max(1));
    rotated_div(u128::from(l) * capacity.saturating_sub(used), den, phi)
}

/// `ceil(a * b / c)` without overflow (c > 0), saturating at u64::MAX.
pub(super) fn div_ceil_u128(a: u64, b: u64, c: u64) -> u64 {
    let v = (u128::from(a) * u128::from(b)).div_ceil(u128::from(c.max(1)));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The slots per second this process can expect: its shares as the engine
/// computed them for the last epochs it claimed (`k` ahead: for the demand
/// as it is now; a share of nothing counts, as for a proxy whose clock is
/// apart before it is found), but no more than `R / max(N,
/// expected_replicas)` until they span [`share_memory`] epochs or hold
/// [`SHARE_SLOTS`] slots (a first share of one slot in one epoch is not ten
/// a second: too few to tell, the estimate errs low, so that a request
/// refused is refused at once rather than after it waited); and, while the fleet asks for less
/// than the rate, its part of what is left over (the rest split over the `N`
/// proxies with demand; not in the first [`SETTLING_NS`] of answers, when
/// partial demand totals would show room that is not there). Before any
/// answer, `R / max(N, expected_replicas)`. With the spare part on its own.
pub(super) fn grant_rate(r: &RuleState, now: u64) -> (u64, u64) {
    let g = r.spec.grid;
    let (e, t, ns) = (
        u128::from(g.epoch_ns),
        u128::from(g.interval_ns.max(1)),
        u128::from(NS_PER_S),
    );
    let n = r.stats.members.max(u64::from(r.spec.expected_replicas));
    let prior = ns.div_ceil(t * u128::from(n.max(1)));
    let Some(first) = r.first_answer else {
        return (u64::try_from(prior).unwrap_or(u64::MAX), 0);
    };
    let memory = u128::try_from(share_memory(&g)).unwrap_or(u128::MAX);
    let epochs_of = r.shares.iter().map(|&(f, ..)| f);
    let (share, spare_with) = match (epochs_of.clone().min(), epochs_of.max()) {
        (Some(from), Some(to)) => {
            let slots: u128 = r.shares.iter().map(|&(_, n, _)| u128::from(n)).sum();
            let left: u128 = r.shares.iter().map(|&(.., s)| u128::from(s)).sum();
            let epochs = u128::from(to.saturating_sub(from).saturating_add(1));
            let seen = slots * ns / (e * epochs);
            let left = left * ns / (e * epochs);
            if epochs < memory && slots < u128::from(SHARE_SLOTS) {
                // Too few to tell: no more than the even split.
                (seen.min(prior), left)
            } else {
                (seen, left)
            }
        }
        _ => (prior, 0),
    };
    let settled = now.saturating_sub(first) >= SETTLING_NS;
    let capacity = u128::from(DEMAND_UNIT) * e;
    let total = u128::from(r.stats.demand);
    let spare = if settled {
        // Left over per second, over the proxies with demand:
        // (64 E - A T) / (64 T E) * NS / N.
        capacity.saturating_sub(total * t) * ns
            / (capacity * t)
            / u128::from(r.stats.members.max(1))
    } else {
        0
    };
    // Each share with the part of the spare the same demand total left this
    // proxy (they add up to the rate for a lone proxy, whatever its own
    // demand does), or the spare by the latest total if more (room the
    // fleet left since). Until issue 30 the spare by the latest total alone:
    // when a proxy's own demand rose, the spare went at once and its shares
    // came a second later, so a lone proxy at 20/s reckoned its turns at
    // 5/s and refused or displaced most of a burst its queue held (scenario
    // `class-burst`; real Envoy, tests/test_combinations.py: 11-16 of 30).
    let per_s = share + spare_with.max(spare);
    (
        u64::try_from(per_s).unwrap_or(u64::MAX),
        u64::try_from(spare).unwrap_or(u64::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight proxies at half of 150/s: each one's spare part is 0.93 slot
    /// an epoch. A plain floor gave each none (fleet sweep seed 396); the
    /// rotated floor adds up to the proportion over epochs, and in no
    /// epoch do the parts exceed what is left over by more than the
    /// rounding of each (one slot per proxy).
    #[test]
    fn spare_parts_below_one_slot_add_up_over_epochs() {
        let g = Grid::new(NS_PER_S / 150);
        let l = g.slots_in(0);
        let members = 8u64;
        // Half the rate, in demand units per epoch.
        let total = DEMAND_UNIT * l / 2;
        let epochs = 1000u64;
        let mut sum = [0u64; 8];
        for f in 0..epochs {
            let mut in_epoch = 0;
            for (p, s) in sum.iter_mut().enumerate() {
                let phi =
                    epoch_phase(f).wrapping_add((p as u64 * 377 + 123) % 1000 * (u64::MAX / 1000));
                let part = spare(&g, l, total, members, phi);
                in_epoch += part;
                *s += part;
            }
            assert!(in_epoch <= l.div_ceil(2) + members, "epoch {f}: {in_epoch}");
        }
        let (cap, used) = (
            (DEMAND_UNIT * g.epoch_ns) as f64,
            (total * g.interval_ns) as f64,
        );
        let expected = epochs as f64 * l as f64 * (1.0 - used / cap) / members as f64;
        for (p, &s) in sum.iter().enumerate() {
            assert!(
                (s as f64 - expected).abs() <= 1.0 + expected * 0.01,
                "proxy {p}: {s} of {expected}"
            );
            assert!(s > 0);
        }
    }
}
