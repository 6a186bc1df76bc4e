//! [`Idempotency`]: the service the layer wraps around a handler.

use super::{config::Config, future::ResponseFuture, pipeline, rebuild_body::RebuildBody};
use crate::{error::BoxError, store::Store};
use http::{Request, Response};
use std::{
    sync::Arc,
    task::{Context, Poll},
};
use tower::Service;

/// An HTTP service made idempotent by an
/// [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// It serves `http::Request<B>` for any body `B` the layer can build
/// ([`RebuildBody`]: `lambda_http`'s `Body`, axum's `Body`, tonic's `Body`,
/// `http_body_util::Full`), and answers with the inner service's own
/// response body type, so it composes where the inner service does
/// (`lambda_http::run`, axum's `Router::layer`, tonic's `Server::layer`,
/// hyper).
pub struct Idempotency<S, St> {
    inner: S,
    config: Arc<Config<St>>,
}

// Not derived: the store need not be `Clone` (the configuration is shared).
impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S, St> Idempotency<S, St> {
    pub(crate) fn new(inner: S, config: Arc<Config<St>>) -> Self {
        Self { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for Idempotency<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, St, B, ResBody> Service<Request<B>> for Idempotency<S, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    St: Store,
    B: RebuildBody,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: RebuildBody,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Use the service that was polled ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(pipeline::serve(Arc::clone(&self.config), inner, request))
    }
}
