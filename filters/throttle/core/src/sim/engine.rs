//! The rate limit service (envoyproxy/ratelimit + Redis) as the engine's
//! facts describe it (engine/README.md), in memory.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::clock::NS_PER_S;

/// The rate limit service as engine/README.md describes it, in memory: one
/// counter per `<domain>_<key>_<value>_<hour of the server's clock>`, INCRBY
/// then EXPIRE per descriptor, `limit_remaining = limit - counter`, a bare OK
/// for descriptors without a limit, 400 for an empty descriptor list.
#[derive(Debug, Clone)]
pub struct FakeEngine {
    pub domain: String,
    pub limit: u64,
    counters: HashMap<String, u64>,
    /// Redis commands executed (INCRBY + EXPIRE per descriptor), as `INFO commandstats` counts them.
    pub redis_commands: u64,
    /// Calls answered.
    pub calls: u64,
}

impl Default for FakeEngine {
    fn default() -> Self {
        FakeEngine {
            domain: "envoy_throttle".into(),
            limit: 4_000_000_000,
            counters: HashMap::new(),
            redis_commands: 0,
            calls: 0,
        }
    }
}

impl FakeEngine {
    /// Loses every counter (Redis restarted without persistence).
    pub fn lose_counters(&mut self) {
        self.counters.clear();
    }

    /// Answers one `POST /json` body at the server's wall time `server_now` (ns).
    pub fn handle(&mut self, body: &[u8], server_now: u64) -> (u16, Vec<u8>) {
        self.calls += 1;
        let Ok(req) = serde_json::from_slice::<Value>(body) else {
            return (400, b"Bad Request\n".to_vec());
        };
        let domain = req.get("domain").and_then(Value::as_str).unwrap_or("");
        let Some(ds) = req
            .get("descriptors")
            .and_then(Value::as_array)
            .filter(|d| !d.is_empty())
        else {
            return (400, b"Bad Request\n".to_vec());
        };
        if domain.is_empty() {
            return (400, b"Bad Request\n".to_vec());
        }
        let secs = server_now / NS_PER_S;
        let window = secs / 3600 * 3600;
        let reset = 3600 - secs % 3600;
        let mut statuses = Vec::with_capacity(ds.len());
        for d in ds {
            let entry = d.get("entries").and_then(|e| e.get(0));
            let key = entry
                .and_then(|e| e.get("key"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let value = entry
                .and_then(|e| e.get("value"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let hits = match d.get("hitsAddend") {
                Some(Value::String(s)) => s.parse::<u64>().unwrap_or(1),
                Some(Value::Number(n)) => n.as_u64().unwrap_or(1),
                _ => 1,
            };
            if domain != self.domain
                || !["throttle_slots", "throttle_members", "throttle_demand"].contains(&key)
            {
                statuses.push(json!({"code": "OK"}));
                continue;
            }
            let counter = self
                .counters
                .entry(format!("{domain}_{key}_{value}_{window}"))
                .or_insert(0);
            *counter += hits;
            self.redis_commands += 2;
            let over = *counter > self.limit;
            let mut s = serde_json::Map::new();
            s.insert("code".into(), json!(if over { "OVER_LIMIT" } else { "OK" }));
            s.insert(
                "currentLimit".into(),
                json!({"requestsPerUnit": self.limit, "unit": "HOUR"}),
            );
            // proto3 JSON leaves out zeros: no limitRemaining at or over the limit.
            if *counter < self.limit {
                s.insert("limitRemaining".into(), json!(self.limit - *counter));
            }
            s.insert("durationUntilReset".into(), json!(format!("{reset}s")));
            statuses.push(Value::Object(s));
        }
        let over = statuses
            .iter()
            .any(|s| s.get("code").and_then(Value::as_str) == Some("OVER_LIMIT"));
        let body =
            json!({"overallCode": if over { "OVER_LIMIT" } else { "OK" }, "statuses": statuses});
        (if over { 429 } else { 200 }, body.to_string().into_bytes())
    }
}
