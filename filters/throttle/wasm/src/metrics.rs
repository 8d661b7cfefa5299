//! The one route by which a statistic reaches Envoy. [`Metrics`] owns the
//! metric ids of a configuration's rules (`throttle.rule.<rule>.<stat>`,
//! defined from the core's table, and per priority class
//! `throttle.rule.<rule>.class.<class>.<stat>`) and takes every change the core returns
//! as data ([`Metrics::count`]): counter and gauge deltas wait in a buffer
//! and are handed over at the worker's next tick ([`Metrics::flush`]: every
//! ~4 ms while requests are held, else every `FLUSH_MS` (`worker.rs`)
//! while there is traffic), so a request within the rate makes no metric
//! host call; samples (a released request's wait, a gauge's new level) go
//! at once ([`Metrics::record`], [`Metrics::set`]).
//!
//! A rule defines only the stats of its features ([`Stat::applies`]):
//! Envoy keeps every metric defined, for each rule on each pod. A change to
//! a stat the rule does not define would be a bug of the core's table; it
//! is not lost silently: the first of each is logged (warn).
//!
//! What batching costs: Envoy's statistics lag the filter by at most
//! `FLUSH_MS` plus a tick, which no scrape (Prometheus: 15 s) sees; the
//! totals are exact.

use std::cell::{Cell, RefCell};

use throttle_core::stats::{self, ClassStat, Counts, FeatureSet, Kind, Stat};
use throttle_core::Config;

use crate::host::{Host, Level};

/// The metrics of one plugin configuration in one VM.
pub struct Metrics {
    /// Metric ids by rule, then by [`Stat`] (None where the rule does not
    /// define the stat, or the host refused the definition).
    ids: Vec<[Option<u32>; stats::COUNT]>,
    /// Per rule, per class, metric ids by [`ClassStat`].
    class_ids: Vec<Vec<[Option<u32>; stats::CLASS_COUNT]>>,
    /// Per rule, its name and features (which stats it defines).
    rules: Vec<(String, FeatureSet)>,
    /// Changes to stats a rule does not define, by rule (each logged once).
    strays: RefCell<Vec<(usize, String)>>,
    /// Deltas by rule, not yet handed to the host.
    pending: RefCell<Vec<Counts>>,
    /// Whether anything was counted since the last flush.
    dirty: Cell<bool>,
}

impl Metrics {
    /// Defines every rule's metrics: the stats of its features.
    pub fn new<H: Host>(host: H, config: &Config) -> Metrics {
        let ids = config
            .rules
            .iter()
            .map(|r| {
                Stat::ALL.map(|s| {
                    let name = format!("throttle.rule.{}.{}", r.name, s.name());
                    s.applies(r)
                        .then(|| host.define_metric(s.kind(), &name))
                        .flatten()
                })
            })
            .collect();
        let class_ids = config
            .rules
            .iter()
            .map(|r| {
                r.classes
                    .iter()
                    .map(|c| {
                        ClassStat::ALL.map(|s| {
                            let name =
                                format!("throttle.rule.{}.class.{}.{}", r.name, c.name, s.name());
                            s.applies(r)
                                .then(|| host.define_metric(s.kind(), &name))
                                .flatten()
                        })
                    })
                    .collect()
            })
            .collect();
        Metrics {
            ids,
            class_ids,
            rules: config
                .rules
                .iter()
                .map(|r| (r.name.clone(), FeatureSet::of(r)))
                .collect(),
            strays: RefCell::default(),
            pending: RefCell::default(),
            dirty: Cell::new(false),
        }
    }

    /// The id of rule `rule`'s metric `stat`.
    pub fn id(&self, rule: usize, stat: Stat) -> Option<u32> {
        self.ids.get(rule)?.get(stat as usize).copied().flatten()
    }

    /// The id of class `class`'s metric `stat` in rule `rule`.
    pub fn class_id(&self, rule: usize, class: usize, stat: ClassStat) -> Option<u32> {
        self.class_ids
            .get(rule)?
            .get(class)?
            .get(stat as usize)
            .copied()
            .flatten()
    }

    /// Counts rule `rule`'s changes: deltas wait for the next flush, samples
    /// go now. True if deltas wait (the worker must tick to flush them).
    pub fn count<H: Host>(&self, host: H, rule: usize, counts: &Counts) -> bool {
        for &(stat, value) in counts.samples() {
            match stat.kind() {
                Kind::Gauge => self.set(host, rule, stat, value),
                Kind::Counter | Kind::Histogram => self.record(host, rule, stat, value),
            }
        }
        for &(class, stat, value) in counts.class_samples() {
            match self.class_id(rule, class, stat) {
                Some(id) => host.record_metric(id, value),
                None => self.missing_class(host, rule, class, stat),
            }
        }
        if !counts.has_deltas() {
            return false;
        }
        let Ok(mut pending) = self.pending.try_borrow_mut() else {
            // Cannot happen (no borrow outlives this call): hand them over now.
            self.apply(host, rule, counts);
            return false;
        };
        if pending.len() <= rule {
            pending.resize(rule + 1, Counts::NONE);
        }
        if let Some(p) = pending.get_mut(rule) {
            p.merge_deltas(counts);
        }
        self.dirty.set(true);
        true
    }

    /// A histogram's sample, now.
    pub fn record<H: Host>(&self, host: H, rule: usize, stat: Stat, value: u64) {
        match self.id(rule, stat) {
            Some(id) => host.record_metric(id, value),
            None => self.missing(host, rule, stat),
        }
    }

    /// A gauge's new level, now.
    pub fn set<H: Host>(&self, host: H, rule: usize, stat: Stat, value: u64) {
        match self.id(rule, stat) {
            Some(id) => host.record_metric(id, value),
            None => self.missing(host, rule, stat),
        }
    }

    /// Hands every pending delta to the host. Returns whether anything was
    /// counted since the last flush.
    pub fn flush<H: Host>(&self, host: H) -> bool {
        if !self.dirty.get() {
            return false;
        }
        let Ok(mut pending) = self.pending.try_borrow_mut() else {
            return true;
        };
        for (rule, counts) in pending.iter_mut().enumerate() {
            self.apply(host, rule, counts);
            *counts = Counts::NONE;
        }
        self.dirty.set(false);
        true
    }

    fn apply<H: Host>(&self, host: H, rule: usize, counts: &Counts) {
        for (stat, delta) in counts.iter() {
            match self.id(rule, stat) {
                Some(id) => host.increment_metric(id, delta.into()),
                None => self.missing(host, rule, stat),
            }
        }
        for (class, stat, delta) in counts.iter_classes() {
            match self.class_id(rule, class, stat) {
                Some(id) => host.increment_metric(id, delta.into()),
                None => self.missing_class(host, rule, class, stat),
            }
        }
    }

    /// Rule `rule` has no metric for `stat`: the host refused it (nothing
    /// to do), or the rule does not define it (a stray).
    fn missing<H: Host>(&self, host: H, rule: usize, stat: Stat) {
        if !self.rules.get(rule).is_some_and(|(_, f)| stat.applies(f)) {
            self.stray(host, rule, stat.name().to_string());
        }
    }

    fn missing_class<H: Host>(&self, host: H, rule: usize, class: usize, stat: ClassStat) {
        let defined = self
            .class_ids
            .get(rule)
            .is_some_and(|classes| class < classes.len())
            && self.rules.get(rule).is_some_and(|(_, f)| stat.applies(f));
        if !defined {
            self.stray(host, rule, format!("class.{class}.{}", stat.name()));
        }
    }

    /// A change to a stat rule `rule` does not define: logged the first
    /// time (a bug of the core's feature column; the change is dropped).
    fn stray<H: Host>(&self, host: H, rule: usize, name: String) {
        let Ok(mut strays) = self.strays.try_borrow_mut() else {
            return;
        };
        if strays.iter().any(|(r, n)| *r == rule && *n == name) {
            return;
        }
        let rule_name = self.rules.get(rule).map_or("?", |(n, _)| n.as_str());
        host.log(
            Level::Warn,
            &format!(
                "throttle: rule '{rule_name}' counted `{name}`, a statistic it does not define \
                 (a bug: the change is dropped)"
            ),
        );
        strays.push((rule, name));
    }

    /// A counter's process-wide value (all VMs' flushed counts).
    pub fn total<H: Host>(&self, host: H, rule: usize, stat: Stat) -> Option<u64> {
        host.metric(self.id(rule, stat)?)
    }
}
