//! What a response's `Retry-After` asks the client to wait (RFC 9110,
//! section 10.2.3): whole seconds, or an HTTP date.

use http::{header::RETRY_AFTER, HeaderMap};
use std::time::{Duration, SystemTime};

/// The wait `Retry-After` asks for, if the response has one that parses:
/// its seconds, or the time until its date (zero for a date past).
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        // More digits than a u64 holds: longer than any bound a caller sets.
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn after(value: &str, now: SystemTime) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        retry_after(&headers, now)
    }

    #[test]
    fn seconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 29 Nov 2026 18:00:00 GMT").unwrap();
        assert_eq!(after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(after("0", now), Some(Duration::ZERO));
        assert_eq!(
            after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            after("Sun, 29 Nov 2026 18:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            after("Sun, 29 Nov 2026 17:59:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(after("-1", now), None);
        assert_eq!(after("soon", now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
