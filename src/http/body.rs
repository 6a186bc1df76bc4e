//! Bodies of any `http_body::Body` type: the request's, buffered within a
//! limit for the key and the fingerprint and rebuilt for the handler; and
//! stored responses and problems, built in the handler's own body type.
//! (The handler's response is read to be stored in `streaming`.)
//!
//! Stored responses are [`StoredBody`]s (empty, text or binary). With the
//! `lambda` feature a `lambda_http` request body is taken as it is, without
//! polling or copying, and a `lambda_http` handler gets its body back of
//! the same kind; any other body is collected.

use super::{rebuild_body::RebuildBody, stored_body::StoredBody};
use crate::error::BoxError;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
#[cfg(feature = "lambda")]
use lambda_http::Body as LambdaBody;
#[cfg(feature = "lambda")]
use std::any::Any;
use std::future::Future;

/// The default limit on a buffered request body: 6 MiB, Lambda's own limit
/// on a request, so no request that reaches a function is refused.
pub const DEFAULT_BODY_LIMIT: usize = 6 * 1024 * 1024;

/// Why a request body was not buffered.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Longer than the limit: `413`.
    TooLarge,
    /// The body failed while it was read (the client went away, a broken
    /// chunked encoding): `400`.
    Unreadable(BoxError),
}

/// How to give the handler back the body it would have had.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// A `lambda_http` body of this kind.
    #[cfg(feature = "lambda")]
    Lambda(LambdaKind),
    /// Any other body type, built from the bytes.
    Other,
}

impl Kind {
    /// Whether the event carried the body base64-encoded (`lambda_http`
    /// decodes those into binary bodies, and only those).
    #[cfg_attr(not(feature = "powertools"), allow(dead_code))]
    pub(crate) fn delivered_base64(self) -> bool {
        #[cfg(feature = "lambda")]
        if let Kind::Lambda(LambdaKind::Binary) = self {
            return true;
        }
        false
    }
}

#[cfg(feature = "lambda")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum LambdaKind {
    Empty,
    Text,
    Binary,
}

/// `value` as a `T` when it is one (as axum-core's `try_downcast`).
#[cfg(feature = "lambda")]
pub(crate) fn try_downcast<T: 'static, K: 'static>(value: K) -> Result<T, K> {
    let mut slot = Some(value);
    if let Some(value) = (&mut slot as &mut dyn Any)
        .downcast_mut::<Option<T>>()
        .and_then(Option::take)
    {
        return Ok(value);
    }
    match slot {
        Some(value) => Err(value),
        // Taken only above, where it returned.
        None => unreachable!("the value is taken only when it is a T"),
    }
}

/// Reads the request's body, at most `limit` bytes: the request with its
/// body as bytes, and how to rebuild the handler's body from them.
pub(crate) fn buffer_request<B>(
    request: Request<B>,
    limit: usize,
) -> impl Future<Output = Result<(Request<Bytes>, Kind), BodyError>>
where
    B: HttpBody + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    // Taken apart before the `async` block, which then holds the parts
    // once (see the note on plain functions in `pipeline`).
    let (parts, body) = request.into_parts();
    async move {
        #[cfg(feature = "lambda")]
        let body = match try_downcast::<LambdaBody, B>(body) {
            Ok(body) => {
                let (bytes, kind) = lambda_bytes(body);
                if bytes.len() > limit {
                    return Err(BodyError::TooLarge);
                }
                return Ok((Request::from_parts(parts, bytes), Kind::Lambda(kind)));
            }
            Err(body) => body,
        };
        // A declared length past the limit is refused before a byte is read.
        if body.size_hint().lower() > limit as u64 {
            return Err(BodyError::TooLarge);
        }
        let collected = Limited::new(body, limit).collect().await.map_err(|error| {
            if error.is::<LengthLimitError>() {
                BodyError::TooLarge
            } else {
                BodyError::Unreadable(error)
            }
        })?;
        Ok((
            Request::from_parts(parts, collected.to_bytes()),
            Kind::Other,
        ))
    }
}

/// The handler's request again, with the body it would have had (a
/// `lambda_http` body of the same kind).
pub(crate) fn rebuild_request<B: RebuildBody>(request: Request<Bytes>, kind: Kind) -> Request<B> {
    let (parts, bytes) = request.into_parts();
    let body = match kind {
        #[cfg(feature = "lambda")]
        Kind::Lambda(kind) => B::from_stored(lambda_body(bytes, kind), None),
        // Taken as they are where the body type can (no copy).
        Kind::Other => B::from_bytes(bytes),
    };
    Request::from_parts(parts, body)
}

/// A `lambda_http` body of `kind` again, from its bytes.
#[cfg(feature = "lambda")]
fn lambda_body(bytes: Bytes, kind: LambdaKind) -> StoredBody {
    let vec = Vec::from(bytes);
    match kind {
        LambdaKind::Empty => StoredBody::Empty,
        LambdaKind::Text => match String::from_utf8(vec) {
            Ok(text) => StoredBody::Text(text),
            Err(error) => StoredBody::Binary(error.into_bytes()),
        },
        LambdaKind::Binary => StoredBody::Binary(vec),
    }
}

#[cfg(feature = "lambda")]
fn lambda_bytes(body: LambdaBody) -> (Bytes, LambdaKind) {
    match body {
        LambdaBody::Empty => (Bytes::new(), LambdaKind::Empty),
        LambdaBody::Text(text) => (Bytes::from(text), LambdaKind::Text),
        LambdaBody::Binary(bytes) => (Bytes::from(bytes), LambdaKind::Binary),
        #[allow(unreachable_patterns)]
        other => (Bytes::copy_from_slice(other.as_ref()), LambdaKind::Binary),
    }
}

/// A stored or problem response, and its trailers, in the handler's body
/// type.
pub(crate) fn into_response<B: RebuildBody>(
    response: Response<StoredBody>,
    trailers: Option<HeaderMap>,
) -> Response<B> {
    response.map(|body| B::from_stored(body, trailers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    #[tokio::test]
    async fn lambda_bodies_keep_their_kind_and_others_round_trip() {
        for body in [
            LambdaBody::Empty,
            LambdaBody::Text("{\"a\":1}".into()),
            LambdaBody::Binary(vec![0, 255, 1]),
        ] {
            let request = Request::new(body.clone());
            let (buffered, kind) = buffer_request(request, 100).await.expect("buffers");
            assert_eq!(buffered.body().as_ref(), body.as_ref());
            let rebuilt: Request<LambdaBody> = rebuild_request(buffered, kind);
            assert_eq!(rebuilt.body(), &body);
        }
        let request = Request::new(Full::new(Bytes::from_static(b"hello")));
        let (buffered, kind) = buffer_request(request, 100).await.expect("buffers");
        assert_eq!(buffered.body(), "hello");
        let rebuilt: Request<Full<Bytes>> = rebuild_request(buffered, kind);
        let bytes = rebuilt
            .into_body()
            .collect()
            .await
            .expect("full")
            .to_bytes();
        assert_eq!(bytes, "hello");
    }

    #[tokio::test]
    async fn the_limit_holds_for_declared_and_streamed_lengths() {
        let full = Request::new(Full::new(Bytes::from(vec![b'a'; 101])));
        assert!(matches!(
            buffer_request(full, 100).await,
            Err(BodyError::TooLarge)
        ));
        // No declared length: refused once more than the limit arrives.
        let chunks = (0..11).map(|_| {
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(vec![b'a'; 10])))
        });
        let streamed = Request::new(StreamBody::new(futures::stream::iter(chunks)));
        assert!(matches!(
            buffer_request(streamed, 100).await,
            Err(BodyError::TooLarge)
        ));
        let at_limit = Request::new(Full::new(Bytes::from(vec![b'a'; 100])));
        assert!(buffer_request(at_limit, 100).await.is_ok());
        let lambda = Request::new(LambdaBody::Binary(vec![0; 101]));
        assert!(matches!(
            buffer_request(lambda, 100).await,
            Err(BodyError::TooLarge)
        ));
    }

    #[tokio::test]
    async fn a_failing_body_is_unreadable() {
        let chunks = [
            Ok(http_body::Frame::data(Bytes::from_static(b"abc"))),
            Err(std::io::Error::other("connection reset")),
        ];
        let request = Request::new(StreamBody::new(futures::stream::iter(chunks)));
        assert!(matches!(
            buffer_request(request, 100).await,
            Err(BodyError::Unreadable(_))
        ));
    }
}
