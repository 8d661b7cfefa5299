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
//! What batching costs: Envoy's statistics lag the filter by at most
//! `FLUSH_MS` plus a tick, which no scrape (Prometheus: 15 s) sees; the
//! totals are exact.

use std::cell::{Cell, RefCell};

use throttle_core::stats::{self, ClassStat, Counts, Kind, Stat};
use throttle_core::Config;

use crate::host::Host;

/// The metrics of one plugin configuration in one VM.
pub struct Metrics {
    /// Metric ids by rule, then by [`Stat`] (None where the host refused
    /// the definition).
    ids: Vec<[Option<u32>; stats::COUNT]>,
    /// Per rule, per class, metric ids by [`ClassStat`].
    class_ids: Vec<Vec<[Option<u32>; stats::CLASS_COUNT]>>,
    /// Deltas by rule, not yet handed to the host.
    pending: RefCell<Vec<Counts>>,
    /// Whether anything was counted since the last flush.
    dirty: Cell<bool>,
}

impl Metrics {
    /// Defines every rule's metrics.
    pub fn new<H: Host>(host: H, config: &Config) -> Metrics {
        let ids = config
            .rules
            .iter()
            .map(|r| {
                Stat::ALL.map(|s| {
                    host.define_metric(s.kind(), &format!("throttle.rule.{}.{}", r.name, s.name()))
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
                            host.define_metric(s.kind(), &name)
                        })
                    })
                    .collect()
            })
            .collect();
        Metrics {
            ids,
            class_ids,
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
            if let Some(id) = self.class_id(rule, class, stat) {
                host.record_metric(id, value);
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
        if let Some(id) = self.id(rule, stat) {
            host.record_metric(id, value);
        }
    }

    /// A gauge's new level, now.
    pub fn set<H: Host>(&self, host: H, rule: usize, stat: Stat, value: u64) {
        if let Some(id) = self.id(rule, stat) {
            host.record_metric(id, value);
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
            if let Some(id) = self.id(rule, stat) {
                host.increment_metric(id, delta.into());
            }
        }
        for (class, stat, delta) in counts.iter_classes() {
            if let Some(id) = self.class_id(rule, class, stat) {
                host.increment_metric(id, delta.into());
            }
        }
    }

    /// A counter's process-wide value (all VMs' flushed counts).
    pub fn total<H: Host>(&self, host: H, rule: usize, stat: Stat) -> Option<u64> {
        host.metric(self.id(rule, stat)?)
    }
}
