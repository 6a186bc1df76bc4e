//! [`IdempotentEvent`]: the service the event layer wraps around a handler.

use super::{config::Config, future::ResponseFuture};
use crate::{store::Store, Attempt, Error};
use lambda_runtime::LambdaEvent;
use serde::{de::DeserializeOwned, Serialize};
use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};
use tower::Service;

/// A `lambda_runtime` handler made idempotent by an
/// [`IdempotentEventLayer`](super::IdempotentEventLayer).
pub struct IdempotentEvent<S, St, E> {
    inner: S,
    config: Arc<Config<St, E>>,
}

impl<S, St, E> IdempotentEvent<S, St, E> {
    pub(crate) fn new(inner: S, config: Arc<Config<St, E>>) -> Self {
        Self { inner, config }
    }
}

impl<S: Clone, St, E> Clone for IdempotentEvent<S, St, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, E> fmt::Debug for IdempotentEvent<S, St, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentEvent")
            .field("inner", &self.inner)
            .field("engine", &self.config.engine)
            .field("scope", &self.config.scope)
            .finish_non_exhaustive()
    }
}

impl<S, St, E> Service<LambdaEvent<E>> for IdempotentEvent<S, St, E>
where
    S: Service<LambdaEvent<E>> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Serialize + DeserializeOwned + Send,
    S::Error: Into<lambda_runtime::Error> + Send,
    St: Store,
    E: Send + 'static,
{
    type Response = S::Response;
    type Error = lambda_runtime::Error;
    type Future = ResponseFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), lambda_runtime::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, event: LambdaEvent<E>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        ResponseFuture::new(async move {
            let key = config.key.as_ref().and_then(|key| key(&event.payload));
            let Some(key) = key else {
                if config.require_key {
                    return Err("the event has no idempotency key; it was not processed".into());
                }
                return inner.call(event).await.map_err(Into::into);
            };
            let fingerprint = match (config.fingerprint)(&event.payload) {
                Ok(fingerprint) => fingerprint,
                Err(error) => {
                    tracing::error!(%error, "idempotent event refused: it cannot be serialised to fingerprint it");
                    return Err(format!(
                        "the event was not processed: it cannot be serialised as JSON to fingerprint it ({error}); \
                         give IdempotentEventLayer a fingerprint closure"
                    )
                    .into());
                }
            };
            let attempt = Attempt::new(&config.scope, &key, fingerprint)
                .deadline_ms(event.context.deadline)
                .port(crate::observe::Port::Event);
            // Set only on a store with transactions (`TransactionalStore`).
            let result = match config.in_transaction {
                Some(limits) => {
                    let no_refusals = |_: &crate::WriteRefusal| None;
                    let operation = |_| async {
                        let value = inner.call(event).await?;
                        Ok((value, Vec::new()))
                    };
                    config
                        .engine
                        .transaction_run(&attempt, limits, &config.codec, no_refusals, operation)
                        .await
                }
                None => {
                    config
                        .engine
                        .execute_with(&attempt, &config.codec, || inner.call(event))
                        .await
                }
            };
            match result {
                Ok(outcome) => {
                    tracing::debug!(
                        outcome = outcome.kind().as_str(),
                        "idempotent event handled"
                    );
                    Ok(outcome.into_value())
                }
                Err(Error::Operation(error)) => Err(error.into()),
                Err(error) => {
                    tracing::warn!(
                        outcome = error.kind().as_str(),
                        "idempotent event not handled"
                    );
                    Err(event_error(error))
                }
            }
        })
    }
}

/// The engine's refusals as errors Lambda reports (and, for asynchronous
/// sources, retries).
fn event_error<E>(error: Error<E>) -> lambda_runtime::Error {
    match error {
        Error::InProgress { retry_after } => format!(
            "this event's idempotency key is being processed by another invocation; retry after {} s",
            retry_after.as_secs()
        )
        .into(),
        Error::KeyReused => {
            "this event's idempotency key was already used with a different payload".into()
        }
        Error::Store(error) => Box::new(error),
        Error::LeaseLost => "the claim on this event's key was taken over; nothing was committed".into(),
        Error::WritesNotCommitted(error) => Box::new(error),
        Error::TimeLimitExceeded { limit } => format!(
            "the handler ran past its time limit of {} ms and was rolled back; the key is free",
            limit.as_millis()
        )
        .into(),
        Error::Operation(_) => "the handler failed".into(),
    }
}
