//! The names of the filter's per-rule statistics (Envoy:
//! `wasmcustom.throttle.rule.<rule>.<stat>`).
//!
//! Through Istio, whose Prometheus endpoint has no tag extractor for custom
//! Wasm stats, a name is flattened to `throttle_rule_<rule>_<stat>` and split
//! back by a regex. That split is unambiguous, whatever the rule's name,
//! because no stat name ends in `_<another stat name>` (tested below).

pub const ADMITTED: &str = "admitted";
pub const QUEUED: &str = "queued";
pub const RELEASED: &str = "released";
pub const REJECTED: &str = "rejected";
pub const CANCELLED: &str = "cancelled";
pub const GONE: &str = "gone";
pub const CONTENTION: &str = "contention";
pub const WOULD_QUEUE: &str = "would_queue";
pub const WOULD_REJECT: &str = "would_reject";
pub const HELD: &str = "held";
pub const IN_FLIGHT: &str = "in_flight";
pub const WAIT_MS: &str = "wait_ms";

/// Every stat, in the order of the README's statistics table.
pub const ALL: &[&str] = &[
    ADMITTED,
    QUEUED,
    RELEASED,
    REJECTED,
    CANCELLED,
    GONE,
    CONTENTION,
    WOULD_QUEUE,
    WOULD_REJECT,
    HELD,
    IN_FLIGHT,
    WAIT_MS,
];

#[cfg(test)]
mod tests {
    use super::ALL;

    #[test]
    fn no_stat_name_ends_in_another_after_an_underscore() {
        for a in ALL {
            for b in ALL {
                assert!(a == b || !a.ends_with(&format!("_{b}")), "{a} ends in _{b}");
            }
        }
    }

    #[test]
    fn names_are_prometheus_safe() {
        for s in ALL {
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
        }
    }
}
