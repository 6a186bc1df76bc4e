//! [`IdempotentEventLayer`]: idempotency for `lambda_runtime` handlers of any
//! serde event type.

use super::{config::Config, service::IdempotentEvent};
use crate::{store::Store, Engine, Fingerprint};
use std::{fmt, sync::Arc};
use tower::Layer;

/// Makes a `lambda_runtime` handler of events `E` idempotent: the handler
/// runs at most once per key, and its result (serialised with serde) is
/// replayed to every redelivery.
///
/// The key and the fingerprinted part of the event are chosen by closures.
/// The lease runs until the invocation's deadline (under Lambda Managed
/// Instances, which do not stop an invocation there, the engine's
/// heartbeat keeps it while the handler runs). A handler error releases
/// the claim, so the next delivery runs it again.
///
/// A redelivery while the first delivery still runs, a key reused with
/// another payload, or an unreachable store is an error, so Lambda's own
/// retries (asynchronous invocations, event source mappings) deliver again
/// later.
///
/// **Not for batch handlers** (SQS, Kinesis, DynamoDB Streams, Kafka):
/// their response is a partial batch response, and a stored one replayed to
/// the batch's retry would tell Lambda that the failed records failed
/// again, without running them. Use [`Batch`](super::Batch), which makes
/// each record idempotent.
///
/// ```
/// use lambda_idempotency::{consumers::IdempotentEventLayer, Engine, Fingerprint, MemoryStore};
/// use lambda_runtime::{service_fn, Error, LambdaEvent};
/// use serde::{Deserialize, Serialize};
/// use tower::ServiceBuilder;
///
/// #[derive(Deserialize, Serialize)]
/// struct OrderPlaced { order_id: String, total: u64, sent_at: String }
///
/// async fn handle(event: LambdaEvent<OrderPlaced>) -> Result<String, Error> {
///     Ok(format!("invoiced {}", event.payload.order_id))
/// }
///
/// let engine = Engine::builder(MemoryStore::new()).build();
/// let handler = ServiceBuilder::new()
///     .layer(
///         IdempotentEventLayer::new(engine, "order-placed")
///             .key(|order: &OrderPlaced| Some(order.order_id.clone()))
///             // A producer's resend differs in `sent_at` only: leave it out.
///             .fingerprint(|order: &OrderPlaced| Fingerprint::of_parts([order.order_id.as_bytes(), &order.total.to_be_bytes()])),
///     )
///     .service(service_fn(handle));
/// // lambda_runtime::run(handler).await
/// # let _ = handler;
/// ```
pub struct IdempotentEventLayer<St, E> {
    config: Config<St, E>,
}

impl<St: Store, E: serde::Serialize + 'static> IdempotentEventLayer<St, E> {
    /// A layer over `engine`, for events whose keys live in `scope` (name
    /// the function or the event type: keys from different sources must
    /// not meet). Set the key with [`key`](IdempotentEventLayer::key); by
    /// default the whole event is fingerprinted as canonical JSON
    /// ([`Fingerprint::of_json`]); an event that cannot be serialised as JSON
    /// is then refused with an error, unprocessed: give such events a
    /// [`fingerprint`](IdempotentEventLayer::fingerprint) closure.
    pub fn new(engine: Engine<St>, scope: impl Into<Arc<str>>) -> Self {
        Self {
            config: Config::new(engine, scope.into()),
        }
    }
}

impl<St, E> IdempotentEventLayer<St, E> {
    /// The idempotency key of an event: a business identifier (an order id,
    /// a payment id) so that a producer's second send is caught too, or the
    /// delivery's id. `None` means the event has no key (see
    /// [`require_key`](IdempotentEventLayer::require_key)).
    pub fn key(mut self, key: impl Fn(&E) -> Option<String> + Send + Sync + 'static) -> Self {
        self.config.key = Some(Arc::new(key));
        self
    }

    /// The part of the event that must match for a redelivery to be a
    /// replay (default: the whole event, as canonical JSON). Leave out what
    /// changes between two sends of the same thing, such as timestamps.
    pub fn fingerprint(
        mut self,
        fingerprint: impl Fn(&E) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.config.fingerprint = Arc::new(move |event: &E| Ok(fingerprint(event)));
        self
    }

    /// Whether an event without a key is an error (`true`, the default) or
    /// handled without idempotency.
    pub fn require_key(mut self, required: bool) -> Self {
        self.config.require_key = required;
        self
    }

    /// Stores the handler's output without the JSON fields `redaction`
    /// names (removed, or replaced): the first delivery's caller gets the
    /// whole output, a retried invocation the redacted one, and it must
    /// still read as the output's type ([`RedactedJson`](crate::RedactedJson)).
    /// See [`redaction`](crate::redaction) for what a retry receives and
    /// why that is safe.
    pub fn redact_json(mut self, redaction: crate::JsonRedaction) -> Self {
        self.config.codec = crate::RedactedJson(redaction);
        self
    }
}

impl<St: crate::store::TransactionalStore, E> IdempotentEventLayer<St, E> {
    /// Runs the handler **inside the store transaction** that holds the
    /// event's claim ([`Engine::run_in_transaction`]; PostgreSQL's): the
    /// handler takes it with its store's `current()` (PostgreSQL's
    /// [`PgTransaction::current`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/struct.PgTransaction.html#method.current))
    /// and reads, locks and writes through it; its result completes the
    /// record in that transaction. An error, a panic or a crash rolls
    /// everything back and leaves the key free (the redelivery runs it as
    /// a first attempt); a duplicate delivery while it runs is told the key
    /// is in progress after at most `limits`' claim wait; past the time
    /// limit, the handler is stopped and rolled back.
    pub fn in_transaction(mut self, limits: crate::store::TransactionLimits) -> Self {
        let store = self.config.engine.store();
        store.expect_open_at_once(crate::engine::transactions_at_once(1));
        self.config.in_transaction = Some(limits);
        self
    }
}

impl<St, E> Clone for IdempotentEventLayer<St, E> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
        }
    }
}

impl<St, E, S> Layer<S> for IdempotentEventLayer<St, E> {
    type Service = IdempotentEvent<S, St, E>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotentEvent::new(inner, Arc::new(self.config.clone()))
    }
}

impl<St: fmt::Debug, E> fmt::Debug for IdempotentEventLayer<St, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentEventLayer")
            .field("engine", &self.config.engine)
            .field("scope", &self.config.scope)
            .field("require_key", &self.config.require_key)
            .finish_non_exhaustive()
    }
}
