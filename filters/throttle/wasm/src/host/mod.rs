//! What the filter needs from its host, as one small trait: the real
//! proxy-wasm ABI ([`abi`], the only `unsafe` code) in Envoy, and a fake in
//! native tests ([`fake`]), so the glue's every path is tested without Envoy;
//! [`map`] is the ABI's header-map encoding (natively tested).
//!
//! Every call reports failure as a value; none panics (the SDK's own
//! wrappers `panic!` on statuses they do not expect, which would trap the VM).

#[cfg(target_arch = "wasm32")]
pub mod abi;
#[cfg(test)]
pub mod fake;
pub mod map;

use throttle_core::clock::Clock;
use throttle_core::reply::Reply;
use throttle_core::stats::Kind;

/// Log levels of the ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

/// The host's calls, as the filter uses them. A handle is `Copy`: the host
/// is process-wide state, reached through free functions in the ABI.
pub trait Host: Copy {
    /// Writes a log line.
    fn log(&self, level: Level, msg: &str);
    /// Monotonic nanoseconds shared by all workers (0 if unknown).
    fn monotonic_ns(&self) -> u64;
    /// Wall-clock nanoseconds since the Unix epoch (0 if unknown).
    fn wall_ns(&self) -> u64;
    /// Fills `buf` with random bytes; false if the host cannot.
    fn random(&self, buf: &mut [u8]) -> bool;

    /// A shared-data value and its compare-and-swap token. Err: status.
    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), u32>;
    /// Compare-and-swap write. Ok(false): the token was stale. Err: status.
    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<bool, u32>;

    /// A request header of the effective stream (its first value).
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    /// A response header of the current stream (`:status`, `retry-after`...).
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    /// A property of the effective stream (`["source", "address"]`).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// Sets a response header of the effective stream, replacing any value.
    fn set_response_header(&self, name: &str, value: &str);
    /// Answers the effective stream with a local reply.
    fn send_reply(&self, reply: &Reply) -> bool;

    /// Makes `id` the effective context; false if it is gone.
    fn set_effective_context(&self, id: u32) -> bool;
    /// Makes `id` the effective context and continues its request.
    /// Err(status): the stream is gone or could not be continued.
    fn resume_request(&self, id: u32) -> Result<(), u32>;
    /// Sets the effective root context's tick period (0 stops it).
    fn set_tick_period_ms(&self, ms: u32) -> bool;

    /// Defines (or looks up) a metric.
    fn define_metric(&self, kind: Kind, name: &str) -> Option<u32>;
    /// Adds to a counter or gauge.
    fn increment_metric(&self, id: u32, delta: i64);
    /// Records a histogram value (or sets a gauge).
    fn record_metric(&self, id: u32, value: u64);
    /// A counter's or gauge's process-wide value.
    fn metric(&self, id: u32) -> Option<u64>;

    /// Sends an HTTP request to an Envoy cluster; Ok(token) identifies its
    /// answer (`on_http_call_response`). Err: the host refused it.
    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, u32>;
    /// The `:status` of the HTTP call whose answer is being delivered.
    fn http_call_status(&self) -> Option<u16>;
    /// The body of the HTTP call whose answer is being delivered.
    fn http_call_body(&self, size: usize) -> Option<Vec<u8>>;

    /// Registers a shared queue owned by the effective root context (its
    /// `on_queue_ready` runs on this worker's event loop).
    fn register_queue(&self, name: &str) -> Option<u32>;
    /// Appends a message to a queue.
    fn enqueue(&self, queue: u32, data: &[u8]) -> bool;
    /// Takes the oldest message of a queue.
    fn dequeue(&self, queue: u32) -> Option<Vec<u8>>;
}

/// The host's clocks, as the core reads them.
pub struct HostClock<H>(pub H);

impl<H: Host> Clock for HostClock<H> {
    fn mono(&mut self) -> u64 {
        self.0.monotonic_ns()
    }
    fn wall(&mut self) -> u64 {
        skewed(self.0.wall_ns())
    }
}

/// Test builds only (cargo feature `test-clock`): the wall clock moved by
/// `THROTTLE_TEST_WALL_OFFSET_MS` milliseconds, read from the VM's
/// environment (Envoy's `vm_config.environment_variables`), so that a test
/// can run one proxy with a skewed clock (libfaketime hangs Envoy at start).
#[cfg(feature = "test-clock")]
fn skewed(ns: u64) -> u64 {
    static OFFSET_NS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let offset = *OFFSET_NS.get_or_init(|| {
        std::env::var("THROTTLE_TEST_WALL_OFFSET_MS")
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .map_or(0, |ms| ms.saturating_mul(1_000_000))
    });
    ns.saturating_add_signed(offset)
}

/// The host's wall clock as it is (only test builds can move it).
#[cfg(not(feature = "test-clock"))]
fn skewed(ns: u64) -> u64 {
    ns
}
