//! The request's decision and the worker's ticks together, on the in-memory
//! store, exact to the nanosecond: hold and release; rejection; dry-run;
//! rate and concurrency together; cancelled, gone and timed out; the gate's
//! slots and tickets; contention; cluster rules waiting for grants.
//! (`wasm/src/tests.rs` tests the glue around the same calls on a fake host.)

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};

use crate::clock::{Clock, Fixed, NS_PER_MS};
use crate::cluster::{self, Mode};
use crate::config::{self, Config};
use crate::keys::KeyHasher;
use crate::matcher::{Facts, FakeRequest};
use crate::reply::Reply;
use crate::stats::Stat;
use crate::store::{BlobId, CellId, Store};
use crate::testing::{MemCells, MemStore};
use crate::worker::{TickAction, Worker};

use super::{Env, Stream, Verdict};

const MS: u64 = NS_PER_MS;
/// Monotonic time of `at(0)`.
const T0: u64 = 1_000_000 * MS;
/// Wall time of `at(0)`: the middle of an hour (cluster claims stop near its edge).
const WALL0: u64 = 1_800_000_000 * 1_000_000_000 + 1_800 * 1_000_000_000;

/// A clock that counts its reads.
struct Counting<'a> {
    at: Fixed,
    reads: &'a mut usize,
}

impl Clock for Counting<'_> {
    fn mono(&mut self) -> u64 {
        *self.reads += 1;
        self.at.mono
    }
    fn wall(&mut self) -> u64 {
        *self.reads += 1;
        self.at.wall
    }
}

/// One worker over the in-memory store, driven as the glue drives it.
struct Proc {
    config: Config,
    hasher: KeyHasher,
    cells: RefCell<MemCells>,
    worker: Worker,
    streams: HashMap<u32, Stream>,
    clock: Fixed,
    clock_reads: usize,
    /// Counters and gauges by (rule, stat), as the host would hold them.
    totals: BTreeMap<(usize, Stat), i64>,
    /// Samples (histograms, gauge levels) by rule, in order.
    samples: Vec<(usize, Stat, u64)>,
    /// Streams resumed, in order, with the wait each was resumed after.
    resumed: Vec<(u32, u64)>,
    replies: HashMap<u32, Reply>,
    /// Streams gone at their turn.
    gone: HashSet<u32>,
    /// A gate slot went back and a waiter may go (the glue wakes the workers).
    woke: bool,
}

impl Proc {
    fn new(json: &str) -> Proc {
        let p = Proc::unconfigured(json);
        // As the glue does on configure.
        assert!(super::create_initial(MemStore(&p.cells), &p.config).is_empty());
        p.cells.borrow_mut().configured();
        p
    }

    fn unconfigured(json: &str) -> Proc {
        Proc {
            config: config::parse(json.as_bytes()).expect("a valid configuration"),
            hasher: KeyHasher::new((1, 2)),
            cells: RefCell::default(),
            worker: Worker::new(),
            streams: HashMap::new(),
            clock: Fixed {
                mono: T0,
                wall: WALL0,
            },
            clock_reads: 0,
            totals: BTreeMap::new(),
            samples: Vec::new(),
            resumed: Vec::new(),
            replies: HashMap::new(),
            gone: HashSet::new(),
            woke: false,
        }
    }

    /// Both clocks at `ms` past the start.
    fn at(&mut self, ms: u64) {
        self.at_ns(ms * MS);
    }

    fn at_ns(&mut self, ns: u64) {
        self.clock = Fixed {
            mono: T0 + ns,
            wall: WALL0 + ns,
        };
    }

    fn count(&mut self, rule: usize, counts: &crate::stats::Counts) {
        if let Some(r) = self.config.rules.get(rule) {
            // The glue defines only the stats of the rule's features.
            assert_eq!(counts.stray(r), None, "rule {}: {counts:?}", r.name);
        }
        for (stat, delta) in counts.iter() {
            *self.totals.entry((rule, stat)).or_default() += i64::from(delta);
        }
        self.samples
            .extend(counts.samples().iter().map(|&(stat, v)| (rule, stat, v)));
    }

    fn request(&mut self, id: u32, req: FakeRequest) -> Verdict {
        let env = Env {
            config: &self.config,
            hasher: &self.hasher,
            store: MemStore(&self.cells),
        };
        let mut clock = Counting {
            at: self.clock,
            reads: &mut self.clock_reads,
        };
        let stream = self.streams.entry(id).or_insert_with(|| Stream::new(id));
        let d = stream.on_request(env, &mut self.worker, &mut Facts::new(req), &mut clock);
        if let Some(rule) = d.rule {
            self.count(rule, &d.counts);
        } else {
            assert!(d.counts.is_empty());
        }
        if let Verdict::Reply(r) = &d.verdict {
            self.replies.insert(id, r.clone());
        }
        d.verdict
    }

    fn get(&mut self, id: u32) -> Verdict {
        self.request(id, FakeRequest::get("/"))
    }

    /// The response's headers (with its end if `end`): the headers added.
    fn respond(&mut self, id: u32, end: bool) -> Vec<(&'static str, String)> {
        let env = Env {
            config: &self.config,
            hasher: &self.hasher,
            store: MemStore(&self.cells),
        };
        let now = self.clock.mono;
        let stream = self.streams.get_mut(&id).expect("a stream");
        let out = stream.on_response_headers(env, &mut self.worker, || now, end);
        let rule = stream.rule();
        self.woke |= out.wake;
        if let Some(rule) = rule {
            self.count(rule, &out.counts);
        }
        out.headers
    }

    fn response_end(&mut self, id: u32) {
        let env = Env {
            config: &self.config,
            hasher: &self.hasher,
            store: MemStore(&self.cells),
        };
        let stream = self.streams.get_mut(&id).expect("a stream");
        let out = stream.on_response_end(env, &mut self.worker);
        let rule = stream.rule();
        self.woke |= out.wake;
        if let Some(rule) = rule {
            self.count(rule, &out.counts);
        }
    }

    fn done(&mut self, id: u32) {
        let env = Env {
            config: &self.config,
            hasher: &self.hasher,
            store: MemStore(&self.cells),
        };
        let mut stream = self.streams.remove(&id).expect("a stream");
        let out = stream.on_done(env, &mut self.worker);
        self.woke |= out.wake;
        if let Some(rule) = stream.rule() {
            self.count(rule, &out.counts);
        }
    }

    /// A tick at the current time, carried out as the glue does.
    fn tick(&mut self) {
        let mut clock = self.clock;
        let plan = self
            .worker
            .plan_tick(&self.config, MemStore(&self.cells), &mut clock);
        self.carry_out(plan);
    }

    /// A wake (a gate slot went back somewhere in the process).
    fn wake(&mut self) {
        self.woke = false;
        let plan = self
            .worker
            .plan_gate(&self.config, MemStore(&self.cells), self.clock.mono);
        self.carry_out(plan);
    }

    fn carry_out(&mut self, plan: crate::worker::TickPlan) {
        for (rule, counts) in &plan.counts {
            self.count(*rule, counts);
        }
        for action in plan.actions {
            let store = MemStore(&self.cells);
            match action {
                TickAction::Resume {
                    id,
                    rule,
                    waited_ns,
                } => {
                    self.worker.resuming(id, waited_ns);
                    let ok = !self.gone.contains(&id);
                    let c = self.worker.resumed(&self.config, store, id, ok);
                    self.count(rule, &c);
                    if ok {
                        self.resumed.push((id, waited_ns));
                    }
                }
                TickAction::Reply { id, rule, reply } => {
                    let ok = !self.gone.contains(&id);
                    let c = self.worker.replied(id, ok);
                    self.count(rule, &c);
                    if ok {
                        self.replies.insert(id, reply);
                    }
                }
            }
        }
    }

    /// Every counter and gauge of rule 0 that is not zero; `requests` is
    /// checked to equal the decisions' total, then left out.
    fn stats(&self) -> BTreeMap<&'static str, i64> {
        let all: BTreeMap<&'static str, i64> = self
            .totals
            .iter()
            .filter(|((rule, _), v)| *rule == 0 && **v != 0)
            .map(|((_, s), v)| (s.name(), *v))
            .collect();
        let get = |name: &str| all.get(name).copied().unwrap_or(0);
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
        all.into_iter().filter(|(n, _)| *n != "requests").collect()
    }

    fn held_until(&mut self) -> Option<u64> {
        self.worker.queue.next_release().map(|t| t - T0)
    }
}

fn s(pairs: &[(&'static str, i64)]) -> BTreeMap<&'static str, i64> {
    pairs.iter().copied().collect()
}

fn reject(retry_after: &str) -> Reply {
    Reply {
        status: 429,
        grpc_status: None,
        headers: vec![
            ("retry-after", retry_after.to_string()),
            ("content-type", "text/plain".to_string()),
        ],
        body: "throttled: retry later\n",
        details: "throttle_rejected",
    }
}

const RATE: &str = r#"{"rules": [{"name": "r", "rate": "10/s", "max_queue_delay": "250ms"}]}"#;

#[test]
fn turns_are_exact_and_beyond_max_queue_delay_is_rejected_at_once() {
    let mut p = Proc::new(RATE);
    assert_eq!(p.get(10), Verdict::Continue);
    // One every 100 ms: held until exactly 100 and 200 ms.
    assert_eq!(p.get(11), Verdict::Hold);
    assert_eq!(p.held_until(), Some(100 * MS));
    assert_eq!(p.get(12), Verdict::Hold);
    // The fourth's turn (300 ms) is beyond 250 ms: rejected now, taking no turn.
    assert_eq!(p.get(13), Verdict::Reply(reject("1")));
    assert!(
        p.respond(13, true).is_empty(),
        "the reply carried its headers"
    );
    p.done(13);
    // 1 ns before 50 ms the next turn (300 ms) is 250 ms + 1 ns away; at 50 ms, exactly 250 ms.
    p.at_ns(50 * MS - 1);
    assert!(matches!(p.get(14), Verdict::Reply(_)));
    p.at(50);
    assert_eq!(p.get(15), Verdict::Hold);
    assert_eq!(
        p.stats(),
        s(&[("admitted", 1), ("queued", 3), ("rejected", 2), ("held", 3)])
    );
}

#[test]
fn a_held_request_is_released_at_its_turn_with_its_wait() {
    let mut p = Proc::new(RATE);
    p.get(10);
    assert_eq!(p.get(11), Verdict::Hold);
    p.at_ns(100 * MS - 1);
    p.tick();
    assert!(p.resumed.is_empty(), "not a nanosecond early");
    // The tick runs 4 ms late: released then, its wait as it was.
    p.at(104);
    p.tick();
    assert_eq!(p.resumed, vec![(11, 104 * MS)]);
    assert_eq!(p.samples, vec![(0, Stat::WaitMs, 104)]);
    assert!(!p.worker.needs_ticks());
    assert_eq!(
        p.respond(11, true),
        vec![("x-throttle-wait-ms", "104".to_string())]
    );
    assert_eq!(
        p.stats(),
        s(&[("admitted", 1), ("queued", 1), ("released", 1)])
    );
}

#[test]
fn grpc_requests_get_resource_exhausted_without_a_newline() {
    let cfg = r#"{"rules": [{"name": "g", "rate": "1/s", "max_queue_delay": "0s"}], "rate_limit_headers": true}"#;
    let mut p = Proc::new(cfg);
    let grpc = || FakeRequest::get("/").with_header("content-type", "application/grpc");
    assert_eq!(p.request(10, grpc()), Verdict::Continue);
    assert_eq!(
        p.request(11, grpc()),
        Verdict::Reply(Reply {
            status: 429,
            grpc_status: Some(8),
            headers: vec![
                ("retry-after", "1".to_string()),
                ("ratelimit-policy", "\"g\";q=1;w=1".to_string()),
                ("ratelimit", "\"g\";r=0;t=1".to_string())
            ],
            body: "throttled: retry later",
            details: "throttle_rejected",
        })
    );
    assert!(p.respond(11, true).is_empty(), "not added twice");
}

#[test]
fn rate_limit_headers_are_computed_when_the_response_leaves() {
    let cfg = r#"{"rules": [{"name": "api", "rate": "10/s", "max_queue_delay": "1s"}], "rate_limit_headers": true}"#;
    let mut p = Proc::new(cfg);
    p.get(10);
    p.get(11);
    // As this request left the schedule (tat = 100 ms): one interval owed, 9
    // left; the whole quota is back in 100 ms (rounded up: 1 s).
    assert_eq!(
        p.respond(10, true),
        vec![
            ("ratelimit-policy", "\"api\";q=10;w=1".to_string()),
            ("ratelimit", "\"api\";r=9;t=1".to_string())
        ]
    );
    // The held one's response leaves 350 ms later: the schedule has moved on.
    p.at(100);
    p.tick();
    p.at(350);
    assert_eq!(
        p.respond(11, true),
        vec![
            ("x-throttle-wait-ms", "100".to_string()),
            ("ratelimit-policy", "\"api\";q=10;w=1".to_string()),
            ("ratelimit", "\"api\";r=10;t=0".to_string())
        ]
    );
}

/// Rule "api" at 10/s, learning its rate (here 4/s: 250 ms in the rate cell's
/// first word), with `classes` or without.
fn learned(classes: bool) -> Proc {
    let classes = if classes {
        r#", "classes": [{"name": "hi", "match": {"path_prefix": "/hi"}}, {"name": "rest"}]"#
    } else {
        ""
    };
    let cfg = format!(
        r#"{{"rules": [{{"name": "api", "rate": "10/s", "max_queue_delay": "1s",
              "adaptive": {{"min_rate": "1/s", "max_rate": "100/s"}}{classes}}}],
            "rate_limit_headers": true}}"#
    );
    let p = Proc::new(&cfg);
    p.cells
        .borrow_mut()
        .cells
        .insert(CellId::Rate(0), ([250 * MS, T0], 1));
    p
}

#[test]
fn at_a_learned_rate_a_class_rule_reports_the_schedule_as_fifo_does() {
    // The first goes at once, the second waits for the next slot (250 ms at
    // the learned 4/s): the schedule as each left it is the same whatever
    // the order, so are the headers (r: the 100 ms intervals of `rate`
    // owed: 3, then 5).
    let mut heads = Vec::new();
    for classes in [false, true] {
        let mut p = learned(classes);
        assert_eq!(p.get(10), Verdict::Continue);
        assert_eq!(p.get(11), Verdict::Hold);
        heads.push((p.respond(10, true), p.respond(11, true)));
    }
    assert_eq!(heads[0].0[1], ("ratelimit", "\"api\";r=7;t=1".to_string()));
    assert_eq!(heads[0].1[1], ("ratelimit", "\"api\";r=5;t=1".to_string()));
    assert_eq!(heads[1], heads[0], "classes as FIFO");
}

#[test]
fn legacy_names_when_asked() {
    let cfg = r#"{"rules": [{"name": "api", "rate": "30/m"}], "rate_limit_headers": "legacy"}"#;
    let mut p = Proc::new(cfg);
    p.get(10);
    assert_eq!(
        p.respond(10, true),
        vec![
            ("x-ratelimit-limit", "30".to_string()),
            ("x-ratelimit-remaining", "29".to_string()),
            ("x-ratelimit-reset", "2".to_string())
        ]
    );
}

/// At 0 ms under [`RATE`]: stream 10 admitted, stream 11 held behind it.
fn one_admitted_one_held() -> Proc {
    let mut p = Proc::new(RATE);
    assert_eq!(p.get(10), Verdict::Continue);
    assert_eq!(p.get(11), Verdict::Hold);
    p
}

#[test]
fn a_client_that_leaves_while_queued_is_cancelled_and_never_resumed() {
    let mut p = one_admitted_one_held();
    p.done(11);
    assert!(!p.worker.needs_ticks());
    p.at(200);
    p.tick();
    assert!(p.resumed.is_empty());
    // Its turn stays taken: the next request's is at 200 ms.
    assert_eq!(p.get(12), Verdict::Continue);
    assert_eq!(p.get(13), Verdict::Hold);
    assert_eq!(p.held_until(), Some(300 * MS));
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 2),
            ("queued", 2),
            ("cancelled", 1),
            ("held", 1)
        ])
    );
}

#[test]
fn a_stream_gone_at_its_turn_is_counted_gone() {
    let mut p = one_admitted_one_held();
    p.gone.insert(11);
    p.at(100);
    p.tick();
    assert!(p.resumed.is_empty());
    assert!(p.worker.waited.is_empty(), "no wait kept for a gone stream");
    assert!(p.samples.is_empty(), "no wait recorded for a gone stream");
    assert_eq!(p.stats(), s(&[("admitted", 1), ("queued", 1), ("gone", 1)]));
}

#[test]
fn envoy_answering_a_held_request_counts_as_timed_out_not_cancelled() {
    let mut p = one_admitted_one_held();
    // stream_idle_timeout: Envoy's 504 passes through the response callback.
    p.at(50);
    assert!(p.respond(11, true).is_empty());
    p.done(11);
    assert_eq!(
        p.stats(),
        s(&[("admitted", 1), ("queued", 1), ("timed_out", 1)])
    );
    p.at(100);
    p.tick();
    assert!(p.resumed.is_empty());
}

#[test]
fn a_full_worker_queue_rejects_what_it_would_hold() {
    let cfg = r#"{"max_held_per_worker": 1, "rules": [{"name": "r", "rate": "10/s", "max_queue_delay": "1s"}]}"#;
    let mut p = Proc::new(cfg);
    p.get(10);
    assert_eq!(p.get(11), Verdict::Hold);
    // Its turn (200 ms) is within max_queue_delay, but the queue is full:
    // retry-after counts the whole wait.
    assert_eq!(p.get(12), Verdict::Reply(reject("1")));
    assert_eq!(p.held_until(), Some(100 * MS), "the rejection took no turn");
    assert_eq!(
        p.stats(),
        s(&[("admitted", 1), ("queued", 1), ("rejected", 1), ("held", 1)])
    );
}

#[test]
fn requests_matching_no_rule_pass_untouched_and_read_no_clock() {
    let cfg = r#"{"rules": [{"name": "admin", "rate": "1/s", "max_queue_delay": "0s",
                  "match": {"path_prefix": "/admin"}}]}"#;
    let mut p = Proc::new(cfg);
    assert_eq!(
        p.request(10, FakeRequest::get("/public")),
        Verdict::Continue
    );
    assert_eq!(p.clock_reads, 0, "no rule, no clock");
    assert!(p.totals.is_empty());
    assert_eq!(
        p.request(11, FakeRequest::get("/%61dmin/x")),
        Verdict::Continue
    );
    assert_eq!(p.clock_reads, 1, "the monotonic clock, once");
    assert!(matches!(
        p.request(12, FakeRequest::get("//admin")),
        Verdict::Reply(_)
    ));
    assert_eq!(p.stats(), s(&[("admitted", 1), ("rejected", 1)]));
}

#[test]
fn requests_are_keyed_by_principal() {
    let cfg = r#"{"rules": [{"name": "p", "rate": "1/h", "max_queue_delay": "0s", "key": {"source": "principal"}}]}"#;
    let mut p = Proc::new(cfg);
    let from = |who: Option<&str>| FakeRequest {
        principal: who.map(|w| format!("spiffe://cluster.local/ns/default/{w}")),
        ..FakeRequest::get("/")
    };
    assert_eq!(p.request(10, from(Some("sa/a"))), Verdict::Continue);
    assert_eq!(p.request(11, from(Some("sa/b"))), Verdict::Continue);
    assert!(matches!(
        p.request(12, from(Some("sa/a"))),
        Verdict::Reply(_)
    ));
    // No identity: the rule's unkeyed schedule.
    assert_eq!(p.request(13, from(None)), Verdict::Continue);
    assert!(matches!(p.request(14, from(None)), Verdict::Reply(_)));
}

#[test]
fn broken_shared_data_fails_closed() {
    let mut p = Proc::new(RATE);
    p.cells.borrow_mut().broken = true;
    assert_eq!(p.get(10), Verdict::Reply(reject("1")));
    assert_eq!(p.stats(), s(&[("rejected", 1), ("contention", 1)]));
}

#[test]
fn endless_lost_races_fail_closed() {
    let mut p = Proc::new(RATE);
    // Another worker wins every compare-and-swap (64 attempts).
    p.cells.borrow_mut().lost_races = 64;
    assert_eq!(p.get(10), Verdict::Reply(reject("1")));
    // One race fewer and the request goes.
    p.cells.borrow_mut().lost_races = 63;
    assert_eq!(p.get(11), Verdict::Continue);
    assert_eq!(
        p.stats(),
        s(&[("admitted", 1), ("rejected", 1), ("contention", 1)])
    );
}

// ------------------------------------------------------------------ the gate

const GATE: &str = r#"{"rules": [{"name": "c", "concurrency": 1, "max_queue_delay": "1s"}]}"#;

#[test]
fn the_gate_lets_one_in_and_hands_the_slot_over_on_response_end() {
    let mut p = Proc::new(GATE);
    assert_eq!(p.get(10), Verdict::Continue);
    assert_eq!(p.get(11), Verdict::Hold);
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 1),
            ("queued", 1),
            ("held", 1),
            ("in_flight", 1)
        ])
    );
    // Headers without end: the slot is still in use; the body's end returns it.
    p.respond(10, false);
    assert!(!p.woke);
    p.response_end(10);
    assert!(p.woke, "a waiter's turn came: the workers are woken");
    p.at(3);
    p.wake();
    assert_eq!(p.resumed, vec![(11, 3 * MS)]);
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 1),
            ("queued", 1),
            ("released", 1),
            ("in_flight", 1)
        ])
    );
    p.response_end(11);
    p.done(10);
    p.done(11);
    assert_eq!(p.stats().get("in_flight"), None, "returned once only");
    assert_eq!(p.cells.borrow().get(CellId::Gate(0)), Some([2, 2]));
}

#[test]
fn a_slot_goes_back_when_the_stream_ends_without_a_response() {
    let mut p = Proc::new(GATE);
    p.get(10);
    p.done(10);
    assert_eq!(p.stats(), s(&[("admitted", 1)]));
    assert_eq!(p.get(11), Verdict::Continue, "the slot is free again");
}

#[test]
fn a_waiter_that_leaves_abandons_its_ticket_until_its_turn() {
    let mut p = Proc::new(GATE);
    p.get(10);
    p.get(11);
    p.get(12);
    p.done(11);
    assert!(
        p.worker.needs_ticks(),
        "the abandoned ticket waits for its turn"
    );
    // 10's response ends: ticket 1 (gone) is counted done at its turn, 12 goes.
    p.respond(10, true);
    p.tick();
    assert_eq!(p.resumed, vec![(12, 0)]);
    assert_eq!(p.cells.borrow().get(CellId::Gate(0)), Some([3, 2]));
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 1),
            ("queued", 2),
            ("released", 1),
            ("cancelled", 1),
            ("in_flight", 1)
        ])
    );
}

#[test]
fn a_waiter_past_max_queue_delay_is_rejected_on_tick() {
    let cfg = r#"{"rules": [{"name": "c", "concurrency": 1, "max_queue_delay": "100ms"}]}"#;
    let mut p = Proc::new(cfg);
    p.get(10);
    p.request(
        11,
        FakeRequest::get("/").with_header("content-type", "application/grpc"),
    );
    p.at_ns(100 * MS - 1);
    p.tick();
    assert!(p.replies.is_empty(), "not a nanosecond early");
    p.at(100);
    p.tick();
    let r = p.replies.get(&11).expect("rejected");
    assert_eq!((r.status, r.grpc_status), (429, Some(8)));
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 1),
            ("queued", 1),
            ("rejected", 1),
            ("in_flight", 1)
        ])
    );
}

#[test]
fn rate_and_concurrency_together_take_the_slot_at_release() {
    let cfg =
        r#"{"rules": [{"name": "rc", "rate": "10/s", "concurrency": 1, "max_queue_delay": "1s"}]}"#;
    let mut p = Proc::new(cfg);
    assert_eq!(p.get(10), Verdict::Continue);
    assert_eq!(p.get(11), Verdict::Hold);
    // At 100 ms 11's rate turn comes, but 10 still holds the slot: it waits at the gate.
    p.at(100);
    p.tick();
    assert!(p.resumed.is_empty());
    p.respond(10, true);
    p.tick();
    assert_eq!(p.resumed, vec![(11, 100 * MS)]);
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 1),
            ("queued", 1),
            ("released", 1),
            ("in_flight", 1)
        ])
    );
    // Gone at its turn gives its slot back.
    p.at(200);
    p.get(12);
    p.respond(11, true);
    p.gone.insert(12);
    p.at(300);
    p.tick();
    assert_eq!(p.stats().get("gone"), Some(&1));
    assert_eq!(
        p.stats().get("in_flight"),
        None,
        "the gone stream's slot went back"
    );
}

// ------------------------------------------------------------------ dry-run

#[test]
fn dry_run_decides_counts_and_stays_invisible_by_default() {
    let cfg = r#"{"dry_run": true, "rules": [{"name": "d", "rate": "10/s", "max_queue_delay": "150ms"}]}"#;
    let mut p = Proc::new(cfg);
    for id in 10..14 {
        assert_eq!(p.get(id), Verdict::Continue);
        assert!(p.respond(id, true).is_empty(), "{id}: a trial is invisible");
    }
    // 1 admitted, 1 would queue (100 ms), 2 would be rejected (200, 300 ms > 150 ms):
    // the counters add up to the requests.
    assert_eq!(
        p.stats(),
        s(&[("admitted", 1), ("would_queue", 1), ("would_reject", 2)])
    );
    assert!(!p.worker.needs_ticks() && p.replies.is_empty());
    // Only what would have gone took a turn: the next is 200 ms away.
    assert_eq!(
        p.cells.borrow().get(CellId::Rate(0)),
        Some([0, T0 + 200 * MS])
    );
}

#[test]
fn dry_run_headers_show_each_decision_when_asked() {
    let cfg = r#"{"dry_run": true, "dry_run_headers": true, "rate_limit_headers": true,
                  "rules": [{"name": "d", "rate": "10/s", "max_queue_delay": "150ms"}]}"#;
    let mut p = Proc::new(cfg);
    let note = |p: &mut Proc, id| {
        p.get(id);
        let headers = p.respond(id, true);
        assert!(headers.iter().any(|(n, _)| *n == "ratelimit"));
        headers
            .into_iter()
            .find(|(n, _)| *n == "x-throttle-dry-run")
            .map(|(_, v)| v)
    };
    assert_eq!(note(&mut p, 10), None);
    assert_eq!(note(&mut p, 11).as_deref(), Some("queued; wait_ms=100"));
    assert_eq!(
        note(&mut p, 12).as_deref(),
        Some("rejected; status=429; retry_after=1")
    );
}

#[test]
fn dry_run_of_a_class_rule_notes_the_turn_each_would_have_waited_for() {
    // 10/s: the first goes at once; the next wait for the slots at +100 and
    // +200 ms, in their class's line; the critical one that comes last is
    // first in line (+100 ms), as enforced.
    let cfg = r#"{"dry_run": true, "dry_run_headers": true, "rules": [{"name": "d",
        "rate": "10/s", "max_queue_delay": "1s", "classes": [
        {"name": "hi", "match": {"path_prefix": "/hi"}}, {"name": "rest"}]}]}"#;
    let mut p = Proc::new(cfg);
    let mut note = |id, path| {
        assert_eq!(p.request(id, FakeRequest::get(path)), Verdict::Continue);
        p.respond(id, true)
            .into_iter()
            .find(|(n, _)| *n == "x-throttle-dry-run")
            .map(|(_, v)| v)
    };
    assert_eq!(note(10, "/"), None);
    assert_eq!(note(11, "/").as_deref(), Some("queued; wait_ms=100"));
    assert_eq!(note(12, "/").as_deref(), Some("queued; wait_ms=200"));
    assert_eq!(note(13, "/hi").as_deref(), Some("queued; wait_ms=100"));
}

#[test]
fn dry_run_at_the_gate_goes_at_once_but_keeps_in_flight_true() {
    let cfg = r#"{"rules": [{"name": "c", "concurrency": 1, "dry_run": true}]}"#;
    let mut p = Proc::new(cfg);
    assert_eq!(p.get(10), Verdict::Continue);
    assert_eq!(p.get(11), Verdict::Continue);
    assert_eq!(
        p.stats(),
        s(&[("admitted", 1), ("would_queue", 1), ("in_flight", 2)])
    );
    p.respond(10, true);
    p.respond(11, true);
    assert_eq!(p.stats().get("in_flight"), None);
}

#[test]
fn dry_run_of_rate_and_gate_counts_each_request_once() {
    let cfg = r#"{"dry_run": true, "dry_run_headers": true,
                  "rules": [{"name": "rc", "rate": "10/s", "concurrency": 1, "max_queue_delay": "150ms"}]}"#;
    let mut p = Proc::new(cfg);
    // 10 goes; 11 would queue for the rate, then for the gate (the later note
    // wins, the count is one); 12 would be rejected by the rate and never
    // reaches the gate.
    for id in 10..13 {
        assert_eq!(p.get(id), Verdict::Continue);
    }
    let note = |p: &mut Proc, id| {
        p.respond(id, false)
            .into_iter()
            .find(|(n, _)| *n == "x-throttle-dry-run")
            .map(|(_, v)| v)
    };
    assert_eq!(
        note(&mut p, 11).as_deref(),
        Some("queued; waiting for a concurrency slot")
    );
    assert_eq!(
        note(&mut p, 12).as_deref(),
        Some("rejected; status=429; retry_after=1")
    );
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 1),
            ("would_queue", 1),
            ("would_reject", 1),
            ("in_flight", 2)
        ])
    );
}

#[test]
fn dry_run_contention_would_reject_and_goes_on() {
    let cfg =
        r#"{"dry_run": true, "dry_run_headers": true, "rules": [{"name": "d", "rate": "10/s"}]}"#;
    let mut p = Proc::new(cfg);
    p.cells.borrow_mut().broken = true;
    assert_eq!(p.get(10), Verdict::Continue);
    assert_eq!(
        p.respond(10, true),
        vec![("x-throttle-dry-run", "rejected; contention".to_string())]
    );
    assert_eq!(p.stats(), s(&[("contention", 1), ("would_reject", 1)]));
}

// ------------------------------------------------------------ cluster scope

const CLUSTER: &str = r#"{"engine": {"cluster": "e"},
    "rules": [{"name": "c", "rate": "100/s", "max_queue_delay": "1s", "scope": "cluster",
               "expected_replicas": 2, "dry_run": DRY}]}"#;

fn cluster(dry_run: bool) -> Proc {
    Proc::new(&CLUSTER.replace("DRY", &dry_run.to_string()))
}

/// What the calling VM publishes: `mode`, and slots `[a, b)` of the grid.
fn publish(p: &Proc, mode: Mode, ranges: &[(u64, u64)]) {
    publish_share(p, mode, (0, 0, 0), ranges);
}

/// [`publish`], with the share the process may expect: (grant rate per
/// second, lead, spare per second).
fn publish_share(p: &Proc, mode: Mode, share: (u64, u64, u64), ranges: &[(u64, u64)]) {
    let rule = &p.config.rules[0];
    let reach = cluster::rule_reach(rule).unwrap();
    let store = MemStore(&p.cells);
    cluster::publish(
        &mut store.blob(BlobId::Grants(0)),
        &mut store.cell(CellId::Cursor(0)),
        &reach,
        p.clock.wall,
        mode,
        share,
        ranges,
    )
    .unwrap();
    // ...and repays what its requests took on credit, as it does after publishing.
    cluster::repay(
        &mut store.cell(CellId::Cursor(0)),
        &mut store.blob(BlobId::Grants(0)),
        &mut store.cell(CellId::Ahead(0)),
        &reach,
        p.clock.wall,
    )
    .unwrap();
}

fn waiting(p: &Proc) -> u64 {
    cluster::Cursor::decode(p.cells.borrow().get(CellId::Cursor(0))).waiting
}

/// The ahead cell: `owed` slots, ahead until `until_ms`.
fn ahead(owed: u64, until_ms: u64) -> [u64; 2] {
    cluster::Ahead {
        owed,
        pending: u64::from(until_ms > 0),
        until_ms,
        gap_us: 0,
        ..Default::default()
    }
    .encode()
}

/// The process owes the one request of credit it may take (burst 0).
fn spend_credit(p: &Proc) {
    p.cells
        .borrow_mut()
        .cells
        .insert(CellId::Ahead(0), (ahead(1, 0), 1));
}

/// The slot of the grid just behind wall time `now` (the first usable at `now`).
fn slot_behind(p: &Proc) -> (cluster::Grid, u64) {
    let grid = cluster::rule_reach(&p.config.rules[0]).unwrap().grid;
    (grid, grid.slot_at_or_after(p.clock.wall) - 1)
}

#[test]
fn a_cluster_request_without_grants_goes_at_once_on_credit_once() {
    let mut p = cluster(false);
    assert_eq!(p.get(10), Verdict::Continue);
    assert_eq!(
        p.cells.borrow().get(CellId::Ahead(0)),
        Some(ahead(1, 0)),
        "the process owes one slot"
    );
    // The credit is spent: the next one waits in the rule's line (its turn,
    // at the 50/s the process expects over 2 replicas after the first
    // shares, 300 ms ahead, is well within max_queue_delay).
    assert_eq!(p.get(11), Verdict::Hold);
    assert_eq!(waiting(&p), 1);
    assert_eq!(
        p.stats(),
        s(&[
            ("admitted", 1),
            ("held", 1),
            ("queued", 1),
            ("slots_ahead", 1),
            ("slots_taken", 1)
        ])
    );
    // Grants arrive: the waiting request goes first, on the first (just
    // behind now); the credit is not repaid while it waits.
    p.at(5);
    let (grid, k) = slot_behind(&p);
    publish(&p, Mode::Grid, &[(k, k + 2)]);
    let owed = |p: &Proc| cluster::Ahead::decode(p.cells.borrow().get(CellId::Ahead(0))).owed;
    assert_eq!(owed(&p), 1, "not repaid ahead of a waiting request");
    p.tick();
    assert_eq!(p.resumed, vec![(11, 5 * MS)], "released on the slot due");
    assert_eq!(waiting(&p), 0);
    // Nobody waits now: the next slot (within one interval) repays the
    // credit, as a burst's allowance comes back while the rate goes unused.
    publish(&p, Mode::Grid, &[]);
    assert_eq!(owed(&p), 0, "repaid");
    let _ = grid;
}

#[test]
fn a_cluster_request_waits_in_the_line_and_takes_the_first_slot_due() {
    let mut p = cluster(false);
    spend_credit(&p);
    assert_eq!(p.get(10), Verdict::Hold);
    assert_eq!(waiting(&p), 1);
    p.at(5);
    p.tick();
    assert!(p.resumed.is_empty(), "no grant yet: still waiting");
    // The engine grants the slot just ahead of now and the next one (100/s:
    // a slot per 10 ms); the waiting request takes the first when it is due
    // (the credit taken before waits for a slot nobody needs).
    let (grid, k) = slot_behind(&p);
    publish(&p, Mode::Grid, &[(k + 1, k + 3)]);
    let wait = grid.slot_time(k + 1) - p.clock.wall;
    assert!(wait > 0 && wait <= 10 * MS, "within one interval");
    p.tick();
    assert!(p.resumed.is_empty());
    p.at_ns(5 * MS + wait);
    p.tick();
    assert_eq!(p.resumed, vec![(10, 5 * MS + wait)]);
    assert_eq!(waiting(&p), 0, "it left the waiting count");
    assert_eq!(
        p.stats(),
        s(&[("queued", 1), ("released", 1), ("slots_taken", 1)])
    );
}

#[test]
fn a_waiter_the_fallback_cannot_serve_in_time_is_refused_at_its_deadline() {
    let mut p = cluster(false);
    spend_credit(&p);
    assert_eq!(p.get(10), Verdict::Hold);
    // The engine fails: local pacing at one request per 10 ms. The
    // fallback schedule is already 450 ms ahead (others paced locally).
    publish(
        &p,
        Mode::Local {
            interval_ns: 10 * MS,
        },
        &[],
    );
    p.cells
        .borrow_mut()
        .cells
        .insert(CellId::Fallback(0), ([0, T0 + 600 * MS + 450 * MS], 1));
    // At 600 ms the fallback's next turn (1,050 ms) lies past the waiter's
    // deadline (1,000 ms): nothing yet; at its deadline, with the credit
    // spent, it is answered (an engine fault, the one case where a request
    // that waited is refused).
    p.at(600);
    p.tick();
    assert!(p.replies.is_empty() && p.resumed.is_empty());
    p.at(1000);
    p.tick();
    assert_eq!(p.replies.get(&10).map(|r| r.status), Some(429));
    // A first attempt may hold its full second on the fallback schedule:
    // the turn at 1,050 ms nobody took.
    assert_eq!(p.get(11), Verdict::Hold);
    assert_eq!(p.held_until(), Some(1050 * MS));
}

#[test]
fn the_last_waiter_refused_at_its_deadline_leaves_the_waiting_count() {
    let mut p = cluster(false);
    spend_credit(&p);
    assert_eq!(p.get(10), Verdict::Hold);
    assert_eq!(waiting(&p), 1);
    // No grant comes and the credit is spent: refused at its deadline; the
    // fast path no longer sees anyone waiting (nor the claims).
    p.at(1000);
    p.tick();
    assert_eq!(p.replies.get(&10).map(|r| r.status), Some(429));
    assert_eq!(waiting(&p), 0);
}

/// The wait a dry-run note gives (`queued; wait_ms=N`).
fn noted_wait_ms(note: &[(&'static str, String)]) -> u64 {
    match note {
        [(name, v)] if *name == "x-throttle-dry-run" => v
            .strip_prefix("queued; wait_ms=")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("not a wait: {v}")),
        _ => panic!("no dry-run note: {note:?}"),
    }
}

#[test]
fn a_cluster_dry_run_leaves_a_ticket_later_arrivals_wait_behind() {
    let mut p = cluster(true);
    p.config.dry_run_headers = true;
    spend_credit(&p);
    // No owned slot and no credit: each would wait in the rule's line. Each
    // goes on at once; its ticket waits in its place.
    assert_eq!(p.get(10), Verdict::Continue);
    assert_eq!(p.get(11), Verdict::Continue);
    let first = noted_wait_ms(&p.respond(10, true));
    let second = noted_wait_ms(&p.respond(11, true));
    // The first shares come 300 ms ahead; then one slot per 20 ms (the
    // 50/s expected here), reckoned a third slower: 26.7 ms.
    assert_eq!(first, 326, "300 ms and one gap");
    assert_eq!(second, 353, "behind the first: 300 ms and two gaps");
    assert_eq!(waiting(&p), 2, "the fast path and the claims see both");
    assert_eq!((p.worker.held(), p.worker.classes.dry_len()), (0, 2));
    assert_eq!(p.stats(), s(&[("would_queue", 2)]));
    // No grant comes: at their deadline the tickets leave the line; nobody
    // is answered, nothing more is counted.
    p.at(1000);
    p.tick();
    assert_eq!((waiting(&p), p.worker.classes.dry_len()), (0, 0));
    assert!(p.replies.is_empty() && p.resumed.is_empty());
    assert_eq!(p.stats(), s(&[("would_queue", 2)]));
}

/// One request waits in the line (credit spent, no grants); the engine then
/// grants the slot due now and the next; a second request arrives before a
/// tick. Returns the process once both slots are past.
fn a_later_arrival_and_a_waiter(dry: bool) -> Proc {
    let mut p = cluster(dry);
    spend_credit(&p);
    let first = p.get(10);
    p.at(10);
    // The slot due now and the next, at the 50/s this process expects.
    let grid = cluster::rule_reach(&p.config.rules[0]).unwrap().grid;
    let k = grid.slot_at_or_after(p.clock.wall);
    assert_eq!(grid.slot_time(k), p.clock.wall);
    publish_share(&p, Mode::Grid, (50, 0, 0), &[(k, k + 2)]);
    let owed = cluster::Ahead::decode(p.cells.borrow().get(CellId::Ahead(0))).owed;
    assert_eq!(owed, 1, "the credit is not repaid ahead of the waiter");
    let second = p.get(11);
    if dry {
        assert_eq!((first, second), (Verdict::Continue, Verdict::Continue));
    } else {
        assert_eq!((first, second), (Verdict::Hold, Verdict::Hold));
    }
    p.tick();
    p.at_ns(grid.slot_time(k + 1) - WALL0);
    p.tick();
    assert_eq!(waiting(&p), 0, "both granted");
    p
}

#[test]
fn a_cluster_dry_run_takes_no_owned_slot_ahead_of_a_waiting_ticket() {
    // Enforced: the second waits behind the first (someone waits), and each
    // is released on an owned slot.
    let enforced = a_later_arrival_and_a_waiter(false);
    assert_eq!(
        enforced.resumed.iter().map(|r| r.0).collect::<Vec<_>>(),
        [10, 11]
    );
    assert_eq!(
        enforced.stats(),
        s(&[("queued", 2), ("released", 2), ("slots_taken", 2)])
    );
    // Dry-run: the same bookkeeping; the second does not take the slot the
    // first's ticket is granted, and nothing is held or resumed.
    let dry = a_later_arrival_and_a_waiter(true);
    assert!(dry.resumed.is_empty() && dry.replies.is_empty());
    assert_eq!((dry.worker.held(), dry.worker.classes.dry_len()), (0, 0));
    assert_eq!(dry.stats(), s(&[("slots_taken", 2), ("would_queue", 2)]));
}

#[test]
fn a_cluster_dry_run_line_counts_against_max_held_per_worker() {
    let json = CLUSTER.replace("{\"engine\"", "{\"max_held_per_worker\": 2, \"engine\"");
    let run = |dry: bool| {
        let mut p = Proc::new(&json.replace("DRY", &dry.to_string()));
        spend_credit(&p);
        let verdicts: Vec<Verdict> = (10..13).map(|id| p.get(id)).collect();
        (p, verdicts)
    };
    let (enforced, verdicts) = run(false);
    assert_eq!(verdicts[..2], [Verdict::Hold, Verdict::Hold]);
    assert!(
        matches!(verdicts[2], Verdict::Reply(_)),
        "the worker is full"
    );
    assert_eq!(
        enforced.stats(),
        s(&[("held", 2), ("queued", 2), ("rejected", 1)])
    );
    let (dry, verdicts) = run(true);
    assert_eq!(verdicts, vec![Verdict::Continue; 3], "none is held");
    assert_eq!((dry.worker.held(), dry.worker.classes.dry_len()), (0, 2));
    assert_eq!(dry.stats(), s(&[("would_queue", 2), ("would_reject", 1)]));
}

impl Proc {
    /// The upstream's answer to `id` now (adaptive rules learn from it).
    fn answer(&mut self, id: u32, status: u16, retry_after_s: Option<u64>) {
        let now = self.clock.mono;
        let stream = self.streams.get_mut(&id).expect("a stream");
        if stream.learns() {
            stream.on_answer(&mut self.worker, now, status, retry_after_s, None);
        }
    }
}

/// An adaptive rule: the worker's tally counts what the learner needs
/// (arrivals; sends, at once or at release; each answer with its latency
/// since it was sent), nothing of what the throttle answered itself; the
/// interval the learner keeps in the rule's cell paces it, and a faster one
/// brings the worker's held requests forward.
#[test]
fn adaptive_rules_tally_their_traffic_and_pace_at_the_learned_rate() {
    let mut p = Proc::new(
        r#"{"rules": [{"name": "api", "rate": "100/s", "max_queue_delay": "40ms",
             "adaptive": {"min_rate": "10/s", "max_rate": "1000/s"}}]}"#,
    );
    p.at(0);
    assert_eq!(p.get(1), Verdict::Continue);
    for id in 2..=5 {
        assert_eq!(p.get(id), Verdict::Hold, "{id}: 10, 20, 30, 40 ms");
    }
    assert!(matches!(p.get(6), Verdict::Reply(_)), "50 ms: beyond 40 ms");
    let t = p.worker.tallies[0];
    assert_eq!((t.arrivals, t.sent), (6, 1));
    p.at(5);
    p.answer(1, 200, None);
    assert!(!p.streams[&6].learns(), "the throttle answered 6 itself");
    p.at(10);
    p.tick();
    assert_eq!(p.resumed, vec![(2, 10 * MS)]);
    assert_eq!(p.worker.tallies[0].sent, 2);
    p.at(17);
    p.answer(2, 429, Some(3));
    let t = p.worker.tallies[0];
    assert_eq!((t.good, t.shed, t.retry_after_s), (1, 1, 3));
    assert_eq!(t.latency_us, 5_000, "5 ms for 1; 2's 429 is not timed");
    // The learner makes it 200/s: 3, 4, 5 (due at 20, 30, 40 ms) come forward.
    crate::adaptive::learner::write_interval(
        &mut MemStore(&p.cells).cell(CellId::Rate(0)),
        10 * MS,
        5 * MS,
        p.clock.mono,
    );
    p.at(18);
    p.tick();
    p.at(30);
    p.tick();
    let ids: Vec<u32> = p.resumed.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![2, 3, 4, 5], "all by 30 ms (were 20, 30, 40)");
    // New requests pace at 5 ms after the moved schedule's end.
    let [first, _] = MemStore(&p.cells).load(CellId::Rate(0)).unwrap().0.unwrap();
    assert_eq!(first, 5 * MS, "admissions keep the learned interval");
    // A client that leaves while its request is upstream: cancelled.
    let now = p.clock.mono;
    let s3 = p.streams.get_mut(&3).unwrap();
    assert!(s3.learns());
    s3.on_gone(&mut p.worker, now);
    assert!(!s3.learns());
    assert_eq!(p.worker.tallies[0].cancelled, 1);
    // Taken for the shared tally, the worker's is empty again.
    let taken = p.worker.take_tallies();
    assert_eq!(taken.len(), 1);
    assert_eq!(p.worker.tallies[0], crate::adaptive::Tally::EMPTY);
}

/// Deadline admission: an adaptive rule in enforce mode answers at once a
/// request whose turn would come after its own deadline, without taking a
/// slot; the same request with time to spare, or under observe mode, waits.
#[test]
fn adaptive_rules_refuse_at_once_what_would_be_held_past_its_deadline() {
    for mode in ["enforce", "observe"] {
        let mut p = Proc::new(&format!(
            r#"{{"rules": [{{"name": "api", "rate": "10/s", "max_queue_delay": "1s",
                 "adaptive": {{"min_rate": "1/s", "max_rate": "100/s", "mode": "{mode}"}}}}]}}"#
        ));
        p.at(0);
        assert_eq!(p.get(1), Verdict::Continue);
        // Its turn is at 100 ms; it will not wait 50.
        let hurried = FakeRequest::get("/").with_header("x-envoy-expected-rq-timeout-ms", "50");
        let v = p.request(2, hurried);
        if mode == "observe" {
            assert_eq!(v, Verdict::Hold, "observe mode changes nothing");
            continue;
        }
        assert_eq!(
            v,
            Verdict::Reply(reject("1")),
            "turn at 100 ms, deadline 50 ms"
        );
        // No slot taken: the next one with time to spare gets 100 ms.
        let patient = FakeRequest::get("/").with_header("grpc-timeout", "2S");
        assert_eq!(p.request(3, patient), Verdict::Hold);
        p.at(100);
        p.tick();
        assert_eq!(p.resumed, vec![(3, 100 * MS)]);
    }
}

/// A request whose response side is quiet ([`Stream::response_is_quiet`]: the
/// glue then skips the response's callbacks) would get nothing from them:
/// no header, count, wake or tick, whatever comes. Held requests, gated
/// rules and rate-limit headers are not quiet.
#[test]
fn a_quiet_response_side_answers_nothing() {
    let cases = [
        (r#"{"rules": [{"name": "a", "rate": "10/s"}]}"#, true),
        (
            r#"{"rules": [{"name": "a", "rate": "10/s", "key": {"header": "x-user"}}]}"#,
            true,
        ),
        (
            r#"{"rules": [{"name": "a", "rate": "10/s"}], "rate_limit_headers": true}"#,
            false,
        ),
        (r#"{"rules": [{"name": "a", "concurrency": 5}]}"#, false),
    ];
    for (json, quiet) in cases {
        let mut p = Proc::new(json);
        assert_eq!(p.get(1), Verdict::Continue, "{json}");
        assert_eq!(p.streams[&1].response_is_quiet(&p.config), quiet, "{json}");
        let before = p.totals.clone();
        let headers = p.respond(1, false);
        p.response_end(1);
        p.done(1);
        if quiet {
            assert!(headers.is_empty(), "{json}: {headers:?}");
            assert_eq!(p.totals, before, "{json}");
            assert!(!p.woke);
        }
    }
    // A second request within 100 ms at 10/s is held: not quiet.
    let mut p = Proc::new(r#"{"rules": [{"name": "a", "rate": "10/s"}]}"#);
    p.get(1);
    assert_eq!(p.get(2), Verdict::Hold);
    assert!(!p.streams[&2].response_is_quiet(&p.config));
}

// ------------------------------------------------------------- cells created at configure

/// A store on which another VM's whole action runs right after this one
/// first reads `target`: the interleaving in which both read a cell before
/// either writes it.
#[derive(Clone, Copy)]
struct Racing<'a, 'b> {
    mem: MemStore<'a>,
    target: CellId,
    /// Or the first read of this value.
    blob: Option<BlobId>,
    other: &'b dyn Fn(),
    fired: &'b std::cell::Cell<bool>,
}

impl Store for Racing<'_, '_> {
    fn load(&self, id: CellId) -> Result<(Option<[u64; 2]>, u32), crate::StoreError> {
        let seen = self.mem.load(id);
        if id == self.target && !self.fired.replace(true) {
            (self.other)();
        }
        seen
    }
    fn store(&self, id: CellId, value: [u64; 2], token: u32) -> Result<bool, crate::StoreError> {
        self.mem.store(id, value, token)
    }
    fn load_blob(&self, id: BlobId) -> Result<(Option<Vec<u8>>, u32), crate::StoreError> {
        let seen = self.mem.load_blob(id);
        if Some(id) == self.blob && !self.fired.replace(true) {
            (self.other)();
        }
        seen
    }
    fn store_blob(&self, id: BlobId, value: &[u8], token: u32) -> Result<bool, crate::StoreError> {
        self.mem.store_blob(id, value, token)
    }
}

const CREDIT_RULE: &str = r#"{"engine": {"cluster": "throttle_engine"},
    "rules": [{"name": "c", "rate": "10/s", "scope": "cluster", "expected_replicas": 2}]}"#;

/// Two workers take credit for their first requests at once (no grants yet).
/// Returns how many went on credit and what the process owes.
fn first_credits(p: &Proc) -> (usize, u64) {
    let reach = cluster::rule_reach(&p.config.rules[0]).unwrap();
    let mem = MemStore(&p.cells);
    let b_took = RefCell::new(None);
    let other = || {
        *b_took.borrow_mut() = Some(cluster::take(
            &mut mem.cell(CellId::Cursor(0)),
            &mut mem.blob(BlobId::Grants(0)),
            &mut mem.cell(CellId::Ahead(0)),
            &reach,
            WALL0,
            true,
            cluster::Attempt::First,
        ));
    };
    let fired = std::cell::Cell::new(false);
    let racing = Racing {
        mem,
        target: CellId::Ahead(0),
        blob: None,
        other: &other,
        fired: &fired,
    };
    let a = cluster::take(
        &mut racing.cell(CellId::Cursor(0)),
        &mut racing.blob(BlobId::Grants(0)),
        &mut racing.cell(CellId::Ahead(0)),
        &reach,
        WALL0,
        true,
        cluster::Attempt::First,
    );
    let b = *b_took.borrow();
    let credits = [Some(a), b]
        .iter()
        .filter(|t| **t == Some(cluster::Take::Credit))
        .count();
    let owed = cluster::Ahead::decode(p.cells.borrow().get(CellId::Ahead(0))).owed;
    (credits, owed)
}

#[test]
fn two_workers_racing_for_the_first_credit_take_it_once() {
    // burst 0: one request may go ahead of the grants. The ahead cell exists
    // from configure on, so the second compare-and-swap sees the first.
    let p = Proc::new(CREDIT_RULE);
    assert_eq!(first_credits(&p), (1, 1));
    assert!(p.cells.borrow().unguarded_writes().is_empty());
    // Had configure not created it, Envoy would have written both (a key that
    // does not exist is written whatever the token): two ahead, one owed.
    let bare = Proc::unconfigured(CREDIT_RULE);
    assert_eq!(first_credits(&bare), (2, 1));
}

/// Two VMs tick at once and both try to take the calling lease. Returns how
/// many hold it.
fn lease_holders(p: &Proc) -> usize {
    let mem = MemStore(&p.cells);
    let b_holds = RefCell::new(false);
    let other = || {
        *b_holds.borrow_mut() = crate::lease::hold(&mut mem.cell(CellId::Caller), 9, T0);
    };
    let fired = std::cell::Cell::new(false);
    let racing = Racing {
        mem,
        target: CellId::Caller,
        blob: None,
        other: &other,
        fired: &fired,
    };
    let a = crate::lease::hold(&mut racing.cell(CellId::Caller), 7, T0);
    let b = *b_holds.borrow();
    usize::from(a) + usize::from(b)
}

#[test]
fn two_vms_racing_for_the_first_lease_one_holds_it() {
    let p = Proc::new(CREDIT_RULE);
    assert_eq!(lease_holders(&p), 1);
    assert!(p.cells.borrow().unguarded_writes().is_empty());
    let bare = Proc::unconfigured(CREDIT_RULE);
    assert_eq!(
        lease_holders(&bare),
        2,
        "an uncreated lease cell is taken twice"
    );
}

const KEYED_RULE: &str = r#"{"rules": [{"name": "k", "rate": "20/s", "max_queue_delay": "5s", "key": {"header": "x-user"}}]}"#;

/// Two workers admit the first request of a new key at once: both read its
/// bucket before either writes it. Returns how many went at once.
fn at_once_of_a_new_key(p: &Proc, fingerprint: u64) -> usize {
    use crate::schedule::{admit_keyed, Admission};
    let rule = &p.config.rules[0];
    let schedule = rule.schedule.unwrap();
    let at = crate::keys::candidates(fingerprint, rule.key_slots);
    let mem = MemStore(&p.cells);
    let b_got = RefCell::new(None);
    let other = || {
        *b_got.borrow_mut() = Some(admit_keyed(
            &mut mem.table(0),
            fingerprint,
            at,
            &schedule,
            T0,
            true,
        ));
    };
    let fired = std::cell::Cell::new(false);
    let racing = Racing {
        mem,
        target: CellId::Caller,
        blob: Some(BlobId::Bucket(0, at.first)),
        other: &other,
        fired: &fired,
    };
    let a = admit_keyed(&mut racing.table(0), fingerprint, at, &schedule, T0, true);
    assert!(fired.get());
    let b = *b_got.borrow();
    [Some(a), b]
        .iter()
        .filter(|x| matches!(x, Some(Admission::Now { .. })))
        .count()
}

#[test]
fn two_workers_racing_for_a_new_keys_first_request_let_one_go() {
    // Envoy 1.40, 2026-11-29: a new key's burst of 10 at 20/s let 2 go at
    // once. Configure creates every bucket of the table, so the second
    // compare-and-swap sees the first, whichever bucket a key falls in.
    let p = Proc::new(KEYED_RULE);
    assert_eq!(
        p.cells.borrow().blobs.len(),
        512,
        "4,096 slots: 512 buckets"
    );
    for fingerprint in [1u64, 0x9e37_79b9_7f4a_7c15, u64::MAX] {
        assert_eq!(at_once_of_a_new_key(&p, fingerprint), 1, "{fingerprint:#x}");
    }
    assert!(p.cells.borrow().unguarded_writes().is_empty());
    // Had configure not created them, Envoy would have written both (a key
    // that does not exist is written whatever the token).
    let bare = Proc::unconfigured(KEYED_RULE);
    assert_eq!(
        at_once_of_a_new_key(&bare, 1),
        2,
        "an uncreated bucket is written twice"
    );
}

#[test]
fn a_key_table_is_created_once_and_the_next_configure_reads_one_cell() {
    let p = Proc::new(
        r#"{"rules": [{"name": "k", "rate": "20/s", "key": {"header": "x-user"}, "key_slots": 5}]}"#,
    );
    let mem = MemStore(&p.cells);
    let bucket = BlobId::Bucket(0, 0);
    // 5 slots: one bucket of 5 entries, then the marker.
    assert_eq!(
        mem.load_blob(bucket).unwrap().0.map(|v| v.len()),
        Some(5 * 16)
    );
    assert_eq!(p.cells.borrow().get(CellId::Table(0)), Some([1, 5]));
    // The next configure reads the marker alone (a bucket gone stays gone).
    p.cells.borrow_mut().blobs.remove(&bucket);
    assert!(super::create_initial(mem, &p.config).is_empty());
    assert_eq!(mem.load_blob(bucket).unwrap().0, None);
    // Without the marker, a missing bucket is created and one in use kept.
    p.cells.borrow_mut().cells.remove(&CellId::Table(0));
    assert!(super::create_initial(mem, &p.config).is_empty());
    let (created, token) = mem.load_blob(bucket).unwrap();
    assert_eq!(created, Some(vec![0; 80]));
    assert!(mem.store_blob(bucket, &[7; 80], token).unwrap());
    p.cells.borrow_mut().cells.remove(&CellId::Table(0));
    assert!(super::create_initial(mem, &p.config).is_empty());
    assert_eq!(mem.load_blob(bucket).unwrap().0, Some(vec![7; 80]));
    assert_eq!(p.cells.borrow().get(CellId::Table(0)), Some([1, 5]));
}
