//! Simulation support: shared data in memory, an engine that models the
//! rate limit service, simulated proxies (each a [`Caller`] plus its shared
//! data and waiting requests, exactly as the glue wires them), and a
//! virtual-time world for property tests. The driver in `tools/cluster-sim`
//! runs the same [`SimProxy`] against the real service in real time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use serde_json::{json, Value};

use crate::clock::NS_PER_S;
use crate::config::EngineConfig;
use crate::schedule::{admit, Admission};

use super::caller::{Call, Caller, RuleFacts, RuleSpec, RuleUpdate};
use super::engine::Failure;
use super::grants::{add_waiting, publish, take, Attempt, Reach, Take};
use super::grid::WINDOW_NS;
use super::local_schedule;

pub use crate::testing::{MemBlob, MemCell};

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

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Released at this true wall time, on grid slot `slot` (None: local fallback).
    Released { at: u64, slot: Option<u64> },
    /// Waiting for grants (resolved later into `Released` or `TimedOut`).
    Waiting,
    /// Rejected at once.
    Rejected,
}

/// A released request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub rule: usize,
    /// True wall time the upstream sees it.
    pub at: u64,
    /// True wall time it arrived.
    pub arrived: u64,
    pub slot: Option<u64>,
}

#[derive(Debug, Clone)]
struct RuleShared {
    reach: Reach,
    cursor: MemCell,
    blob: MemBlob,
    waiting: MemCell,
    local_tat: MemCell,
    /// Requests waiting for grants: (arrival true time, arrival proxy time).
    waiters: VecDeque<(u64, u64)>,
    /// Blob version at which a retry last found nothing (u32::MAX: never).
    retried_at_version: u32,
    arrived: u64,
}

/// One simulated Envoy process: the calling VM and the shared data of its rules.
#[derive(Debug, Clone)]
pub struct SimProxy {
    pub caller: Caller,
    /// This host's wall clock minus the true time, ns.
    pub skew_ns: i64,
    rules: Vec<RuleShared>,
    pub releases: Vec<Release>,
    /// Every range granted to this proxy: (rule, [start, end)).
    pub granted: Vec<(usize, (u64, u64))>,
    pub rejected: u64,
    /// Requests that waited for grants until max_queue_delay and were rejected then.
    pub timed_out: u64,
    pub calls: u64,
    pub failures: u64,
}

impl SimProxy {
    pub fn new(engine: &EngineConfig, rules: &[(RuleSpec, Reach)], skew_ns: i64) -> SimProxy {
        SimProxy {
            caller: Caller::new(engine, rules.iter().map(|(s, _)| s.clone()).collect()),
            skew_ns,
            rules: rules
                .iter()
                .map(|(_, reach)| RuleShared {
                    reach: *reach,
                    cursor: MemCell::default(),
                    blob: MemBlob::default(),
                    waiting: MemCell::default(),
                    local_tat: MemCell::default(),
                    waiters: VecDeque::new(),
                    retried_at_version: u32::MAX,
                    arrived: 0,
                })
                .collect(),
            releases: Vec::new(),
            granted: Vec::new(),
            rejected: 0,
            timed_out: 0,
            calls: 0,
            failures: 0,
        }
    }

    /// Sets the calling VM's phase (see [`Caller::with_phase`]).
    pub fn with_phase(mut self, permille: u64) -> SimProxy {
        self.caller = self.caller.with_phase(permille);
        self
    }

    /// This host's wall clock at true time `t`.
    pub fn clock(&self, t: u64) -> u64 {
        t.saturating_add_signed(self.skew_ns)
    }

    /// A request of rule `rule` arrives at true time `t`.
    pub fn arrive(&mut self, rule: usize, t: u64) -> Fate {
        let now = self.clock(t);
        let Some(r) = self.rules.get_mut(rule) else {
            return Fate::Rejected;
        };
        r.arrived += 1;
        let decision = take(
            &mut r.cursor,
            &mut r.blob,
            &mut r.waiting,
            &r.reach,
            now,
            true,
            Attempt::First,
        );
        match self.settle(rule, t, now, decision) {
            Some(fate) => fate,
            None => {
                if let Some(r) = self.rules.get_mut(rule) {
                    r.waiters.push_back((t, now));
                }
                Fate::Waiting
            }
        }
    }

    /// Records a decision; None for `Wait`.
    fn settle(&mut self, rule: usize, arrived: u64, now: u64, decision: Take) -> Option<Fate> {
        let skew = self.skew_ns;
        let r = self.rules.get_mut(rule)?;
        let released = |at_local: u64, slot| {
            let at = at_local.saturating_add_signed(-skew);
            (
                Release {
                    rule,
                    at,
                    arrived,
                    slot,
                },
                Fate::Released { at, slot },
            )
        };
        let (release, fate) = match decision {
            Take::Now { slot } => released(now, Some(slot)),
            Take::Hold { slot, delay_ns } => released(now + delay_ns, Some(slot)),
            Take::Wait => return None,
            Take::Local { interval_ns } => {
                let s = local_schedule(&r.reach, interval_ns, Attempt::First);
                match admit(&mut r.local_tat, &s, now, true) {
                    Admission::Now { .. } => released(now, None),
                    Admission::Hold { release_at, .. } => released(release_at, None),
                    _ => {
                        self.rejected += 1;
                        return Some(Fate::Rejected);
                    }
                }
            }
            Take::Reject { .. } | Take::Deny | Take::Contention => {
                self.rejected += 1;
                return Some(Fate::Rejected);
            }
        };
        self.releases.push(release);
        Some(fate)
    }

    /// The calling VM's tick and the workers' retries, at true time `t`.
    /// Returns the call to send.
    pub fn tick(&mut self, t: u64) -> Option<Call> {
        let now = self.clock(t);
        for rule in 0..self.rules.len() {
            self.retry_waiters(rule, now);
        }
        let facts: Vec<RuleFacts> = self
            .rules
            .iter()
            .map(|r| RuleFacts {
                arrived_total: r.arrived,
                waiting: r.waiting.v.map_or(0, |[n, _]| n),
            })
            .collect();
        let (call, updates) = self.caller.tick(now, &facts);
        self.apply(now, &updates);
        if call.is_some() {
            self.calls += 1;
        }
        call
    }

    /// The workers' retries of requests waiting for grants, oldest first (as
    /// the glue should do them): expired ones are rejected; the rest are
    /// retried only when the grants blob changed since a retry last found
    /// nothing, and only until one still has to wait.
    fn retry_waiters(&mut self, rule: usize, now: u64) {
        loop {
            let Some(r) = self.rules.get_mut(rule) else {
                return;
            };
            let Some(&(arrived, started)) = r.waiters.front() else {
                return;
            };
            let waited_ns = now.saturating_sub(started);
            if waited_ns >= r.reach.max_delay_ns {
                // Its max_queue_delay is over: rejected (the glue answers 429 now).
                r.waiters.pop_front();
                let _ = add_waiting(&mut r.waiting, -1);
                self.timed_out += 1;
                continue;
            }
            if r.blob.version == r.retried_at_version {
                return;
            }
            let d = take(
                &mut r.cursor,
                &mut r.blob,
                &mut r.waiting,
                &r.reach,
                now,
                true,
                Attempt::Retry { waited_ns },
            );
            if matches!(d, Take::Wait) {
                r.retried_at_version = r.blob.version;
                return;
            }
            r.waiters.pop_front();
            self.settle(rule, arrived, now, d);
        }
    }

    /// The answer to the call in flight, at true time `t`.
    pub fn answer(&mut self, t: u64, answer: Result<(u16, &[u8]), Failure>) {
        let now = self.clock(t);
        let before: u64 = (0..self.rules.len())
            .filter_map(|i| self.caller.stats(i))
            .map(|s| s.failures)
            .sum();
        let updates = self.caller.on_answer(now, answer);
        let after: u64 = (0..self.rules.len())
            .filter_map(|i| self.caller.stats(i))
            .map(|s| s.failures)
            .sum();
        if after > before {
            self.failures += 1;
        }
        self.apply(now, &updates);
    }

    fn apply(&mut self, now: u64, updates: &[RuleUpdate]) {
        for u in updates {
            for &range in &u.ranges {
                self.granted.push((u.rule, range));
            }
            if let Some(r) = self.rules.get_mut(u.rule) {
                let _ = publish(
                    &mut r.blob,
                    &mut r.cursor,
                    &r.reach,
                    now,
                    u.mode,
                    u.grant_rate_per_s,
                    &u.ranges,
                );
            }
        }
    }

    /// Requests waiting for grants now.
    pub fn waiting(&self) -> usize {
        self.rules.iter().map(|r| r.waiters.len()).sum()
    }
}

/// How the network and the engine treat one call in the virtual world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// Reaches the engine after `ns / 2`, answered after `ns` (a timeout if beyond it).
    Latency(u64),
    /// Never reaches the engine: a transport error after `ns`.
    Refused(u64),
    /// The engine answers this nonsense instead (garbage, 500...).
    Nonsense(u16, &'static [u8]),
}

/// A virtual-time run: proxies with their own arrivals, one fake engine.
pub struct World {
    pub proxies: Vec<SimProxy>,
    pub engine: FakeEngine,
    /// The engine's clock minus the true time, ns.
    pub engine_skew_ns: i64,
    /// Glue tick period of the calling VM and of the workers' retries.
    pub tick_ns: u64,
    /// Time step of arrivals.
    pub step_ns: u64,
    timeout_ns: u64,
    /// Events: (true time, sequence, proxy, what).
    events: BinaryHeap<Reverse<(u64, u64, usize, Ev)>>,
    seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The call reaches the engine; its answer takes `back_ns` more, unless
    /// the proxy gave up (`late`: a timeout was already scheduled).
    Serve {
        body: Vec<u8>,
        back_ns: u64,
        late: bool,
    },
    /// The answer reaches the proxy.
    Answer(u16, Vec<u8>),
    /// The call fails: a timeout (true) or a transport error.
    Fail(bool),
}

impl World {
    pub fn new(proxies: Vec<SimProxy>, timeout_ns: u64) -> World {
        World {
            proxies,
            engine: FakeEngine::default(),
            engine_skew_ns: 0,
            tick_ns: 5 * crate::clock::NS_PER_MS,
            step_ns: crate::clock::NS_PER_MS,
            timeout_ns,
            events: BinaryHeap::new(),
            seq: 0,
        }
    }

    fn push(&mut self, at: u64, proxy: usize, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, proxy, ev)));
    }

    /// Runs from true time `start` to `end`. `arrivals(proxy, from, to)`
    /// gives the arrivals of each proxy in `(from, to]` as (rule, true time);
    /// `net(proxy, call number)` how each call fares.
    pub fn run(
        &mut self,
        start: u64,
        end: u64,
        mut arrivals: impl FnMut(usize, u64, u64) -> Vec<(usize, u64)>,
        mut net: impl FnMut(usize, u64) -> Net,
    ) {
        let mut t = start;
        let mut next_tick = start;
        let mut calls = 0u64;
        while t < end {
            let to = t + self.step_ns;
            while self
                .events
                .peek()
                .is_some_and(|Reverse((at, ..))| *at <= to)
            {
                let Some(Reverse((at, _, p, ev))) = self.events.pop() else {
                    break;
                };
                self.deliver(at, p, ev);
            }
            for p in 0..self.proxies.len() {
                for (rule, at) in arrivals(p, t, to) {
                    if let Some(proxy) = self.proxies.get_mut(p) {
                        proxy.arrive(rule, at);
                    }
                }
            }
            if to >= next_tick {
                next_tick += self.tick_ns;
                for p in 0..self.proxies.len() {
                    let Some(call) = self.proxies.get_mut(p).and_then(|x| x.tick(to)) else {
                        continue;
                    };
                    calls += 1;
                    match net(p, calls) {
                        Net::Latency(ns) => {
                            let late = ns > self.timeout_ns;
                            let body = call.request.body;
                            self.push(
                                to + ns / 2,
                                p,
                                Ev::Serve {
                                    body,
                                    back_ns: ns - ns / 2,
                                    late,
                                },
                            );
                            if late {
                                self.push(to + self.timeout_ns, p, Ev::Fail(true));
                            }
                        }
                        Net::Refused(ns) => self.push(to + ns, p, Ev::Fail(false)),
                        Net::Nonsense(status, body) => self.push(
                            to + crate::clock::NS_PER_MS,
                            p,
                            Ev::Answer(status, body.to_vec()),
                        ),
                    }
                }
            }
            t = to;
        }
    }

    fn deliver(&mut self, at: u64, p: usize, ev: Ev) {
        match ev {
            Ev::Serve {
                body,
                back_ns,
                late,
            } => {
                let server_now = at.saturating_add_signed(self.engine_skew_ns);
                let (status, answer) = self.engine.handle(&body, server_now);
                if !late {
                    self.push(at + back_ns, p, Ev::Answer(status, answer));
                }
            }
            Ev::Answer(status, body) => {
                if let Some(proxy) = self.proxies.get_mut(p) {
                    if proxy.caller.in_flight() {
                        proxy.answer(at, Ok((status, &body)));
                    }
                }
            }
            Ev::Fail(timeout) => {
                if let Some(proxy) = self.proxies.get_mut(p) {
                    if proxy.caller.in_flight() {
                        let f = if timeout {
                            Failure::Timeout
                        } else {
                            Failure::Transport
                        };
                        proxy.answer(at, Err(f));
                    }
                }
            }
        }
    }
}

/// Most releases in any window of `w` ns (`times` sorted).
pub fn max_in_window(times: &[u64], w: u64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for (hi, &t) in times.iter().enumerate() {
        while times.get(lo).is_some_and(|&x| x + w <= t) {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best
}

/// Whether any two ranges overlap (a slot granted twice).
pub fn first_overlap(ranges: &[(u64, u64)]) -> Option<((u64, u64), (u64, u64))> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .find(|w| matches!(w, [a, b] if b.0 < a.1))
        .and_then(|w| Some((*w.first()?, *w.get(1)?)))
}

/// The hour (service window) of true time `t`, for reports.
pub fn hour_of(t: u64) -> u64 {
    t / WINDOW_NS
}
