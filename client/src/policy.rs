//! What to do after an attempt: return what it got, or wait and send the
//! request again. One place decides, for responses and transport failures
//! alike.

use crate::retry_after::retry_after;
use http::{HeaderMap, StatusCode};
use std::time::{Duration, Instant, SystemTime};

/// The bounds the caller set ([`IdempotencyMiddleware`](crate::IdempotencyMiddleware)'s
/// settings).
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Statuses retried with backoff (by default 429 and 503).
    pub(crate) retry_statuses: Vec<StatusCode>,
    /// Attempts, counting the first, that may fail (a retried status or a
    /// transport failure) before the last failure is returned.
    pub(crate) max_attempts: u32,
    /// The first backoff, doubled after each failure.
    pub(crate) initial_backoff: Duration,
    /// The longest backoff.
    pub(crate) max_backoff: Duration,
    /// The longest `Retry-After` obeyed on a retried status: a server that
    /// asks for longer gets its response returned as it is.
    pub(crate) max_retry_after: Duration,
    /// How long, in all, the `409`s of a request still in progress are
    /// waited out.
    pub(crate) in_progress_budget: Duration,
}

/// What to do after a transport failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterError {
    /// Not a failure this middleware retries: return it as it is.
    Return,
    /// Send the request again after this long.
    Wait(Duration),
    /// A failure that is retried, but no attempt is left (of more than
    /// one).
    GiveUp,
}

/// The shortest wait before a `409` is sent again, whatever its
/// `Retry-After` and the backoff say: a peer answering `Retry-After: 0`
/// to a client with a zero backoff is not sent the request in a loop.
pub(crate) const MIN_IN_PROGRESS_WAIT: Duration = Duration::from_millis(50);

/// Stripe's word on whether a response may be sent again (`true` or
/// `false`), which its SDKs obey before the status.
const STRIPE_SHOULD_RETRY: &str = "stripe-should-retry";

/// What one logical request has used of its bounds.
#[derive(Debug)]
pub(crate) struct Spent {
    failures: u32,
    /// The waits for a request in progress, in all.
    in_progress: Duration,
    /// When the first attempt was sent: the in-progress budget is time,
    /// and an attempt a server holds (its `wait_for_result`) spends it too.
    started: Instant,
}

impl Default for Spent {
    fn default() -> Self {
        Self {
            failures: 0,
            in_progress: Duration::ZERO,
            started: Instant::now(),
        }
    }
}

impl Policy {
    /// How long to wait before the next attempt after a response with this
    /// status and headers, or `None` to return it.
    pub(crate) fn after_response(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        spent: &mut Spent,
    ) -> Option<Duration> {
        let asked = retry_after(headers, SystemTime::now());
        let stripe_says =
            headers
                .get(STRIPE_SHOULD_RETRY)
                .and_then(|value| match value.as_bytes() {
                    b"true" => Some(true),
                    b"false" => Some(false),
                    _ => None,
                });
        if stripe_says == Some(false) {
            return None;
        }
        if status == StatusCode::CONFLICT {
            // The key's first request is still running: it says so with
            // Retry-After (this crate's servers), or Stripe with
            // `Stripe-Should-Retry: true` (its `idempotency_key_in_use`).
            // Any other 409 is a conflict of the resource's state, which
            // sending again does not resolve.
            let wait = match (asked, stripe_says) {
                (Some(asked), _) => asked.max(self.initial_backoff),
                (None, Some(true)) => self.backoff(spent.failures + 1),
                (None, _) => return None,
            }
            .max(MIN_IN_PROGRESS_WAIT);
            // The budget is time since the first attempt (at least the
            // waits so far): a server that holds each duplicate spends it
            // as a sleep does.
            let spent_already = spent.in_progress.max(spent.started.elapsed());
            if spent_already.checked_add(wait)? > self.in_progress_budget {
                return None;
            }
            spent.in_progress += wait;
            return Some(wait);
        }
        if !self.retry_statuses.contains(&status) {
            return None;
        }
        spent.failures += 1;
        if spent.failures >= self.max_attempts {
            return None;
        }
        match asked {
            Some(wait) if wait > self.max_retry_after => None,
            Some(wait) => Some(wait),
            None => Some(self.backoff(spent.failures)),
        }
    }

    /// What to do after a transport failure.
    pub(crate) fn after_error(
        &self,
        error: &reqwest_middleware::Error,
        spent: &mut Spent,
    ) -> AfterError {
        // Another middleware's error is its own to handle (reqwest-retry's,
        // inside this one, has already retried).
        let reqwest_middleware::Error::Reqwest(error) = error else {
            return AfterError::Return;
        };
        // Connection refused, reset or closed before the answer, timeouts:
        // the request may or may not have reached the server, which the key
        // makes safe to find out by sending it again. Not a request that
        // could not be built, nor a redirect loop.
        if !(error.is_connect() || error.is_timeout() || error.is_request()) {
            return AfterError::Return;
        }
        spent.failures += 1;
        if spent.failures < self.max_attempts {
            AfterError::Wait(self.backoff(spent.failures))
        } else if self.max_attempts > 1 {
            AfterError::GiveUp
        } else {
            // Retries left to another layer (reqwest-retry outside this
            // one): the failure as it is, for it to classify.
            AfterError::Return
        }
    }

    /// The wait after the `failures`th failure: the first backoff doubled
    /// each time, at most the longest, less up to half at random (so that
    /// clients turned away together do not come back together).
    fn backoff(&self, failures: u32) -> Duration {
        let doubled = self
            .initial_backoff
            .saturating_mul(1u32 << failures.saturating_sub(1).min(16));
        let full = doubled.min(self.max_backoff);
        let half = full / 2;
        let jitter = getrandom::u32().unwrap_or(0);
        half + half.mul_f64(f64::from(jitter) / f64::from(u32::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{header::RETRY_AFTER, HeaderValue};

    fn policy() -> Policy {
        Policy {
            retry_statuses: vec![
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE,
            ],
            max_attempts: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
            max_retry_after: Duration::from_secs(5),
            in_progress_budget: Duration::from_secs(3),
        }
    }

    fn headers(retry_after: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn client_errors_are_returned_at_once() {
        let mut spent = Spent::default();
        for status in [400, 401, 404, 409, 413, 422] {
            let status = StatusCode::from_u16(status).unwrap();
            // Without Retry-After; a 4xx other than 409 even with it.
            assert_eq!(
                policy().after_response(status, &headers(None), &mut spent),
                None
            );
            if status != StatusCode::CONFLICT {
                assert_eq!(
                    policy().after_response(status, &headers(Some("1")), &mut spent),
                    None
                );
            }
        }
        assert_eq!(
            policy().after_response(StatusCode::CREATED, &headers(None), &mut spent),
            None
        );
        assert_eq!(spent.failures, 0);
    }

    #[test]
    fn in_progress_is_waited_out_as_asked_within_the_budget() {
        let (policy, mut spent) = (policy(), Spent::default());
        let conflict = StatusCode::CONFLICT;
        assert_eq!(
            policy.after_response(conflict, &headers(Some("1")), &mut spent),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            policy.after_response(conflict, &headers(Some("2")), &mut spent),
            Some(Duration::from_secs(2))
        );
        // 3 s of the 3 s budget spent: another second would pass it.
        assert_eq!(
            policy.after_response(conflict, &headers(Some("1")), &mut spent),
            None
        );
        // Retry-After: 0 still waits the first backoff.
        assert_eq!(
            Policy {
                in_progress_budget: Duration::from_secs(1),
                ..policy
            }
            .after_response(conflict, &headers(Some("0")), &mut Spent::default()),
            Some(Duration::from_millis(100))
        );
    }

    #[test]
    fn unavailable_is_retried_as_asked_or_with_backoff_a_bounded_number_of_times() {
        let (policy, mut spent) = (policy(), Spent::default());
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            policy.after_response(unavailable, &headers(Some("2")), &mut spent),
            Some(Duration::from_secs(2))
        );
        let backoff = policy
            .after_response(StatusCode::TOO_MANY_REQUESTS, &headers(None), &mut spent)
            .unwrap();
        // The second failure: 200 ms, less up to half.
        assert!(backoff >= Duration::from_millis(100) && backoff <= Duration::from_millis(200));
        // The third attempt's failure is the last.
        assert_eq!(
            policy.after_response(unavailable, &headers(None), &mut spent),
            None
        );
        assert_eq!(spent.failures, 3);
        // A Retry-After past the bound is not waited for.
        assert_eq!(
            policy.after_response(unavailable, &headers(Some("6")), &mut Spent::default()),
            None
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        let policy = policy();
        for failures in [1, 2, 3, 10, 40] {
            let full = Duration::from_millis(100 * (1 << (failures - 1).min(10)))
                .min(Duration::from_millis(300));
            let wait = policy.backoff(failures);
            assert!(wait >= full / 2 && wait <= full, "{failures}: {wait:?}");
        }
    }
}
