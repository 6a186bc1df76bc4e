//! The edges between actix-web and the layer: actix's requests and
//! responses (http 0.2 types, bodies that are not `Send`) as the layer's
//! (http 1 types, `Send` bodies), and back. A body that is not `Send` is
//! read on a local task of actix's runtime and its bytes sent across a
//! channel, so the layer reads it (or not) as it reads any body.

use super::super::scope::RouteTemplate;
use crate::error::BoxError;
use actix_web::{
    body::{BodySize, BodyStream, BoxBody, MessageBody, SizedStream},
    dev::Payload,
    error::PayloadError,
    http::{
        header::{HeaderName as ActixName, HeaderValue as ActixValue},
        StatusCode as ActixStatus, Version as ActixVersion,
    },
    HttpRequest, HttpResponse,
};
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use http::{header, Request, Response, Version};
use http_body::{Body as _, Frame};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};
use std::{
    fmt::Display,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::sync::mpsc;

/// The body of a request or response as the layer sees it.
pub(super) type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A response of at most this many bytes whose length actix knows is read
/// whole on its task, without a channel.
const READ_WHOLE: u64 = 64 * 1024;

/// The caller an [`Idempotency::caller`](super::Idempotency::caller)
/// function named, in the layer's request.
#[derive(Clone, Debug)]
pub(super) struct Caller(pub(super) Option<String>);

/// What the local task reading a body sends: its chunks, then how it
/// ended. A channel that closes without saying (the task panicked while
/// polling the body, or was dropped with its runtime) is a failure, never
/// an end: read as one, the rows before a panic were a whole response.
enum Sent {
    Data(Bytes),
    Failed(BoxError),
    Ended,
}

/// A body whose bytes a local task sends, of `remaining` bytes more when
/// actix knew its length (kept, so that the response keeps its
/// `content-length`, and checked: a body that ends short of it failed).
struct Channel {
    receiver: mpsc::Receiver<Sent>,
    remaining: Option<u64>,
    done: bool,
}

impl Channel {
    fn fail(&mut self, error: impl Into<BoxError>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        Poll::Ready(Some(Err(error.into())))
    }
}

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.receiver.poll_recv(cx)) {
            Some(Sent::Data(bytes)) => {
                let length = bytes.len() as u64;
                match self.remaining {
                    Some(remaining) if length > remaining => {
                        self.fail("the response body is longer than its declared length")
                    }
                    remaining => {
                        self.remaining = remaining.map(|r| r - length);
                        Poll::Ready(Some(Ok(Frame::data(bytes))))
                    }
                }
            }
            Some(Sent::Failed(error)) => self.fail(error),
            Some(Sent::Ended) => match self.remaining {
                Some(short) if short > 0 => self.fail(format!(
                    "the response body ended {short} bytes short of its declared length"
                )),
                _ => {
                    self.done = true;
                    Poll::Ready(None)
                }
            },
            None => self
                .fail("the body stopped without ending: what produced it panicked or was dropped"),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.remaining {
            Some(remaining) => http_body::SizeHint::with_exact(remaining),
            None => http_body::SizeHint::default(),
        }
    }
}

/// `stream`'s bytes as a `Send` body of `length` bytes if known: read on a
/// local task, one chunk ahead of the reader, until the reader drops the
/// body.
fn sent_body<S, E>(stream: S, length: Option<u64>) -> Body
where
    S: Stream<Item = Result<Bytes, E>> + 'static,
    E: Display,
{
    let (sender, receiver) = mpsc::channel(1);
    actix_web::rt::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let ending = loop {
            match stream.next().await {
                Some(Ok(bytes)) => {
                    if sender.send(Sent::Data(bytes)).await.is_err() {
                        return;
                    }
                }
                Some(Err(error)) => break Sent::Failed(BoxError::from(error.to_string())),
                None => break Sent::Ended,
            }
        };
        let _ = sender.send(ending).await;
    });
    Channel {
        receiver,
        remaining: length,
        done: false,
    }
    .boxed_unsync()
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

fn whole(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The request's body, read only if the layer reads it.
pub(super) fn request_body(payload: Payload) -> Body {
    match payload {
        Payload::None => empty(),
        payload => sent_body(payload, None),
    }
}

/// actix's request as the layer's, with `body`, the caller a caller
/// function named and actix's route template.
pub(super) fn request(
    actix: &HttpRequest,
    body: Body,
    caller: Option<Caller>,
    template: Option<String>,
) -> Result<Request<Body>, http::Error> {
    let mut builder = Request::builder()
        .method(actix.method().as_str())
        .uri(actix.uri().to_string())
        .version(version(actix.version()));
    for (name, value) in actix.headers() {
        builder = builder.header(name.as_str(), value.as_bytes());
    }
    if let Some(caller) = caller {
        builder = builder.extension(caller);
    }
    if let Some(template) = template {
        builder = builder.extension(RouteTemplate(template));
    }
    builder.body(body)
}

fn version(version: ActixVersion) -> Version {
    match version {
        ActixVersion::HTTP_09 => Version::HTTP_09,
        ActixVersion::HTTP_10 => Version::HTTP_10,
        ActixVersion::HTTP_2 => Version::HTTP_2,
        ActixVersion::HTTP_3 => Version::HTTP_3,
        _ => Version::HTTP_11,
    }
}

/// The layer's request body, as the payload of actix's request.
pub(super) fn payload(body: Body) -> Payload {
    let stream = body
        .into_data_stream()
        .map_err(|error| PayloadError::Io(std::io::Error::other(error)));
    Payload::Stream {
        payload: Box::pin(stream),
    }
}

/// actix's response as the layer's: its status, headers and extensions
/// (`W`: the store's writes, [`CommitWith`](super::super::CommitWith)),
/// and its body, read on this local task as the layer reads it.
pub(super) async fn response<W>(actix: HttpResponse<BoxBody>) -> Response<Body>
where
    W: Clone + Send + Sync + 'static,
{
    let (mut head, body) = actix.into_parts();
    let body = match body.size() {
        BodySize::None => empty(),
        BodySize::Sized(length) if length <= READ_WHOLE => {
            let failed = |error: BoxError| {
                http_body_util::StreamBody::new(futures_util::stream::iter([Err(error)]))
                    .boxed_unsync()
            };
            match actix_web::body::to_bytes(body).await {
                Ok(bytes) if bytes.len() as u64 == length => whole(bytes),
                // Its producer stopped part-way (or lied): a failure, never
                // a shorter whole body.
                Ok(bytes) => failed(BoxError::from(format!(
                    "the response body holds {} bytes, not the {length} it declares",
                    bytes.len()
                ))),
                Err(error) => failed(BoxError::from(error.to_string())),
            }
        }
        BodySize::Sized(_) | BodySize::Stream => {
            let length = match body.size() {
                BodySize::Sized(length) => Some(length),
                _ => None,
            };
            let mut body = Box::pin(body);
            sent_body(
                futures_util::stream::poll_fn(move |cx| body.as_mut().poll_next(cx)),
                length,
            )
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = http::StatusCode::from_u16(head.status().as_u16())
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in head.headers() {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_str().as_bytes()),
            header::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    if let Some(commit) = head
        .extensions_mut()
        .remove::<super::super::CommitWith<W>>()
    {
        response.extensions_mut().insert(commit);
    }
    if let Some(stream) = head
        .extensions_mut()
        .remove::<super::super::StreamResponse>()
    {
        response.extensions_mut().insert(stream);
    }
    response
}

/// The layer's response as actix's. actix writes the framing headers
/// (`content-length`, `transfer-encoding`) from the body itself.
pub(super) fn actix_response(response: Response<Body>) -> HttpResponse {
    let (parts, body) = response.into_parts();
    let status =
        ActixStatus::from_u16(parts.status.as_u16()).unwrap_or(ActixStatus::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            ActixName::from_bytes(name.as_str().as_bytes()),
            ActixValue::from_bytes(value.as_bytes()),
        ) {
            builder.append_header((name, value));
        }
    }
    let length = body.size_hint().exact();
    let stream = body
        .into_data_stream()
        .map_err(|error| -> Box<dyn std::error::Error> { error });
    match length {
        Some(0) => builder.finish(),
        Some(length) => builder.body(SizedStream::new(length, stream)),
        None => builder.body(BodyStream::new(stream)),
    }
}
