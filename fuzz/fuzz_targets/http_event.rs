//! Whole `lambda_http` requests built from arbitrary events, through the
//! HTTP layer: never a panic, only the handler's answer or a 400, one scope
//! and one fingerprint however often an event is parsed. Seeded by
//! `make fuzz` with every event under tests/data/.
#![no_main]

#[path = "../../tests/support/http_event.rs"]
mod http_event;

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else { return };
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    });
    http_event::check(runtime, json);
});
