//! [`ResponseFuture`]: the future of an [`Idempotency`](super::Idempotency)
//! service.

use lambda_http::{Body, Response};
use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

/// The response of an [`Idempotency`](super::Idempotency) service: the
/// handler's, a replay, or the layer's own problem response.
pub struct ResponseFuture<E> {
    inner: BoxFuture<E>,
}

impl<E> ResponseFuture<E> {
    pub(crate) fn new(
        future: impl Future<Output = Result<Response<Body>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
