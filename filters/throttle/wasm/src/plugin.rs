//! What the root context hands to every HTTP context: the validated
//! configuration with each rule's shared-data keys and metric ids.

use throttle_core::cluster::Grants;
use throttle_core::keys::KeyHasher;
use throttle_core::stats::{self, Counts, Stat};
use throttle_core::{Config, NS_PER_MS};

use crate::host::Host;
use crate::shared::{ensure_blob, ensure_cell};

/// A validated configuration with its per-rule runtime handles.
pub struct Plugin {
    pub config: Config,
    pub hasher: KeyHasher,
    pub rules: Vec<RuleRuntime>,
    /// Cluster scope: the caller lease of this configuration
    /// (`throttle/v2/caller/<hash of the configuration>`).
    pub caller_key: String,
}

/// A rule's shared-data keys and metric ids.
pub struct RuleRuntime {
    /// The rule's unkeyed rate schedule.
    pub rate_key: String,
    /// Prefix of the rule's key table slots (`<prefix><slot>`).
    pub slot_prefix: String,
    /// The rule's concurrency gate.
    pub gate_key: String,
    /// Cluster scope: the cursor, the waiting count, the fallback schedule, the grants.
    pub cursor_key: String,
    pub waiting_key: String,
    pub fallback_key: String,
    pub grants_key: String,
    /// Metric ids by [`Stat`] (None where the host refused the definition).
    pub metrics: [Option<u32>; stats::COUNT],
}

impl Plugin {
    /// Defines the rules' metrics (`throttle.rule.<rule>.<stat>`).
    pub fn new<H: Host>(host: H, config: Config, seed: (u64, u64), config_hash: u64) -> Self {
        let rules = config
            .rules
            .iter()
            .map(|r| {
                let base = format!("throttle/v2/rule/{}/", r.name);
                RuleRuntime {
                    rate_key: format!("{base}rate"),
                    slot_prefix: format!("{base}k/"),
                    gate_key: format!("{base}gate"),
                    cursor_key: format!("{base}cursor"),
                    waiting_key: format!("{base}waiting"),
                    fallback_key: format!("{base}fallback"),
                    grants_key: format!("{base}grants"),
                    metrics: Stat::ALL.map(|s| {
                        host.define_metric(
                            s.kind(),
                            &format!("throttle.rule.{}.{}", r.name, s.name()),
                        )
                    }),
                }
            })
            .collect();
        Plugin {
            config,
            hasher: KeyHasher::new(seed),
            rules,
            caller_key: format!("throttle/v2/caller/{config_hash:016x}"),
        }
    }

    /// Creates the rules' shared cells so that updates always carry a CAS
    /// token. Returns the names of rules whose cells could not be created.
    pub fn init_cells<H: Host>(&self, host: H) -> Vec<&str> {
        self.config
            .rules
            .iter()
            .zip(&self.rules)
            .filter(|(r, rt)| {
                let rate_ok = r.schedule.is_none() || ensure_cell(host, &rt.rate_key);
                let gate_ok = r.concurrency.is_none() || ensure_cell(host, &rt.gate_key);
                let cluster_ok = r.cluster.is_none()
                    || ([&rt.cursor_key, &rt.waiting_key, &rt.fallback_key]
                        .iter()
                        .all(|k| ensure_cell(host, k))
                        && ensure_blob(host, &rt.grants_key, &Grants::default().encode()));
                !(rate_ok && gate_ok && cluster_ok)
            })
            .map(|(r, _)| r.name.as_str())
            .collect()
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

    /// Records a released request's wait.
    pub fn record_wait<H: Host>(&self, host: H, rule: usize, waited_ns: u64) {
        if let Some(Some(id)) = self
            .rules
            .get(rule)
            .and_then(|rt| rt.metrics.get(Stat::WaitMs as usize))
        {
            host.record_metric(*id, waited_ns / NS_PER_MS);
        }
    }
}
