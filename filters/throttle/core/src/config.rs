//! The filter's JSON configuration: parsed and validated in one pass that
//! collects every problem, each naming its field (`rules[1].rate: ...`).
//!
//! ```json
//! {"rules": [{"name": "default", "rate": "500/s", "burst": 0, "max_queue_delay": "1s",
//!             "match": {"path_prefix": "/"}}],
//!  "max_held_per_worker": 10000, "reject_status": 429}
//! ```

use std::fmt;

use serde_json::{Map, Value};

use crate::schedule::Schedule;
use crate::units::{describe, parse_duration, parse_rate};

/// Default of `max_queue_delay`: one second.
pub const DEFAULT_MAX_QUEUE_DELAY_NS: u64 = crate::NS_PER_S;
/// Default of `max_held_per_worker`.
pub const DEFAULT_MAX_HELD_PER_WORKER: u32 = 10_000;
/// Highest accepted `max_held_per_worker`.
pub const MAX_HELD_PER_WORKER_LIMIT: u64 = 1_000_000;
/// Default of `reject_status`.
pub const DEFAULT_REJECT_STATUS: u16 = 429;
/// Highest accepted `burst`.
pub const MAX_BURST: u64 = 1_000_000;
/// Longest accepted rule name (it becomes part of metric names).
pub const MAX_NAME_LEN: usize = 64;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Rules in order; the first that matches a request applies to it.
    pub rules: Vec<Rule>,
    /// Cap on requests held at once by one worker (memory bound); beyond it,
    /// a request that would be held is rejected.
    pub max_held_per_worker: u32,
    /// HTTP status of rejections.
    pub reject_status: u16,
}

/// One throttle rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Unique name; used in metric names and shared-data keys.
    pub name: String,
    /// The rule's schedule parameters.
    pub schedule: Schedule,
    /// Which requests the rule applies to.
    pub matcher: Match,
}

/// Request matcher of a rule. An absent field matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Match {
    /// The `:path` header starts with this string.
    pub path_prefix: Option<String>,
}

impl Match {
    /// Whether the request with this `:path` matches.
    pub fn matches(&self, path: Option<&str>) -> bool {
        match &self.path_prefix {
            None => true,
            Some(prefix) => path.is_some_and(|p| p.starts_with(prefix.as_str())),
        }
    }

    /// Whether matching needs the request's path.
    pub fn needs_path(&self) -> bool {
        self.path_prefix.is_some()
    }
}

impl Config {
    /// Index of the first rule matching a request with this `:path`.
    pub fn find_rule(&self, path: Option<&str>) -> Option<usize> {
        self.rules.iter().position(|r| r.matcher.matches(path))
    }

    /// Whether choosing a rule needs the request's path: false when the first
    /// rule matches everything, so the fast path reads no header.
    pub fn needs_path(&self) -> bool {
        self.rules.first().is_some_and(|r| r.matcher.needs_path())
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

/// Parses and validates a configuration. Returns every problem found.
pub fn parse(bytes: &[u8]) -> Result<Config, Vec<ConfigError>> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        vec![ConfigError {
            field: "(config)".into(),
            reason: format!("invalid JSON: {e}"),
        }]
    })?;
    let mut v = Validator::default();
    let config = v.config(&value);
    match config {
        Some(c) if v.errors.is_empty() => Ok(c),
        _ => Err(v.errors),
    }
}

impl std::str::FromStr for Config {
    type Err = Vec<ConfigError>;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s.as_bytes())
    }
}

#[derive(Default)]
struct Validator {
    errors: Vec<ConfigError>,
}

impl Validator {
    fn error(&mut self, field: &str, reason: impl Into<String>) {
        self.errors.push(ConfigError {
            field: field.into(),
            reason: reason.into(),
        });
    }

    /// Reports unknown fields of an object.
    fn known_fields(&mut self, path: &str, obj: &Map<String, Value>, known: &[&str]) {
        for key in obj.keys() {
            if !known.contains(&key.as_str()) {
                let field = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                self.error(
                    &field,
                    format!("unknown field (expected one of: {})", known.join(", ")),
                );
            }
        }
    }

    fn object<'a>(&mut self, path: &str, value: &'a Value) -> Option<&'a Map<String, Value>> {
        match value {
            Value::Object(o) => Some(o),
            other => {
                self.error(path, format!("expected an object, got {}", describe(other)));
                None
            }
        }
    }

    /// An integer field in `min..=max`, or its default when absent.
    fn integer(
        &mut self,
        path: &str,
        value: Option<&Value>,
        min: u64,
        max: u64,
        default: u64,
    ) -> Option<u64> {
        let Some(value) = value else {
            return Some(default);
        };
        match value.as_u64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                self.error(
                    path,
                    format!(
                        "must be an integer from {min} to {max}, got {}",
                        describe(value)
                    ),
                );
                None
            }
        }
    }

    fn config(&mut self, value: &Value) -> Option<Config> {
        let obj = self.object("(config)", value)?;
        self.known_fields("", obj, &["rules", "max_held_per_worker", "reject_status"]);
        let max_held = self.integer(
            "max_held_per_worker",
            obj.get("max_held_per_worker"),
            1,
            MAX_HELD_PER_WORKER_LIMIT,
            DEFAULT_MAX_HELD_PER_WORKER.into(),
        );
        let reject_status = self.integer(
            "reject_status",
            obj.get("reject_status"),
            400,
            599,
            DEFAULT_REJECT_STATUS.into(),
        );
        let rules = self.rules(obj.get("rules"));
        Some(Config {
            rules: rules?,
            max_held_per_worker: u32::try_from(max_held?).ok()?,
            reject_status: u16::try_from(reject_status?).ok()?,
        })
    }

    fn rules(&mut self, value: Option<&Value>) -> Option<Vec<Rule>> {
        let Some(value) = value else {
            self.error("rules", "required: a non-empty list of rules");
            return None;
        };
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
            if let Some(rule) = self.rule(&path, item) {
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

    fn rule(&mut self, path: &str, value: &Value) -> Option<Rule> {
        let obj = self.object(path, value)?;
        self.known_fields(
            path,
            obj,
            &["name", "rate", "burst", "max_queue_delay", "match"],
        );
        let name = self.name(&format!("{path}.name"), obj.get("name"));
        let interval = match obj.get("rate") {
            None => {
                self.error(
                    &format!("{path}.rate"),
                    "required: \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second",
                );
                None
            }
            Some(v) => parse_rate(v)
                .map_err(|e| self.error(&format!("{path}.rate"), e))
                .ok(),
        };
        let burst = self.integer(&format!("{path}.burst"), obj.get("burst"), 0, MAX_BURST, 0);
        let max_delay = match obj.get("max_queue_delay") {
            None => Some(DEFAULT_MAX_QUEUE_DELAY_NS),
            Some(v) => parse_duration(v)
                .map_err(|e| self.error(&format!("{path}.max_queue_delay"), e))
                .ok(),
        };
        let matcher = match obj.get("match") {
            None => Some(Match::default()),
            Some(v) => self.matcher(&format!("{path}.match"), v),
        };
        Some(Rule {
            name: name?,
            schedule: Schedule::new(interval?, burst?, max_delay?),
            matcher: matcher?,
        })
    }

    fn name(&mut self, path: &str, value: Option<&Value>) -> Option<String> {
        let ok = |s: &str| {
            !s.is_empty()
                && s.len() <= MAX_NAME_LEN
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        match value {
            Some(Value::String(s)) if ok(s) => Some(s.clone()),
            Some(other) => {
                self.error(
                    path,
                    format!(
                    "must be 1 to {MAX_NAME_LEN} characters of A-Z, a-z, 0-9, '_' or '-', got {}",
                    describe(other)
                ),
                );
                None
            }
            None => {
                self.error(path, "required: the rule's name (used in metric names)");
                None
            }
        }
    }

    fn matcher(&mut self, path: &str, value: &Value) -> Option<Match> {
        let obj = self.object(path, value)?;
        self.known_fields(path, obj, &["path_prefix"]);
        let path_prefix = match obj.get("path_prefix") {
            None => None,
            Some(Value::String(p)) if p.starts_with('/') => Some(p.clone()),
            Some(other) => {
                self.error(
                    &format!("{path}.path_prefix"),
                    format!(
                        "must be a string starting with '/', got {}",
                        describe(other)
                    ),
                );
                return None;
            }
        };
        Some(Match { path_prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NS_PER_MS;

    fn errors(json: &str) -> Vec<String> {
        match parse(json.as_bytes()) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn the_contract_example_parses() {
        let c: Config =
            r#"{"rules": [{"name": "default", "rate": "500/s", "burst": 0, "max_queue_delay": "1s",
              "match": {"path_prefix": "/"}}], "max_held_per_worker": 10000, "reject_status": 429}"#
                .parse()
                .unwrap();
        assert_eq!(c.max_held_per_worker, 10_000);
        assert_eq!(c.reject_status, 429);
        assert_eq!(c.rules.len(), 1);
        assert_eq!(c.rules[0].name, "default");
        assert_eq!(
            c.rules[0].schedule,
            Schedule::new(2 * NS_PER_MS, 0, 1000 * NS_PER_MS)
        );
        assert_eq!(c.rules[0].matcher.path_prefix.as_deref(), Some("/"));
    }

    #[test]
    fn defaults() {
        let c: Config = r#"{"rules": [{"name": "a", "rate": 10}]}"#.parse().unwrap();
        assert_eq!(c.max_held_per_worker, DEFAULT_MAX_HELD_PER_WORKER);
        assert_eq!(c.reject_status, 429);
        assert_eq!(
            c.rules[0].schedule,
            Schedule::new(100 * NS_PER_MS, 0, DEFAULT_MAX_QUEUE_DELAY_NS)
        );
        assert_eq!(c.rules[0].matcher, Match::default());
        assert!(!c.needs_path());
    }

    #[test]
    fn first_matching_rule_wins() {
        let c: Config = r#"{"rules": [
            {"name": "api", "rate": 10, "match": {"path_prefix": "/api"}},
            {"name": "api-v2", "rate": 10, "match": {"path_prefix": "/api/v2"}},
            {"name": "static", "rate": 10, "match": {"path_prefix": "/static/"}}]}"#
            .parse()
            .unwrap();
        assert!(c.needs_path());
        assert_eq!(c.find_rule(Some("/api/v2/x")), Some(0));
        assert_eq!(c.find_rule(Some("/static/a.css")), Some(2));
        assert_eq!(c.find_rule(Some("/other")), None);
        assert_eq!(c.find_rule(None), None);
    }

    /// Table of bad configs and the exact messages they produce.
    #[test]
    fn bad_configs_name_the_field() {
        let table: &[(&str, &[&str])] = &[
            (r#"{"rules": [{"name": "a", "rate": 1, "colour": "red"}]}"#,
             &["rules[0].colour: unknown field (expected one of: name, rate, burst, max_queue_delay, match)"]),
            (r#"{"rules": [{"name": "a", "rate": 1}], "max_held": 5}"#,
             &["max_held: unknown field (expected one of: rules, max_held_per_worker, reject_status)"]),
            (r#"{"rules": [{"name": "a", "rate": 1, "burst": -1}]}"#,
             &["rules[0].burst: must be an integer from 0 to 1000000, got -1"]),
            (r#"{"rules": [{"name": "a", "rate": "fast"}]}"#,
             &["rules[0].rate: expected \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, got \"fast\""]),
            (r#"{"rules": []}"#, &["rules: must contain at least one rule"]),
            (r#"{}"#, &["rules: required: a non-empty list of rules"]),
            (r#"{"rules": {}}"#, &["rules: expected a non-empty list of rules, got an object"]),
            (r#"[]"#, &["(config): expected an object, got an array"]),
            (r#"{"rules": [{"rate": 1}]}"#, &["rules[0].name: required: the rule's name (used in metric names)"]),
            (r#"{"rules": [{"name": "a b", "rate": 1}]}"#,
             &["rules[0].name: must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-', got \"a b\""]),
            (r#"{"rules": [{"name": "a"}]}"#,
             &["rules[0].rate: required: \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second"]),
            (r#"{"rules": [{"name": "a", "rate": 1}, {"name": "a", "rate": 2}]}"#,
             &["rules[1].name: duplicate rule name \"a\""]),
            (r#"{"rules": [{"name": "a", "rate": 1, "max_queue_delay": 5}]}"#,
             &["rules[0].max_queue_delay: expected a string with a unit such as \"250ms\", \"2s\" or \"1m\", got 5"]),
            (r#"{"rules": [{"name": "a", "rate": 1, "match": {"path_prefix": "api"}}]}"#,
             &["rules[0].match.path_prefix: must be a string starting with '/', got \"api\""]),
            (r#"{"rules": [{"name": "a", "rate": 1, "match": {"path": "/"}}]}"#,
             &["rules[0].match.path: unknown field (expected one of: path_prefix)"]),
            (r#"{"rules": [{"name": "a", "rate": 1}], "reject_status": 200}"#,
             &["reject_status: must be an integer from 400 to 599, got 200"]),
            (r#"{"rules": [{"name": "a", "rate": 1}], "max_held_per_worker": 0}"#,
             &["max_held_per_worker: must be an integer from 1 to 1000000, got 0"]),
            (r#"{"rules": [{"name": "a", "rate": 1}], "max_held_per_worker": 1.5}"#,
             &["max_held_per_worker: must be an integer from 1 to 1000000, got 1.5"]),
            // Every problem is reported, one line each.
            (r#"{"rules": [{"name": "a", "rate": "fast", "burst": -1}, "x"], "reject_status": "429"}"#,
             &["reject_status: must be an integer from 400 to 599, got \"429\"",
               "rules[0].rate: expected \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, got \"fast\"",
               "rules[0].burst: must be an integer from 0 to 1000000, got -1",
               "rules[1]: expected an object, got \"x\""]),
        ];
        for (json, expected) in table {
            assert_eq!(&errors(json), expected, "config: {json}");
        }
    }

    #[test]
    fn invalid_json_is_one_clear_error() {
        let e = errors("{\"rules\": [");
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("(config): invalid JSON: EOF while parsing"),
            "{}",
            e[0]
        );
    }
}
