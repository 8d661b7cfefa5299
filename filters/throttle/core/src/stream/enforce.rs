//! The one step that carries out a stage's [`Outcome`]: on to the next
//! stage, hold, or reject. It alone knows dry-run and alone builds the
//! request's rejections (Envoy's local rate limit: `requestAllowed`, count,
//! then `if (!enforced())`).
//!
//! Enforced, an outcome is carried out on the worker: held until its turn,
//! waiting for grants or a gate's turn, or answered with the rule's
//! rejection. Under dry-run nothing is held or rejected: the first outcome
//! that would have held or rejected the request is counted
//! (`would_queue`, `would_reject`), noted for `x-throttle-dry-run`, and the
//! request goes on (a would-be rejection skips the later stages).

use crate::classes::ClassWaiter;
use crate::clock::NS_PER_MS;
use crate::cluster;
use crate::config::{Config, Rule};
use crate::matcher::{Facts, Request};
use crate::reply::{rejection, Reply};
use crate::stats::{ClassStat, Counts, Stat};
use crate::store::{CellId, Store};
use crate::worker::Worker;

use super::{Ctx, Decision, Outcome, Stream, Verdict, Wait};

/// Whether the pipeline goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// On to the next stage (or, after the last, the request continues).
    Stage,
    /// Decided: held or answered (or, under dry-run, would be rejected).
    Done,
}

/// Whether a stage may answer "hold" or "wait": the worker has room. Under
/// dry-run nothing is held, so there is room, except in a rule with a line
/// (classes, or a cluster rule's own line): the tickets its requests leave
/// in the line wait on the worker, bounded as held requests are (beyond, a
/// request would be rejected, as enforced).
pub(super) fn can_hold(config: &Config, rule: &Rule, worker: &Worker) -> bool {
    let max_held = usize::try_from(config.max_held_per_worker).unwrap_or(usize::MAX);
    let lined = !rule.classes.is_empty() || rule.cluster.is_some();
    match (rule.dry_run, lined) {
        (true, false) => true,
        (true, true) => worker.held().saturating_add(worker.classes.dry_len()) < max_held,
        (false, _) => worker.held() < max_held,
    }
}

/// Every stage let the request go: it was admitted (unless, under dry-run,
/// it would have been held).
pub(super) fn went_through(counts: &mut Counts, class: Option<usize>) {
    if !would(counts) {
        counts.inc(Stat::Admitted);
        if let Some(c) = class {
            counts.add_class(c, ClassStat::Admitted, 1);
        }
    }
}

/// Under dry-run: an earlier stage would have held or rejected the request.
fn would(counts: &Counts) -> bool {
    counts.get(Stat::WouldQueue) > 0 || counts.get(Stat::WouldReject) > 0
}

/// The request holds a slot of rule `index`'s gate now: the worker gives it
/// back when the response or the stream ends.
pub(super) fn take_slot(worker: &mut Worker, id: u32, index: usize, counts: &mut Counts) {
    worker.in_flight.insert(id, index);
    counts.inc(Stat::InFlight);
}

impl Stream {
    /// Carries out `outcome` of one stage of rule `cx.rule`.
    pub(super) fn enforce<S: Store, R: Request>(
        &mut self,
        cx: &Ctx<'_, S>,
        outcome: Outcome,
        w: &mut Worker,
        req: &mut Facts<R>,
        d: &mut Decision,
    ) -> Next {
        if cx.rule.dry_run {
            return self.dry_run(cx, outcome, w, d);
        }
        let (id, index, now) = (self.id, cx.index, cx.now);
        match outcome {
            Outcome::Go => return Next::Stage,
            Outcome::Hold { until } => w.queue.hold(id, index, now, until),
            Outcome::Wait(Wait::Fallback { until, .. }) => {
                w.queue.hold_fallback(id, index, now, until)
            }
            Outcome::Wait(Wait::Gate { ticket, deadline }) => {
                w.gate.wait(id, index, ticket, now, deadline)
            }
            Outcome::Wait(Wait::Class {
                class,
                ticket,
                deadline,
                ..
            }) => w.classes.wait(ClassWaiter {
                context_id: id,
                rule: index,
                class,
                ticket,
                since: now,
                deadline,
                dry: false,
            }),
            Outcome::Reject { retry_after_s } => return self.reject_now(cx, retry_after_s, req, d),
            Outcome::Contention => {
                d.counts.inc(Stat::Contention);
                return self.reject_now(cx, 1, req, d);
            }
        }
        if let Some(c) = self.class {
            d.counts.add_class(c, ClassStat::Queued, 1);
        }
        self.held = true;
        if req.is_grpc() {
            w.grpc.insert(id);
        }
        d.counts.add(Stat::Queued, 1);
        d.counts.add(Stat::Held, 1);
        d.verdict = Verdict::Hold;
        Next::Done
    }

    /// Under dry-run: counts and notes what would have happened; holds and
    /// rejects nothing (a class ticket waits without its request).
    fn dry_run<S: Store>(
        &mut self,
        cx: &Ctx<'_, S>,
        outcome: Outcome,
        w: &mut Worker,
        d: &mut Decision,
    ) -> Next {
        let first = !would(&d.counts);
        let (stat, note, next) = match outcome {
            Outcome::Go => return Next::Stage,
            Outcome::Hold { until } | Outcome::Wait(Wait::Fallback { until, .. }) => {
                (Stat::WouldQueue, wait_note(until, cx.now), Next::Stage)
            }
            Outcome::Wait(Wait::Class {
                class,
                ticket,
                deadline,
                until,
            }) => {
                // Its ticket waits in the line as the request would have
                // (so later arrivals queue behind it, and the tick counts
                // its grant or its displacement); the request goes on.
                w.classes.wait(ClassWaiter {
                    context_id: self.id,
                    rule: cx.index,
                    class,
                    ticket,
                    since: cx.now,
                    deadline,
                    dry: true,
                });
                // A cluster rule's tickets that wait without their request
                // are counted in its cursor, so that the engine caller claims
                // for them as it does for held requests (the `held` gauge,
                // which a dry-run rule does not define); its tick keeps the
                // count (`worker/lines.rs`). A line without classes counted
                // its ticket when it took it (`stream/cluster.rs`).
                if cx.rule.cluster.is_some() && !cx.rule.classes.is_empty() {
                    let _ =
                        cluster::add_waiting(&mut cx.env.store.cell(CellId::Cursor(cx.index)), 1);
                }
                (Stat::WouldQueue, wait_note(until, cx.now), Next::Stage)
            }
            Outcome::Wait(Wait::Gate { .. }) => {
                // It goes at once, but keeps its ticket as a slot so that
                // in_flight stays true.
                take_slot(w, self.id, cx.index, &mut d.counts);
                (
                    Stat::WouldQueue,
                    "queued; waiting for a concurrency slot".into(),
                    Next::Stage,
                )
            }
            Outcome::Reject { retry_after_s } => (
                Stat::WouldReject,
                format!(
                    "rejected; status={}; retry_after={retry_after_s}",
                    cx.rule.reject_status
                ),
                Next::Done,
            ),
            Outcome::Contention => {
                d.counts.inc(Stat::Contention);
                (Stat::WouldReject, "rejected; contention".into(), Next::Done)
            }
        };
        if first {
            d.counts.inc(stat);
            if let Some(c) = self.class {
                let s = if stat == Stat::WouldQueue {
                    ClassStat::Queued
                } else {
                    ClassStat::Rejected
                };
                d.counts.add_class(c, s, 1);
            }
        }
        if cx.env.config.dry_run_headers {
            self.note = Some(note);
        }
        next
    }

    fn reject_now<S: Store, R: Request>(
        &mut self,
        cx: &Ctx<'_, S>,
        retry_after_s: u64,
        req: &mut Facts<R>,
        d: &mut Decision,
    ) -> Next {
        d.counts.inc(Stat::Rejected);
        if let Some(c) = self.class {
            d.counts.add_class(c, ClassStat::Rejected, 1);
        }
        d.verdict = Verdict::Reply(self.rejection(cx, retry_after_s, req));
        Next::Done
    }

    /// The rule's rejection of this request: its status (gRPC:
    /// RESOURCE_EXHAUSTED), `retry-after`, and the rate-limit headers.
    fn rejection<S: Store, R: Request>(
        &mut self,
        cx: &Ctx<'_, S>,
        retry_after_s: u64,
        req: &mut Facts<R>,
    ) -> Reply {
        self.replied = true;
        let headers = self
            .rate
            .map(|seen| seen.headers(cx.env.config, cx.rule, cx.now))
            .unwrap_or_default();
        rejection(cx.rule.reject_status, retry_after_s, req.is_grpc(), headers)
    }
}

fn wait_note(until: u64, now: u64) -> String {
    format!("queued; wait_ms={}", until.saturating_sub(now) / NS_PER_MS)
}
