//! Responses as stored in the record: status, allowlisted headers and body,
//! in a compact binary frame, with large bodies compressed.
//!
//! Frame (version 1), all integers big-endian:
//!
//! ```text
//! u8 version | u8 flags | u16 status | u32 header count
//! { u32 name length | name | u32 value length | value } *
//! body (deflate-compressed when FLAG_DEFLATE is set)
//! ```
//!
//! A response with trailers (gRPC's status, for one) is version 2: the
//! trailers follow the headers, counted and framed as they are. A response
//! without trailers is still written as version 1, so records written
//! before trailers were stored, and instances not yet upgraded, read each
//! other's; a version-1 reader refuses a version-2 record (a corrupt-record
//! answer) rather than replaying it without its status.
//!
//! ```text
//! u8 2 | u8 flags | u16 status | u32 header count | { header } *
//! u32 trailer count | { u32 name length | name | u32 value length | value } *
//! body
//! ```
//!
//! A response kept with the trace context of the work that made it
//! ([`keep_trace_context`](super::IdempotencyLayer::keep_trace_context)) is
//! version 3: version 2's fields (the trailer count 0 when there are none),
//! then the trace context as a version-00 `traceparent` (55 bytes). Only
//! a layer told to keep it writes it, so a table read by older versions
//! keeps being readable by them until it is turned on. A trace of another
//! length is a corrupt frame; one of that length that does not read is
//! left out of the replay, not held against the record (it is not part of
//! the answer).
//!
//! ```text
//! u8 3 | u8 flags | u16 status | u32 header count | { header } *
//! u32 trailer count | { trailer } * | u32 length | traceparent | body
//! ```

use super::{grpc_wire::is_grpc, stored_body::StoredBody, trace_context::TraceContext};
use crate::deflate::{deflate, inflate, Compression};
use crate::{error::BoxError, Codec};
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use sha2::{Digest, Sha256};
use std::{fmt, sync::Arc};

const VERSION: u8 = 1;
/// The version of a frame with trailers.
const VERSION_TRAILERS: u8 = 2;
/// The version of a frame with the trace context of the work.
const VERSION_TRACE: u8 = 3;
/// The length of the trace context a version-3 frame keeps: a version-00
/// `traceparent`.
const TRACEPARENT_LEN: usize = 55;
const FLAG_DEFLATE: u8 = 0b0001;
const FLAG_BINARY: u8 = 0b0010;
const FLAG_TEXT: u8 = 0b0100;
const FLAG_NOT_STORED: u8 = 0b1000;
/// Bits 4 to 6 of a not-stored marker's flags: why it was not stored
/// ([`WhyNotStored`]). Earlier versions of the crate ignore them; a record without
/// them reads as [`WhyNotStored::Unsaid`].
const WHY_SHIFT: u8 = 4;
const WHY_MASK: u8 = 0b0111_0000;

/// The headers that describe a stored body, stored with it whatever
/// [`stored_headers`](super::IdempotencyLayer::stored_headers) says.
pub const BODY_HEADERS: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_DISPOSITION,
];

/// Bodies longer than this are compressed before they are stored.
pub const DEFAULT_COMPRESS_ABOVE: usize = 4 * 1024;

/// The headers stored with a response and replayed, by default. Never
/// `set-cookie`: a replay must not hand one client's session to a retry.
///
/// Whatever the list, the headers that describe the body
/// ([`BODY_HEADERS`]) are always stored with it: a replayed gzip body
/// without its `Content-Encoding` would be garbage.
pub fn default_stored_headers() -> Vec<HeaderName> {
    vec![
        header::CONTENT_TYPE,
        header::CONTENT_LANGUAGE,
        header::CONTENT_LOCATION,
        header::LOCATION,
        header::ETAG,
        header::LAST_MODIFIED,
        header::CACHE_CONTROL,
        header::LINK,
        header::VARY,
    ]
}

/// The most bytes a stored response may take: DynamoDB's 400 KB item limit,
/// less room for the record's other attributes.
pub const MAX_STORED_RESPONSE: usize = 400 * 1024 - 4 * 1024;
/// A decompressed body larger than this is corrupt (Lambda's own response
/// limit is 6 MB), so a hostile stored item cannot exhaust memory; a body
/// larger than this is never stored, so every stored body replays.
pub(crate) const MAX_BODY: u64 = 16 * 1024 * 1024;

/// A response as the record holds it.
#[derive(Debug)]
pub(crate) enum StoredResponse {
    /// The whole response: status, stored headers and body, and its
    /// trailers if it had any.
    Full(Response<StoredBody>, Option<HeaderMap>),
    /// A response not stored (too large, or a stream): its status and
    /// stored headers only, and why. Retries learn that it was processed,
    /// not what it said.
    NotStored {
        status: StatusCode,
        headers: HeaderMap,
        why: WhyNotStored,
    },
    /// A response whose body the layer does not keep, by its settings
    /// ([`withhold_bodies`](super::IdempotencyLayer::withhold_bodies), or a
    /// redaction that failed): its status, stored headers and the SHA-256
    /// of its body. Framed as a not-stored marker whose reason is
    /// [`WhyNotStored::Withheld`], with the digest where a body would be.
    Withheld {
        status: StatusCode,
        headers: HeaderMap,
        digest: [u8; 32],
    },
}

/// In the extensions of a response that [`decode_stored_response`](super::decode_stored_response)
/// read from a record holding its head only (no body): why, and the
/// body's SHA-256 when the layer's settings withheld it
/// ([`withhold_bodies`](super::IdempotencyLayer::withhold_bodies), or a
/// redaction that failed), as retries are told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BodyNotStored {
    /// Why the record holds no body, in the words of the problem a retry
    /// gets (for example "it was too large to store").
    pub why: &'static str,
    /// The SHA-256 of the body the first caller got, when it was withheld.
    pub digest: Option<[u8; 32]>,
}

impl BodyNotStored {
    /// The digest as a `Repr-Digest` value (`sha-256=:<base64>:`), as the
    /// problem body's `response_digest` member says it.
    pub fn repr_digest(&self) -> Option<String> {
        use base64::Engine as _;
        self.digest.map(|digest| {
            format!(
                "sha-256=:{}:",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
        })
    }
}

/// Why a response's record holds its head only, as retries are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WhyNotStored {
    /// Recorded by a version that did not say.
    Unsaid,
    /// A whole response, too large for a record.
    TooLarge,
    /// A stream by its kind (server-sent events, a [`StreamResponse`],
    /// a gRPC stream), passed to the client as it came.
    ///
    /// [`StreamResponse`]: super::StreamResponse
    Stream,
    /// Streamed to the client as it came, and longer than a record holds.
    StreamTooLong,
    /// Streamed to the client as it came, and failed part-way.
    StreamFailed,
    /// Streamed to the client as it came, and still going when its claim's
    /// lease was near its end: recorded then, so that no retry runs it again.
    StreamOutlivedLease,
    /// Its body is not kept, by the layer's settings: a
    /// [`StoredResponse::Withheld`].
    Withheld,
}

impl WhyNotStored {
    fn code(self) -> u8 {
        match self {
            WhyNotStored::Unsaid => 0,
            WhyNotStored::TooLarge => 1,
            WhyNotStored::Stream => 2,
            WhyNotStored::StreamTooLong => 3,
            WhyNotStored::StreamFailed => 4,
            WhyNotStored::StreamOutlivedLease => 5,
            WhyNotStored::Withheld => 6,
        }
    }

    /// A code this version does not know (a later one wrote it) is unsaid.
    fn from_code(code: u8) -> Self {
        match code {
            1 => WhyNotStored::TooLarge,
            2 => WhyNotStored::Stream,
            3 => WhyNotStored::StreamTooLong,
            4 => WhyNotStored::StreamFailed,
            5 => WhyNotStored::StreamOutlivedLease,
            6 => WhyNotStored::Withheld,
            _ => WhyNotStored::Unsaid,
        }
    }

    fn flags(self) -> u8 {
        FLAG_NOT_STORED | (self.code() << WHY_SHIFT)
    }
}

/// The response codec of the HTTP layer.
#[derive(Debug, Clone)]
pub(crate) struct ResponseCodec {
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) compress_above: usize,
    pub(crate) max_stored: usize,
    pub(crate) bodies: StoredBodies,
}

impl Default for ResponseCodec {
    fn default() -> Self {
        Self {
            stored_headers: default_stored_headers(),
            compress_above: DEFAULT_COMPRESS_ABOVE,
            max_stored: MAX_STORED_RESPONSE,
            bodies: StoredBodies::Whole,
        }
    }
}

/// A hook that redacts the response a record keeps; an error, and the
/// record keeps no body.
pub(crate) type RedactFn =
    Arc<dyn Fn(&mut Response<StoredBody>) -> Result<(), BoxError> + Send + Sync>;

/// What a record keeps of a response's body.
#[derive(Clone, Default)]
pub(crate) enum StoredBodies {
    /// All of it.
    #[default]
    Whole,
    /// What the hook leaves of a copy of the response.
    Redacted(RedactFn),
    /// None: the status, the stored headers and the body's SHA-256.
    Withheld,
}

impl fmt::Debug for StoredBodies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoredBodies::Whole => "Whole",
            StoredBodies::Redacted(_) => "Redacted",
            StoredBodies::Withheld => "Withheld",
        })
    }
}

impl ResponseCodec {
    /// The head a record keeps of a response stored head only (a stream,
    /// a response too large): as the redaction hook leaves it, if there is
    /// one; its status alone if the hook fails.
    fn head_kept(&self, head: Response<StoredBody>) -> Response<StoredBody> {
        match &self.bodies {
            StoredBodies::Redacted(redact) => redacted_copy(redact, &head, None)
                .unwrap_or_else(|| head_of(head.status(), &HeaderMap::new())),
            _ => head,
        }
    }

    /// The record of a response whose body is not kept: its head, and the
    /// digest of its body where the body would be.
    fn withheld(&self, response: &Response<StoredBody>, digest: [u8; 32]) -> Vec<u8> {
        self.frame(
            response,
            None,
            Some(&digest),
            WhyNotStored::Withheld.flags(),
        )
    }

    fn frame(
        &self,
        response: &Response<StoredBody>,
        trailers: Option<&HeaderMap>,
        body: Option<&[u8]>,
        flags: u8,
    ) -> Vec<u8> {
        let body = body.unwrap_or_default();
        let trailers = trailers.filter(|trailers| !trailers.is_empty());
        // Kept only with a body: a record of a head alone says why it has
        // no body, which is read by versions that know no trace.
        let trace = response
            .extensions()
            .get::<TraceContext>()
            .filter(|_| flags & FLAG_NOT_STORED == 0);
        // Room for the head, a typical answer's few stored headers and the
        // body: written once, not grown.
        let mut out = Vec::with_capacity(HEAD_ROOM + body.len());
        out.push(if trace.is_some() {
            VERSION_TRACE
        } else if trailers.is_some() {
            VERSION_TRAILERS
        } else {
            VERSION
        });
        out.push(flags);
        out.extend_from_slice(&response.status().as_u16().to_be_bytes());
        if is_grpc(response.headers()) {
            // gRPC metadata is part of the call's answer, which the client
            // reads as it reads the message: all of it, but cookies.
            put_fields(
                &mut out,
                response
                    .headers()
                    .iter()
                    .filter(|(name, _)| !NEVER_STORED.contains(name)),
            );
        } else {
            // The response's few headers read once, each looked for in
            // the short lists, rather than a lookup in its map for every
            // name listed (a dozen by default): each value stored once,
            // in the response's order.
            let stored = |name: &HeaderName| {
                BODY_HEADERS.contains(name) || self.stored_headers.contains(name)
            };
            put_fields(
                &mut out,
                response.headers().iter().filter(|(name, _)| stored(name)),
            );
        }
        if let Some(trailers) = trailers {
            put_fields(&mut out, trailers.iter());
        } else if trace.is_some() {
            out.extend_from_slice(&0u32.to_be_bytes());
        }
        if let Some(trace) = trace {
            put_bytes(&mut out, trace.to_string().as_bytes());
        }
        out.extend_from_slice(body);
        out
    }
}

/// A response with `status` and `headers`, and no body.
fn head_of(status: StatusCode, headers: &HeaderMap) -> Response<StoredBody> {
    let mut head = Response::new(StoredBody::Empty);
    *head.status_mut() = status;
    *head.headers_mut() = headers.clone();
    head
}

/// A copy of `response` (its status, headers and body, its `trailers` in
/// its extensions as an `http::HeaderMap`) as `redact` leaves it; `None`,
/// logged, if the hook fails or panics.
fn redacted_copy(
    redact: &RedactFn,
    response: &Response<StoredBody>,
    trailers: Option<&HeaderMap>,
) -> Option<Response<StoredBody>> {
    let mut copy = head_of(response.status(), response.headers());
    *copy.body_mut() = response.body().clone();
    if let Some(trace) = response.extensions().get::<TraceContext>() {
        copy.extensions_mut().insert(*trace);
    }
    if let Some(trailers) = trailers {
        copy.extensions_mut().insert(trailers.clone());
    }
    // A hook that panics is a hook that failed: the response still reaches
    // its caller, and its record keeps nothing the hook was to take out.
    let redacted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| redact(&mut copy)))
        .unwrap_or_else(|panic| {
            Err(format!(
                "the redaction hook panicked: {}",
                crate::engine::panic_message(panic.as_ref())
            )
            .into())
        });
    if let Err(error) = redacted {
        tracing::warn!(
            %error,
            "the response could not be redacted: its record keeps its status and the digest of its body, not its headers or body"
        );
        return None;
    }
    if copy.body() != response.body() {
        // Headers that measure the original body would misdescribe the
        // redacted one (a `content-length` the user chose to store would
        // cut the replay short).
        for name in BODY_MEASURES {
            copy.headers_mut().remove(name);
        }
    }
    Some(copy)
}

/// The headers that measure a body, and the strong validator that names
/// it (`ETag`): dropped from a redacted copy whose body the redaction
/// changed, and from a replay that has no body of the original.
pub(super) const BODY_MEASURES: [&str; 5] = [
    "content-length",
    "content-md5",
    "content-digest",
    "repr-digest",
    "etag",
];

/// The SHA-256 of a response's body, as its client received it.
fn digest_of(response: &Response<StoredBody>) -> [u8; 32] {
    let body: &[u8] = match response.body() {
        StoredBody::Empty => &[],
        StoredBody::Text(text) => text.as_bytes(),
        StoredBody::Binary(bytes) => bytes,
    };
    Sha256::digest(body).into()
}

/// The room a framed response starts with besides its body: its head (8
/// bytes) and a content type or two.
const HEAD_ROOM: usize = 96;

/// The headers of a gRPC response that are never stored: a cookie, and
/// those that describe the connection rather than the answer.
const NEVER_STORED: [HeaderName; 5] = [
    header::SET_COOKIE,
    header::DATE,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
];

/// Writes the fields' count, then each name and value: the count first as
/// a place, filled in once they are written (no list of them is made).
fn put_fields<'a>(
    out: &mut Vec<u8>,
    fields: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) {
    let count_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut count: u32 = 0;
    for (name, value) in fields {
        put_bytes(out, name.as_str().as_bytes());
        put_bytes(out, value.as_bytes());
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&count.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

impl Codec<StoredResponse> for ResponseCodec {
    fn encode(&self, stored: &StoredResponse) -> Result<Vec<u8>, BoxError> {
        let (response, trailers) = match stored {
            StoredResponse::Full(response, trailers) => (response, trailers.as_ref()),
            StoredResponse::NotStored {
                status,
                headers,
                why,
            } => {
                let head = self.head_kept(head_of(*status, headers));
                return Ok(self.frame(&head, None, None, why.flags()));
            }
            StoredResponse::Withheld {
                status,
                headers,
                digest,
            } => {
                let head = self.head_kept(head_of(*status, headers));
                return Ok(self.withheld(&head, *digest));
            }
        };
        let redacted;
        let redacted_trailers;
        let (response, trailers) = match &self.bodies {
            StoredBodies::Whole => (response, trailers),
            StoredBodies::Withheld => return Ok(self.withheld(response, digest_of(response))),
            StoredBodies::Redacted(redact) => match redacted_copy(redact, response, trailers) {
                Some(mut copy) => {
                    redacted_trailers = copy.extensions_mut().remove::<HeaderMap>();
                    redacted = copy;
                    (&redacted, redacted_trailers.as_ref())
                }
                // Nothing the hook was to take out may be kept: the status
                // and the body's digest only.
                None => {
                    let status_only = head_of(response.status(), &HeaderMap::new());
                    return Ok(self.withheld(&status_only, digest_of(response)));
                }
            },
        };
        let (body, kind): (&[u8], u8) = match response.body() {
            StoredBody::Empty => (&[], 0),
            StoredBody::Text(text) => (text.as_bytes(), FLAG_TEXT),
            StoredBody::Binary(bytes) => (bytes, FLAG_BINARY),
        };
        if body.len() as u64 > MAX_BODY {
            // Compressible enough to fit an item, but past what a replay
            // decodes: refused now rather than stored and never replayable.
            tracing::warn!(
                size = body.len(),
                limit = MAX_BODY,
                "response body too large to replay; retries will get its status and headers with an explanation, not its body"
            );
            return Ok(self.frame(response, None, None, WhyNotStored::TooLarge.flags()));
        }
        let deflated = (body.len() > self.compress_above)
            .then(|| deflate(body, Compression::fast()))
            .flatten();
        let framed = match &deflated {
            Some(compressed) => {
                self.frame(response, trailers, Some(compressed), kind | FLAG_DEFLATE)
            }
            None => self.frame(response, trailers, Some(body), kind),
        };
        if framed.len() <= self.max_stored {
            return Ok(framed);
        }
        // Too large even compressed. Storing nothing would let a retry run
        // the operation again once the lease passes; store the status and
        // headers instead, so retries learn it was processed.
        tracing::warn!(
            size = framed.len(),
            limit = self.max_stored,
            "response too large to store; retries will get its status and headers with an explanation, not its body"
        );
        Ok(self.frame(response, None, None, WhyNotStored::TooLarge.flags()))
    }

    fn decode(&self, bytes: &[u8]) -> Result<StoredResponse, BoxError> {
        let mut reader = Reader(bytes);
        let version = reader.u8()?;
        if ![VERSION, VERSION_TRAILERS, VERSION_TRACE].contains(&version) {
            return Err(format!("unknown stored response version {version}").into());
        }
        let flags = reader.u8()?;
        let status = StatusCode::from_u16(reader.u16()?)?;
        let count = reader.u32()?;
        let mut response = Response::new(StoredBody::Empty);
        *response.status_mut() = status;
        for _ in 0..count {
            let name = HeaderName::from_bytes(reader.bytes()?)?;
            let value = HeaderValue::from_bytes(reader.bytes()?)?;
            response.headers_mut().append(name, value);
        }
        let trailers = if version >= VERSION_TRAILERS {
            let count = reader.u32()?;
            let mut trailers = HeaderMap::new();
            for _ in 0..count {
                let name = HeaderName::from_bytes(reader.bytes()?)?;
                let value = HeaderValue::from_bytes(reader.bytes()?)?;
                trailers.append(name, value);
            }
            Some(trailers).filter(|trailers| !trailers.is_empty() || version == VERSION_TRAILERS)
        } else {
            None
        };
        if version == VERSION_TRACE {
            let trace = reader.bytes()?;
            // Written as a version-00 `traceparent`, 55 bytes, always: a
            // length that says otherwise is a frame changed since (its
            // body's bytes taken for the trace, or the trace's for the
            // body), not a trace that merely does not read.
            if trace.len() != TRACEPARENT_LEN {
                return Err(format!(
                    "a stored trace context of {} bytes, not {TRACEPARENT_LEN}",
                    trace.len()
                )
                .into());
            }
            match std::str::from_utf8(trace)
                .ok()
                .and_then(TraceContext::from_traceparent)
            {
                Some(trace) => {
                    response.extensions_mut().insert(trace);
                }
                None => {
                    tracing::debug!("a stored trace context does not read; replayed without it")
                }
            }
        }
        if flags & FLAG_NOT_STORED != 0 {
            let why = WhyNotStored::from_code((flags & WHY_MASK) >> WHY_SHIFT);
            let headers = std::mem::take(response.headers_mut());
            if why == WhyNotStored::Withheld {
                let digest = <[u8; 32]>::try_from(reader.0)
                    .map_err(|_| "a withheld response's record does not hold its digest")?;
                return Ok(StoredResponse::Withheld {
                    status,
                    headers,
                    digest,
                });
            }
            return Ok(StoredResponse::NotStored {
                status,
                headers,
                why,
            });
        }
        let body = if flags & FLAG_DEFLATE != 0 {
            inflate(reader.0, MAX_BODY).map_err(|error| {
                format!("stored body does not inflate within the size limit: {error}")
            })?
        } else {
            reader.0.to_vec()
        };
        *response.body_mut() = if flags & FLAG_TEXT != 0 {
            StoredBody::Text(String::from_utf8(body)?)
        } else if flags & FLAG_BINARY != 0 {
            StoredBody::Binary(body)
        } else {
            StoredBody::Empty
        };
        Ok(StoredResponse::Full(response, trailers))
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BoxError> {
        if self.0.len() < n {
            return Err("stored response is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, BoxError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, BoxError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into()?))
    }

    fn u32(&mut self) -> Result<u32, BoxError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], BoxError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> ResponseCodec {
        ResponseCodec {
            stored_headers: vec![header::CONTENT_TYPE, header::LOCATION],
            compress_above: 1024,
            max_stored: MAX_STORED_RESPONSE,
            bodies: StoredBodies::Whole,
        }
    }

    fn store(codec: &ResponseCodec, response: Response<StoredBody>) -> Vec<u8> {
        codec
            .encode(&StoredResponse::Full(response, None))
            .expect("encodes")
    }

    fn replay(codec: &ResponseCodec, bytes: &[u8]) -> Response<StoredBody> {
        match codec.decode(bytes).expect("decodes") {
            StoredResponse::Full(response, _) => response,
            other => panic!("expected a whole response, got {other:?}"),
        }
    }

    fn not_stored(codec: &ResponseCodec, bytes: &[u8]) -> (StatusCode, HeaderMap) {
        match codec.decode(bytes).expect("decodes") {
            StoredResponse::NotStored {
                status, headers, ..
            } => (status, headers),
            other => panic!("expected a not-stored marker, got {other:?}"),
        }
    }

    fn response(body: StoredBody) -> Response<StoredBody> {
        Response::builder()
            .status(201)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::LOCATION, "/v1/charges/ch_1")
            .header(header::SET_COOKIE, "session=secret")
            .header("x-request-id", "abc")
            .body(body)
            .unwrap()
    }

    #[test]
    fn round_trips_status_allowlisted_headers_and_body_kind() {
        let codec = codec();
        let bodies = || {
            [
                StoredBody::Empty,
                StoredBody::Text("{\"id\":\"ch_1\"}".into()),
                StoredBody::Binary(vec![0, 159, 146, 150, 255]),
                StoredBody::Text("é".repeat(10_000)),
                StoredBody::Binary((0..200_000u32).map(|i| (i % 251) as u8).collect()),
            ]
        };
        for (body, expected) in bodies().into_iter().zip(bodies()) {
            let bytes = store(&codec, response(body));
            let replay = replay(&codec, &bytes);
            assert_eq!(replay.status(), StatusCode::CREATED);
            assert_eq!(replay.body(), &expected);
            assert_eq!(replay.headers()[header::LOCATION], "/v1/charges/ch_1");
            assert!(
                replay.headers().get(header::SET_COOKIE).is_none(),
                "set-cookie is not stored"
            );
            assert!(
                replay.headers().get("x-request-id").is_none(),
                "not on the allowlist"
            );
        }
    }

    /// A name listed twice, or a body header listed too, is stored once:
    /// every value of it, in its order, and no value twice.
    #[test]
    fn a_header_listed_twice_replays_each_of_its_values_once() {
        let codec = ResponseCodec {
            stored_headers: vec![header::LINK, header::CONTENT_TYPE, header::LINK],
            ..codec()
        };
        let mut first = response(StoredBody::Empty);
        let headers = first.headers_mut();
        headers.append(header::LINK, HeaderValue::from_static("</a>; rel=next"));
        headers.append(header::LINK, HeaderValue::from_static("</b>; rel=prev"));
        let replay = replay(&codec, &store(&codec, first));
        let links: Vec<_> = replay.headers().get_all(header::LINK).iter().collect();
        assert_eq!(links, ["</a>; rel=next", "</b>; rel=prev"]);
        let types: Vec<_> = replay
            .headers()
            .get_all(header::CONTENT_TYPE)
            .iter()
            .collect();
        assert_eq!(types, ["application/json"]);
    }

    #[test]
    fn large_bodies_are_compressed() {
        let body = "{\"item\":\"repeated\"},".repeat(5_000);
        let bytes = store(&codec(), response(StoredBody::Text(body.clone())));
        assert!(bytes.len() < body.len() / 10, "{} bytes", bytes.len());
        assert_eq!(bytes[1] & FLAG_DEFLATE, FLAG_DEFLATE);
    }

    #[test]
    fn a_response_too_large_to_store_replays_as_an_explained_status() {
        let mut codec = codec();
        codec.max_stored = 4 * 1024;
        // Incompressible: pseudo-random bytes.
        let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
        let noise: Vec<u8> = std::iter::repeat_with(|| rng.u8(..))
            .take(64 * 1024)
            .collect();
        let bytes = store(&codec, response(StoredBody::Binary(noise)));
        assert!(bytes.len() <= codec.max_stored);
        let (status, headers) = not_stored(&codec, &bytes);
        assert_eq!(status, StatusCode::CREATED, "the original status");
        assert_eq!(
            headers[header::LOCATION],
            "/v1/charges/ch_1",
            "so the client can fetch it"
        );
        assert!(headers.get(header::SET_COOKIE).is_none());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let codec = codec();
        let good = store(&codec, response(StoredBody::Text("hello".repeat(1000))));
        for len in 0..good.len().min(64) {
            let _ = codec.decode(&good[..len]);
        }
        assert!(codec.decode(&[]).is_err());
        assert!(
            codec.decode(&[2, 0, 0, 200, 0, 0, 0, 0]).is_err(),
            "unknown version"
        );
        assert!(codec.decode(&[1, 0, 0, 5, 0, 0, 0, 0]).is_err(), "status 5");
        assert!(
            codec.decode(&[1, 0, 0, 200, 255, 255, 255, 255]).is_err(),
            "header count past the end"
        );
        let mut bad_deflate = vec![1, FLAG_DEFLATE | FLAG_TEXT, 0, 200, 0, 0, 0, 0];
        bad_deflate.extend_from_slice(b"not deflate");
        assert!(codec.decode(&bad_deflate).is_err());
    }

    /// Issue 10, item 14: a body that compresses into an item but decodes
    /// past the replay limit used to be stored, and then every retry got a
    /// corrupt-record 500.
    #[test]
    fn a_body_past_the_replay_limit_is_refused_at_store_time() {
        let codec = codec();
        let huge = "a".repeat(MAX_BODY as usize + 1);
        let bytes = store(&codec, response(StoredBody::Text(huge)));
        assert_eq!(bytes[1] & FLAG_NOT_STORED, FLAG_NOT_STORED);
        let (status, headers) = not_stored(&codec, &bytes);
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers[header::LOCATION], "/v1/charges/ch_1");
        let limit = "a".repeat(MAX_BODY as usize);
        let bytes = store(&codec, response(StoredBody::Text(limit.clone())));
        assert_eq!(replay(&codec, &bytes).body(), &StoredBody::Text(limit));
    }

    #[test]
    fn trailers_round_trip_and_records_without_them_still_read() {
        let codec = codec();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.append("x-tally", HeaderValue::from_static("1"));
        trailers.append("x-tally", HeaderValue::from_static("2"));
        let grpc = Response::builder()
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("x-custom-metadata", "kept")
            .header(header::SET_COOKIE, "session=secret")
            .body(StoredBody::Binary(vec![0, 0, 0, 0, 1, 8]))
            .unwrap();
        let bytes = codec
            .encode(&StoredResponse::Full(grpc, Some(trailers.clone())))
            .expect("encodes");
        assert_eq!(bytes[0], VERSION_TRAILERS);
        let StoredResponse::Full(replay, Some(replayed)) = codec.decode(&bytes).expect("decodes")
        else {
            panic!("a whole response with trailers")
        };
        assert_eq!(replayed, trailers);
        assert_eq!(
            replay.headers()["x-custom-metadata"],
            "kept",
            "gRPC metadata"
        );
        assert!(replay.headers().get(header::SET_COOKIE).is_none());
        assert_eq!(replay.body(), &StoredBody::Binary(vec![0, 0, 0, 0, 1, 8]));
        // A record written before trailers were stored: version 1, read as
        // a response without trailers; and one without trailers is still
        // written so.
        let old = [&[1u8, FLAG_TEXT, 0, 201, 0, 0, 0, 0][..], b"hello"].concat();
        let StoredResponse::Full(response, None) = codec.decode(&old).expect("decodes") else {
            panic!("a whole response without trailers")
        };
        assert_eq!(response.body(), &StoredBody::from("hello"));
        assert_eq!(store(&codec, response)[0], VERSION);
    }

    /// A withheld body leaves its head and digest, and the record of one
    /// re-encodes to itself; a marker whose digest is cut short is corrupt,
    /// not a replay without it.
    #[test]
    fn a_withheld_body_keeps_its_head_and_digest_only() {
        let mut codec = codec();
        codec.bodies = StoredBodies::Withheld;
        let bytes = store(&codec, response(StoredBody::from("card 4242424242424242")));
        assert!(!bytes.windows(4).any(|w| w == b"4242"));
        let decoded = codec.decode(&bytes).expect("decodes");
        let StoredResponse::Withheld {
            status,
            headers,
            digest,
        } = &decoded
        else {
            panic!("expected a withheld response, got {decoded:?}");
        };
        assert_eq!(*status, StatusCode::CREATED);
        assert_eq!(headers[header::LOCATION], "/v1/charges/ch_1");
        assert!(headers.get(header::SET_COOKIE).is_none());
        assert_eq!(digest[..], Sha256::digest(b"card 4242424242424242")[..]);
        assert_eq!(codec.encode(&decoded).expect("encodes"), bytes);
        assert!(codec.decode(&bytes[..bytes.len() - 1]).is_err());
    }

    /// What operators read (`decode_stored_response`, the CLI's inspect):
    /// a withheld body's record decodes to its head with its digest and
    /// reason in the extensions; a whole response has no such extension.
    #[test]
    fn a_decoded_withheld_record_says_why_and_keeps_its_digest() {
        let mut codec = codec();
        codec.bodies = StoredBodies::Withheld;
        let bytes = store(&codec, response(StoredBody::from("card 4242424242424242")));
        let decoded = super::super::decode_stored_response(&bytes).expect("decodes");
        assert_eq!(decoded.status(), StatusCode::CREATED);
        let not_stored = decoded
            .extensions()
            .get::<BodyNotStored>()
            .expect("says why");
        assert_eq!(not_stored.why, "this service does not keep response bodies");
        let digest = Sha256::digest(b"card 4242424242424242");
        assert_eq!(not_stored.digest.map(|d| d.to_vec()), Some(digest.to_vec()));
        use base64::Engine as _;
        assert_eq!(
            not_stored.repr_digest(),
            Some(format!(
                "sha-256=:{}:",
                base64::engine::general_purpose::STANDARD.encode(digest)
            ))
        );
        codec.bodies = StoredBodies::Whole;
        let whole = store(&codec, response(StoredBody::from("card")));
        let decoded = super::super::decode_stored_response(&whole).expect("decodes");
        assert!(decoded.extensions().get::<BodyNotStored>().is_none());
    }

    /// A redaction that changes the body drops the headers that measured
    /// the original (here stored because the user listed them).
    #[test]
    fn a_redacted_body_loses_the_headers_that_measured_the_original() {
        let mut codec = codec();
        codec.stored_headers.extend([
            header::CONTENT_LENGTH,
            HeaderName::from_static("content-digest"),
        ]);
        let mut original = response(StoredBody::from("card 4242424242424242"));
        original
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(21));
        original
            .headers_mut()
            .insert("content-digest", HeaderValue::from_static("sha-256=:x:"));
        for changes_body in [true, false] {
            codec.bodies = StoredBodies::Redacted(Arc::new(move |response| {
                if changes_body {
                    *response.body_mut() = StoredBody::from("card ****");
                }
                Ok(())
            }));
            let replayed = replay(&codec, &store(&codec, copy(&original)));
            let kept = replayed.headers().contains_key(header::CONTENT_LENGTH);
            assert_eq!(kept, !changes_body);
            assert_eq!(
                replayed.headers().contains_key("content-digest"),
                !changes_body
            );
        }
    }

    fn traced(mut response: Response<StoredBody>) -> Response<StoredBody> {
        response.extensions_mut().insert(
            TraceContext::from_traceparent(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
            .expect("a traceparent"),
        );
        response
    }

    #[test]
    fn a_kept_trace_context_round_trips_in_version_3_and_only_when_kept() {
        let codec = codec();
        let bytes = store(&codec, traced(response(StoredBody::Text("{}".into()))));
        assert_eq!(bytes[0], VERSION_TRACE);
        let replayed = replay(&codec, &bytes);
        assert_eq!(
            replayed
                .extensions()
                .get::<TraceContext>()
                .map(|trace| trace.to_string())
                .as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(replayed.body(), &StoredBody::Text("{}".into()));
        assert_eq!(replayed.headers()[header::LOCATION], "/v1/charges/ch_1");
        // Without one, the frame older versions read.
        assert_eq!(
            store(&codec, response(StoredBody::Text("{}".into())))[0],
            VERSION
        );
        // Compressed, and with trailers: both kept beside it.
        let large = "x".repeat(4096);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let bytes = codec
            .encode(&StoredResponse::Full(
                traced(response(StoredBody::Text(large.clone()))),
                Some(trailers.clone()),
            ))
            .expect("encodes");
        assert_eq!(bytes[0], VERSION_TRACE);
        let StoredResponse::Full(replayed, Some(replayed_trailers)) =
            codec.decode(&bytes).expect("decodes")
        else {
            panic!("a whole response with trailers")
        };
        assert_eq!(replayed_trailers, trailers);
        assert_eq!(replayed.body(), &StoredBody::Text(large));
        assert!(replayed.extensions().get::<TraceContext>().is_some());
        // A redacted copy keeps it; a head alone does not (older versions
        // read why it has no body).
        let redacting = ResponseCodec {
            bodies: StoredBodies::Redacted(Arc::new(|response| {
                *response.body_mut() = StoredBody::Text("{\"card\":\"****\"}".into());
                Ok(())
            })),
            ..codec.clone()
        };
        let bytes = store(&redacting, traced(response(StoredBody::Text("{}".into()))));
        assert_eq!(bytes[0], VERSION_TRACE);
        let withholding = ResponseCodec {
            bodies: StoredBodies::Withheld,
            ..codec.clone()
        };
        let bytes = store(
            &withholding,
            traced(response(StoredBody::Text("{}".into()))),
        );
        assert_eq!(bytes[0], VERSION);
    }

    #[test]
    fn a_trace_context_that_does_not_read_is_left_out_and_a_cut_one_is_an_error() {
        let codec = codec();
        let mut bytes = store(&codec, traced(response(StoredBody::Text("{}".into()))));
        let at = bytes
            .windows(3)
            .position(|window| window == b"00-")
            .expect("the traceparent");
        bytes[at + 10] = b'Z';
        let replayed = replay(&codec, &bytes);
        assert!(replayed.extensions().get::<TraceContext>().is_none());
        assert_eq!(replayed.body(), &StoredBody::Text("{}".into()));
        // Its length past the end: truncated, an error, no panic.
        let mut bytes = store(&codec, traced(response(StoredBody::Empty)));
        let length_at = at - 4;
        bytes[length_at..length_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(codec.decode(&bytes).is_err());
    }

    /// A version-3 record whose trace length was changed to take in the
    /// body too (an edit, a flipped bit) is corrupt, not replayed with the
    /// body it swallowed left out.
    #[test]
    fn a_trace_length_that_takes_in_the_body_is_a_corrupt_record() {
        let codec = codec();
        let body = r#"{"charge":"ch_1"}"#;
        let mut bytes = store(&codec, traced(response(StoredBody::Text(body.into()))));
        let at = bytes
            .windows(3)
            .position(|window| window == b"00-")
            .expect("the traceparent");
        let swallowing = u32::try_from(bytes.len() - at).unwrap();
        bytes[at - 4..at].copy_from_slice(&swallowing.to_be_bytes());
        match codec.decode(&bytes) {
            Err(_) => {}
            Ok(StoredResponse::Full(replayed, _)) => panic!(
                "replayed as {} with body {:?} (stored: {body:?})",
                replayed.status(),
                replayed.body()
            ),
            Ok(_) => panic!("replayed as something else"),
        }
    }

    fn copy(response: &Response<StoredBody>) -> Response<StoredBody> {
        let mut copy = Response::new(response.body().clone());
        *copy.status_mut() = response.status();
        *copy.headers_mut() = response.headers().clone();
        copy
    }
}
