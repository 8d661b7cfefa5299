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
//! * `r`: how many more requests could be released within the next `w`
//!   seconds without being held, as the schedule stands (never above `q`:
//!   `burst` lets more through at once, but the sustained quota is `q`).
//! * `t`: seconds (rounded up) until `r` is back to `q`, i.e. until the schedule
//!   is idle again.
//!
//! With `"legacy"` the same three numbers go in `x-ratelimit-limit`,
//! `x-ratelimit-remaining` and `x-ratelimit-reset` (no window: `30/m` and `1/2s`
//! cannot be told apart there, which is why the draft replaced them).

use crate::schedule::Schedule;
use crate::units::RateWindow;
use crate::NS_PER_S;

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

/// Requests that could still be released within the next `window` without
/// being held, for a schedule at `tat`, at `now`: at most the quota.
pub fn remaining(schedule: &Schedule, window: RateWindow, tat: u64, now: u64) -> u64 {
    let w = window.window_s.saturating_mul(NS_PER_S);
    // The k-th next request goes at max(now, tat - tau + (k-1)T); count those
    // strictly before now + w.
    let horizon = now.saturating_add(w).saturating_add(schedule.tau_ns);
    let r = if horizon > tat && schedule.interval_ns > 0 {
        (horizon - tat).div_ceil(schedule.interval_ns)
    } else {
        0
    };
    r.min(window.count)
}

/// Seconds (rounded up) until the full quota is available again (0: it is
/// now). `r` reaches `q` once the next request would go strictly within
/// `tat - tau - T` of the window's start, that is when the schedule is idle.
pub fn reset_s(schedule: &Schedule, window: RateWindow, tat: u64, now: u64) -> u64 {
    if remaining(schedule, window, tat, now) >= window.count {
        return 0;
    }
    let idle_at = tat
        .saturating_sub(schedule.tau_ns)
        .saturating_sub(schedule.interval_ns);
    idle_at.saturating_sub(now) / NS_PER_S + 1
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
    use crate::NS_PER_MS;

    const MS: u64 = NS_PER_MS;
    const S: u64 = NS_PER_S;

    fn w(count: u64, window_s: u64) -> RateWindow {
        RateWindow { count, window_s }
    }

    #[test]
    fn an_idle_rule_has_its_whole_quota_but_this_request() {
        // 500/s, burst 0: after one request at 10 s, 499 more fit in the next
        // second, and the 500th is back 2 ms later (rounded up: 1 s).
        let s = Schedule::new(2 * MS, 0, S);
        let q = w(500, 1);
        let now = 10 * S;
        let tat = now + 2 * MS;
        assert_eq!(remaining(&s, q, tat, now), 499);
        assert_eq!(reset_s(&s, q, tat, now), 1);
        assert_eq!(remaining(&s, q, tat, now + 2 * MS), 500);
        assert_eq!(reset_s(&s, q, tat, now + 2 * MS), 0);
    }

    #[test]
    fn remaining_never_exceeds_the_quota_whatever_the_burst() {
        // 1/s with burst 5: six at once, but the sustained quota is 1 per second.
        let s = Schedule::new(S, 5, 10 * S);
        let q = w(1, 1);
        let now = 100 * S;
        // After the first request five more would go at once: reported as 1.
        assert_eq!(remaining(&s, q, now + S, now), 1);
        assert_eq!(reset_s(&s, q, now + S, now), 0);
        // After the sixth, the seventh goes at now + 1 s: not within the next second.
        assert_eq!(remaining(&s, q, now + 6 * S, now), 0);
        assert_eq!(reset_s(&s, q, now + 6 * S, now), 1);
    }

    #[test]
    fn a_backlog_leaves_nothing_and_says_when_it_is_gone() {
        // 10/s, 2 s of backlog: nothing within the next second; the schedule
        // is idle 1.9 s from now (rounded up: 2).
        let s = Schedule::new(100 * MS, 0, 5 * S);
        let q = w(10, 1);
        let now = 50 * S;
        let tat = now + 2 * S;
        assert_eq!(remaining(&s, q, tat, now), 0);
        assert_eq!(reset_s(&s, q, tat, now), 2);
        // A held request's response leaving 0.5 s later: still none, 1.4 s to idle.
        assert_eq!(remaining(&s, q, tat, now + 500 * MS), 0);
        assert_eq!(reset_s(&s, q, tat, now + 500 * MS), 2);
        assert_eq!(remaining(&s, q, tat, now + 1500 * MS), 5);
        assert_eq!(reset_s(&s, q, tat, now + 1500 * MS), 1);
    }

    #[test]
    fn fractional_rates_keep_their_window() {
        // 0.5/s = 1 per 2 s.
        let s = Schedule::new(2 * S, 0, 0);
        let q = w(1, 2);
        let now = 7 * S;
        assert_eq!(remaining(&s, q, now + 2 * S, now), 0);
        assert_eq!(reset_s(&s, q, now + 2 * S, now), 1);
        assert_eq!(remaining(&s, q, now + 2 * S, now + S), 1);
        assert_eq!(
            headers(HeaderStyle::Ietf, "slow", q, 0, 1),
            vec![
                ("ratelimit-policy", "\"slow\";q=1;w=2".to_string()),
                ("ratelimit", "\"slow\";r=0;t=1".to_string())
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
