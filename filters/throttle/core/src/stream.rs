//! One request's life, decided here and carried out by the glue: what to do
//! with its headers (continue, hold, or answer), what its response carries,
//! and what its end gives back. Each callback returns its answer as data
//! with the counters to move.
//!
//! A rule with a `rate` decides first (continue, hold until the release time,
//! or reject at once); a rule with `concurrency` then takes a slot or waits
//! for one. A request held by the rate takes its slot later, at release (see
//! [`crate::worker`]). Dry-run rules make every decision and count it
//! (`would_queue`, `would_reject`; `admitted` only for what would have been
//! admitted), but hold and reject nothing.

use crate::clock::Clock;
use crate::clock::NS_PER_MS;
use crate::cluster::{self, Attempt, Take};
use crate::config::{Config, Rule};
use crate::gate::{self, Enter};
use crate::keys::{candidate_slots, KeyHasher};
use crate::matcher::{Facts, Request};
use crate::ratelimit::{self, HeaderStyle};
use crate::reply::{rejection, Reply};
use crate::schedule::{admit, admit_keyed, admit_with_quota, Admission};
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Initial, Store};
use crate::worker::Worker;

/// What the request-headers callback does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let the request go on now.
    Continue,
    /// Pause it: it is in the worker's queue or at a gate, and a tick will
    /// resume or answer it (the glue makes sure the worker ticks).
    Hold,
    /// Answer it now with this reply.
    Reply(Reply),
}

/// The answer to a request's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The rule that applied (None: no rule matched).
    pub rule: Option<usize>,
    /// The rule's counters to move.
    pub counts: Counts,
}

impl Decision {
    fn pass() -> Self {
        Decision {
            verdict: Verdict::Continue,
            rule: None,
            counts: Counts::NONE,
        }
    }
}

/// What the response-headers callback adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseDecision {
    /// Headers to set, replacing any of the same name.
    pub headers: Vec<(&'static str, String)>,
    pub counts: Counts,
    /// A gate slot went back and a waiter's turn came: wake the workers.
    pub wake: bool,
    /// An abandoned gate ticket waits for its turn: the worker must tick.
    pub tick: bool,
}

/// The end of a stream: counters to move, and whether to wake or tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndDecision {
    pub counts: Counts,
    pub wake: bool,
    pub tick: bool,
}

/// The outcome of the rate stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rate {
    /// Within the rate: on to the gate (if any), or continue.
    Go,
    /// Hold until this monotonic time.
    Hold(u64),
    /// Cluster scope: wait for grants until this monotonic time at most.
    WaitGrants(u64),
    /// Reject now with this `retry-after`.
    Reject(u64),
    /// The shared state could not be updated: fail closed.
    Contention,
}

/// What the rate stage left for the response's rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RateSeen {
    /// The schedule after this request (or as it stood, if rejected).
    tat: u64,
    rejected: bool,
}

/// The state of one request (one HTTP context), across its callbacks.
#[derive(Debug, Default)]
pub struct Stream {
    id: u32,
    rule: Option<usize>,
    /// It was held (by the rate or at a gate) at some point.
    held: bool,
    /// Its rule has a gate, so it may hold a slot to give back.
    gated: bool,
    /// Dry-run: what would have happened (only kept when clients see it).
    note: Option<String>,
    rate: Option<RateSeen>,
    /// The filter answered it itself (the reply carried the headers).
    replied: bool,
}

/// What the decisions need besides the request: the configuration, the
/// key hasher, and the process-wide cells.
#[derive(Clone, Copy)]
pub struct Env<'a, S> {
    pub config: &'a Config,
    pub hasher: &'a KeyHasher,
    pub store: S,
}

/// The shared values rule `index`'s stages need before its first request
/// (so that every update carries a compare-and-swap token). Key tables are
/// not listed: a slot is written with a token of 0 the first time.
pub fn initial_values(index: usize, rule: &Rule) -> Vec<Initial> {
    let mut out = Vec::new();
    if rule.schedule.is_some() {
        out.push(Initial::Cell(CellId::Rate(index)));
    }
    if rule.concurrency.is_some() {
        out.push(Initial::Cell(CellId::Gate(index)));
    }
    if rule.cluster.is_some() {
        out.extend(
            [
                CellId::Cursor(index),
                CellId::Waiting(index),
                CellId::Fallback(index),
            ]
            .map(Initial::Cell),
        );
        out.push(Initial::Blob(
            BlobId::Grants(index),
            cluster::Grants::default().encode(),
        ));
    }
    out
}

impl Stream {
    pub fn new(id: u32) -> Self {
        Stream {
            id,
            ..Default::default()
        }
    }

    /// The rule that applied.
    pub fn rule(&self) -> Option<usize> {
        self.rule
    }

    /// The rule that applies to a request (None: none matches).
    fn pick<'c, R: Request>(config: &'c Config, req: &mut Facts<R>) -> Option<(usize, &'c Rule)> {
        let index = if config.first_rule_takes_all() {
            0
        } else {
            config.rules.iter().position(|r| r.matcher.matches(req))?
        };
        Some((index, config.rules.get(index)?))
    }

    /// The request's headers arrived while the worker's state was busy (the
    /// glue found it borrowed; cannot happen in one thread): decided without
    /// it, failing closed. Counted as contention, then rejected (under
    /// dry-run: would be rejected, and it goes on). Reads no clock.
    pub fn on_busy<S: Store, R: Request>(
        &mut self,
        env: Env<'_, S>,
        req: &mut Facts<R>,
    ) -> Decision {
        let config = env.config;
        let Some((index, rule)) = Self::pick(config, req) else {
            return Decision::pass();
        };
        self.rule = Some(index);
        let mut d = Decision {
            verdict: Verdict::Continue,
            rule: Some(index),
            counts: Counts::of(&[(Stat::Requests, 1), (Stat::Contention, 1)]),
        };
        if rule.dry_run {
            d.counts.inc(Stat::WouldReject);
            self.note(config, "rejected; contention".into());
        } else {
            d.counts.inc(Stat::Rejected);
            d.verdict = Verdict::Reply(self.reject(config, rule, req, 1, 0));
        }
        d
    }

    /// The request's headers arrived: pick the rule, then admit, hold or
    /// reject. `clock` is read only if a rule applies (the wall clock only for
    /// cluster rules).
    pub fn on_request<S: Store, R: Request>(
        &mut self,
        env: Env<'_, S>,
        worker: &mut Worker,
        req: &mut Facts<R>,
        clock: &mut impl Clock,
    ) -> Decision {
        let config = env.config;
        let Some((index, rule)) = Self::pick(config, req) else {
            return Decision::pass();
        };
        self.rule = Some(index);
        // Set before any early return: a request held by the rate takes its
        // gate slot later, on tick, and must still give it back.
        self.gated = rule.concurrency.is_some();
        let mut d = Decision {
            verdict: Verdict::Continue,
            rule: Some(index),
            counts: Counts::NONE,
        };
        let max_held = usize::try_from(config.max_held_per_worker).unwrap_or(usize::MAX);
        let can_hold = rule.dry_run || worker.held() < max_held;
        let mut would = false;
        let now = clock.mono();
        d.counts.inc(Stat::Requests);

        let rate = if rule.cluster.is_some() {
            self.take_cluster(env, index, rule, clock, can_hold, &mut d.counts)
        } else {
            self.admit_rate(env, index, rule, req, now, can_hold)
        };
        match rate {
            Rate::Go => {}
            Rate::Hold(release_at) | Rate::WaitGrants(release_at) if rule.dry_run => {
                would = true;
                d.counts.inc(Stat::WouldQueue);
                self.note(
                    config,
                    format!(
                        "queued; wait_ms={}",
                        release_at.saturating_sub(now) / NS_PER_MS
                    ),
                );
            }
            Rate::Hold(release_at) => {
                worker.queue.hold(self.id, index, now, release_at);
                self.held_by(worker, req);
                d.counts.add(Stat::Queued, 1);
                d.counts.add(Stat::Held, 1);
                d.verdict = Verdict::Hold;
                return d;
            }
            Rate::WaitGrants(deadline) => {
                worker.grants.wait(self.id, index, now, deadline);
                self.held_by(worker, req);
                d.counts.add(Stat::Queued, 1);
                d.counts.add(Stat::Held, 1);
                d.verdict = Verdict::Hold;
                return d;
            }
            Rate::Reject(retry_after_s) if rule.dry_run => {
                would = true;
                d.counts.inc(Stat::WouldReject);
                self.note(
                    config,
                    format!(
                        "rejected; status={}; retry_after={retry_after_s}",
                        rule.reject_status
                    ),
                );
            }
            Rate::Reject(retry_after_s) => {
                d.counts.inc(Stat::Rejected);
                d.verdict = Verdict::Reply(self.reject(config, rule, req, retry_after_s, now));
                return d;
            }
            Rate::Contention => {
                // Fail closed: the shared schedule could not be read or updated.
                d.counts.inc(Stat::Contention);
                if rule.dry_run {
                    would = true;
                    d.counts.inc(Stat::WouldReject);
                    self.note(config, "rejected; contention".into());
                } else {
                    d.counts.inc(Stat::Rejected);
                    d.verdict = Verdict::Reply(self.reject(config, rule, req, 1, now));
                    return d;
                }
            }
        }

        // A dry-run request the rate would have rejected never reaches the gate.
        let rate_would_reject = d.counts.get(Stat::WouldReject) > 0;
        let Some(limit) = rule.concurrency.filter(|_| !rate_would_reject) else {
            if !would {
                d.counts.inc(Stat::Admitted);
            }
            return d;
        };
        let w = worker;
        match gate::enter(&mut env.store.cell(CellId::Gate(index)), limit, can_hold) {
            Enter::Go => {
                w.in_flight.insert(self.id, index);
                d.counts.inc(Stat::InFlight);
                if !would {
                    d.counts.inc(Stat::Admitted);
                }
            }
            Enter::Wait { .. } if rule.dry_run => {
                // Dry-run goes at once, but keeps its slot so in-flight stays true.
                w.in_flight.insert(self.id, index);
                d.counts.inc(Stat::InFlight);
                if !would {
                    d.counts.inc(Stat::WouldQueue);
                }
                self.note(config, "queued; waiting for a concurrency slot".into());
            }
            Enter::Wait { ticket } => {
                w.gate.wait(
                    self.id,
                    index,
                    ticket,
                    now,
                    now.saturating_add(rule.max_delay_ns),
                );
                self.held_by(w, req);
                d.counts.add(Stat::Queued, 1);
                d.counts.add(Stat::Held, 1);
                d.verdict = Verdict::Hold;
            }
            Enter::Full => {
                d.counts.inc(Stat::Rejected);
                d.verdict = Verdict::Reply(self.reject(config, rule, req, 1, now));
            }
            Enter::Contention => {
                d.counts.inc(Stat::Contention);
                if rule.dry_run {
                    if !would {
                        d.counts.inc(Stat::WouldReject);
                    }
                    self.note(config, "rejected; contention".into());
                } else {
                    d.counts.inc(Stat::Rejected);
                    d.verdict = Verdict::Reply(self.reject(config, rule, req, 1, now));
                }
            }
        }
        d
    }

    /// Stage 1: the rule's rate schedule (per key if keyed).
    fn admit_rate<S: Store, R: Request>(
        &mut self,
        env: Env<'_, S>,
        index: usize,
        rule: &Rule,
        req: &mut Facts<R>,
        now: u64,
        can_hold: bool,
    ) -> Rate {
        let Some(schedule) = rule.schedule.as_ref() else {
            return Rate::Go;
        };
        let key = rule.key.as_ref().and_then(|k| k.extract(req));
        let store = env.store;
        let admission = match (key, &rule.quota) {
            // Fairness: the shared schedule decides, each key within its quota
            // (requests without a key value count as one key).
            (key, Some(quota)) => {
                let fp = env
                    .hasher
                    .fingerprint(&rule.name, key.as_deref().unwrap_or_default());
                admit_with_quota(
                    &mut store.cell(CellId::Rate(index)),
                    &mut store.table(index),
                    fp,
                    candidate_slots(fp, rule.key_slots),
                    schedule,
                    quota,
                    now,
                    can_hold,
                )
            }
            (Some(value), None) => {
                let fp = env.hasher.fingerprint(&rule.name, &value);
                admit_keyed(
                    &mut store.table(index),
                    fp,
                    candidate_slots(fp, rule.key_slots),
                    schedule,
                    now,
                    can_hold,
                )
            }
            (None, None) => admit(
                &mut store.cell(CellId::Rate(index)),
                schedule,
                now,
                can_hold,
            ),
        };
        self.rate_of(admission)
    }

    /// An admission as the rate stage's outcome (remembering the schedule
    /// for the rate-limit headers).
    fn rate_of(&mut self, admission: Admission) -> Rate {
        match admission {
            Admission::Now { tat } => {
                self.seen(tat, false);
                Rate::Go
            }
            Admission::Hold { release_at, tat } => {
                self.seen(tat, false);
                Rate::Hold(release_at)
            }
            Admission::Reject {
                retry_after_s, tat, ..
            } => {
                self.seen(tat, true);
                Rate::Reject(retry_after_s)
            }
            Admission::Contention => Rate::Contention,
        }
    }

    /// Stage 1 of a cluster rule: a slot of the grid this proxy owns, or the
    /// fallback while the engine fails. (No rate-limit headers: the grid has
    /// no per-process schedule to report.)
    fn take_cluster<S: Store>(
        &mut self,
        env: Env<'_, S>,
        index: usize,
        rule: &Rule,
        clock: &mut impl Clock,
        can_hold: bool,
        counts: &mut Counts,
    ) -> Rate {
        let Some(reach) = cluster::rule_reach(rule) else {
            return Rate::Go;
        };
        let store = env.store;
        let now = clock.mono();
        let taken = cluster::take(
            &mut store.cell(CellId::Cursor(index)),
            &mut store.blob(BlobId::Grants(index)),
            &mut store.cell(CellId::Waiting(index)),
            &reach,
            clock.wall(),
            can_hold,
            Attempt::First,
        );
        match taken {
            Take::Now { .. } => {
                counts.inc(Stat::SlotsTaken);
                Rate::Go
            }
            Take::Hold { delay_ns, .. } => {
                counts.inc(Stat::SlotsTaken);
                Rate::Hold(now.saturating_add(delay_ns))
            }
            Take::Wait if rule.dry_run => {
                // A dry run never waits: its place in the waiting count goes.
                let _ = cluster::add_waiting(&mut store.cell(CellId::Waiting(index)), -1);
                Rate::WaitGrants(now.saturating_add(rule.max_delay_ns))
            }
            Take::Wait => Rate::WaitGrants(now.saturating_add(rule.max_delay_ns)),
            Take::Reject { retry_after_s, .. } => Rate::Reject(retry_after_s),
            Take::Local { interval_ns } => {
                let local = cluster::local_schedule(&reach, interval_ns);
                let admission = admit(
                    &mut store.cell(CellId::Fallback(index)),
                    &local,
                    now,
                    can_hold,
                );
                let rate = self.rate_of(admission);
                // The fallback's schedule is not the rule's: no headers from it.
                self.rate = None;
                rate
            }
            Take::Deny => Rate::Reject(1),
            Take::Contention => Rate::Contention,
        }
    }

    fn seen(&mut self, tat: u64, rejected: bool) {
        self.rate = Some(RateSeen { tat, rejected });
    }

    fn held_by<R: Request>(&mut self, w: &mut Worker, req: &mut Facts<R>) {
        self.held = true;
        if req.is_grpc() {
            w.grpc.insert(self.id);
        }
    }

    fn note(&mut self, config: &Config, what: String) {
        if config.dry_run_headers {
            self.note = Some(what);
        }
    }

    /// The rate-limit headers of this request at `now` (none for dry-run
    /// rules unless clients see dry runs).
    fn rate_headers(&self, config: &Config, rule: &Rule, now: u64) -> Vec<(&'static str, String)> {
        let (Some(seen), Some(s), Some(w)) = (self.rate, &rule.schedule, rule.rate_window) else {
            return Vec::new();
        };
        if config.rate_limit_headers == HeaderStyle::Off
            || (rule.dry_run && !config.dry_run_headers)
        {
            return Vec::new();
        }
        let remaining = if seen.rejected && !rule.dry_run {
            0
        } else {
            ratelimit::remaining(s, w, seen.tat, now)
        };
        let reset = ratelimit::reset_s(seen.tat, now);
        ratelimit::headers(config.rate_limit_headers, &rule.name, w, remaining, reset)
    }

    fn reject<R: Request>(
        &mut self,
        config: &Config,
        rule: &Rule,
        req: &mut Facts<R>,
        retry_after_s: u64,
        now: u64,
    ) -> Reply {
        self.replied = true;
        rejection(
            rule.reject_status,
            retry_after_s,
            req.is_grpc(),
            self.rate_headers(config, rule, now),
        )
    }

    /// Whether the request's body or trailers must wait (it is held).
    pub fn is_held(&self, worker: &Worker) -> bool {
        self.held && worker.holds(self.id)
    }

    /// The response's headers arrived (from the upstream, or a local reply).
    /// `clock` is read only if the response carries rate-limit headers.
    pub fn on_response_headers<S: Store>(
        &mut self,
        env: Env<'_, S>,
        w: &mut Worker,
        clock: impl FnOnce() -> u64,
        end_of_stream: bool,
    ) -> ResponseDecision {
        let mut out = ResponseDecision::default();
        let Some(index) = self.rule else {
            return out;
        };
        let Some(rule) = env.config.rules.get(index) else {
            return out;
        };
        if self.held && w.unhold(env.store, self.id) {
            // Envoy answered it while we held it: a timeout shorter than
            // max_queue_delay (stream_idle_timeout, request_timeout, ...).
            out.counts = Counts::of(&[(Stat::TimedOut, 1), (Stat::Held, -1)]);
            out.tick = self.gated;
        }
        if self.held {
            if let Some(ms) = w.waited.remove(&self.id) {
                out.headers.push(("x-throttle-wait-ms", ms.to_string()));
            }
        }
        if let Some(note) = &self.note {
            out.headers.push(("x-throttle-dry-run", note.clone()));
        }
        if !self.replied && self.rate.is_some() && env.config.rate_limit_headers != HeaderStyle::Off
        {
            out.headers
                .extend(self.rate_headers(env.config, rule, clock()));
        }
        if end_of_stream {
            self.end_of_response(env, w, &mut out.counts, &mut out.wake);
        }
        out
    }

    /// The response ended (last body chunk or trailers): the slot goes back.
    pub fn on_response_end<S: Store>(&mut self, env: Env<'_, S>, w: &mut Worker) -> EndDecision {
        let mut out = EndDecision::default();
        self.end_of_response(env, w, &mut out.counts, &mut out.wake);
        out
    }

    fn end_of_response<S: Store>(
        &self,
        env: Env<'_, S>,
        w: &mut Worker,
        counts: &mut Counts,
        wake: &mut bool,
    ) {
        if !self.gated {
            return;
        }
        if let Some((_, woke)) = w.return_slot(env.config, env.store, self.id) {
            counts.add(Stat::InFlight, -1);
            *wake |= woke;
        }
    }

    /// The stream ended, for whatever reason. If it is still held, its client
    /// went away; a slot it holds goes back.
    pub fn on_done<S: Store>(&mut self, env: Env<'_, S>, w: &mut Worker) -> EndDecision {
        let mut out = EndDecision::default();
        if self.held {
            if w.unhold(env.store, self.id) {
                out.counts = Counts::of(&[(Stat::Cancelled, 1), (Stat::Held, -1)]);
                // Its abandoned ticket is counted at its turn, on tick.
                out.tick = self.gated;
            }
            w.waited.remove(&self.id);
        }
        self.end_of_response(env, w, &mut out.counts, &mut out.wake);
        out
    }
}
