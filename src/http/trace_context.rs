//! The trace that did a record's work, kept with its record: a replay's
//! span then points to it, and (opt-in) a response header names it.
//!
//! A client that gets an old answer asks "which request made this?". The
//! record keeps the W3C trace context (`traceparent`) of the request that
//! ran: with the `opentelemetry` feature, the layer's own span (the span
//! the handler ran under); otherwise the request's `traceparent` header,
//! or AWS X-Ray's `X-Amzn-Trace-Id` when it names a span (`Parent`), or,
//! in Lambda, the invocation's own X-Ray header (API Gateway's, a Function
//! URL's and an ALB's events name the trace alone, `Root`). A
//! replay records it on its span (`idempotency.replay_of`), links its span
//! to it (with the `opentelemetry` feature), and puts it in the response's
//! extensions, and in a header if one is named.

use http::HeaderMap;
use std::fmt;

/// W3C Trace Context's header.
const TRACEPARENT: &str = "traceparent";
/// AWS X-Ray's header (API Gateway, ALB, Lambda).
const XRAY: &str = "x-amzn-trace-id";

/// A W3C trace context: the trace and span of the request whose work a
/// record holds.
///
/// On a replayed response (the layer's [`keep_trace_context`]), it is in
/// the response's extensions: the trace that ran the operation the replay
/// answers with. Shown as a `traceparent` value
/// (`00-<trace id>-<span id>-<flags>`).
///
/// [`keep_trace_context`]: super::IdempotencyLayer::keep_trace_context
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
}

impl TraceContext {
    /// A trace context from its parts; none if either id is all zeros
    /// (invalid in W3C Trace Context and in OpenTelemetry).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            sampled,
        })
    }

    /// The trace's id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The id of the span that did the work.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// Whether that trace was sampled (recorded) where it ran: a link to
    /// an unsampled trace leads nowhere in a tracing backend.
    pub fn sampled(&self) -> bool {
        self.sampled
    }

    /// A `traceparent` header's value, as W3C Trace Context reads it:
    /// version `00` exactly, a later version's first four fields (a
    /// version `ff`, upper-case hex and all-zero ids are invalid). None
    /// for anything else.
    pub fn from_traceparent(value: &str) -> Option<Self> {
        let value = value.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        if bytes.len() < 55 {
            return None;
        }
        let version = lower_hex::<1>(&bytes[0..2])?[0];
        // Version 00 is exactly 55 characters; a later version may carry
        // more, after a dash (W3C Trace Context, "versioning").
        let fits = match version {
            0xff => false,
            0 => bytes.len() == 55,
            _ => bytes.len() == 55 || bytes[55] == b'-',
        };
        if !fits || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let flags = lower_hex::<1>(&bytes[53..55])?[0];
        Self::new(
            lower_hex(&bytes[3..35])?,
            lower_hex(&bytes[36..52])?,
            flags & 1 == 1,
        )
    }

    /// An AWS X-Ray trace header's value
    /// (`Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1`):
    /// its trace id as W3C's (X-Ray's epoch and unique parts, joined) and
    /// its parent segment as the span. None without a `Parent` (an ALB's
    /// header names the trace only: there is no span to point to).
    pub fn from_xray(value: &str) -> Option<Self> {
        let (mut root, mut parent, mut sampled) = (None, None, false);
        for field in value.split(';') {
            match field.trim().split_once('=') {
                Some(("Root", value)) => root = Some(value),
                Some(("Parent", value)) => parent = Some(value),
                Some(("Sampled", value)) => sampled = value == "1",
                _ => {}
            }
        }
        let root = root?.as_bytes();
        // `1-` + 8 hex digits (the epoch) + `-` + 24 hex digits.
        if root.len() != 35 || &root[..2] != b"1-" || root[10] != b'-' {
            return None;
        }
        let mut trace_id = [0; 16];
        trace_id[..4].copy_from_slice(&lower_hex::<4>(&root[2..10])?);
        trace_id[4..].copy_from_slice(&lower_hex::<12>(&root[11..35])?);
        Self::new(trace_id, lower_hex(parent?.as_bytes())?, sampled)
    }

    /// The trace context a request carries: its `traceparent` (one: two
    /// are none, as W3C Trace Context says), else its X-Ray header.
    pub(crate) fn of_headers(headers: &HeaderMap) -> Option<Self> {
        let only = |name| {
            let mut values = headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(value), None) => value.to_str().ok(),
                _ => None,
            }
        };
        only(TRACEPARENT)
            .and_then(Self::from_traceparent)
            .or_else(|| only(XRAY).and_then(Self::from_xray))
    }

    /// The trace context of the work running now: the current span's, with
    /// the `opentelemetry` feature; else the request's headers; else, in
    /// Lambda, the invocation's own X-Ray header (the events' header names
    /// the trace alone, `Root=`, with no span to point to).
    pub(crate) fn of_work<B>(request: &http::Request<B>) -> Option<Self> {
        #[cfg(feature = "opentelemetry")]
        if let Some(current) = super::trace_link::of_current_span() {
            return Some(current);
        }
        Self::of_headers(request.headers())
            .or_else(|| super::lambda_context::xray_trace_id(request).and_then(Self::from_xray))
    }
}

/// `N` bytes from exactly `2 * N` lower-case hex digits.
fn lower_hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

impl fmt::Display for TraceContext {
    /// The `traceparent` value: `00-<trace id>-<span id>-<flags>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for byte in self.trace_id {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("-")?;
        for byte in self.span_id {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "-{:02x}", u8::from(self.sampled))
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceContext({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips() {
        let context = TraceContext::from_traceparent(SPEC).expect("the spec's example");
        assert_eq!(context.to_string(), SPEC);
        assert!(context.sampled());
        assert_eq!(
            context.span_id(),
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        let unsampled = SPEC.replace("-01", "-00");
        assert!(!TraceContext::from_traceparent(&unsampled)
            .expect("unsampled")
            .sampled());
    }

    #[test]
    fn traceparents_w3c_calls_invalid_are_refused() {
        for invalid in [
            "",
            "00",
            &SPEC.to_uppercase(),
            &SPEC.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32)),
            &SPEC.replace("00f067aa0ba902b7", &"0".repeat(16)),
            &SPEC.replacen("00-", "ff-", 1),
            &format!("{SPEC}-extra"),
            &SPEC.replace('-', "_"),
            &SPEC[..54],
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::from_traceparent(invalid), None, "{invalid:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let later = SPEC.replacen("00-", "01-", 1);
        assert!(TraceContext::from_traceparent(&format!("{later}-what-comes-next")).is_some());
        assert!(TraceContext::from_traceparent(&later).is_some());
        assert_eq!(
            TraceContext::from_traceparent(&format!("{later}x")),
            None,
            "more only after a dash"
        );
    }

    #[test]
    fn an_xray_header_becomes_the_same_trace_in_w3c_form() {
        let context = TraceContext::from_xray(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        )
        .expect("X-Ray's example");
        assert_eq!(
            context.to_string(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
        );
        // Fields in another order, spaced, with Lineage, unsampled.
        let other = TraceContext::from_xray(
            "Sampled=0; Lineage=a87bd80c:0;Parent=53995c3f42cd8ad8; Root=1-5759e988-bd862e3fe1be46a994272793",
        )
        .expect("reordered");
        assert!(!other.sampled());
        assert_eq!(other.trace_id(), context.trace_id());
    }

    #[test]
    fn an_xray_header_without_a_parent_or_malformed_is_none() {
        for invalid in [
            "Root=1-5759e988-bd862e3fe1be46a994272793",
            "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a99427279;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000",
            "garbage",
            "Root=;Parent=",
        ] {
            assert_eq!(TraceContext::from_xray(invalid), None, "{invalid:?}");
        }
    }

    #[test]
    fn a_request_s_traceparent_comes_before_its_xray_header() {
        let mut headers = HeaderMap::new();
        headers.insert(
            XRAY,
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
                .parse()
                .expect("value"),
        );
        let xray = TraceContext::of_headers(&headers).expect("X-Ray alone");
        headers.insert(TRACEPARENT, SPEC.parse().expect("value"));
        assert_eq!(
            TraceContext::of_headers(&headers)
                .map(|c| c.to_string())
                .as_deref(),
            Some(SPEC)
        );
        // An invalid traceparent does not hide a valid X-Ray header.
        headers.insert(TRACEPARENT, "nonsense".parse().expect("value"));
        assert_eq!(TraceContext::of_headers(&headers), Some(xray));
        // Two traceparent fields are none (W3C's test suite,
        // `test_traceparent_duplicated`).
        headers.insert(TRACEPARENT, SPEC.parse().expect("value"));
        headers.append(TRACEPARENT, SPEC.parse().expect("value"));
        assert_eq!(TraceContext::of_headers(&headers), Some(xray));
    }
}
