//! The layer's configuration, shared by the layer and every service it
//! makes, and its defaults.

use super::stored_body::StoredBody;
use super::{
    body::DEFAULT_BODY_LIMIT, fingerprint::FingerprintSource, grpc::default_grpc_store_policy,
    idempotency_key::KeySource, in_flight::Slots, problem::DEFAULT_PROBLEM_BASE,
    retry_after::Durations, retry_after::RetryAfter, stored::ResponseCodec, EmfMetrics,
};
use crate::{Engine, Mode, Replayed};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode};
use std::{sync::Arc, time::Duration};

/// The default key header, as the IETF draft names it.
pub const DEFAULT_HEADER: &str = "idempotency-key";

/// The header that marks a replayed response, by default
/// ([`replayed_header`](super::IdempotencyLayer::replayed_header)).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The default outcome policy: which handler responses are stored and
/// replayed.
///
/// Stored: 2xx, 3xx and the deterministic 4xx (a 400 for a bad body is the
/// answer to that body, every time). Released, so a retry runs again: 5xx;
/// the 4xx that say "try again" (408 Request Timeout, 409 Conflict,
/// 425 Too Early, 429 Too Many Requests); and the 4xx about credentials
/// (401 Unauthorized, 403 Forbidden, 407 Proxy Authentication Required):
/// credentials are in neither the scope nor the fingerprint when no
/// authorizer checks them, so a retry with a fresh token must not be
/// answered with the 401 its expired one got; and the 4xx about headers
/// the fingerprint leaves out (406 Not Acceptable, 415 Unsupported Media
/// Type, axum's `Json` rejection of a body without
/// `Content-Type: application/json`), so the retry that fixes the header
/// runs rather than getting the old answer replayed; and 405 Method Not
/// Allowed, which axum's router answers for a method the route does not
/// serve (a router layered with `Router::route_layer` passes those requests
/// through the layer): nothing ran, and the route may serve the method
/// after a deployment.
pub fn default_store_policy(status: StatusCode) -> bool {
    !(status.is_server_error()
        || matches!(
            status.as_u16(),
            401 | 403 | 405 | 406 | 407 | 408 | 409 | 415 | 425 | 429
        )
        || status.is_informational())
}

pub(crate) type ScopeFn = Arc<dyn Fn(&Request<Bytes>) -> String + Send + Sync>;
pub(crate) type CallerFn = Arc<dyn Fn(&Request<Bytes>) -> Option<String> + Send + Sync>;
pub(crate) type StreamFn = Arc<dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync>;

/// How the layer scopes a request's key.
#[derive(Clone)]
pub(crate) enum ScopeRule {
    /// The [default scope](super::default_scope) for a request with a Lambda
    /// request context; any other request is refused (`500`), since nothing
    /// names its caller.
    LambdaContext,
    /// The default scope, with the caller this function names.
    Caller(CallerFn),
    /// The default scope, every request without a Lambda context
    /// anonymous: the callers share records (a single-tenant service).
    Shared,
    /// This function's scope, whole.
    Custom(ScopeFn),
}
pub(crate) type PolicyFn = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;
/// The application's answer to a refused write of its own.
pub(crate) type RefusalFn =
    Arc<dyn Fn(&crate::WriteRefusal) -> Option<http::Response<super::StoredBody>> + Send + Sync>;
pub(crate) type GrpcPolicyFn = Arc<dyn Fn(u32) -> bool + Send + Sync>;
pub(crate) type ReplayHook = Arc<dyn Fn(&mut Response<StoredBody>, &Replayed) + Send + Sync>;

/// Everything an [`IdempotencyLayer`](super::IdempotencyLayer) is
/// configured with: the engine, and the settings, which do not depend on
/// the store.
pub(crate) struct Config<St> {
    pub(crate) engine: Engine<St>,
    pub(crate) settings: Settings,
}

impl<St> Config<St> {
    pub(crate) fn new(engine: Engine<St>) -> Self {
        Self {
            engine,
            settings: Settings::default(),
        }
    }
}

// Not derived: the store need not be `Clone` (the engine shares it).
impl<St> Clone for Config<St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            settings: self.settings.clone(),
        }
    }
}

/// The layer's settings, every one but the engine.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) require_key: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) key: KeySource,
    pub(crate) fingerprint: FingerprintSource,
    pub(crate) replayed_header: HeaderName,
    /// Whether a record keeps the trace context of the work that ran.
    pub(crate) keep_trace_context: bool,
    /// Where a replay names that trace context, if anywhere.
    pub(crate) replay_trace_header: Option<HeaderName>,
    pub(crate) body_limit: usize,
    pub(crate) store_when: PolicyFn,
    /// For gRPC responses, by their `grpc-status`, after `store_when`.
    pub(crate) grpc_store_when: GrpcPolicyFn,
    pub(crate) on_replay: Option<ReplayHook>,
    pub(crate) codec: ResponseCodec,
    pub(crate) wait: Option<Duration>,
    /// What a duplicate of a request in progress is told to wait.
    pub(crate) retry_after: RetryAfter,
    /// How long each route's requests take, shared by every clone.
    pub(crate) durations: Durations,
    pub(crate) mode: Mode,
    pub(crate) single_write: bool,
    pub(crate) scope: ScopeRule,
    /// Responses passed through from their first byte (besides
    /// `text/event-stream` and the [`StreamResponse`](super::StreamResponse)
    /// marker).
    pub(crate) stream_when: Option<StreamFn>,
    /// The claimed requests' detached work and its bound, shared by every
    /// clone.
    pub(crate) in_flight: Slots,
    pub(crate) metrics: Option<EmfMetrics>,
    pub(crate) problem_base: String,
    #[cfg(feature = "powertools")]
    pub(crate) powertools: Option<Arc<crate::powertools::PowertoolsCompat>>,
    /// The handler inside the store transaction that holds its claim.
    pub(crate) in_transaction: Option<InTransaction>,
    /// The application's answers to refusals of its `CommitWith` writes.
    pub(crate) on_write_refusal: Option<RefusalFn>,
}

/// The handler inside the store transaction that holds its claim
/// ([`IdempotencyLayer::in_transaction`](super::IdempotencyLayer::in_transaction)):
/// its bounds, and how the request is handed the transaction.
#[derive(Clone, Copy)]
pub(crate) struct InTransaction {
    pub(crate) limits: crate::store::TransactionLimits,
    /// Puts the claim's transaction into the request's extensions as its
    /// store's own type (axum: `Extension<PgTransaction>`).
    pub(crate) hand_over: fn(&crate::ClaimHandle, &mut http::Extensions),
}

impl InTransaction {
    pub(crate) fn of<St: crate::store::TransactionalStore>(
        limits: crate::store::TransactionLimits,
    ) -> Self {
        Self {
            limits,
            hand_over: |claim, extensions| {
                if let Some(transaction) = claim.transaction::<St::Transaction>() {
                    extensions.insert(transaction.clone());
                }
            },
        }
    }
}

impl Default for Settings {
    /// Key required on POST and PATCH in the `Idempotency-Key` header, the
    /// default outcome policy, stored headers and scope, no waiting, plain
    /// mode.
    fn default() -> Self {
        Self {
            require_key: true,
            methods: vec![Method::POST, Method::PATCH],
            key: KeySource::header(HeaderName::from_static(DEFAULT_HEADER)),
            fingerprint: FingerprintSource::default(),
            replayed_header: HeaderName::from_static(REPLAYED_HEADER),
            keep_trace_context: false,
            replay_trace_header: None,
            body_limit: DEFAULT_BODY_LIMIT,
            store_when: Arc::new(default_store_policy),
            grpc_store_when: Arc::new(default_grpc_store_policy),
            on_replay: None,
            codec: ResponseCodec::default(),
            wait: None,
            retry_after: RetryAfter::default(),
            durations: Durations::default(),
            mode: Mode::Plain,
            single_write: false,
            scope: ScopeRule::LambdaContext,
            stream_when: None,
            in_flight: Slots::default(),
            metrics: None,
            problem_base: DEFAULT_PROBLEM_BASE.to_owned(),
            #[cfg(feature = "powertools")]
            powertools: None,
            in_transaction: None,
            on_write_refusal: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_stores_deterministic_answers_only() {
        for stored in [200, 201, 204, 301, 400, 404, 410, 422] {
            assert!(
                default_store_policy(StatusCode::from_u16(stored).unwrap()),
                "{stored}"
            );
        }
        for released in [401, 403, 405, 407, 408, 409, 425, 429, 500, 502, 503, 504] {
            assert!(
                !default_store_policy(StatusCode::from_u16(released).unwrap()),
                "{released}"
            );
        }
    }
}
