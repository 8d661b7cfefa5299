//! The glue's every path against a fake host, natively and fast: hold, tick,
//! resume; cancel while queued; gone at its turn; timed out; slot return and
//! the wake queue; a busy worker state; replies and headers as the host gets
//! them; metrics and the tick periods; configuration; cluster calls. The
//! decisions themselves are tested in the core (`stream/tests.rs`).

use std::collections::HashMap;

use throttle_core::reply::Reply;
use throttle_core::NS_PER_MS;

use crate::host::fake::Fake;
use crate::host::Host;
use crate::http::{Flow, HttpStream};
use crate::root::Root;

const MS: u64 = NS_PER_MS;

/// One worker (a root context and its streams) on a fake host.
struct Worker {
    host: Fake,
    root_id: u32,
    root: Root<Fake>,
    streams: HashMap<u32, HttpStream<Fake>>,
}

impl Worker {
    fn new(host: Fake, root_id: u32, config: &str) -> Self {
        let mut root = Root::new(host, root_id);
        host.state().current = root_id;
        assert!(
            root.on_configure(config.as_bytes()),
            "config refused: {:?}",
            host.state().logs
        );
        Worker {
            host,
            root_id,
            root,
            streams: HashMap::new(),
        }
    }

    fn at(&self, ms: u64) {
        self.host.state().now = 1_000_000 * MS + ms * MS;
    }

    fn request(&mut self, id: u32, headers: &[(&str, &str)]) -> Flow {
        {
            let mut s = self.host.state();
            s.current = id;
            let mut lines = vec![
                (":path".to_string(), b"/".to_vec()),
                (":method".to_string(), b"GET".to_vec()),
                (":authority".to_string(), b"example.com".to_vec()),
            ];
            for (n, v) in headers {
                lines.retain(|(name, _)| !(n.starts_with(':') && name == n));
                lines.push((n.to_string(), v.as_bytes().to_vec()));
            }
            s.request.insert(id, lines);
        }
        let mut stream = self.root.create_stream(id);
        let flow = stream.on_request_headers();
        self.streams.insert(id, stream);
        flow
    }

    fn with<T>(&mut self, id: u32, f: impl FnOnce(&mut HttpStream<Fake>) -> T) -> T {
        self.host.state().current = id;
        let stream = self.streams.get_mut(&id).expect("a stream");
        f(stream)
    }

    fn respond(&mut self, id: u32, end_of_stream: bool) -> Flow {
        self.with(id, |s| s.on_response_headers(end_of_stream))
    }

    fn response_end(&mut self, id: u32) -> Flow {
        self.with(id, |s| s.on_response_end())
    }

    fn done(&mut self, id: u32) {
        self.with(id, |s| s.on_done());
        self.streams.remove(&id);
    }

    fn tick(&mut self) {
        self.host.state().current = self.root_id;
        self.root.on_tick();
    }
}

impl Worker {
    /// A metric's value, after handing the pending counts to the host.
    fn metric(&self, rule: &str, stat: &str) -> i64 {
        self.root.flush();
        self.host
            .state()
            .metric(&format!("throttle.rule.{rule}.{stat}"))
    }

    /// Every counter and gauge of a rule that is not zero, after handing the
    /// pending counts to the host; `requests` (every request the rule applied
    /// to) is checked to equal the decisions' total, then left out.
    fn stats(&self, rule: &str) -> Vec<(String, i64)> {
        self.root.flush();
        let prefix = format!("throttle.rule.{rule}.");
        let all: Vec<(String, i64)> = self
            .host
            .state()
            .metrics
            .iter()
            .filter(|(n, _, v)| n.starts_with(&prefix) && *v != 0)
            .map(|(n, _, v)| (n.trim_start_matches(&prefix).to_string(), *v))
            .collect();
        let get = |name: &str| all.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
        // Held requests rejected later, on tick (queued = released + cancelled
        // + gone + timed_out + held + those): not new requests.
        let rejected_later = get("queued")
            - get("released")
            - get("cancelled")
            - get("gone")
            - get("timed_out")
            - get("held");
        let decided = get("admitted")
            + get("queued")
            + get("would_queue")
            + get("would_reject")
            + get("rejected")
            - rejected_later;
        assert_eq!(
            get("requests"),
            decided,
            "requests counts every decision: {all:?}"
        );
        all.into_iter().filter(|(n, _)| n != "requests").collect()
    }
}

fn s(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
}

fn reply(host: Fake, id: u32) -> Option<Reply> {
    host.state().replies.get(&id).cloned()
}

fn response_headers(host: Fake, id: u32) -> Vec<(String, String)> {
    host.state()
        .response
        .get(&id)
        .map(|h| h.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

const RATE: &str = r#"{"rules": [{"name": "r", "rate": "10/s", "max_queue_delay": "250ms"}]}"#;

#[test]
fn within_the_rate_continues_and_counts_once() {
    let host = Fake::new();
    let mut w = Worker::new(host, 1, RATE);
    w.at(0);
    assert_eq!(w.request(10, &[]), Flow::Continue);
    assert_eq!(w.respond(10, true), Flow::Continue);
    w.done(10);
    assert!(response_headers(host, 10).is_empty());
    // Counters are handed to Envoy by a slow tick, not per request.
    let admitted = || host.state().metric("throttle.rule.r.admitted");
    assert_eq!(admitted(), 0, "not yet");
    assert_eq!(
        host.state().tick_ms,
        100,
        "nothing held: a slow tick hands the counts over"
    );
    w.tick();
    assert_eq!(admitted(), 1);
    assert_eq!(
        host.state().tick_ms,
        100,
        "traffic in the last period: keep the slow tick"
    );
    w.tick();
    assert_eq!(host.state().tick_ms, 0, "a quiet period: no tick at all");
    assert_eq!(w.stats("r"), s(&[("admitted", 1)]));
}

#[test]
fn held_then_released_at_its_turn_with_its_wait() {
    let host = Fake::new();
    let mut w = Worker::new(host, 1, RATE);
    w.at(0);
    assert_eq!(w.request(10, &[]), Flow::Continue);
    assert_eq!(w.request(11, &[]), Flow::Pause);
    assert_eq!(host.state().tick_ms, 1, "holding starts the tick");
    assert_eq!(
        w.stats("r"),
        s(&[("admitted", 1), ("queued", 1), ("held", 1)])
    );
    // A body of a held request waits with it.
    assert_eq!(w.with(11, |s| s.on_request_body()), Flow::Pause);
    // 99 ms: not yet.
    w.at(99);
    w.tick();
    assert!(host.state().resumed.is_empty());
    // Its turn (100 ms); the tick runs 4 ms late.
    w.at(104);
    w.tick();
    assert_eq!(host.state().resumed, vec![11]);
    assert_eq!(
        host.state().tick_ms,
        100,
        "nothing held: back to the slow tick"
    );
    assert_eq!(
        w.stats("r"),
        s(&[("admitted", 1), ("queued", 1), ("released", 1)])
    );
    assert_eq!(
        host.state().recorded,
        vec![("throttle.rule.r.wait_ms".to_string(), 104)]
    );
    assert_eq!(w.with(11, |s| s.on_request_body()), Flow::Continue);
    w.respond(11, true);
    assert_eq!(
        response_headers(host, 11),
        vec![("x-throttle-wait-ms".to_string(), "104".to_string())]
    );
}

#[test]
fn beyond_max_queue_delay_is_rejected_at_once_exactly() {
    let host = Fake::new();
    let mut w = Worker::new(host, 1, RATE);
    w.at(0);
    for id in 10..13 {
        w.request(id, &[]);
    }
    // Turns at 0, 100, 200 ms; the fourth (300 ms) is beyond 250 ms.
    assert_eq!(w.request(13, &[]), Flow::Pause);
    assert_eq!(
        reply(host, 13),
        Some(Reply {
            status: 429,
            grpc_status: None,
            headers: vec![
                ("retry-after", "1".to_string()),
                ("content-type", "text/plain".to_string())
            ],
            body: "throttled: retry later\n",
            details: "throttle_rejected",
        })
    );
    // The reply passes through the filter's own response callback: nothing added twice.
    w.respond(13, true);
    assert!(response_headers(host, 13).is_empty());
    w.done(13);
    assert_eq!(
        w.stats("r"),
        s(&[("admitted", 1), ("queued", 2), ("rejected", 1), ("held", 2)])
    );
}

#[test]
fn rate_limit_headers_replace_the_upstreams_and_are_computed_when_the_response_leaves() {
    let host = Fake::new();
    let cfg = r#"{"rules": [{"name": "api", "rate": "10/s", "max_queue_delay": "1s"}], "rate_limit_headers": true}"#;
    let mut w = Worker::new(host, 1, cfg);
    w.at(0);
    w.request(10, &[]);
    w.request(11, &[]);
    // The upstream's own header is replaced, not appended.
    host.state()
        .response
        .entry(10)
        .or_default()
        .insert("ratelimit".into(), "\"upstream\";r=5".into());
    w.respond(10, true);
    // As this request left the schedule (tat = 100 ms): one interval owed, 9
    // left; the whole quota is back in 100 ms (rounded up: 1 s).
    assert_eq!(
        response_headers(host, 10),
        vec![
            ("ratelimit".to_string(), "\"api\";r=9;t=1".to_string()),
            (
                "ratelimit-policy".to_string(),
                "\"api\";q=10;w=1".to_string()
            )
        ]
    );
    // The held one's response leaves 350 ms later: the schedule has moved on.
    w.at(100);
    w.tick();
    w.at(350);
    w.respond(11, true);
    assert_eq!(
        response_headers(host, 11).first(),
        Some(&("ratelimit".to_string(), "\"api\";r=10;t=0".to_string()))
    );
}

/// At 0 ms under [`RATE`]: stream 10 admitted, stream 11 held behind it.
fn one_admitted_one_held(host: Fake) -> Worker {
    let mut w = Worker::new(host, 1, RATE);
    w.at(0);
    assert_eq!(w.request(10, &[]), Flow::Continue);
    assert_eq!(w.request(11, &[]), Flow::Pause);
    w
}

#[test]
fn a_client_that_leaves_while_queued_is_cancelled_and_never_resumed() {
    let host = Fake::new();
    let mut w = one_admitted_one_held(host);
    w.done(11);
    assert_eq!(
        w.stats("r"),
        s(&[("admitted", 1), ("queued", 1), ("cancelled", 1)])
    );
    w.at(200);
    w.tick();
    assert!(host.state().resumed.is_empty());
    assert_eq!(
        host.state().tick_ms,
        0,
        "nothing held, nothing counted since"
    );
}

#[test]
fn counts_pending_when_the_plugin_goes_away_reach_the_host() {
    // A drain closes held streams and Envoy then deletes the plugin, with no
    // tick in between: the root's on_done hands the last counts over.
    let host = Fake::new();
    let mut w = one_admitted_one_held(host);
    w.done(11);
    let name = "throttle.rule.r.cancelled";
    assert_eq!(host.state().metric(name), 0, "batched, not yet handed over");
    w.root.on_done();
    assert_eq!(host.state().metric(name), 1);
    assert_eq!(host.state().metric("throttle.rule.r.held"), 0);
    assert_eq!(host.state().metric("throttle.rule.r.queued"), 1);
}

#[test]
fn a_stream_gone_at_its_turn_is_counted_gone() {
    let host = Fake::new();
    let mut w = one_admitted_one_held(host);
    host.state().gone.insert(11);
    w.at(100);
    w.tick();
    assert_eq!(
        w.stats("r"),
        s(&[("admitted", 1), ("queued", 1), ("gone", 1)])
    );
    assert!(
        host.state().recorded.is_empty(),
        "no wait recorded for a gone stream"
    );
}

#[test]
fn envoy_answering_a_held_request_counts_as_timed_out_not_cancelled() {
    let host = Fake::new();
    let mut w = one_admitted_one_held(host);
    // stream_idle_timeout: Envoy's 504 passes through the response callback.
    w.at(50);
    w.respond(11, true);
    w.done(11);
    assert_eq!(
        w.stats("r"),
        s(&[("admitted", 1), ("queued", 1), ("timed_out", 1)])
    );
    w.at(100);
    w.tick();
    assert!(host.state().resumed.is_empty());
}

const GATE: &str = r#"{"rules": [{"name": "c", "concurrency": 1, "max_queue_delay": "1s"}]}"#;

#[test]
fn the_gate_lets_one_in_and_hands_the_slot_over_on_response_end() {
    let host = Fake::new();
    let mut w = Worker::new(host, 1, GATE);
    w.at(0);
    assert_eq!(w.request(10, &[]), Flow::Continue);
    assert_eq!(w.request(11, &[]), Flow::Pause);
    assert_eq!(
        w.stats("c"),
        s(&[
            ("admitted", 1),
            ("queued", 1),
            ("held", 1),
            ("in_flight", 1)
        ])
    );
    // Headers without end: the slot is still in use; the body's end returns it.
    w.respond(10, false);
    assert_eq!(w.metric("c", "in_flight"), 1);
    w.response_end(10);
    // The returned slot wakes the worker through its queue, at once.
    let queue = host.state().queues.len() as u32 - 1;
    assert_eq!(host.state().queues[queue as usize].1.len(), 1);
    w.root.on_queue_ready(queue);
    assert_eq!(host.state().resumed, vec![11]);
    assert_eq!(
        w.stats("c"),
        s(&[
            ("admitted", 1),
            ("queued", 1),
            ("released", 1),
            ("in_flight", 1)
        ])
    );
    // Trailers end the next one's response.
    w.with(11, |s| s.on_response_end()); // trailers
    assert_eq!(w.metric("c", "in_flight"), 0);
    w.done(10);
    w.done(11);
    assert_eq!(w.metric("c", "in_flight"), 0, "returned once only");
}

#[test]
fn a_busy_worker_state_never_strands_a_request() {
    let host = Fake::new();
    let mut w = Worker::new(host, 1, RATE);
    w.at(0);
    w.request(10, &[]);
    // Something holds the worker state (cannot happen in one thread): the
    // glue fails closed without it (nothing held unrecorded), counted as
    // contention.
    let worker = w.root.worker();
    let guard = worker.core.borrow_mut();
    let reads = host.state().clock_reads;
    assert_eq!(w.request(11, &[]), Flow::Pause);
    drop(guard);
    assert_eq!(reply(host, 11).map(|r| r.status), Some(429));
    assert_eq!(host.state().clock_reads, reads, "decided without a clock");
    assert!(host
        .state()
        .logs
        .iter()
        .any(|(_, m)| m.contains("worker state busy")));
    assert_eq!(
        w.stats("r"),
        s(&[("admitted", 1), ("rejected", 1), ("contention", 1)])
    );
    // Under dry-run it goes on, as a request that would have been rejected.
    let host = Fake::new();
    let cfg =
        r#"{"dry_run": true, "dry_run_headers": true, "rules": [{"name": "d", "rate": "10/s"}]}"#;
    let mut w = Worker::new(host, 1, cfg);
    let worker = w.root.worker();
    let guard = worker.core.borrow_mut();
    assert_eq!(host.state().tick_ms, 0);
    assert_eq!(w.request(10, &[]), Flow::Continue);
    drop(guard);
    assert_eq!(
        host.state().tick_ms,
        100,
        "counted through the one route: a tick hands the counts over"
    );
    w.respond(10, true);
    assert_eq!(
        response_headers(host, 10),
        vec![(
            "x-throttle-dry-run".to_string(),
            "rejected; contention".to_string()
        )]
    );
    assert_eq!(w.stats("d"), s(&[("contention", 1), ("would_reject", 1)]));

    // A gate cannot record a slot without the worker state: rejected, counted as contention.
    let host = Fake::new();
    let mut w = Worker::new(host, 1, GATE);
    let worker = w.root.worker();
    let guard = worker.core.borrow_mut();
    assert_eq!(w.request(10, &[]), Flow::Pause);
    drop(guard);
    assert_eq!(w.stats("c"), s(&[("rejected", 1), ("contention", 1)]));
}

#[test]
fn broken_shared_data_fails_closed() {
    let host = Fake::new();
    let mut w = Worker::new(host, 1, RATE);
    w.at(0);
    host.state().shared_broken = true;
    assert_eq!(w.request(10, &[]), Flow::Pause);
    assert_eq!(reply(host, 10).map(|r| r.status), Some(429));
    assert_eq!(w.stats("r"), s(&[("rejected", 1), ("contention", 1)]));
}

#[test]
fn a_waiter_on_another_worker_is_woken_through_its_queue() {
    let host = Fake::new();
    let mut a = Worker::new(host, 1, GATE);
    let mut b = Worker::new(host, 2, GATE);
    a.at(0);
    assert_eq!(a.request(10, &[]), Flow::Continue);
    assert_eq!(b.request(20, &[]), Flow::Pause);
    a.respond(10, true);
    // Both workers' queues got a wake; b's resumes its waiter without a tick.
    let queues: Vec<usize> = host.state().queues.iter().map(|(_, q)| q.len()).collect();
    assert_eq!(queues, vec![1, 1]);
    a.root.on_queue_ready(0);
    assert!(host.state().resumed.is_empty(), "a has no waiter");
    b.root.on_queue_ready(1);
    assert_eq!(host.state().resumed, vec![20]);
}

#[test]
fn requests_matching_no_rule_pass_untouched_and_read_no_clock() {
    let host = Fake::new();
    let cfg = r#"{"rules": [{"name": "admin", "rate": "1/s", "max_queue_delay": "0s",
                  "match": {"path_prefix": "/admin"}}]}"#;
    let mut w = Worker::new(host, 1, cfg);
    w.at(0);
    assert_eq!(w.request(10, &[(":path", "/public")]), Flow::Continue);
    assert_eq!(host.state().clock_reads, 0, "no rule, no clock");
    assert_eq!(w.request(11, &[(":path", "/%61dmin/x")]), Flow::Continue);
    assert_eq!(
        w.request(12, &[(":path", "//admin")]),
        Flow::Pause,
        "same rule, second request"
    );
    assert_eq!(w.stats("admin"), s(&[("admitted", 1), ("rejected", 1)]));
}

#[test]
fn keys_by_principal_and_by_header_lines() {
    let host = Fake::new();
    let cfg = r#"{"rules": [{"name": "p", "rate": "1/h", "max_queue_delay": "0s", "key": {"source": "principal"}}]}"#;
    let mut w = Worker::new(host, 1, cfg);
    w.at(0);
    for (id, who) in [(10, "sa/a"), (11, "sa/b"), (12, "sa/a")] {
        host.state().properties.insert(
            (id, "connection.uri_san_peer_certificate".into()),
            format!("spiffe://cluster.local/ns/default/{who}").into_bytes(),
        );
    }
    assert_eq!(w.request(10, &[]), Flow::Continue);
    assert_eq!(w.request(11, &[]), Flow::Continue);
    assert_eq!(w.request(12, &[]), Flow::Pause, "sa/a's second request");
    // A forged X-Forwarded-For changes nothing: the key is the identity.
    assert_eq!(
        w.request(13, &[("x-forwarded-for", "10.0.0.1")]),
        Flow::Continue,
        "no identity: unkeyed"
    );
    assert_eq!(
        w.request(14, &[("x-forwarded-for", "10.0.0.2")]),
        Flow::Pause
    );
}

#[test]
fn a_bad_configuration_is_refused_and_logged_by_field() {
    let host = Fake::new();
    let mut root = Root::new(host, 1);
    assert!(!root.on_configure(br#"{"rules": [{"name": "a", "rate": "fast", "rate": 2}]}"#));
    let logs: Vec<String> = host.state().logs.iter().map(|(_, m)| m.clone()).collect();
    assert_eq!(
        logs,
        vec![
            "throttle[root 1]: config refused: rules[0].rate: duplicate field (JSON objects must not repeat a name; which one would win is unclear)".to_string(),
        ]
    );
    // A stream of an unconfigured root passes.
    let mut s = root.create_stream(5);
    assert_eq!(s.on_request_headers(), Flow::Continue);
    assert!(host.monotonic_ns() == 0);
}

// ------------------------------------------------------------ cluster scope

use throttle_core::cluster::sim::FakeEngine;

/// Wall time of the tests' cluster runs: the middle of an hour (claims stop
/// near the hour's edge, as the engine's window demands).
const WALL0: u64 = 1_800_000_000 * 1_000_000_000 + 1_800 * 1_000_000_000;

fn cluster_config(on_failure: &str) -> String {
    format!(
        r#"{{"engine": {{"cluster": "throttle_engine", "timeout": "50ms", "fallback_after": "250ms"}},
            "rules": [{{"name": "c", "rate": "100/s", "max_queue_delay": "1s", "scope": "cluster",
                        "expected_replicas": 2, "on_engine_failure": "{on_failure}"}}]}}"#
    )
}

impl Worker {
    /// Both clocks at `ms` past the start.
    fn at_both(&self, ms: u64) {
        self.at(ms);
        self.host.state().wall = WALL0 + ms * MS;
    }

    /// Ticks every 5 ms from `from_ms` to `to_ms`, answering every call with
    /// `engine` (None: the engine does not answer in time).
    fn run(&mut self, from_ms: u64, to_ms: u64, mut engine: Option<&mut FakeEngine>) {
        let mut answered = self.host.state().calls.len();
        let mut t = from_ms;
        while t <= to_ms {
            self.at_both(t);
            self.tick();
            let calls = self.host.state().calls.clone();
            for (token, _, _, body, _) in calls.iter().skip(answered) {
                let answer = match engine.as_deref_mut() {
                    Some(e) => {
                        let (status, body) = e.handle(body, WALL0 + t * MS);
                        (Some(status), body)
                    }
                    None => (None, Vec::new()),
                };
                let size = answer.1.len();
                self.host.state().answer = Some(answer);
                self.root.on_http_call_response(*token, size);
            }
            answered = calls.len();
            t += 5;
        }
    }
}

fn cluster_worker(host: Fake, on_failure: &str) -> Worker {
    host.state().clusters = vec!["throttle_engine".into()];
    let w = Worker::new(host, 1, &cluster_config(on_failure));
    w.at_both(0);
    w
}

#[test]
fn a_cluster_rule_waits_for_its_first_grants_then_takes_its_slots() {
    let host = Fake::new();
    let mut w = cluster_worker(host, "local_share");
    let mut engine = FakeEngine::default();
    assert_eq!(
        host.state().tick_ms,
        20,
        "a VM with cluster rules ticks to call the engine"
    );
    // No grants yet: the first request goes at once on credit (burst 0: one
    // at a time); the next waits for grants.
    assert_eq!(w.request(9, &[]), Flow::Continue);
    assert_eq!(w.request(10, &[]), Flow::Pause);
    assert_eq!(
        w.stats("c"),
        s(&[
            ("admitted", 1),
            ("queued", 1),
            ("held", 1),
            ("slots_taken", 1),
            ("slots_ahead", 1)
        ])
    );
    w.run(0, 400, Some(&mut engine));
    assert_eq!(
        host.state().resumed,
        vec![10],
        "resumed once its grant came"
    );
    let calls = host.state().calls.clone();
    assert!(!calls.is_empty());
    let (_, cluster, headers, _, timeout) = &calls[0];
    assert_eq!(cluster, "throttle_engine");
    assert!(headers.contains(&(":path".into(), "/json".into())));
    assert_eq!(*timeout, 50);
    // At most one call per 100 ms per process.
    assert!(calls.len() <= 5, "{} calls in 400 ms", calls.len());
    assert_eq!(w.metric("c", "engine_calls"), calls.len() as i64);
    assert_eq!(w.metric("c", "engine_failures"), 0);
    assert!(w.metric("c", "slots_granted") >= 2);
    assert_eq!(w.metric("c", "slots_taken"), 2);
    assert_eq!(w.metric("c", "held"), 0);
    // With demand seen, the proxy claims ahead: the next request takes a slot
    // (at once or held until it) and needs no grant first.
    w.at_both(405);
    let flow = w.request(11, &[]);
    w.run(410, 600, Some(&mut engine));
    let resumed = host.state().resumed.clone();
    assert!(
        flow == Flow::Continue || resumed.contains(&11),
        "{flow:?} {resumed:?}"
    );
    assert!(reply(host, 11).is_none());
    assert_eq!(w.metric("c", "slots_taken"), 3);
}

#[test]
fn an_engine_that_is_down_falls_back_to_the_local_share_then_recovers() {
    let host = Fake::new();
    let mut w = cluster_worker(host, "local_share");
    // The engine's cluster does not answer: every call fails. The first
    // request goes on credit (never repaid: no grant comes), the next waits.
    assert_eq!(w.request(9, &[]), Flow::Continue);
    assert_eq!(w.request(10, &[]), Flow::Pause);
    w.run(0, 600, None);
    assert!(w.metric("c", "engine_failures") >= 1);
    assert!(
        w.metric("c", "fallback_ms") > 0,
        "in fallback after fallback_after"
    );
    assert_eq!(
        host.state().resumed,
        vec![10],
        "the waiting request went on the local schedule"
    );
    // In fallback: paced locally at 100/s / 2 replicas = one per 20 ms.
    w.at_both(605);
    assert_eq!(w.request(11, &[]), Flow::Continue);
    assert_eq!(
        w.request(12, &[]),
        Flow::Pause,
        "the next local slot is 20 ms away"
    );
    // The engine comes back: the first good answer returns the rule to the grid.
    let mut engine = FakeEngine::default();
    w.run(610, 1200, Some(&mut engine));
    assert!(w.metric("c", "slots_granted") >= 1);
    let fallback = w.metric("c", "fallback_ms");
    w.run(1205, 1400, Some(&mut engine));
    assert_eq!(
        w.metric("c", "fallback_ms"),
        fallback,
        "no longer in fallback"
    );
}

#[test]
fn deny_rejects_while_the_engine_fails() {
    let host = Fake::new();
    let mut w = cluster_worker(host, "deny");
    host.state().clusters.clear(); // the cluster is unknown: every call is refused
    assert_eq!(w.request(9, &[]), Flow::Continue, "on credit");
    assert_eq!(w.request(10, &[]), Flow::Pause);
    w.run(0, 600, None);
    assert_eq!(
        reply(host, 10).map(|r| r.status),
        Some(429),
        "no grant, then deny"
    );
    w.at_both(605);
    assert_eq!(w.request(11, &[]), Flow::Pause);
    assert_eq!(reply(host, 11).map(|r| r.status), Some(429));
    let warnings = host
        .state()
        .logs
        .iter()
        .filter(|(_, m)| m.contains("refused the call"))
        .count();
    assert_eq!(warnings, 1, "said once a minute at most, not at every call");
}

#[test]
fn nonsense_answers_count_as_failures() {
    let host = Fake::new();
    let mut w = cluster_worker(host, "local_share");
    w.request(10, &[]);
    let mut answered = 0;
    for t in (0..=400).step_by(5) {
        w.at_both(t);
        w.tick();
        let calls = host.state().calls.clone();
        for (token, ..) in calls.iter().skip(answered) {
            host.state().answer = Some((
                Some(200),
                br#"{"overallCode": "OK", "statuses": []}"#.to_vec(),
            ));
            w.root.on_http_call_response(*token, 64);
        }
        answered = calls.len();
    }
    assert!(answered >= 1);
    assert_eq!(w.metric("c", "engine_failures"), answered as i64);
    assert_eq!(w.metric("c", "slots_granted"), 0);
}

#[test]
fn only_one_vm_of_the_process_calls_the_engine() {
    let host = Fake::new();
    host.state().clusters = vec!["throttle_engine".into()];
    let mut a = Worker::new(host, 1, &cluster_config("local_share"));
    let mut b = Worker::new(host, 2, &cluster_config("local_share"));
    let mut engine = FakeEngine::default();
    a.at_both(0);
    // The process's one credit goes to the first; the others wait for grants.
    assert_eq!(a.request(9, &[]), Flow::Continue);
    a.request(10, &[]);
    b.request(20, &[]);
    for t in (0..=400).step_by(5) {
        a.run(t, t, Some(&mut engine));
        b.run(t, t, Some(&mut engine));
    }
    let calls = host.state().calls.len();
    assert!(
        (1..=5).contains(&calls),
        "{calls} calls: one caller for the process"
    );
    let mut resumed = host.state().resumed.clone();
    resumed.sort_unstable();
    assert_eq!(resumed, vec![10, 20], "both workers' requests got slots");
}

/// An adaptive rule on the fake host: each worker's tally reaches shared
/// data on its tick, the VM holding the learner lease cuts the rate in the
/// rule's cell when the upstream sheds (429 + Retry-After), and publishes
/// the rate gauge and what moved it; requests then pace at the learned rate.
#[test]
fn adaptive_rules_learn_from_answers_and_pace_at_the_learned_rate() {
    let host = Fake::new();
    let config = r#"{"rules": [{"name": "api", "rate": "200/s", "max_queue_delay": "1s",
        "adaptive": {"min_rate": "10/s", "max_rate": "1000/s"}}]}"#;
    let mut w = Worker::new(host, 1, config);
    assert_eq!(
        host.state().tick_ms,
        crate::worker::LEARNER_TICK_MS,
        "ticks to learn"
    );
    let mut id = 100;
    // 2 s at 100/s; the upstream sheds every other request with Retry-After: 1.
    // Once the learner cuts below 100/s some requests are held: they are
    // answered when a tick resumes them.
    let answer = |w: &mut Worker, id: u32| {
        let status = if id % 2 == 0 { "429" } else { "200" };
        host.state().upstream.insert(
            id,
            vec![
                (":status".to_string(), status.as_bytes().to_vec()),
                ("retry-after".to_string(), b"1".to_vec()),
            ],
        );
        w.respond(id, true);
        w.done(id);
    };
    let (mut sent, mut held) = (0, 0);
    for ms in (0..2000).step_by(10) {
        w.at(ms);
        id += 1;
        match w.request(id, &[]) {
            Flow::Continue => {
                sent += 1;
                w.at(ms + 5);
                answer(&mut w, id);
            }
            _ => held += 1,
        }
        if ms % 100 == 0 {
            w.tick();
            let resumed: Vec<u32> = host.state().resumed.drain(..).collect();
            for r in resumed {
                answer(&mut w, r);
            }
        }
    }
    // Half the answers are 429s at any rate: the first learner round
    // (100 ms) cuts to just under the good half, ~48/s; a 429 share that a
    // cut does not lower costs one more cut, then is tolerated (the rate
    // stays above the 10/s floor instead of walking down to it).
    assert!(sent >= 10, "the first round went at once at 200/s: {sent}");
    let rate = w.metric("api", "adaptive_rate");
    let cuts = w.metric("api", "adaptive_shed");
    assert!(
        (10_000..50_000).contains(&rate) && (1..=2).contains(&cuts),
        "{cuts} cuts to {rate} mreq/s {:?}",
        w.stats("api")
    );
    assert!(w.metric("api", "adaptive_retry_after") >= 1);
    let released = w.metric("api", "released");
    assert!(
        (20..=110).contains(&(sent + released)),
        "at most the 50/s answered well over 2 s went upstream, at least the 10/s floor: \
         {sent} at once + {released} released, {held} held"
    );
    // The interval is in the rule's cell: new requests pace at it (two at
    // once: the second waits one learned interval, longer than 5 ms of 200/s).
    let key = throttle_core::store::CellId::Rate(0).key("api", 0).unwrap();
    let (value, _) = host.shared_get(key.as_str()).unwrap();
    let first = u64::from_le_bytes(value.unwrap()[..8].try_into().unwrap());
    assert!(first > 10 * MS, "learned interval {first} ns");
    w.at(10_000);
    assert_eq!(w.request(1, &[]), Flow::Continue);
    assert_eq!(w.request(2, &[]), Flow::Pause);
}

/// 10/s: critical above batch, on two workers of one process.
const CLASSES: &str = r#"{"rules": [{"name": "api", "rate": "10/s", "max_queue_delay": "1s",
  "classes": [{"name": "critical", "match": {"headers": {"x-priority": "critical"}}},
              {"name": "batch"}]}]}"#;

#[test]
fn classes_order_releases_across_workers_and_count_per_class() {
    let host = Fake::new();
    let mut a = Worker::new(host, 1, CLASSES);
    let mut b = Worker::new(host, 2, CLASSES);
    a.at(0);
    assert_eq!(a.request(10, &[]), Flow::Continue);
    // Batch waits on worker a, then critical on worker b, for the slot at 100 ms.
    assert_eq!(a.request(11, &[]), Flow::Pause);
    assert_eq!(b.request(20, &[("x-priority", "critical")]), Flow::Pause);
    assert_eq!(b.request(21, &[("x-priority", "critical")]), Flow::Pause);
    assert_eq!(host.state().tick_ms, 1, "waiting starts the tick");
    // Worker a ticks at the slot: it grants it to critical, held by b.
    a.at(100);
    a.tick();
    assert!(host.state().resumed.is_empty());
    b.at(103);
    b.tick();
    assert_eq!(host.state().resumed, vec![20]);
    // Its client goes before the next slot: the next critical takes it; batch after.
    b.done(21);
    for ms in [200, 300] {
        a.at(ms);
        a.tick();
        b.tick();
    }
    assert_eq!(host.state().resumed, vec![20, 11]);
    assert_eq!(a.metric("api", "class.critical.queued"), 2);
    assert_eq!(a.metric("api", "class.critical.released"), 1);
    assert_eq!(a.metric("api", "class.batch.admitted"), 1);
    assert_eq!(a.metric("api", "class.batch.released"), 1);
    assert_eq!(a.metric("api", "cancelled"), 1);
    let recorded = host.state().recorded.clone();
    assert!(recorded.contains(&("throttle.rule.api.class.critical.wait_ms".to_string(), 103)));
    assert!(recorded.contains(&("throttle.rule.api.class.batch.wait_ms".to_string(), 200)));
    assert!(recorded.contains(&("throttle.rule.api.wait_ms".to_string(), 200)));
    assert_eq!(a.metric("api", "held"), 0);
}

#[test]
fn a_grant_passed_on_to_another_workers_ticket_wakes_it() {
    let host = Fake::new();
    let mut a = Worker::new(host, 1, CLASSES);
    let mut b = Worker::new(host, 2, CLASSES);
    a.at(0);
    assert_eq!(a.request(10, &[]), Flow::Continue);
    assert_eq!(a.request(11, &[("x-priority", "critical")]), Flow::Pause);
    assert_eq!(b.request(20, &[("x-priority", "critical")]), Flow::Pause);
    // Worker b grants the slot at 100 ms to a's request, whose client goes.
    b.at(100);
    b.tick();
    a.done(11);
    let queued = |host: Fake| -> usize { host.state().queues.iter().map(|(_, q)| q.len()).sum() };
    assert_eq!(queued(host), 0);
    // Worker a passes the slot on to b's request at its tick and wakes the
    // workers: b resumes it without waiting for its own tick.
    a.at(101);
    a.tick();
    assert!(host.state().resumed.is_empty());
    assert!(queued(host) > 0, "a wake");
    b.root.on_queue_ready(1);
    assert_eq!(host.state().resumed, vec![20]);
}

#[test]
fn a_displaced_request_is_answered_and_counted() {
    let host = Fake::new();
    let json = CLASSES.replace(
        r#"{"name": "batch"}"#,
        r#"{"name": "batch", "max_queue_delay": "250ms"}"#,
    );
    let mut a = Worker::new(host, 1, &json);
    a.at(0);
    a.request(10, &[]);
    assert_eq!(a.request(11, &[]), Flow::Pause); // batch: its turn at 100 ms
    for id in 20..25 {
        assert_eq!(a.request(id, &[("x-priority", "critical")]), Flow::Pause);
    }
    // Five critical requests now go first: batch cannot be served within 250 ms.
    a.at(1);
    a.tick();
    let r = reply(host, 11).expect("a rejection");
    assert_eq!(r.status, 429);
    assert_eq!(a.metric("api", "class.batch.displaced"), 1);
    assert_eq!(a.metric("api", "rejected"), 1);
}

// ---------------------------------------------------------------- host calls

/// The host calls of `n` requests within the rate, 1 ms apart (headers,
/// response headers, response end, done), no tick in between: by ABI name.
fn calls_of(
    w: &mut Worker,
    n: u32,
    headers: &[(&str, &str)],
    from_ms: u64,
) -> Vec<(&'static str, usize)> {
    let host = w.host;
    host.state().hostcalls.clear();
    for i in 0..n {
        let id = 1000 + i;
        w.at_both(from_ms + u64::from(i));
        assert_eq!(w.request(id, headers), Flow::Continue, "request {i}");
        w.respond(id, false);
        w.response_end(id);
        w.done(id);
    }
    let calls = host.state().hostcalls.clone();
    calls.into_iter().collect()
}

/// On the fast path a request makes the host calls its decision needs and no
/// other: one clock read, the rule's cell read and written once (an exact
/// schedule across workers: see perf/icount/README.md), the path or the key
/// header only for a rule that needs it; statistics wait for the tick.
#[test]
fn the_fast_path_host_calls_per_request() {
    let fast =
        |rule: &str| format!(r#"{{"rules": [{{"name": "f", "rate": "1000000/s", {rule}}}]}}"#);
    let per = |w: &mut Worker, headers: &[(&str, &str)]| {
        // The first request starts the worker's tick: measure the next 100.
        calls_of(w, 1, headers, 0);
        calls_of(w, 100, headers, 10)
    };
    let cas = [("get_shared_data", 100), ("set_shared_data", 100)];
    let host = Fake::new();
    let mut w = Worker::new(host, 1, &fast(r#""match": {"path_prefix": "/"}"#));
    assert_eq!(
        per(&mut w, &[]),
        [("clock_time_get", 100), cas[0], cas[1]],
        "unkeyed"
    );
    let host = Fake::new();
    let mut w = Worker::new(host, 1, &fast(r#""key": {"header": "x-user"}"#));
    assert_eq!(
        per(&mut w, &[("x-user", "u")]),
        [
            ("clock_time_get", 100),
            ("get_property", 100),
            cas[0],
            cas[1]
        ],
        "keyed by a header (every line of it: a property)"
    );
    let host = Fake::new();
    let mut w = Worker::new(host, 1, &fast(r#""match": {"path_prefix": "/details"}"#));
    assert_eq!(
        per(&mut w, &[(":path", "/details.json")]),
        [
            ("clock_time_get", 100),
            ("get_header_map_value", 100),
            cas[0],
            cas[1]
        ],
        "a path match"
    );
    // Cluster scope with grants in hand (the engine answered for a second of
    // traffic at the rate measured, 1000/s: shares follow demand): the wall
    // clock only, and the cursor cell; the grants only when the cursor's
    // range ends.
    let host = Fake::new();
    host.state().clusters = vec!["throttle_engine".into()];
    let mut w = Worker::new(
        host,
        1,
        r#"{"engine": {"cluster": "throttle_engine"},
            "rules": [{"name": "c", "rate": "1000000/s", "scope": "cluster"}]}"#,
    );
    let mut engine = FakeEngine::default();
    let mut held = Vec::new();
    for t in 0..2000 {
        w.run(t, t, Some(&mut engine));
        let id = 100_000 + t as u32;
        if w.request(id, &[]) == Flow::Pause {
            held.push(id);
        } else {
            w.respond(id, true);
            w.done(id);
        }
        let resumed = host.state().resumed.clone();
        held.retain(|id| {
            let go = resumed.contains(id);
            if go {
                w.respond(*id, true);
                w.done(*id);
            }
            !go
        });
    }
    held.retain(|id| reply(host, *id).is_none());
    assert!(held.is_empty(), "the warm-up's requests all went: {held:?}");
    let calls = calls_of(&mut w, 50, &[], 2000);
    let get = |name| {
        calls
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, c)| *c)
    };
    assert_eq!(get("get_current_time_nanoseconds"), 50, "{calls:?}");
    assert_eq!(get("set_shared_data"), 50, "{calls:?}");
    assert!((50..=52).contains(&get("get_shared_data")), "{calls:?}");
    assert_eq!(calls.len(), 3, "no other host call: {calls:?}");
}

// ------------------------------------------------------- stats by feature

/// The log line of a change to a stat the rule does not define.
const STRAY: &str = "a statistic it does not define";

/// Every test's worker, when it goes: nothing it counted went to a stat its
/// rule does not define (the glue would have dropped it).
impl Drop for Worker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        self.root.flush();
        let logs = self.host.state().logs.clone();
        let strays: Vec<&String> = logs
            .iter()
            .map(|(_, l)| l)
            .filter(|l| l.contains(STRAY))
            .collect();
        assert!(strays.is_empty(), "{strays:?}");
    }
}

/// What can happen to the requests of rule `r` of `config`, on two workers
/// of one process for 3 s: bursts beyond its rate (admitted, held, rejected
/// at once or later), critical and batch requests, three keys, clients that
/// leave while held, streams gone at their turn, Envoy answering a held
/// request, upstream answers 200, 429 with `retry-after` and 503; for a
/// cluster rule, an engine that answers, fails for a second, and answers
/// again. Returns the host (the workers checked their counts on the way out).
fn exercise(config: &str) -> Fake {
    #[derive(Clone, Copy)]
    enum Then {
        Answer,
        Leave,
        EnvoyAnswers,
    }
    let host = Fake::new();
    host.state().clusters = vec!["throttle_engine".into()];
    let mut ws = [Worker::new(host, 1, config), Worker::new(host, 2, config)];
    let mut engine = FakeEngine::default();
    let mut calls_answered = 0;
    let mut alive: HashMap<u32, usize> = HashMap::new();
    let mut later: Vec<(u64, u32, Then)> = Vec::new();
    let finish = |ws: &mut [Worker; 2], alive: &mut HashMap<u32, usize>, id: u32, status: &str| {
        let Some(k) = alive.remove(&id) else { return };
        let mut lines = vec![(":status".to_string(), status.as_bytes().to_vec())];
        if status == "429" {
            lines.push(("retry-after".to_string(), b"1".to_vec()));
        }
        host.state().upstream.insert(id, lines);
        ws[k].respond(id, false);
        ws[k].response_end(id);
        ws[k].done(id);
    };
    let mut id = 100;
    for t in (0..3500).step_by(5) {
        for w in &ws {
            w.at_both(t);
        }
        if t < 2000 && t % 50 == 0 {
            for _ in 0..6 {
                id += 1;
                let k = (id % 2) as usize;
                let user = format!("u{}", id % 3);
                let mut headers = vec![("x-user", user.as_str())];
                if id % 3 == 0 {
                    headers.push(("x-priority", "critical"));
                }
                let flow = ws[k].request(id, &headers);
                alive.insert(id, k);
                if reply(host, id).is_some() {
                    alive.remove(&id);
                    ws[k].done(id);
                } else if flow == Flow::Continue {
                    later.push((t + 20, id, Then::Answer));
                } else if id % 7 == 0 {
                    later.push((t + 30, id, Then::Leave));
                } else if id % 11 == 0 {
                    host.state().gone.insert(id);
                } else if id % 13 == 0 {
                    later.push((t + 40, id, Then::EnvoyAnswers));
                }
            }
        }
        let due: Vec<(u64, u32, Then)> = later.iter().filter(|e| e.0 <= t).copied().collect();
        later.retain(|e| e.0 > t);
        for (_, id, then) in due {
            match then {
                Then::Answer => {
                    let status = ["200", "200", "429", "503"][(id % 4) as usize];
                    finish(&mut ws, &mut alive, id, status);
                }
                Then::Leave | Then::EnvoyAnswers => {
                    let resumed = host.state().resumed.contains(&id);
                    if let (false, Some(&k)) = (resumed, alive.get(&id)) {
                        if matches!(then, Then::EnvoyAnswers) {
                            host.state()
                                .upstream
                                .insert(id, vec![(":status".to_string(), b"504".to_vec())]);
                            ws[k].respond(id, true);
                        }
                        alive.remove(&id);
                        ws[k].done(id);
                    }
                }
            }
        }
        for w in &mut ws {
            w.tick();
        }
        // The engine answers what the VM holding the lease sent, except
        // from 1.5 s to 2.5 s.
        let calls = host.state().calls.clone();
        for (token, _, _, body, _) in calls.iter().skip(calls_answered) {
            let answer = if (1500..2500).contains(&t) {
                (None, Vec::new())
            } else {
                let (status, body) = engine.handle(body, WALL0 + t * MS);
                (Some(status), body)
            };
            let size = answer.1.len();
            for w in &mut ws {
                host.state().answer = Some(answer.clone());
                host.state().current = w.root_id;
                w.root.on_http_call_response(*token, size);
            }
        }
        calls_answered = calls.len();
        let resumed: Vec<u32> = host.state().resumed.drain(..).collect();
        for r in resumed {
            later.push((t + 10, r, Then::Answer));
        }
        let replied: Vec<u32> = host.state().replies.keys().copied().collect();
        for r in replied {
            if let Some(k) = alive.remove(&r) {
                ws[k].done(r);
            }
        }
    }
    for (r, k) in std::mem::take(&mut alive) {
        ws[k].done(r);
    }
    host
}

/// Each kind of rule defines the stats of its features, as many as the
/// README says, and whatever happens to its requests moves only those.
#[test]
fn each_rule_defines_the_stats_of_its_features_and_counts_no_other() {
    let classes = r#", "classes": [{"name": "critical", "match": {"headers": {"x-priority": "critical"}}},
                                   {"name": "batch", "max_queue_delay": "100ms"}]"#;
    let rate = r#", "rate": "20/s""#;
    let dry = r#", "dry_run": true"#;
    let gate = r#", "concurrency": 2"#;
    let cluster = r#", "scope": "cluster", "expected_replicas": 2"#;
    let adaptive = r#", "adaptive": {"min_rate": "5/s", "max_rate": "100/s"}"#;
    let observe = r#", "adaptive": {"min_rate": "5/s", "max_rate": "100/s", "mode": "observe"}"#;
    let keyed = r#", "key": {"header": "x-user"}, "key_quota": "10/s""#;
    let per_key = r#", "key": {"header": "x-user"}"#;
    // (what, the rule's fields, its stats: the rule's and each class's).
    let cases: &[(&str, Vec<&str>, usize)] = &[
        ("process", vec![rate], 11),
        ("process, dry-run", vec![rate, dry], 5),
        ("concurrency alone", vec![gate], 12),
        ("rate and concurrency", vec![rate, gate], 12),
        ("concurrency, dry-run", vec![rate, gate, dry], 6),
        ("per key", vec![rate, per_key], 11),
        ("key quota", vec![rate, keyed], 11),
        ("classes", vec![rate, classes], 11 + 2 * 6),
        ("classes, key quota", vec![rate, classes, keyed], 11 + 2 * 6),
        ("classes, dry-run", vec![rate, classes, dry], 5 + 2 * 6),
        ("cluster", vec![rate, cluster], 28),
        ("cluster, dry-run", vec![rate, cluster, dry], 22),
        ("cluster, classes", vec![rate, cluster, classes], 28 + 2 * 6),
        (
            "cluster, classes, dry-run",
            vec![rate, cluster, classes, dry],
            22 + 2 * 6,
        ),
        ("adaptive", vec![rate, adaptive], 19),
        ("adaptive, observe", vec![rate, observe], 19),
        ("adaptive, key quota", vec![rate, adaptive, keyed], 19),
        ("adaptive, dry-run", vec![rate, adaptive, dry], 13),
        (
            "adaptive, classes",
            vec![rate, adaptive, classes],
            19 + 2 * 6,
        ),
        (
            "adaptive, classes, dry-run",
            vec![rate, adaptive, classes, dry],
            13 + 2 * 6,
        ),
    ];
    for (what, fields, want) in cases {
        let rule = format!(
            r#"{{"name": "r", "max_queue_delay": "250ms"{}}}"#,
            fields.concat()
        );
        let config = format!(
            r#"{{"engine": {{"cluster": "throttle_engine", "timeout": "50ms", "fallback_after": "250ms"}},
                "rules": [{rule}]}}"#
        );
        let host = exercise(&config);
        let parsed = throttle_core::config::parse(config.as_bytes()).unwrap();
        let r = &parsed.rules[0];
        let mut expected: Vec<String> = throttle_core::stats::Stat::ALL
            .iter()
            .filter(|s| s.applies(r))
            .map(|s| s.name().to_string())
            .collect();
        for c in &r.classes {
            for s in throttle_core::stats::ClassStat::ALL {
                if s.applies(r) {
                    expected.push(format!("class.{}.{}", c.name, s.name()));
                }
            }
        }
        let state = host.state();
        let mut defined: Vec<String> = state
            .metrics
            .iter()
            .filter_map(|(n, _, _)| n.strip_prefix("throttle.rule.r."))
            .map(str::to_string)
            .collect();
        defined.sort();
        expected.sort();
        assert_eq!(defined, expected, "{what}");
        assert_eq!(defined.len(), *want, "{what}: {defined:?}");
        assert!(state.metric("throttle.rule.r.requests") >= 150, "{what}");
        let moved = state.metrics.iter().filter(|(_, _, v)| *v != 0).count();
        let held = state.recorded.iter().any(|(n, _)| n.ends_with(".wait_ms"));
        assert!(
            moved >= 4 && (held || r.dry_run),
            "{what}: {:?}",
            state.metrics
        );
    }
}

/// An adaptive rule learns where an answer came from, so that errors of
/// some paths or clients are told from the upstream's overload: the
/// request's `:path` with the request (Envoy keeps no request headers for
/// the response's callbacks: measured, `:path` and `request.path` read
/// there are absent), one call when the rule's match did not read it; its
/// client's address (a connection property) only for every bad answer and
/// one in eight of the others; the answer's `:status` always.
#[test]
fn adaptive_rules_read_an_answers_origin_when_it_is_bad_and_one_in_eight_others() {
    let host = Fake::new();
    let config = r#"{"rules": [{"name": "api", "rate": "1000/s", "max_queue_delay": "1s",
        "match": {"path_prefix": "/"},
        "adaptive": {"min_rate": "10/s", "max_rate": "10000/s"}}]}"#;
    let mut w = Worker::new(host, 1, config);
    let answer = |w: &mut Worker, id: u32, ms: u64, status: &str| {
        w.at_both(ms);
        assert_eq!(w.request(id, &[]), Flow::Continue);
        host.state().upstream.insert(
            id,
            vec![
                (":status".to_string(), status.as_bytes().to_vec()),
                ("retry-after".to_string(), b"5".to_vec()),
            ],
        );
        w.respond(id, true);
        w.done(id);
    };
    answer(&mut w, 1, 0, "200");
    host.state().hostcalls.clear();
    for i in 0..80 {
        answer(&mut w, 100 + i, 10 + u64::from(i), "200");
    }
    let calls = host.state().hostcalls.clone();
    assert_eq!(
        (calls.get("get_header_map_value"), calls.get("get_property")),
        (Some(&160), Some(&10)),
        "80 paths and statuses, and 10 addresses: {calls:?}"
    );
    host.state().hostcalls.clear();
    for i in 0..10 {
        answer(&mut w, 200 + i, 100 + u64::from(i), "503");
    }
    let calls = host.state().hostcalls.clone();
    assert_eq!(
        (calls.get("get_header_map_value"), calls.get("get_property")),
        (Some(&30), Some(&10)),
        "each 503: its path, its status, its Retry-After, its address: {calls:?}"
    );
}
