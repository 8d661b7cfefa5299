//! Rate-limit response headers: what a client can act on, computed from the
//! rule's GCRA schedule at the moment the response leaves.
//!
//! Following the IETF draft (draft-ietf-httpapi-ratelimit-headers-09/-10):
//!
//! ```text
//! RateLimit-Policy: "<rule>";q=<quota>;w=<window seconds>
//! RateLimit: "<rule>";r=<remaining>;t=<seconds until the full quota is back>
//! ```
//!
//! * `q`/`w`: the rate exactly, in the unit the user wrote (`30/m` → `q=30;w=60`,
//!   `0.5/s` → `q=1;w=2`).
//! * `r`: the quota left, as a token bucket sees it: `q` minus the requests
//!   the schedule is still paying for (its lead over now, in intervals,
//!   rounded up). An idle 500/s rule answers 499 after a request; a rule with
//!   a backlog answers 0. Never above `q` (`burst` lets more through at once,
//!   but the sustained quota is `q`).
//! * `t`: seconds (rounded up) until the whole quota is back, i.e. until the
//!   schedule is idle again.
//!
//! Both are computed when the response leaves, from the schedule as this
//! request left it (other requests since then are not re-read: that would
//! cost a shared-data read per response).
//!
//! With `"legacy"` the same three numbers go in `x-ratelimit-limit`,
//! `x-ratelimit-remaining` and `x-ratelimit-reset` (no window: `30/m` and `1/2s`
//! cannot be told apart there, which is why the draft replaced them).

use crate::clock::NS_PER_S;
use crate::schedule::Schedule;
use crate::units::RateWindow;

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// None.
    #[default]
    Off,
    /// `RateLimit-Policy` and `RateLimit` (IETF draft).
    Ietf,
    /// `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset`.
    Legacy,
}

/// Every header name this module may set (the glue replaces, never appends).
pub const HEADER_NAMES: [&str; 5] = [
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

/// The quota left at `now` for a schedule at `tat`: the quota minus the
/// intervals the schedule is ahead of now (rounded up), at least 0.
pub fn remaining(schedule: &Schedule, window: RateWindow, tat: u64, now: u64) -> u64 {
    let debt = tat
        .saturating_sub(now)
        .div_ceil(schedule.interval_ns.max(1));
    window.count.saturating_sub(debt)
}

/// Seconds (rounded up) until the whole quota is back: until the schedule is
/// idle (`tat <= now`).
pub fn reset_s(tat: u64, now: u64) -> u64 {
    tat.saturating_sub(now).div_ceil(NS_PER_S)
}

/// The headers of one response.
pub fn headers(
    style: HeaderStyle,
    rule: &str,
    window: RateWindow,
    remaining: u64,
    reset_s: u64,
) -> Vec<(&'static str, String)> {
    match style {
        HeaderStyle::Off => Vec::new(),
        HeaderStyle::Ietf => vec![
            (
                "ratelimit-policy",
                format!("\"{rule}\";q={};w={}", window.count, window.window_s),
            ),
            ("ratelimit", format!("\"{rule}\";r={remaining};t={reset_s}")),
        ],
        HeaderStyle::Legacy => vec![
            ("x-ratelimit-limit", window.count.to_string()),
            ("x-ratelimit-remaining", remaining.to_string()),
            ("x-ratelimit-reset", reset_s.to_string()),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NS_PER_MS;

    const MS: u64 = NS_PER_MS;
    const S: u64 = NS_PER_S;

    fn w(count: u64, window_s: u64) -> RateWindow {
        RateWindow { count, window_s }
    }

    #[test]
    fn an_idle_rule_has_its_whole_quota_but_this_request() {
        // 500/s, burst 0: after one request at 10 s, 499 are left; the last
        // interval is paid off 2 ms later (rounded up: 1 s).
        let s = Schedule::new(2 * MS, 0, S);
        let q = w(500, 1);
        let now = 10 * S;
        let tat = now + 2 * MS;
        assert_eq!(remaining(&s, q, tat, now), 499);
        assert_eq!(reset_s(tat, now), 1);
        assert_eq!(
            remaining(&s, q, tat, now + MS),
            499,
            "1 ms later: still one interval owed"
        );
        assert_eq!(remaining(&s, q, tat, now + 2 * MS), 500);
        assert_eq!(reset_s(tat, now + 2 * MS), 0);
    }

    #[test]
    fn remaining_never_exceeds_the_quota_whatever_the_burst() {
        // 1/s with burst 5: six at once, but the sustained quota is 1 per second.
        let s = Schedule::new(S, 5, 10 * S);
        let q = w(1, 1);
        let now = 100 * S;
        assert_eq!(remaining(&s, q, now + S, now), 0);
        assert_eq!(remaining(&s, q, now + 6 * S, now), 0);
        assert_eq!(reset_s(now + 6 * S, now), 6);
        assert_eq!(remaining(&s, q, now, now), 1, "idle: the whole quota");
    }

    #[test]
    fn a_backlog_leaves_nothing_and_says_when_it_is_gone() {
        // 10/s, 2 s of backlog: nothing left, idle in 2 s.
        let s = Schedule::new(100 * MS, 0, 5 * S);
        let q = w(10, 1);
        let now = 50 * S;
        let tat = now + 2 * S;
        assert_eq!(remaining(&s, q, tat, now), 0);
        assert_eq!(reset_s(tat, now), 2);
        // A held request's response leaving 1.5 s later: 5 intervals owed.
        assert_eq!(remaining(&s, q, tat, now + 1500 * MS), 5);
        assert_eq!(reset_s(tat, now + 1500 * MS), 1);
        assert_eq!(remaining(&s, q, tat, now + 1950 * MS), 9);
    }

    #[test]
    fn fractional_rates_keep_their_window() {
        // 0.5/s = 1 per 2 s: after one request none is left for 2 s.
        let s = Schedule::new(2 * S, 0, 0);
        let q = w(1, 2);
        let now = 7 * S;
        assert_eq!(remaining(&s, q, now + 2 * S, now + MS), 0);
        assert_eq!(reset_s(now + 2 * S, now + MS), 2);
        assert_eq!(remaining(&s, q, now + 2 * S, now + 2 * S), 1);
        assert_eq!(
            headers(HeaderStyle::Ietf, "slow", q, 0, 2),
            vec![
                ("ratelimit-policy", "\"slow\";q=1;w=2".to_string()),
                ("ratelimit", "\"slow\";r=0;t=2".to_string())
            ]
        );
    }

    #[test]
    fn legacy_names_carry_the_same_numbers() {
        assert_eq!(
            headers(HeaderStyle::Legacy, "r", w(30, 60), 29, 0),
            vec![
                ("x-ratelimit-limit", "30".to_string()),
                ("x-ratelimit-remaining", "29".to_string()),
                ("x-ratelimit-reset", "0".to_string())
            ]
        );
        assert!(headers(HeaderStyle::Off, "r", w(30, 60), 29, 0).is_empty());
    }
}
