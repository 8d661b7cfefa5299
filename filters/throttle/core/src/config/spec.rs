//! The configuration's single source of truth: every field with its type,
//! default, unit, range and scope. The validator reads names, bounds and
//! defaults from here at run time; the JSON Schema
//! (`filters/throttle/config.schema.json`) and the README's configuration
//! reference are generated from here (`throttle-config schema|reference`), and
//! a test fails when either file drifts.

use serde_json::{json, Map, Value};

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// An object with these fields.
    Object(&'static [Field]),
    /// A non-empty list of objects with these fields.
    List(&'static [Field]),
    /// An integer in `min..=max`.
    Integer { min: u64, max: u64 },
    /// true or false.
    Bool,
    /// `"<n>/s"`, `"<n>/m"`, `"<n>/h"`, or a number per second.
    Rate,
    /// A duration string with a unit: `ms`, `s`, `m`.
    Duration,
    /// A rule name: 1 to 64 of `A-Za-z0-9_-`.
    Name,
    /// A string starting with `/`.
    Path,
    /// A list of HTTP method names.
    Methods,
    /// Header name -> exact value (string), present (`true`) or absent (`false`).
    HeaderMatches,
    /// A non-empty string (header name, host name).
    Text,
    /// Exactly this string.
    Literal(&'static str),
    /// Exactly `true`.
    True,
    /// One of these strings.
    OneOf(&'static [&'static str]),
}

/// One configuration field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
    /// The default as shown to users; None: required or no default.
    pub default: Option<&'static str>,
    pub required: bool,
    /// What it means, its unit and its scope.
    pub doc: &'static str,
}

const fn field(
    name: &'static str,
    kind: Kind,
    default: Option<&'static str>,
    doc: &'static str,
) -> Field {
    Field {
        name,
        kind,
        default,
        required: false,
        doc,
    }
}

const fn required(name: &'static str, kind: Kind, doc: &'static str) -> Field {
    Field {
        name,
        kind,
        default: None,
        required: true,
        doc,
    }
}

pub const MAX_HELD_PER_WORKER: Field = field(
    "max_held_per_worker",
    Kind::Integer { min: 1, max: 1_000_000 },
    Some("10000"),
    "Requests one worker thread may hold at once (bounds memory; per worker, not shared). Beyond it, a request that would be held is rejected.",
);
pub const REJECT_STATUS: Field = field(
    "reject_status",
    Kind::Integer { min: 400, max: 599 },
    Some("429"),
    "HTTP status of rejections. They carry `retry-after` (whole seconds, at least 1).",
);
pub const DRY_RUN: Field = field(
    "dry_run",
    Kind::Bool,
    Some("false"),
    "Decide and count everything, but hold and reject nothing; the response header `x-throttle-dry-run` tells what would have happened. Rules may override it.",
);
pub const RATE_LIMIT_HEADERS: Field = field(
    "rate_limit_headers",
    Kind::Bool,
    Some("false"),
    "Add the draft `x-ratelimit-limit`, `x-ratelimit-remaining` and `x-ratelimit-reset` headers to responses of rate rules (per key for keyed rules).",
);
pub const RULES: Field = required(
    "rules",
    Kind::List(RULE_FIELDS),
    "Rules in order: the first whose `match` fits a request applies; a request that matches none passes untouched.",
);
pub const ENGINE: Field = field(
    "engine",
    Kind::Object(ENGINE_FIELDS),
    None,
    "The rate limit service (envoyproxy/ratelimit + Redis) that rules with `scope: \"cluster\"` share one rate through. Required by such rules.",
);
pub const CONFIG_FIELDS: &[Field] = &[
    RULES,
    MAX_HELD_PER_WORKER,
    REJECT_STATUS,
    DRY_RUN,
    RATE_LIMIT_HEADERS,
    ENGINE,
];

pub const ENGINE_CLUSTER: Field = required(
    "cluster",
    Kind::Text,
    "Envoy cluster that reaches the rate limit service's HTTP port (`POST /json`). In Istio, the `outbound|8080||<service host>` cluster, or one added by an EnvoyFilter.",
);
pub const ENGINE_TIMEOUT: Field = field(
    "timeout",
    Kind::Duration,
    Some("\"50ms\""),
    "Bounds each call to the service (1ms to 1s). A call answered later counts as a failure; its slots are never used.",
);
pub const ENGINE_FALLBACK_AFTER: Field = field(
    "fallback_after",
    Kind::Duration,
    Some("\"250ms\""),
    "How long calls must keep failing (transport error, non-200, timeout, nonsense) before cluster rules fall back per `on_engine_failure` (0 to 1m). Slots already granted stay valid; the first good answer returns the rules to the shared schedule.",
);
pub const ENGINE_DOMAIN: Field = field(
    "domain",
    Kind::Text,
    Some("\"envoy_throttle\""),
    "Rate limit domain of the service configuration (engine/config/throttle.yaml).",
);
pub const ENGINE_MAX_CLOCK_SKEW: Field = field(
    "max_clock_skew",
    Kind::Duration,
    Some("\"100ms\""),
    "Largest difference between the wall clocks of any two proxies or service replicas (0 to 10s). Claims are never sent within this much (plus `timeout`) of the service's hourly counter boundary, so every claim on one epoch lands on the same counter.",
);
pub const ENGINE_FIELDS: &[Field] = &[
    ENGINE_CLUSTER,
    ENGINE_TIMEOUT,
    ENGINE_FALLBACK_AFTER,
    ENGINE_DOMAIN,
    ENGINE_MAX_CLOCK_SKEW,
];

pub const NAME: Field = required(
    "name",
    Kind::Name,
    "Unique rule name; appears in metric names (bounded cardinality) and shared-data keys.",
);
pub const RATE: Field = field(
    "rate",
    Kind::Rate,
    None,
    "Requests released per second/minute/hour, shared by all worker threads of the Envoy process (per key value with `key`). 1/h to 1,000,000/s; the interval is rounded up to whole nanoseconds, so the rate never exceeds the setting. A rule needs `rate`, `concurrency`, or both.",
);
pub const BURST: Field = field(
    "burst",
    Kind::Integer { min: 0, max: 1_000_000 },
    Some("0"),
    "Extra requests let through at once above the rate after an idle period (GCRA burst tolerance). Requires `rate`.",
);
pub const MAX_QUEUE_DELAY: Field = field(
    "max_queue_delay",
    Kind::Duration,
    Some("\"1s\""),
    "Longest a request may be held (0 to 1h). With `rate`, a request whose turn is further away is rejected at once; with `concurrency`, a request still waiting for a slot after this long is rejected then. `\"0s\"` makes the rule a plain rejecting limiter.",
);
pub const CONCURRENCY: Field = field(
    "concurrency",
    Kind::Integer { min: 1, max: 1_000_000 },
    None,
    "At most this many requests of the rule in flight to the upstream at once, across all worker threads; the rest wait in arrival order. A slot frees when the response ends or the stream ends for any reason. Cannot be combined with `key`.",
);
pub const RULE_REJECT_STATUS: Field = field(
    "reject_status",
    Kind::Integer { min: 400, max: 599 },
    Some("the global `reject_status`"),
    "HTTP status of this rule's rejections.",
);
pub const RULE_DRY_RUN: Field = field(
    "dry_run",
    Kind::Bool,
    Some("the global `dry_run`"),
    "Dry-run for this rule only.",
);
pub const MATCH: Field = field(
    "match",
    Kind::Object(MATCH_FIELDS),
    Some("matches every request"),
    "Conditions that must all hold.",
);
pub const KEY: Field = field(
    "key",
    Kind::Object(KEY_FIELDS),
    Some("one schedule for everyone"),
    "Apply the rule per value of this key instead of once for everyone: exactly one of its fields. A request without a value (header absent) uses the rule's shared \"unkeyed\" schedule.",
);
pub const KEY_QUOTA: Field = field(
    "key_quota",
    Kind::Rate,
    None,
    "Fairness under one shared rate: with `key_quota`, `rate` is the rule's rate for all keys together (one exactly paced schedule) and `key_quota` caps each key's share of it: a key may hold at most `key_quota` x `max_queue_delay` + 1 places of the shared queue and gets at most `key_quota` on average, so one noisy key cannot fill the shared schedule. Requests without a key value count as one key. Requires `key` and `rate`.",
);
pub const KEY_SLOTS: Field = field(
    "key_slots",
    Kind::Integer { min: 1, max: 1_000_000 },
    Some("4096"),
    "Size of the rule's key table in Envoy's shared data (memory stays bounded whatever keys clients send). A slot is reused once its schedule lies in the past; two active keys that land on the same slots share a rate (the safe side). Requires `key`.",
);
pub const SCOPE: Field = field(
    "scope",
    Kind::OneOf(&["process", "cluster"]),
    Some("\"process\""),
    "`\"process\"`: the rate holds for one Envoy process (all its worker threads). `\"cluster\"`: the rate holds for all proxies together (every proxy whose rule has the same name and rate), through the top-level `engine`; needs a rate of at least 1/s, and no `key` or `concurrency` (process-only).",
);
pub const EXPECTED_REPLICAS: Field = field(
    "expected_replicas",
    Kind::Integer { min: 1, max: 10_000 },
    Some("1"),
    "Proxies expected to share a cluster rule: while the engine fails, `local_share` paces each at `rate` / this, or / the most proxies the engine counted in the last ~5 s if that is more. Requires `scope: \"cluster\"`.",
);
pub const ON_ENGINE_FAILURE: Field = field(
    "on_engine_failure",
    Kind::OneOf(&["local_share", "deny", "local_full"]),
    Some("\"local_share\""),
    "What a cluster rule does while the engine fails (see `engine.fallback_after`): `\"local_share\"` paces each proxy at `rate` / max(`expected_replicas`, proxies recently counted); `\"deny\"` rejects with `reject_status` and `retry-after`; `\"local_full\"` paces each proxy at the full `rate`. Requires `scope: \"cluster\"`.",
);
pub const RULE_FIELDS: &[Field] = &[
    NAME,
    RATE,
    BURST,
    MAX_QUEUE_DELAY,
    CONCURRENCY,
    MATCH,
    KEY,
    KEY_QUOTA,
    KEY_SLOTS,
    RULE_REJECT_STATUS,
    RULE_DRY_RUN,
    SCOPE,
    EXPECTED_REPLICAS,
    ON_ENGINE_FAILURE,
];

pub const PATH_PREFIX: Field = field(
    "path_prefix",
    Kind::Path,
    None,
    "The request path (without query string) starts with this.",
);
pub const PATH_EXACT: Field = field(
    "path_exact",
    Kind::Path,
    None,
    "The request path (without query string) is exactly this.",
);
pub const METHODS: Field = field(
    "methods",
    Kind::Methods,
    None,
    "The request method is one of these (e.g. `[\"GET\", \"HEAD\"]`).",
);
pub const HEADERS: Field = field(
    "headers",
    Kind::HeaderMatches,
    None,
    "Request headers: name -> exact value (string), present (`true`) or absent (`false`). Names are case-insensitive.",
);
pub const AUTHORITY: Field = field(
    "authority",
    Kind::Text,
    None,
    "The `:authority` (Host) is exactly this, ignoring case.",
);
pub const MATCH_FIELDS: &[Field] = &[PATH_PREFIX, PATH_EXACT, METHODS, HEADERS, AUTHORITY];

pub const KEY_HEADER: Field = field(
    "header",
    Kind::Text,
    None,
    "Key by the value of this request header.",
);
pub const KEY_SOURCE: Field = field(
    "source",
    Kind::Literal("address"),
    None,
    "`\"address\"`: key by the downstream remote address, without port.",
);
pub const KEY_PATH: Field = field(
    "path",
    Kind::True,
    None,
    "`true`: key by the request path (without query string).",
);
pub const KEY_AUTHORITY: Field = field(
    "authority",
    Kind::True,
    None,
    "`true`: key by the `:authority` (Host), lower-cased.",
);
pub const KEY_FIELDS: &[Field] = &[KEY_HEADER, KEY_SOURCE, KEY_PATH, KEY_AUTHORITY];

/// Names of a field list, for "unknown field" messages.
pub fn names(fields: &[Field]) -> String {
    fields.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

/// The JSON Schema (draft 2020-12) of the configuration.
pub fn json_schema() -> Value {
    let mut root = object_schema(CONFIG_FIELDS);
    if let Value::Object(m) = &mut root {
        let mut head = Map::new();
        head.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
        head.insert(
            "$id".into(),
            json!("https://github.com/envoy-throttle/filters/throttle/config.schema.json"),
        );
        head.insert("title".into(), json!("throttle filter configuration"));
        head.insert(
            "description".into(),
            json!("Plugin configuration of the throttle proxy-wasm filter (Envoy `configuration`, Istio `pluginConfig`). Generated from filters/throttle/core/src/config/spec.rs."),
        );
        head.append(m);
        return Value::Object(head);
    }
    root
}

fn object_schema(fields: &[Field]) -> Value {
    let mut props = Map::new();
    for f in fields {
        props.insert(f.name.into(), field_schema(f));
    }
    let required: Vec<&str> = fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.name)
        .collect();
    let mut o = Map::new();
    o.insert("type".into(), json!("object"));
    o.insert("additionalProperties".into(), json!(false));
    o.insert("properties".into(), Value::Object(props));
    if !required.is_empty() {
        o.insert("required".into(), json!(required));
    }
    if std::ptr::eq(fields, KEY_FIELDS) {
        o.insert("minProperties".into(), json!(1));
        o.insert("maxProperties".into(), json!(1));
    }
    Value::Object(o)
}

fn field_schema(f: &Field) -> Value {
    let mut s = match kind_schema(f.kind) {
        Value::Object(m) => m,
        other => Map::from_iter([("allOf".to_string(), json!([other]))]),
    };
    s.insert("description".into(), json!(f.doc));
    if let Some(d) = f
        .default
        .and_then(|d| serde_json::from_str::<Value>(d).ok())
    {
        s.insert("default".into(), d);
    }
    Value::Object(s)
}

fn kind_schema(kind: Kind) -> Value {
    match kind {
        Kind::Object(fields) => object_schema(fields),
        Kind::List(fields) => {
            json!({"type": "array", "minItems": 1, "items": object_schema(fields)})
        }
        Kind::Integer { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Rate => json!({"oneOf": [
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000},
            {"type": "string", "pattern": "^\\s*[0-9]*\\.?[0-9]+\\s*/\\s*[smh]\\s*$"}]}),
        Kind::Duration => {
            json!({"type": "string", "pattern": "^\\s*[0-9]*\\.?[0-9]+(ms|s|m)\\s*$"})
        }
        Kind::Name => json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}),
        Kind::Path => json!({"type": "string", "pattern": "^/"}),
        Kind::Methods => {
            json!({"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "^[A-Za-z]+$"}})
        }
        Kind::HeaderMatches => json!({"type": "object", "minProperties": 1,
            "additionalProperties": {"type": ["string", "boolean"]}}),
        Kind::Text => json!({"type": "string", "minLength": 1}),
        Kind::Literal(v) => json!({"const": v}),
        Kind::True => json!({"const": true}),
        Kind::OneOf(values) => json!({"enum": values}),
    }
}

fn kind_text(kind: Kind) -> String {
    match kind {
        Kind::Object(_) => "object".into(),
        Kind::List(_) => "list of objects, 1 or more".into(),
        Kind::Integer { min, max } => format!("integer {}–{}", group(min), group(max)),
        Kind::Bool => "boolean".into(),
        Kind::Rate => "`\"<n>/s\"`, `\"<n>/m\"`, `\"<n>/h\"`, or a number per second".into(),
        Kind::Duration => "duration: `\"250ms\"`, `\"2s\"`, `\"1m\"`".into(),
        Kind::Name => "string, 1–64 of `A-Za-z0-9_-`, unique".into(),
        Kind::Path => "string starting with `/`".into(),
        Kind::Methods => "list of strings".into(),
        Kind::HeaderMatches => "object: name → string or boolean".into(),
        Kind::Text => "string".into(),
        Kind::Literal(v) => format!("`\"{v}\"`"),
        Kind::True => "`true`".into(),
        Kind::OneOf(values) => values
            .iter()
            .map(|v| format!("`\"{v}\"`"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The README's configuration reference: a Markdown table of every field.
pub fn reference_table() -> String {
    let mut out = String::from("| field | type | default | meaning |\n|---|---|---|---|\n");
    rows("", CONFIG_FIELDS, &mut out);
    out
}

fn rows(prefix: &str, fields: &[Field], out: &mut String) {
    for f in fields {
        let path = format!("{prefix}{}", f.name);
        let default = match (f.required, f.default) {
            (true, _) => "required".to_string(),
            (false, Some(d))
                if d.starts_with('"') || d.chars().all(|c| c.is_ascii_alphanumeric()) =>
            {
                format!("`{d}`")
            }
            (false, Some(d)) => d.to_string(),
            (false, None) => "—".to_string(),
        };
        out.push_str(&format!(
            "| `{path}` | {} | {default} | {} |\n",
            kind_text(f.kind),
            f.doc
        ));
        match f.kind {
            Kind::Object(sub) => rows(&format!("{path}."), sub, out),
            Kind::List(sub) => rows(&format!("{path}[]."), sub, out),
            _ => {}
        }
    }
}
