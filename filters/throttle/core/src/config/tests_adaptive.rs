//! The `adaptive` block: what it accepts, and every refusal naming its field.

use super::*;
use crate::adaptive::{Mode, Settings};
use crate::NS_PER_MS;

fn errors(json: &str) -> Vec<String> {
    match parse(json.as_bytes()) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

fn ok(json: &str) -> Config {
    parse(json.as_bytes()).unwrap_or_else(|e| panic!("refused {json}: {e:?}"))
}

#[test]
fn the_issue_example_parses() {
    let c = ok(
        r#"{"rules": [{"name": "api", "rate": "200/s", "max_queue_delay": "2s",
                  "adaptive": {"min_rate": "10/s", "max_rate": "2000/s"}}]}"#,
    );
    assert_eq!(
        c.rules[0].adaptive,
        Some(Settings {
            min_interval_ns: NS_PER_MS / 2,
            max_interval_ns: 100 * NS_PER_MS,
            mode: Mode::Enforce,
        })
    );
    assert_eq!(
        c.rules[0].describe(),
        "api: rate 200/1s (interval 5000000ns), burst 0, max_queue_delay 2000ms, \
         adaptive enforce, learned within 10/s to 2000/s"
    );
    let c = ok(
        r#"{"rules": [{"name": "api", "rate": 5, "adaptive": {"min_rate": 5, "max_rate": "5/s", "mode": "observe"}}]}"#,
    );
    assert_eq!(c.rules[0].adaptive.map(|a| a.mode), Some(Mode::Observe));
    // Bounds below 1/s are shown in their own unit, not as 0.00/s; 1% of the rate is accepted.
    let c = ok(
        r#"{"rules": [{"name": "a", "rate": "100/m", "adaptive": {"min_rate": "1/m", "max_rate": "2/s"}}]}"#,
    );
    assert!(
        c.rules[0]
            .describe()
            .ends_with("adaptive enforce, learned within 1/m to 2/s"),
        "{}",
        c.rules[0].describe()
    );
    assert_eq!(
        ok(r#"{"rules": [{"name": "a", "rate": 5}]}"#).rules[0].adaptive,
        None
    );
}

#[test]
fn allowed_combinations() {
    // The shared rate of a key_quota rule is learned; each key's quota stays.
    let c = ok(
        r#"{"rules": [{"name": "t", "rate": "100/s", "key": {"header": "x-tenant"}, "key_quota": "20/s",
                  "adaptive": {"min_rate": "10/s", "max_rate": "1000/s"}}]}"#,
    );
    assert!(c.rules[0].adaptive.is_some() && c.rules[0].quota.is_some());
    // Priority classes paced at the learned rate (the classes' slot source
    // reads the learned interval, `rate::Gcra`).
    let c = ok(
        r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": 1, "max_rate": 20},
             "classes": [{"name": "hi", "match": {"path_prefix": "/hi"}}, {"name": "rest"}]}]}"#,
    );
    assert!(c.rules[0].learns() && c.rules[0].classes.len() == 2);
    // A concurrency cap beside a learned rate; dry-run.
    ok(
        r#"{"rules": [{"name": "c", "rate": 50, "concurrency": 8, "dry_run": true,
           "adaptive": {"min_rate": 1, "max_rate": 100}}]}"#,
    );
}

#[test]
fn bad_adaptive_blocks_name_the_field() {
    let cases: &[(&str, &[&str])] = &[
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"max_rate": 20}}]}"#,
         &["rules[0].adaptive.min_rate: required: the lowest rate it may learn"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": 1}}]}"#,
         &["rules[0].adaptive.max_rate: required: the highest rate it may learn"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": "fast", "max_rate": 20}}]}"#,
         &["rules[0].adaptive.min_rate: expected \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, got \"fast\""]),
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": 1, "max_rate": 20, "mode": "learn"}}]}"#,
         &["rules[0].adaptive.mode: must be one of \"enforce\", \"observe\", got \"learn\""]),
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": 1, "max_rate": 20, "gain": 2}}]}"#,
         &["rules[0].adaptive.gain: unknown field (expected one of: min_rate, max_rate, mode)"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": true}]}"#,
         &["rules[0].adaptive: expected an object, got true"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": 30, "max_rate": 20}}]}"#,
         &["rules[0].adaptive.min_rate: must not exceed `max_rate`",
           "rules[0].adaptive.min_rate: must not exceed `rate` (the rate it starts at lies within its bounds)"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": 20, "max_rate": 30}}]}"#,
         &["rules[0].adaptive.min_rate: must not exceed `rate` (the rate it starts at lies within its bounds)"]),
        (r#"{"rules": [{"name": "a", "rate": "60/m", "adaptive": {"min_rate": "1/m", "max_rate": "59/m"}}]}"#,
         &["rules[0].adaptive.max_rate: must not be below `rate` (the rate it starts at lies within its bounds)"]),
        // Red team 3, finding 8: 1/h under a 100/s rule was accepted and shown as 0.00/s.
        (r#"{"rules": [{"name": "a", "rate": "100/s", "adaptive": {"min_rate": "1/h", "max_rate": "1000/s"}}]}"#,
         &["rules[0].adaptive.min_rate: must be at least 1% of `rate` (100/s), got 1/h: a floor the learner would take minutes to climb back from, with few answers to learn from at that rate; set it to what the service must always get"]),
        (r#"{"rules": [{"name": "a", "concurrency": 4, "adaptive": {"min_rate": 1, "max_rate": 20}}]}"#,
         &["rules[0].adaptive: requires `rate` (the rate it starts at, before anything is learned)"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "key": {"header": "x-user"}, "adaptive": {"min_rate": 1, "max_rate": 20}}]}"#,
         &["rules[0].adaptive: cannot be combined with `key` without `key_quota` (the learned rate is the upstream's, one for all keys: add `key_quota` to share it fairly among them)"]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "rate": 10, "scope": "cluster", "adaptive": {"min_rate": 1, "max_rate": 20}}]}"#,
         &["rules[0].adaptive: cannot be combined with `scope: \"cluster\"` (one learned rate for a fleet needs every proxy's answers in one place; on a sidecar's inbound side, where it belongs, the process scope already covers the one replica behind it)"]),
    ];
    for (json, want) in cases {
        assert_eq!(errors(json), *want, "{json}");
    }
}

#[test]
fn every_adaptive_field_is_validated() {
    for f in spec::ADAPTIVE_FIELDS {
        let mut cfg = serde_json::json!({"rules": [{"name": "a", "rate": 10,
            "adaptive": {"min_rate": 1, "max_rate": 20}}]});
        cfg["rules"][0]["adaptive"][f.name] = serde_json::json!({"wrong": true});
        let errs = errors(&cfg.to_string());
        let want = format!("rules[0].adaptive.{}", f.name);
        assert!(errs.iter().any(|e| e.starts_with(&want)), "{errs:?}");
    }
}
