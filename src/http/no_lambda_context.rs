//! Without the `lambda` feature no request carries a Lambda event: the
//! same questions as `lambda_context.rs`, answered with nothing.

use http::Request;

pub(crate) fn has_context<B>(_: &Request<B>) -> bool {
    false
}

pub(crate) fn deadline_ms<B>(_: &Request<B>) -> Option<u64> {
    None
}

pub(crate) fn raw_path<B>(_: &Request<B>) -> &str {
    ""
}

pub(crate) fn event_query_pairs<B>(_: &Request<B>) -> Option<Vec<(String, String)>> {
    None
}

pub(crate) fn principal<B>(_: &Request<B>) -> Option<String> {
    None
}

pub(crate) fn entry_point<B>(_: &Request<B>) -> Option<String> {
    None
}

pub(crate) fn lambda_route<B>(_: &Request<B>) -> Option<String> {
    None
}

#[cfg_attr(not(feature = "powertools"), allow(dead_code))]
pub(crate) fn infers_plain_responses<B>(_: &Request<B>) -> bool {
    true
}

#[cfg_attr(not(feature = "powertools"), allow(dead_code))]
pub(crate) fn event_query_parameters<B>(_: &Request<B>) -> serde_json::Value {
    serde_json::Value::Null
}

/// No Lambda context, no invocation trace header.
pub(crate) fn xray_trace_id<B>(_: &Request<B>) -> Option<&str> {
    None
}
