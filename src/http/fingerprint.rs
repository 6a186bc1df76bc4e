//! The fingerprint of an HTTP request: method, path and query, and body,
//! with a JSON body canonicalised so that key order and whitespace do not
//! change it.

use crate::Fingerprint;
use lambda_http::{http::header::CONTENT_TYPE, Request};

/// The fingerprint of `request`.
///
/// A body whose content type is JSON (`application/json`, or any
/// `+json` type) and that parses as JSON is hashed in canonical form (keys
/// sorted, no whitespace); any other body as its raw bytes.
pub fn request_fingerprint(request: &Request) -> Fingerprint {
    let method = request.method().as_str().as_bytes();
    let target = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .as_bytes();
    let body: &[u8] = request.body().as_ref();
    if is_json(request) {
        if let Some(fingerprint) = Fingerprint::of_parts_and_json(&[method, target, b"json"], body)
        {
            return fingerprint;
        }
    }
    Fingerprint::of_parts([method, target, b"raw", body])
}

fn is_json(request: &Request) -> bool {
    let Some(content_type) = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_http::Body;

    fn request(method: &str, uri: &str, content_type: Option<&str>, body: &str) -> Request {
        let mut builder = lambda_http::http::Request::builder()
            .method(method)
            .uri(uri);
        if let Some(content_type) = content_type {
            builder = builder.header(CONTENT_TYPE, content_type);
        }
        builder.body(Body::from(body)).expect("request")
    }

    #[test]
    fn json_bodies_are_canonical() {
        let a = request(
            "POST",
            "/v1/charges",
            Some("application/json"),
            r#"{"amount":100,"currency":"eur"}"#,
        );
        let b = request(
            "POST",
            "/v1/charges",
            Some("application/json; charset=utf-8"),
            "{\n  \"currency\": \"eur\",\n  \"amount\": 100\n}",
        );
        assert_eq!(request_fingerprint(&a), request_fingerprint(&b));
        let c = request(
            "POST",
            "/v1/charges",
            Some("application/merge-patch+json"),
            r#"{ "amount":100, "currency":"eur" }"#,
        );
        let d = request(
            "POST",
            "/v1/charges",
            Some("application/merge-patch+json"),
            r#"{"currency":"eur","amount":100}"#,
        );
        assert_eq!(request_fingerprint(&c), request_fingerprint(&d));
    }

    #[test]
    fn method_path_and_body_all_count() {
        let base = request(
            "POST",
            "/v1/charges",
            Some("application/json"),
            r#"{"amount":100}"#,
        );
        for other in [
            request(
                "PATCH",
                "/v1/charges",
                Some("application/json"),
                r#"{"amount":100}"#,
            ),
            request(
                "POST",
                "/v1/refunds",
                Some("application/json"),
                r#"{"amount":100}"#,
            ),
            request(
                "POST",
                "/v1/charges?expand=customer",
                Some("application/json"),
                r#"{"amount":100}"#,
            ),
            request(
                "POST",
                "/v1/charges",
                Some("application/json"),
                r#"{"amount":101}"#,
            ),
        ] {
            assert_ne!(
                request_fingerprint(&base),
                request_fingerprint(&other),
                "{other:?}"
            );
        }
    }

    #[test]
    fn other_bodies_are_raw_bytes() {
        let a = request("POST", "/upload", Some("text/plain"), r#"{"a":1,"b":2}"#);
        let b = request("POST", "/upload", Some("text/plain"), r#"{"b":2,"a":1}"#);
        assert_ne!(request_fingerprint(&a), request_fingerprint(&b));
        // Invalid JSON under a JSON content type still fingerprints, as bytes.
        let c = request("POST", "/x", Some("application/json"), "{not json");
        let d = request("POST", "/x", Some("application/json"), "{not json ");
        assert_ne!(request_fingerprint(&c), request_fingerprint(&d));
    }
}
