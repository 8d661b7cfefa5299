//! What a simulated run is: the fleet (proxies, their VMs and clocks), the
//! configuration every proxy carries (as JSON a user would write, validated
//! as the filter validates it), the demand, the faults, the network. A
//! scenario is data: the sweep draws them from a seed ([`super::sweep`]),
//! tests and the red team's findings write them by hand.

use serde_json::{json, Value};

use crate::clock::{NS_PER_MS, NS_PER_S};
use crate::config::{self, Config};

/// One rule of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    pub name: String,
    /// Requests per second (0.5 to 5,000 in the sweep).
    pub rate_per_s: f64,
    pub burst: u64,
    pub max_queue_delay_ms: u64,
    /// `scope: "cluster"`.
    pub cluster: bool,
    pub expected_replicas: u32,
    /// `on_engine_failure`.
    pub on_failure: &'static str,
    /// Keyed by `x-sim-key` (process scope), with `key_slots`.
    pub keyed: Option<u32>,
    /// `key_quota` (with `keyed`): each key's share of the rule's rate.
    pub key_quota_per_s: Option<f64>,
    /// Priority classes, highest first: (name, min_share, max_queue_delay ms).
    /// The last one is the default class (no match).
    pub classes: Vec<(String, f64, u64)>,
}

impl RuleSpec {
    /// A process-scope rule at `rate_per_s`, burst 0, max_queue_delay 1 s.
    pub fn process(name: &str, rate_per_s: f64) -> RuleSpec {
        RuleSpec {
            name: name.into(),
            rate_per_s,
            burst: 0,
            max_queue_delay_ms: 1000,
            cluster: false,
            expected_replicas: 1,
            on_failure: "local_share",
            keyed: None,
            key_quota_per_s: None,
            classes: Vec::new(),
        }
    }

    /// A cluster-scope rule over `replicas` proxies.
    pub fn cluster(name: &str, rate_per_s: f64, replicas: u32) -> RuleSpec {
        RuleSpec {
            cluster: true,
            expected_replicas: replicas,
            ..RuleSpec::process(name, rate_per_s)
        }
    }

    /// The rule's interval, ns (as the filter rounds it: up, to whole ns).
    pub fn interval_ns(&self) -> u64 {
        (NS_PER_S as f64 / self.rate_per_s).ceil() as u64
    }

    fn rate_text(&self) -> String {
        if (self.rate_per_s - self.rate_per_s.round()).abs() < 1e-9 {
            format!("{}/s", self.rate_per_s.round() as u64)
        } else {
            // Rates below 1/s (or fractional): per minute, whole.
            format!("{}/m", (self.rate_per_s * 60.0).round() as u64)
        }
    }
}

/// How the requests of one load arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// Evenly spaced at this rate, from a phase.
    Uniform { per_s: f64, phase_ms: u64 },
    /// Poisson at this rate.
    Poisson { per_s: f64 },
    /// `n` from `at_ms` (a burst, e.g. after idle), evenly over `spread_ms`
    /// (0: all at once). A client's burst is never at one instant: Fortio
    /// opens its 50 connections over 5-40 ms on the machines here, and an
    /// engine answer can land among them (CI 2026-12-01: scenario
    /// `burst-after-idle-spread`).
    Burst { n: u32, at_ms: u64, spread_ms: u64 },
}

/// One stream of requests: of a rule, at a proxy, over a time span.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    pub rule: usize,
    pub proxy: usize,
    pub shape: Shape,
    pub from_ms: u64,
    pub to_ms: u64,
    /// Its class (index in the rule's classes).
    pub class: Option<usize>,
    /// Keys drawn from `0..keys` (Zipf-like, a few hot), for keyed rules.
    pub keys: Option<u32>,
    /// The client gives up after this long (None: never within the run).
    pub client_timeout_ms: Option<u64>,
}

/// One proxy: its VMs (Envoy worker threads), its clock and its clock's steps.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxySpec {
    pub vms: usize,
    /// Its wall clock minus the true time, ms.
    pub skew_ms: i64,
    /// At `at_ms` its clock steps by `by_ms` (NTP stepping it, or a VM migrated).
    pub steps: Vec<(u64, i64)>,
    /// It starts at `start_ms` (None: at the start) and stops at `stop_ms`.
    pub start_ms: u64,
    pub stop_ms: Option<u64>,
    /// From `at_ms` for `for_ms` the whole process is held up (the machine
    /// or a cgroup's CPU quota stopped it): it sees nothing (arrivals,
    /// ticks, answers) until the end, then all of it at once.
    pub stalls: Vec<(u64, u64)>,
}

impl ProxySpec {
    pub fn new(vms: usize) -> ProxySpec {
        ProxySpec {
            vms,
            skew_ms: 0,
            steps: Vec::new(),
            start_ms: 0,
            stop_ms: None,
            stalls: Vec::new(),
        }
    }
}

/// Something that goes wrong with the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Redis restarts empty at `at_ms`, down for `down_ms` (the service
    /// answers 400 meanwhile).
    RedisRestart { at_ms: u64, down_ms: u64 },
    /// The service is unreachable (connect refused) for `for_ms`.
    EngineDown { at_ms: u64, for_ms: u64 },
    /// Every call takes `latency_ms` (past the timeout: a timeout) for `for_ms`.
    Slow {
        at_ms: u64,
        for_ms: u64,
        latency_ms: u64,
    },
    /// The service answers nonsense (HTTP 200 with garbage) for `for_ms`.
    Nonsense { at_ms: u64, for_ms: u64 },
}

impl Fault {
    /// When it starts and ends, ms.
    pub fn span_ms(&self) -> (u64, u64) {
        match *self {
            Fault::RedisRestart { at_ms, down_ms } => (at_ms, at_ms + down_ms),
            Fault::EngineDown { at_ms, for_ms }
            | Fault::Slow { at_ms, for_ms, .. }
            | Fault::Nonsense { at_ms, for_ms } => (at_ms, at_ms + for_ms),
        }
    }
}

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub seed: u64,
    /// A name for hand-written scenarios ("" for drawn ones).
    pub name: String,
    pub rules: Vec<RuleSpec>,
    pub proxies: Vec<ProxySpec>,
    pub loads: Vec<Load>,
    pub faults: Vec<Fault>,
    /// The engine block.
    pub timeout_ms: u64,
    pub fallback_after_ms: u64,
    pub max_clock_skew_ms: u64,
    /// A call's round trip, ms (drawn per call in `[lo, hi]`).
    pub latency_ms: (u64, u64),
    /// A VM's tick while it holds requests, ms (drawn per tick in `[lo, hi]`:
    /// Envoy fires a 1 ms tick about every 4 ms here).
    pub tick_ms: (u64, u64),
    /// The upstream's service time, ms.
    pub service_ms: u64,
    pub duration_ms: u64,
    /// True (and, unskewed, wall) time of the start, s since the Unix epoch.
    pub start_s: u64,
    pub max_held_per_worker: u32,
    /// Mixed into the VMs' and calls' draws only (ticks, latency): the same
    /// requests, timed a little differently (0: as drawn).
    pub noise: u64,
}

/// 2026-11-21 13:00 UTC, s since the Unix epoch: a boundary of the service's
/// hour, where its counters start again and claims pause
/// ([`crate::cluster::grid::Grid::may_claim`]).
pub const HOUR_S: u64 = 1_795_266_000;

impl Scenario {
    /// An empty scenario: no rules, no proxies, the default engine block.
    pub fn new(seed: u64, name: &str) -> Scenario {
        Scenario {
            seed,
            noise: 0,
            name: name.into(),
            rules: Vec::new(),
            proxies: Vec::new(),
            loads: Vec::new(),
            faults: Vec::new(),
            timeout_ms: 50,
            fallback_after_ms: 250,
            max_clock_skew_ms: 100,
            latency_ms: (1, 3),
            tick_ms: (2, 6),
            service_ms: 2,
            duration_ms: 10_000,
            // The top of an hour (claims pause for its first 100 ms, inside
            // the invariants' first seconds).
            start_s: HOUR_S,
            max_held_per_worker: 10_000,
        }
    }

    /// The configuration every proxy carries, as JSON.
    pub fn config_json(&self) -> Value {
        let rules: Vec<Value> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut rule = json!({
                    "name": r.name,
                    "rate": r.rate_text(),
                    "burst": r.burst,
                    "max_queue_delay": format!("{}ms", r.max_queue_delay_ms),
                    "match": {"headers": {"x-sim-rule": i.to_string()}},
                });
                let obj = rule.as_object_mut();
                if let Some(obj) = obj {
                    if r.cluster {
                        obj.insert("scope".into(), json!("cluster"));
                        obj.insert("expected_replicas".into(), json!(r.expected_replicas));
                        obj.insert("on_engine_failure".into(), json!(r.on_failure));
                    }
                    if let Some(slots) = r.keyed {
                        obj.insert("key".into(), json!({"header": "x-sim-key"}));
                        obj.insert("key_slots".into(), json!(slots));
                    }
                    if let Some(q) = r.key_quota_per_s {
                        obj.insert(
                            "key_quota".into(),
                            json!(format!("{}/m", (q * 60.0).round() as u64)),
                        );
                    }
                    if !r.classes.is_empty() {
                        let last = r.classes.len() - 1;
                        let classes: Vec<Value> = r
                            .classes
                            .iter()
                            .enumerate()
                            .map(|(k, (name, share, mqd))| {
                                let mut c =
                                    json!({"name": name, "max_queue_delay": format!("{mqd}ms")});
                                if let Some(o) = c.as_object_mut() {
                                    if *share > 0.0 {
                                        o.insert("min_share".into(), json!(share));
                                    }
                                    if k != last {
                                        o.insert(
                                            "match".into(),
                                            json!({"headers": {"x-priority": name}}),
                                        );
                                    }
                                }
                                c
                            })
                            .collect();
                        obj.insert("classes".into(), Value::Array(classes));
                    }
                }
                rule
            })
            .collect();
        let mut cfg = json!({"rules": rules, "max_held_per_worker": self.max_held_per_worker});
        if self.rules.iter().any(|r| r.cluster) {
            if let Some(obj) = cfg.as_object_mut() {
                obj.insert(
                    "engine".into(),
                    json!({
                        "cluster": "throttle_engine",
                        "timeout": format!("{}ms", self.timeout_ms),
                        "fallback_after": format!("{}ms", self.fallback_after_ms),
                        "max_clock_skew": format!("{}ms", self.max_clock_skew_ms),
                    }),
                );
            }
        }
        cfg
    }

    /// The validated configuration (Err: the filter would refuse it).
    pub fn config(&self) -> Result<Config, String> {
        config::parse(self.config_json().to_string().as_bytes()).map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// True time of the start, ns.
    pub fn start_ns(&self) -> u64 {
        self.start_s.saturating_mul(NS_PER_S)
    }

    /// True time at `ms` into the run, ns.
    pub fn at(&self, ms: u64) -> u64 {
        self.start_ns() + ms * NS_PER_MS
    }

    /// One line: what the run is.
    pub fn describe(&self) -> String {
        let rules: Vec<String> = self
            .rules
            .iter()
            .map(|r| {
                let mut d = format!(
                    "{} {:.1}/s b{} mqd{}ms{}",
                    r.name,
                    r.rate_per_s,
                    r.burst,
                    r.max_queue_delay_ms,
                    if r.cluster { " cluster" } else { "" }
                );
                if r.keyed.is_some() {
                    d.push_str(" keyed");
                }
                if !r.classes.is_empty() {
                    d.push_str(&format!(" {} classes", r.classes.len()));
                }
                d
            })
            .collect();
        let skewed = self
            .proxies
            .iter()
            .filter(|p| p.skew_ms != 0 || !p.steps.is_empty())
            .count();
        let mut stalls: Vec<(u64, u64)> = self
            .proxies
            .iter()
            .flat_map(|p| p.stalls.iter().copied())
            .collect();
        stalls.sort_unstable();
        stalls.dedup();
        let stalls = if stalls.is_empty() {
            String::new()
        } else {
            let each: Vec<String> = stalls
                .iter()
                .map(|(at, len)| format!("{len} ms at {:.1} s", *at as f64 / 1e3))
                .collect();
            format!("; stalls {}", each.join(", "))
        };
        // The service's hour boundaries after the start, within the run.
        let into = self.start_s % 3600;
        let hour = match 3600 - into {
            s if into > 0 && s * 1000 < self.duration_ms => format!("; the hour at {s} s"),
            _ => String::new(),
        };
        format!(
            "{} proxies ({} vms), {} s; rules [{}]; {} loads; {} faults; {} skewed{stalls}{hour}",
            self.proxies.len(),
            self.proxies.iter().map(|p| p.vms).sum::<usize>(),
            self.duration_ms / 1000,
            rules.join(", "),
            self.loads.len(),
            self.faults.len(),
            skewed
        )
    }
}
