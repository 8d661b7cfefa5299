//! Thin, non-panicking wrappers over the few host calls on the hot and tick
//! paths. The SDK's own wrappers `panic!` on statuses they do not expect (for
//! example when a stream is gone), which would crash the VM; these return the
//! raw status instead.

use throttle_core::schedule::{KeyTable, SharedCell, StoreError};

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
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn clock_time_get(clock_id: u32, precision: u64, time: *mut u64) -> u16;
    fn random_get(buf: *mut u8, len: usize) -> u16;
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

/// Makes `context_id` the effective context; false if it is gone.
pub fn set_effective_context_checked(context_id: u32) -> bool {
    // SAFETY: plain host call with an integer argument.
    unsafe { proxy_set_effective_context(context_id) == OK }
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

/// A 16-byte cell in proxy-wasm shared data (two little-endian u64), updated
/// with the host's compare-and-swap token. Shared data is scoped by `vm_id`.
pub struct SharedData<'a> {
    pub key: &'a str,
}

fn shared_get(key: &str) -> Result<(Option<Vec<u8>>, u32), u32> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    let mut cas: u32 = 0;
    // SAFETY: out pointers are valid; the host allocates the value with the
    // module's allocator (proxy_on_memory_allocate), so we own and free it.
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match status {
        OK if data.is_null() => Ok((None, cas)),
        // SAFETY: the host handed us `size` bytes allocated by our allocator.
        OK => Ok((Some(unsafe { Vec::from_raw_parts(data, size, size) }), cas)),
        NOT_FOUND => Ok((None, 0)),
        other => Err(other),
    }
}

fn shared_set(key: &str, value: &[u8], cas: u32) -> Result<bool, u32> {
    // SAFETY: key and value are valid for their lengths.
    let status =
        unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) };
    match status {
        OK => Ok(true),
        CAS_MISMATCH => Ok(false),
        other => Err(other),
    }
}

fn decode16(bytes: &[u8]) -> Option<[u64; 2]> {
    let a = u64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?);
    let b = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
    Some([a, b])
}

fn encode16([a, b]: [u64; 2]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

impl SharedCell for SharedData<'_> {
    type Token = u32;

    fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        let (value, cas) = shared_get(self.key).map_err(StoreError)?;
        Ok((value.as_deref().and_then(decode16), cas))
    }

    fn store(&mut self, value: [u64; 2], cas: u32) -> Result<bool, StoreError> {
        shared_set(self.key, &encode16(value), cas).map_err(StoreError)
    }
}

/// A cell whose key is built per use (slots of a key table).
pub struct OwnedSharedData {
    pub key: String,
}

impl SharedCell for OwnedSharedData {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        SharedData { key: &self.key }.load()
    }
    fn store(&mut self, value: [u64; 2], cas: u32) -> Result<bool, StoreError> {
        SharedData { key: &self.key }.store(value, cas)
    }
}

/// The key table of a per-key rule: slot `i` is the cell `<prefix><i>`.
pub struct SharedTable<'a> {
    pub prefix: &'a str,
}

impl KeyTable for SharedTable<'_> {
    type Cell = OwnedSharedData;
    fn cell(&mut self, slot: u32) -> OwnedSharedData {
        OwnedSharedData {
            key: format!("{}{slot}", self.prefix),
        }
    }
}

/// Creates a cell if it does not exist yet, so that every later update
/// carries a compare-and-swap token (a token of 0 would skip the check).
pub fn ensure_cell(key: &str, initial: [u64; 2]) -> bool {
    let mut cell = SharedData { key };
    match cell.load() {
        Ok((Some(_), _)) => true,
        Ok((None, cas)) => cell.store(initial, cas).unwrap_or(false),
        Err(_) => false,
    }
}

/// The secret seed of key hashing, shared by all VMs of the process: read from
/// shared data, or created there from WASI randomness by the first VM (the
/// main thread's, which is configured before any worker's).
pub fn shared_seed(key: &str) -> Option<(u64, u64)> {
    let mut cell = SharedData { key };
    if let Ok((Some([a, b]), _)) = cell.load() {
        return Some((a, b));
    }
    let mut bytes = [0u8; 16];
    // SAFETY: the host fills the buffer it is given.
    if unsafe { random_get(bytes.as_mut_ptr(), bytes.len()) } != 0 {
        return None;
    }
    let fresh = decode16(&bytes)?;
    let (_, cas) = cell.load().ok()?;
    let _ = cell.store(fresh, cas);
    match cell.load() {
        Ok((Some([a, b]), _)) => Some((a, b)),
        _ => None,
    }
}

const MAP_REQUEST_HEADERS: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;

/// A request header's raw bytes (no UTF-8 assumption: clients send any bytes).
pub fn request_header(name: &str) -> Option<Vec<u8>> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: valid name and out pointers; the host allocates with our allocator.
    let status = unsafe {
        proxy_get_header_map_value(
            MAP_REQUEST_HEADERS,
            name.as_ptr(),
            name.len(),
            &mut data,
            &mut size,
        )
    };
    match status {
        OK if data.is_null() => Some(Vec::new()),
        // SAFETY: the host handed us `size` bytes allocated by our allocator.
        OK => Some(unsafe { Vec::from_raw_parts(data, size, size) }),
        _ => None,
    }
}

/// Adds a response header on the effective context.
pub fn add_response_header(name: &str, value: &str) {
    // SAFETY: name and value are valid for their lengths.
    let _ = unsafe {
        proxy_add_header_map_value(
            MAP_RESPONSE_HEADERS,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    };
}

/// The downstream remote address (`ip:port`) of the effective stream.
pub fn source_address() -> Option<String> {
    let value = proxy_wasm::hostcalls::get_property(vec!["source", "address"])
        .ok()
        .flatten()?;
    Some(String::from_utf8_lossy(&value).into_owned())
}
