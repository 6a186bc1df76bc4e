//! [`ResponseFuture`]: the future of an
//! [`IdempotentEvent`](super::IdempotentEvent) service.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

type BoxFuture<R> = Pin<Box<dyn Future<Output = Result<R, lambda_runtime::Error>> + Send>>;

/// The result of an [`IdempotentEvent`](super::IdempotentEvent) service:
/// the handler's, a replay, or the layer's own error.
pub struct ResponseFuture<R> {
    inner: BoxFuture<R>,
}

impl<R> ResponseFuture<R> {
    pub(crate) fn new(
        future: impl Future<Output = Result<R, lambda_runtime::Error>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<R> Future for ResponseFuture<R> {
    type Output = Result<R, lambda_runtime::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<R> fmt::Debug for ResponseFuture<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
