//! Responses the layer does not hold whole: streams (server-sent events, a
//! response marked [`StreamResponse`]) pass through from their first byte,
//! and a response longer than can be stored streams on after the part the
//! layer read. Either way the record completes without the body, so
//! retries get the not-stored answer and nothing runs twice.

#[cfg(feature = "lambda")]
use super::body::try_downcast;
use super::{config::StreamFn, grpc, rebuild_body::RebuildBody, stored_body::StoredBody};
use crate::error::BoxError;
use bytes::{Buf, Bytes};
use http::{header, response::Parts, HeaderMap};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
#[cfg(feature = "lambda")]
use lambda_http::Body as LambdaBody;
use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

/// Marks a response that passes through the layer from its first byte:
/// put it in the response's extensions (an export, a long poll, a stream of
/// tokens). `text/event-stream` responses pass through without it.
///
/// Such a response is not stored: its record completes with its status
/// and stored headers as soon as the layer sees them, so a retry learns
/// that the request was processed (the not-stored answer) and nothing runs
/// again.
///
/// ```
/// use axum::{body::Body, response::Response};
/// use lambda_idempotency::http::StreamResponse;
///
/// fn export(rows: Body) -> Response {
///     let mut response = Response::new(rows);
///     response.extensions_mut().insert(StreamResponse);
///     response
/// }
/// # let _ = export;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamResponse;

/// Whether the response passes through unread.
pub(crate) fn streams(parts: &Parts, predicate: Option<&StreamFn>) -> bool {
    let event_stream = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("text/event-stream"));
    event_stream
        || parts.extensions.get::<StreamResponse>().is_some()
        || predicate.is_some_and(|streams| streams(parts.status, &parts.headers))
}

/// A response body, read as far as the layer may hold it.
pub(crate) enum Read<B> {
    /// The whole body, to store, and its trailers.
    Whole(StoredBody, Option<HeaderMap>),
    /// Longer than `limit`, or a gRPC stream: the body as the client gets
    /// it, the part read first and then the rest as it comes.
    Streams(B),
}

/// Reads `body` whole if it is at most `limit` bytes long, with its
/// trailers; past that, gives it back to stream on (when its type can hold
/// a stream: [`RebuildBody::from_stream`]; a `lambda_http` body is whole
/// already). A body of another type is read whole, whatever its length,
/// unless it declares a length past `limit`.
///
/// A gRPC response (`grpc`) also streams on once a second message begins:
/// a unary call's answer is one message and its trailers, so this is a
/// streaming call, which goes on to the client as it comes and is not
/// stored. Its first message reaches the client with the second.
///
/// The trailers end the read: hyper polls a body no further once it has
/// sent them, so the layer does not wait for an end after them either.
pub(crate) async fn read_bounded<B>(body: B, limit: usize, grpc: bool) -> Result<Read<B>, BoxError>
where
    B: RebuildBody,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    #[cfg(feature = "lambda")]
    let body = match try_downcast::<LambdaBody, B>(body) {
        Ok(whole) => return Ok(Read::Whole(StoredBody::from(whole), None)),
        Err(body) => body,
    };
    if body.size_hint().lower() > limit as u64 {
        return Ok(Read::Streams(body));
    }
    let mut rest = Box::pin(body);
    let mut prefix: VecDeque<Bytes> = VecDeque::new();
    let mut read = 0usize;
    let mut head = Vec::new();
    loop {
        let Some(frame) = rest.frame().await else {
            return Ok(Read::Whole(concat(prefix, read), None));
        };
        let mut data = match frame.map_err(Into::into)?.into_data() {
            Ok(data) => data,
            Err(frame) => {
                let Ok(trailers) = frame.into_trailers() else {
                    // A frame of a kind http-body may add: not stored.
                    continue;
                };
                return Ok(Read::Whole(concat(prefix, read), Some(trailers)));
            }
        };
        let chunk = data.copy_to_bytes(data.remaining());
        read = read.saturating_add(chunk.len());
        if grpc && head.len() < 5 {
            head.extend(chunk.iter().take(5 - head.len()));
        }
        prefix.push_back(chunk);
        let second_message =
            grpc && grpc::first_message_len(&head).is_some_and(|first| read as u64 > first);
        if read > limit || second_message {
            let prefixed = Prefixed { prefix, rest }.boxed_unsync();
            match B::from_stream(prefixed) {
                Ok(body) => return Ok(Read::Streams(body)),
                // This type cannot hold a stream: read whole.
                Err(body) => return read_whole(body).await,
            }
        }
    }
}

/// The chunks read, as one body.
fn concat(chunks: VecDeque<Bytes>, len: usize) -> StoredBody {
    let mut bytes = Vec::with_capacity(len);
    for chunk in chunks {
        bytes.extend_from_slice(&chunk);
    }
    StoredBody::from_bytes(bytes)
}

/// The rest of a body whose type cannot stream on, whole.
async fn read_whole<B>(body: UnsyncBoxBody<Bytes, BoxError>) -> Result<Read<B>, BoxError> {
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned();
    let bytes = collected.to_bytes();
    Ok(Read::Whole(
        StoredBody::from_bytes(Vec::from(bytes)),
        trailers,
    ))
}

type UnsyncBoxBody<D, E> = http_body_util::combinators::UnsyncBoxBody<D, E>;

/// The chunks already read, then the rest of the body.
struct Prefixed<B> {
    prefix: VecDeque<Bytes>,
    rest: Pin<Box<B>>,
}

impl<B> HttpBody for Prefixed<B>
where
    B: HttpBody,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(chunk) = self.prefix.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        self.rest.as_mut().poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame
                    .map(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
                    .map_err(Into::into)
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: u64 = self.prefix.iter().map(|chunk| chunk.len() as u64).sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(buffered));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(buffered));
        }
        hint
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    fn chunked(chunks: usize, size: usize) -> axum::body::Body {
        let frames = (0..chunks).map(move |i| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![
                b'a' + (i % 26) as u8;
                size
            ])))
        });
        axum::body::Body::new(StreamBody::new(futures::stream::iter(frames)))
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole() {
        let Read::Whole(body, _) = read_bounded(chunked(3, 10), 30, false)
            .await
            .expect("reads")
        else {
            panic!("30 bytes fit a 30-byte limit");
        };
        assert_eq!(body.as_ref().len(), 30);
    }

    #[tokio::test]
    async fn a_longer_body_streams_on_with_every_byte_in_order() {
        let Read::Streams(body) = read_bounded(chunked(10, 10), 25, false)
            .await
            .expect("reads")
        else {
            panic!("100 bytes do not fit 25");
        };
        let bytes = body.collect().await.expect("streams").to_bytes();
        let expected: Vec<u8> = (0..10).flat_map(|i| vec![b'a' + i as u8; 10]).collect();
        assert_eq!(bytes.as_ref(), expected.as_slice());
    }

    #[tokio::test]
    async fn a_declared_length_past_the_limit_is_not_read() {
        let body = axum::body::Body::from(vec![0u8; 100]);
        assert!(matches!(
            read_bounded(body, 99, false).await.expect("reads"),
            Read::Streams(_)
        ));
    }

    #[test]
    fn event_streams_and_marked_responses_pass_through() {
        let parts = |content_type: &str, marked: bool| {
            let mut response = http::Response::builder()
                .header(header::CONTENT_TYPE, content_type)
                .body(())
                .expect("response");
            if marked {
                response.extensions_mut().insert(StreamResponse);
            }
            response.into_parts().0
        };
        assert!(streams(
            &parts("text/event-stream; charset=utf-8", false),
            None
        ));
        assert!(streams(&parts("Text/Event-Stream", false), None));
        assert!(streams(&parts("application/json", true), None));
        assert!(!streams(&parts("application/json", false), None));
        let csv: StreamFn =
            std::sync::Arc::new(|_, headers| headers[header::CONTENT_TYPE] == "text/csv");
        assert!(streams(&parts("text/csv", false), Some(&csv)));
    }
}
