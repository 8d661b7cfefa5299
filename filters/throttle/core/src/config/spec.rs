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
    /// An object with exactly one of these fields.
    OneOf(&'static [Field]),
    /// A non-empty list of objects with these fields.
    List(&'static [Field]),
    /// A list of 1 to `max` objects with these fields.
    BoundedList(&'static [Field], u64),
    /// An integer in `min..=max`.
    Integer { min: u64, max: u64 },
    /// true or false.
    Bool,
    /// `"<n>/s"`, `"<n>/m"`, `"<n>/h"`, or a number per second.
    Rate,
    /// A duration string with a unit: `ms`, `s`, `m`.
    Duration,
    /// A rule name: 1 to 64 of `A-Za-z0-9_-`, without the word `class`
    /// inside (see [`names_are_unambiguous`]).
    Name,
    /// A class name: 1 to 64 of `A-Za-z0-9_-`, without the word `class`.
    ClassName,
    /// A number from 0 to `max_ppm` / 1,000,000.
    Fraction { max_ppm: u32 },
    /// A string starting with `/`.
    Path,
    /// A list of HTTP method names.
    Methods,
    /// Header name -> exact value (string), present (`true`) or absent (`false`).
    HeaderMatches,
    /// A non-empty string (header name, host name).
    Text,
    /// One of these strings.
    Choice(&'static [&'static str]),
    /// `true`, `false`, or one of these strings.
    BoolOrChoice(&'static [&'static str]),
    /// Exactly `true`.
    True,
}

/// A field's default, typed once here: the validator uses these values and
/// the docs show them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// The field is required.
    Required,
    /// Optional; absent means the feature is off.
    Absent,
    /// An integer.
    Int(u64),
    /// A boolean.
    Bool(bool),
    /// A duration, as shown and in nanoseconds.
    Duration(&'static str, u64),
    /// A string choice.
    Choice(&'static str),
    /// Described in words ("matches every request", "the global `dry_run`").
    Words(&'static str),
}

impl Default {
    /// The default as the docs show it.
    pub fn shown(&self) -> String {
        match self {
            Default::Required => "required".into(),
            Default::Absent => "—".into(),
            Default::Int(n) => format!("`{n}`"),
            Default::Bool(b) => format!("`{b}`"),
            Default::Duration(d, _) | Default::Choice(d) => format!("`\"{d}\"`"),
            Default::Words(w) => (*w).into(),
        }
    }

    /// The default as a JSON value, for the schema.
    pub fn json(&self) -> Option<Value> {
        match self {
            Default::Int(n) => Some(json!(n)),
            Default::Bool(b) => Some(json!(b)),
            Default::Duration(d, _) | Default::Choice(d) => Some(json!(d)),
            _ => None,
        }
    }
}

/// One configuration field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
    /// The default (typed; the validator reads it).
    pub default: Default,
    /// What it means, its unit and its scope.
    pub doc: &'static str,
}

impl Field {
    /// Whether the field must be present.
    pub fn required(&self) -> bool {
        matches!(self.default, Default::Required)
    }

    /// The default of an integer field (0 if it has none).
    pub fn int_default(&self) -> u64 {
        match self.default {
            Default::Int(n) => n,
            _ => 0,
        }
    }

    /// The default of a boolean field (false if it has none).
    pub fn bool_default(&self) -> bool {
        matches!(self.default, Default::Bool(true))
    }

    /// The default of a duration field, in nanoseconds (0 if it has none).
    pub fn duration_default_ns(&self) -> u64 {
        match self.default {
            Default::Duration(_, ns) => ns,
            _ => 0,
        }
    }

    /// The bounds of an integer field.
    pub fn bounds(&self) -> (u64, u64) {
        match self.kind {
            Kind::Integer { min, max } => (min, max),
            _ => (0, u64::MAX),
        }
    }
}

const fn field(name: &'static str, kind: Kind, default: Default, doc: &'static str) -> Field {
    Field {
        name,
        kind,
        default,
        doc,
    }
}

const fn required(name: &'static str, kind: Kind, doc: &'static str) -> Field {
    field(name, kind, Default::Required, doc)
}

pub const MAX_HELD_PER_WORKER: Field = field(
    "max_held_per_worker",
    Kind::Integer { min: 1, max: 1_000_000 },
    Default::Int(10_000),
    "Requests one worker thread may hold at once (bounds memory; per worker, not shared). Beyond it, a request that would be held is rejected.",
);
pub const REJECT_STATUS: Field = field(
    "reject_status",
    Kind::Integer { min: 400, max: 599 },
    Default::Int(429),
    "HTTP status of rejections. They carry `retry-after` (whole seconds, at least 1). gRPC requests (`content-type: application/grpc...`) are answered with `grpc-status: 8` (RESOURCE_EXHAUSTED), which gRPC clients and Istio's default retry policy do not retry at once.",
);
pub const DRY_RUN: Field = field(
    "dry_run",
    Kind::Bool,
    Default::Bool(false),
    "Decide and count everything, but hold and reject nothing (counters `would_queue`, `would_reject`). Rules may override it.",
);
pub const DRY_RUN_HEADERS: Field = field(
    "dry_run_headers",
    Kind::Bool,
    Default::Bool(false),
    "Let clients see a dry run: responses under dry-run rules carry `x-throttle-dry-run` (what would have happened) and the rate-limit headers. Off by default, so a trial is invisible to clients.",
);
pub const RATE_LIMIT_HEADERS: Field = field(
    "rate_limit_headers",
    Kind::BoolOrChoice(&["ietf", "legacy"]),
    Default::Bool(false),
    "Rate-limit headers on responses of rate rules (per key for keyed rules): `true` or `\"ietf\"` for `RateLimit-Policy` and `RateLimit` (IETF draft), `\"legacy\"` for `x-ratelimit-limit`/`-remaining`/`-reset`. They replace any the upstream sent.",
);
pub const RULES: Field = required(
    "rules",
    Kind::List(RULE_FIELDS),
    "Rules in order: the first whose `match` fits a request applies; a request that matches none passes untouched.",
);
pub const ENGINE: Field = field(
    "engine",
    Kind::Object(ENGINE_FIELDS),
    Default::Absent,
    "The rate limit service (envoyproxy/ratelimit + Redis) that rules with `scope: \"cluster\"` share one rate through. Required by such rules.",
);
pub const CONFIG_FIELDS: &[Field] = &[
    RULES,
    MAX_HELD_PER_WORKER,
    REJECT_STATUS,
    DRY_RUN,
    DRY_RUN_HEADERS,
    RATE_LIMIT_HEADERS,
    ENGINE,
];

pub const ENGINE_CLUSTER: Field = required(
    "cluster",
    Kind::Text,
    "Envoy cluster that reaches the rate limit service's HTTP port (`POST /json`). In Istio, the service's `outbound|8080||<service host>` cluster (a sidecar has it; a waypoint needs the EnvoyFilter of `istio/engine-waypoint`: see the section Cluster scope in the mesh of istio/README.md).",
);
pub const ENGINE_TIMEOUT: Field = field(
    "timeout",
    Kind::Duration,
    Default::Duration("50ms", 50 * crate::clock::NS_PER_MS),
    "Bounds each call to the service (1ms to 1s): Envoy gives up on a call after this long, which counts as a failure, and its slots are never used. (An answer Envoy does deliver later, held up because the proxy itself was stalled, is used if the service counted it inside its hour.)",
);
pub const ENGINE_FALLBACK_AFTER: Field = field(
    "fallback_after",
    Kind::Duration,
    Default::Duration("250ms", 250 * crate::clock::NS_PER_MS),
    "How long calls must keep failing (transport error, non-200, timeout, nonsense) before cluster rules fall back per `on_engine_failure` (0 to 1m). Slots already granted stay valid; the first good answer returns the rules to the shared schedule.",
);
pub const ENGINE_DOMAIN: Field = field(
    "domain",
    Kind::Text,
    Default::Choice("envoy_throttle"),
    "Rate limit domain of the service configuration (engine/config/throttle.yaml).",
);
pub const ENGINE_MAX_CLOCK_SKEW: Field = field(
    "max_clock_skew",
    Kind::Duration,
    Default::Duration("100ms", 100 * crate::clock::NS_PER_MS),
    "Largest difference between the wall clocks of any two proxies or service replicas (0 to 10s). Claims are never sent within this much (plus `timeout`) of the service's hourly counter boundary, so every claim on one epoch lands on the same counter.",
);
pub const ENGINE_FIELDS: &[Field] = &[
    ENGINE_CLUSTER,
    ENGINE_TIMEOUT,
    ENGINE_FALLBACK_AFTER,
    ENGINE_DOMAIN,
    ENGINE_MAX_CLOCK_SKEW,
];

/// Slowest interval a cluster-scope rule accepts (a rate of 1/s): slower
/// grids have epochs so long that claims two epochs ahead would often cross
/// the engine's hourly window.
pub const MAX_CLUSTER_INTERVAL_NS: u64 = crate::clock::NS_PER_S;

pub const NAME: Field = required(
    "name",
    Kind::Name,
    "Unique rule name; appears in metric names (bounded cardinality) and shared-data keys.",
);
pub const RATE: Field = field(
    "rate",
    Kind::Rate,
    Default::Absent,
    "Requests released per second/minute/hour, shared by all worker threads of the Envoy process (per key value with `key`). 1/h to 1,000,000/s; the interval is rounded up to whole nanoseconds, so the rate never exceeds the setting. A rule needs `rate`, `concurrency`, or both.",
);
pub const BURST: Field = field(
    "burst",
    Kind::Integer { min: 0, max: 1_000_000 },
    Default::Int(0),
    "Extra requests let through at once above the rate after an idle period (GCRA burst tolerance). Requires `rate`.",
);
pub const MAX_QUEUE_DELAY: Field = field(
    "max_queue_delay",
    Kind::Duration,
    Default::Duration("1s", crate::clock::NS_PER_S),
    "Longest a request may be held, from 0 to 1h. With `rate`, a request whose turn is further away is rejected at once; with `concurrency`, a request still waiting for a slot after this long is rejected then. `\"0s\"` makes the rule a plain rejecting limiter.",
);
pub const CONCURRENCY: Field = field(
    "concurrency",
    Kind::Integer { min: 1, max: 1_000_000 },
    Default::Absent,
    "At most this many requests of the rule in flight to the upstream at once, across all worker threads; the rest wait in arrival order. A slot frees when the response ends or the stream ends for any reason. Cannot be combined with `key`.",
);
pub const RULE_REJECT_STATUS: Field = field(
    "reject_status",
    Kind::Integer { min: 400, max: 599 },
    Default::Words("the global `reject_status`"),
    "HTTP status of this rule's rejections.",
);
pub const RULE_DRY_RUN: Field = field(
    "dry_run",
    Kind::Bool,
    Default::Words("the global `dry_run`"),
    "Dry-run for this rule only.",
);
pub const MATCH: Field = field(
    "match",
    Kind::Object(MATCH_FIELDS),
    Default::Words("matches every request"),
    "Conditions that must all hold.",
);
pub const KEY: Field = field(
    "key",
    Kind::OneOf(KEY_FIELDS),
    Default::Words("one schedule for everyone"),
    "Apply the rule per value of this key instead of once for everyone: exactly one of its fields. A request without a value (header absent) uses the rule's shared \"unkeyed\" schedule.",
);
pub const KEY_QUOTA: Field = field(
    "key_quota",
    Kind::Rate,
    Default::Absent,
    "Fairness under one shared rate: with `key_quota`, `rate` is the rule's rate for all keys together (one exactly paced schedule) and `key_quota` caps each key's share of it: a key may hold at most `key_quota` x `max_queue_delay` + 1 places of the shared queue and gets at most `key_quota` on average, so one noisy key cannot fill the shared schedule. Requests without a key value count as one key. Requires `key` and `rate`, and may not exceed `rate`.",
);
pub const KEY_SLOTS: Field = field(
    "key_slots",
    Kind::Integer { min: 1, max: 1_000_000 },
    Default::Int(4096),
    "Entries of the rule's key table in Envoy's shared data (memory stays bounded whatever keys clients send), in buckets of 8; each key may use 16 of them. An entry is reused once its schedule lies in the past; a key whose 16 entries all belong to other active keys shares a rate (the safe side). Size it at about twice the keys active at once. Requires `key`.",
);
pub const SCOPE: Field = field(
    "scope",
    Kind::Choice(&["process", "cluster"]),
    Default::Choice("process"),
    "`\"process\"`: the rate holds for one Envoy process (all its worker threads). `\"cluster\"`: the rate holds for all proxies together (every proxy whose rule has the same name and rate), through the top-level `engine`; needs a rate of at least 1/s, and no `key` or `concurrency` (process-only).",
);
pub const EXPECTED_REPLICAS: Field = field(
    "expected_replicas",
    Kind::Integer { min: 1, max: 10_000 },
    Default::Int(1),
    "Proxies expected to share a cluster rule: while the engine fails, `local_share` paces each at `rate` / this, or / the most proxies the engine counted in the last ~5 s if that is more. Requires `scope: \"cluster\"`.",
);
pub const ON_ENGINE_FAILURE: Field = field(
    "on_engine_failure",
    Kind::Choice(&["local_share", "deny", "local_full"]),
    Default::Choice("local_share"),
    "What a cluster rule does while the engine fails (see `engine.fallback_after`): `\"local_share\"` paces each proxy at `rate` / max(`expected_replicas`, proxies recently counted); `\"deny\"` rejects with `reject_status` and `retry-after`; `\"local_full\"` paces each proxy at the full `rate`. Requires `scope: \"cluster\"`.",
);
pub const CLASSES: Field = field(
    "classes",
    Kind::BoundedList(CLASS_FIELDS, MAX_CLASSES as u64),
    Default::Absent,
    "Priority classes inside the rule's queue, highest first (at most 8). A request takes the first class whose `match` fits, else the one class without `match`. The rule's rate stays one exact schedule; each release goes to the highest class with requests waiting, except the releases that `min_share` reserves for a lower class. A held request whose turn moves past its class's `max_queue_delay` (pushed back by higher classes) is answered with `reject_status` and counted `displaced`. Requires `rate`; with `key`, requires `key_quota` (see Priority classes).",
);
pub const ADAPTIVE: Field = field(
    "adaptive",
    Kind::Object(ADAPTIVE_FIELDS),
    Default::Absent,
    "Learn the rate from the upstream's answers (latency, 429/503 and `Retry-After`, 5xx, resets; errors count only when they spread over the rule's paths and clients) and pace at it, within `min_rate` and `max_rate`; `rate` is where it starts, before anything is learned and after a configuration change that changes the rule's `rate` or `adaptive` block (other changes keep the rate learned). One learned rate per Envoy process (shared by all worker threads). Requires `rate`; with `key` only together with `key_quota` (the learned rate is the shared one); with `classes` (each class's requests are released at the learned rate); not with `scope: \"cluster\"`. See \"Adaptive pacing\".",
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
    CLASSES,
    ADAPTIVE,
];

/// Most classes a rule may have.
pub const MAX_CLASSES: usize = crate::stats::MAX_CLASSES;

pub const CLASS_NAME: Field = required(
    "name",
    Kind::ClassName,
    "The class's name, unique within the rule; appears in metric names (`throttle.rule.<rule>.class.<class>.<stat>`).",
);
pub const CLASS_MATCH: Field = field(
    "match",
    Kind::Object(MATCH_FIELDS),
    Default::Words("the default class"),
    "Conditions that must all hold, as a rule's `match`. Exactly one class has no `match`: it takes every request no other class fits. A client can choose its class only through what the match reads: match on a header only if a trusted hop sets it, or on `principal`.",
);
pub const MIN_SHARE: Field = field(
    "min_share",
    Kind::Fraction { max_ppm: 500_000 },
    Default::Words("`0`"),
    "While the class has requests waiting, at least this fraction of the rule's releases goes to it, whatever the classes above it offer (0 to 0.5; the classes' shares add up to at most 1). Releases it does not need go to the highest class waiting.",
);
pub const CLASS_MAX_QUEUE_DELAY: Field = field(
    "max_queue_delay",
    Kind::Duration,
    Default::Words("the rule's `max_queue_delay`"),
    "Longest a request of the class may wait (0 to 1h). A request whose estimated turn lies further is rejected at once; a held request whose turn moves past it is answered then (`displaced`).",
);
pub const CLASS_FIELDS: &[Field] = &[CLASS_NAME, CLASS_MATCH, MIN_SHARE, CLASS_MAX_QUEUE_DELAY];

pub const ADAPTIVE_MIN_RATE: Field = required(
    "min_rate",
    Kind::Rate,
    "Lowest rate it paces at, whatever the upstream answers. At most `rate`, and at least 1% of it (a floor far below the rate is one the learner would take minutes to climb back from, with few answers to learn from).",
);
pub const ADAPTIVE_MAX_RATE: Field = required(
    "max_rate",
    Kind::Rate,
    "Highest rate it paces at, however well the upstream answers. At least `rate`.",
);
pub const ADAPTIVE_MODE: Field = field(
    "mode",
    Kind::Choice(&["enforce", "observe"]),
    Default::Choice("enforce"),
    "`\"enforce\"`: pace at the learned rate. `\"observe\"`: learn it and report it (what it would pace at) while pacing at `rate`, to watch before trusting it.",
);
pub const ADAPTIVE_FIELDS: &[Field] = &[ADAPTIVE_MIN_RATE, ADAPTIVE_MAX_RATE, ADAPTIVE_MODE];

pub const PATH_PREFIX: Field = field(
    "path_prefix",
    Kind::Path,
    Default::Absent,
    "The normalised request path starts with this (also normalised). Normalised: without query string, unreserved percent-escapes decoded, `%2F`, `%5C` and `\\` read as `/`, repeated slashes merged, `.` and `..` segments resolved; so `/%61dmin`, `//admin` and `/x/../admin` are `/admin`. `\"/\"` matches every request (also `OPTIONS *` and CONNECT, which have no such path).",
);
pub const PATH_EXACT: Field = field(
    "path_exact",
    Kind::Path,
    Default::Absent,
    "The normalised request path is exactly this (also normalised; see `path_prefix`).",
);
pub const METHODS: Field = field(
    "methods",
    Kind::Methods,
    Default::Absent,
    "The request method is one of these (e.g. `[\"GET\", \"HEAD\"]`).",
);
pub const HEADERS: Field = field(
    "headers",
    Kind::HeaderMatches,
    Default::Absent,
    "Request headers: name -> exact value (string), present (`true`) or absent (`false`). Names are case-insensitive. A header sent on several lines is matched on its values joined with `,` (as Envoy's own header matchers do).",
);
pub const AUTHORITY: Field = field(
    "authority",
    Kind::Text,
    Default::Absent,
    "The request's host is this, ignoring case and a trailing dot. Without a port here, any port matches (`example.com` matches `Host: example.com:8080`); with one (`example.com:8080`), the port must match too.",
);
pub const PRINCIPAL: Field = field(
    "principal",
    Kind::Text,
    Default::Absent,
    "The caller's mTLS identity is exactly this (the first URI SAN of the peer certificate, e.g. Istio's `spiffe://cluster.local/ns/<ns>/sa/<sa>`; see `key.source`). No client can forge it; a request without one never matches.",
);
pub const MATCH_FIELDS: &[Field] = &[
    PATH_PREFIX,
    PATH_EXACT,
    METHODS,
    HEADERS,
    AUTHORITY,
    PRINCIPAL,
];

pub const KEY_HEADER: Field = field(
    "header",
    Kind::Text,
    Default::Absent,
    "Key by the value of this request header; a header sent on several lines is keyed on its values joined with `,`. Clients choose header values: use a header a trusted hop sets (overwriting what the client sent).",
);
pub const KEY_SOURCE: Field = field(
    "source",
    Kind::Choice(&["address", "principal"]),
    Default::Absent,
    "`\"address\"`: the client address Envoy trusts, without port: the peer of the connection with `use_remote_address: true`, else an `X-Forwarded-For` entry chosen by `xff_num_trusted_hops` (which a client can forge unless a trusted hop overwrites it; the shipped configs set `use_remote_address: true`). `\"principal\"`: the caller's mTLS identity (the first URI SAN of the peer certificate, e.g. Istio's SPIFFE ID `spiffe://cluster.local/ns/<ns>/sa/<sa>`; on waypoints, Istio's `io.istio.peer_principal` filter state), which no client can forge.",
);
pub const KEY_PATH: Field = field(
    "path",
    Kind::True,
    Default::Absent,
    "`true`: key by the normalised request path (see `match.path_prefix`).",
);
pub const KEY_AUTHORITY: Field = field(
    "authority",
    Kind::True,
    Default::Absent,
    "`true`: key by the request's host: lower case, without port and trailing dot (`H1`, `h1:19003` and `h1.` are one key).",
);
pub const KEY_FIELDS: &[Field] = &[KEY_HEADER, KEY_SOURCE, KEY_PATH, KEY_AUTHORITY];

/// Rule names: `A-Za-z0-9_-`, without the word `class` between separators.
pub const RULE_NAME_PATTERN: &str = "^(?!.*[_-]class[_-])[A-Za-z0-9_-]{1,64}$";
/// Class names: `A-Za-z0-9_-`, without the word `class` at all.
pub const CLASS_NAME_PATTERN: &str = "^(?!(?:.*[_-])?class(?:[_-]|$))[A-Za-z0-9_-]{1,64}$";

/// Why names may not contain the word `class`: per-class statistics are
/// named `throttle.rule.<rule>.class.<class>.<stat>`, which a Prometheus
/// endpoint without tag extraction (Istio's) flattens to
/// `throttle_rule_<rule>_class_<class>_<stat>` (`-` becomes `_`). That name
/// splits back into rule, class and stat unambiguously only if the class
/// has no word `class` and the rule none inside (`a_class_b`): else a
/// rule's own `throttle_rule_a_class_b_queued` would read as class `b` of
/// rule `a`. (A rule name may start or end with the word.)
pub fn names_are_unambiguous(name: &str, class: bool) -> bool {
    let words: Vec<&str> = name.split(['_', '-']).collect();
    let inner = if class {
        &words[..]
    } else {
        words.get(1..words.len().saturating_sub(1)).unwrap_or(&[])
    };
    !inner.contains(&"class")
}

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
        .filter(|f| f.required())
        .map(|f| f.name)
        .collect();
    let mut o = Map::new();
    o.insert("type".into(), json!("object"));
    o.insert("additionalProperties".into(), json!(false));
    o.insert("properties".into(), Value::Object(props));
    if !required.is_empty() {
        o.insert("required".into(), json!(required));
    }
    Value::Object(o)
}

fn field_schema(f: &Field) -> Value {
    let mut s = match kind_schema(f.kind) {
        Value::Object(m) => m,
        other => Map::from_iter([("allOf".to_string(), json!([other]))]),
    };
    s.insert("description".into(), json!(f.doc));
    if let Some(d) = f.default.json() {
        s.insert("default".into(), d);
    }
    Value::Object(s)
}

fn kind_schema(kind: Kind) -> Value {
    match kind {
        Kind::Object(fields) => object_schema(fields),
        Kind::OneOf(fields) => {
            let mut o = object_schema(fields);
            if let Value::Object(m) = &mut o {
                m.insert("minProperties".into(), json!(1));
                m.insert("maxProperties".into(), json!(1));
            }
            o
        }
        Kind::List(fields) => {
            json!({"type": "array", "minItems": 1, "items": object_schema(fields)})
        }
        Kind::BoundedList(fields, max) => {
            json!({"type": "array", "minItems": 1, "maxItems": max, "items": object_schema(fields)})
        }
        Kind::Integer { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Rate => json!({"oneOf": [
            {"type": "number", "exclusiveMinimum": 0, "maximum": crate::units::MAX_RATE_PER_S},
            {"type": "string", "pattern": "^\\s*[0-9]*\\.?[0-9]+\\s*/\\s*[smh]\\s*$"}]}),
        Kind::Duration => {
            json!({"type": "string", "pattern": "^\\s*[0-9]*\\.?[0-9]+(ms|s|m|h)\\s*$"})
        }
        Kind::Name => json!({"type": "string", "pattern": RULE_NAME_PATTERN}),
        Kind::ClassName => json!({"type": "string", "pattern": CLASS_NAME_PATTERN}),
        Kind::Fraction { max_ppm } => {
            json!({"type": "number", "minimum": 0, "maximum": f64::from(max_ppm) / 1e6})
        }
        Kind::Path => json!({"type": "string", "pattern": "^/"}),
        Kind::Methods => {
            json!({"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "^[A-Za-z]+$"}})
        }
        Kind::HeaderMatches => json!({"type": "object", "minProperties": 1,
            "additionalProperties": {"type": ["string", "boolean"]}}),
        Kind::Text => json!({"type": "string", "minLength": 1}),
        Kind::Choice(v) => json!({"enum": v}),
        Kind::BoolOrChoice(v) => json!({"oneOf": [{"type": "boolean"}, {"enum": v}]}),
        Kind::True => json!({"const": true}),
    }
}

fn kind_text(kind: Kind) -> String {
    match kind {
        Kind::Object(_) => "object".into(),
        Kind::OneOf(_) => "object with exactly one field".into(),
        Kind::List(_) => "list of objects, 1 or more".into(),
        Kind::BoundedList(_, max) => format!("list of objects, 1 to {max}"),
        Kind::Integer { min, max } => format!("integer {}–{}", group(min), group(max)),
        Kind::Bool => "boolean".into(),
        Kind::Rate => "`\"<n>/s\"`, `\"<n>/m\"`, `\"<n>/h\"`, or a number per second".into(),
        Kind::Duration => "duration: `\"250ms\"`, `\"2s\"`, `\"1m\"`, `\"1h\"`".into(),
        Kind::Name => {
            "string, 1–64 of `A-Za-z0-9_-`, unique, without the word `class` inside".into()
        }
        Kind::ClassName => {
            "string, 1–64 of `A-Za-z0-9_-`, unique in the rule, without the word `class`".into()
        }
        Kind::Fraction { max_ppm } => format!("number, 0–{}", f64::from(max_ppm) / 1e6),
        Kind::Path => "string starting with `/`".into(),
        Kind::Methods => "list of strings".into(),
        Kind::HeaderMatches => "object: name → string or boolean".into(),
        Kind::Text => "string".into(),
        Kind::Choice(v) => quoted(v),
        Kind::BoolOrChoice(v) => format!("`true`, `false`, {}", quoted(v)),
        Kind::True => "`true`".into(),
    }
}

fn quoted(v: &[&str]) -> String {
    v.iter()
        .map(|c| format!("`\"{c}\"`"))
        .collect::<Vec<_>>()
        .join(" or ")
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
        let default = f.default.shown();
        out.push_str(&format!(
            "| `{path}` | {} | {default} | {} |\n",
            kind_text(f.kind),
            f.doc
        ));
        match f.kind {
            Kind::Object(sub) | Kind::OneOf(sub) => rows(&format!("{path}."), sub, out),
            Kind::List(sub) | Kind::BoundedList(sub, _) => rows(&format!("{path}[]."), sub, out),
            _ => {}
        }
    }
}
