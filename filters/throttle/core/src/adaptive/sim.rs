//! A simulated world for the learner, in virtual time: open-loop clients
//! (constant arrival rate, a timeout, optional retries), the throttle (the
//! real GCRA [`Schedule`] as the pacer, held requests released at 1 ms
//! ticks, exactly as the filter decides at admission), and a backend with
//! `W` workers, a lognormal service time (mean `S`, CV 0.3) and an optional
//! internal rate limit that answers 429 with `Retry-After`. Capacity and
//! load change in steps ([`Phase`]). Deterministic for a given seed.
//!
//! The learner sees exactly what the filter would: arrivals, sends, and
//! each answer's status, latency and `Retry-After`, summed per round; a
//! client that gives up while its request is upstream shows as cancelled
//! (Envoy resets the upstream stream; the backend still does the dead work).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

use super::controller::{rate_of_interval, Controller, Reason, Reasons, Tuning, MICRO};
use super::tally::{Observation, Origin, Outcome, Tally, SAMPLE_EVERY};
use crate::schedule::{retime, Schedule, Step};
use crate::{NS_PER_MS, NS_PER_S};

/// From `at_ns` on: the backend's workers, mean service time and internal
/// limit, and the clients' offered rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub at_ns: u64,
    pub workers: u32,
    pub service_us: u64,
    /// Internal token bucket (requests per second, burst = a tenth of it):
    /// beyond it the backend answers 429 with `Retry-After: 1` at once.
    pub limit_per_s: Option<u64>,
    pub offered_per_s: u64,
}

impl Phase {
    /// What the backend can serve per second: W / S, or its limit if lower.
    pub fn capacity_per_s(&self) -> f64 {
        let by_workers = f64::from(self.workers) * 1e6 / self.service_us.max(1) as f64;
        self.limit_per_s
            .map_or(by_workers, |l| by_workers.min(l as f64))
    }
}

pub use super::Mode;

/// What paces the requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacer {
    /// No throttle: every request goes upstream at once.
    None,
    /// The throttle at a fixed rate.
    Static { rate_per_s: f64 },
    /// The learner (tuned by [`World::tune`]): starts at `start_per_s`, bounded.
    Adaptive {
        start_per_s: f64,
        min_per_s: f64,
        max_per_s: f64,
        mode: Mode,
    },
}

/// One simulated run.
#[derive(Debug, Clone)]
pub struct World {
    /// Sorted by `at_ns`; the first starts at 0.
    pub phases: Vec<Phase>,
    pub duration_ns: u64,
    pub pacer: Pacer,
    pub max_queue_delay_ns: u64,
    /// Clients give up after this long (and may retry).
    pub client_timeout_ns: u64,
    /// Envoy's route timeout: a request upstream this long is answered 504
    /// by Envoy (the learner sees the 504; the backend still does the work).
    pub route_timeout_ns: Option<u64>,
    /// Retries per request after a timeout, 5xx or 429 (at once).
    pub retries: u32,
    /// Coefficient of variation of service times, percent.
    pub cv_pct: u64,
    pub seed: u64,
    /// The learner's constants.
    pub tune: Tuning,
    /// When the learned rate rises, bring what is already scheduled forward
    /// (see [`retime`]); false: a higher rate applies only after the
    /// schedule's backlog (today's schedule, decided at admission). A lower
    /// rate always applies to new admissions only.
    pub retime: bool,
    /// A client of the same rule whose own requests the backend answers
    /// with an error at once, whatever its load.
    pub attack: Option<Attack>,
}

/// A client that asks for something the backend answers badly (a broken
/// endpoint, its own bad requests or quota), from one address to one path,
/// at a constant rate between two times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attack {
    pub from_ns: u64,
    pub to_ns: u64,
    pub per_s: u64,
    pub status: u16,
    pub retry_after_s: Option<u64>,
}

impl World {
    /// The defaults of the scenarios: no retries, 2 s client timeout, CV 0.3.
    pub fn new(phases: Vec<Phase>, duration_s: u64, pacer: Pacer) -> Self {
        World {
            phases,
            duration_ns: duration_s * NS_PER_S,
            pacer,
            max_queue_delay_ns: 500 * NS_PER_MS,
            client_timeout_ns: 2 * NS_PER_S,
            route_timeout_ns: None,
            retries: 0,
            cv_pct: 30,
            seed: 1,
            tune: Tuning::default(),
            retime: true,
            attack: None,
        }
    }
}

/// Length of a report bucket.
pub const BUCKET_NS: u64 = 100 * NS_PER_MS;
/// Length of a learner round (its tick).
pub const ROUND_NS: u64 = 100 * NS_PER_MS;
/// Tick of the throttle's releases.
const TICK_NS: u64 = NS_PER_MS;

/// What happened in one 100 ms bucket.
#[derive(Debug, Clone, Default)]
pub struct Bucket {
    /// Arrivals at the throttle (with retries).
    pub arrivals: u64,
    /// Sent upstream.
    pub sent: u64,
    /// Answers the (well-behaved) clients got: 2xx, 2xx within the SLO
    /// (1 s), the backend's 429s, the throttle's own 429s; attempts the
    /// clients gave up on. The attacker's are counted apart.
    pub ok: u64,
    pub ok_in_slo: u64,
    pub upstream_429: u64,
    pub local_429: u64,
    pub timeouts: u64,
    /// Envoy's 504s (the route's timeout).
    pub gateway_504: u64,
    /// Latencies of the 2xx answers, µs.
    pub ok_latency_us: Vec<u64>,
    /// The backend's capacity, per second.
    pub capacity_per_s: f64,
    /// The backend's own queue (waiting for a worker) at the bucket's end.
    pub backlog: u64,
    /// The rate the throttle paced at (the learner's in observe mode too), per second.
    pub rate_per_s: f64,
    /// The learner's rate (what it would pace at), per second.
    pub learned_per_s: f64,
    /// What moved it in the round that ended with this bucket.
    pub reasons: Reasons,
    /// Requests in flight as the learner counts them, and the schedule's
    /// reach beyond now (ms), at the bucket's end.
    pub in_flight: u64,
    pub ahead_ms: u64,
    /// The attacker's requests that arrived, and that went upstream.
    pub attack_arrivals: u64,
    pub attack_sent: u64,
}

/// The outcome of a run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub buckets: Vec<Bucket>,
    /// Counts of each reason, in [`Reason::ALL`] order.
    pub reasons: [u64; 7],
    /// The upstream's arrival times (what it saw), ns.
    pub upstream_arrivals: u64,
}

/// The SLO of the scenarios: a 2xx within 1 s.
pub const SLO_NS: u64 = NS_PER_S;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Lognormal with this mean and coefficient of variation.
    fn lognormal(&mut self, mean: f64, cv: f64) -> f64 {
        if cv <= 0.0 {
            return mean;
        }
        let s2 = (1.0 + cv * cv).ln();
        let mu = mean.ln() - s2 / 2.0;
        let (u1, u2) = (self.unit(), self.unit());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        (mu + s2.sqrt() * z).exp()
    }
}

#[derive(Debug, Clone, Copy)]
struct Req {
    /// When this attempt reached the throttle.
    arrived: u64,
    /// When the client gives up on it.
    deadline: u64,
    retries_left: u32,
    sent_at: u64,
    /// Where it comes from: the attacker's, or one of the others'.
    attack: bool,
    origin: Origin,
}

/// Runs the world.
pub fn run(w: &World) -> Report {
    Sim::new(w).run()
}

struct Sim<'a> {
    w: &'a World,
    rng: Rng,
    report: Report,
    // The throttle.
    tat: Option<u64>,
    held: BinaryHeap<Reverse<(u64, u64)>>,
    held_reqs: HashMap<u64, Req>,
    next_id: u64,
    controller: Option<Controller>,
    tally: Tally,
    // The backend: every request upstream by id; its queue, its busy
    // workers and its shed answers by time.
    upstream: HashMap<u64, Req>,
    queue: VecDeque<u64>,
    busy: BinaryHeap<Reverse<(u64, u64)>>,
    shed: BinaryHeap<Reverse<(u64, u64)>>,
    /// The status and `Retry-After` of each answer given at once.
    fast: HashMap<u64, (u16, Option<u64>)>,
    /// Answers that were not bad, for the sample of origins.
    answers_seen: u64,
    tokens: f64,
    tokens_at: u64,
    /// Deadlines of requests upstream: the client's (a client that gives
    /// up while its request is upstream is observed as cancelled then) or
    /// the route's, if sooner (observed as Envoy's 504).
    upstream_deadlines: BinaryHeap<Reverse<(u64, u64)>>,
    /// Requests upstream whose client is gone (dead work).
    gone: HashSet<u64>,
    retry_at: Vec<(u64, u32)>,
    /// The interval the schedule was last paced at.
    paced: Option<u64>,
    /// Where counts beyond the report would go (never, in practice).
    spare: Bucket,
}

impl<'a> Sim<'a> {
    fn new(w: &'a World) -> Self {
        let controller = match w.pacer {
            Pacer::Adaptive {
                start_per_s,
                min_per_s,
                max_per_s,
                ..
            } => Some(Controller::new(
                interval(start_per_s),
                interval(max_per_s),
                interval(min_per_s),
                Tuning {
                    retime_up: w.retime,
                    ..w.tune
                },
            )),
            _ => None,
        };
        Sim {
            w,
            rng: Rng(w.seed),
            report: Report::default(),
            tat: None,
            held: BinaryHeap::new(),
            held_reqs: Default::default(),
            next_id: 0,
            controller,
            tally: Tally::EMPTY,
            upstream: HashMap::new(),
            queue: VecDeque::new(),
            busy: BinaryHeap::new(),
            shed: BinaryHeap::new(),
            fast: HashMap::new(),
            answers_seen: 0,
            tokens: 0.0,
            tokens_at: 0,
            upstream_deadlines: BinaryHeap::new(),
            gone: Default::default(),
            retry_at: Vec::new(),
            paced: None,
            spare: Bucket::default(),
        }
    }

    fn phase(&self, t: u64) -> Phase {
        let mut p = self.w.phases.first().copied().unwrap_or(Phase {
            at_ns: 0,
            workers: 1,
            service_us: 1000,
            limit_per_s: None,
            offered_per_s: 0,
        });
        for q in &self.w.phases {
            if q.at_ns <= t {
                p = *q;
            }
        }
        p
    }

    fn bucket(&mut self, t: u64) -> &mut Bucket {
        let i = usize::try_from(t / BUCKET_NS).unwrap_or(usize::MAX);
        let end = usize::try_from(self.w.duration_ns / BUCKET_NS).unwrap_or(0);
        let i = i.min(end);
        if i >= self.report.buckets.len() {
            self.report.buckets.resize_with(i + 1, Bucket::default);
        }
        match self.report.buckets.get_mut(i) {
            Some(b) => b,
            None => &mut self.spare,
        }
    }

    /// The interval the throttle paces at now (None: no throttle).
    fn pacing_interval(&self) -> Option<u64> {
        match self.w.pacer {
            Pacer::None => None,
            Pacer::Static { rate_per_s } => Some(interval(rate_per_s)),
            Pacer::Adaptive {
                mode: Mode::Observe,
                start_per_s,
                ..
            } => Some(interval(start_per_s)),
            Pacer::Adaptive { .. } => self.controller.as_ref().map(Controller::interval_ns),
        }
    }

    fn run(mut self) -> Report {
        let w = self.w;
        let mut next_arrival = 0u64;
        let mut next_attack = w.attack.map_or(u64::MAX, |a| a.from_ns);
        let mut next_round = ROUND_NS;
        let mut t = 0u64;
        while t < w.duration_ns {
            let end = t + TICK_NS;
            let p = self.phase(t);
            // Arrivals in [t, end): evenly spaced at the offered rate, and retries.
            if let Some(gap) = NS_PER_S.checked_div(p.offered_per_s) {
                next_arrival = next_arrival.max(t.saturating_sub(gap));
                while next_arrival < end {
                    let at = next_arrival.max(t);
                    self.arrive(at, w.retries, false);
                    next_arrival += gap;
                }
            } else {
                next_arrival = end;
            }
            let due: Vec<(u64, u32)> = {
                let (due, later) = self.retry_at.iter().partition(|(at, _)| *at < end);
                self.retry_at = later;
                due
            };
            for (at, left) in due {
                self.arrive(at.max(t), left, false);
            }
            if let Some(a) = w.attack.filter(|a| a.per_s > 0) {
                while next_attack < end && next_attack < a.to_ns {
                    self.arrive(next_attack.max(t), 0, true);
                    next_attack += NS_PER_S / a.per_s;
                }
            }
            // The tick: release what is due.
            while let Some(&Reverse((release_at, id))) = self.held.peek() {
                if release_at > t {
                    break;
                }
                self.held.pop();
                if let Some(r) = self.held_reqs.remove(&id) {
                    if r.deadline <= t {
                        // The client gave up while it was held.
                        self.client_failed(r.deadline, r, Fail::Timeout);
                        continue;
                    }
                    self.send(t, id, r);
                }
            }
            self.backend(end);
            if end >= next_round {
                self.round(next_round, p);
                next_round += ROUND_NS;
            }
            t = end;
        }
        self.report
    }

    fn arrive(&mut self, at: u64, retries_left: u32, attack: bool) {
        let id = self.next_id;
        self.next_id += 1;
        self.tally.arrived();
        if attack {
            self.bucket(at).attack_arrivals += 1;
        } else {
            self.bucket(at).arrivals += 1;
        }
        // The others: 20 clients on 4 paths; the attacker: its own of each.
        let (path, client) = if attack {
            (1000, 1000)
        } else {
            ((id / 20) % 4, id % 20)
        };
        let mix = |x: u64| {
            let mut z = x
                .wrapping_add(self.w.seed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z ^ (z >> 27)
        };
        let r = Req {
            arrived: at,
            deadline: at.saturating_add(self.w.client_timeout_ns),
            retries_left,
            sent_at: 0,
            attack,
            origin: Origin::new(mix(path), mix(client ^ 0xABCD)),
        };
        let Some(interval) = self.pacing_interval() else {
            self.send(at, id, r);
            return;
        };
        let s = Schedule::new(interval, 0, self.w.max_queue_delay_ns);
        match s.step(self.tat, at, true) {
            Step::Now { new_tat } => {
                self.tat = Some(new_tat);
                self.send(at, id, r);
            }
            Step::Hold {
                release_at,
                new_tat,
            } => {
                self.tat = Some(new_tat);
                self.held.push(Reverse((release_at, id)));
                self.held_reqs.insert(id, r);
            }
            Step::Reject { .. } => {
                if !r.attack {
                    self.bucket(at).local_429 += 1;
                }
                self.client_failed(at, r, Fail::Rejected);
            }
        }
    }

    fn send(&mut self, at: u64, id: u64, mut r: Req) {
        r.sent_at = at;
        self.tally.sent();
        self.bucket(at).sent += 1;
        if r.attack {
            self.bucket(at).attack_sent += 1;
        }
        self.report.upstream_arrivals += 1;
        let route = self
            .w
            .route_timeout_ns
            .map_or(u64::MAX, |t| at.saturating_add(t));
        self.upstream_deadlines
            .push(Reverse((r.deadline.min(route), id)));
        let p = self.phase(at);
        if let Some(a) = self.w.attack.filter(|_| r.attack) {
            // Answered at once, whatever the load.
            self.shed.push(Reverse((at + NS_PER_MS, id)));
            self.fast.insert(id, (a.status, a.retry_after_s));
            self.upstream.insert(id, r);
            return;
        }
        if let Some(limit) = p.limit_per_s {
            let burst = (limit as f64 / 10.0).max(1.0);
            let elapsed = at.saturating_sub(self.tokens_at) as f64 / NS_PER_S as f64;
            self.tokens = (self.tokens + elapsed * limit as f64).min(burst);
            self.tokens_at = at;
            if self.tokens < 1.0 {
                self.shed.push(Reverse((at + NS_PER_MS, id)));
                self.fast.insert(id, (429, Some(1)));
                self.upstream.insert(id, r);
                return;
            }
            self.tokens -= 1.0;
        }
        self.upstream.insert(id, r);
        self.queue.push_back(id);
        self.start_work(at, p);
    }

    fn start_work(&mut self, at: u64, p: Phase) {
        while self.busy.len() < p.workers as usize {
            let Some(id) = self.queue.pop_front() else {
                break;
            };
            let s = self
                .rng
                .lognormal(p.service_us as f64 * 1e3, self.w.cv_pct as f64 / 100.0);
            let done = at.saturating_add(s.max(1.0) as u64);
            self.busy.push(Reverse((done, id)));
        }
    }

    /// The backend up to `end`: answers in time order, workers taking work.
    fn backend(&mut self, end: u64) {
        loop {
            let next_done = self.busy.peek().map(|Reverse((d, _))| *d);
            let next_shed = self.shed.peek().map(|Reverse((d, _))| *d);
            let next_gone = self.upstream_deadlines.peek().map(|Reverse((d, _))| *d);
            let next = [next_done, next_shed, next_gone]
                .into_iter()
                .flatten()
                .min();
            let Some(at) = next.filter(|at| *at < end) else {
                break;
            };
            if next_gone == Some(at) {
                if let Some(Reverse((_, id))) = self.upstream_deadlines.pop() {
                    // Still upstream when its client gives up: Envoy resets
                    // the stream (the learner sees a cancel); the backend
                    // still does the work. The route's timeout first:
                    // Envoy answers 504.
                    if let Some(r) = self.upstream.get(&id).copied() {
                        let route = self.w.route_timeout_ns.map(|t| r.sent_at.saturating_add(t));
                        if route == Some(at) && at < r.deadline && self.gone.insert(id) {
                            self.observe(
                                r,
                                at,
                                Outcome::Answered {
                                    status: 504,
                                    retry_after_s: None,
                                },
                            );
                            self.bucket(at).gateway_504 += 1;
                            self.client_failed(at, r, Fail::Answered);
                        } else if self.gone.insert(id) {
                            self.observe(r, at, Outcome::Cancelled);
                            self.client_failed(at, r, Fail::Timeout);
                        }
                    }
                }
                continue;
            }
            let fast = next_shed == Some(at);
            let popped = if fast {
                self.shed.pop()
            } else {
                self.busy.pop()
            };
            let mut status = 200;
            if let Some(Reverse((_, id))) = popped {
                let retry_after = if fast {
                    let (s, ra) = self.fast.remove(&id).unwrap_or((429, Some(1)));
                    status = s;
                    ra
                } else {
                    None
                };
                if let Some(r) = self.upstream.remove(&id) {
                    self.answer(id, r, at, status, retry_after);
                }
            }
            if !fast {
                let p = self.phase(at);
                self.start_work(at, p);
            }
        }
    }

    fn answer(&mut self, id: u64, r: Req, at: u64, status: u16, retry_after_s: Option<u64>) {
        if self.gone.remove(&id) {
            return; // dead work: nobody is waiting for it
        }
        self.observe(
            r,
            at,
            Outcome::Answered {
                status,
                retry_after_s,
            },
        );
        if r.attack {
            return;
        }
        let b = self.bucket(at);
        if status == 200 {
            let took = at.saturating_sub(r.arrived);
            b.ok += 1;
            if took <= SLO_NS {
                b.ok_in_slo += 1;
            }
            b.ok_latency_us.push(took / 1_000);
        } else {
            b.upstream_429 += 1;
            self.client_failed(at, r, Fail::Answered);
        }
    }

    /// What the filter records of an answer: its origin for every bad one
    /// and one in [`SAMPLE_EVERY`] of the others, as the glue reads it.
    fn observe(&mut self, r: Req, at: u64, outcome: Outcome) {
        let (mut origin, mut sampled) = (None, false);
        if let Outcome::Answered { status, .. } = outcome {
            if status == 429 || (500..600).contains(&status) {
                origin = Some(r.origin);
            } else {
                self.answers_seen += 1;
                sampled = self.answers_seen % SAMPLE_EVERY == 0;
                origin = sampled.then_some(r.origin);
            }
        }
        self.tally.record(&Observation {
            sent_at: r.sent_at,
            done_at: at,
            outcome,
            deadline_ns: None,
            origin,
            sampled,
        });
    }

    fn client_failed(&mut self, at: u64, r: Req, why: Fail) {
        if why == Fail::Timeout {
            self.bucket(at).timeouts += 1;
        }
        if r.retries_left > 0 {
            self.retry_at.push((at, r.retries_left - 1));
        }
    }

    fn round(&mut self, now: u64, p: Phase) {
        let tally = std::mem::take(&mut self.tally);
        let ahead = self.tat.map_or(0, |t| t.saturating_sub(now));
        let mut learned = 0.0;
        let mut reasons = Reasons::default();
        let mut in_flight = 0;
        if let Some(c) = self.controller.as_mut() {
            let u = c.update(now, &tally, ahead);
            reasons = u.reasons;
            in_flight = c.in_flight();
            for (i, r) in Reason::ALL.iter().enumerate() {
                if u.reasons.has(*r) {
                    if let Some(n) = self.report.reasons.get_mut(i) {
                        *n += 1;
                    }
                }
            }
            learned = u.rate as f64 / MICRO as f64;
        }
        let interval = self.pacing_interval();
        if let (Some(old), Some(new)) = (self.paced, interval) {
            if new < old && self.w.retime {
                self.retime(now, old, new);
            }
        }
        self.paced = interval;
        let pacing = interval.map_or(0.0, |i| rate_of_interval(i) as f64 / MICRO as f64);
        let backlog = self.queue.len() as u64;
        let b = self.bucket(now.saturating_sub(1));
        b.capacity_per_s = p.capacity_per_s();
        b.backlog = backlog;
        b.rate_per_s = pacing;
        b.learned_per_s = learned;
        b.reasons = reasons;
        b.in_flight = in_flight;
        b.ahead_ms = ahead / NS_PER_MS;
    }
}

impl Sim<'_> {
    /// Re-times the schedule for a new interval at `now`, as the filter does
    /// ([`crate::schedule::retime`]): its end and every held request.
    fn retime(&mut self, now: u64, old: u64, new: u64) {
        self.tat = self.tat.map(|t| retime(t, now, old, new));
        let held: Vec<(u64, u64)> = self.held.drain().map(|Reverse(x)| x).collect();
        for (release_at, id) in held {
            self.held
                .push(Reverse((retime(release_at, now, old, new), id)));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    Rejected,
    Answered,
    Timeout,
}

fn interval(per_s: f64) -> u64 {
    if per_s <= 0.0 {
        return u64::MAX;
    }
    (NS_PER_S as f64 / per_s).ceil() as u64
}

/// Figures of a report over `[from, to)` (seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// Sent upstream per second.
    pub admitted_per_s: f64,
    /// 2xx within the SLO per second.
    pub goodput_per_s: f64,
    pub upstream_429: u64,
    pub local_429: u64,
    pub timeouts: u64,
    pub gateway_504: u64,
    pub sent: u64,
    /// Of the 2xx answers, ms.
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Report {
    fn range(&self, from_s: f64, to_s: f64) -> &[Bucket] {
        let a = ((from_s * 10.0).round().max(0.0) as usize).min(self.buckets.len());
        let b = ((to_s * 10.0).round().max(0.0) as usize).clamp(a, self.buckets.len());
        self.buckets.get(a..b).unwrap_or(&[])
    }

    /// Figures over `[from_s, to_s)`.
    pub fn figures(&self, from_s: f64, to_s: f64) -> Figures {
        let bs = self.range(from_s, to_s);
        let secs = bs.len() as f64 / 10.0;
        let mut lat: Vec<u64> = bs
            .iter()
            .flat_map(|b| b.ok_latency_us.iter().copied())
            .collect();
        lat.sort_unstable();
        let q = |p: f64| {
            if lat.is_empty() {
                return 0.0;
            }
            let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
            lat.get(i).copied().unwrap_or(0) as f64 / 1000.0
        };
        let sum = |f: fn(&Bucket) -> u64| bs.iter().map(f).sum::<u64>();
        Figures {
            admitted_per_s: sum(|b| b.sent) as f64 / secs.max(0.1),
            goodput_per_s: sum(|b| b.ok_in_slo) as f64 / secs.max(0.1),
            upstream_429: sum(|b| b.upstream_429),
            local_429: sum(|b| b.local_429),
            timeouts: sum(|b| b.timeouts),
            gateway_504: sum(|b| b.gateway_504),
            sent: sum(|b| b.sent),
            p50_ms: q(0.5),
            p99_ms: q(0.99),
        }
    }

    /// Seconds from `change_s` until the admitted rate stays within ±10% of
    /// `target_per_s` and the 2xx p99 under the SLO, in every 1 s window
    /// (sliding by 100 ms) for `hold_s` (or to `end_s`, if sooner). None:
    /// never before `end_s`.
    pub fn time_to_adapt(
        &self,
        change_s: f64,
        target_per_s: f64,
        hold_s: f64,
        end_s: f64,
    ) -> Option<f64> {
        let ok = |u: f64| {
            let f = self.figures(u, u + 1.0);
            (f.admitted_per_s - target_per_s).abs() <= 0.1 * target_per_s
                && f.p99_ms <= SLO_NS as f64 / 1e6
        };
        let steps = ((end_s - 1.0 - change_s) * 10.0).round().max(0.0) as u64;
        'start: for i in 0..=steps {
            let t = change_s + i as f64 / 10.0;
            let last = (t + hold_s).min(end_s - 1.0);
            let mut u = t;
            while u <= last + 1e-9 {
                if !ok(u) {
                    continue 'start;
                }
                u += 0.1;
            }
            return Some(t - change_s);
        }
        None
    }

    /// The largest and smallest admitted rate over 1 s windows in `[from_s, to_s)`.
    pub fn admitted_range(&self, from_s: f64, to_s: f64) -> (f64, f64) {
        let mut lo = f64::MAX;
        let mut hi = 0.0f64;
        let mut u = from_s;
        while u + 1.0 <= to_s + 1e-9 {
            let a = self.figures(u, u + 1.0).admitted_per_s;
            lo = lo.min(a);
            hi = hi.max(a);
            u += 0.1;
        }
        (lo, hi)
    }

    /// The learner's rate over time (per bucket end), per second.
    pub fn learned(&self) -> Vec<f64> {
        self.buckets.iter().map(|b| b.learned_per_s).collect()
    }
}

/// A phase's figures against its target (the measures).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseFigures {
    /// When the phase starts, and the rate it should settle at:
    /// min(capacity, offered), per second.
    pub at_s: f64,
    pub target_per_s: f64,
    /// Seconds until the admitted rate stays within ±10% of the target and
    /// the 2xx p99 under 1 s in every 1 s window for 5 s (None: never).
    pub time_to_adapt_s: Option<f64>,
    /// From 3 s into the phase: the share of 1 s windows (sliding by
    /// 100 ms) whose admitted rate is within ±10% of the target, and the
    /// lowest and highest, relative to it.
    pub in_band: f64,
    pub lowest: f64,
    pub highest: f64,
    /// The whole phase.
    pub figures: Figures,
    /// The backend's 429s after 2 s, as a share of what was sent then.
    pub upstream_429_after_2s: f64,
}

impl Report {
    /// Figures per phase; `changes` are (start s, target per s), sorted.
    pub fn phases(&self, changes: &[(f64, f64)], end_s: f64) -> Vec<PhaseFigures> {
        let mut out = Vec::new();
        for (i, &(at, target)) in changes.iter().enumerate() {
            let next = changes.get(i + 1).map_or(end_s, |c| c.0);
            let (mut n, mut ok, mut lo, mut hi) = (0u32, 0u32, f64::MAX, 0.0f64);
            let mut u = at + 3.0;
            while u + 1.0 <= next + 1e-9 {
                let a = self.figures(u, u + 1.0).admitted_per_s / target;
                n += 1;
                if (a - 1.0).abs() <= 0.1 {
                    ok += 1;
                }
                lo = lo.min(a);
                hi = hi.max(a);
                u += 0.1;
            }
            let late = self.figures(at + 2.0, next);
            out.push(PhaseFigures {
                at_s: at,
                target_per_s: target,
                time_to_adapt_s: self.time_to_adapt(at, target, 5.0, next),
                in_band: if n == 0 {
                    1.0
                } else {
                    f64::from(ok) / f64::from(n)
                },
                lowest: if n == 0 { 1.0 } else { lo },
                highest: if n == 0 { 1.0 } else { hi },
                figures: self.figures(at, next),
                upstream_429_after_2s: late.upstream_429 as f64 / late.sent.max(1) as f64,
            });
        }
        out
    }
}

/// One scenario of the anchors (§6.2), at their own scale: the simulation
/// has no machine limit.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub what: &'static str,
    pub world: World,
    /// (start s, target per s) of each phase.
    pub changes: Vec<(f64, f64)>,
}

impl Scenario {
    /// Runs it and returns the report and its figures per phase.
    pub fn run(&self) -> (Report, Vec<PhaseFigures>) {
        let r = run(&self.world);
        let p = r.phases(
            &self.changes,
            self.world.duration_ns as f64 / NS_PER_S as f64,
        );
        (r, p)
    }
}

fn step(at_s: u64, workers: u32, service_ms: u64, limit: Option<u64>, offered: u64) -> Phase {
    Phase {
        at_ns: at_s * NS_PER_S,
        workers,
        service_us: service_ms * 1000,
        limit_per_s: limit,
        offered_per_s: offered,
    }
}

/// The learner as the scenarios use it: starting at `start_per_s`, bounds
/// 10/s and 2,000/s, default tuning.
pub fn learner(start_per_s: f64, mode: Mode) -> Pacer {
    Pacer::Adaptive {
        start_per_s,
        min_per_s: 10.0,
        max_per_s: 2000.0,
        mode,
    }
}

/// S1, S2, S3, S4, S9 and S10 with this pacer (`max_queue_delay` 300 ms,
/// 1.5 s in S4), seeded.
pub fn anchors(pacer: Pacer, seed: u64) -> Vec<Scenario> {
    let world = |phases, secs, delay_ms: u64| {
        let mut w = World::new(phases, secs, pacer);
        w.max_queue_delay_ns = delay_ms * NS_PER_MS;
        // As the benchmark's Envoy (perf/adaptive/arms.py): a request
        // upstream 1.5 s is answered 504, its work goes on.
        w.route_timeout_ns = Some(1_500 * NS_PER_MS);
        w.seed = seed;
        w
    };
    let mut s9 = world(
        vec![
            step(0, 50, 100, None, 400),
            step(20, 20, 100, None, 400),
            step(50, 50, 100, None, 400),
        ],
        70,
        300,
    );
    s9.retries = 3;
    s9.client_timeout_ns = NS_PER_S;
    vec![
        Scenario {
            name: "S1",
            what: "W 50->20->50, S 100 ms, offered 400/s",
            world: world(
                vec![
                    step(0, 50, 100, None, 400),
                    step(20, 20, 100, None, 400),
                    step(40, 50, 100, None, 400),
                ],
                60,
                300,
            ),
            changes: vec![(0.0, 400.0), (20.0, 200.0), (40.0, 400.0)],
        },
        Scenario {
            name: "S2",
            what: "W 50, S 100->250->100 ms, offered 400/s",
            world: world(
                vec![
                    step(0, 50, 100, None, 400),
                    step(20, 50, 250, None, 400),
                    step(40, 50, 100, None, 400),
                ],
                60,
                300,
            ),
            changes: vec![(0.0, 400.0), (20.0, 200.0), (40.0, 400.0)],
        },
        Scenario {
            name: "S3",
            what: "limit 200/s (429, Retry-After: 1), S 20 ms, offered 400/s",
            world: world(vec![step(0, 50, 20, Some(200), 400)], 40, 300),
            changes: vec![(0.0, 200.0)],
        },
        Scenario {
            name: "S4",
            what: "W 50->20->50 for 4 s, offered 250/s, max_queue_delay 1.5 s",
            world: world(
                vec![
                    step(0, 50, 100, None, 250),
                    step(20, 20, 100, None, 250),
                    step(24, 50, 100, None, 250),
                ],
                40,
                1500,
            ),
            changes: vec![(0.0, 250.0), (20.0, 200.0), (24.0, 250.0)],
        },
        Scenario {
            name: "S9",
            what: "S1's drop for 30 s, clients retry 3x with a 1 s timeout",
            world: s9,
            changes: vec![(0.0, 400.0), (20.0, 200.0), (50.0, 400.0)],
        },
        Scenario {
            name: "S10",
            what: "offered 350/s = 70% of 500/s, nothing changes",
            world: world(vec![step(0, 50, 100, None, 350)], 60, 300),
            changes: vec![(0.0, 350.0)],
        },
    ]
}

/// Beyond the anchors: a client of the same rule whose own requests the
/// backend always answers badly (20% of the rule's traffic; 350/s of the
/// others against a capacity of 500/s, so the rule's rate is never what
/// limits them), from 20 s to 40 s: `A503`, `A500`, `A429` (with
/// `Retry-After: 3600`); `A503-drop`: the same attacker from 10 s on while
/// the capacity halves at 30 s (a real drop must still be cut at once);
/// `S1-stall`: S1 behind a backend that answers nothing for its first 1.5 s
/// (a stalled start: its first answers carry a queue).
pub fn more(pacer: Pacer, seed: u64) -> Vec<Scenario> {
    let attacked = |status: u16, retry_after_s: Option<u64>, from_s: u64, phases: Vec<Phase>| {
        let mut w = World::new(phases, 60, pacer);
        w.max_queue_delay_ns = 300 * NS_PER_MS;
        w.route_timeout_ns = Some(1_500 * NS_PER_MS);
        w.seed = seed;
        w.attack = Some(Attack {
            from_ns: from_s * NS_PER_S,
            to_ns: if from_s == 20 { 40 } else { 60 } * NS_PER_S,
            per_s: 88,
            status,
            retry_after_s,
        });
        w
    };
    let steady = || vec![step(0, 50, 100, None, 350)];
    let mut stall = anchors(pacer, seed)
        .into_iter()
        .find(|s| s.name == "S1")
        .map(|s| s.world)
        .unwrap_or_else(|| World::new(Vec::new(), 60, pacer));
    stall.phases.insert(
        0,
        Phase {
            at_ns: 0,
            workers: 0,
            service_us: 100_000,
            limit_per_s: None,
            offered_per_s: 400,
        },
    );
    if let Some(p) = stall.phases.get_mut(1) {
        p.at_ns = 1_500 * NS_PER_MS;
    }
    vec![
        Scenario {
            name: "A503",
            what: "steady, 350/s of 500/s; an attacker's 88/s answered 503, 20-40 s",
            world: attacked(503, None, 20, steady()),
            changes: vec![(0.0, 350.0), (20.0, 350.0), (40.0, 350.0)],
        },
        Scenario {
            name: "A500",
            what: "the same, answered 500",
            world: attacked(500, None, 20, steady()),
            changes: vec![(0.0, 350.0), (20.0, 350.0), (40.0, 350.0)],
        },
        Scenario {
            name: "A429",
            what: "the same, answered 429 with Retry-After: 3600",
            world: attacked(429, Some(3600), 20, steady()),
            changes: vec![(0.0, 350.0), (20.0, 350.0), (40.0, 350.0)],
        },
        Scenario {
            name: "A503-drop",
            what: "the 503 attacker from 10 s; W 50->20 at 30 s (capacity 500->200)",
            world: attacked(
                503,
                None,
                10,
                vec![step(0, 50, 100, None, 350), step(30, 20, 100, None, 350)],
            ),
            changes: vec![(0.0, 350.0), (10.0, 350.0), (30.0, 200.0)],
        },
        Scenario {
            name: "S1-stall",
            what: "S1 after a backend stalled for its first 1.5 s",
            world: stall,
            changes: vec![(0.0, 400.0), (20.0, 200.0), (40.0, 400.0)],
        },
    ]
}
