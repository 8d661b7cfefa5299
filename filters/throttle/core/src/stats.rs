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

/// The part of a rule's plan that can move a stat. A rule defines a stat
/// (Envoy keeps every metric defined, per rule, per pod) only if it has the
/// stat's feature ([`Stat::applies`]), and a class stat only if it has
/// classes as well ([`ClassStat::applies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// Every rule.
    Core,
    /// Rules that hold and reject: every rule but dry-run ones.
    Enforce,
    /// `dry_run` rules.
    DryRun,
    /// Rules with `concurrency` (the gate).
    Concurrency,
    /// `scope: "cluster"` rules.
    Cluster,
    /// `adaptive` rules.
    Adaptive,
    /// Rules with `classes` (each class's stats).
    Classes,
}

impl Feature {
    /// Every feature, in the README's order.
    pub const ALL: [Feature; 7] = [
        Feature::Core,
        Feature::Enforce,
        Feature::DryRun,
        Feature::Concurrency,
        Feature::Cluster,
        Feature::Adaptive,
        Feature::Classes,
    ];

    /// The feature's name in the README.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Core => "core",
            Feature::Enforce => "enforce",
            Feature::DryRun => "dry_run",
            Feature::Concurrency => "concurrency",
            Feature::Cluster => "cluster",
            Feature::Adaptive => "adaptive",
            Feature::Classes => "classes",
        }
    }

    /// Which rules have it, for the README.
    pub fn rules(self) -> &'static str {
        match self {
            Feature::Core => "Every rule",
            Feature::Enforce => "Rules that hold and reject: every rule but `dry_run` ones",
            Feature::DryRun => "`dry_run` rules",
            Feature::Concurrency => "Rules with `concurrency`",
            Feature::Cluster => "`scope: \"cluster\"` rules",
            Feature::Adaptive => "`adaptive` rules",
            Feature::Classes => "Rules with `classes`, for each class",
        }
    }
}

/// What a rule has, as far as its statistics go ([`crate::config::Rule`]
/// answers from its configuration).
pub trait Features {
    /// Whether the rule has `feature`.
    fn has(&self, feature: Feature) -> bool;
}

/// A rule's features as a set of bits, for who keeps them per rule (the
/// glue, to tell a stat the rule does not define from one the host
/// refused).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeatureSet(u8);

impl FeatureSet {
    /// The features `rule` has.
    pub fn of(rule: &impl Features) -> FeatureSet {
        let bits = Feature::ALL
            .iter()
            .filter(|&&f| rule.has(f))
            .fold(0, |bits, &f| bits | 1 << f as u8);
        FeatureSet(bits)
    }
}

impl Features for FeatureSet {
    fn has(&self, feature: Feature) -> bool {
        self.0 & 1 << feature as u8 != 0
    }
}

/// A stat's name, kind, feature and meaning: one row of [`TABLE`] or
/// [`CLASS_TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec<S> {
    pub stat: S,
    pub name: &'static str,
    pub kind: Kind,
    pub feature: Feature,
    pub doc: &'static str,
}

/// A class stat's row of [`CLASS_TABLE`].
pub type ClassSpec = Spec<ClassStat>;

/// One declaration of a set of stats: each row `Variant: "name", Kind,
/// Feature, "doc";` gives the enum's variant, its [`Spec`] in the table and
/// its place in `ALL`, so that a new stat is one row (Envoy's
/// `ALL_*_STATS(COUNTER, GAUGE, HISTOGRAM)`).
macro_rules! stats {
    (
        $(#[$meta:meta])*
        enum $Stat:ident, table $TABLE:ident, count $COUNT:ident;
        $($Var:ident: $name:literal, $kind:ident, $feature:ident, $doc:literal;)+
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $Stat {
            $(#[doc = $doc] $Var,)+
        }

        #[doc = concat!("Number of [`", stringify!($Stat), "`]s.")]
        pub const $COUNT: usize = $Stat::ALL.len();

        #[doc = concat!("Every [`", stringify!($Stat), "`] with its name, kind, feature and meaning, in enum order.")]
        pub const $TABLE: [Spec<$Stat>; $COUNT] = [$(Spec {
            stat: $Stat::$Var,
            name: $name,
            kind: Kind::$kind,
            feature: Feature::$feature,
            doc: $doc,
        },)+];

        impl $Stat {
            /// Every one, in table order.
            pub const ALL: [$Stat; [$($Stat::$Var),+].len()] = [$($Stat::$Var),+];

            /// Its row of the table.
            pub fn spec(self) -> &'static Spec<$Stat> {
                const FIRST: &Spec<$Stat> = &$TABLE[0];
                $TABLE.get(self as usize).unwrap_or(FIRST)
            }

            /// Its name (`admitted`, `wait_ms`, ...).
            pub fn name(self) -> &'static str {
                self.spec().name
            }

            /// Counter, gauge or histogram.
            pub fn kind(self) -> Kind {
                self.spec().kind
            }

            /// The feature that can move it.
            pub fn feature(self) -> Feature {
                self.spec().feature
            }
        }
    };
}

stats! {
    /// One statistic of a rule.
    enum Stat, table TABLE, count COUNT;
    Requests: "requests", Counter, Core,
        "Requests the rule applied to, whatever became of them.";
    Admitted: "admitted", Counter, Core,
        "Requests continued at once (within rate or burst, and a concurrency slot free). Under dry-run: requests that would have been continued at once.";
    Queued: "queued", Counter, Enforce,
        "Requests held (by the rate schedule or waiting for a concurrency slot).";
    Released: "released", Counter, Enforce,
        "Held requests resumed at their turn.";
    Rejected: "rejected", Counter, Enforce,
        "Requests answered with `reject_status`: turn too far away, full worker queue, no concurrency slot within `max_queue_delay`, or contention.";
    Cancelled: "cancelled", Counter, Enforce,
        "Held requests whose client went away before their turn.";
    Gone: "gone", Counter, Enforce,
        "Held requests whose stream was already gone at their turn.";
    TimedOut: "timed_out", Counter, Enforce,
        "Held requests that Envoy answered itself before their turn (for example a 504 from `stream_idle_timeout` or a 408 from `request_timeout`): a timeout shorter than `max_queue_delay`.";
    Contention: "contention", Counter, Core,
        "Requests whose shared schedule or gate could not be updated (they are rejected; see failure policy).";
    WouldQueue: "would_queue", Counter, DryRun,
        "Dry-run: requests that would have been held.";
    WouldReject: "would_reject", Counter, DryRun,
        "Dry-run: requests that would have been rejected.";
    Held: "held", Gauge, Enforce,
        "Requests held now, summed over workers.";
    InFlight: "in_flight", Gauge, Concurrency,
        "Concurrency mode: requests holding a slot now.";
    WaitMs: "wait_ms", Histogram, Enforce,
        "Time released requests were held, in milliseconds.";
    SlotsTaken: "slots_taken", Counter, Cluster,
        "Cluster scope: slots of the shared grid this proxy's requests used.";
    SlotsAhead: "slots_ahead", Counter, Cluster,
        "Cluster scope: of the slots taken, requests that went at once ahead of their slot: on this proxy's next slot before its time, or on credit when it had none (repaid from its next grants). At most `burst + 1` are ahead at any instant.";
    SlotsForgiven: "slots_forgiven", Counter, Cluster,
        "Cluster scope: held requests that went at their `max_queue_delay` on no slot and no credit: a failed engine call cost this proxy the shares their turns were reckoned on (at most the share it claimed and the two it left uncomputed, within `max_queue_delay` after them), so they were not refused after the hold.";
    SlotsGranted: "slots_granted", Counter, Cluster,
        "Cluster scope: slots of the shared grid the engine granted this proxy.";
    SlotsUnused: "slots_unused", Gauge, Cluster,
        "Cluster scope: slots granted to this proxy that passed unused (granted - taken - still usable).";
    EngineCalls: "engine_calls", Counter, Cluster,
        "Cluster scope: calls to the rate limit service that carried the rule (at most 10 per second per proxy over time, 11 within any second).";
    EngineFailures: "engine_failures", Counter, Cluster,
        "Cluster scope: of those, calls that failed (transport error, non-200, timeout, or an answer that makes no sense).";
    FailuresTransport: "failures_transport", Counter, Cluster,
        "Cluster scope: failed calls with no answer (connection refused or reset, no healthy endpoint, no such cluster).";
    FailuresTimeout: "failures_timeout", Counter, Cluster,
        "Cluster scope: failed calls not answered within `engine.timeout`.";
    FailuresStatus: "failures_status", Counter, Cluster,
        "Cluster scope: failed calls answered with an HTTP status other than 200 (400: the service cannot reach Redis).";
    FailuresConfig: "failures_config", Counter, Cluster,
        "Cluster scope: failed calls whose answer is not for the throttle's counters (domain or descriptors not configured, a unit other than hour, a limit too small).";
    FailuresClock: "failures_clock", Counter, Cluster,
        "Cluster scope: the service's clock is not this proxy's (its hour ends at another time), or this proxy's clock was found off the other proxies' and its grid moved to theirs.";
    FailuresLost: "failures_lost", Counter, Cluster,
        "Cluster scope: answers showing the engine lost its counters (Redis restarted empty); the slots granted ahead were dropped.";
    FailuresNonsense: "failures_nonsense", Counter, Cluster,
        "Cluster scope: failed calls whose answer made no sense otherwise.";
    FallbackMs: "fallback_ms", Gauge, Cluster,
        "Cluster scope: total milliseconds the rule has spent in its `on_engine_failure` fallback (rising while in fallback).";
    ClockOffsetMs: "clock_offset_ms", Gauge, Cluster,
        "Cluster scope: how far this proxy's clock was found from the other proxies' of the rule (ms, whole epochs; 0: in step); its grid follows theirs.";
    GridMismatch: "grid_mismatch", Counter, Cluster,
        "Cluster scope: seconds in which more proxies carried a rule of this name than this rule's grid: another rate under the same name counts on its own grid, with its own full rate (a rollout of a new rate, or configurations that differ).";
    AdaptiveRate: "adaptive_rate", Gauge, Adaptive,
        "Adaptive: the rate paced at (in observe mode, the rate it would pace at), in requests per second x 1000; set by the learning VM every ~100 ms.";
    AdaptiveShed: "adaptive_shed", Counter, Adaptive,
        "Adaptive: cuts of the learned rate because the upstream shed (429, 503) beyond the tolerance: sheds spread over the rule's paths and clients (a client's or an endpoint's own do not count).";
    AdaptiveFailed: "adaptive_failed", Counter, Adaptive,
        "Adaptive: cuts because of 5xx other than 503 and 504, or resets, beyond the tolerance, spread over the rule's paths and clients (a 504 counts as a queue).";
    AdaptiveQueue: "adaptive_queue", Counter, Adaptive,
        "Adaptive: cuts because requests in flight and their latency kept growing (the upstream fell behind), a queue stood, or the load's answers came beyond the route's timeout (504).";
    AdaptiveDrained: "adaptive_drained", Counter, Adaptive,
        "Adaptive: drains ended (the queue a cut found is gone): back to the capacity measured.";
    AdaptiveProbe: "adaptive_probe", Counter, Adaptive,
        "Adaptive: probes above the rate.";
    AdaptiveKept: "adaptive_kept", Counter, Adaptive,
        "Adaptive: probes the upstream delivered (their rate kept).";
    AdaptiveRetryAfter: "adaptive_retry_after", Counter, Adaptive,
        "Adaptive: cuts for sheds of the load whose `Retry-After` held probes back (at most 60 s).";
}

impl Stat {
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

    /// Whether `rule` defines this stat: it has the stat's feature.
    pub fn applies(self, rule: &impl Features) -> bool {
        rule.has(self.feature())
    }
}

stats! {
    /// One statistic of a rule's priority class, named
    /// `throttle.rule.<rule>.class.<class>.<stat>` (Prometheus:
    /// `throttle_class_<stat>{throttle_rule, throttle_class}`). Bounded: at
    /// most [`MAX_CLASSES`] classes per rule. Its feature is the
    /// rule's besides `classes`.
    enum ClassStat, table CLASS_TABLE, count CLASS_COUNT;
    Admitted: "admitted", Counter, Core,
        "Requests of the class continued at once.";
    Queued: "queued", Counter, Core,
        "Requests of the class held, waiting for a release (under dry-run: that would have been held).";
    Released: "released", Counter, Core,
        "Held requests of the class resumed at their turn (under dry-run: the tickets of those that would have been held, granted).";
    Rejected: "rejected", Counter, Core,
        "Requests of the class rejected at once: estimated turn beyond the class's `max_queue_delay`, full worker queue, over the key's quota, or contention (under dry-run: that would have been rejected).";
    Displaced: "displaced", Counter, Core,
        "Held requests of the class rejected later: pushed back by higher classes, their turn moved past the class's `max_queue_delay` (they also count in the rule's `rejected`; under dry-run: tickets that would have been, counted `would_queue` at arrival).";
    WaitMs: "wait_ms", Histogram, Core,
        "Time released requests of the class were held, in milliseconds (under dry-run: the time they would have been held).";
}

impl ClassStat {
    /// Whether `rule` defines this stat for each of its classes: it has
    /// classes and the stat's feature.
    pub fn applies(self, rule: &impl Features) -> bool {
        rule.has(Feature::Classes) && rule.has(self.feature())
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

    /// A change `rule` defines no metric for (None: each has its metric),
    /// named as the rule's stat (`in_flight`) or a class's
    /// (`class.<index>.wait_ms`). Not None is a bug: the feature column of
    /// [`TABLE`] or [`CLASS_TABLE`] misses a path that counts the stat.
    pub fn stray(&self, rule: &impl Features) -> Option<String> {
        let rule_stats = self.iter().map(|(s, _)| s);
        let sampled = self.samples.iter().map(|&(s, _)| s);
        if let Some(s) = rule_stats.chain(sampled).find(|s| !s.applies(rule)) {
            return Some(s.name().to_string());
        }
        let classes = self.iter_classes().map(|(c, s, _)| (c, s));
        let sampled = self.class_samples.iter().map(|&(c, s, _)| (c, s));
        classes
            .chain(sampled)
            .find(|(_, s)| !s.applies(rule))
            .map(|(c, s)| format!("class.{c}.{}", s.name()))
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

/// The README's statistics tables (Markdown), one per feature: which rules
/// define which stats, each with its type and meaning; the classes' last
/// (`class.<class>.<stat>`).
pub fn reference_table() -> String {
    let count = |f: Feature| TABLE.iter().filter(|s| s.feature == f).count();
    let class_count = |f: Feature| CLASS_TABLE.iter().filter(|s| s.feature == f).count();
    let plain = count(Feature::Core) + count(Feature::Enforce);
    let dry = count(Feature::Core) + count(Feature::DryRun);
    let dry_classes = class_count(Feature::Core) + class_count(Feature::DryRun);
    let under_dry_run = if dry_classes == CLASS_COUNT {
        " (under `dry_run` too)".to_string()
    } else {
        format!(" ({dry_classes} under `dry_run`)")
    };
    let mut out = format!(
        "A rule defines only the stats of its features (Envoy keeps each metric defined, for every \
         rule on every pod): a process-scope rule with a rate and nothing else has {plain}, a \
         `dry_run` one {dry}; `concurrency` adds {}, `scope: \"cluster\"` {}, `adaptive` {}, and \
         `classes` {} for each class{under_dry_run}.\n",
        count(Feature::Concurrency),
        count(Feature::Cluster),
        count(Feature::Adaptive),
        CLASS_COUNT,
    );
    let header = "| name | type | description |\n|---|---|---|\n";
    for f in Feature::ALL {
        let rows: Vec<String> = if f == Feature::Classes {
            CLASS_TABLE
                .iter()
                .map(|s| {
                    let only = match s.feature {
                        Feature::Core => String::new(),
                        Feature::Enforce => " Not under `dry_run`.".into(),
                        other => format!(" Only with `{}`.", other.name()),
                    };
                    format!(
                        "| `class.<class>.{}` | {} | {}{only} |\n",
                        s.name,
                        s.kind.name(),
                        s.doc
                    )
                })
                .collect()
        } else {
            TABLE
                .iter()
                .filter(|s| s.feature == f)
                .map(|s| format!("| `{}` | {} | {} |\n", s.name, s.kind.name(), s.doc))
                .collect()
        };
        out.push_str(&format!(
            "\n### {} (`{}`)\n\n{header}{}",
            f.rules(),
            f.name(),
            rows.concat()
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
