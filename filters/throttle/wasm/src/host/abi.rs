//! The proxy-wasm ABI: every `extern` and every `unsafe` of the filter. The
//! calls return the host's status as a value; none panics.

use throttle_core::reply::Reply;
use throttle_core::stats::Kind;

use super::{Host, Level};

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const CAS_MISMATCH: u32 = 8;
const STREAM_HTTP_REQUEST: u32 = 0;
const MAP_REQUEST_HEADERS: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;
const MAP_HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const BUFFER_HTTP_CALL_RESPONSE_BODY: u32 = 4;
const CLOCK_MONOTONIC: u32 = 1;

#[allow(clashing_extern_declarations)]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
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
    fn proxy_get_metric(metric_id: u32, return_value: *mut u64) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_register_shared_queue(
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(
        queue_id: u32,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn clock_time_get(clock_id: u32, precision: u64, time: *mut u64) -> u16;
    fn random_get(buf: *mut u8, len: usize) -> u16;
}

/// Takes ownership of a buffer the host allocated with this module's
/// allocator (`proxy_on_memory_allocate`) and handed back through an out
/// pointer. A null pointer is an empty value.
fn owned(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        return Vec::new();
    }
    // SAFETY: the host allocated `size` bytes at `data` with our allocator
    // and gave up ownership; nobody else holds the pointer.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

/// The host of the running Envoy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Abi;

impl Host for Abi {
    fn log(&self, level: Level, msg: &str) {
        // SAFETY: msg is valid for its length during the call.
        let _ = unsafe { proxy_log(level as u32, msg.as_ptr(), msg.len()) };
    }

    fn monotonic_ns(&self) -> u64 {
        let mut t: u64 = 0;
        // SAFETY: the host writes one u64 through a valid pointer.
        let errno = unsafe { clock_time_get(CLOCK_MONOTONIC, 1, &mut t) };
        if errno == 0 {
            t
        } else {
            0
        }
    }

    fn wall_ns(&self) -> u64 {
        let mut t: u64 = 0;
        // SAFETY: the host writes one u64 through a valid pointer.
        let status = unsafe { proxy_get_current_time_nanoseconds(&mut t) };
        if status == OK {
            t
        } else {
            0
        }
    }

    fn random(&self, buf: &mut [u8]) -> bool {
        // SAFETY: the host fills the buffer it is given, within its length.
        unsafe { random_get(buf.as_mut_ptr(), buf.len()) == 0 }
    }

    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), u32> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        let mut cas: u32 = 0;
        // SAFETY: out pointers are valid; the host allocates the value with
        // our allocator and hands it over (see `owned`).
        let status = unsafe {
            proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
        };
        match status {
            OK if data.is_null() => Ok((None, cas)),
            OK => Ok((Some(owned(data, size)), cas)),
            NOT_FOUND => Ok((None, 0)),
            other => Err(other),
        }
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<bool, u32> {
        // SAFETY: key and value are valid for their lengths during the call.
        let status = unsafe {
            proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
        };
        match status {
            OK => Ok(true),
            CAS_MISMATCH => Ok(false),
            other => Err(other),
        }
    }

    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
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
        (status == OK).then(|| owned(data, size))
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: valid name and out pointers; the host allocates with our allocator.
        let status = unsafe {
            proxy_get_header_map_value(
                MAP_RESPONSE_HEADERS,
                name.as_ptr(),
                name.len(),
                &mut data,
                &mut size,
            )
        };
        (status == OK).then(|| owned(data, size))
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let encoded = path.join("\0");
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: valid path and out pointers; the host allocates with our allocator.
        let status =
            unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), &mut data, &mut size) };
        (status == OK && !data.is_null()).then(|| owned(data, size))
    }

    fn set_response_header(&self, name: &str, value: &str) {
        // SAFETY: name and value are valid for their lengths during the call.
        let _ = unsafe {
            proxy_replace_header_map_value(
                MAP_RESPONSE_HEADERS,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        };
    }

    fn send_reply(&self, reply: &Reply) -> bool {
        let pairs: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        let headers = super::map::serialize_pairs(&pairs);
        let grpc = reply
            .grpc_status
            .and_then(|g| i32::try_from(g).ok())
            .unwrap_or(-1);
        // SAFETY: all pointers are valid for their lengths during the call.
        let status = unsafe {
            proxy_send_local_response(
                reply.status.into(),
                reply.details.as_ptr(),
                reply.details.len(),
                reply.body.as_ptr(),
                reply.body.len(),
                headers.as_ptr(),
                headers.len(),
                grpc,
            )
        };
        status == OK
    }

    fn set_effective_context(&self, id: u32) -> bool {
        // SAFETY: plain host call with an integer argument.
        unsafe { proxy_set_effective_context(id) == OK }
    }

    fn resume_request(&self, id: u32) -> Result<(), u32> {
        // SAFETY: plain host calls with integer arguments.
        let status = unsafe { proxy_set_effective_context(id) };
        if status != OK {
            return Err(status);
        }
        // SAFETY: as above.
        match unsafe { proxy_continue_stream(STREAM_HTTP_REQUEST) } {
            OK => Ok(()),
            status => Err(status),
        }
    }

    fn set_tick_period_ms(&self, ms: u32) -> bool {
        // SAFETY: plain host call with an integer argument.
        unsafe { proxy_set_tick_period_milliseconds(ms) == OK }
    }

    fn define_metric(&self, kind: Kind, name: &str) -> Option<u32> {
        let abi_kind = match kind {
            Kind::Counter => 0,
            Kind::Gauge => 1,
            Kind::Histogram => 2,
        };
        let mut id = 0u32;
        // SAFETY: name is valid for its length; id is a valid out pointer.
        let s = unsafe { proxy_define_metric(abi_kind, name.as_ptr(), name.len(), &mut id) };
        (s == OK).then_some(id)
    }

    fn increment_metric(&self, id: u32, delta: i64) {
        // SAFETY: plain host call with integer arguments.
        let _ = unsafe { proxy_increment_metric(id, delta) };
    }

    fn record_metric(&self, id: u32, value: u64) {
        // SAFETY: plain host call with integer arguments.
        let _ = unsafe { proxy_record_metric(id, value) };
    }

    fn metric(&self, id: u32) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: the host writes one u64 through a valid pointer.
        let status = unsafe { proxy_get_metric(id, &mut v) };
        (status == OK).then_some(v)
    }

    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, u32> {
        // Through the SDK: it registers the call's token with the context
        // that sent it, and its dispatcher delivers the answer there (an
        // answer to a token it does not know would make it panic). It answers
        // only Ok, BadArgument (no such cluster) or InternalFailure here,
        // which are all the statuses Envoy's http_call returns.
        proxy_wasm::hostcalls::dispatch_http_call(
            cluster,
            headers.to_vec(),
            Some(body),
            Vec::new(),
            std::time::Duration::from_millis(timeout_ms.into()),
        )
        .map_err(|status| status as u32)
    }

    fn http_call_status(&self) -> Option<u16> {
        let name = ":status";
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: valid name and out pointers; the host allocates with our allocator.
        let status = unsafe {
            proxy_get_header_map_value(
                MAP_HTTP_CALL_RESPONSE_HEADERS,
                name.as_ptr(),
                name.len(),
                &mut data,
                &mut size,
            )
        };
        if status != OK {
            return None;
        }
        std::str::from_utf8(&owned(data, size)).ok()?.parse().ok()
    }

    fn http_call_body(&self, size: usize) -> Option<Vec<u8>> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut got: usize = 0;
        // SAFETY: out pointers are valid; the host allocates with our allocator.
        let status = unsafe {
            proxy_get_buffer_bytes(BUFFER_HTTP_CALL_RESPONSE_BODY, 0, size, &mut data, &mut got)
        };
        (status == OK).then(|| owned(data, got))
    }

    fn register_queue(&self, name: &str) -> Option<u32> {
        let mut id = 0u32;
        // SAFETY: name is valid for its length; id is a valid out pointer.
        let s = unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) };
        (s == OK).then_some(id)
    }

    fn enqueue(&self, queue: u32, data: &[u8]) -> bool {
        // SAFETY: data is valid for its length during the call.
        unsafe { proxy_enqueue_shared_queue(queue, data.as_ptr(), data.len()) == OK }
    }

    fn dequeue(&self, queue: u32) -> Option<Vec<u8>> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: out pointers are valid; the host allocates with our allocator.
        let s = unsafe { proxy_dequeue_shared_queue(queue, &mut data, &mut size) };
        (s == OK).then(|| owned(data, size))
    }
}
