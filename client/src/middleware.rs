//! [`IdempotencyMiddleware`]: its settings, and the loop that sends one
//! logical request until it has an answer to return.

use crate::{
    policy::{AfterError, Policy, Spent},
    GaveUp, Idempotency, IdempotencyKey, InvalidKey,
};
use http::{Extensions, HeaderName, HeaderValue, Method, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use std::time::Duration;

/// The default key header, as the IETF draft and Stripe name it.
pub const DEFAULT_KEY_HEADER: &str = "idempotency-key";

/// The default replay header, as `lambda-idempotency`'s HTTP layer and
/// Stripe set it (`Idempotent-Replayed: true`).
pub const DEFAULT_REPLAYED_HEADER: &str = "idempotent-replayed";

/// A `reqwest-middleware` layer that gives each logical request one
/// `Idempotency-Key` and keeps it across every attempt: see the [crate
/// docs](crate) for what it retries and in which order to add it.
#[derive(Debug, Clone)]
pub struct IdempotencyMiddleware {
    key_header: HeaderName,
    replayed_header: HeaderName,
    methods: Vec<Method>,
    policy: Policy,
}

impl Default for IdempotencyMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyMiddleware {
    /// POST and PATCH keyed in `Idempotency-Key`; `409` waited out for up
    /// to 30 s in all; 429 and 503 retried, 3 attempts in all, as
    /// `Retry-After` says (up to 20 s) or with backoff from 200 ms to 5 s.
    pub fn new() -> Self {
        Self {
            key_header: HeaderName::from_static(DEFAULT_KEY_HEADER),
            replayed_header: HeaderName::from_static(DEFAULT_REPLAYED_HEADER),
            methods: vec![Method::POST, Method::PATCH],
            policy: Policy {
                retry_statuses: vec![
                    StatusCode::TOO_MANY_REQUESTS,
                    StatusCode::SERVICE_UNAVAILABLE,
                ],
                max_attempts: 3,
                initial_backoff: Duration::from_millis(200),
                max_backoff: Duration::from_secs(5),
                max_retry_after: Duration::from_secs(20),
                in_progress_budget: Duration::from_secs(30),
            },
        }
    }

    /// The header the key is sent in (default `Idempotency-Key`).
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// The header whose value `true` marks a replayed response (default
    /// `Idempotent-Replayed`), read into [`Idempotency::replayed`].
    pub fn replayed_header(mut self, name: HeaderName) -> Self {
        self.replayed_header = name;
        self
    }

    /// The methods keyed and retried (default POST and PATCH). Requests
    /// with any other method pass through untouched: no key, no retry, no
    /// [`Idempotency`] on the response.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// How long, from the first attempt, to wait out the `409`s of a
    /// request still in progress (default 30 s): those with `Retry-After`
    /// (this crate's servers), and Stripe's, which say
    /// `Stripe-Should-Retry: true` instead (waited with the backoff).
    /// Each wait is what `Retry-After` says, at least 50 ms; one that
    /// would pass the budget is not started, and the time a server holds
    /// an attempt (its `wait_for_result`) counts as a wait does. A response
    /// marked replayed is the key's stored answer, and is returned at once
    /// whatever its status; `Stripe-Should-Retry: false` is never sent
    /// again.
    pub fn wait_in_progress(mut self, budget: Duration) -> Self {
        self.policy.in_progress_budget = budget;
        self
    }

    /// Attempts, the first one counted, that may fail with a retried
    /// status or in transport before the last one's response or error is
    /// returned (default 3; 1 retries none). The waits for a `409` in
    /// progress are bounded by [`wait_in_progress`](Self::wait_in_progress)
    /// instead.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.policy.max_attempts = attempts.max(1);
        self
    }

    /// The statuses retried with backoff (default 429 and 503). Add 502
    /// and 504 if a gateway in front of the server answers them; never a
    /// 4xx that describes the request (400, 422): sending it again gets the
    /// same answer.
    pub fn retry_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.policy.retry_statuses = statuses.into_iter().collect();
        self
    }

    /// The backoff where no `Retry-After` says how long to wait: `initial`
    /// after the first failure, doubled after each one, at most `max`, each
    /// less up to half at random (defaults 200 ms and 5 s).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.policy.initial_backoff = initial;
        self.policy.max_backoff = max.max(initial);
        self
    }

    /// The longest `Retry-After` obeyed on a retried status (default 20 s):
    /// a response that asks for longer is returned as it is.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.policy.max_retry_after = max;
        self
    }

    /// The request's key: its header if the caller set one (refused,
    /// before anything is sent, if it is not a key: [`InvalidKey`]); else the
    /// [`IdempotencyKey`] in its extensions (the caller's, or the one this
    /// middleware generated on an earlier pass of the same request, when a
    /// retry layer outside it sends it again); else a new one, kept there.
    fn key_of(
        &self,
        request: &mut Request,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<IdempotencyKey> {
        if let Some(value) = request.headers().get(&self.key_header) {
            // The caller's key, checked as any key is: one that is not
            // visible ASCII would be given back (`Idempotency::key`,
            // `GaveUp::key`) as another key than the one sent.
            let text = value.to_str().map_err(|_| InvalidKey::InvalidCharacter);
            return text
                .and_then(IdempotencyKey::new)
                .map_err(reqwest_middleware::Error::middleware);
        }
        let key = match extensions.get::<IdempotencyKey>() {
            Some(key) => key.clone(),
            None => {
                let key = IdempotencyKey::generate().map_err(|error| {
                    reqwest_middleware::Error::middleware(std::io::Error::other(error))
                })?;
                extensions.insert(key.clone());
                key
            }
        };
        let value =
            HeaderValue::from_str(key.as_str()).map_err(reqwest_middleware::Error::middleware)?;
        request.headers_mut().insert(self.key_header.clone(), value);
        Ok(key)
    }

    fn replayed(&self, response: &Response) -> bool {
        response
            .headers()
            .get(&self.replayed_header)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"))
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if !self.methods.contains(request.method()) {
            return next.run(request, extensions).await;
        }
        let key = self.key_of(&mut request, extensions)?;
        // Every attempt is a copy of this request, key header included. A
        // streamed body cannot be copied: that request is sent once.
        // No body, or bytes: a copy for each attempt (`Request::try_clone`).
        let body_replayable = request.body().is_none_or(|body| body.as_bytes().is_some());
        let mut kept = Some(request);
        let mut spent = Spent::default();
        let mut attempts = 0;
        loop {
            let Some(original) = kept.take() else {
                // Unreachable: the loop only goes round with a request kept.
                return Err(reqwest_middleware::Error::middleware(
                    std::io::Error::other("idempotency middleware: no request left to send"),
                ));
            };
            let attempt = match original.try_clone() {
                Some(copy) => {
                    kept = Some(original);
                    copy
                }
                None => original,
            };
            attempts += 1;
            let result = next.clone().run(attempt, extensions).await;
            let wait = match result {
                Ok(mut response) => {
                    // A replay is the key's stored answer, whatever its
                    // status: sending it again gets it again.
                    let wait = if self.replayed(&response) {
                        None
                    } else {
                        self.policy.after_response(
                            response.status(),
                            response.headers(),
                            &mut spent,
                        )
                    };
                    match wait {
                        Some(wait) if kept.is_some() => wait,
                        // Final, or a streamed body that cannot go again.
                        _ => {
                            let replayed = self.replayed(&response);
                            response.extensions_mut().insert(Idempotency {
                                key,
                                replayed,
                                attempts,
                            });
                            return Ok(response);
                        }
                    }
                }
                Err(error) => match self.policy.after_error(&error, &mut spent) {
                    AfterError::Wait(wait) if kept.is_some() => wait,
                    AfterError::Return => return Err(error),
                    // Out of attempts, or a streamed body that cannot go
                    // again: say which key to send it with.
                    AfterError::Wait(_) | AfterError::GiveUp => {
                        return Err(gave_up(error, key, attempts, body_replayable))
                    }
                },
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// The error of a request that got no response: the last attempt's
/// transport failure, with the key and the attempts.
fn gave_up(
    error: reqwest_middleware::Error,
    key: IdempotencyKey,
    attempts: u32,
    body_replayable: bool,
) -> reqwest_middleware::Error {
    match error {
        reqwest_middleware::Error::Reqwest(last) => reqwest_middleware::Error::middleware(GaveUp {
            key,
            attempts,
            body_replayable,
            last,
        }),
        // The policy retries transport failures only.
        other => other,
    }
}
