//! The HTTP side of the compatibility mode: the view of a request that the
//! key expressions read, and Powertools' stored proxy response as a
//! response.

use super::{PowertoolsCompat, PowertoolsFound};
use crate::{http::StoredBody, Error, StoreError, StoreErrorKind};
use bytes::Bytes;
use http::{header::SET_COOKIE, HeaderName, HeaderValue, Request, Response, StatusCode};
use serde_json::{Map, Value};

/// What Powertools' record says of `request`, when it decides it: the
/// response it stored, to replay, or why the request is refused (its
/// record is in progress, cannot be replayed as HTTP, or could not be
/// read). `None` lets this crate's protocol run.
pub(crate) async fn answer(
    compat: &PowertoolsCompat,
    request: &Request<Bytes>,
) -> Option<Result<Response<StoredBody>, Error>> {
    match compat.check_in(&request_view(request), true).await {
        Ok(None) => None,
        Ok(Some(PowertoolsFound::InProgress { retry_after })) => {
            Some(Err(Error::InProgress { retry_after }))
        }
        Ok(Some(PowertoolsFound::Completed { data })) => {
            Some(proxy_response(data.as_deref()).map_err(|why| {
                Error::Store(StoreError::new(
                    StoreErrorKind::CorruptRecord,
                    format!("the Powertools record cannot be replayed as an HTTP response: {why}"),
                ))
            }))
        }
        Err(error) => Some(Err(error)),
    }
}

/// What an `event_key_jmespath` can read of an HTTP request: `headers`
/// (lowercased names; repeated values joined with commas, as API Gateway's
/// HTTP API does) and `body` as text (`null` for a binary body: API Gateway
/// sent it base64-encoded, which `powertools_json` cannot read either).
pub(crate) fn request_view(request: &Request<Bytes>) -> Value {
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
        Ok("") => Value::Null,
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => Value::Null,
    };
    let mut view = Map::new();
    view.insert("headers".to_owned(), Value::Object(headers));
    view.insert("body".to_owned(), body);
    Value::Object(view)
}

/// Powertools' stored response (`json.dumps` of the handler's proxy
/// response dict) as a response: `statusCode`, `headers`,
/// `multiValueHeaders`, `cookies` (HTTP API), and `body`, decoded from
/// base64 when `isBase64Encoded`. Anything else is an error that names what
/// is wrong (the record cannot be replayed as HTTP).
pub(crate) fn proxy_response(data: Option<&str>) -> Result<Response<StoredBody>, String> {
    let data = data.ok_or("the COMPLETED record holds no response")?;
    let value: Value =
        serde_json::from_str(data).map_err(|e| format!("the response is not JSON: {e}"))?;
    let Value::Object(dict) = value else {
        return Err("the response is not a proxy response dict".to_owned());
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

/// Standard base64 (with or without padding), as API Gateway reads a
/// proxy response's body.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let bytes = text.trim_end_matches('=').as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= sextet(*c)? << (18 - 6 * i);
        }
        let produced = chunk.len() * 6 / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + produced]);
    }
    Some(out)
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
        let response = proxy_response(Some(data)).unwrap();
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
            let response = proxy_response(Some(&data)).unwrap();
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
            assert!(proxy_response(data).is_err(), "{data:?}");
        }
    }
}
