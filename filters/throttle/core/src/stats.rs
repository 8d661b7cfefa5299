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
    SlotsAhead,
    SlotsGranted,
    SlotsUnused,
    EngineCalls,
    EngineFailures,
    FailuresTransport,
    FailuresTimeout,
    FailuresStatus,
    FailuresConfig,
    FailuresClock,
    FailuresLost,
    FailuresNonsense,
    FallbackMs,
    ClockOffsetMs,
    GridMismatch,
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
    spec(Stat::SlotsAhead, "slots_ahead", Kind::Counter,
        "Cluster scope: of the slots taken, requests that went at once ahead of their slot: on this proxy's next slot before its time, or on credit when it had none (repaid from its next grants). At most `burst + 1` are ahead at any instant."),
    spec(Stat::SlotsGranted, "slots_granted", Kind::Counter,
        "Cluster scope: slots of the shared grid the engine granted this proxy."),
    spec(Stat::SlotsUnused, "slots_unused", Kind::Gauge,
        "Cluster scope: slots granted to this proxy that passed unused (granted - taken - still usable)."),
    spec(Stat::EngineCalls, "engine_calls", Kind::Counter,
        "Cluster scope: calls to the rate limit service that carried the rule (at most 10 per second per proxy over time, 11 within any second)."),
    spec(Stat::EngineFailures, "engine_failures", Kind::Counter,
        "Cluster scope: of those, calls that failed (transport error, non-200, timeout, or an answer that makes no sense)."),
    spec(Stat::FailuresTransport, "failures_transport", Kind::Counter,
        "Cluster scope: failed calls with no answer (connection refused or reset, no healthy endpoint, no such cluster)."),
    spec(Stat::FailuresTimeout, "failures_timeout", Kind::Counter,
        "Cluster scope: failed calls not answered within `engine.timeout`."),
    spec(Stat::FailuresStatus, "failures_status", Kind::Counter,
        "Cluster scope: failed calls answered with an HTTP status other than 200 (400: the service cannot reach Redis)."),
    spec(Stat::FailuresConfig, "failures_config", Kind::Counter,
        "Cluster scope: failed calls whose answer is not for the throttle's counters (domain or descriptors not configured, a unit other than hour, a limit too small)."),
    spec(Stat::FailuresClock, "failures_clock", Kind::Counter,
        "Cluster scope: the service's clock is not this proxy's (its hour ends at another time), or this proxy's clock was found off the other proxies' and its grid moved to theirs."),
    spec(Stat::FailuresLost, "failures_lost", Kind::Counter,
        "Cluster scope: answers showing the engine lost its counters (Redis restarted empty); the slots granted ahead were dropped."),
    spec(Stat::FailuresNonsense, "failures_nonsense", Kind::Counter,
        "Cluster scope: failed calls whose answer made no sense otherwise."),
    spec(Stat::FallbackMs, "fallback_ms", Kind::Gauge,
        "Cluster scope: total milliseconds the rule has spent in its `on_engine_failure` fallback (rising while in fallback)."),
    spec(Stat::ClockOffsetMs, "clock_offset_ms", Kind::Gauge,
        "Cluster scope: how far this proxy's clock was found from the other proxies' of the rule (ms, whole epochs; 0: in step); its grid follows theirs."),
    spec(Stat::GridMismatch, "grid_mismatch", Kind::Counter,
        "Cluster scope: seconds in which more proxies carried a rule of this name than this rule's grid: another rate under the same name counts on its own grid, with its own full rate (a rollout of a new rate, or configurations that differ)."),
    spec(Stat::AdaptiveRate, "adaptive_rate", Kind::Gauge,
        "Adaptive: the rate paced at (in observe mode, the rate it would pace at), in requests per second x 1000; set by the learning VM every ~100 ms."),
    spec(Stat::AdaptiveShed, "adaptive_shed", Kind::Counter,
        "Adaptive: cuts of the learned rate because the upstream shed (429, 503) beyond the tolerance: sheds spread over the rule's paths and clients (a client's or an endpoint's own do not count)."),
    spec(Stat::AdaptiveFailed, "adaptive_failed", Kind::Counter,
        "Adaptive: cuts because of 5xx other than 503 and 504, or resets, beyond the tolerance, spread over the rule's paths and clients (a 504 counts as a queue)."),
    spec(Stat::AdaptiveQueue, "adaptive_queue", Kind::Counter,
        "Adaptive: cuts because requests in flight and their latency kept growing (the upstream fell behind), a queue stood, or the load's answers came beyond the route's timeout (504)."),
    spec(Stat::AdaptiveDrained, "adaptive_drained", Kind::Counter,
        "Adaptive: drains ended (the queue a cut found is gone): back to the capacity measured."),
    spec(Stat::AdaptiveProbe, "adaptive_probe", Kind::Counter,
        "Adaptive: probes above the rate."),
    spec(Stat::AdaptiveKept, "adaptive_kept", Kind::Counter,
        "Adaptive: probes the upstream delivered (their rate kept)."),
    spec(Stat::AdaptiveRetryAfter, "adaptive_retry_after", Kind::Counter,
        "Adaptive: cuts for sheds of the load whose `Retry-After` held probes back (at most 60 s)."),
];

/// Number of stats.
pub const COUNT: usize = 38;

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
        Stat::SlotsAhead,
        Stat::SlotsGranted,
        Stat::SlotsUnused,
        Stat::EngineCalls,
        Stat::EngineFailures,
        Stat::FailuresTransport,
        Stat::FailuresTimeout,
        Stat::FailuresStatus,
        Stat::FailuresConfig,
        Stat::FailuresClock,
        Stat::FailuresLost,
        Stat::FailuresNonsense,
        Stat::FallbackMs,
        Stat::ClockOffsetMs,
        Stat::GridMismatch,
        Stat::AdaptiveRate,
        Stat::AdaptiveShed,
        Stat::AdaptiveFailed,
        Stat::AdaptiveQueue,
        Stat::AdaptiveDrained,
        Stat::AdaptiveProbe,
        Stat::AdaptiveKept,
        Stat::AdaptiveRetryAfter,
    ];

    /// The counter of each failure kind, in the order of
    /// [`crate::cluster::Failure::KINDS`].
    pub const FAILURES: [Stat; 7] = [
        Stat::FailuresTransport,
        Stat::FailuresTimeout,
        Stat::FailuresStatus,
        Stat::FailuresConfig,
        Stat::FailuresClock,
        Stat::FailuresLost,
        Stat::FailuresNonsense,
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

/// One statistic of a rule's priority class, named
/// `throttle.rule.<rule>.class.<class>.<stat>` (Prometheus:
/// `throttle_class_<stat>{throttle_rule, throttle_class}`). Bounded: at most
/// [`MAX_CLASSES`] classes per rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClassStat {
    Admitted,
    Queued,
    Released,
    Rejected,
    Displaced,
    WaitMs,
}

/// A class stat's name, kind and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassSpec {
    pub stat: ClassStat,
    pub name: &'static str,
    pub kind: Kind,
    pub doc: &'static str,
}

/// Number of class stats.
pub const CLASS_COUNT: usize = 6;

/// Every class stat, in the order of [`ClassStat`] and of the README's table.
pub const CLASS_TABLE: [ClassSpec; CLASS_COUNT] = [
    ClassSpec { stat: ClassStat::Admitted, name: "admitted", kind: Kind::Counter,
        doc: "Requests of the class continued at once." },
    ClassSpec { stat: ClassStat::Queued, name: "queued", kind: Kind::Counter,
        doc: "Requests of the class held, waiting for a release." },
    ClassSpec { stat: ClassStat::Released, name: "released", kind: Kind::Counter,
        doc: "Held requests of the class resumed at their turn." },
    ClassSpec { stat: ClassStat::Rejected, name: "rejected", kind: Kind::Counter,
        doc: "Requests of the class rejected at once: estimated turn beyond the class's `max_queue_delay`, full worker queue, over the key's quota, or contention." },
    ClassSpec { stat: ClassStat::Displaced, name: "displaced", kind: Kind::Counter,
        doc: "Held requests of the class rejected later: pushed back by higher classes, their turn moved past the class's `max_queue_delay` (they also count in the rule's `rejected`)." },
    ClassSpec { stat: ClassStat::WaitMs, name: "wait_ms", kind: Kind::Histogram,
        doc: "Time released requests of the class were held, in milliseconds." },
];

impl ClassStat {
    /// Every class stat, in table order.
    pub const ALL: [ClassStat; CLASS_COUNT] = [
        ClassStat::Admitted,
        ClassStat::Queued,
        ClassStat::Released,
        ClassStat::Rejected,
        ClassStat::Displaced,
        ClassStat::WaitMs,
    ];

    /// The stat's entry in [`CLASS_TABLE`].
    pub fn spec(self) -> &'static ClassSpec {
        const FIRST: &ClassSpec = &CLASS_TABLE[0];
        CLASS_TABLE.iter().find(|s| s.stat == self).unwrap_or(FIRST)
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn kind(self) -> Kind {
        self.spec().kind
    }
}

/// Most priority classes of a rule (`config::spec::MAX_CLASSES` is this:
/// defined here, on the ground floor, since the counts are sized by it).
pub const MAX_CLASSES: usize = 8;

/// Most classes counted per rule.
const CLASSES: usize = MAX_CLASSES;

/// Changes to a rule's statistics (and its classes'), returned with every
/// decision so the glue can apply them (and tests can assert them exactly):
/// deltas of counters and gauges, and samples (a histogram's value, or a
/// gauge's new level).
#[derive(Debug, Clone)]
pub struct Counts {
    deltas: [i32; COUNT],
    /// By class, grown on first use: empty for rules without classes, so
    /// that a decision's counts stay small (they are moved and merged on
    /// every request).
    by_class: Vec<[i32; CLASS_COUNT]>,
    /// In the order recorded (empty on the fast path: no allocation).
    samples: Vec<(Stat, u64)>,
    /// Samples of the classes' histograms: (class, stat, value).
    class_samples: Vec<(usize, ClassStat, u64)>,
}

impl Counts {
    /// No change.
    pub const NONE: Counts = Counts {
        deltas: [0; COUNT],
        by_class: Vec::new(),
        samples: Vec::new(),
        class_samples: Vec::new(),
    };
}

// By hand: `Default` is derived for arrays of at most 32 elements.
impl Default for Counts {
    fn default() -> Counts {
        Counts::NONE
    }
}

impl Counts {
    /// Adds `delta` to class `class`'s `stat`.
    pub fn add_class(&mut self, class: usize, stat: ClassStat, delta: i32) {
        if delta == 0 || class >= CLASSES {
            return;
        }
        if self.by_class.len() <= class {
            self.by_class.resize(class + 1, [0; CLASS_COUNT]);
        }
        if let Some(d) = self
            .by_class
            .get_mut(class)
            .and_then(|c| c.get_mut(stat as usize))
        {
            *d = d.saturating_add(delta);
        }
    }

    /// Records a sample of class `class`'s histogram `stat`.
    pub fn record_class(&mut self, class: usize, stat: ClassStat, value: u64) {
        self.class_samples.push((class, stat, value));
    }

    /// The classes' samples recorded, in order.
    pub fn class_samples(&self) -> &[(usize, ClassStat, u64)] {
        &self.class_samples
    }

    /// The change of class `class`'s `stat`.
    pub fn get_class(&self, class: usize, stat: ClassStat) -> i32 {
        self.by_class
            .get(class)
            .and_then(|c| c.get(stat as usize))
            .copied()
            .unwrap_or(0)
    }

    /// The non-zero class changes: (class, stat, delta).
    pub fn iter_classes(&self) -> impl Iterator<Item = (usize, ClassStat, i32)> + '_ {
        self.by_class.iter().enumerate().flat_map(|(c, row)| {
            ClassStat::ALL
                .iter()
                .zip(row.iter())
                .filter(|(_, &d)| d != 0)
                .map(move |(&s, &d)| (c, s, d))
        })
    }

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
        for (c, s, d) in other.iter_classes() {
            self.add_class(c, s, d);
        }
        self.samples.extend_from_slice(&other.samples);
        self.class_samples.extend_from_slice(&other.class_samples);
    }

    /// Adds the deltas of `other` (counters, gauges, classes), not its samples.
    pub fn merge_deltas(&mut self, other: &Counts) {
        for (d, o) in self.deltas.iter_mut().zip(other.deltas.iter()) {
            *d = d.saturating_add(*o);
        }
        for (c, s, d) in other.iter_classes() {
            self.add_class(c, s, d);
        }
    }

    /// Whether any counter or gauge changes (samples aside).
    pub fn has_deltas(&self) -> bool {
        self.deltas.iter().any(|&d| d != 0) || self.by_class.iter().flatten().any(|&d| d != 0)
    }

    /// The change of `stat`.
    pub fn get(&self, stat: Stat) -> i32 {
        self.deltas.get(stat as usize).copied().unwrap_or(0)
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.deltas.iter().all(|&d| d == 0)
            && self.by_class.iter().flatten().all(|&d| d == 0)
            && self.samples.is_empty()
            && self.class_samples.is_empty()
    }

    /// The samples recorded, in order.
    pub fn samples(&self) -> &[(Stat, u64)] {
        &self.samples
    }

    /// The changes without the samples (what may wait to be handed over).
    pub fn deltas(&self) -> Counts {
        Counts {
            deltas: self.deltas,
            by_class: self.by_class.clone(),
            samples: Vec::new(),
            class_samples: Vec::new(),
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

/// Equal when every change is: a class row that is absent counts as zeros.
impl PartialEq for Counts {
    fn eq(&self, other: &Counts) -> bool {
        let rows = self.by_class.len().max(other.by_class.len());
        let row = |c: &Counts, i: usize| c.by_class.get(i).copied().unwrap_or([0; CLASS_COUNT]);
        self.deltas == other.deltas
            && (0..rows).all(|i| row(self, i) == row(other, i))
            && self.samples == other.samples
            && self.class_samples == other.class_samples
    }
}

impl Eq for Counts {}

/// The README's statistics table (Markdown): the rule's stats, then its
/// classes' (`class.<class>.<stat>`).
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
    for s in &CLASS_TABLE {
        out.push_str(&format!(
            "| `class.<class>.{}` | {} | {} |\n",
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
    fn deltas_merge_without_samples_and_class_rows_grow_on_use() {
        let mut a = Counts::of(&[(Stat::Requests, 1)]);
        assert!(a.has_deltas());
        assert!(!Counts::NONE.has_deltas());
        let mut b = Counts::of(&[(Stat::Requests, 2), (Stat::Admitted, 1)]);
        b.record(Stat::WaitMs, 7);
        b.add_class(3, ClassStat::Queued, 1);
        a.merge_deltas(&b);
        assert_eq!(a.get(Stat::Requests), 3);
        assert_eq!(a.get(Stat::Admitted), 1);
        assert_eq!(a.get_class(3, ClassStat::Queued), 1);
        assert!(a.samples().is_empty(), "samples go at once, never batched");
        // A class row that came back to zero equals no row.
        a.add_class(3, ClassStat::Queued, -1);
        assert_eq!(a, Counts::of(&[(Stat::Requests, 3), (Stat::Admitted, 1)]));
        let mut only_class = Counts::NONE;
        only_class.add_class(0, ClassStat::Admitted, 1);
        assert!(only_class.has_deltas());
    }

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
    fn the_class_table_is_in_enum_order_and_its_names_split_back() {
        for (i, s) in CLASS_TABLE.iter().enumerate() {
            assert_eq!(s.stat as usize, i, "{}", s.name);
            assert_eq!(ClassStat::ALL[i], s.stat);
            assert!(s.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
            // A flattened class stat ends in `_class_<class>_<stat>`: no
            // class stat may end in `_<another class stat>`.
            for o in &CLASS_TABLE {
                assert!(s.name == o.name || !s.name.ends_with(&format!("_{}", o.name)));
            }
            // ... nor may a rule stat end in `_<a class stat>` (it would read
            // as a class stat of a rule whose name ends in `_class`).
            for r in &TABLE {
                assert!(!r.name.ends_with(&format!("_{}", s.name)), "{}", r.name);
            }
        }
    }

    #[test]
    fn class_counts_add_up_apart_from_the_rule_s() {
        let mut c = Counts::NONE;
        c.add_class(2, ClassStat::Queued, 1);
        c.add_class(9, ClassStat::Queued, 1); // no such class: ignored
        assert!(!c.is_empty() && c.iter().next().is_none());
        let mut d = Counts::of(&[(Stat::Queued, 1)]);
        d.add_class(2, ClassStat::Queued, 2);
        d.add_class(0, ClassStat::Displaced, 1);
        c.merge(&d);
        assert_eq!(
            c.iter_classes().collect::<Vec<_>>(),
            vec![(0, ClassStat::Displaced, 1), (2, ClassStat::Queued, 3)]
        );
        assert_eq!(c.get_class(2, ClassStat::Queued), 3);
        assert_eq!(c.get(Stat::Queued), 1);
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
