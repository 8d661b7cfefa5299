use super::*;
use crate::clock::{NS_PER_MS, NS_PER_S};
use crate::matcher::HeaderMatch;
use crate::ratelimit::HeaderStyle;

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
fn the_contract_example_parses() {
    let c = ok(
        r#"{"rules": [{"name": "default", "rate": "500/s", "burst": 0, "max_queue_delay": "1s",
          "match": {"path_prefix": "/"}}], "max_held_per_worker": 10000, "reject_status": 429}"#,
    );
    assert_eq!(c.max_held_per_worker, 10_000);
    let r = &c.rules[0];
    assert_eq!(r.name, "default");
    assert_eq!(r.reject_status, 429);
    assert_eq!(
        r.schedule,
        Some(Schedule::new(2 * NS_PER_MS, 0, 1000 * NS_PER_MS))
    );
    assert_eq!(
        r.rate_window,
        Some(RateWindow {
            count: 500,
            window_s: 1
        })
    );
    // "/" is every request: no condition at all, and no header is read.
    assert!(r.matcher.is_empty());
    assert!(c.first_rule_takes_all());
    assert_eq!((r.concurrency, &r.key, r.dry_run), (None, &None, false));
}

#[test]
fn defaults() {
    let c = ok(r#"{"rules": [{"name": "a", "rate": 10}]}"#);
    assert_eq!(c.max_held_per_worker, 10_000);
    assert_eq!(c.rate_limit_headers, HeaderStyle::Off);
    assert!(!c.dry_run_headers);
    let r = &c.rules[0];
    assert_eq!(r.reject_status, 429);
    assert_eq!(
        r.schedule,
        Some(Schedule::new(
            100 * NS_PER_MS,
            0,
            spec::MAX_QUEUE_DELAY.duration_default_ns()
        ))
    );
    assert_eq!(r.max_delay_ns, NS_PER_S);
    assert_eq!(r.key_slots, 4096);
    assert!(r.matcher.is_empty());
    assert!(c.first_rule_takes_all());
}

#[test]
fn global_settings_and_rule_overrides() {
    let c = ok(
        r#"{"reject_status": 503, "dry_run": true, "rate_limit_headers": true, "rules": [
        {"name": "a", "rate": 1},
        {"name": "b", "rate": 1, "reject_status": 429, "dry_run": false}]}"#,
    );
    assert_eq!(c.rate_limit_headers, HeaderStyle::Ietf);
    assert_eq!((c.rules[0].reject_status, c.rules[0].dry_run), (503, true));
    assert_eq!((c.rules[1].reject_status, c.rules[1].dry_run), (429, false));
}

#[test]
fn every_match_condition_and_key() {
    let c = ok(
        r#"{"rules": [{"name": "t", "rate": "5/s", "key": {"header": "X-Tenant"}, "key_slots": 16,
        "match": {"path_prefix": "/api/", "path_exact": "/api/x", "methods": ["get", "POST"],
                  "headers": {"X-Env": "prod", "authorization": true, "x-debug": false},
                  "authority": "Shop.Example"}},
        {"name": "ip", "rate": 1, "key": {"source": "address"}},
        {"name": "p", "rate": 1, "key": {"path": true}},
        {"name": "h", "rate": 1, "key": {"authority": true}}]}"#,
    );
    let m = &c.rules[0].matcher;
    assert_eq!(m.methods, vec!["GET", "POST"]);
    assert_eq!(
        m.headers,
        vec![
            ("x-env".to_string(), HeaderMatch::Exact("prod".into())),
            ("authorization".to_string(), HeaderMatch::Present),
            ("x-debug".to_string(), HeaderMatch::Absent),
        ]
    );
    assert_eq!(
        m.authority,
        Some(crate::matcher::AuthorityMatch {
            host: "shop.example".into(),
            port: None
        })
    );
    assert_eq!(c.rules[0].key, Some(KeySource::Header("x-tenant".into())));
    assert_eq!(c.rules[0].key_slots, 16);
    assert_eq!(c.rules[1].key, Some(KeySource::SourceAddress));
    assert_eq!(c.rules[2].key, Some(KeySource::Path));
    assert_eq!(c.rules[3].key, Some(KeySource::Authority));
    assert!(!c.first_rule_takes_all());
}

#[test]
fn key_quota_makes_rate_shared() {
    let c = ok(
        r#"{"rules": [{"name": "t", "rate": "100/s", "key": {"header": "x-tenant"}, "key_quota": "20/s",
                              "max_queue_delay": "2s"}]}"#,
    );
    assert_eq!(
        c.rules[0].quota,
        Some(Schedule::new(50 * NS_PER_MS, 0, 2 * NS_PER_S))
    );
    assert_eq!(
        c.rules[0].schedule,
        Some(Schedule::new(10 * NS_PER_MS, 0, 2 * NS_PER_S))
    );
}

#[test]
fn concurrency_alone_or_with_a_rate() {
    let c = ok(
        r#"{"rules": [{"name": "c", "concurrency": 8, "max_queue_delay": "5s"},
                              {"name": "rc", "rate": "100/s", "concurrency": 2}]}"#,
    );
    assert_eq!(
        (c.rules[0].concurrency, c.rules[0].schedule),
        (Some(8), None)
    );
    assert_eq!(c.rules[0].max_delay_ns, 5 * NS_PER_S);
    assert_eq!(c.rules[1].concurrency, Some(2));
    assert!(c.rules[1].schedule.is_some());
}

/// Table of bad configs and the exact messages they produce.
#[test]
fn bad_configs_name_the_field() {
    let table: &[(&str, &[&str])] = &[
        (r#"{"rules": [{"name": "a", "rate": 1, "colour": "red"}]}"#,
         &["rules[0].colour: unknown field (expected one of: name, rate, burst, max_queue_delay, concurrency, match, key, key_quota, key_slots, reject_status, dry_run, scope, expected_replicas, on_engine_failure, classes, adaptive)"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "key_quota": "1/s"}]}"#, &["rules[0].key_quota: requires `key` and `rate`"]),
        (r#"{"rules": [{"name": "a", "concurrency": 1, "key": {"path": true}, "key_quota": "1/s"}]}"#,
         &["rules[0].key_quota: requires `key` and `rate`",
           "rules[0].concurrency: cannot be combined with `key` (concurrency is per rule)"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "key": {"path": true}, "key_quota": "often"}]}"#,
         &["rules[0].key_quota: expected \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, got \"often\""]),
        (r#"{"rules": [{"name": "a", "rate": 1}], "": 5}"#,
         &["\"\": unknown field (expected one of: rules, max_held_per_worker, reject_status, dry_run, dry_run_headers, rate_limit_headers, engine)"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "": 5}]}"#,
         &["rules[0].\"\": unknown field (expected one of: name, rate, burst, max_queue_delay, concurrency, match, key, key_quota, key_slots, reject_status, dry_run, scope, expected_replicas, on_engine_failure, classes, adaptive)"]),
        (r#"{"rules": [{"name": "a", "rate": 1}], "max_held": 5}"#,
         &["max_held: unknown field (expected one of: rules, max_held_per_worker, reject_status, dry_run, dry_run_headers, rate_limit_headers, engine)"]),
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
        (r#"{"rules": [{"name": "a"}]}"#, &["rules[0].rate: required: a rule needs `rate`, `concurrency`, or both"]),
        (r#"{"rules": [{"name": "a", "rate": 1}, {"name": "a", "rate": 2}]}"#,
         &["rules[1].name: duplicate rule name \"a\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "max_queue_delay": 5}]}"#,
         &["rules[0].max_queue_delay: expected a string with a unit such as \"250ms\", \"2s\", \"1m\" or \"1h\", got 5"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "max_queue_delay": "2h"}]}"#,
         &["rules[0].max_queue_delay: must be from 0 to 1h, got \"2h\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "rate": 2}]}"#,
         &["rules[0].rate: duplicate field (JSON objects must not repeat a name; which one would win is unclear)"]),
        (r#"{"rules": [{"name": "a", "rate": "10/s", "key": {"path": true}, "key_quota": "20/s"}]}"#,
         &["rules[0].key_quota: must not exceed `rate` (a key's share of the shared rate cannot be larger than the rate)"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"headers": {"": true}}}]}"#,
         &["rules[0].match.headers.\"\": must be a header name"]),
        (r#"{"rules": [{"name": "a", "rate": 1}], "rate_limit_headers": "draft"}"#,
         &["rate_limit_headers: must be true, false, \"ietf\" or \"legacy\", got \"draft\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"path_prefix": "api"}}]}"#,
         &["rules[0].match.path_prefix: must be a string starting with '/', got \"api\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"path": "/"}}]}"#,
         &["rules[0].match.path: unknown field (expected one of: path_prefix, path_exact, methods, headers, authority, principal)"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"methods": []}}]}"#,
         &["rules[0].match.methods: must be a non-empty list of method names such as [\"GET\", \"POST\"], got an array"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"methods": ["GET", 1]}}]}"#,
         &["rules[0].match.methods[1]: must be a method name such as \"GET\", got 1"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"headers": {"x-a": 1}}}]}"#,
         &["rules[0].match.headers.x-a: must be an exact value (string), true (present) or false (absent), got 1"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"headers": {"a b": true}}}]}"#,
         &["rules[0].match.headers.a b: must be a header name"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "match": {"authority": ""}}]}"#,
         &["rules[0].match.authority: must be a non-empty string, got \"\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "key": {}}]}"#,
         &["rules[0].key: must have exactly one of: header, source, path, authority"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "key": {"header": "x", "path": true}}]}"#,
         &["rules[0].key: must have exactly one of: header, source, path, authority"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "key": {"source": "port"}}]}"#,
         &["rules[0].key.source: must be \"address\" or \"principal\", got \"port\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "key": {"path": "yes"}}]}"#,
         &["rules[0].key.path: must be true, got \"yes\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "key": {"cookie": "s"}}]}"#,
         &["rules[0].key.cookie: unknown field (expected one of: header, source, path, authority)"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "key_slots": 8}]}"#, &["rules[0].key_slots: requires `key`"]),
        (r#"{"rules": [{"name": "a", "concurrency": 2, "burst": 3}]}"#, &["rules[0].burst: requires `rate`"]),
        (r#"{"rules": [{"name": "a", "concurrency": 0}]}"#,
         &["rules[0].concurrency: must be an integer from 1 to 1000000, got 0"]),
        (r#"{"rules": [{"name": "a", "concurrency": 2, "key": {"path": true}}]}"#,
         &["rules[0].concurrency: cannot be combined with `key` (concurrency is per rule)"]),
        (r#"{"rules": [{"name": "a", "rate": 1, "dry_run": "yes"}]}"#,
         &["rules[0].dry_run: must be true or false, got \"yes\""]),
        (r#"{"rules": [{"name": "a", "rate": 1, "reject_status": 302}]}"#,
         &["rules[0].reject_status: must be an integer from 400 to 599, got 302"]),
        (r#"{"rules": [{"name": "a", "rate": 1}], "reject_status": 200}"#,
         &["reject_status: must be an integer from 400 to 599, got 200"]),
        (r#"{"rules": [{"name": "a", "rate": 1}], "max_held_per_worker": 0}"#,
         &["max_held_per_worker: must be an integer from 1 to 1000000, got 0"]),
        (r#"{"rules": [{"name": "a", "rate": 1}], "max_held_per_worker": 1.5}"#,
         &["max_held_per_worker: must be an integer from 1 to 1000000, got 1.5"]),
        (r#"{"rules": [{"name": "a", "rate": 1}], "rate_limit_headers": 1}"#,
         &["rate_limit_headers: must be true, false, \"ietf\" or \"legacy\", got 1"]),
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

/// A value of the wrong type for a field of this kind.
fn wrong_value(kind: spec::Kind) -> serde_json::Value {
    use serde_json::json;
    match kind {
        // An object field given a list, a list field given an object.
        spec::Kind::Object(_) | spec::Kind::OneOf(_) | spec::Kind::HeaderMatches => {
            json!(["wrong"])
        }
        spec::Kind::List(_) | spec::Kind::BoundedList(..) => json!({"wrong": true}),
        // Everything else refuses an object.
        _ => json!({"wrong": true}),
    }
}

/// Where a field list lives in a config: 0 top level, 1 a rule, 2 its
/// match, 3 its key, 4 its first class.
fn with_field(level: usize, name: &str, value: serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    let mut cfg = json!({"rules": [{"name": "a", "rate": 1}]});
    let target = match level {
        0 => &mut cfg,
        1 => &mut cfg["rules"][0],
        2 => {
            cfg["rules"][0]["match"] = json!({});
            &mut cfg["rules"][0]["match"]
        }
        3 => {
            cfg["rules"][0]["key"] = json!({});
            &mut cfg["rules"][0]["key"]
        }
        _ => {
            cfg["rules"][0]["classes"] = json!([{"name": "c"}]);
            &mut cfg["rules"][0]["classes"][0]
        }
    };
    target[name] = value;
    cfg
}

/// Every field the spec lists is read by the validator: set to a value of
/// the wrong type, each one is refused with an error naming it. (A field in
/// the spec that the validator never reads would pass silently, and the
/// schema and README would promise what the filter ignores.)
#[test]
fn every_spec_field_is_validated() {
    let prefix = [
        "",
        "rules[0].",
        "rules[0].match.",
        "rules[0].key.",
        "rules[0].classes[0].",
    ];
    let mut checked = 0;
    let levels = [
        spec::CONFIG_FIELDS,
        spec::RULE_FIELDS,
        spec::MATCH_FIELDS,
        spec::KEY_FIELDS,
        spec::CLASS_FIELDS,
    ];
    for (level, fields) in levels.iter().enumerate() {
        for f in *fields {
            let cfg = with_field(level, f.name, wrong_value(f.kind)).to_string();
            let errs = parse(cfg.as_bytes()).err().unwrap_or_default();
            let want = format!("{}{}", prefix[level], f.name);
            assert!(
                errs.iter()
                    .any(|e| e.field == want || e.field.starts_with(&format!("{want}."))),
                "{cfg}: no error names {want}: {errs:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 7 + 16 + 6 + 4 + 4);
}

/// The committed JSON Schema and README table are exactly what the spec
/// generates (regenerate with `make config-docs`).
#[test]
fn generated_docs_have_not_drifted() {
    let schema = include_str!("../../../config.schema.json");
    let want = serde_json::to_string_pretty(&spec::json_schema()).unwrap() + "\n";
    assert!(
        schema == want,
        "filters/throttle/config.schema.json is stale: run `make config-docs`"
    );
    let readme = include_str!("../../../README.md");
    let start = readme
        .find(README_START)
        .expect("README has the reference start marker")
        + README_START.len();
    let end = readme
        .find(README_END)
        .expect("README has the reference end marker");
    assert!(
        readme[start..end].trim() == spec::reference_table().trim(),
        "filters/throttle/README.md configuration reference is stale: run `make config-docs`"
    );
}

const README_START: &str = "<!-- config-reference:start (generated by `make config-docs`) -->";
const README_END: &str = "<!-- config-reference:end -->";

const ENGINE: &str = r#""engine": {"cluster": "throttle_engine"}"#;

#[test]
fn the_cluster_contract_example_parses() {
    let c = ok(
        r#"{"engine": {"cluster": "throttle_engine", "timeout": "50ms"},
        "rules": [{"name": "orders", "rate": "300/s", "max_queue_delay": "2s",
                   "scope": "cluster", "expected_replicas": 3, "on_engine_failure": "local_share"}]}"#,
    );
    assert_eq!(
        c.engine,
        Some(EngineConfig {
            cluster: "throttle_engine".into(),
            timeout_ns: 50 * NS_PER_MS,
            fallback_after_ns: 250 * NS_PER_MS,
            domain: "envoy_throttle".into(),
            max_clock_skew_ns: 100 * NS_PER_MS,
        })
    );
    assert_eq!(
        c.rules[0].cluster,
        Some(ClusterScope {
            expected_replicas: 3,
            on_engine_failure: OnEngineFailure::LocalShare
        })
    );
}

#[test]
fn cluster_defaults_and_every_engine_field() {
    let c = ok(&format!(
        r#"{{{ENGINE}, "rules": [{{"name": "a", "rate": 10, "scope": "cluster"}}, {{"name": "b", "rate": 10}}]}}"#
    ));
    assert_eq!(
        c.rules[0].cluster,
        Some(ClusterScope {
            expected_replicas: 1,
            on_engine_failure: OnEngineFailure::LocalShare
        })
    );
    assert_eq!(c.rules[1].cluster, None, "scope defaults to process");
    let e = c.engine.unwrap();
    assert_eq!(
        (e.timeout_ns, e.fallback_after_ns, e.max_clock_skew_ns),
        (50 * NS_PER_MS, 250 * NS_PER_MS, 100 * NS_PER_MS)
    );
    let c = ok(
        r#"{"engine": {"cluster": "rl", "timeout": "20ms", "fallback_after": "1s", "domain": "d", "max_clock_skew": "10ms"},
        "rules": [{"name": "a", "rate": "1/s", "scope": "cluster", "on_engine_failure": "deny"},
                  {"name": "b", "rate": 5, "scope": "cluster", "on_engine_failure": "local_full"}]}"#,
    );
    let e = c.engine.unwrap();
    assert_eq!(
        (
            e.cluster.as_str(),
            e.timeout_ns,
            e.fallback_after_ns,
            e.domain.as_str(),
            e.max_clock_skew_ns
        ),
        ("rl", 20 * NS_PER_MS, NS_PER_S, "d", 10 * NS_PER_MS)
    );
    assert_eq!(
        c.rules[0].cluster.map(|s| s.on_engine_failure),
        Some(OnEngineFailure::Deny)
    );
    assert_eq!(
        c.rules[1].cluster.map(|s| s.on_engine_failure),
        Some(OnEngineFailure::LocalFull)
    );
    // An engine block alone (no cluster rule) is accepted: it is simply unused.
    assert!(ok(&format!(
        r#"{{{ENGINE}, "rules": [{{"name": "a", "rate": 1}}]}}"#
    ))
    .engine
    .is_some());
}

#[test]
fn bad_cluster_configs_name_the_field() {
    let table: &[(&str, &[&str])] = &[
        (r#"{"rules": [{"name": "orders", "rate": 10, "scope": "cluster"}]}"#,
         &["rules[0].scope: \"cluster\" requires the top-level `engine` block (`engine.cluster` names the Envoy cluster of the rate limit service)"]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "rate": 10, "scope": "global"}]}"#,
         &["rules[0].scope: must be one of \"process\", \"cluster\", got \"global\""]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "rate": 10, "scope": "cluster", "key": {"path": true}}]}"#,
         &["rules[0].scope: \"cluster\" cannot be combined with `key` (per-key rules are process-only)"]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "rate": 10, "concurrency": 2, "scope": "cluster"}]}"#,
         &["rules[0].scope: \"cluster\" cannot be combined with `concurrency` (concurrency is process-only)"]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "concurrency": 2, "scope": "cluster"}]}"#,
         &["rules[0].scope: \"cluster\" cannot be combined with `concurrency` (concurrency is process-only)"]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "rate": "30/m", "scope": "cluster"}]}"#,
         &["rules[0].rate: scope \"cluster\" needs a rate of at least 1/s (one slot per second or more), got one every 2.000 s"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "expected_replicas": 3}]}"#,
         &["rules[0].expected_replicas: requires `scope: \"cluster\"`"]),
        (r#"{"rules": [{"name": "a", "rate": 10, "scope": "process", "on_engine_failure": "deny"}]}"#,
         &["rules[0].on_engine_failure: requires `scope: \"cluster\"`"]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "rate": 10, "scope": "cluster", "expected_replicas": 0}]}"#,
         &["rules[0].expected_replicas: must be an integer from 1 to 10000, got 0"]),
        (r#"{"engine": {"cluster": "rl"}, "rules": [{"name": "a", "rate": 10, "scope": "cluster", "on_engine_failure": "open"}]}"#,
         &["rules[0].on_engine_failure: must be one of \"local_share\", \"deny\", \"local_full\", got \"open\""]),
        (r#"{"engine": {}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.cluster: required: the Envoy cluster of the rate limit service"]),
        (r#"{"engine": "rl", "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine: expected an object, got \"rl\""]),
        (r#"{"engine": {"cluster": ""}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.cluster: must be a non-empty string, got \"\""]),
        (r#"{"engine": {"cluster": "rl", "timeout": "0s"}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.timeout: must be from 1ms to 1s, got \"0s\""]),
        (r#"{"engine": {"cluster": "rl", "timeout": "2s"}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.timeout: must be from 1ms to 1s, got \"2s\""]),
        (r#"{"engine": {"cluster": "rl", "timeout": 50}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.timeout: expected a string with a unit such as \"250ms\", \"2s\", \"1m\" or \"1h\", got 50"]),
        (r#"{"engine": {"cluster": "rl", "fallback_after": "2m"}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.fallback_after: must be from 0s to 1m, got \"2m\""]),
        (r#"{"engine": {"cluster": "rl", "max_clock_skew": "11s"}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.max_clock_skew: must be from 0s to 10s, got \"11s\""]),
        (r#"{"engine": {"cluster": "rl", "domain": 7}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.domain: must be a non-empty string, got 7"]),
        (r#"{"engine": {"cluster": "rl", "host": "x"}, "rules": [{"name": "a", "rate": 10}]}"#,
         &["engine.host: unknown field (expected one of: cluster, timeout, fallback_after, domain, max_clock_skew)"]),
        (r#"{"engine": {"cluster": "rl", "timeout": "500ms"}, "rules": [{"name": "a", "rate": 10, "max_queue_delay": "10ms", "scope": "cluster"}]}"#,
         &["rules[0].max_queue_delay: 10 ms is shorter than engine.timeout (500 ms): a request waiting for grants from the engine could only be rejected; make it at least engine.timeout"]),
    ];
    for (json, expected) in table {
        assert_eq!(&errors(json), expected, "config: {json}");
    }
}

#[test]
fn the_configured_line_names_the_scope_and_the_engine_and_warns_of_an_unused_engine() {
    let c = parse(
        br#"{"engine": {"cluster": "rl", "domain": "d"}, "rules": [
            {"name": "a", "rate": 10, "scope": "cluster", "expected_replicas": 3},
            {"name": "b", "rate": 5}]}"#,
    )
    .unwrap();
    assert_eq!(
        c.describe(),
        vec![
            "a: rate 10/1s (interval 100000000ns), burst 0, max_queue_delay 1000ms, scope cluster (engine cluster \"rl\", domain \"d\", expected_replicas 3, on_engine_failure local_share)".to_string(),
            "b: rate 5/1s (interval 200000000ns), burst 0, max_queue_delay 1000ms".to_string(),
        ]
    );
    assert!(c.warnings().is_empty());
    let unused =
        parse(br#"{"engine": {"cluster": "rl"}, "rules": [{"name": "b", "rate": 5}]}"#).unwrap();
    assert_eq!(
        unused.warnings(),
        vec!["engine: no rule has scope \"cluster\", so the engine block is not used".to_string()]
    );
}

#[test]
fn the_validator_knows_exactly_the_engine_fields() {
    for f in spec::ENGINE_FIELDS {
        let cfg = format!(
            r#"{{"rules": [{{"name": "a", "rate": 1}}], "engine": {{"cluster": "x", "{}": null}}}}"#,
            f.name
        );
        let errs = parse(cfg.as_bytes()).err().unwrap_or_default();
        assert!(
            errs.iter().all(|e| !e.reason.starts_with("unknown field")),
            "{cfg}: {errs:?}"
        );
    }
}

/// The README's statistics table is what the stat table generates.
#[test]
fn the_statistics_table_has_not_drifted() {
    let readme = include_str!("../../../README.md");
    let start = "<!-- stats-reference:start (generated by `make config-docs`) -->";
    let i = readme
        .find(start)
        .expect("README has the stats start marker")
        + start.len();
    let j = readme
        .find("<!-- stats-reference:end -->")
        .expect("README has the stats end marker");
    assert!(
        readme[i..j].trim() == crate::stats::reference_table().trim(),
        "filters/throttle/README.md statistics table is stale: run `make config-docs`"
    );
}

/// A rule defines the stats of its features only (the glue defines a metric
/// for each, per rule, on every pod): a process-scope rule with a rate and
/// nothing else, 11 (not all 39).
#[test]
fn a_rule_defines_only_the_stats_of_its_features() {
    use crate::stats::{ClassStat, Stat};
    let engine = r#""engine": {"cluster": "e"}, "#;
    let classes =
        r#", "classes": [{"name": "a", "match": {"headers": {"x": "a"}}}, {"name": "b"}]"#;
    for (fields, want, per_class) in [
        ("", 11, 0),
        (r#", "dry_run": true"#, 5, 0),
        (r#", "concurrency": 4"#, 12, 0),
        (r#", "key": {"header": "x"}, "key_quota": "1/s""#, 11, 0),
        (classes, 11, 6),
        (&format!(r#"{classes}, "dry_run": true"#), 5, 6),
        (r#", "scope": "cluster""#, 28, 0),
        (
            r#", "adaptive": {"min_rate": "1/s", "max_rate": "20/s"}"#,
            19,
            0,
        ),
    ] {
        let c = ok(&format!(
            r#"{{{engine}"rules": [{{"name": "r", "rate": "10/s"{fields}}}]}}"#
        ));
        let rule = &c.rules[0];
        let defined = Stat::ALL.iter().filter(|s| s.applies(rule)).count();
        let by_class = ClassStat::ALL.iter().filter(|s| s.applies(rule)).count();
        assert_eq!((defined, by_class), (want, per_class), "{fields}");
    }
}

#[test]
fn the_classes_contract_example_parses() {
    let c = ok(
        r#"{"rules": [{"name": "api", "rate": "100/s", "max_queue_delay": "2s",
     "classes": [
       {"name": "critical", "match": {"headers": {"x-priority": "critical"}}},
       {"name": "normal"},
       {"name": "batch", "match": {"headers": {"x-priority": "batch"}},
        "min_share": 0.1, "max_queue_delay": "10s"}]}]}"#,
    );
    let k = &c.rules[0].classes;
    let names: Vec<&str> = k.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["critical", "normal", "batch"]);
    assert_eq!(
        (k[0].min_share_ppm, k[0].max_delay_ns),
        (0, 2 * NS_PER_S),
        "defaults: no floor, the rule's delay"
    );
    assert!(k[1].matcher.is_none());
    assert_eq!(
        (k[2].min_share_ppm, k[2].max_delay_ns),
        (100_000, 10 * NS_PER_S)
    );
    assert_eq!(
        c.rules[0].describe(),
        "api: rate 100/1s (interval 10000000ns), burst 0, max_queue_delay 2000ms, \
         classes critical (2000ms) > normal (2000ms) > batch (10000ms, min_share 0.1)"
    );
    // A request takes the first class that fits, else the default.
    let req = |h: Option<&str>| {
        let mut r = crate::matcher::FakeRequest::get("/");
        if let Some(v) = h {
            r = r.with_header("x-priority", v);
        }
        c.rules[0].class_of(&mut crate::matcher::Facts::new(r))
    };
    assert_eq!(req(Some("critical")), Some(0));
    assert_eq!(req(Some("batch")), Some(2));
    assert_eq!(req(Some("other")), Some(1));
    assert_eq!(req(None), Some(1));
}

#[test]
fn a_class_may_match_on_the_callers_principal() {
    let c = ok(r#"{"rules": [{"name": "api", "rate": 10, "classes": [
        {"name": "checkout", "match": {"principal": "spiffe://cluster.local/ns/shop/sa/checkout"}},
        {"name": "rest"}]}]}"#);
    let mut r = crate::matcher::FakeRequest::get("/");
    r.principal = Some("spiffe://cluster.local/ns/shop/sa/checkout".into());
    assert_eq!(
        c.rules[0].class_of(&mut crate::matcher::Facts::new(r)),
        Some(0)
    );
    let other = crate::matcher::FakeRequest::get("/");
    assert_eq!(
        c.rules[0].class_of(&mut crate::matcher::Facts::new(other)),
        Some(1)
    );
}

#[test]
fn bad_classes_name_the_field() {
    let rule = |classes: &str, extra: &str| {
        format!(r#"{{"rules": [{{"name": "api", "rate": 10{extra}, "classes": {classes}}}]}}"#)
    };
    #[rustfmt::skip]
    let table: &[(String, &[&str])] = &[
        (rule("[]", ""), &["rules[0].classes: must be a list of 1 to 8 classes, got 0 classes"]),
        (rule(&format!("[{}]", [r#"{"name": "x"}"#; 9].join(",")), ""),
         &["rules[0].classes: must be a list of 1 to 8 classes, got 9 classes"]),
        (rule(r#"{"name": "x"}"#, ""), &["rules[0].classes: must be a list of 1 to 8 classes, got an object"]),
        (rule(r#"[{"name": "a", "match": {"methods": ["GET"]}}]"#, ""),
         &["rules[0].classes: exactly one class must have no `match` (it takes the requests no other class fits), found 0"]),
        (rule(r#"[{"name": "a"}, {"name": "b"}]"#, ""),
         &["rules[0].classes: exactly one class must have no `match` (it takes the requests no other class fits), found 2: a, b"]),
        (rule(r#"[{"name": "a", "match": {"methods": ["GET"]}}, {"name": "a"}]"#, ""),
         &["rules[0].classes[1].name: duplicate class name \"a\""]),
        // Red team 3, finding 8: classes no request could take were accepted silently.
        (rule(r#"[{"name": "a", "match": {}}, {"name": "b"}]"#, ""),
         &["rules[0].classes[0].match: is empty: it fits every request, so no request would reach the classes after it nor the default class \"b\"; leave `match` out to make \"a\" the default class"]),
        (rule(r#"[{"name": "a", "match": {"methods": ["GET", "HEAD"], "headers": {"x-a": "1", "x-b": true}}},
                 {"name": "b", "match": {"headers": {"x-b": true, "x-a": "1"}, "methods": ["head", "GET"]}}, {"name": "c"}]"#, ""),
         &["rules[0].classes[1].match: the same as classes[0].match (\"a\"), which fits first: no request could ever take class \"b\""]),
        (rule(r#"[{"name": "a b"}]"#, ""),
         &["rules[0].classes[0].name: must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-', got \"a b\""]),
        (rule(r#"[{"name": "first-class"}]"#, ""),
         &["rules[0].classes[0].name: must not contain the word \"class\" (per-class metric names would be ambiguous), got \"first-class\""]),
        (rule(r#"[{"name": "a"}, {"name": "b", "match": {"methods": ["GET"]}, "min_share": 0.6}]"#, ""),
         &["rules[0].classes[1].min_share: must be a number from 0 to 0.5, got 0.6"]),
        (rule(r#"[{"name": "a", "min_share": "10%"}]"#, ""),
         &["rules[0].classes[0].min_share: must be a number from 0 to 0.5, got \"10%\""]),
        (rule(r#"[{"name": "a", "min_share": 0.5}, {"name": "b", "match": {"methods": ["GET"]}, "min_share": 0.5},
                 {"name": "c", "match": {"methods": ["PUT"]}, "min_share": 0.25}]"#, ""),
         &["rules[0].classes: the classes' `min_share` add up to 1.25; they must add up to at most 1"]),
        (rule(r#"[{"name": "a", "max_queue_delay": "2h"}]"#, ""),
         &["rules[0].classes[0].max_queue_delay: must be from 0 to 1h, got \"2h\""]),
        (rule(r#"[{"name": "a", "colour": 1}]"#, ""),
         &["rules[0].classes[0].colour: unknown field (expected one of: name, match, min_share, max_queue_delay)"]),
        (rule(r#"[{"name": "a", "match": {"principal": ""}}]"#, ""),
         &["rules[0].classes[0].match.principal: must be a non-empty string, got \"\""]),
        (r#"{"rules": [{"name": "api", "concurrency": 5, "classes": [{"name": "a"}]}]}"#.into(),
         &["rules[0].classes: requires `rate` (classes order the releases of the rule's rate)"]),
        (rule(r#"[{"name": "a"}]"#, r#", "key": {"header": "x-user"}"#),
         &["rules[0].classes: cannot be combined with `key` without `key_quota`: with `key` alone every key has its own rate, so there is no shared queue to order (use `key_quota`: one shared rate ordered by class, each key within its quota)"]),
        (r#"{"rules": [{"name": "a_class_b", "rate": 1}]}"#.into(),
         &["rules[0].name: must not contain the word \"class\" between '_' or '-' (per-class metric names would be ambiguous), got \"a_class_b\""]),
    ];
    for (json, expected) in table {
        assert_eq!(&errors(json), expected, "config: {json}");
    }
    // A rule name may start or end with the word; with key_quota, keys are fine.
    ok(r#"{"rules": [{"name": "class-a", "rate": 1}, {"name": "b_class", "rate": 1}]}"#);
    ok(&rule(
        r#"[{"name": "a"}]"#,
        r#", "key": {"header": "x-user"}, "key_quota": 5"#,
    ));
}
