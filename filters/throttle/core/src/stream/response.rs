//! The response's side of a request: the headers its response carries
//! (`x-throttle-wait-ms`, the dry-run note, the rate-limit headers), and the
//! end of the response or of the stream, which gives a concurrency slot back
//! and stops holding a request whose client (or Envoy) gave up.

use crate::ratelimit::HeaderStyle;
use crate::stats::{Counts, Stat};
use crate::store::Store;
use crate::worker::Worker;

use super::{Env, Stream};

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

impl Stream {
    /// Whether the response's side has nothing to do for this request: not
    /// held, no slot to give back, no answer an adaptive rule learns from, no
    /// dry-run note and no rate-limit headers to add. Then [`Stream::on_response_headers`], [`Stream::on_response_end`]
    /// and [`Stream::on_done`] answer nothing, whatever the worker holds, and
    /// the glue need not call them (most requests: a rule's fast path).
    pub fn response_is_quiet(&self, config: &crate::config::Config) -> bool {
        !self.held
            && !self.gated
            && !self.learns()
            && self.note.is_none()
            && (self.rate.is_none()
                || self.replied
                || config.rate_limit_headers == HeaderStyle::Off)
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
        if let Some(seen) = self.rate.filter(|_| !self.replied) {
            if env.config.rate_limit_headers != HeaderStyle::Off {
                out.headers.extend(seen.headers(env.config, rule, clock()));
            }
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
