//! The proxy-wasm SDK's context traits, forwarding each callback to the
//! generic glue ([`Root`], [`HttpStream`]) over the real host ([`Abi`]).

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

use crate::host::abi::Abi;
use crate::http::{Flow, HttpStream};
use crate::root::Root;

fn action(flow: Flow) -> Action {
    match flow {
        Flow::Continue => Action::Continue,
        Flow::Pause => Action::Pause,
    }
}

/// The root context of one VM.
pub struct RootCtx(pub Root<Abi>);

impl Context for RootCtx {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        self.0.on_http_call_response(token_id, body_size);
    }

    fn on_done(&mut self) -> bool {
        self.0.on_done();
        true
    }
}

impl RootContext for RootCtx {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        self.0.on_configure(&bytes)
    }

    fn on_tick(&mut self) {
        self.0.on_tick();
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        self.0.on_queue_ready(queue_id);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(HttpCtx(self.0.create_stream(context_id))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One HTTP context.
pub struct HttpCtx(HttpStream<Abi>);

impl Context for HttpCtx {
    fn on_done(&mut self) -> bool {
        self.0.on_done();
        true
    }
}

impl HttpContext for HttpCtx {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        action(self.0.on_request_headers())
    }

    fn on_http_request_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        action(self.0.on_request_body())
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        action(self.0.on_request_body())
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        action(self.0.on_response_headers(end_of_stream))
    }

    fn on_http_response_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            action(self.0.on_response_end())
        } else {
            Action::Continue
        }
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        action(self.0.on_response_end())
    }
}
