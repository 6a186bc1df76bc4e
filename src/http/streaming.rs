//! Responses the layer does not hold whole: streams (server-sent events, a
//! response marked [`StreamResponse`]) pass through from their first byte,
//! and a response longer than can be stored streams on after the part the
//! layer read. Either way the record completes without the body, so
//! retries get the not-stored answer and nothing runs twice.

#[cfg(feature = "lambda")]
use super::body::try_downcast;
use super::{
    config::StreamFn, grpc, rebuild_body::RebuildBody, stored::WhyNotStored,
    stored_body::StoredBody,
};
use crate::error::BoxError;
use bytes::{Buf, Bytes};
use http::{header, response::Parts, HeaderMap};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
#[cfg(feature = "lambda")]
use lambda_http::Body as LambdaBody;
use std::{
    collections::VecDeque,
    future::poll_fn,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::sync::oneshot;

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

/// How much of a response that is ready is read before any of it goes to
/// the client, when it may stream: a typical answer whole, so that it is
/// stored before the client sees it, and no more, so that a long one does
/// not wait for 16 MiB to be read first.
const READ_IN_PLACE: usize = 64 * 1024;

/// A response body, read as far as the layer may hold it.
pub(crate) enum Read<B> {
    /// The whole body, to store, and its trailers.
    Whole(StoredBody, Option<HeaderMap>),
    /// Not to be stored (`why`): longer than the limit, or a gRPC stream.
    /// The body as the client gets it, the part read first and then the
    /// rest as it comes.
    Streams(B, WhyNotStored),
    /// The body would have waited for more: it goes on to the client as it
    /// comes, copied as it passes; `Copied` resolves to how it ended.
    Teed(B, Copied),
}

/// Reads `body` for its record: whole if it is at most `limit` bytes long,
/// with its trailers; past that, gives it back to stream on (when its type
/// can hold a stream: [`RebuildBody::from_stream`]; a `lambda_http` body is
/// whole already). A body of another type is read whole, whatever its
/// length, unless it declares a length past `limit`.
///
/// With `tee`, a body that would wait for its next frame is not waited
/// for, nor one longer than [`READ_IN_PLACE`]: what was read and the rest
/// go on to the client at once, and are copied as they pass
/// (`Read::Teed`), so the layer never delays a byte. A short body that is
/// ready to its end (most are: a handler's whole answer) is read in place,
/// as without.
///
/// A gRPC response (`grpc`) also streams on once a second message begins:
/// a unary call's answer is one message and its trailers, so this is a
/// streaming call, which goes on to the client as it comes and is not
/// stored.
///
/// The trailers end the read: hyper polls a body no further once it has
/// sent them, so the layer does not wait for an end after them either.
pub(crate) async fn read_bounded<B>(
    body: B,
    limit: usize,
    grpc: bool,
    tee: bool,
) -> Result<Read<B>, BoxError>
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
        return Ok(Read::Streams(body, WhyNotStored::StreamTooLong));
    }
    let mut rest = Box::pin(body);
    let mut copy = RecordCopy::new(limit, grpc);
    loop {
        // Converted at once: the body's own error type need not be `Send`.
        let polled = if tee {
            poll_fn(|cx| Poll::Ready(rest.as_mut().poll_frame(cx).map(|frame| frame.map(owned))))
                .await
        } else {
            Poll::Ready(rest.frame().await.map(owned))
        };
        // The ways on that a body read whole (most) never takes are awaited
        // boxed: this future, which every stored response's read holds, then
        // keeps no room for them.
        let Poll::Ready(frame) = polled else {
            // It would wait: on to the client, copied as it goes.
            return Ok(Box::pin(tee_on(copy, rest)).await);
        };
        let Some(frame) = frame else {
            return Ok(Read::Whole(copy.into_body(), None));
        };
        let data = match frame?.into_data() {
            Ok(data) => data,
            Err(frame) => {
                let Ok(trailers) = frame.into_trailers() else {
                    // A frame of a kind http-body may add: not stored.
                    continue;
                };
                return Ok(Read::Whole(copy.into_body(), Some(trailers)));
            }
        };
        if let Err(why) = copy.push(data) {
            let prefixed = Prefixed {
                prefix: copy.chunks.into(),
                rest,
            }
            .boxed_unsync();
            match B::from_stream(prefixed) {
                Ok(body) => return Ok(Read::Streams(body, why)),
                // This type cannot hold a stream: read whole.
                Err(body) => return Box::pin(read_whole(body)).await,
            }
        }
        if tee && copy.len > READ_IN_PLACE {
            // Long, and ready: the client gets it from here on as it comes.
            return Ok(Box::pin(tee_on(copy, rest)).await);
        }
    }
}

/// A frame with its data as `Bytes` and its error boxed.
fn owned<D: Buf, E: Into<BoxError>>(frame: Result<Frame<D>, E>) -> Result<Frame<Bytes>, BoxError> {
    frame
        .map(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
        .map_err(Into::into)
}

/// The body as the client gets it from here on: the part read, then the
/// rest, copied as they pass. A type that cannot hold a stream reads it
/// whole instead.
async fn tee_on<B>(copy: RecordCopy, rest: Pin<Box<B>>) -> Read<B>
where
    B: RebuildBody,
    B::Error: Into<BoxError>,
{
    let (ended, copied) = oneshot::channel();
    let (recorded, record_done) = oneshot::channel();
    // The part read is copied again as it passes, with the rest.
    let fresh = RecordCopy::new(copy.limit, copy.grpc_head.is_some());
    let prefixed = Prefixed {
        prefix: copy.chunks.into(),
        rest,
    }
    .boxed_unsync();
    let tee = Tee {
        body: Some(prefixed),
        copy: Some((fresh, ended)),
        record_done: Some(record_done),
        last: None,
    };
    match B::from_stream(tee.boxed_unsync()) {
        Ok(body) => Read::Teed(
            body,
            Copied {
                ended: copied,
                recorded: Recorded(recorded),
            },
        ),
        // Unreachable for the types that stream; read whole all the same.
        Err(body) => match read_whole(body).await {
            Ok(read) => read,
            Err(_) => Read::Whole(StoredBody::Empty, None),
        },
    }
}

/// What is copied of a body for its record, as far as a record holds it.
struct RecordCopy {
    chunks: Vec<Bytes>,
    len: usize,
    limit: usize,
    /// A gRPC response's first five bytes, which give its first message's
    /// length, while they are read.
    grpc_head: Option<Vec<u8>>,
}

impl RecordCopy {
    fn new(limit: usize, grpc: bool) -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
            limit,
            grpc_head: grpc.then(Vec::new),
        }
    }

    /// Copies `chunk`; an error says why the body is not to be stored
    /// after all.
    fn push(&mut self, chunk: Bytes) -> Result<(), WhyNotStored> {
        self.len = self.len.saturating_add(chunk.len());
        if let Some(head) = &mut self.grpc_head {
            if head.len() < 5 {
                head.extend(chunk.iter().take(5 - head.len()));
            }
        }
        self.chunks.push(chunk);
        let second_message = self.grpc_head.as_deref().and_then(grpc::first_message_len);
        if second_message.is_some_and(|first| self.len as u64 > first) {
            return Err(WhyNotStored::Stream);
        }
        if self.len > self.limit {
            return Err(WhyNotStored::StreamTooLong);
        }
        Ok(())
    }

    /// The chunks copied, as one body. A body of one chunk (most whole
    /// ones) keeps its allocation when nothing else holds it, rather than
    /// being copied into a new one.
    fn into_body(mut self) -> StoredBody {
        if self.chunks.len() == 1 {
            return StoredBody::from_bytes(Vec::from(self.chunks.swap_remove(0)));
        }
        let mut bytes = Vec::with_capacity(self.len);
        for chunk in self.chunks {
            bytes.extend_from_slice(&chunk);
        }
        StoredBody::from_bytes(bytes)
    }
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

/// How a teed body ended, for its record.
pub(crate) enum Ending {
    /// To its end, whole: every byte, and the trailers.
    Whole(StoredBody, Option<HeaderMap>),
    /// Not to be stored: longer than a record holds, a gRPC stream, or
    /// failed part-way.
    NotStored(WhyNotStored),
}

/// Resolves to how a teed body ended. When the client leaves first (its
/// side is dropped), the rest is read here, as far as a record holds it:
/// the work the handler started finishes, as it does for a client that
/// leaves while the handler runs.
pub(crate) struct Copied {
    ended: oneshot::Receiver<Ended>,
    recorded: Recorded,
}

/// Lets the last frame of a teed body go to the client: when sent, or
/// dropped, once the record is complete (or will never be), so that a
/// client that has the whole response finds it recorded.
pub(crate) struct Recorded(oneshot::Sender<()>);

impl Recorded {
    /// The record is complete.
    pub(crate) fn done(self) {
        let _ = self.0.send(());
    }
}

/// What the client's side of a teed body sends its record.
enum Ended {
    /// The body came to its end, or could not be stored.
    Ending(Ending),
    /// The client's side was dropped before the end: the rest, and what
    /// was copied.
    Left(UnsyncBoxBody<Bytes, BoxError>, RecordCopy),
}

impl Copied {
    /// Where to say that the record is complete, and a future of how the
    /// body ended, which stops copying (the client still gets every byte)
    /// when dropped before that.
    pub(crate) fn split(self) -> (Recorded, impl std::future::Future<Output = Ending> + Send) {
        let ended = self.ended;
        let ending = async move {
            match ended.await {
                Ok(Ended::Ending(ending)) => ending,
                Ok(Ended::Left(rest, copy)) => read_rest(rest, copy).await,
                // The client's side is gone and sent nothing: never, since
                // its drop sends what it holds.
                Err(_) => Ending::NotStored(WhyNotStored::StreamFailed),
            }
        };
        (self.recorded, ending)
    }
}

/// Reads the rest of a body the client left, into its copy.
async fn read_rest(mut rest: UnsyncBoxBody<Bytes, BoxError>, mut copy: RecordCopy) -> Ending {
    loop {
        match poll_fn(|cx| poll_unwinding(Pin::new(&mut rest), cx)).await {
            None => return Ending::Whole(copy.into_body(), None),
            Some(Err(_)) => return Ending::NotStored(WhyNotStored::StreamFailed),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if let Err(why) = copy.push(data) {
                        return Ending::NotStored(why);
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        return Ending::Whole(copy.into_body(), Some(trailers));
                    }
                }
            },
        }
    }
}

/// The body's next frame; a panic while polling it is an error frame. A
/// response body is polled where the server writes it (hyper's connection
/// task), after the handler returned: a panic there, unguarded, left the
/// teed body to its drop, which handed the panicked body on to be read
/// again, and a body resumed after its panic panics once more, on the
/// task completing the record. As an error, the client's connection is cut
/// (as hyper cuts it for any body error) and the record says why.
fn poll_unwinding<B>(
    body: Pin<&mut B>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: HttpBody<Data = Bytes, Error = BoxError> + ?Sized,
{
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body.poll_frame(cx))).unwrap_or_else(
        |panic| {
            let message = crate::engine::panic_message(&*panic);
            Poll::Ready(Some(Err(BoxError::from(format!(
                "the response body panicked: {message}"
            )))))
        },
    )
}

/// The client's side of a teed body: every frame as it comes, copied for
/// the record until the body ends or no longer fits.
struct Tee {
    /// `None` once dropped, or once it failed (it may have panicked).
    body: Option<UnsyncBoxBody<Bytes, BoxError>>,
    /// The copy and where its ending goes; `None` once sent, or once no
    /// one waits for it.
    copy: Option<(RecordCopy, oneshot::Sender<Ended>)>,
    /// Resolves when the record is complete; `None` once it has.
    record_done: Option<oneshot::Receiver<()>>,
    /// The body's last frame (or its end), held until the record is
    /// complete.
    last: Option<Option<Result<Frame<Bytes>, BoxError>>>,
}

impl Tee {
    fn end(&mut self, ending: impl FnOnce(RecordCopy) -> Ending) {
        if let Some((copy, ended)) = self.copy.take() {
            let _ = ended.send(Ended::Ending(ending(copy)));
        }
    }
}

impl HttpBody for Tee {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(record_done) = &mut this.record_done {
            if this.last.is_some() {
                // Sent or dropped: either way, nothing more to wait for.
                let _ = std::task::ready!(std::future::Future::poll(Pin::new(record_done), cx));
                this.record_done = None;
                return Poll::Ready(this.last.take().flatten());
            }
        }
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(poll_unwinding(Pin::new(body), cx));
        if matches!(frame, Some(Err(_))) {
            // Never polled again, nor handed on when dropped: it may have
            // panicked.
            this.body = None;
        }
        if this
            .copy
            .as_ref()
            .is_some_and(|(_, ended)| ended.is_closed())
        {
            // No one records this body any more (its lease was near its
            // end): the client still gets every byte.
            this.copy = None;
        }
        let last = match &frame {
            None => {
                this.end(|copy| Ending::Whole(copy.into_body(), None));
                true
            }
            Some(Err(_)) => {
                this.end(|_| Ending::NotStored(WhyNotStored::StreamFailed));
                false
            }
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let trailers = trailers.clone();
                    this.end(|copy| Ending::Whole(copy.into_body(), Some(trailers)));
                    true
                } else if let Some(data) = frame.data_ref() {
                    if let Some((copy, _)) = &mut this.copy {
                        if let Err(why) = copy.push(data.clone()) {
                            this.end(|_| Ending::NotStored(why));
                        }
                    }
                    let ended = this.body.as_ref().is_some_and(HttpBody::is_end_stream);
                    if ended {
                        this.end(|copy| Ending::Whole(copy.into_body(), None));
                    }
                    ended
                } else {
                    false
                }
            }
        };
        if last && this.record_done.is_some() {
            // The client gets the end once the record is complete.
            this.last = Some(frame);
            return self.poll_frame(cx);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.last.is_none() && self.body.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Drop for Tee {
    fn drop(&mut self) {
        if let (Some(rest), Some((copy, ended))) = (self.body.take(), self.copy.take()) {
            let _ = ended.send(Ended::Left(rest, copy));
        }
    }
}

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
        self.rest
            .as_mut()
            .poll_frame(cx)
            .map(|frame| frame.map(owned))
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
        let Read::Whole(body, _) = read_bounded(chunked(3, 10), 30, false, false)
            .await
            .expect("reads")
        else {
            panic!("30 bytes fit a 30-byte limit");
        };
        assert_eq!(body.as_ref().len(), 30);
    }

    #[tokio::test]
    async fn a_longer_body_streams_on_with_every_byte_in_order() {
        let Read::Streams(body, _) = read_bounded(chunked(10, 10), 25, false, false)
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
            read_bounded(body, 99, false, false).await.expect("reads"),
            Read::Streams(..)
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
