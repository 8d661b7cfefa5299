//! One request's life, decided here and carried out by the glue: what to do
//! with its headers (continue, hold, or answer), what its response carries,
//! and what its end gives back. Each callback returns its answer as data
//! with the counters to move.
//!
//! The headers' decision is a pipeline of stages, each in its own file and
//! each answering one [`Outcome`]:
//!
//! 1. the rate: `rate.rs` (the process schedule, per key if keyed) or
//!    `cluster.rs` (a slot of the cluster's grid, or the fallback while the
//!    engine fails);
//! 2. the concurrency gate, `gate.rs` (a rule with `concurrency`; a request
//!    held by the rate takes its slot later, at release: see
//!    [`crate::worker`]).
//!
//! After each stage, `enforce.rs` carries the outcome out: on to the next
//! stage, hold, or reject. It alone knows dry-run (as Envoy's local rate
//! limit does `if (!enforced())` after its decision): dry-run rules make
//! every decision and count it (`would_queue`, `would_reject`; `admitted`
//! only for what would have been admitted), but hold and reject nothing.
//! `response.rs` adds the response's headers and gives slots back.
//!
//! Layers inside: a stage (`rate.rs`, `cluster.rs`, `gate.rs`) reads the
//! request's context and answers an [`Outcome`] (`outcome.rs`); it never
//! touches the [`Worker`], which reuses the stages for what it decides on
//! tick. `enforce.rs` and `response.rs` carry out on the worker.
//!
//! A new stage (a priority class, an adaptive rate) is one file here that
//! answers an [`Outcome`], one line in [`Stream::on_request`], and its
//! configuration.

mod class;
mod cluster;
mod enforce;
mod gate;
mod outcome;
mod rate;
mod response;
#[cfg(test)]
mod tests;

pub use outcome::{Outcome, Wait};
pub use response::{EndDecision, ResponseDecision};

use crate::adaptive::tally::SAMPLE_EVERY;
use crate::adaptive::{Observation, Origin, Outcome as Answer};
use crate::clock::{Clock, NS_PER_MS};
use crate::cluster::Grants;
use crate::config::{Config, Rule};
use crate::keys::KeyHasher;
use crate::matcher::{Facts, Request};
use crate::reply::Reply;
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Initial, Store};
use crate::worker::Worker;

use enforce::Next;

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
    /// What the rate stage left for the rate-limit headers.
    rate: Option<rate::Seen>,
    /// The filter answered it itself (the reply carried the headers).
    replied: bool,
    /// Its priority class, if its rule has classes.
    class: Option<usize>,
    /// Adaptive rules: what the learner needs of this request.
    learn: Option<Learn>,
}

/// An adaptive rule's request, as its learner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Learn {
    /// When it arrived (the decision's time).
    arrived: u64,
    /// It went upstream at once (else at its release, if any).
    sent_now: bool,
    /// Its answer (or its client's leaving) was recorded.
    done: bool,
    /// Its answer is one of the sampled ones ([`Stream::wants_origin`]).
    sampled: bool,
    /// Where it came from, as far as the request tells (read with it:
    /// Envoy keeps no request headers for the response's callbacks): its
    /// path's fingerprint, and its key's for keyed rules.
    path_fp: u64,
    client_fp: Option<u64>,
}

/// What the decisions need besides the request: the configuration, the
/// key hasher, and the process-wide cells.
#[derive(Clone, Copy)]
pub struct Env<'a, S> {
    pub config: &'a Config,
    pub hasher: &'a KeyHasher,
    pub store: S,
}

/// What every stage of one request's decision sees.
struct Ctx<'a, S> {
    env: Env<'a, S>,
    index: usize,
    rule: &'a Rule,
    /// The monotonic time of the decision.
    now: u64,
    /// The worker may hold one more request (under dry-run: always, but in a
    /// rule with a line, whose dry tickets take that room; see
    /// [`enforce::can_hold`]).
    can_hold: bool,
}

impl<S> Ctx<'_, S> {
    /// The fingerprint of a request's key in the rule's key table (for a
    /// `key_quota`, requests without a key value count as one key).
    fn key_fingerprint(&self, key: Option<&[u8]>) -> u64 {
        self.env
            .hasher
            .fingerprint(&self.rule.name, key.unwrap_or_default())
    }
}

/// The shared values a configuration needs before its first request, so
/// that every update carries a compare-and-swap token: Envoy writes a key
/// that does not exist whatever the token, so two workers that both found a
/// cell missing could both write it (both take the first credit, both take
/// the first lease). Per rule (`Some(index)`), then the process's leases
/// (`None`). A per-key rule's table too, every bucket of it: else two
/// workers that both found a new key's bucket missing both wrote it, and
/// the entry written first was lost with the places it had given (seen in
/// Envoy: a new key's burst of 10 at 20/s let 2 go at once).
pub fn initial_values(config: &Config) -> Vec<(Option<usize>, Initial)> {
    let mut out = Vec::new();
    for (index, rule) in config.rules.iter().enumerate() {
        let mut add = |v| out.push((Some(index), v));
        if rule.schedule.is_some() {
            add(Initial::Cell(CellId::Rate(index)));
        }
        if rule.concurrency.is_some() {
            add(Initial::Cell(CellId::Gate(index)));
        }
        if rule.key.is_some() {
            let (buckets, ways) = crate::keys::table_shape(rule.key_slots);
            add(Initial::Table {
                rule: index,
                buckets,
                ways,
            });
        }
        if !rule.line().is_empty() {
            add(Initial::Blob(
                BlobId::Classes(index),
                crate::classes::Tickets::default().encode(),
            ));
        }
        if rule.adaptive.is_some() {
            add(Initial::Blob(
                BlobId::Tally(index),
                crate::adaptive::learner::encode(&crate::adaptive::Tally::EMPTY),
            ));
            add(Initial::Cell(CellId::Learner(index)));
            add(Initial::Cell(CellId::Learned(index)));
        }
        if rule.cluster.is_some() {
            for id in [
                CellId::Cursor(index),
                CellId::Fallback(index),
                CellId::Ahead(index),
                CellId::Forgiven(index),
            ] {
                add(Initial::Cell(id));
            }
            // Until the engine answers, the proxy expects its part of the
            // rate over `expected_replicas` (a request's turn in the line).
            let expected = rule.schedule.map_or(0, |s| {
                let replicas = u128::from(rule.cluster.map_or(1, |c| c.expected_replicas.max(1)));
                let per_s = u128::from(crate::clock::NS_PER_S)
                    .div_ceil(u128::from(s.interval_ns.max(1)) * replicas);
                u64::try_from(per_s).unwrap_or(u64::MAX)
            });
            let lead_ns = config.engine.as_ref().map_or(0, |e| {
                let epoch = crate::cluster::grid::EPOCH_NS;
                crate::cluster::caller::ahead_epochs(epoch, e.timeout_ns, e.max_clock_skew_ns)
                    .saturating_mul(epoch)
            });
            add(Initial::Blob(
                BlobId::Grants(index),
                Grants {
                    grant_rate_per_s: expected,
                    lead_ns,
                    ..Grants::default()
                }
                .encode(),
            ));
        }
    }
    if config.engine.is_some() && config.rules.iter().any(|r| r.cluster.is_some()) {
        out.push((None, Initial::Cell(CellId::Caller)));
    }
    out
}

/// Creates what [`initial_values`] lists where it does not exist yet (a
/// value another VM created first is kept). Returns the rules (None: the
/// process's leases) whose values could not be created.
pub fn create_initial<S: Store>(store: S, config: &Config) -> Vec<Option<usize>> {
    let mut failed: Vec<Option<usize>> = Vec::new();
    for (rule, value) in initial_values(config) {
        let ok = match value {
            Initial::Cell(id) => match store.load(id) {
                Ok((Some(_), _)) => true,
                Ok((None, token)) => store.store(id, [0, 0], token).unwrap_or(false),
                Err(_) => false,
            },
            Initial::Blob(id, bytes) => create_blob(store, id, &bytes),
            Initial::Table {
                rule,
                buckets,
                ways,
            } => create_table(store, rule, buckets, ways),
        };
        if !ok && !failed.contains(&rule) {
            failed.push(rule);
        }
    }
    failed
}

fn create_blob<S: Store>(store: S, id: BlobId, bytes: &[u8]) -> bool {
    match store.load_blob(id) {
        Ok((Some(_), _)) => true,
        Ok((None, token)) => store.store_blob(id, bytes, token).unwrap_or(false),
        Err(_) => false,
    }
}

/// Creates every missing bucket of rule `rule`'s key table, empty, then
/// marks the table done, so that the next configure reads one cell: a
/// table of 4,096 slots is 512 buckets, one of 1,000,000 is 125,000.
fn create_table<S: Store>(store: S, rule: usize, buckets: u32, ways: u32) -> bool {
    let marker = CellId::Table(rule);
    let done = [u64::from(buckets), u64::from(ways)];
    let Ok((seen, token)) = store.load(marker) else {
        return false;
    };
    if seen == Some(done) {
        return true;
    }
    let empty = crate::keys::Bucket::decode(None, ways);
    let all = (0..buckets).all(|n| create_blob(store, BlobId::Bucket(rule, n), empty.encode()));
    // Lost the race to mark it: another VM created the same table.
    all && store.store(marker, done, token).is_ok()
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

    /// Its priority class, if its rule has classes.
    pub fn class(&self) -> Option<usize> {
        self.class
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

    /// The request's headers arrived: pick the rule, then run its stages.
    /// `clock` is read only if a rule applies (the wall clock only for
    /// cluster rules). An adaptive rule's request is counted in the worker's
    /// tally: arrived, and sent if it continues (a held one is counted sent
    /// at its release, [`Worker::resumed`]); and, if it goes upstream, its
    /// path (and key) are read for the learner: one more host call when the
    /// rule's match did not read the path already.
    pub fn on_request<S: Store, R: Request>(
        &mut self,
        env: Env<'_, S>,
        worker: &mut Worker,
        req: &mut Facts<R>,
        clock: &mut impl Clock,
    ) -> Decision {
        let d = self.run_stages(env, worker, req, clock);
        let Some(index) = d.rule else {
            return d;
        };
        if env
            .config
            .rules
            .get(index)
            .is_some_and(|r| r.adaptive.is_some())
        {
            let sent_now = d.verdict == Verdict::Continue;
            if let Some(t) = worker.tally(index) {
                t.arrived();
                if sent_now {
                    t.sent();
                }
            }
            if d.verdict == Verdict::Hold {
                worker.learning_held.insert(self.id, index);
            }
            if matches!(d.verdict, Verdict::Continue | Verdict::Hold) {
                let rule = env.config.rules.get(index);
                let path = req.path().unwrap_or_default().as_bytes().to_vec();
                let key = rule
                    .and_then(|r| r.key.as_ref())
                    .and_then(|k| k.extract(req));
                self.learn = Some(Learn {
                    arrived: clock.mono(),
                    sent_now,
                    done: false,
                    sampled: false,
                    path_fp: env.hasher.fingerprint("\u{1}path", &path),
                    client_fp: key.map(|k| env.hasher.fingerprint("\u{1}client", &k)),
                });
            }
        }
        d
    }

    fn run_stages<S: Store, R: Request>(
        &mut self,
        env: Env<'_, S>,
        worker: &mut Worker,
        req: &mut Facts<R>,
        clock: &mut impl Clock,
    ) -> Decision {
        let Some((index, rule)) = Self::pick(env.config, req) else {
            return Decision::pass();
        };
        self.rule = Some(index);
        // Set before any stage: a request held by the rate takes its gate
        // slot later, on tick, and must still give it back.
        self.gated = rule.concurrency.is_some();
        let mut d = Decision {
            verdict: Verdict::Continue,
            rule: Some(index),
            counts: Counts::of(&[(Stat::Requests, 1)]),
        };
        self.class = rule.class_of(req);
        // A cluster rule's grid is wall-clock time: on its fast path (a slot
        // now) no stage needs the monotonic clock, which is read after its
        // stage only if the request is held or answered (one clock read per
        // request; the glue's clock reads each clock at most once).
        let grid_first = rule.cluster.is_some() && self.class.is_none();
        let mut cx = Ctx {
            env,
            index,
            rule,
            now: if grid_first { 0 } else { clock.mono() },
            can_hold: enforce::can_hold(env.config, rule, worker),
        };
        let outcome = match self.class {
            Some(c) => {
                let (outcome, seen) = class::enter(&cx, c, req, clock, &mut d.counts);
                self.rate = seen;
                outcome
            }
            _ if rule.cluster.is_some() => cluster::take(&cx, clock, &mut d.counts),
            _ => {
                let (outcome, seen) = rate::admit_rate(&cx, req);
                self.rate = seen;
                outcome
            }
        };
        if grid_first && (outcome != Outcome::Go || rule.concurrency.is_some()) {
            cx.now = clock.mono();
        }
        if self.enforce(&cx, outcome, worker, req, &mut d) == Next::Done {
            return d;
        }
        if let Some(limit) = rule.concurrency {
            let outcome = gate::enter(&cx, limit);
            if outcome == Outcome::Go {
                enforce::take_slot(worker, self.id, index, &mut d.counts);
            }
            if self.enforce(&cx, outcome, worker, req, &mut d) == Next::Done {
                return d;
            }
        }
        enforce::went_through(&mut d.counts, self.class);
        d
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
        let Some((index, rule)) = Self::pick(env.config, req) else {
            return Decision::pass();
        };
        self.rule = Some(index);
        self.class = rule.class_of(req);
        let mut d = Decision {
            verdict: Verdict::Continue,
            rule: Some(index),
            counts: Counts::of(&[(Stat::Requests, 1)]),
        };
        let cx = Ctx {
            env,
            index,
            rule,
            now: 0,
            can_hold: false,
        };
        // Contention touches no worker state: a scratch one stands in.
        self.enforce(&cx, Outcome::Contention, &mut Worker::new(), req, &mut d);
        d
    }

    /// Whether the request's body or trailers must wait (it is held).
    pub fn is_held(&self, worker: &Worker) -> bool {
        self.held && worker.holds(self.id)
    }

    /// Whether its rule learns from its answer: the glue then reads the
    /// response's status and `Retry-After` ([`Stream::on_answer`]), or the
    /// time its client left ([`Stream::on_gone`]).
    pub fn learns(&self) -> bool {
        self.learn.is_some_and(|l| !l.done) && !self.replied
    }

    /// When it went upstream: at once, or at its release (None: still held,
    /// or answered by Envoy while held).
    fn sent_at(&self, w: &Worker, l: Learn) -> Option<u64> {
        if l.sent_now {
            return Some(l.arrived);
        }
        let waited_ms = *w.waited.get(&self.id)?;
        Some(
            l.arrived
                .saturating_add(waited_ms.saturating_mul(NS_PER_MS)),
        )
    }

    /// Whether the glue should read where this answer's request came from
    /// ([`Stream::origin`]) before [`Stream::on_answer`]: for every bad
    /// answer (429, 5xx: the learner counts them against their paths and
    /// clients unless they spread over all), and for one in
    /// [`SAMPLE_EVERY`] of the others (how the traffic spreads). Two host
    /// calls each, on those answers only.
    pub fn wants_origin(&mut self, w: &mut Worker, status: u16) -> bool {
        let Some(l) = self.learn.as_mut().filter(|l| !l.done) else {
            return false;
        };
        if self.replied {
            return false;
        }
        let bad = status == 429 || (500..600).contains(&status);
        if bad {
            return true;
        }
        w.answers_seen = w.answers_seen.wrapping_add(1);
        l.sampled = w.answers_seen % SAMPLE_EVERY == 0;
        l.sampled
    }

    /// Where this request came from, for the learner: its normalised path
    /// (read with the request), and its client: the rule's key value (read
    /// with the request), else the source address without port (read now,
    /// from the connection), as groups under the process's secret seed.
    pub fn origin<S, R: Request>(&self, env: Env<'_, S>, req: &mut Facts<R>) -> Origin {
        let Some(l) = self.learn else {
            return Origin::default();
        };
        let client = l.client_fp.unwrap_or_else(|| {
            let address = req
                .raw()
                .source_address()
                .map(|a| crate::keys::strip_port(&a).as_bytes().to_vec())
                .unwrap_or_default();
            env.hasher.fingerprint("\u{1}client", &address)
        });
        Origin::new(l.path_fp, client)
    }

    /// The answer to an adaptive rule's request came at `now` (call before
    /// [`Stream::on_response_headers`]): its status, the upstream's
    /// `Retry-After` in seconds and, if asked for, its origin go into the
    /// worker's tally.
    pub fn on_answer(
        &mut self,
        w: &mut Worker,
        now: u64,
        status: u16,
        retry_after_s: Option<u64>,
        origin: Option<Origin>,
    ) {
        self.observe(
            w,
            now,
            Answer::Answered {
                status,
                retry_after_s,
            },
            origin,
        );
    }

    /// The stream of an adaptive rule's request ends at `now` without an
    /// answer (call before [`Stream::on_done`]): if it was upstream, its
    /// client left first.
    pub fn on_gone(&mut self, w: &mut Worker, now: u64) {
        self.observe(w, now, Answer::Cancelled, None);
    }

    fn observe(&mut self, w: &mut Worker, now: u64, outcome: Answer, origin: Option<Origin>) {
        let (Some(index), Some(l)) = (self.rule, self.learn) else {
            return;
        };
        if l.done || self.replied {
            return;
        }
        let Some(sent_at) = self.sent_at(w, l) else {
            return;
        };
        self.learn = Some(Learn { done: true, ..l });
        if let Some(t) = w.tally(index) {
            t.record(&Observation {
                sent_at,
                done_at: now,
                outcome,
                deadline_ns: None,
                origin,
                sampled: l.sampled,
            });
        }
    }
}
