#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]
//! The throttle filter: proxy-wasm glue around `throttle-core`. Modules
//! import one way: `context` (the SDK's traits, wasm32 only) → `root` →
//! `caller`, `http` → `plugin`, `request`, `worker` → `metrics`, `shared` →
//! `host` (the ABI, all `unsafe` in `host::abi`).
//! Everything but `context` and `host::abi` also builds natively, where the
//! glue is tested against a fake host.

mod caller;
#[cfg(target_arch = "wasm32")]
mod context;
mod host;
mod http;
mod metrics;
mod plugin;
mod request;
mod root;
mod shared;
#[cfg(test)]
mod tests;
mod worker;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    use proxy_wasm::traits::RootContext;
    use crate::host::{abi::Abi, Host, Level};
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        // Log at critical before the VM traps (release builds abort on panic).
        Abi.log(Level::Critical, &format!("throttle: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(context::RootCtx(root::Root::new(Abi, context_id)))
    });
}}
