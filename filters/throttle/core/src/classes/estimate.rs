//! How long a request of a class will wait, from the shared counts: for a
//! new request's admission (with the recent arrivals of the higher classes)
//! and for a held request's displacement (a bound that holds whatever comes).

use crate::clock::NS_PER_S;
use crate::config::Class;

use super::tickets::Tickets;
use super::{discrepancy, floor_slots_at_most, MAX};
use crate::rate::Outlook;

/// The queue as a request of some class sees it at `now`.
#[derive(Debug, Clone, Copy)]
pub struct Backlog<'a> {
    pub classes: &'a [Class],
    pub tickets: &'a Tickets,
    pub outlook: Outlook,
    pub now: u64,
}

impl Backlog<'_> {
    fn share(&self, c: usize) -> f64 {
        self.classes
            .get(c)
            .map_or(0.0, |k| f64::from(k.min_share_ppm) / 1e6)
    }

    /// Requests of the classes above `c` waiting.
    fn above(&self, c: usize, waiting: &[u64; MAX]) -> u64 {
        waiting.iter().take(c).sum()
    }
}

/// Estimated nanoseconds from `now` until the `position`-th waiting request
/// of class `c` (1: the next) gets its slot; None if it never would (no
/// floor, and the classes above take every slot).
///
/// The higher classes' backlog goes first, except the floor slots of `c`
/// and of the lower classes waiting; for an admission (`admission`), the
/// higher classes keep arriving at their recent rate `H`. So `c` receives
/// its floor `F_c` while the backlog above drains at `R - F_below - F_c -
/// H`, then `max(F_c, R - F_below - H)`. Exact for a single class:
/// `next_at - now + (position - 1) / R`, as the schedule of a rule without
/// classes. For an admission, when lower classes with a floor wait, the
/// turn is later by the floor sequence's discrepancy over that many slots
/// ([`floor_slots_at_most`]'s slack), so that an admitted request is not
/// displaced because the floor slots bunched.
pub fn turn_ns(b: &Backlog<'_>, c: usize, position: u64, admission: bool) -> Option<u64> {
    if admission {
        match walk(b, c, position) {
            Walk::Found(ns) => return Some(ns),
            // Beyond every slot owned: reckoned, so after the last of them
            // (a rate reckoned from the next slot on would put it among
            // them, and take it as certain; fleet sweep seed 193: shares
            // falling after the start's leftovers, 194 critical requests
            // held and refused at their deadline).
            Walk::Beyond => {
                let after = b
                    .outlook
                    .certain_until
                    .saturating_sub(b.now)
                    .saturating_add(b.outlook.interval_ns.max(1));
                return reckon(b, c, position, admission).map(|ns| ns.max(after));
            }
            Walk::Unknown => {}
        }
    }
    reckon(b, c, position, admission)
}

/// What an admission's walk over the known slots found.
enum Walk {
    /// The turn, in nanoseconds from now.
    Found(u64),
    /// Every owned slot walked, and the turn lies beyond them.
    Beyond,
    /// The known slots end (or the walk does) before the turn.
    Unknown,
}

/// Slots an admission's walk looks at one by one, at most.
const WALK_MAX: u64 = 4096;

/// For an admission: the turn over the slots whose indices are known
/// ([`Outlook::known`]), slot by slot, on the safe side for the request:
/// every lower class with a floor is taken to wait (it may, by the time its
/// floor slot comes), and the classes above keep arriving at their recent
/// rate. None if the known slots end before its turn.
fn walk(b: &Backlog<'_>, c: usize, position: u64) -> Walk {
    if b.outlook.known.is_none() {
        return Walk::Unknown;
    }
    let mut waiting = b.tickets.waiting();
    for (d, k) in b.classes.iter().enumerate().skip(c + 1) {
        if k.min_share_ppm > 0 {
            if let Some(w) = waiting.get_mut(d) {
                *w = (*w).max(1);
            }
        }
    }
    if let Some(w) = waiting.get_mut(c) {
        *w = (*w).max(1);
    }
    let h: f64 = (0..c).map(|x| b.tickets.arrival_rate(x, b.now)).sum();
    let mut above = b.above(c, &waiting) as f64;
    let mut got = 0u64;
    let mut last_at = b.outlook.next_at;
    let mut walked = 0u64;
    for (slot, at) in b.outlook.known_slots().take(WALK_MAX as usize) {
        walked += 1;
        above += h * at.saturating_sub(last_at) as f64 / NS_PER_S as f64;
        last_at = at;
        let mut w = waiting;
        // The classes above count as waiting while their backlog lasts.
        for x in 0..c {
            if let Some(v) = w.get_mut(x) {
                *v = u64::from(above >= 1.0) * (*v).max(1);
            }
        }
        match super::choose(slot, b.classes, &w) {
            Some(x) if x == c => {
                got += 1;
                if got >= position {
                    return Walk::Found(at.saturating_sub(b.now));
                }
            }
            Some(x) if x < c => above = (above - 1.0).max(0.0),
            _ => {}
        }
    }
    if b.outlook.later_all && walked < WALK_MAX {
        Walk::Beyond
    } else {
        Walk::Unknown
    }
}

/// The turn reckoned from the rates (see [`turn_ns`]).
fn reckon(b: &Backlog<'_>, c: usize, position: u64, admission: bool) -> Option<u64> {
    let arrivals = admission;
    let waiting = b.tickets.waiting();
    let r = b.outlook.per_s;
    let f_c = b.share(c) * r;
    let f_below: f64 = (c + 1..b.classes.len())
        .filter(|&d| waiting.get(d).is_some_and(|&w| w > 0))
        .map(|d| b.share(d) * r)
        .sum();
    let h: f64 = if arrivals {
        (0..c).map(|h| b.tickets.arrival_rate(h, b.now)).sum()
    } else {
        0.0
    };
    let need = position.saturating_sub(1) as f64;
    let above = b.above(c, &waiting) as f64;
    let drain = r - f_below - f_c - h;
    // Phase 1: the backlog above drains; c receives its floor only.
    let t1 = if above <= 0.0 {
        0.0
    } else if drain > 0.0 {
        above / drain
    } else {
        f64::INFINITY
    };
    let t = if f_c > 0.0 && f_c * t1 >= need {
        need / f_c
    } else if t1.is_infinite() {
        return None;
    } else {
        let rest = r - f_below - h;
        let rate2 = rest.max(f_c);
        if rate2 <= 0.0 {
            return None;
        }
        t1 + (need - f_c * t1) / rate2
    };
    let mut ns = t * NS_PER_S as f64;
    if admission && f_below > 0.0 {
        let slots = (t * r).max(0.0) as u64;
        ns += discrepancy(slots) as f64 * NS_PER_S as f64 / r;
    }
    if !ns.is_finite() || ns >= u64::MAX as f64 {
        return None;
    }
    Some(
        b.outlook
            .next_at
            .saturating_sub(b.now)
            .saturating_add(ns as u64),
    )
}

/// Whether the `position`-th waiting request of class `c` certainly cannot
/// get its slot by `deadline`, even if no request of a higher class arrived
/// from now on: of the `n` slots due by then, the backlog above takes all
/// but `c`'s floor slots, so `c` gets at most `max(floor slots of n, n -
/// waiting above)` ([`floor_slots_at_most`]).
pub fn cannot_make_it(b: &Backlog<'_>, c: usize, position: u64, deadline: u64) -> bool {
    if deadline < b.now {
        return true;
    }
    let n = match (
        deadline.checked_sub(b.outlook.next_at),
        b.outlook.interval_ns,
    ) {
        (Some(span), t) if t > 0 => span / t + 1,
        // No slot is coming (or it comes after the deadline).
        _ => 0,
    };
    let waiting = b.tickets.waiting();
    let ppm = b.classes.get(c).map_or(0, |k| k.min_share_ppm);
    let most = floor_slots_at_most(ppm, n).max(n.saturating_sub(b.above(c, &waiting)));
    position > most
}
