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

/// `ceil(a * b / c)` without overflow (c > 0), saturating at u64::MAX.
pub(super) fn div_ceil_u128(a: u64, b: u64, c: u64) -> u64 {
    let v = (u128::from(a) * u128::from(b)).div_ceil(u128::from(c.max(1)));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The slots per second this process can expect: its share (its demand
/// `a` of the fleet's `A`, [`share`]) and, while the fleet asks for less
/// than the rate, its part of what is left over (the rest split over the
/// `N` proxies with demand); `R / N` before the demand is known.
pub(super) fn grant_rate(r: &RuleState) -> u64 {
    let g = r.spec.grid;
    let (e, t, ns) = (
        u128::from(g.epoch_ns),
        u128::from(g.interval_ns.max(1)),
        u128::from(NS_PER_S),
    );
    let n = u128::from(r.stats.members.max(1));
    let capacity = u128::from(DEMAND_UNIT) * e;
    let per_s = match u128::from(r.stats.demand) {
        0 => ns.div_ceil(t * n),
        total => {
            let den = (total * t).max(capacity);
            let share = u128::from(r.demand) * ns;
            let spare = capacity.saturating_sub(total * t) * ns;
            // share/den + spare/(64 T E N), over one denominator.
            let d2 = u128::from(DEMAND_UNIT) * t * e * n;
            (share * d2 + spare * den).div_ceil(den * d2)
        }
    };
    u64::try_from(per_s).unwrap_or(u64::MAX)
}
