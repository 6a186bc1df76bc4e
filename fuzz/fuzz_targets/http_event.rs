//! Whole `lambda_http` requests built from arbitrary events, through the
//! HTTP layer: never a panic, only the handler's answer or a 400, one scope
//! and one fingerprint however often an event is parsed. Seeded by
//! `make fuzz` with every event under tests/data/.
#![no_main]

#[path = "../../tests/support/http_event.rs"]
mod http_event;

use libfuzzer_sys::fuzz_target;
use std::sync::{Once, OnceLock};

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
static HOOK: Once = Once::new();

/// libFuzzer aborts on every panic, caught or not. `lambda_http` and the
/// crates it converts events with panic on some events (a `Host` that is no
/// URI authority, a body marked base64 that is not, a multi-value query
/// parameter without values) before any layer runs: their defects, not this
/// crate's, and `http_event::parse` catches them. Every other panic still
/// aborts.
fn tolerate_lambda_http_panics() {
    HOOK.call_once(|| {
        let fuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_lambda_http = info
                .location()
                .is_some_and(|location| {
                    let file = location.file();
                    ["/lambda_http-", "/aws_lambda_events-", "/query_map-"]
                        .iter()
                        .any(|dependency| file.contains(dependency))
                });
            if !in_lambda_http {
                fuzzer_hook(info);
            }
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    tolerate_lambda_http_panics();
    let Ok(json) = std::str::from_utf8(data) else { return };
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    });
    http_event::check(runtime, json);
});
