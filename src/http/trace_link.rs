//! OpenTelemetry's side of the trace context kept with a record (the
//! `opentelemetry` feature): the context of the span the work runs under,
//! and a replay's span linked to the work it replays.

use super::trace_context::TraceContext;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The current span's OpenTelemetry context, if it has one (a subscriber
/// with tracing-opentelemetry's layer, and a span it records).
pub(super) fn of_current_span() -> Option<TraceContext> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let current = span.span_context();
    if !current.is_valid() {
        return None;
    }
    TraceContext::new(
        current.trace_id().to_bytes(),
        current.span_id().to_bytes(),
        current.is_sampled(),
    )
}

/// Links the current span to `work`: the span of the request whose record
/// this replay answers with. A remote context, as a propagated one is.
pub(super) fn link_current_span(work: &TraceContext) {
    let flags = if work.sampled() {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    tracing::Span::current().add_link(SpanContext::new(
        TraceId::from_bytes(work.trace_id()),
        SpanId::from_bytes(work.span_id()),
        flags,
        true,
        TraceState::default(),
    ));
}
