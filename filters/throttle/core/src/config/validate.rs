//! The validator: walks the JSON once, checks every field against [`spec`],
//! and reports every problem (not just the first).

use serde_json::{Map, Value};

use super::spec::{self, Field, Kind};
use super::strict_json;
use super::{Class, ClusterScope, Config, ConfigError, EngineConfig, OnEngineFailure, Rule};
use crate::keys::KeySource;
use crate::matcher::{AuthorityMatch, HeaderMatch, Match};
use crate::path::{normalize_authority, normalize_path};
use crate::ratelimit::HeaderStyle;
use crate::schedule::Schedule;
use crate::units::{describe, parse_duration, parse_rate, MAX_DURATION_NS};

mod adaptive;

/// Parses and validates a configuration. Returns every problem found.
pub fn parse(bytes: &[u8]) -> Result<Config, Vec<ConfigError>> {
    let (value, duplicates) = strict_json::parse(bytes).map_err(|e| {
        vec![ConfigError {
            field: "(config)".into(),
            reason: format!("invalid JSON: {e}"),
        }]
    })?;
    let mut v = Validator::default();
    for path in duplicates {
        v.error(
            &path,
            "duplicate field (JSON objects must not repeat a name; which one would win is unclear)",
        );
    }
    match v.config(&value) {
        Some(c) if v.errors.is_empty() => Ok(c),
        _ => Err(v.errors),
    }
}

#[derive(Default)]
struct Validator {
    errors: Vec<ConfigError>,
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

impl Validator {
    fn error(&mut self, field: &str, reason: impl Into<String>) {
        self.errors.push(ConfigError {
            field: field.into(),
            reason: reason.into(),
        });
    }

    /// The object at `path`, with its unknown fields reported.
    fn object<'a>(
        &mut self,
        path: &str,
        value: &'a Value,
        fields: &[Field],
    ) -> Option<&'a Map<String, Value>> {
        let Value::Object(obj) = value else {
            let shown = if path.is_empty() { "(config)" } else { path };
            self.error(
                shown,
                format!("expected an object, got {}", describe(value)),
            );
            return None;
        };
        for key in obj.keys() {
            if !fields.iter().any(|f| f.name == key) {
                // An empty key is shown as "" so the message still names it.
                let shown = if key.is_empty() { "\"\"" } else { key.as_str() };
                self.error(
                    &join(path, shown),
                    format!("unknown field (expected one of: {})", spec::names(fields)),
                );
            }
        }
        Some(obj)
    }

    /// A required field's value; reports `required: <what>` when absent.
    fn get<'a>(
        &mut self,
        path: &str,
        obj: &'a Map<String, Value>,
        f: &Field,
        what: &str,
    ) -> Option<&'a Value> {
        let v = obj.get(f.name);
        if v.is_none() {
            self.error(&join(path, f.name), format!("required: {what}"));
        }
        v
    }

    /// An integer field; `default` when absent (the spec's own default for
    /// most fields; rule overrides pass the global value). Bounds come from
    /// the spec.
    fn integer(
        &mut self,
        path: &str,
        obj: &Map<String, Value>,
        f: &Field,
        default: u64,
    ) -> Option<u64> {
        let Kind::Integer { min, max } = f.kind else {
            return None;
        };
        let Some(value) = obj.get(f.name) else {
            return Some(default);
        };
        match value.as_u64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                self.error(
                    &join(path, f.name),
                    format!(
                        "must be an integer from {min} to {max}, got {}",
                        describe(value)
                    ),
                );
                None
            }
        }
    }

    fn boolean(
        &mut self,
        path: &str,
        obj: &Map<String, Value>,
        f: &Field,
        default: bool,
    ) -> Option<bool> {
        match obj.get(f.name) {
            None => Some(default),
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.error(
                    &join(path, f.name),
                    format!("must be true or false, got {}", describe(other)),
                );
                None
            }
        }
    }

    fn config(&mut self, value: &Value) -> Option<Config> {
        let obj = self.object("", value, spec::CONFIG_FIELDS)?;
        let max_held = self.integer(
            "",
            obj,
            &spec::MAX_HELD_PER_WORKER,
            spec::MAX_HELD_PER_WORKER.int_default(),
        );
        let reject_status = self.integer(
            "",
            obj,
            &spec::REJECT_STATUS,
            spec::REJECT_STATUS.int_default(),
        );
        let dry_run = self.boolean("", obj, &spec::DRY_RUN, spec::DRY_RUN.bool_default());
        let dry_run_headers = self.boolean(
            "",
            obj,
            &spec::DRY_RUN_HEADERS,
            spec::DRY_RUN_HEADERS.bool_default(),
        );
        let headers = self.header_style(obj);
        let defaults = RuleDefaults {
            reject_status: reject_status.unwrap_or(spec::REJECT_STATUS.int_default()),
            dry_run: dry_run.unwrap_or(spec::DRY_RUN.bool_default()),
        };
        let engine = match obj.get(spec::ENGINE.name) {
            None => Some(None),
            Some(v) => self.engine("engine", v).map(Some),
        };
        let rules = self.rules(obj, &defaults);
        let (rules, engine) = (rules?, engine?);
        if let Some(e) = &engine {
            for (i, r) in rules.iter().enumerate() {
                if r.cluster.is_some() && r.max_delay_ns < e.timeout_ns {
                    self.error(
                        &format!("rules[{i}].max_queue_delay"),
                        format!(
                            "{} ms is shorter than engine.timeout ({} ms): a request waiting for grants from the engine could only be rejected; make it at least engine.timeout",
                            r.max_delay_ns / crate::clock::NS_PER_MS,
                            e.timeout_ns / crate::clock::NS_PER_MS
                        ),
                    );
                }
            }
            if !self.errors.is_empty() {
                return None;
            }
        }
        if engine.is_none() {
            for (i, r) in rules.iter().enumerate() {
                if r.cluster.is_some() {
                    self.error(
                        &format!("rules[{i}].scope"),
                        "\"cluster\" requires the top-level `engine` block (`engine.cluster` names the Envoy cluster of the rate limit service)",
                    );
                }
            }
            if !self.errors.is_empty() {
                return None;
            }
        }
        Some(Config {
            rules,
            max_held_per_worker: u32::try_from(max_held?).ok()?,
            rate_limit_headers: headers?,
            dry_run_headers: dry_run_headers?,
            engine,
        })
    }

    fn header_style(&mut self, obj: &Map<String, Value>) -> Option<HeaderStyle> {
        match obj.get(spec::RATE_LIMIT_HEADERS.name) {
            None | Some(Value::Bool(false)) => Some(HeaderStyle::Off),
            Some(Value::Bool(true)) => Some(HeaderStyle::Ietf),
            Some(Value::String(s)) if s == "ietf" => Some(HeaderStyle::Ietf),
            Some(Value::String(s)) if s == "legacy" => Some(HeaderStyle::Legacy),
            Some(other) => {
                self.error(
                    spec::RATE_LIMIT_HEADERS.name,
                    format!(
                        "must be true, false, \"ietf\" or \"legacy\", got {}",
                        describe(other)
                    ),
                );
                None
            }
        }
    }

    fn rules(&mut self, obj: &Map<String, Value>, defaults: &RuleDefaults) -> Option<Vec<Rule>> {
        let value = self.get("", obj, &spec::RULES, "a non-empty list of rules")?;
        let Value::Array(items) = value else {
            self.error(
                "rules",
                format!(
                    "expected a non-empty list of rules, got {}",
                    describe(value)
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.error("rules", "must contain at least one rule");
            return None;
        }
        let before = self.errors.len();
        let mut rules: Vec<Rule> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let path = format!("rules[{i}]");
            if let Some(rule) = self.rule(&path, item, defaults) {
                if rules.iter().any(|r| r.name == rule.name) {
                    self.error(
                        &format!("{path}.name"),
                        format!("duplicate rule name \"{}\"", rule.name),
                    );
                }
                rules.push(rule);
            }
        }
        (self.errors.len() == before).then_some(rules)
    }

    fn rule(&mut self, path: &str, value: &Value, defaults: &RuleDefaults) -> Option<Rule> {
        let obj = self.object(path, value, spec::RULE_FIELDS)?;
        let before = self.errors.len();
        let name = self.name(path, obj);
        let rate = match obj.get(spec::RATE.name) {
            None => None,
            Some(v) => match parse_rate(v) {
                Ok(r) => Some(r),
                Err(e) => {
                    self.error(&join(path, "rate"), e);
                    None
                }
            },
        };
        let burst = self.integer(path, obj, &spec::BURST, spec::BURST.int_default());
        let quota = match obj.get(spec::KEY_QUOTA.name) {
            None => None,
            Some(v) => match parse_rate(v) {
                Ok((interval, _)) => Some(interval),
                Err(e) => {
                    self.error(&join(path, "key_quota"), e);
                    None
                }
            },
        };
        let max_delay = match obj.get(spec::MAX_QUEUE_DELAY.name) {
            None => Some(spec::MAX_QUEUE_DELAY.duration_default_ns()),
            Some(v) => parse_duration(v)
                .map_err(|e| self.error(&join(path, "max_queue_delay"), e))
                .ok(),
        };
        let concurrency = match obj.get(spec::CONCURRENCY.name) {
            None => None,
            Some(_) => self
                .integer(path, obj, &spec::CONCURRENCY, 0)
                .and_then(|n| u32::try_from(n).ok()),
        };
        let matcher = match obj.get(spec::MATCH.name) {
            None => Some(Match::default()),
            Some(v) => self.matcher(&join(path, "match"), v),
        };
        let key = match obj.get(spec::KEY.name) {
            None => None,
            Some(v) => self.key(&join(path, "key"), v),
        };
        let key_slots = self.integer(path, obj, &spec::KEY_SLOTS, spec::KEY_SLOTS.int_default());
        let reject_status =
            self.integer(path, obj, &spec::RULE_REJECT_STATUS, defaults.reject_status);
        let dry_run = self.boolean(path, obj, &spec::RULE_DRY_RUN, defaults.dry_run);
        let cluster = self.scope(path, obj, rate.map(|(interval, _)| interval));
        let adaptive = match obj.get(spec::ADAPTIVE.name) {
            None => Some(None),
            Some(v) => self
                .adaptive(&join(path, "adaptive"), v, obj, rate.map(|(i, _)| i))
                .map(Some),
        };
        let classes = match (obj.get(spec::CLASSES.name), max_delay) {
            (None, _) => Some(Vec::new()),
            (Some(v), Some(rule_delay)) => self.classes(&join(path, "classes"), v, rule_delay),
            // The rule's delay is wrong (reported): the classes' defaults are unknown.
            (Some(_), None) => None,
        };

        // Relations between fields.
        let has = |f: &Field| obj.contains_key(f.name);
        if !has(&spec::RATE) && !has(&spec::CONCURRENCY) {
            self.error(
                &join(path, "rate"),
                "required: a rule needs `rate`, `concurrency`, or both",
            );
        }
        if has(&spec::BURST) && !has(&spec::RATE) {
            self.error(&join(path, "burst"), "requires `rate`");
        }
        if has(&spec::KEY_SLOTS) && !has(&spec::KEY) {
            self.error(&join(path, "key_slots"), "requires `key`");
        }
        if has(&spec::KEY_QUOTA) && !(has(&spec::KEY) && has(&spec::RATE)) {
            self.error(&join(path, "key_quota"), "requires `key` and `rate`");
        }
        if let (Some(q), Some((interval, _))) = (quota, rate) {
            // A longer interval is a lower rate.
            if q < interval {
                self.error(
                    &join(path, "key_quota"),
                    "must not exceed `rate` (a key's share of the shared rate cannot be larger than the rate)",
                );
            }
        }
        if has(&spec::CLASSES) {
            if !has(&spec::RATE) {
                self.error(
                    &join(path, "classes"),
                    "requires `rate` (classes order the releases of the rule's rate)",
                );
            }
            if has(&spec::KEY) && !has(&spec::KEY_QUOTA) {
                self.error(
                    &join(path, "classes"),
                    "cannot be combined with `key` without `key_quota`: with `key` alone every key has its own rate, so there is no shared queue to order (use `key_quota`: one shared rate ordered by class, each key within its quota)",
                );
            }
        }
        if has(&spec::CONCURRENCY) && has(&spec::KEY) {
            self.error(
                &join(path, "concurrency"),
                "cannot be combined with `key` (concurrency is per rule)",
            );
        }
        if self.errors.len() != before {
            return None;
        }
        let max_delay_ns = max_delay?;
        Some(Rule {
            name: name?,
            schedule: rate
                .map(|(interval, _)| Schedule::new(interval, burst.unwrap_or(0), max_delay_ns)),
            rate_window: rate.map(|(_, w)| w),
            concurrency,
            max_delay_ns,
            matcher: matcher?,
            key,
            key_slots: u32::try_from(key_slots?).ok()?,
            quota: quota.map(|interval| Schedule::new(interval, 0, max_delay_ns)),
            reject_status: u16::try_from(reject_status?).ok()?,
            dry_run: dry_run?,
            cluster: cluster?,
            adaptive: adaptive?,
            classes: classes?,
        })
    }

    /// A rule's `classes`; each class's delay defaults to `rule_delay`.
    fn classes(&mut self, path: &str, value: &Value, rule_delay: u64) -> Option<Vec<Class>> {
        let max = spec::MAX_CLASSES;
        let items = match value {
            Value::Array(items) if (1..=max).contains(&items.len()) => items,
            other => {
                self.error(
                    path,
                    format!(
                        "must be a list of 1 to {max} classes, got {}",
                        match other {
                            Value::Array(a) => format!("{} classes", a.len()),
                            v => describe(v),
                        }
                    ),
                );
                return None;
            }
        };
        let before = self.errors.len();
        let mut out: Vec<Class> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let Some(class) = self.class(&at, item, rule_delay) else {
                continue;
            };
            if out.iter().any(|c| c.name == class.name) {
                self.error(
                    &format!("{at}.name"),
                    format!("duplicate class name \"{}\"", class.name),
                );
            }
            out.push(class);
        }
        if self.errors.len() != before {
            return None;
        }
        self.unreachable_classes(path, &out);
        let defaults: Vec<&str> = out
            .iter()
            .filter(|c| c.matcher.is_none())
            .map(|c| c.name.as_str())
            .collect();
        if defaults.len() != 1 {
            self.error(
                path,
                format!(
                    "exactly one class must have no `match` (it takes the requests no other class fits), found {}{}",
                    defaults.len(),
                    if defaults.is_empty() { String::new() } else { format!(": {}", defaults.join(", ")) }
                ),
            );
        }
        let total: u64 = out.iter().map(|c| u64::from(c.min_share_ppm)).sum();
        if total > 1_000_000 {
            self.error(
                path,
                format!(
                    "the classes' `min_share` add up to {}; they must add up to at most 1",
                    total as f64 / 1e6
                ),
            );
        }
        (self.errors.len() == before).then_some(out)
    }

    /// Classes no request could ever take: after a class whose `match` is
    /// empty (it takes every request), or with the same `match` as a class
    /// before them (the first fits first).
    fn unreachable_classes(&mut self, path: &str, classes: &[Class]) {
        let same = |a: &Match, b: &Match| {
            let sorted = |m: &Match| {
                let mut m = m.clone();
                m.methods.sort();
                m.headers.sort_by(|x, y| x.0.cmp(&y.0));
                m
            };
            sorted(a) == sorted(b)
        };
        for (i, c) in classes.iter().enumerate() {
            let Some(m) = &c.matcher else { continue };
            if m.is_empty() {
                let default = classes
                    .iter()
                    .find(|d| d.matcher.is_none())
                    .map_or("the default class".to_string(), |d| {
                        format!("the default class \"{}\"", d.name)
                    });
                self.error(
                    &format!("{path}[{i}].match"),
                    format!(
                        "is empty: it fits every request, so no request would reach the classes after it nor {default}; leave `match` out to make \"{}\" the default class",
                        c.name
                    ),
                );
                continue;
            }
            let earlier = classes
                .get(..i)
                .unwrap_or_default()
                .iter()
                .position(|e| e.matcher.as_ref().is_some_and(|em| same(em, m)));
            if let Some(j) = earlier {
                self.error(
                    &format!("{path}[{i}].match"),
                    format!(
                        "the same as classes[{j}].match (\"{}\"), which fits first: no request could ever take class \"{}\"",
                        classes.get(j).map_or("", |e| e.name.as_str()),
                        c.name
                    ),
                );
            }
        }
    }

    fn class(&mut self, path: &str, value: &Value, rule_delay: u64) -> Option<Class> {
        let obj = self.object(path, value, spec::CLASS_FIELDS)?;
        let before = self.errors.len();
        let name = match self.get(
            path,
            obj,
            &spec::CLASS_NAME,
            "the class's name (used in metric names)",
        )? {
            Value::String(s) if valid_name(s) && spec::names_are_unambiguous(s, true) => {
                Some(s.clone())
            }
            Value::String(s) if valid_name(s) => {
                self.error(
                    &join(path, "name"),
                    format!("must not contain the word \"class\" (per-class metric names would be ambiguous), got \"{s}\""),
                );
                None
            }
            other => {
                self.error(
                    &join(path, "name"),
                    format!(
                        "must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-', got {}",
                        describe(other)
                    ),
                );
                None
            }
        };
        let matcher = match obj.get(spec::CLASS_MATCH.name) {
            None => Some(None),
            Some(v) => self.matcher(&join(path, "match"), v).map(Some),
        };
        let min_share = match obj.get(spec::MIN_SHARE.name) {
            None => Some(0),
            Some(v) => {
                let spec::Kind::Fraction { max_ppm } = spec::MIN_SHARE.kind else {
                    return None;
                };
                match v.as_f64() {
                    Some(x) if (0.0..=f64::from(max_ppm) / 1e6).contains(&x) => {
                        Some((x * 1e6).round() as u32)
                    }
                    _ => {
                        self.error(
                            &join(path, "min_share"),
                            format!(
                                "must be a number from 0 to {}, got {}",
                                f64::from(max_ppm) / 1e6,
                                describe(v)
                            ),
                        );
                        None
                    }
                }
            }
        };
        let max_delay = self.duration(
            path,
            obj,
            &spec::CLASS_MAX_QUEUE_DELAY,
            rule_delay,
            (0, MAX_DURATION_NS, "from 0s to 1h"),
        );
        if self.errors.len() != before {
            return None;
        }
        Some(Class {
            name: name?,
            matcher: matcher?,
            min_share_ppm: min_share?,
            max_delay_ns: max_delay?,
        })
    }

    /// One of the strings a `Kind::OneOf` field allows; `default` when absent.
    fn one_of<'a>(
        &mut self,
        path: &str,
        obj: &'a Map<String, Value>,
        f: &Field,
        default: &'a str,
    ) -> Option<&'a str> {
        let Kind::Choice(values) = f.kind else {
            return None;
        };
        match obj.get(f.name) {
            None => Some(default),
            Some(Value::String(s)) if values.contains(&s.as_str()) => Some(s.as_str()),
            Some(other) => {
                let allowed: Vec<String> = values.iter().map(|v| format!("\"{v}\"")).collect();
                self.error(
                    &join(path, f.name),
                    format!(
                        "must be one of {}, got {}",
                        allowed.join(", "),
                        describe(other)
                    ),
                );
                None
            }
        }
    }

    /// `scope` and the fields that go with `"cluster"`: Some(None) for process scope.
    fn scope(
        &mut self,
        path: &str,
        obj: &Map<String, Value>,
        interval_ns: Option<u64>,
    ) -> Option<Option<ClusterScope>> {
        let before = self.errors.len();
        let scope = self.one_of(path, obj, &spec::SCOPE, "process");
        let replicas = self.integer(path, obj, &spec::EXPECTED_REPLICAS, 1);
        let failure = self.one_of(path, obj, &spec::ON_ENGINE_FAILURE, "local_share");
        let cluster = scope == Some("cluster");
        if !cluster && scope.is_some() {
            for f in [&spec::EXPECTED_REPLICAS, &spec::ON_ENGINE_FAILURE] {
                if obj.contains_key(f.name) {
                    self.error(&join(path, f.name), "requires `scope: \"cluster\"`");
                }
            }
        }
        if cluster {
            for (f, why) in [
                (&spec::KEY, "per-key rules are process-only"),
                (&spec::CONCURRENCY, "concurrency is process-only"),
            ] {
                if obj.contains_key(f.name) {
                    self.error(
                        &join(path, "scope"),
                        format!("\"cluster\" cannot be combined with `{}` ({why})", f.name),
                    );
                }
            }
            if let Some(t) = interval_ns.filter(|t| *t > spec::MAX_CLUSTER_INTERVAL_NS) {
                self.error(
                    &join(path, "rate"),
                    format!(
                        "scope \"cluster\" needs a rate of at least 1/s (one slot per second or more), got one every {:.3} s",
                        t as f64 / crate::clock::NS_PER_S as f64
                    ),
                );
            }
        }
        if self.errors.len() != before {
            return None;
        }
        if !cluster {
            return Some(None);
        }
        let on_engine_failure = match failure? {
            "deny" => OnEngineFailure::Deny,
            "local_full" => OnEngineFailure::LocalFull,
            _ => OnEngineFailure::LocalShare,
        };
        Some(Some(ClusterScope {
            expected_replicas: u32::try_from(replicas?).ok()?,
            on_engine_failure,
        }))
    }

    /// A duration field within `min..=max` ns; `default` when absent.
    fn duration(
        &mut self,
        path: &str,
        obj: &Map<String, Value>,
        f: &Field,
        default: u64,
        (min, max, range): (u64, u64, &str),
    ) -> Option<u64> {
        let Some(v) = obj.get(f.name) else {
            return Some(default);
        };
        match parse_duration(v) {
            Ok(ns) if (min..=max).contains(&ns) => Some(ns),
            Ok(_) => {
                self.error(
                    &join(path, f.name),
                    format!("must be {range}, got {}", describe(v)),
                );
                None
            }
            Err(e) => {
                self.error(&join(path, f.name), e);
                None
            }
        }
    }

    fn engine(&mut self, path: &str, value: &Value) -> Option<EngineConfig> {
        let obj = self.object(path, value, spec::ENGINE_FIELDS)?;
        let before = self.errors.len();
        let cluster = self
            .get(
                path,
                obj,
                &spec::ENGINE_CLUSTER,
                "the Envoy cluster of the rate limit service",
            )
            .and_then(|v| self.text(&join(path, "cluster"), v));
        let ms = crate::clock::NS_PER_MS;
        let s = crate::clock::NS_PER_S;
        let timeout = self.duration(
            path,
            obj,
            &spec::ENGINE_TIMEOUT,
            spec::ENGINE_TIMEOUT.duration_default_ns(),
            (ms, s, "from 1ms to 1s"),
        );
        let fallback_after = self.duration(
            path,
            obj,
            &spec::ENGINE_FALLBACK_AFTER,
            spec::ENGINE_FALLBACK_AFTER.duration_default_ns(),
            (0, 60 * s, "from 0s to 1m"),
        );
        let skew = self.duration(
            path,
            obj,
            &spec::ENGINE_MAX_CLOCK_SKEW,
            spec::ENGINE_MAX_CLOCK_SKEW.duration_default_ns(),
            (0, 10 * s, "from 0s to 10s"),
        );
        let domain = match obj.get(spec::ENGINE_DOMAIN.name) {
            None => Some("envoy_throttle".to_string()),
            Some(v) => self.text(&join(path, "domain"), v),
        };
        if self.errors.len() != before {
            return None;
        }
        Some(EngineConfig {
            cluster: cluster?,
            timeout_ns: timeout?,
            fallback_after_ns: fallback_after?,
            domain: domain?,
            max_clock_skew_ns: skew?,
        })
    }

    fn name(&mut self, path: &str, obj: &Map<String, Value>) -> Option<String> {
        match self.get(
            path,
            obj,
            &spec::NAME,
            "the rule's name (used in metric names)",
        )? {
            Value::String(s) if valid_name(s) && spec::names_are_unambiguous(s, false) => {
                Some(s.clone())
            }
            Value::String(s) if valid_name(s) => {
                self.error(
                    &join(path, "name"),
                    format!("must not contain the word \"class\" between '_' or '-' (per-class metric names would be ambiguous), got \"{s}\""),
                );
                None
            }
            other => {
                self.error(
                    &join(path, "name"),
                    format!(
                        "must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-', got {}",
                        describe(other)
                    ),
                );
                None
            }
        }
    }

    fn path_string(&mut self, path: &str, value: &Value) -> Option<String> {
        match value {
            Value::String(p) if p.starts_with('/') => Some(p.clone()),
            other => {
                self.error(
                    path,
                    format!(
                        "must be a string starting with '/', got {}",
                        describe(other)
                    ),
                );
                None
            }
        }
    }

    fn text(&mut self, path: &str, value: &Value) -> Option<String> {
        match value {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            other => {
                self.error(
                    path,
                    format!("must be a non-empty string, got {}", describe(other)),
                );
                None
            }
        }
    }

    fn matcher(&mut self, path: &str, value: &Value) -> Option<Match> {
        let obj = self.object(path, value, spec::MATCH_FIELDS)?;
        let before = self.errors.len();
        let mut m = Match::default();
        if let Some(v) = obj.get(spec::PATH_PREFIX.name) {
            // "/" is every request: no condition, so the request's path is not
            // even read (the fast path reads no header).
            m.path_prefix = self
                .path_string(&join(path, "path_prefix"), v)
                .map(|p| normalize_path(p.as_bytes()))
                .filter(|p| p != "/");
        }
        if let Some(v) = obj.get(spec::PATH_EXACT.name) {
            m.path_exact = self
                .path_string(&join(path, "path_exact"), v)
                .map(|p| normalize_path(p.as_bytes()));
        }
        if let Some(v) = obj.get(spec::METHODS.name) {
            m.methods = self.methods(&join(path, "methods"), v).unwrap_or_default();
        }
        if let Some(v) = obj.get(spec::HEADERS.name) {
            m.headers = self
                .header_matches(&join(path, "headers"), v)
                .unwrap_or_default();
        }
        if let Some(v) = obj.get(spec::AUTHORITY.name) {
            m.authority = self.text(&join(path, "authority"), v).map(|a| {
                let (host, port) = normalize_authority(&a);
                AuthorityMatch {
                    host,
                    port: port.map(str::to_string),
                }
            });
        }
        if let Some(v) = obj.get(spec::PRINCIPAL.name) {
            m.principal = self.text(&join(path, "principal"), v);
        }
        (self.errors.len() == before).then_some(m)
    }

    fn methods(&mut self, path: &str, value: &Value) -> Option<Vec<String>> {
        let bad = |v: &Value| {
            format!(
                "must be a non-empty list of method names such as [\"GET\", \"POST\"], got {}",
                describe(v)
            )
        };
        let Value::Array(items) = value else {
            self.error(path, bad(value));
            return None;
        };
        if items.is_empty() {
            self.error(path, bad(value));
            return None;
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic()) => {
                    out.push(s.to_ascii_uppercase())
                }
                other => self.error(
                    &format!("{path}[{i}]"),
                    format!(
                        "must be a method name such as \"GET\", got {}",
                        describe(other)
                    ),
                ),
            }
        }
        Some(out)
    }

    fn header_matches(&mut self, path: &str, value: &Value) -> Option<Vec<(String, HeaderMatch)>> {
        let obj = match value {
            Value::Object(o) if !o.is_empty() => o,
            other => {
                self.error(
                    path,
                    format!(
                        "must be a non-empty object of header name -> value, true or false, got {}",
                        describe(other)
                    ),
                );
                return None;
            }
        };
        let mut out = Vec::with_capacity(obj.len());
        for (name, v) in obj {
            let shown = if name.is_empty() {
                "\"\""
            } else {
                name.as_str()
            };
            let field = join(path, shown);
            if !is_header_name(name) {
                self.error(&field, "must be a header name");
                continue;
            }
            let m = match v {
                Value::String(s) => HeaderMatch::Exact(s.clone()),
                Value::Bool(true) => HeaderMatch::Present,
                Value::Bool(false) => HeaderMatch::Absent,
                other => {
                    self.error(&field, format!("must be an exact value (string), true (present) or false (absent), got {}", describe(other)));
                    continue;
                }
            };
            out.push((name.to_ascii_lowercase(), m));
        }
        Some(out)
    }

    fn key(&mut self, path: &str, value: &Value) -> Option<KeySource> {
        let obj = self.object(path, value, spec::KEY_FIELDS)?;
        if obj.len() != 1 {
            self.error(
                path,
                format!(
                    "must have exactly one of: {}",
                    spec::names(spec::KEY_FIELDS)
                ),
            );
            return None;
        }
        let (name, v) = obj.iter().next()?;
        let field = join(path, name);
        match (name.as_str(), v) {
            ("header", v) => self
                .text(&field, v)
                .map(|h| KeySource::Header(h.to_ascii_lowercase())),
            ("source", Value::String(s)) if s == "address" => Some(KeySource::SourceAddress),
            ("source", Value::String(s)) if s == "principal" => Some(KeySource::Principal),
            ("source", other) => {
                self.error(
                    &field,
                    format!(
                        "must be \"address\" or \"principal\", got {}",
                        describe(other)
                    ),
                );
                None
            }
            ("path", Value::Bool(true)) => Some(KeySource::Path),
            ("authority", Value::Bool(true)) => Some(KeySource::Authority),
            ("path" | "authority", other) => {
                self.error(&field, format!("must be true, got {}", describe(other)));
                None
            }
            _ => None, // unknown field, already reported
        }
    }
}

/// 1 to 64 of `A-Za-z0-9_-` (rule and class names).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

struct RuleDefaults {
    reject_status: u64,
    dry_run: bool,
}

/// A header name: visible ASCII without ':' (pseudo-headers such as
/// `:authority` allowed).
fn is_header_name(name: &str) -> bool {
    let bare = name.strip_prefix(':').unwrap_or(name);
    !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}
