//! The throttle filter: proxy-wasm glue around `throttle-core`.
//!
//! * [`root::ThrottleRoot`] (one per worker VM and one on the main thread):
//!   parses and validates the configuration, owns the worker's queue of held
//!   requests, and releases due requests from `on_tick`.
//! * [`http::ThrottleHttp`] (one per request): picks the rule, admits the
//!   request against the process-wide schedule in shared data, and continues,
//!   holds or rejects it.

mod host;
mod http;
mod metrics;
mod plugin;
mod request;
mod root;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        // Log at critical before the VM traps (release builds abort on panic).
        let _ = proxy_wasm::hostcalls::log(LogLevel::Critical, &format!("throttle: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(root::ThrottleRoot::new(context_id))
    });
}}
