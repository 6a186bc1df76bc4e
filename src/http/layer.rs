//! [`IdempotencyLayer`]: the layer, configured with builder methods.

use super::stored_body::StoredBody;
use super::{
    config::{Config, ScopeRule},
    fingerprint::FingerprintSource,
    idempotency_key::KeySource,
    in_flight::InFlight,
    retry_after::RetryAfter,
    service::Idempotency,
    stored::{StoredBodies, MAX_STORED_RESPONSE},
};
use crate::{store::Store, EmfMetrics, Engine, JsonRedaction, Mode, Replayed};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode};
use std::{fmt, sync::Arc, time::Duration};
use tower::Layer;

/// Makes an HTTP service idempotent (`lambda_http`, axum, hyper, any
/// `http::Request<B>` with `B: http_body::Body`): see the [module docs](super).
///
/// Configure it with its builder methods; every setting has a default.
pub struct IdempotencyLayer<St> {
    pub(crate) config: Config<St>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
        }
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `engine`, with the defaults: key required on POST and
    /// PATCH in the `Idempotency-Key` header, the [default outcome
    /// policy](super::default_store_policy), the [default stored
    /// headers](super::default_stored_headers), no waiting (a duplicate of a
    /// request in progress gets 409), the [default scope](super::default_scope)
    /// for requests with a Lambda request context (outside Lambda, choose
    /// [`caller`](Self::caller) or [`shared_scope`](Self::shared_scope)).
    pub fn new(engine: Engine<St>) -> Self {
        Self {
            config: Config::new(engine),
        }
    }

    /// Whether a request of an idempotent method without a key is rejected
    /// with 400 (`true`, the default) or passed through without idempotency.
    pub fn require_key(mut self, required: bool) -> Self {
        self.config.settings.require_key = required;
        self
    }

    /// The methods made idempotent (default POST and PATCH). Requests with
    /// other methods pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.settings.methods = methods.into_iter().collect();
        self
    }

    /// The header carrying the key (default `Idempotency-Key`): short for
    /// [`key_source`](Self::key_source)`(KeySource::header(name))`.
    pub fn header(mut self, name: HeaderName) -> Self {
        self.config.settings.key = KeySource::header(name);
        self
    }

    /// Where the key is read (default: the `Idempotency-Key` header): a
    /// header, a field of a JSON body, or any function of the request. See
    /// [`KeySource`].
    pub fn key_source(mut self, source: KeySource) -> Self {
        self.config.settings.key = source;
        self
    }

    /// What must match for a retry to count as the same request (default:
    /// the whole request, [`request_fingerprint`](super::request_fingerprint)):
    /// a selection of the JSON body, or any function of the request. See
    /// [`FingerprintSource`] for when to narrow it.
    pub fn fingerprint_source(mut self, source: FingerprintSource) -> Self {
        self.config.settings.fingerprint = source;
        self
    }

    /// The header that marks a replayed response (default
    /// [`Idempotent-Replayed`](super::REPLAYED_HEADER)`: true`).
    pub fn replayed_header(mut self, name: HeaderName) -> Self {
        self.config.settings.replayed_header = name;
        self
    }

    /// Keeps, with each record, the trace context of the request that ran
    /// (see [`TraceContext`](super::TraceContext)): with the
    /// `opentelemetry` feature, the layer's span's; otherwise the request's
    /// `traceparent` header, or X-Ray's `X-Amzn-Trace-Id` when it names a
    /// span, or in Lambda the invocation's own X-Ray header. A replay then
    /// points to the work it replays: its span records it
    /// (`idempotency.replay_of`) and, with the `opentelemetry` feature,
    /// links to it; the replayed response's extensions hold it; and a
    /// header names it, if [`replay_trace_header`](Self::replay_trace_header)
    /// says which.
    ///
    /// Off by default. A record that keeps one is written in a newer
    /// format (version 3) that versions of this crate before it refuse as
    /// corrupt: turn it on once every instance that reads the table runs
    /// a version that reads it. Kept for responses stored whole or
    /// redacted, not for those whose body is not stored. Encrypted with
    /// the response when encryption is on.
    pub fn keep_trace_context(mut self) -> Self {
        self.config.settings.keep_trace_context = true;
        self
    }

    /// Names, in this header of each replay, the trace context of the work
    /// it replays (a `traceparent` value), for a client or a support tool
    /// to follow; the
    /// [`keep_trace_context`](Self::keep_trace_context) it needs is turned
    /// on with it. Off by default: a trace id tells a client something of
    /// the server's tracing it may not need to know.
    pub fn replay_trace_header(mut self, name: HeaderName) -> Self {
        self.config.settings.keep_trace_context = true;
        self.config.settings.replay_trace_header = Some(name);
        self
    }

    /// The most bytes of a request body the layer reads (default
    /// [`DEFAULT_BODY_LIMIT`](super::DEFAULT_BODY_LIMIT), 6 MiB, Lambda's
    /// own limit). The layer buffers the whole body of each request it makes
    /// idempotent, to fingerprint it, before the handler runs; a longer one
    /// is answered `413` and nothing runs. Requests it passes through are
    /// not read.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.config.settings.body_limit = bytes;
        self
    }

    /// Which handler responses are stored and replayed; the others release
    /// the claim so a retry runs again (default: [`default_store_policy`](super::default_store_policy)).
    /// The layer's own rejections (400, 409, 422, 503) are never stored.
    pub fn store_when(
        mut self,
        policy: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.config.settings.store_when = Arc::new(policy);
        self
    }

    /// Which gRPC responses are stored and replayed, by their `grpc-status`
    /// (default: [`default_grpc_store_policy`](super::default_grpc_store_policy));
    /// the others release the claim so a retry runs again. A gRPC error
    /// travels on an HTTP 200, so [`store_when`](Self::store_when) sees
    /// `200` and passes it here. The layer's own gRPC answers are never
    /// stored.
    pub fn grpc_store_when(mut self, policy: impl Fn(u32) -> bool + Send + Sync + 'static) -> Self {
        self.config.settings.grpc_store_when = Arc::new(policy);
        self
    }

    /// The response headers stored and replayed (default:
    /// [`default_stored_headers`](super::default_stored_headers)); others are dropped from replays. The
    /// [`BODY_HEADERS`](super::BODY_HEADERS) are stored in any case.
    pub fn stored_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.settings.codec.stored_headers = names.into_iter().collect();
        self
    }

    /// While another request with the key is in progress, wait up to
    /// `budget` for its result and replay it, instead of answering 409 at
    /// once, never past the invocation's deadline less 500 ms. When that
    /// request runs in this process (a duplicate that reached the same
    /// server, or another worker of a Lambda Managed Instance), the wait is
    /// on the request itself, in memory: no store call until it ends, and
    /// its replay as soon as it completes (not in
    /// [`single_write`](Self::single_write) mode, which holds no claim
    /// while the handler runs). When it runs elsewhere, the
    /// store is asked again after 50 ms, then after twice as long each time
    /// up to 1 s (never longer than the `Retry-After` the
    /// [`in_progress_retry_after`](Self::in_progress_retry_after) setting
    /// gives). Once the budget is spent, the answer is the `409` with its
    /// `Retry-After`.
    /// The waiting request holds its connection and its place in
    /// [`max_in_flight`](Self::max_in_flight) meanwhile; without this
    /// setting (the default) the client waits instead, as `Retry-After`
    /// says.
    pub fn wait_for_result(mut self, budget: Duration) -> Self {
        self.config.settings.wait = Some(budget);
        self
    }

    /// What the `Retry-After` of a `409` in progress says (default
    /// [`RetryAfter::estimated`]`(`[`DEFAULT_FIRST_RETRY_AFTER`](super::DEFAULT_FIRST_RETRY_AFTER)`)`):
    /// the time left of the route's typical duration, measured from its
    /// completed requests. Always whole seconds, at least 1, never more
    /// than the time left on the running request's lease. See
    /// [`RetryAfter`] and [Retry-After](super#retry-after).
    pub fn in_progress_retry_after(mut self, retry_after: RetryAfter) -> Self {
        self.config.settings.retry_after = retry_after;
        self
    }

    /// Answers the business-rule refusals of the handler's
    /// [`CommitWith`](super::CommitWith) writes as the application chooses,
    /// instead of a 500 `idempotency-write-rejected`: when the store
    /// refuses one of them (a PostgreSQL constraint or SQLSTATE, a
    /// DynamoDB condition on a business item: see [`WriteRefusal`]),
    /// `answer` is asked; a response it returns (a 409 or 422 problem, say)
    /// is the request's, stored or not by the
    /// [outcome policy](IdempotencyLayer::store_when) like any other
    /// response, and committed without any of the writes. `None` leaves it
    /// a fault (500, the claim released).
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use lambda_idempotency::{http::{IdempotencyLayer, StoredBody}, Engine, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
    ///     .on_write_refusal(|refusal| {
    ///         (refusal.constraint.as_deref() == Some("accounts_balance_not_negative")
    ///             || refusal.code == "ConditionalCheckFailed")
    ///             .then(|| {
    ///                 Response::builder()
    ///                     .status(StatusCode::UNPROCESSABLE_ENTITY)
    ///                     .header("content-type", "application/problem+json")
    ///                     .body(StoredBody::from(r#"{"type":"insufficient-funds","status":422}"#))
    ///                     .ok()
    ///             })
    ///             .flatten()
    ///     });
    /// # let _ = layer;
    /// ```
    ///
    /// With `in_transaction` too (the PostgreSQL store): a
    /// refused `CommitWith` write is rolled back to the claim and the
    /// answer stored. Not in [`single_write`](IdempotencyLayer::single_write)
    /// (a refused single write is still an error).
    ///
    /// [`WriteRefusal`]: crate::WriteRefusal
    pub fn on_write_refusal(
        mut self,
        answer: impl Fn(&crate::WriteRefusal) -> Option<Response<StoredBody>> + Send + Sync + 'static,
    ) -> Self {
        self.config.settings.on_write_refusal = Some(Arc::new(answer));
        self
    }

    /// How the handler's outcome is committed (default [`Mode::Plain`]).
    ///
    /// Declare [`Mode::Transactional`] when the handler commits its effects
    /// with [`CommitWith`](super::CommitWith). Such a handler then never
    /// runs without the store: with an engine that
    /// [fails open](crate::EngineBuilder::fail_open), a store outage is a
    /// 503 before the handler runs, instead of a run whose writes cannot be
    /// committed.
    ///
    /// Undeclared, a handler that returns `CommitWith` during an outage
    /// with fail-open has run, but nothing it wrote is committed: the
    /// client gets a 503 `idempotency-writes-not-committed` that says so.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.config.settings.mode = mode;
        self
    }

    /// Commits each request in **one** store write: the handler runs first,
    /// then its response and its [`CommitWith`](super::CommitWith) writes
    /// are committed together, conditioned as a claim is (see
    /// [`Engine::run_single_write`](crate::Engine::run_single_write)). A
    /// first request costs one DynamoDB call instead of two, a replay one.
    ///
    /// **Only for handlers whose sole effect is their `CommitWith` writes.**
    /// Concurrent duplicates may each run the handler; one commits and the
    /// others replay its response, and a retry of a completed request runs
    /// the handler before it is answered with the replay (unless the
    /// engine reads first,
    /// [`read_before_claim`](crate::EngineBuilder::read_before_claim), and
    /// the read sees the completion). A handler that
    /// calls a payment provider, sends a message or writes anything else
    /// must not use it. Supersedes [`mode`](IdempotencyLayer::mode).
    ///
    /// Only stores whose [`Store::SINGLE_WRITE`] is `true` have it: with
    /// another store this does not compile.
    pub fn single_write(mut self) -> Self {
        const {
            assert!(
                St::SINGLE_WRITE,
                "this store cannot commit in a single write: use IdempotencyLayer::mode"
            )
        };
        self.config.settings.single_write = true;
        self
    }

    /// Adjusts every replayed response before it is sent (Powertools'
    /// `response_hook`), with what is known of the record it came from:
    /// for example a header with the original request's time. The
    /// `Idempotent-Replayed: true` header is already set.
    ///
    /// ```
    /// use lambda_http::http::HeaderValue;
    /// use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
    ///     .on_replay(|response, replayed| {
    ///         if let Some(at) = replayed.completed_at_ms {
    ///             response.headers_mut().insert("x-original-completed-at-ms", HeaderValue::from(at));
    ///         }
    ///     });
    /// # let _ = layer;
    /// ```
    pub fn on_replay(
        mut self,
        hook: impl Fn(&mut Response<StoredBody>, &Replayed) + Send + Sync + 'static,
    ) -> Self {
        self.config.settings.on_replay = Some(Arc::new(hook));
        self
    }

    /// Names the caller of a request, outside Lambda: from what your
    /// authentication middleware (layered outside this one, so it runs
    /// first) put in the request's extensions, never from a header the
    /// client controls. The scope is then the
    /// caller, the entry point and the [route](super::route), as
    /// [`default_scope`] makes it from a Lambda authorizer, so routes never
    /// share records whatever the function returns.
    ///
    /// A request for which `caller` returns `None` is refused with a `500`
    /// problem (`idempotency-scope-unset`) and an error in the log, and
    /// nothing runs: most often the authentication middleware was layered
    /// inside this one, so it had not run yet, and treating every such
    /// request as one anonymous caller would share one caller's results
    /// with the next. A service that also serves anonymous callers returns a
    /// name for them (`Some("anonymous".into())`): they share records.
    ///
    /// Without this, [`scope`](Self::scope) or
    /// [`shared_scope`](Self::shared_scope), a request without a Lambda
    /// request context is refused the same way: nothing could tell its
    /// caller from another's. See [Outside Lambda](super#outside-lambda).
    ///
    /// [`default_scope`]: super::default_scope
    pub fn caller(
        mut self,
        caller: impl Fn(&Request<Bytes>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.config.settings.scope = ScopeRule::Caller(Arc::new(caller));
        self
    }

    /// Declares that every caller without a Lambda request context shares
    /// records: a single-tenant service, or one whose keys are unique
    /// across callers by construction. The scope is then the
    /// [`ANONYMOUS`](super::ANONYMOUS) caller, the entry point and the
    /// [route](super::route). Two clients that send the same key and body
    /// to the same route get one response: the second gets the first's.
    /// Requests with a Lambda request context are scoped by their caller as
    /// always.
    pub fn shared_scope(mut self) -> Self {
        self.config.settings.scope = ScopeRule::Shared;
        self
    }

    /// Derives the whole scope of a request's key (default: [`default_scope`],
    /// from the Lambda authorizer context and the route). Use only trusted
    /// request data: never a header the client controls; and put the
    /// [route](super::route) in it, or two routes share records. Most
    /// services want [`caller`](Self::caller), which only names the caller.
    ///
    /// The request's body is there too, read whole; it is rarely what a
    /// scope should depend on.
    ///
    /// [`default_scope`]: super::default_scope
    pub fn scope(
        mut self,
        scope: impl Fn(&Request<Bytes>) -> String + Send + Sync + 'static,
    ) -> Self {
        self.config.settings.scope = ScopeRule::Custom(Arc::new(scope));
        self
    }

    /// Which responses pass through from their first byte, besides
    /// `text/event-stream` and those whose extensions hold a
    /// [`StreamResponse`](super::StreamResponse): a response this predicate
    /// selects (by status and headers) is not read by the layer. Its record
    /// completes as soon as its head is known, without its body, so retries
    /// get the [not-stored answer](super#what-is-stored) and it never runs
    /// again.
    pub fn stream_when(
        mut self,
        streams: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.config.settings.stream_when = Some(Arc::new(streams));
        self
    }

    /// The work of requests that have claimed their key, which runs to its
    /// end even when the request's future is dropped (a client that
    /// disconnects, a `TimeoutLayer`): wait for it at graceful shutdown.
    /// Every service this layer (or a clone of it) makes shares it.
    pub fn in_flight(&self) -> InFlight {
        InFlight::new(&self.config.settings.in_flight)
    }

    /// The most requests that run at once from their claim to their answer
    /// (default [`DEFAULT_MAX_IN_FLIGHT`](super::DEFAULT_MAX_IN_FLIGHT),
    /// 1,024; at least 1). A request that finds that many running is
    /// answered `503` with `Retry-After: 1` (`idempotency-overloaded`)
    /// before it claims its key: nothing is recorded, and a retry with the
    /// same key runs as if it were the first.
    ///
    /// Why a bound: once claimed, a request's work runs to its end on a
    /// task of its own even when its client leaves (see [When the client
    /// leaves](super#when-the-client-leaves)), so nothing else bounds it: a
    /// connection limit counts connections, and a client that sends and
    /// hangs up frees its own at once while its handler, holding its
    /// request body (up to the [body limit](Self::body_limit)), keeps
    /// running. 2,000 clients that did so with 64 KiB bodies left 1,694
    /// handlers running and took a server to 283 MB. The default is far
    /// above what a process serves at once against a store (1,024 requests
    /// of 100 ms each are 10,000 a second) and still bounds what a flood
    /// can hold. In Lambda an execution environment serves one request at
    /// a time, and the bound is never reached.
    ///
    /// The count is [`InFlight::len`](super::InFlight::len) (see
    /// [`in_flight`](Self::in_flight)), recorded as `in_flight` on the
    /// layer's `idempotency` span; refusals are
    /// [`HttpOutcome::Overloaded`](super::HttpOutcome::Overloaded). Every
    /// service made by this layer or its clones shares one count, and the
    /// last bound set on any of them applies to the services it makes.
    pub fn max_in_flight(mut self, requests: usize) -> Self {
        self.config.settings.in_flight.max = requests.max(1);
        self
    }

    /// The prefix of every problem `type` (default
    /// `urn:lambda-idempotency:problem:`), for example
    /// `https://api.example.com/problems/`.
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.config.settings.problem_base = base.into();
        self
    }

    /// Compress stored bodies longer than `bytes` (default 4 KiB).
    pub fn compress_above(mut self, bytes: usize) -> Self {
        self.config.settings.codec.compress_above = bytes;
        self
    }

    /// The largest stored response, in bytes (default and maximum:
    /// [`MAX_STORED_RESPONSE`], what fits in a DynamoDB item). A larger
    /// response is returned to its caller, but retries get its status and
    /// stored headers with a problem body explaining that it was processed;
    /// it never runs again.
    pub fn max_stored_response(mut self, bytes: usize) -> Self {
        self.config.settings.codec.max_stored = bytes.min(MAX_STORED_RESPONSE);
        self
    }

    /// Stores each response as `redact` leaves a copy of it (its status,
    /// headers and body), for what must never be stored: the first caller
    /// gets the response whole, every retry the redacted copy, marked
    /// replayed. The hook runs once a response, when it is stored, on a
    /// response the outcome policy stores. See [Redaction](super#redaction)
    /// for what a retry receives and why that is safe.
    ///
    /// The hook sees every response the layer records, those it keeps the
    /// head of only (a stream, a response too large: their headers), and
    /// a response's trailers (gRPC's) in its extensions, as an
    /// `http::HeaderMap` to edit or remove. If `redact` returns an error or
    /// panics, the record keeps the status and the body's SHA-256 only
    /// (a retry gets what [`withhold_bodies`](Self::withhold_bodies) gives,
    /// without the stored headers): never what the hook was to take out. A
    /// WARN says so.
    ///
    /// ```
    /// use lambda_idempotency::{http::{IdempotencyLayer, StoredBody}, Engine, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
    ///     .redact(|response| {
    ///         // A one-time download link is never replayed.
    ///         response.headers_mut().remove("x-download-url");
    ///         Ok(())
    ///     });
    /// # let _ = layer;
    /// ```
    pub fn redact(
        mut self,
        redact: impl Fn(&mut Response<StoredBody>) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.config.settings.codec.bodies = StoredBodies::Redacted(Arc::new(redact));
        self
    }

    /// Stores each JSON response with the fields `redaction` names removed
    /// or replaced, as [`redact`](Self::redact) does with a hook: the first
    /// caller gets the whole response, retries the redacted one.
    ///
    /// The stored body is the JSON written again, compact (its whitespace
    /// and the order of its members may differ from the original's). A
    /// response with a body this cannot read as JSON (a content type that
    /// is not JSON, a `Content-Encoding`, a body that does not parse, a
    /// number the JSON written again would round: an integer past 64 bits,
    /// a decimal with more digits than a double keeps) is
    /// not stored with its body: its record keeps its status and the
    /// body's digest, so that a field meant to be removed is never stored
    /// in a form the redaction missed.
    /// A response with an empty body is stored as it is.
    ///
    /// ```
    /// use lambda_idempotency::{http::IdempotencyLayer, Engine, JsonPointer, JsonRedaction, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).redact_json(
    ///     JsonRedaction::new()
    ///         .remove(JsonPointer::new("/client_secret")?)
    ///         .replace(JsonPointer::new("/card/number")?, "************4242"),
    /// );
    /// # let _ = layer;
    /// # Ok::<(), lambda_idempotency::InvalidJsonPointer>(())
    /// ```
    pub fn redact_json(self, redaction: JsonRedaction) -> Self {
        self.redact(move |response| redact_json_body(&redaction, response))
    }

    /// Stores no response body: each record keeps the response's status,
    /// its stored headers and the SHA-256 of its body. The first caller
    /// gets the whole response; a retry gets the original status and
    /// stored headers (a `Location` among them, by default) with a
    /// `problem+json` body of type `idempotency-response-not-stored` whose
    /// `response_digest` member is the body's digest (`sha-256=:…:`, the
    /// form of RFC 9530's `Repr-Digest`); a gRPC retry gets
    /// `ALREADY_EXISTS` with the digest in its
    /// `idempotency-response-digest` metadata. The request is never run
    /// again. See [Redaction](super#redaction).
    pub fn withhold_bodies(mut self) -> Self {
        self.config.settings.codec.bodies = StoredBodies::Withheld;
        self
    }

    /// Powertools compatibility, for a migration window: before claiming a
    /// request, read the record Powertools wrote for it; a completed one
    /// is replayed (its proxy response, with the `idempotent-replayed`
    /// header), one in progress answers 409, an abandoned one lets the
    /// request run as its takeover ([`Takeover`](crate::Takeover) in the
    /// request's extensions). Runs on every request of an idempotent
    /// method, with or without a key header (Powertools may have keyed on
    /// the body: a request without this crate's key is answered from
    /// Powertools' record before `require_key` refuses it or it passes
    /// through), unless the local cache answers it. See
    /// [`crate::powertools`].
    ///
    /// # Panics
    ///
    /// When a key or validation expression reads what the layer does not
    /// see of a request (the whole event, `requestContext`, ...): such a
    /// record would never be found, and every retry would run again.
    /// [`try_powertools`](Self::try_powertools) returns the error instead.
    ///
    /// ```should_panic
    /// # use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore, StoreError};
    /// # use lambda_idempotency::powertools::{PowertoolsCompat, PowertoolsLayout, PowertoolsRecord, PowertoolsRecords};
    /// # use std::{future::Future, pin::Pin};
    /// # #[derive(Debug)]
    /// # struct Reader; // a DynamoDbStore or a RedisStore, in a real function
    /// # impl PowertoolsRecords for Reader {
    /// #     fn read_powertools_record<'a>(&'a self, _: &'a str, _: &'a PowertoolsLayout)
    /// #         -> Pin<Box<dyn Future<Output = Result<Option<PowertoolsRecord>, StoreError>> + Send + 'a>> {
    /// #         Box::pin(async { Ok(None) })
    /// #     }
    /// # }
    /// let compat = PowertoolsCompat::new(Reader, "orders", "app.lambda_handler")
    ///     .event_key_jmespath("requestContext.requestId")
    ///     .unwrap();
    /// let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build());
    /// let _ = layer.powertools(compat); // panics: requestContext changes with every retry
    /// ```
    #[cfg(feature = "powertools")]
    #[cfg_attr(docsrs, doc(cfg(feature = "powertools")))]
    #[track_caller]
    pub fn powertools(self, compat: crate::powertools::PowertoolsCompat) -> Self {
        match self.try_powertools(compat) {
            Ok(layer) => layer,
            Err(error) => panic!("{error}"),
        }
    }

    /// Like [`powertools`](Self::powertools), with an error for an
    /// `event_key_jmespath` or `payload_validation_jmespath` the layer
    /// cannot evaluate as Powertools did over the API Gateway event. It
    /// reads `headers.<name>`, `queryStringParameters.<name>` (or the whole
    /// map) and `body`, in paths, lists of paths and after
    /// `powertools_json(...)`; the whole event, `requestContext.*` (API
    /// Gateway's request id and time change with every retry), the whole
    /// `headers` map and any other field are refused. A closure
    /// ([`event_key`](crate::powertools::PowertoolsCompat::event_key)) is
    /// not checked.
    ///
    /// ```
    /// # use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore, StoreError};
    /// # use lambda_idempotency::powertools::{PowertoolsCompat, PowertoolsLayout, PowertoolsRecord, PowertoolsRecords};
    /// # use std::{future::Future, pin::Pin};
    /// # #[derive(Debug)]
    /// # struct Reader; // a DynamoDbStore or a RedisStore, in a real function
    /// # impl PowertoolsRecords for Reader {
    /// #     fn read_powertools_record<'a>(&'a self, _: &'a str, _: &'a PowertoolsLayout)
    /// #         -> Pin<Box<dyn Future<Output = Result<Option<PowertoolsRecord>, StoreError>> + Send + 'a>> {
    /// #         Box::pin(async { Ok(None) })
    /// #     }
    /// # }
    /// let compat = PowertoolsCompat::new(Reader, "orders", "app.lambda_handler")
    ///     .event_key_jmespath("requestContext.requestId")
    ///     .unwrap();
    /// let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build());
    /// let error = layer.try_powertools(compat).unwrap_err();
    /// assert_eq!(error.expression(), "requestContext.requestId");
    /// assert!(error.to_string().contains("change with every retry"));
    /// ```
    #[cfg(feature = "powertools")]
    #[cfg_attr(docsrs, doc(cfg(feature = "powertools")))]
    pub fn try_powertools(
        mut self,
        compat: crate::powertools::PowertoolsCompat,
    ) -> Result<Self, crate::powertools::UnsupportedExpression> {
        compat.check_http()?;
        self.config.settings.powertools = Some(Arc::new(compat));
        Ok(self)
    }

    /// Emit a CloudWatch Embedded Metric Format count per request.
    pub fn metrics(mut self, metrics: EmfMetrics) -> Self {
        self.config.settings.metrics = Some(metrics);
        self
    }
}

impl<St: crate::store::TransactionalStore> IdempotencyLayer<St> {
    /// Runs each claimed handler **inside the store transaction** that
    /// holds its claim ([`Engine::run_in_transaction`]; PostgreSQL's): the
    /// handler takes the store's transaction (PostgreSQL's
    /// [`PgTransaction`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/struct.PgTransaction.html)) from
    /// its request's extensions (axum: `Extension<PgTransaction>`), reads,
    /// locks (`SELECT … FOR UPDATE`) and writes through it, and its
    /// response completes the record in that transaction, with any
    /// [`CommitWith`](super::CommitWith) writes: all of it commits, or none.
    ///
    /// - A response the [outcome policy](IdempotencyLayer::store_when)
    ///   releases (a 5xx, a 409), a handler error, a panic or a crash rolls
    ///   everything back: the key is free, and the retry runs as a first
    ///   request.
    /// - A client that leaves does not: as for every claimed request
    ///   ([When the client leaves](super#when-the-client-leaves)), the
    ///   handler runs on, its transaction commits with the record, and the
    ///   retry gets the replay.
    /// - A stored 4xx (a business-rule refusal, say a 422 for a balance too
    ///   low) is stored **without** the handler's writes (its SQL and its
    ///   `CommitWith`): they are rolled back to the claim first
    ///   ([`OpenTransaction::roll_back_writes`](crate::store::OpenTransaction::roll_back_writes)),
    ///   and the refusal is replayed to every retry.
    /// - A duplicate waits at most `limits`'
    ///   [`claim_wait`](crate::store::TransactionLimits::claim_wait)
    ///   (it then replays the committed response) before its 409; with
    ///   [`wait_for_result`](IdempotencyLayer::wait_for_result) it asks
    ///   again within that budget.
    /// - A handler past the
    ///   [`time_limit`](crate::store::TransactionLimits::time_limit)
    ///   is stopped and rolled back: a 503
    ///   `idempotency-time-limit-exceeded` with `Retry-After`.
    ///
    /// Each request holds one of the pool's connections from its claim to
    /// its commit: size the pool for the requests served at once (under
    /// Lambda Managed Instances, `AWS_LAMBDA_MAX_CONCURRENCY`; a warning is
    /// logged here when the pool is smaller).
    ///
    /// Supersedes [`mode`](IdempotencyLayer::mode) and
    /// [`single_write`](IdempotencyLayer::single_write). See
    /// `examples/postgres_balance.rs` for an axum server with a balance
    /// check inside the transaction.
    pub fn in_transaction(mut self, limits: crate::store::TransactionLimits) -> Self {
        let store = self.config.engine.store();
        store.expect_open_at_once(crate::engine::transactions_at_once(1));
        self.config.settings.in_transaction = Some(super::config::InTransaction::of::<St>(limits));
        self
    }
}

impl<S, St: Store> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, Arc::new(self.config.clone()))
    }
}

impl<St: fmt::Debug> fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("engine", &self.config.engine)
            .field("require_key", &self.config.settings.require_key)
            .field("methods", &self.config.settings.methods)
            .field("key", &self.config.settings.key)
            .field("fingerprint", &self.config.settings.fingerprint)
            .field("replayed_header", &self.config.settings.replayed_header)
            .field(
                "keep_trace_context",
                &self.config.settings.keep_trace_context,
            )
            .field(
                "replay_trace_header",
                &self.config.settings.replay_trace_header,
            )
            .field("body_limit", &self.config.settings.body_limit)
            .field("wait", &self.config.settings.wait)
            .field("retry_after", &self.config.settings.retry_after)
            .field("mode", &self.config.settings.mode)
            .field("single_write", &self.config.settings.single_write)
            .field("codec", &self.config.settings.codec)
            .field("metrics", &self.config.settings.metrics)
            .finish_non_exhaustive()
    }
}

/// `response`'s JSON body with `redaction` applied; an error when the body
/// is not JSON this can read (the record then keeps no body).
fn redact_json_body(
    redaction: &JsonRedaction,
    response: &mut Response<StoredBody>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let headers = response.headers();
    let json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|essence| {
            let essence = essence.trim().to_ascii_lowercase();
            essence == "application/json" || essence.ends_with("+json")
        })
        .unwrap_or(false);
    let encoded = headers
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|value| !value.as_bytes().eq_ignore_ascii_case(b"identity"));
    let bytes: &[u8] = match response.body() {
        StoredBody::Empty => return Ok(()),
        StoredBody::Text(text) => text.as_bytes(),
        StoredBody::Binary(bytes) => bytes,
    };
    if bytes.is_empty() {
        return Ok(());
    }
    if !json || encoded {
        return Err("the response is not an uncompressed JSON body".into());
    }
    if crate::redaction::has_number_a_value_rounds(bytes) {
        return Err(
            "the JSON body holds a number that writing it again would round (an \
             integer past 64 bits, or a decimal with more digits than a double keeps)"
                .into(),
        );
    }
    let mut document: serde_json::Value = serde_json::from_slice(bytes)?;
    redaction.apply(&mut document);
    *response.body_mut() = StoredBody::Text(serde_json::to_string(&document)?);
    Ok(())
}
