//! Thin, non-panicking wrappers over the few host calls on the hot and tick
//! paths. The SDK's own wrappers `panic!` on statuses they do not expect (for
//! example when a stream is gone), which would crash the VM; these return the
//! raw status instead.

use throttle_core::schedule::{StoreError, TatStore};

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const CAS_MISMATCH: u32 = 8;
const STREAM_HTTP_REQUEST: u32 = 0;

#[allow(clashing_extern_declarations)]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn clock_time_get(clock_id: u32, precision: u64, time: *mut u64) -> u16;
}

const CLOCK_MONOTONIC: u32 = 1;

/// The host's monotonic clock in nanoseconds, shared by all workers of the
/// Envoy process (Envoy backs WASI's monotonic clock with its steady clock).
/// Returns 0 if the host cannot tell, which can only delay releases.
pub fn monotonic_ns() -> u64 {
    let mut t: u64 = 0;
    // SAFETY: the host writes one u64 through a valid pointer.
    let errno = unsafe { clock_time_get(CLOCK_MONOTONIC, 1, &mut t) };
    if errno == 0 {
        t
    } else {
        0
    }
}

/// Makes `context_id` the effective context and continues its request.
/// Err(status): the stream is gone (`BadArgument`) or could not be continued.
pub fn resume_request(context_id: u32) -> Result<(), u32> {
    // SAFETY: plain host calls with integer arguments.
    let status = unsafe { proxy_set_effective_context(context_id) };
    if status != OK {
        return Err(status);
    }
    // SAFETY: as above.
    match unsafe { proxy_continue_stream(STREAM_HTTP_REQUEST) } {
        OK => Ok(()),
        status => Err(status),
    }
}

/// Restores the effective context (after resuming other streams).
pub fn set_effective_context(context_id: u32) {
    // SAFETY: plain host call with an integer argument.
    let _ = unsafe { proxy_set_effective_context(context_id) };
}

/// Sets the tick period of the effective context's root context (0 stops it).
pub fn set_tick_period_ms(ms: u32) -> bool {
    // SAFETY: plain host call with an integer argument.
    unsafe { proxy_set_tick_period_milliseconds(ms) == OK }
}

/// Sends a local reply on the effective HTTP context.
pub fn send_local_response(
    status: u32,
    details: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> bool {
    let headers = throttle_core::wire::serialize_pairs(headers);
    // SAFETY: all pointers are valid for their lengths for the call's duration.
    let s = unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    };
    s == OK
}

/// Metric types of the ABI.
#[derive(Clone, Copy)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// Defines (or looks up) a metric. None if the host refused it.
pub fn define_metric(kind: MetricType, name: &str) -> Option<u32> {
    let mut id = 0u32;
    // SAFETY: name is valid for its length; id is a valid out pointer.
    let s = unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) };
    (s == OK).then_some(id)
}

/// Adds `delta` to a counter or gauge. Errors are ignored: a metric never
/// changes the fate of a request.
pub fn increment_metric(id: Option<u32>, delta: i64) {
    if let Some(id) = id {
        // SAFETY: plain host call with integer arguments.
        let _ = unsafe { proxy_increment_metric(id, delta) };
    }
}

/// Records a histogram value (or sets a gauge).
pub fn record_metric(id: Option<u32>, value: u64) {
    if let Some(id) = id {
        // SAFETY: plain host call with integer arguments.
        let _ = unsafe { proxy_record_metric(id, value) };
    }
}

/// A schedule's TAT in proxy-wasm shared data: 8 bytes, little-endian
/// nanoseconds, updated with the host's compare-and-swap token.
pub struct SharedTat<'a> {
    pub key: &'a str,
}

impl TatStore for SharedTat<'_> {
    type Token = u32;

    fn load(&mut self) -> Result<(Option<u64>, u32), StoreError> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        let mut cas: u32 = 0;
        // SAFETY: out pointers are valid; the host allocates the value with the
        // module's allocator (proxy_on_memory_allocate), so we own and free it.
        let status = unsafe {
            proxy_get_shared_data(
                self.key.as_ptr(),
                self.key.len(),
                &mut data,
                &mut size,
                &mut cas,
            )
        };
        match status {
            OK => {
                let tat = if data.is_null() {
                    None
                } else {
                    // SAFETY: the host handed us `size` bytes allocated by our allocator.
                    let bytes = unsafe { Vec::from_raw_parts(data, size, size) };
                    <[u8; 8]>::try_from(bytes.as_slice())
                        .ok()
                        .map(u64::from_le_bytes)
                };
                Ok((tat, cas))
            }
            NOT_FOUND => Ok((None, 0)),
            other => Err(StoreError(other)),
        }
    }

    fn store(&mut self, tat: u64, cas: u32) -> Result<bool, StoreError> {
        let value = tat.to_le_bytes();
        // SAFETY: key and value are valid for their lengths.
        let status = unsafe {
            proxy_set_shared_data(
                self.key.as_ptr(),
                self.key.len(),
                value.as_ptr(),
                value.len(),
                cas,
            )
        };
        match status {
            OK => Ok(true),
            CAS_MISMATCH => Ok(false),
            other => Err(StoreError(other)),
        }
    }
}

/// Creates the shared TAT of `key` if it does not exist yet, so that every
/// later update carries a compare-and-swap token (a token of 0 would skip the
/// check).
pub fn ensure_shared_tat(key: &str) -> bool {
    let mut store = SharedTat { key };
    match store.load() {
        Ok((Some(_), _)) => true,
        Ok((None, cas)) => store.store(0, cas).unwrap_or(false),
        Err(_) => false,
    }
}
