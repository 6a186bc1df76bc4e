//! [`RebuildBody`]: the body types the layer serves, which it can build
//! itself: the handler's request again from the bytes it read, and replays
//! and its own answers (data, then trailers) in the handler's response type.

use super::stored_body::StoredBody;
use crate::error::BoxError;
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{
    combinators::{BoxBody, UnsyncBoxBody},
    BodyExt, Full,
};
use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

/// A body type the layer can build: it rebuilds a request's body from the
/// bytes it read for the key and the fingerprint, and builds replays and its
/// own answers in the handler's response body type.
///
/// Implemented for `lambda_http`'s `Body` (feature `lambda`), axum's `Body`
/// (feature `axum`), tonic's `Body` (feature `tonic`),
/// `http_body_util::Full<Bytes>` and the boxed bodies
/// `UnsyncBoxBody<Bytes, BoxError>` and `BoxBody<Bytes, BoxError>`. A body
/// type of your own implements it in a few lines:
///
/// ```
/// use bytes::Bytes;
/// use http::HeaderMap;
/// use http_body_util::Full;
/// use lambda_idempotency::http::{RebuildBody, StoredBody};
///
/// /// A body of your own (here a wrapper around `Full`).
/// struct MyBody(Full<Bytes>);
/// # impl http_body::Body for MyBody {
/// #     type Data = Bytes;
/// #     type Error = std::convert::Infallible;
/// #     fn poll_frame(
/// #         self: std::pin::Pin<&mut Self>,
/// #         cx: &mut std::task::Context<'_>,
/// #     ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
/// #         std::pin::Pin::new(&mut self.get_mut().0).poll_frame(cx)
/// #     }
/// # }
///
/// impl RebuildBody for MyBody {
///     fn from_stored(body: StoredBody, _trailers: Option<HeaderMap>) -> Self {
///         // A type that cannot carry trailers leaves them out.
///         MyBody(Full::new(Bytes::from(body.into_bytes())))
///     }
/// }
/// ```
///
/// A type that can hold any body (a boxed one) also implements
/// [`from_stream`](Self::from_stream), so that a response longer than can
/// be stored, or a gRPC stream, goes on to the client as it comes instead of
/// being read whole first.
#[diagnostic::on_unimplemented(
    message = "the idempotency layer cannot build a `{Self}` body",
    note = "axum's `Body` needs the crate's `axum` feature, tonic's the `tonic` feature, lambda_http's the `lambda` feature; implement `RebuildBody` for a body type of your own"
)]
pub trait RebuildBody: HttpBody + Sized + Send + 'static {
    /// A body that yields `body`, then `trailers` when there are some. A
    /// type that cannot carry trailers (`Full`, a `lambda_http` body) leaves
    /// them out.
    fn from_stored(body: StoredBody, trailers: Option<HeaderMap>) -> Self;

    /// The handler's request body again, from the bytes the layer read for
    /// the key and the fingerprint. The default copies them into a
    /// [`StoredBody`]; a type that can hold `Bytes` as they are takes them
    /// without a copy (those this crate implements it for do).
    fn from_bytes(bytes: Bytes) -> Self {
        Self::from_stored(StoredBody::Binary(Vec::from(bytes)), None)
    }

    /// `body` as this type, when this type can hold a stream; otherwise
    /// `body` back (the default), and the layer reads it whole.
    fn from_stream(
        body: UnsyncBoxBody<Bytes, BoxError>,
    ) -> Result<Self, UnsyncBoxBody<Bytes, BoxError>> {
        Err(body)
    }
}

/// A stored body and its trailers as frames: the data, then the trailers.
#[derive(Debug, Default)]
pub(crate) struct StoredFrames {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl StoredFrames {
    pub(crate) fn new(body: StoredBody, trailers: Option<HeaderMap>) -> Self {
        let bytes = body.into_bytes();
        Self {
            data: (!bytes.is_empty()).then(|| Bytes::from(bytes)),
            trailers,
        }
    }
}

impl HttpBody for StoredFrames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|trailers| Ok(Frame::trailers(trailers))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |data| data.len() as u64))
    }
}

impl RebuildBody for Full<Bytes> {
    fn from_stored(body: StoredBody, _trailers: Option<HeaderMap>) -> Self {
        Full::new(Bytes::from(body.into_bytes()))
    }

    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl RebuildBody for UnsyncBoxBody<Bytes, BoxError> {
    fn from_stored(body: StoredBody, trailers: Option<HeaderMap>) -> Self {
        StoredFrames::new(body, trailers)
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    fn from_stream(
        body: UnsyncBoxBody<Bytes, BoxError>,
    ) -> Result<Self, UnsyncBoxBody<Bytes, BoxError>> {
        Ok(body)
    }
}

impl RebuildBody for BoxBody<Bytes, BoxError> {
    fn from_stored(body: StoredBody, trailers: Option<HeaderMap>) -> Self {
        StoredFrames::new(body, trailers)
            .map_err(|never| match never {})
            .boxed()
    }

    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes).map_err(|never| match never {}).boxed()
    }
}

#[cfg(feature = "lambda")]
impl RebuildBody for lambda_http::Body {
    /// Of the stored kind (text or binary); Lambda has no trailers.
    fn from_stored(body: StoredBody, _trailers: Option<HeaderMap>) -> Self {
        lambda_http::Body::from(body)
    }
}

#[cfg(feature = "axum")]
impl RebuildBody for axum::body::Body {
    fn from_stored(body: StoredBody, trailers: Option<HeaderMap>) -> Self {
        axum::body::Body::new(StoredFrames::new(body, trailers))
    }

    fn from_bytes(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }

    fn from_stream(
        body: UnsyncBoxBody<Bytes, BoxError>,
    ) -> Result<Self, UnsyncBoxBody<Bytes, BoxError>> {
        Ok(axum::body::Body::new(body))
    }
}

#[cfg(feature = "tonic")]
impl RebuildBody for tonic::body::Body {
    fn from_stored(body: StoredBody, trailers: Option<HeaderMap>) -> Self {
        tonic::body::Body::new(StoredFrames::new(body, trailers))
    }

    fn from_bytes(bytes: Bytes) -> Self {
        tonic::body::Body::new(Full::new(bytes))
    }

    fn from_stream(
        body: UnsyncBoxBody<Bytes, BoxError>,
    ) -> Result<Self, UnsyncBoxBody<Bytes, BoxError>> {
        Ok(tonic::body::Body::new(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stored_frames_yield_the_data_then_the_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let collected = UnsyncBoxBody::from_stored(StoredBody::from("hi"), Some(trailers.clone()))
            .collect()
            .await
            .expect("infallible");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "hi");
        let empty = StoredFrames::new(StoredBody::Empty, None);
        assert!(empty.is_end_stream());
    }
}
