//! The filter's JSON configuration: parsed and validated in one pass that
//! collects every problem, each naming its field (`rules[1].rate: ...`).
//! Field names, bounds, defaults and docs live in [`spec`].
//!
//! ```json
//! {"rules": [{"name": "default", "rate": "500/s", "burst": 0, "max_queue_delay": "1s",
//!             "match": {"path_prefix": "/"}}],
//!  "max_held_per_worker": 10000, "reject_status": 429}
//! ```

pub mod adaptive;
pub mod spec;
mod strict_json;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_adaptive;

use std::fmt;

use crate::clock::NS_PER_MS;
use crate::keys::KeySource;
use crate::matcher::Match;
pub use crate::ratelimit::HeaderStyle;
use crate::schedule::Schedule;
use crate::stats::{Feature, Features};
use crate::units::rate_for_people;
pub use crate::units::RateWindow;

pub use validate::parse;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Rules in order; the first that matches a request applies to it.
    pub rules: Vec<Rule>,
    /// Cap on requests held at once by one worker.
    pub max_held_per_worker: u32,
    /// Which rate-limit headers responses of rate rules carry.
    pub rate_limit_headers: HeaderStyle,
    /// Whether clients see dry runs (`x-throttle-dry-run`, rate-limit headers).
    pub dry_run_headers: bool,
    /// The rate limit service of cluster-scope rules (required by them).
    pub engine: Option<EngineConfig>,
}

/// The top-level `engine` block: how cluster-scope rules reach the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Envoy cluster of the rate limit service's HTTP port.
    pub cluster: String,
    /// Bound of each call, ns.
    pub timeout_ns: u64,
    /// How long calls keep failing before rules fall back, ns.
    pub fallback_after_ns: u64,
    /// Rate limit domain of the service configuration.
    pub domain: String,
    /// Largest wall-clock difference between proxies and service replicas, ns.
    pub max_clock_skew_ns: u64,
}

/// What a cluster rule does while the engine fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEngineFailure {
    /// Pace locally at rate / proxy count (last seen, else expected_replicas).
    LocalShare,
    /// Reject with the rule's status and `retry-after`.
    Deny,
    /// Pace locally at the full rate.
    LocalFull,
}

impl OnEngineFailure {
    /// The configuration's spelling.
    pub fn name(self) -> &'static str {
        match self {
            OnEngineFailure::LocalShare => "local_share",
            OnEngineFailure::Deny => "deny",
            OnEngineFailure::LocalFull => "local_full",
        }
    }
}

/// A rule's `scope: "cluster"` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterScope {
    /// Proxies expected to share the rule (divisor of `local_share`).
    pub expected_replicas: u32,
    /// Fallback while the engine fails.
    pub on_engine_failure: OnEngineFailure,
}

/// One validated rule. Rule-level overrides are already resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Unique name; used in metric names and shared-data keys.
    pub name: String,
    /// The rate schedule, if the rule has a `rate`.
    pub schedule: Option<Schedule>,
    /// The rate as configured, for `x-ratelimit-limit`.
    pub rate_window: Option<RateWindow>,
    /// Process-wide cap on requests in flight, if the rule has `concurrency`.
    pub concurrency: Option<u32>,
    /// Longest hold, in ns.
    pub max_delay_ns: u64,
    /// Which requests the rule applies to.
    pub matcher: Match,
    /// Per-key rule: where the key comes from.
    pub key: Option<KeySource>,
    /// Size of the key table (meaningful with `key`).
    pub key_slots: u32,
    /// Fairness: each key's quota of the shared `schedule` (with `key_quota`).
    pub quota: Option<Schedule>,
    /// Status of rejections.
    pub reject_status: u16,
    /// Decide and count, but hold and reject nothing.
    pub dry_run: bool,
    /// `scope: "cluster"`: one rate across all proxies (None: per process).
    pub cluster: Option<ClusterScope>,
    /// `adaptive`: the rate is learned within these bounds.
    pub adaptive: Option<adaptive::Settings>,
    /// Priority classes, highest first (empty: none).
    pub classes: Vec<Class>,
}

/// One priority class of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    /// Unique in the rule; used in metric names.
    pub name: String,
    /// Which requests take the class (None: the default class, which takes
    /// every request no other class fits).
    pub matcher: Option<Match>,
    /// The class's floor: parts per million of the rule's releases while it waits.
    pub min_share_ppm: u32,
    /// Longest a request of the class may wait, in ns.
    pub max_delay_ns: u64,
}

impl Rule {
    /// One line for the log: `default: rate 500/1s (interval 2000000ns), burst 0, max_queue_delay 1000ms`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let (Some(s), Some(w)) = (&self.schedule, &self.rate_window) {
            parts.push(format!(
                "rate {} (interval {}ns), burst {}",
                w.describe(),
                s.interval_ns,
                s.tau_ns.checked_div(s.interval_ns).unwrap_or(0)
            ));
        }
        if let Some(n) = self.concurrency {
            parts.push(format!("concurrency {n}"));
        }
        parts.push(format!(
            "max_queue_delay {}ms",
            self.max_delay_ns / NS_PER_MS
        ));
        if let Some(k) = &self.key {
            parts.push(format!(
                "keyed by {} ({} slots)",
                k.describe(),
                self.key_slots
            ));
        }
        if !self.classes.is_empty() {
            let classes: Vec<String> = self
                .classes
                .iter()
                .map(|c| {
                    let mut d = format!("{} ({}ms", c.name, c.max_delay_ns / NS_PER_MS);
                    if c.min_share_ppm > 0 {
                        d.push_str(&format!(", min_share {}", f64::from(c.min_share_ppm) / 1e6));
                    }
                    d + ")"
                })
                .collect();
            parts.push(format!("classes {}", classes.join(" > ")));
        }
        if let Some(a) = &self.adaptive {
            let mode = match a.mode {
                adaptive::Mode::Enforce => "enforce",
                adaptive::Mode::Observe => "observe",
            };
            parts.push(format!(
                "adaptive {mode}, learned within {} to {}",
                rate_for_people(a.max_interval_ns),
                rate_for_people(a.min_interval_ns)
            ));
        }
        if self.dry_run {
            parts.push("dry-run".into());
        }
        format!("{}: {}", self.name, parts.join(", "))
    }
}

impl Rule {
    /// Whether the rule paces at a learned interval (adaptive, enforce
    /// mode): its rate cell's first word holds it ([`crate::rate::Gcra`]).
    pub fn learns(&self) -> bool {
        self.adaptive
            .is_some_and(|a| a.mode == adaptive::Mode::Enforce)
    }

    /// The lines a rule's waiting requests queue in, in ticket order
    /// ([`crate::classes`]): its priority classes; for a cluster rule
    /// without classes, one line of its own (the requests that wait for the
    /// grid's slots, served first come first across the process's workers);
    /// none for others (their schedule fixes each release at admission).
    pub fn line(&self) -> std::borrow::Cow<'_, [Class]> {
        if !self.classes.is_empty() || self.cluster.is_none() {
            return std::borrow::Cow::Borrowed(&self.classes);
        }
        std::borrow::Cow::Owned(vec![Class {
            name: String::new(),
            matcher: None,
            min_share_ppm: 0,
            max_delay_ns: self.max_delay_ns,
        }])
    }

    /// The class of a request of this rule (None if the rule has no classes).
    pub fn class_of<R: crate::matcher::Request>(
        &self,
        req: &mut crate::matcher::Facts<R>,
    ) -> Option<usize> {
        let fits = self
            .classes
            .iter()
            .position(|c| c.matcher.as_ref().is_some_and(|m| m.matches(req)));
        fits.or_else(|| self.classes.iter().position(|c| c.matcher.is_none()))
    }
}

/// The features of a rule's plan, for its statistics: a rule defines the
/// stats of these only ([`crate::stats::Stat::applies`]). A key or a key
/// quota moves no stat of its own (its rejections are `rejected`).
impl Features for Rule {
    fn has(&self, feature: Feature) -> bool {
        match feature {
            Feature::Core => true,
            Feature::Enforce => !self.dry_run,
            Feature::DryRun => self.dry_run,
            Feature::Concurrency => self.concurrency.is_some(),
            Feature::Cluster => self.cluster.is_some(),
            Feature::Adaptive => self.adaptive.is_some(),
            Feature::Classes => !self.classes.is_empty(),
        }
    }
}

impl Config {
    /// One line per rule for the log and `throttle-config check`; a cluster
    /// rule's names its engine.
    pub fn describe(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| match (&r.cluster, &self.engine) {
                (Some(c), Some(e)) => format!(
                    "{}, scope cluster (engine cluster {:?}, domain {:?}, expected_replicas {}, on_engine_failure {})",
                    r.describe(),
                    e.cluster,
                    e.domain,
                    c.expected_replicas,
                    c.on_engine_failure.name()
                ),
                _ => r.describe(),
            })
            .collect()
    }

    /// What is valid but probably not meant (logged at warn when configured).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.engine.is_some() && self.rules.iter().all(|r| r.cluster.is_none()) {
            out.push(
                "engine: no rule has scope \"cluster\", so the engine block is not used".into(),
            );
        }
        out
    }

    /// Whether some rule needs request data to match or key (false when the
    /// first rule matches everything and has no key: the fast path reads no header).
    pub fn first_rule_takes_all(&self) -> bool {
        self.rules
            .first()
            .is_some_and(|r| r.matcher.is_empty() && r.key.is_none())
    }
}

/// One configuration problem, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Path of the offending field, such as `rules[0].rate`, or `(config)`.
    pub field: String,
    /// What is wrong, and what would be right.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::str::FromStr for Config {
    type Err = Vec<ConfigError>;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s.as_bytes())
    }
}
