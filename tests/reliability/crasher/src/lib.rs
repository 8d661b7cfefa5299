//! Test-only filter: a request carrying `x-crash` makes the VM trap.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

proxy_wasm::main! {{
    proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(Crasher) });
}}

struct Crasher;

impl Context for Crasher {}

impl HttpContext for Crasher {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        if self.get_http_request_header("x-crash").is_some() {
            core::arch::wasm32::unreachable();
        }
        Action::Continue
    }
}
