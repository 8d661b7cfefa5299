//! The filter's per-rule statistics: one table that gives each stat its name,
//! type and meaning. The glue defines its metrics from it, the README's
//! statistics table is generated from it (`throttle-config stats`), and the
//! Prometheus relabelling and dashboards are tested against it.
//!
//! Envoy names a stat `wasmcustom.throttle.rule.<rule>.<stat>`. Through Istio,
//! whose Prometheus endpoint has no tag extractor for custom Wasm stats, a name
//! is flattened to `throttle_rule_<rule>_<stat>` and split back by a regex.
//! That split is unambiguous, whatever the rule's name, because no stat name
//! ends in `_<another stat name>` (tested below).

/// What kind of metric a stat is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The name used in the README and by Envoy.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "Counter",
            Kind::Gauge => "Gauge",
            Kind::Histogram => "Histogram",
        }
    }
}

/// One statistic of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stat {
    Requests,
    Admitted,
    Queued,
    Released,
    Rejected,
    Cancelled,
    Gone,
    TimedOut,
    Contention,
    WouldQueue,
    WouldReject,
    Held,
    InFlight,
    WaitMs,
    SlotsTaken,
    SlotsGranted,
    SlotsUnused,
    EngineCalls,
    EngineFailures,
    FallbackMs,
    AdaptiveRate,
    AdaptiveShed,
    AdaptiveFailed,
    AdaptiveQueue,
    AdaptiveDrained,
    AdaptiveProbe,
    AdaptiveKept,
    AdaptiveRetryAfter,
}

/// A stat's name, kind and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub stat: Stat,
    pub name: &'static str,
    pub kind: Kind,
    pub doc: &'static str,
}

const fn spec(stat: Stat, name: &'static str, kind: Kind, doc: &'static str) -> Spec {
    Spec {
        stat,
        name,
        kind,
        doc,
    }
}

/// Every stat, in the order of [`Stat`] (tested) and of the README's table.
pub const TABLE: [Spec; COUNT] = [
    spec(Stat::Requests, "requests", Kind::Counter,
        "Requests the rule applied to, whatever became of them."),
    spec(Stat::Admitted, "admitted", Kind::Counter,
        "Requests continued at once (within rate or burst, and a concurrency slot free). Under dry-run: requests that would have been continued at once."),
    spec(Stat::Queued, "queued", Kind::Counter,
        "Requests held (by the rate schedule or waiting for a concurrency slot)."),
    spec(Stat::Released, "released", Kind::Counter,
        "Held requests resumed at their turn."),
    spec(Stat::Rejected, "rejected", Kind::Counter,
        "Requests answered with `reject_status`: turn too far away, full worker queue, no concurrency slot within `max_queue_delay`, or contention."),
    spec(Stat::Cancelled, "cancelled", Kind::Counter,
        "Held requests whose client went away before their turn."),
    spec(Stat::Gone, "gone", Kind::Counter,
        "Held requests whose stream was already gone at their turn."),
    spec(Stat::TimedOut, "timed_out", Kind::Counter,
        "Held requests that Envoy answered itself before their turn (for example a 504 from `stream_idle_timeout` or a 408 from `request_timeout`): a timeout shorter than `max_queue_delay`."),
    spec(Stat::Contention, "contention", Kind::Counter,
        "Requests whose shared schedule or gate could not be updated (they are rejected; see failure policy)."),
    spec(Stat::WouldQueue, "would_queue", Kind::Counter,
        "Dry-run: requests that would have been held."),
    spec(Stat::WouldReject, "would_reject", Kind::Counter,
        "Dry-run: requests that would have been rejected."),
    spec(Stat::Held, "held", Kind::Gauge,
        "Requests held now, summed over workers."),
    spec(Stat::InFlight, "in_flight", Kind::Gauge,
        "Concurrency mode: requests holding a slot now."),
    spec(Stat::WaitMs, "wait_ms", Kind::Histogram,
        "Time released requests were held, in milliseconds."),
    spec(Stat::SlotsTaken, "slots_taken", Kind::Counter,
        "Cluster scope: slots of the shared grid this proxy's requests used."),
    spec(Stat::SlotsGranted, "slots_granted", Kind::Counter,
        "Cluster scope: slots of the shared grid the engine granted this proxy."),
    spec(Stat::SlotsUnused, "slots_unused", Kind::Gauge,
        "Cluster scope: slots granted to this proxy that passed unused (granted - taken - still usable)."),
    spec(Stat::EngineCalls, "engine_calls", Kind::Counter,
        "Cluster scope: calls to the rate limit service that carried the rule (at most 10 per second per proxy over time, 11 within any second)."),
    spec(Stat::EngineFailures, "engine_failures", Kind::Counter,
        "Cluster scope: of those, calls that failed (transport error, non-200, timeout, or an answer that makes no sense)."),
    spec(Stat::FallbackMs, "fallback_ms", Kind::Gauge,
        "Cluster scope: total milliseconds the rule has spent in its `on_engine_failure` fallback (rising while in fallback)."),
    spec(Stat::AdaptiveRate, "adaptive_rate", Kind::Gauge,
        "Adaptive: the rate paced at (in observe mode, the rate it would pace at), in requests per second x 1000; set by the learning VM every ~100 ms."),
    spec(Stat::AdaptiveShed, "adaptive_shed", Kind::Counter,
        "Adaptive: cuts of the learned rate because the upstream shed (429, 503) beyond the tolerance."),
    spec(Stat::AdaptiveFailed, "adaptive_failed", Kind::Counter,
        "Adaptive: cuts because of 5xx other than 503 and 504, or resets, beyond the tolerance (a 504 counts as latency)."),
    spec(Stat::AdaptiveQueue, "adaptive_queue", Kind::Counter,
        "Adaptive: cuts because requests in flight and their latency kept growing (the upstream fell behind)."),
    spec(Stat::AdaptiveDrained, "adaptive_drained", Kind::Counter,
        "Adaptive: drains ended (the queue a cut found is gone): back to the capacity measured."),
    spec(Stat::AdaptiveProbe, "adaptive_probe", Kind::Counter,
        "Adaptive: probes above the rate."),
    spec(Stat::AdaptiveKept, "adaptive_kept", Kind::Counter,
        "Adaptive: probes the upstream delivered (their rate kept)."),
    spec(Stat::AdaptiveRetryAfter, "adaptive_retry_after", Kind::Counter,
        "Adaptive: rounds in which the upstream's `Retry-After` held probes back."),
];

/// Number of stats.
pub const COUNT: usize = 28;

impl Stat {
    /// Every stat, in table order.
    pub const ALL: [Stat; COUNT] = [
        Stat::Requests,
        Stat::Admitted,
        Stat::Queued,
        Stat::Released,
        Stat::Rejected,
        Stat::Cancelled,
        Stat::Gone,
        Stat::TimedOut,
        Stat::Contention,
        Stat::WouldQueue,
        Stat::WouldReject,
        Stat::Held,
        Stat::InFlight,
        Stat::WaitMs,
        Stat::SlotsTaken,
        Stat::SlotsGranted,
        Stat::SlotsUnused,
        Stat::EngineCalls,
        Stat::EngineFailures,
        Stat::FallbackMs,
        Stat::AdaptiveRate,
        Stat::AdaptiveShed,
        Stat::AdaptiveFailed,
        Stat::AdaptiveQueue,
        Stat::AdaptiveDrained,
        Stat::AdaptiveProbe,
        Stat::AdaptiveKept,
        Stat::AdaptiveRetryAfter,
    ];

    /// The stat's entry in [`TABLE`].
    pub fn spec(self) -> &'static Spec {
        const FIRST: &Spec = &TABLE[0];
        TABLE.iter().find(|s| s.stat == self).unwrap_or(FIRST)
    }

    /// The stat's name (`admitted`, `wait_ms`, ...).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Counter, gauge or histogram.
    pub fn kind(self) -> Kind {
        self.spec().kind
    }
}

/// Changes to a rule's statistics, returned with every decision so the glue
/// can apply them (and tests can assert them exactly): deltas of counters
/// and gauges, and samples (a histogram's value, or a gauge's new level).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    deltas: [i32; COUNT],
    /// In the order recorded (empty on the fast path: no allocation).
    samples: Vec<(Stat, u64)>,
}

impl Counts {
    /// No change.
    pub const NONE: Counts = Counts {
        deltas: [0; COUNT],
        samples: Vec::new(),
    };

    /// These changes.
    pub fn of(changes: &[(Stat, i32)]) -> Self {
        let mut c = Counts::NONE;
        for &(s, d) in changes {
            c.add(s, d);
        }
        c
    }

    /// Adds `delta` to `stat`.
    pub fn add(&mut self, stat: Stat, delta: i32) {
        if let Some(d) = self.deltas.get_mut(stat as usize) {
            *d = d.saturating_add(delta);
        }
    }

    /// Adds 1 to `stat`.
    pub fn inc(&mut self, stat: Stat) {
        self.add(stat, 1);
    }

    /// Records `value`: a sample of a histogram, or the level a gauge is
    /// set to (the glue hands samples to the host at once, in order).
    pub fn record(&mut self, stat: Stat, value: u64) {
        self.samples.push((stat, value));
    }

    /// Adds every change of `other` (its samples after ours).
    pub fn merge(&mut self, other: &Counts) {
        for (s, d) in other.iter() {
            self.add(s, d);
        }
        self.samples.extend_from_slice(&other.samples);
    }

    /// The change of `stat`.
    pub fn get(&self, stat: Stat) -> i32 {
        self.deltas.get(stat as usize).copied().unwrap_or(0)
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.deltas.iter().all(|&d| d == 0) && self.samples.is_empty()
    }

    /// The samples recorded, in order.
    pub fn samples(&self) -> &[(Stat, u64)] {
        &self.samples
    }

    /// The changes without the samples (what may wait to be handed over).
    pub fn deltas(&self) -> Counts {
        Counts {
            deltas: self.deltas,
            samples: Vec::new(),
        }
    }

    /// The non-zero deltas, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (Stat, i32)> + '_ {
        Stat::ALL
            .iter()
            .zip(self.deltas.iter())
            .filter(|(_, &d)| d != 0)
            .map(|(&s, &d)| (s, d))
    }
}

/// The README's statistics table (Markdown).
pub fn reference_table() -> String {
    let mut out = String::from("| name | type | description |\n|---|---|---|\n");
    for s in &TABLE {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            s.name,
            s.kind.name(),
            s.doc
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_enum_order() {
        for (i, s) in TABLE.iter().enumerate() {
            assert_eq!(s.stat as usize, i, "{}", s.name);
            assert_eq!(Stat::ALL[i], s.stat);
        }
    }

    #[test]
    fn no_stat_name_ends_in_another_after_an_underscore() {
        for a in &TABLE {
            for b in &TABLE {
                assert!(
                    a.name == b.name || !a.name.ends_with(&format!("_{}", b.name)),
                    "{} ends in _{}",
                    a.name,
                    b.name
                );
            }
        }
    }

    #[test]
    fn names_are_prometheus_safe_and_unique() {
        for s in &TABLE {
            assert!(
                s.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}",
                s.name
            );
            assert_eq!(TABLE.iter().filter(|t| t.name == s.name).count(), 1);
        }
    }

    #[test]
    fn counts_add_up_and_list_only_changes() {
        let mut c = Counts::of(&[(Stat::Queued, 1), (Stat::Held, 1)]);
        c.merge(&Counts::of(&[(Stat::Held, -1), (Stat::Released, 1)]));
        assert_eq!(
            c.iter().collect::<Vec<_>>(),
            vec![(Stat::Queued, 1), (Stat::Released, 1)]
        );
        assert_eq!(c.get(Stat::Held), 0);
        assert!(!c.is_empty());
        assert!(Counts::NONE.is_empty());
        let mut w = Counts::NONE;
        w.record(Stat::WaitMs, 104);
        assert!(!w.is_empty() && w.iter().next().is_none());
        c.merge(&w);
        c.record(Stat::FallbackMs, 7);
        assert_eq!(c.samples(), &[(Stat::WaitMs, 104), (Stat::FallbackMs, 7)]);
        assert!(c.deltas().samples().is_empty());
        assert_eq!(c.deltas().iter().count(), 2);
    }
}
