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

/// `floor(l * d / total + phi / 2^64)` (total > 0). Summed over proxies whose
/// demand ranges tile `[0, total)`, the differences give exactly `l`.
pub(super) fn rotated_floor(l: u64, d: u64, total: u64, phi: u64) -> u64 {
    let total = u128::from(total.max(1));
    let ld = u128::from(l) * u128::from(d);
    // l * d < 2^64 for any real rate and demand; beyond it, no offset.
    match (
        ld.checked_shl(64).filter(|_| ld >> 64 == 0),
        total.checked_shl(64),
    ) {
        (Some(num), Some(den)) if total >> 64 == 0 => {
            u64::try_from((num + u128::from(phi) * total) / den).unwrap_or(u64::MAX)
        }
        _ => u64::try_from(ld / total).unwrap_or(u64::MAX),
    }
}

/// `ceil(a * b / c)` without overflow (c > 0), saturating at u64::MAX.
pub(super) fn div_ceil_u128(a: u64, b: u64, c: u64) -> u64 {
    let v = (u128::from(a) * u128::from(b)).div_ceil(u128::from(c.max(1)));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The share per second this process can expect: `L * a / A` slots per
/// epoch (`L / N` before the demand is known).
pub(super) fn grant_rate(r: &RuleState) -> u64 {
    let g = r.spec.grid;
    let l = g.slots_per_epoch;
    let per_epoch = match r.stats.demand {
        0 => l.div_ceil(r.stats.members.max(1)),
        total => l.min(div_ceil_u128(l, r.demand.max(1), total)),
    };
    div_ceil_u128(per_epoch, NS_PER_S, g.epoch_ns)
}
