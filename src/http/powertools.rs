//! The HTTP side of the compatibility mode: the view of a request that the
//! key expressions read, and Powertools' stored proxy response as a
//! response.

use super::StoredBody;
use crate::{
    powertools::{PowertoolsCompat, PowertoolsFound},
    Error, StoreError, StoreErrorKind, Takeover,
};
use base64::{
    alphabet,
    engine::{general_purpose::STANDARD, DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
    Engine as _,
};
use bytes::Bytes;
use http::{
    header::{CONTENT_TYPE, SET_COOKIE},
    HeaderName, HeaderValue, Request, Response, StatusCode,
};
use serde_json::{Map, Value};

/// How API Gateway read a proxy response's base64 body: padding optional.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// How the request reached the function, as far as Powertools' record
/// depends on it.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    /// The event carried the body base64-encoded (`isBase64Encoded`).
    pub(crate) base64_body: bool,
    /// The event's `queryStringParameters`, as API Gateway wrote them
    /// (null without any).
    pub(crate) query: Value,
    /// The entry point serves a response without `statusCode` as 200 JSON
    /// (payload format 2.0), rather than refusing it.
    pub(crate) infers_plain_responses: bool,
}

/// What Powertools' record says of a request.
pub(crate) enum Answer {
    /// This crate's protocol runs; after an abandoned record, as its
    /// takeover.
    Run(Option<Takeover>),
    /// The response it stored, to replay, or why the request is refused
    /// (its record is in progress, cannot be replayed as HTTP, or could not
    /// be read).
    Answered(Result<Response<StoredBody>, Error>),
}

/// What Powertools' record says of `request`.
pub(crate) async fn answer(
    compat: &PowertoolsCompat,
    request: &Request<Bytes>,
    delivery: Delivery,
) -> Answer {
    let found = compat
        .check_in(
            &request_view(request, delivery.base64_body, delivery.query),
            true,
        )
        .await;
    Answer::Answered(match found {
        Ok(None) => return Answer::Run(None),
        Ok(Some(PowertoolsFound::Abandoned { takeover })) => return Answer::Run(Some(takeover)),
        Ok(Some(PowertoolsFound::InProgress { retry_after })) => {
            Err(Error::InProgress { retry_after })
        }
        Ok(Some(PowertoolsFound::Completed { data })) => {
            proxy_response(data.as_deref(), delivery.infers_plain_responses).map_err(|why| {
                Error::Store(StoreError::new(
                    StoreErrorKind::CorruptRecord,
                    format!("the Powertools record cannot be replayed as an HTTP response: {why}"),
                ))
            })
        }
        Err(error) => Err(error),
    })
}

/// What an `event_key_jmespath` can read of an HTTP request: `headers`
/// (lowercased names; repeated values joined with commas, as API Gateway's
/// HTTP API does), `queryStringParameters` (`query`, as the event held
/// them) and `body` as the event carried it: base64 text when it
/// was delivered so (Powertools hashed that text, and `powertools_json`
/// cannot read it), otherwise the text (`null` for bytes that are not
/// UTF-8, which no event carries as text).
pub(crate) fn request_view(request: &Request<Bytes>, base64_body: bool, query: Value) -> Value {
    let mut headers = Map::new();
    for name in request.headers().keys() {
        let values: Vec<&str> = request
            .headers()
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .collect();
        headers.insert(name.as_str().to_owned(), Value::String(values.join(",")));
    }
    let body = match std::str::from_utf8(request.body()) {
        _ if base64_body => Value::String(STANDARD.encode(request.body())),
        Ok("") => Value::Null,
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => Value::Null,
    };
    let mut view = Map::new();
    view.insert("headers".to_owned(), Value::Object(headers));
    view.insert("queryStringParameters".to_owned(), query);
    view.insert("body".to_owned(), body);
    Value::Object(view)
}

/// Powertools' stored response (`json.dumps` of what the handler
/// returned) as API Gateway served it: a proxy response dict's
/// `statusCode`, `headers`, `multiValueHeaders`, `cookies` (HTTP API), and
/// `body`, decoded from base64 when `isBase64Encoded`; with
/// `infers_plain_responses` (payload format 2.0), any other JSON as a 200
/// `application/json` response with that JSON as its body. Anything else
/// is an error that names what is wrong (the record cannot be replayed as
/// HTTP).
pub(crate) fn proxy_response(
    data: Option<&str>,
    infers_plain_responses: bool,
) -> Result<Response<StoredBody>, String> {
    let data = data.ok_or("the COMPLETED record holds no response")?;
    let value: Value =
        serde_json::from_str(data).map_err(|e| format!("the response is not JSON: {e}"))?;
    let dict = match value {
        Value::Object(dict) if dict.contains_key("statusCode") => dict,
        // A string is served as its text, any other JSON as it is (null
        // as `null`): "body is the function's response".
        Value::String(text) if infers_plain_responses => return Ok(plain_response(&text)),
        _ if infers_plain_responses => return Ok(plain_response(data)),
        _ => {
            return Err(
                "the response has no statusCode, which API Gateway's payload format 1.0 \
                 (REST APIs) and ALB refuse: the client got an error from them, not this"
                    .to_owned(),
            )
        }
    };
    let status = dict
        .get("statusCode")
        .and_then(Value::as_u64)
        .and_then(|code| u16::try_from(code).ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or("the response has no valid statusCode")?;
    let mut response = Response::new(StoredBody::Empty);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    let mut add = |name: &str, value: &Value| -> Result<(), String> {
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Number(_) | Value::Bool(_) => value.to_string(),
            _ => return Err(format!("header {name:?} is not a string")),
        };
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{name:?} is not a header name"))?;
        let value = HeaderValue::from_str(&text)
            .map_err(|_| format!("header {name}'s value is not a header value"))?;
        headers.append(name, value);
        Ok(())
    };
    if let Some(Value::Object(multi)) = dict.get("multiValueHeaders") {
        for (name, values) in multi {
            for value in values.as_array().into_iter().flatten() {
                add(name, value)?;
            }
        }
    }
    if let Some(Value::Object(single)) = dict.get("headers") {
        for (name, value) in single {
            // API Gateway gives multiValueHeaders precedence for a name in both.
            let in_multi = dict
                .get("multiValueHeaders")
                .and_then(Value::as_object)
                .is_some_and(|multi| multi.keys().any(|m| m.eq_ignore_ascii_case(name)));
            if !in_multi {
                add(name, value)?;
            }
        }
    }
    if let Some(Value::Array(cookies)) = dict.get("cookies") {
        for cookie in cookies {
            add(SET_COOKIE.as_str(), cookie)?;
        }
    }
    let base64 = dict
        .get("isBase64Encoded")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    *response.body_mut() = match dict.get("body") {
        None | Some(Value::Null) => StoredBody::Empty,
        Some(Value::String(text)) if base64 => StoredBody::Binary(
            decode_base64(text).ok_or("the body is marked base64 but does not decode")?,
        ),
        Some(Value::String(text)) => StoredBody::Text(text.clone()),
        Some(_) => return Err("the body is not a string".to_owned()),
    };
    Ok(response)
}

/// A Lambda response without `statusCode`, as payload format 2.0 serves it.
fn plain_response(json: &str) -> Response<StoredBody> {
    let mut response = Response::new(StoredBody::Text(json.to_owned()));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Standard base64 (with or without padding), as API Gateway reads a
/// proxy response's body.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    LENIENT_BASE64.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_bytes(response: &Response<StoredBody>) -> Vec<u8> {
        response.body().as_ref().to_vec()
    }

    #[test]
    fn a_proxy_response_becomes_the_response() {
        let data = r#"{"body": "{\"id\": \"ch_1\"}", "cookies": ["a=1"], "headers": {"Content-Type": "application/json", "X-N": 5}, "multiValueHeaders": {"Vary": ["a", "b"]}, "statusCode": 201}"#;
        let response = proxy_response(Some(data), false).unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(body_bytes(&response), br#"{"id": "ch_1"}"#);
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(response.headers()["x-n"], "5");
        assert_eq!(response.headers().get_all("vary").iter().count(), 2);
        assert_eq!(response.headers()["set-cookie"], "a=1");
    }

    #[test]
    fn a_base64_body_is_decoded() {
        for (encoded, decoded) in [
            ("aGVsbG8=", &b"hello"[..]),
            ("aGk", b"hi"),
            ("", b""),
            ("AP8=", &[0, 255]),
        ] {
            let data =
                format!(r#"{{"statusCode": 200, "body": "{encoded}", "isBase64Encoded": true}}"#);
            let response = proxy_response(Some(&data), false).unwrap();
            assert_eq!(body_bytes(&response), decoded, "{encoded}");
        }
    }

    #[test]
    fn what_is_not_a_proxy_response_is_an_error() {
        for data in [
            None,
            Some("null"),
            Some("\"text\""),
            Some("{\"body\": \"x\"}"),
            Some("{\"statusCode\": 99}"),
            Some("{\"statusCode\": 200, \"body\": 5}"),
            Some("{\"statusCode\": 200, \"body\": \"*\", \"isBase64Encoded\": true}"),
            Some("{\"statusCode\": 200, \"headers\": {\"a b\": \"x\"}}"),
            Some("{not json"),
        ] {
            assert!(proxy_response(data, false).is_err(), "{data:?}");
        }
    }

    #[test]
    fn without_status_code_payload_format_2_serves_200_json() {
        // A string is served as its text, not as JSON (API Gateway's
        // documented example: "Hello from Lambda!" has the body
        // Hello from Lambda!); anything else as the JSON it is.
        for (data, body) in [
            (
                r#"{"charge": "ch_1", "body": "x"}"#,
                r#"{"charge": "ch_1", "body": "x"}"#,
            ),
            (r#"[1, 2]"#, "[1, 2]"),
            (r#""text \"é\"""#, "text \"é\""),
            (r#""""#, ""),
            (r#""{\"a\": 1}""#, r#"{"a": 1}"#),
            ("null", "null"),
            ("7", "7"),
        ] {
            let response = proxy_response(Some(data), true).unwrap();
            assert_eq!(response.status(), 200, "{data}");
            assert_eq!(response.headers()["content-type"], "application/json");
            assert_eq!(body_bytes(&response), body.as_bytes(), "{data}");
            let why = proxy_response(Some(data), false).unwrap_err();
            assert!(why.contains("no statusCode"), "{why}");
        }
        // A proxy response is read as one, whatever the entry point.
        let response = proxy_response(Some(r#"{"statusCode": 202}"#), true).unwrap();
        assert_eq!(response.status(), 202);
        // Not JSON, or no response at all, is never served.
        assert!(proxy_response(Some("{not json"), true).is_err());
        assert!(proxy_response(None, true).is_err());
    }
}
