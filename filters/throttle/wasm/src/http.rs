//! One request's glue: each callback reads facts from the host, asks the
//! core ([`Stream`]) what to do, and carries out the answer.

use std::rc::Rc;

use throttle_core::adaptive::retry_after::retry_after_s;
use throttle_core::clock::Once;
use throttle_core::matcher::Facts;
use throttle_core::stats::Counts;
use throttle_core::stream::{Env, Stream, Verdict};
use throttle_core::NS_PER_S;

use crate::host::{Host, HostClock, Level};
use crate::plugin::Plugin;
use crate::request::HostRequest;
use crate::shared::{wake_all, SharedStore};
use crate::worker::WorkerGlue;

/// What a stream callback tells the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Pause,
}

/// The glue of one HTTP context.
pub struct HttpStream<H: Host> {
    host: H,
    /// None when the root context has no valid configuration: pass through.
    plugin: Option<Rc<Plugin>>,
    worker: Rc<WorkerGlue>,
    stream: Stream,
}

impl<H: Host> HttpStream<H> {
    pub fn new(host: H, id: u32, plugin: Option<Rc<Plugin>>, worker: Rc<WorkerGlue>) -> Self {
        HttpStream {
            host,
            plugin,
            worker,
            stream: Stream::new(id),
        }
    }

    fn env<'p>(&self, plugin: &'p Plugin) -> Env<'p, SharedStore<'p, H>> {
        Env {
            config: &plugin.config,
            hasher: &plugin.hasher,
            store: plugin.store(self.host),
        }
    }

    fn busy(&self) {
        // Cannot happen: no borrow outlives a callback, and callbacks of one
        // worker do not nest while it is borrowed.
        self.host.log(
            Level::Error,
            "throttle: worker state busy; deciding without it",
        );
    }

    fn count(&self, plugin: &Plugin, rule: usize, counts: &Counts) {
        if plugin.metrics.count(self.host, rule, counts) {
            self.worker.tick_to_flush(self.host);
        }
    }

    pub fn on_request_headers(&mut self) -> Flow {
        let Some(plugin) = self.plugin.clone() else {
            return Flow::Continue;
        };
        let env = self.env(&plugin);
        let host = self.host;
        let mut req = Facts::new(HostRequest::new(host));
        let decision = match self.worker.core.try_borrow_mut() {
            Ok(mut w) => {
                let mut clock = Once::new(HostClock(host));
                self.stream.on_request(env, &mut w, &mut req, &mut clock)
            }
            Err(_) => {
                // Nothing can be held or recorded: fail closed, counted.
                self.busy();
                self.stream.on_busy(env, &mut req)
            }
        };
        if let Some(rule) = decision.rule {
            self.count(&plugin, rule, &decision.counts);
        }
        match decision.verdict {
            Verdict::Continue => Flow::Continue,
            Verdict::Hold => {
                self.worker.tick_fast(host);
                Flow::Pause
            }
            Verdict::Reply(reply) => {
                host.send_reply(&reply);
                Flow::Pause
            }
        }
    }

    /// Body and trailers of a held request wait (Envoy buffers them).
    pub fn on_request_body(&self) -> Flow {
        let held = self
            .worker
            .core
            .try_borrow()
            .is_ok_and(|w| self.stream.is_held(&w));
        if held {
            Flow::Pause
        } else {
            Flow::Continue
        }
    }

    /// Whether the response's side has nothing to do (see
    /// [`Stream::response_is_quiet`]): then its callbacks touch nothing.
    fn quiet(&self) -> bool {
        self.plugin.as_deref().is_none_or(|p| {
            self.stream.rule().is_none() || self.stream.response_is_quiet(&p.config)
        })
    }

    pub fn on_response_headers(&mut self, end_of_stream: bool) -> Flow {
        if self.quiet() {
            return Flow::Continue;
        }
        let (Some(plugin), Some(rule)) = (self.plugin.clone(), self.stream.rule()) else {
            return Flow::Continue;
        };
        let env = self.env(&plugin);
        let host = self.host;
        let Ok(mut w) = self.worker.core.try_borrow_mut() else {
            self.busy();
            return Flow::Continue;
        };
        if self.stream.learns() {
            // An adaptive rule learns from the answer: its status, and the
            // upstream's Retry-After when it shed.
            let status = host
                .response_header(":status")
                .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u16>().ok());
            if let Some(status) = status {
                let retry_after = (status == 429 || status == 503)
                    .then(|| host.response_header("retry-after"))
                    .flatten()
                    .and_then(|v| retry_after_s(&v, host.wall_ns() / NS_PER_S));
                // Where it came from (every bad answer, one in eight others):
                // errors that stay with some paths or clients are theirs.
                let origin = self.stream.wants_origin(&mut w, status).then(|| {
                    self.stream
                        .origin(env, &mut Facts::new(HostRequest::new(host)))
                });
                self.stream
                    .on_answer(&mut w, host.monotonic_ns(), status, retry_after, origin);
            }
        }
        let out =
            self.stream
                .on_response_headers(env, &mut w, || host.monotonic_ns(), end_of_stream);
        drop(w);
        self.count(&plugin, rule, &out.counts);
        if out.tick {
            self.worker.tick_fast(host);
        }
        for (name, value) in &out.headers {
            host.set_response_header(name, value);
        }
        if out.wake {
            wake_all(host);
        }
        Flow::Continue
    }

    /// The response's last body chunk or its trailers: the slot goes back.
    pub fn on_response_end(&mut self) -> Flow {
        if self.quiet() {
            return Flow::Continue;
        }
        let (Some(plugin), Some(rule)) = (self.plugin.clone(), self.stream.rule()) else {
            return Flow::Continue;
        };
        let env = self.env(&plugin);
        let Ok(mut w) = self.worker.core.try_borrow_mut() else {
            self.busy();
            return Flow::Continue;
        };
        let out = self.stream.on_response_end(env, &mut w);
        drop(w);
        self.count(&plugin, rule, &out.counts);
        if out.wake {
            wake_all(self.host);
        }
        Flow::Continue
    }

    /// The stream ended, for any reason.
    pub fn on_done(&mut self) {
        if self.quiet() {
            return;
        }
        let (Some(plugin), Some(rule)) = (self.plugin.clone(), self.stream.rule()) else {
            return;
        };
        let env = self.env(&plugin);
        let host = self.host;
        let Ok(mut w) = self.worker.core.try_borrow_mut() else {
            self.busy();
            return;
        };
        if self.stream.learns() {
            // Upstream and never answered: its client left first.
            self.stream.on_gone(&mut w, host.monotonic_ns());
        }
        let out = self.stream.on_done(env, &mut w);
        drop(w);
        self.count(&plugin, rule, &out.counts);
        if out.tick {
            self.worker.tick_fast(host);
        }
        if out.wake {
            wake_all(host);
        }
    }
}
