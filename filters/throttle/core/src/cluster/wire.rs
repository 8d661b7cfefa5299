//! envoyproxy/ratelimit as the [`Engine`]: the `POST /json` exchange
//! (proto3 JSON of `RateLimitRequest` / `RateLimitResponse`), each claim one
//! descriptor, and the strict reading of the answer. Anything unexpected is
//! a [`Failure`], never a guess. The tests use answers captured from the
//! real service (`testdata/`).

use serde_json::{json, Value};

use super::engine::{Claim, Counted, Counter, Engine, Failure, Request};

/// The descriptor key of each counter in the service configuration
/// (engine/config/throttle.yaml).
pub fn family(counter: Counter) -> &'static str {
    match counter {
        Counter::Slots => "throttle_slots",
        Counter::Members => "throttle_members",
        Counter::Demand => "throttle_demand",
    }
}

/// envoyproxy/ratelimit behind its HTTP port, in one rate limit `domain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatelimitJson {
    pub domain: String,
}

impl Engine for RatelimitJson {
    fn request(&self, claims: &[Claim]) -> Request {
        Request {
            headers: vec![
                (":method", "POST".into()),
                (":path", "/json".into()),
                (":authority", "ratelimit".into()),
                ("content-type", "application/json".into()),
            ],
            body: request_body(&self.domain, claims),
        }
    }

    fn read(&self, status: u16, body: &[u8], claims: &[Claim]) -> Result<Vec<Counted>, Failure> {
        parse_answer(status, body, claims)
    }
}

/// The request body: every descriptor carries its own `hitsAddend`, also 0
/// (a per-descriptor 0 looks without adding; unset would add 1).
pub fn request_body(domain: &str, claims: &[Claim]) -> Vec<u8> {
    let ds: Vec<Value> = claims
        .iter()
        .map(|c| {
            json!({"entries": [{"key": family(c.counter), "value": c.key}],
                   "hitsAddend": c.hits.to_string()})
        })
        .collect();
    json!({"domain": domain, "descriptors": ds})
        .to_string()
        .into_bytes()
}

fn nonsense(why: impl Into<String>) -> Failure {
    Failure::Nonsense(why.into())
}

/// Envoy's own answer when it could not reach the engine's cluster (a
/// connect failure, a reset before headers, no healthy host): a 503 with
/// one of its local-reply texts, not the service's answer.
fn is_envoy_local_reply(http_status: u16, body: &[u8]) -> bool {
    const TEXTS: [&[u8]; 2] = [
        b"upstream connect error or disconnect/reset before headers",
        b"no healthy upstream",
    ];
    http_status == 503 && TEXTS.iter().any(|t| body.starts_with(t))
}

/// Reads an answer to a call of `sent` claims. Every status must be OK
/// with our hourly limit, and `limit_remaining` (0 when absent: proto3 JSON
/// omits zeros) must leave room for this claim's own add.
pub fn parse_answer(
    http_status: u16,
    body: &[u8],
    sent: &[Claim],
) -> Result<Vec<Counted>, Failure> {
    if http_status != 200 {
        if is_envoy_local_reply(http_status, body) {
            return Err(Failure::Transport);
        }
        // Envoy's own 504 when the call outlived `engine.timeout` (the
        // call's timeout is its route's).
        if http_status == 504 && body.starts_with(b"upstream request timeout") {
            return Err(Failure::Timeout);
        }
        return Err(Failure::Status(http_status));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| nonsense(format!("not JSON: {e}")))?;
    if v.get("overallCode").and_then(Value::as_str) != Some("OK") {
        return Err(nonsense(format!(
            "overallCode is {}",
            v.get("overallCode")
                .map_or("missing".into(), Value::to_string)
        )));
    }
    let statuses = v
        .get("statuses")
        .and_then(Value::as_array)
        .ok_or_else(|| nonsense("no statuses"))?;
    if statuses.len() != sent.len() {
        return Err(nonsense(format!(
            "{} statuses for {} descriptors",
            statuses.len(),
            sent.len()
        )));
    }
    statuses
        .iter()
        .zip(sent)
        .enumerate()
        .map(|(i, (s, d))| counted(i, s, d.hits))
        .collect()
}

fn counted(i: usize, s: &Value, hits: u64) -> Result<Counted, Failure> {
    let at = |why: String| format!("statuses[{i}]: {why}");
    let config = |why: String| Failure::Config(at(why));
    let code = s.get("code").and_then(Value::as_str).unwrap_or("missing");
    if code == "OVER_LIMIT" {
        return Err(config(
            "code OVER_LIMIT: a counter reached its limit (too small a requests_per_unit?)".into(),
        ));
    }
    if code != "OK" {
        return Err(nonsense(at(format!("code {code}"))));
    }
    let limit = s.get("currentLimit").ok_or_else(|| {
        config(
            "no currentLimit: the descriptor matches no limit (domain or service configuration?)"
                .into(),
        )
    })?;
    if limit.get("unit").and_then(Value::as_str) != Some("HOUR") {
        return Err(config(format!(
            "unit {} (the configuration must use unit: hour)",
            limit.get("unit").map_or("missing".into(), Value::to_string)
        )));
    }
    let per_unit = limit
        .get("requestsPerUnit")
        .and_then(Value::as_u64)
        .ok_or_else(|| nonsense(at("no requestsPerUnit".into())))?;
    if per_unit < MIN_LIMIT {
        return Err(config(format!(
            "requestsPerUnit {per_unit} is too small to be a counter (at least {MIN_LIMIT})"
        )));
    }
    counter(s, per_unit, hits).map_err(|why| nonsense(at(why)))
}

/// The counter after this claim's add, from a status whose limit is ours.
fn counter(s: &Value, per_unit: u64, hits: u64) -> Result<Counted, String> {
    let remaining = match s.get("limitRemaining") {
        None => 0,
        Some(r) => r.as_u64().ok_or("limitRemaining is not a number")?,
    };
    if remaining > per_unit {
        return Err(format!(
            "limitRemaining {remaining} above the limit {per_unit}"
        ));
    }
    let after = per_unit - remaining;
    if after < hits {
        return Err(format!(
            "counter {after} below this call's own add of {hits}"
        ));
    }
    let reset_s = s
        .get("durationUntilReset")
        .and_then(Value::as_str)
        .and_then(|d| d.strip_suffix('s'))
        .and_then(|d| d.parse::<u64>().ok())
        .ok_or("no durationUntilReset")?;
    if reset_s > 3600 {
        return Err(format!("durationUntilReset {reset_s}s longer than an hour"));
    }
    Ok(Counted { after, reset_s })
}

/// Smallest `requests_per_unit` accepted as "never reached" (the shipped
/// configuration uses 4,000,000,000; the field is a uint32).
pub const MIN_LIMIT: u64 = 1 << 31;

#[cfg(test)]
mod tests {
    use super::*;

    fn d(counter: Counter, key: &str, hits: u64) -> Claim {
        Claim {
            rule: 0,
            counter,
            key: key.into(),
            hits,
        }
    }

    /// The four descriptors of testdata/ok.json, in order.
    fn sent() -> Vec<Claim> {
        vec![
            d(Counter::Members, "orders:3333334:30:7", 1),
            d(Counter::Members, "orders:3333334:30:6", 0),
            d(Counter::Slots, "orders:3333334:30:7", 10),
            d(Counter::Slots, "orders:3333334:30:6", 4),
        ]
    }

    #[test]
    fn the_request_is_a_post_of_json_with_every_hits_addend() {
        let engine = RatelimitJson {
            domain: "envoy_throttle".into(),
        };
        let r = engine.request(&sent()[1..3]);
        assert_eq!(
            r.headers,
            vec![
                (":method", "POST".to_string()),
                (":path", "/json".to_string()),
                (":authority", "ratelimit".to_string()),
                ("content-type", "application/json".to_string())
            ]
        );
        let body = r.body;
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"descriptors":[{"entries":[{"key":"throttle_members","value":"orders:3333334:30:6"}],"hitsAddend":"0"},{"entries":[{"key":"throttle_slots","value":"orders:3333334:30:7"}],"hitsAddend":"10"}],"domain":"envoy_throttle"}"#
        );
    }

    #[test]
    fn a_real_answer_reveals_each_counter() {
        let got = parse_answer(200, include_bytes!("testdata/ok.json"), &sent()).unwrap();
        let after: Vec<u64> = got.iter().map(|c| c.after).collect();
        assert_eq!(after, vec![1, 0, 10, 4]);
        assert!(got.iter().all(|c| c.reset_s == 2743));
    }

    #[test]
    fn a_real_over_limit_answer_is_a_429() {
        let body = include_bytes!("testdata/over_limit.json");
        let sent = &sent()[..2];
        assert_eq!(parse_answer(429, body, sent), Err(Failure::Status(429)));
        // Even if a proxy in between turned it into a 200, it is refused.
        assert_eq!(
            parse_answer(200, body, sent),
            Err(Failure::Nonsense("overallCode is \"OVER_LIMIT\"".into()))
        );
    }

    #[test]
    fn a_real_answer_without_a_limit_is_a_configuration_mismatch() {
        // What the service answers for a domain or key it has no limit for.
        let e = parse_answer(200, include_bytes!("testdata/no_limit.json"), &sent()[..1]);
        assert_eq!(
            e,
            Err(Failure::Config(
                "statuses[0]: no currentLimit: the descriptor matches no limit (domain or service configuration?)".into()
            ))
        );
    }

    #[test]
    fn nonsense_is_named() {
        let one = &sent()[2..3]; // adds 10
        let ok = |extra: &str| {
            format!(
                r#"{{"overallCode":"OK","statuses":[{{"code":"OK","currentLimit":{{"requestsPerUnit":4000000000,"unit":"HOUR"}},"durationUntilReset":"60s"{extra}}}]}}"#
            )
        };
        // What a service configured for other counters answers: named as
        // a configuration mismatch (the log says what to fix).
        let config: Vec<(String, &str)> = vec![
            (
                ok(r#","limitRemaining":1"#).replace("HOUR", "MINUTE"),
                "statuses[0]: unit \"MINUTE\" (the configuration must use unit: hour)",
            ),
            (
                ok(r#","limitRemaining":1"#).replace("4000000000", "100"),
                "statuses[0]: requestsPerUnit 100 is too small to be a counter (at least 2147483648)",
            ),
            (
                ok("").replace(r#""code":"OK""#, r#""code":"OVER_LIMIT""#),
                "statuses[0]: code OVER_LIMIT: a counter reached its limit (too small a requests_per_unit?)",
            ),
        ];
        for (body, why) in config {
            let got = parse_answer(200, body.as_bytes(), one);
            assert_eq!(got, Err(Failure::Config(why.into())), "{body}");
        }
        let cases: Vec<(String, &str)> = vec![
            (
                "<html>".into(),
                "not JSON: expected value at line 1 column 1",
            ),
            (
                "".into(),
                "not JSON: EOF while parsing a value at line 1 column 0",
            ),
            (r#"{"overallCode":"OK"}"#.into(), "no statuses"),
            (
                r#"{"overallCode":"OK","statuses":[]}"#.into(),
                "0 statuses for 1 descriptors",
            ),
            (
                ok(r#","limitRemaining":4000000005"#),
                "statuses[0]: limitRemaining 4000000005 above the limit 4000000000",
            ),
            (
                ok(r#","limitRemaining":3999999995"#),
                "statuses[0]: counter 5 below this call's own add of 10",
            ),
            (
                ok(r#","limitRemaining":"x""#),
                "statuses[0]: limitRemaining is not a number",
            ),
            (
                ok(r#","limitRemaining":1"#).replace("\"60s\"", "\"7200s\""),
                "statuses[0]: durationUntilReset 7200s longer than an hour",
            ),
        ];
        for (body, why) in cases {
            let got = parse_answer(200, body.as_bytes(), one);
            assert_eq!(got, Err(Failure::Nonsense(why.into())), "{body}");
        }
        // A missing limitRemaining is 0 (proto3 JSON omits zeros): the counter sits at the limit.
        assert_eq!(
            parse_answer(200, ok("").as_bytes(), one).map(|c| c[0].after),
            Ok(4_000_000_000)
        );
        assert_eq!(parse_answer(500, b"", one), Err(Failure::Status(500)));
        // Envoy's own 503s, when it could not reach the service: no answer.
        for body in [
            &b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: Connection refused"[..],
            b"no healthy upstream",
        ] {
            assert_eq!(parse_answer(503, body, one), Err(Failure::Transport));
        }
        assert_eq!(parse_answer(503, b"{}", one), Err(Failure::Status(503)));
        // Envoy's own 504 at engine.timeout: a timeout (seen on real Envoy,
        // tests/cluster/test_other_numbers.py's blips); another 504 is a status.
        assert_eq!(
            parse_answer(504, b"upstream request timeout", one),
            Err(Failure::Timeout)
        );
        assert_eq!(parse_answer(504, b"", one), Err(Failure::Status(504)));
        assert_eq!(
            parse_answer(500, b"no healthy upstream", one),
            Err(Failure::Status(500))
        );
        assert_eq!(
            parse_answer(400, b"Bad Request", one),
            Err(Failure::Status(400))
        );
    }
}
