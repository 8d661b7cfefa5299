//! What the root context hands to every HTTP context: the validated
//! configuration, its key hasher, and each rule's metric ids.

use throttle_core::keys::KeyHasher;
use throttle_core::stats::{self, ClassStat, Counts, Stat};
use throttle_core::{Config, NS_PER_MS};

use crate::host::Host;
use crate::shared::SharedStore;

/// A validated configuration with its per-rule runtime handles.
pub struct Plugin {
    pub config: Config,
    pub hasher: KeyHasher,
    pub rules: Vec<RuleRuntime>,
    /// A hash of the configuration's bytes: names its caller lease.
    pub config_hash: u64,
}

/// A rule's metric ids.
pub struct RuleRuntime {
    /// Metric ids by [`Stat`] (None where the host refused the definition).
    pub metrics: [Option<u32>; stats::COUNT],
    /// Per class of the rule, metric ids by [`ClassStat`].
    pub classes: Vec<[Option<u32>; stats::CLASS_COUNT]>,
}

impl Plugin {
    /// Defines the rules' metrics (`throttle.rule.<rule>.<stat>`, and
    /// `throttle.rule.<rule>.class.<class>.<stat>` per class).
    pub fn new<H: Host>(host: H, config: Config, seed: (u64, u64), config_hash: u64) -> Self {
        let rules = config
            .rules
            .iter()
            .map(|r| RuleRuntime {
                metrics: Stat::ALL.map(|s| {
                    host.define_metric(s.kind(), &format!("throttle.rule.{}.{}", r.name, s.name()))
                }),
                classes: r
                    .classes
                    .iter()
                    .map(|c| {
                        ClassStat::ALL.map(|s| {
                            let name =
                                format!("throttle.rule.{}.class.{}.{}", r.name, c.name, s.name());
                            host.define_metric(s.kind(), &name)
                        })
                    })
                    .collect(),
            })
            .collect();
        Plugin {
            config,
            hasher: KeyHasher::new(seed),
            rules,
            config_hash,
        }
    }

    /// The configuration's cells in the host's shared data.
    pub fn store<H: Host>(&self, host: H) -> SharedStore<'_, H> {
        SharedStore {
            host,
            config: &self.config,
            config_hash: self.config_hash,
        }
    }

    /// Moves rule `rule`'s counters and gauges.
    pub fn apply<H: Host>(&self, host: H, rule: usize, counts: &Counts) {
        let Some(rt) = self.rules.get(rule) else {
            return;
        };
        for (stat, delta) in counts.iter() {
            if let Some(Some(id)) = rt.metrics.get(stat as usize) {
                host.increment_metric(*id, delta.into());
            }
        }
        for (class, stat, delta) in counts.iter_classes() {
            if let Some(Some(id)) = rt.classes.get(class).and_then(|c| c.get(stat as usize)) {
                host.increment_metric(*id, delta.into());
            }
        }
    }

    /// The id of rule `rule`'s metric `stat`.
    pub fn metric(&self, rule: usize, stat: Stat) -> Option<u32> {
        self.rules
            .get(rule)?
            .metrics
            .get(stat as usize)
            .copied()
            .flatten()
    }

    /// Records a released request's wait (in its class's histogram too).
    pub fn record_wait<H: Host>(&self, host: H, rule: usize, class: Option<usize>, waited_ns: u64) {
        if let Some(Some(id)) = class.and_then(|c| {
            self.rules
                .get(rule)?
                .classes
                .get(c)?
                .get(ClassStat::WaitMs as usize)
                .copied()
        }) {
            host.record_metric(id, waited_ns / NS_PER_MS);
        }
        if let Some(Some(id)) = self
            .rules
            .get(rule)
            .and_then(|rt| rt.metrics.get(Stat::WaitMs as usize))
        {
            host.record_metric(*id, waited_ns / NS_PER_MS);
        }
    }
}
