//! Where the service's clock stands against this proxy's, from the seconds
//! left in its hour that every answer carries (`durationUntilReset`).
//!
//! The rate limit service counts each counter for an hour of its own clock
//! and answers `3600 - now % 3600` whole seconds to go, `now` its Unix time
//! in whole seconds (envoyproxy/ratelimit's `CalculateReset`). So an answer
//! to a call sent at our `t_s` and answered at our `t_a` says that the
//! service's second `S` (the hour's end less the seconds to go) began at
//! most then, and ended after `t_s`: the offset `d = service - ours` lies in
//! `[S - t_a, S + 1 s - t_s)`. Each answer narrows it; calls 100 ms apart
//! fall at ten places of the service's second, so within about a second the
//! offset is known to about 100 ms plus a round trip.
//!
//! The member counters' vote ([`super::skew`]) tells where this proxy's
//! clock stands against the other proxies'; the service is the one clock
//! every proxy shares. A vote that would move a proxy's grid away from the
//! service's clock, beyond `max_clock_skew`, is refused
//! ([`ServiceClock::moves_away`]): the others, off the service's clock,
//! are the ones to move. A grid off it goes to it ([`ServiceClock::target`]). Until 2026-12-02 a 2-against-2 split could resolve to
//! the skewed half (two proxies with right clocks followed two 900 ms
//! behind): the fleet's grid was then 900 ms off the service's, and at the
//! top of the service's hour every call failed its hour check for a second
//! and the fleet fell back (fleet sweep `--start-search clock-tie`: 140
//! released in that second of a 100/s rule, 103.5/s over 15 s).

use std::collections::VecDeque;

use crate::clock::NS_PER_S;

/// How long an answer's bounds count: a clock that steps is followed
/// within this long (bounds that no longer meet are dropped at once).
pub const MEMORY_NS: u64 = 3 * NS_PER_S;

/// A grid goes to the service's clock only on bounds that agree over this
/// long, and this many answers.
pub const SETTLED_NS: u64 = 1_500_000_000;
const SETTLED_ANSWERS: usize = 12;

/// At most this many answers' bounds are kept.
const KEPT: usize = 40;

/// The service's hour, ns.
const HOUR_NS: u64 = 3600 * NS_PER_S;

/// The bounds on the service's clock offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceClock {
    /// Per answer: when it came (our time), and `[lo, hi)` of the offset.
    bounds: VecDeque<(u64, i64, i64)>,
}

impl ServiceClock {
    /// An answer to a call sent at our `sent` (ns) came at our `now`,
    /// `reset_s` seconds before the end of the service's hour.
    pub fn observe(&mut self, sent: u64, now: u64, reset_s: u64) {
        if reset_s == 0 || reset_s > 3600 || now < sent {
            return;
        }
        // The hour's end nearest to ours plus the seconds to go (the clocks
        // within half an hour of each other), and the service's second then.
        let end_guess = now.saturating_add(reset_s.saturating_mul(NS_PER_S));
        let end = end_guess.saturating_add(HOUR_NS / 2) / HOUR_NS * HOUR_NS;
        let second = end.saturating_sub(reset_s.saturating_mul(NS_PER_S));
        let lo = i128::from(second) - i128::from(now);
        let hi = i128::from(second) + i128::from(NS_PER_S) - i128::from(sent);
        let (Ok(lo), Ok(hi)) = (i64::try_from(lo), i64::try_from(hi)) else {
            return;
        };
        // A bound that does not meet the others: the clock stepped. Start
        // again from it (keeping those of the others that happen to meet
        // it would place the service between the two clocks).
        if let Some((l, h)) = self.offset() {
            if lo.max(l) >= hi.min(h) {
                self.bounds.clear();
            }
        }
        self.bounds.push_back((now, lo, hi));
        while self.bounds.len() > KEPT
            || self
                .bounds
                .front()
                .is_some_and(|&(at, ..)| at.saturating_add(MEMORY_NS) < now)
        {
            self.bounds.pop_front();
        }
    }

    /// Whether the bounds kept agree over [`SETTLED_NS`] and
    /// [`SETTLED_ANSWERS`] at least: not a clock that has just stepped
    /// (bounds from before a step that still meet the first ones after it
    /// would place the service wrong, and a grid moved by them moves again).
    fn settled(&self) -> bool {
        match (self.bounds.front(), self.bounds.back()) {
            (Some(&(first, ..)), Some(&(last, ..))) => {
                self.bounds.len() >= SETTLED_ANSWERS && last.saturating_sub(first) >= SETTLED_NS
            }
            _ => false,
        }
    }

    /// `[lo, hi)` of the service's clock minus ours, ns (None before any
    /// answer).
    pub fn offset(&self) -> Option<(i64, i64)> {
        if self.bounds.is_empty() {
            return None;
        }
        Some(
            self.bounds
                .iter()
                .fold((i64::MIN, i64::MAX), |(lo, hi), &(_, l, h)| {
                    (lo.max(l), hi.min(h))
                }),
        )
    }

    /// Where a grid that runs `from` ns behind our clock should run, in
    /// epochs of `epoch_ns`, to follow the service's clock, on bounds that
    /// have settled (12 answers over 1.5 s agree): see [`ServiceClock::target`].
    pub fn toward(&self, from: i64, epoch_ns: i64, skew: i64) -> Option<i64> {
        self.target(from, epoch_ns, skew).filter(|_| self.settled())
    }

    /// Where a grid that runs `from` ns behind our clock should run, in
    /// epochs of `epoch_ns`, to follow the service's clock: `None` while it
    /// is within `skew` and an epoch of it (or might be), or while the
    /// service's offset is known to less than two epochs. Taken at once
    /// when a vote also says the grid is off (the vote may have read half
    /// of a skewed half); alone, only on settled bounds.
    pub fn target(&self, from: i64, epoch_ns: i64, skew: i64) -> Option<i64> {
        let (lo, hi) = self.offset()?;
        let epoch_ns = epoch_ns.max(1);
        if hi.saturating_sub(lo) > 2 * epoch_ns {
            return None;
        }
        // Beyond `max_clock_skew` by more than an epoch (rounding and the
        // bounds' width never move a grid).
        if self.gap(from, skew.saturating_add(epoch_ns)) == 0 {
            return None;
        }
        // The grid's offset that puts the service's at the middle of the
        // bounds: `d + offset = 0`.
        let mid = lo / 2 + hi / 2;
        Some(-(mid.saturating_add(epoch_ns / 2).div_euclid(epoch_ns)))
    }

    /// How far, for sure, a grid that runs `to` ns behind our clock is off
    /// the service's clock beyond `skew` (0: within it, or it might be).
    fn gap(&self, to: i64, skew: i64) -> i64 {
        let Some((lo, hi)) = self.offset() else {
            return 0;
        };
        // The grid's clock is ours less the offset; the service's is ours
        // plus `d`: the service is `d + offset` ahead of the grid.
        let (a, b) = (lo.saturating_add(to), hi.saturating_add(to));
        if b <= -skew {
            -skew - b
        } else if a > skew {
            a - skew
        } else {
            0
        }
    }

    /// Whether a grid off the service's clock (beyond `skew`, for sure) at
    /// `from` ns would be within `skew` of it (or might be) at `to`: a
    /// vote's first answer that the service confirms needs no second.
    pub fn corroborates(&self, from: i64, to: i64, skew: i64) -> bool {
        self.gap(from, skew) > 0 && self.gap(to, skew) == 0
    }

    /// Whether a grid that runs `from` ns behind our clock (our offset from
    /// the fleet's: positive when ours is ahead) moving to `to` ns would be
    /// further from the service's clock, and beyond `skew` of it, for sure:
    /// a vote that would do that is refused.
    pub fn moves_away(&self, from: i64, to: i64, skew: i64) -> bool {
        let after = self.gap(to, skew);
        after > 0 && after > self.gap(from, skew)
    }
}

/// What a rule's grid does after an answer ([`ServiceClock::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing moves.
    Stay,
    /// A vote would move the grid to this offset (epochs), away from the
    /// service's clock: refused.
    Refuse(i64),
    /// The grid moves to this offset (epochs): to the service's clock, or
    /// where the vote says.
    Move { to: i64, by_service: bool },
}

impl ServiceClock {
    /// Where a grid at `offset` epochs of `epoch_ns` goes, given the
    /// member counters' vote (`vote`: a confirmed move; `pending`: a first
    /// answer waiting for its second sweep) and the service's clock: a
    /// first answer the service confirms needs no second; a grid off the
    /// service's clock goes to it (on bounds settled, whatever the vote
    /// says; at once when the vote also says it is off: a vote that read
    /// half of a skewed half would move it half way, then again); a vote
    /// that would take it away from the service's clock is refused. A
    /// `late` answer says nothing of the service's clock now.
    pub fn decide(
        &self,
        vote: Option<i64>,
        pending: Option<i64>,
        offset: i64,
        epoch_ns: i64,
        skew: i64,
        late: bool,
    ) -> Decision {
        let from = offset.saturating_mul(epoch_ns);
        let vote = vote.or_else(|| {
            pending.filter(|&m| {
                !late
                    && self.corroborates(
                        from,
                        offset.saturating_add(m).saturating_mul(epoch_ns),
                        skew,
                    )
            })
        });
        let service = if late {
            None
        } else if vote.is_some() {
            self.target(from, epoch_ns, skew)
        } else {
            self.toward(from, epoch_ns, skew)
        };
        if let Some(to) = service.filter(|&to| to != offset) {
            return Decision::Move {
                to,
                by_service: true,
            };
        }
        let Some(m) = vote else {
            return Decision::Stay;
        };
        let to = offset.saturating_add(m);
        if self.moves_away(from, to.saturating_mul(epoch_ns), skew) {
            Decision::Refuse(to)
        } else {
            Decision::Move {
                to,
                by_service: false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    /// An hour's start, ns.
    const H: u64 = 1_795_266_000 * NS_PER_S;

    /// Calls every 100 ms from `from` for `n` calls, answered after 2 ms,
    /// by a service `d` ns ahead of us.
    fn feed(c: &mut ServiceClock, from: u64, n: u64, d: i64) {
        for i in 0..n {
            let sent = from + i * 100 * MS + 37 * MS;
            let served = (sent + MS).saturating_add_signed(d);
            let secs = served / NS_PER_S;
            c.observe(sent, sent + 2 * MS, 3600 - secs % 3600);
        }
    }

    #[test]
    fn a_second_of_answers_knows_the_offset_to_about_100_ms() {
        for d in [
            0i64,
            900 * MS as i64,
            -900 * MS as i64,
            250 * MS as i64,
            -1_300 * MS as i64,
        ] {
            let mut c = ServiceClock::default();
            feed(&mut c, H + 20 * NS_PER_S, 12, d);
            let (lo, hi) = c.offset().unwrap();
            assert!(lo <= d && d < hi, "{d}: [{lo}, {hi})");
            assert!(hi - lo <= 110 * MS as i64, "{d}: [{lo}, {hi})");
        }
    }

    #[test]
    fn the_hour_boundary_and_a_clock_step_are_followed() {
        let mut c = ServiceClock::default();
        // Across the service's hour (3600 to go right after it).
        feed(&mut c, H - NS_PER_S, 20, 0);
        let (lo, hi) = c.offset().unwrap();
        assert!(lo <= 0 && 0 < hi, "[{lo}, {hi})");
        // Our clock steps 900 ms back: the service is now 900 ms ahead.
        feed(&mut c, H + 5 * NS_PER_S, 20, 900 * MS as i64);
        let (lo, hi) = c.offset().unwrap();
        assert!(
            lo <= 900 * MS as i64 && (900 * MS as i64) < hi,
            "[{lo}, {hi})"
        );
    }

    #[test]
    fn a_move_away_from_the_service_is_refused_one_toward_it_is_not() {
        let skew = 100 * MS as i64;
        // Our clock is the service's: following a fleet 900 ms behind
        // (offset +900 ms: ours ahead of the fleet) moves away.
        let mut right = ServiceClock::default();
        feed(&mut right, H + 20 * NS_PER_S, 6, 0);
        assert!(right.moves_away(0, 900 * MS as i64, skew));
        assert!(!right.moves_away(0, 0, skew));
        // Ours 900 ms behind the service's: following a fleet 900 ms ahead
        // (offset -900 ms) moves toward it, as does half of that; the other
        // way does not.
        let mut behind = ServiceClock::default();
        feed(&mut behind, H + 20 * NS_PER_S, 6, 900 * MS as i64);
        assert!(!behind.moves_away(0, -900 * MS as i64, skew));
        assert!(!behind.moves_away(0, -500 * MS as i64, skew));
        assert!(behind.moves_away(0, 300 * MS as i64, skew));
        // Nothing known: nothing refused.
        assert!(!ServiceClock::default().moves_away(0, 900 * MS as i64, skew));
    }

    #[test]
    fn a_two_two_split_moves_only_the_half_off_the_service() {
        let (skew, e) = (100 * MS as i64, 100 * MS as i64);
        // The right half's vote says "follow the others, 900 ms behind":
        // refused; late, the same (the refusal needs no fresh answer).
        let mut right = ServiceClock::default();
        feed(&mut right, H + 20 * NS_PER_S, 6, 0);
        assert_eq!(
            right.decide(Some(9), None, 0, e, skew, false),
            Decision::Refuse(9)
        );
        assert_eq!(
            right.decide(Some(9), None, 0, e, skew, true),
            Decision::Refuse(9)
        );
        // The skewed half's first answer "9 epochs behind", which the
        // service confirms: it moves at once, and only with the service's
        // word (late, or with nothing known, it waits for the second sweep).
        let mut behind = ServiceClock::default();
        feed(&mut behind, H + 20 * NS_PER_S, 6, 900 * MS as i64);
        assert!(matches!(
            behind.decide(None, Some(-9), 0, e, skew, false),
            Decision::Move { to: -9, .. }
        ));
        assert_eq!(
            behind.decide(None, Some(-9), 0, e, skew, true),
            Decision::Stay
        );
        assert_eq!(
            ServiceClock::default().decide(None, Some(-9), 0, e, skew, false),
            Decision::Stay
        );
    }

    #[test]
    fn a_grid_off_the_service_goes_to_it_once_the_offset_is_known() {
        let (skew, e) = (100 * MS as i64, 100 * MS as i64);
        // Ours 1,202 ms ahead of the service's.
        let mut c = ServiceClock::default();
        feed(&mut c, H + 20 * NS_PER_S, 2, -1_202 * MS as i64);
        assert_eq!(c.toward(0, e, skew), None, "known to a second only");
        feed(&mut c, H + 20 * NS_PER_S + 200 * MS, 18, -1_202 * MS as i64);
        let to = c.toward(0, e, skew).unwrap();
        assert!((11..=13).contains(&to), "{to}");
        // There (within max_clock_skew): no further move.
        assert_eq!(c.toward(to * e, e, skew), None);
        // Our clock the service's: none.
        let mut right = ServiceClock::default();
        feed(&mut right, H + 20 * NS_PER_S, 14, 0);
        assert_eq!(right.toward(0, e, skew), None);
    }
}
