//! Responses as stored in the record: status, allowlisted headers and body,
//! in a compact binary frame, with large bodies compressed.
//!
//! Frame (version 1), all integers big-endian:
//!
//! ```text
//! u8 version | u8 flags | u16 status | u32 header count
//! { u32 name length | name | u32 value length | value } *
//! body (deflate-compressed when FLAG_DEFLATE is set)
//! ```

use super::{layer::BODY_HEADERS, problem::Problem};
use crate::{error::BoxError, Codec};
use flate2::{read::DeflateDecoder, write::DeflateEncoder, Compression};
use lambda_http::{
    http::{HeaderName, HeaderValue, StatusCode},
    Body, Response,
};
use std::io::{Read, Write};

const VERSION: u8 = 1;
const FLAG_DEFLATE: u8 = 0b0001;
const FLAG_BINARY: u8 = 0b0010;
const FLAG_TEXT: u8 = 0b0100;
const FLAG_NOT_STORED: u8 = 0b1000;

/// The most bytes a stored response may take: DynamoDB's 400 KB item limit,
/// less room for the record's other attributes.
pub const MAX_STORED_RESPONSE: usize = 400 * 1024 - 4 * 1024;
/// A decompressed body larger than this is corrupt (Lambda's own response
/// limit is 6 MB), so a hostile stored item cannot exhaust memory; a body
/// larger than this is never stored, so every stored body replays.
const MAX_BODY: u64 = 16 * 1024 * 1024;

/// The response codec of the HTTP layer.
#[derive(Debug, Clone)]
pub(crate) struct ResponseCodec {
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) compress_above: usize,
    pub(crate) max_stored: usize,
    pub(crate) problem_base: String,
}

impl ResponseCodec {
    fn frame(&self, response: &Response<Body>, body: Option<&[u8]>, flags: u8) -> Vec<u8> {
        let body = body.unwrap_or_default();
        let mut out = Vec::with_capacity(16 + body.len());
        out.push(VERSION);
        out.push(flags);
        out.extend_from_slice(&response.status().as_u16().to_be_bytes());
        let body_headers = BODY_HEADERS.iter();
        let listed = self
            .stored_headers
            .iter()
            .filter(|name| !BODY_HEADERS.contains(name));
        let headers: Vec<_> = body_headers
            .chain(listed)
            .flat_map(|name| {
                response
                    .headers()
                    .get_all(name)
                    .iter()
                    .map(move |value| (name, value))
            })
            .collect();
        out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            put_bytes(&mut out, name.as_str().as_bytes());
            put_bytes(&mut out, value.as_bytes());
        }
        out.extend_from_slice(body);
        out
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

impl Codec<Response<Body>> for ResponseCodec {
    fn encode(&self, response: &Response<Body>) -> Result<Vec<u8>, BoxError> {
        let (body, kind): (&[u8], u8) = match response.body() {
            Body::Empty => (&[], 0),
            Body::Text(text) => (text.as_bytes(), FLAG_TEXT),
            Body::Binary(bytes) => (bytes, FLAG_BINARY),
            _ => (response.body().as_ref(), FLAG_BINARY),
        };
        if body.len() as u64 > MAX_BODY {
            // Compressible enough to fit an item, but past what a replay
            // decodes: refused now rather than stored and never replayable.
            tracing::warn!(
                size = body.len(),
                limit = MAX_BODY,
                "response body too large to replay; retries will get its status and headers with an explanation, not its body"
            );
            return Ok(self.frame(response, None, FLAG_NOT_STORED));
        }
        let framed = if body.len() > self.compress_above {
            let mut encoder =
                DeflateEncoder::new(Vec::with_capacity(body.len() / 4), Compression::fast());
            encoder.write_all(body)?;
            let compressed = encoder.finish()?;
            if compressed.len() < body.len() {
                self.frame(response, Some(&compressed), kind | FLAG_DEFLATE)
            } else {
                self.frame(response, Some(body), kind)
            }
        } else {
            self.frame(response, Some(body), kind)
        };
        if framed.len() <= self.max_stored {
            return Ok(framed);
        }
        // Too large even compressed. Storing nothing would let a retry run
        // the operation again once the lease passes; store the status and
        // headers instead, so retries learn it was processed.
        tracing::warn!(
            size = framed.len(),
            limit = self.max_stored,
            "response too large to store; retries will get its status and headers with an explanation, not its body"
        );
        Ok(self.frame(response, None, FLAG_NOT_STORED))
    }

    fn decode(&self, bytes: &[u8]) -> Result<Response<Body>, BoxError> {
        let mut reader = Reader(bytes);
        let version = reader.u8()?;
        if version != VERSION {
            return Err(format!("unknown stored response version {version}").into());
        }
        let flags = reader.u8()?;
        let status = StatusCode::from_u16(reader.u16()?)?;
        let count = reader.u32()?;
        let mut response = Response::new(Body::Empty);
        *response.status_mut() = status;
        for _ in 0..count {
            let name = HeaderName::from_bytes(reader.bytes()?)?;
            let value = HeaderValue::from_bytes(reader.bytes()?)?;
            response.headers_mut().append(name, value);
        }
        if flags & FLAG_NOT_STORED != 0 {
            let mut problem = Problem::ResponseNotStored { status }.to_response(&self.problem_base);
            for (name, value) in response.headers() {
                if !problem.headers().contains_key(name) {
                    problem.headers_mut().append(name, value.clone());
                }
            }
            return Ok(problem);
        }
        let body = if flags & FLAG_DEFLATE != 0 {
            let mut body = Vec::new();
            DeflateDecoder::new(reader.0)
                .take(MAX_BODY + 1)
                .read_to_end(&mut body)?;
            if body.len() as u64 > MAX_BODY {
                return Err("stored body decompresses past the size limit".into());
            }
            body
        } else {
            reader.0.to_vec()
        };
        *response.body_mut() = if flags & FLAG_TEXT != 0 {
            Body::Text(String::from_utf8(body)?)
        } else if flags & FLAG_BINARY != 0 {
            Body::Binary(body)
        } else {
            Body::Empty
        };
        Ok(response)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BoxError> {
        if self.0.len() < n {
            return Err("stored response is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, BoxError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, BoxError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into()?))
    }

    fn u32(&mut self) -> Result<u32, BoxError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], BoxError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_http::http::header;

    fn codec() -> ResponseCodec {
        ResponseCodec {
            stored_headers: vec![header::CONTENT_TYPE, header::LOCATION],
            compress_above: 1024,
            max_stored: MAX_STORED_RESPONSE,
            problem_base: super::super::problem::DEFAULT_PROBLEM_BASE.to_owned(),
        }
    }

    fn response(body: Body) -> Response<Body> {
        Response::builder()
            .status(201)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::LOCATION, "/v1/charges/ch_1")
            .header(header::SET_COOKIE, "session=secret")
            .header("x-request-id", "abc")
            .body(body)
            .unwrap()
    }

    #[test]
    fn round_trips_status_allowlisted_headers_and_body_kind() {
        let codec = codec();
        for body in [
            Body::Empty,
            Body::Text("{\"id\":\"ch_1\"}".into()),
            Body::Binary(vec![0, 159, 146, 150, 255]),
            Body::Text("é".repeat(10_000)),
            Body::Binary((0..200_000u32).map(|i| (i % 251) as u8).collect()),
        ] {
            let original = response(body);
            let bytes = codec.encode(&original).unwrap();
            let replay = codec.decode(&bytes).unwrap();
            assert_eq!(replay.status(), StatusCode::CREATED);
            assert_eq!(replay.body(), original.body());
            assert_eq!(replay.headers()[header::LOCATION], "/v1/charges/ch_1");
            assert!(
                replay.headers().get(header::SET_COOKIE).is_none(),
                "set-cookie is not stored"
            );
            assert!(
                replay.headers().get("x-request-id").is_none(),
                "not on the allowlist"
            );
        }
    }

    #[test]
    fn large_bodies_are_compressed() {
        let body = "{\"item\":\"repeated\"},".repeat(5_000);
        let bytes = codec().encode(&response(Body::Text(body.clone()))).unwrap();
        assert!(bytes.len() < body.len() / 10, "{} bytes", bytes.len());
        assert_eq!(bytes[1] & FLAG_DEFLATE, FLAG_DEFLATE);
    }

    #[test]
    fn a_response_too_large_to_store_replays_as_an_explained_status() {
        let mut codec = codec();
        codec.max_stored = 4 * 1024;
        // Incompressible: pseudo-random bytes.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..64 * 1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let bytes = codec.encode(&response(Body::Binary(noise))).unwrap();
        assert!(bytes.len() <= codec.max_stored);
        let replay = codec.decode(&bytes).unwrap();
        assert_eq!(replay.status(), StatusCode::CREATED, "the original status");
        assert_eq!(
            replay.headers()[header::LOCATION],
            "/v1/charges/ch_1",
            "so the client can fetch it"
        );
        assert_eq!(
            replay.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let Body::Text(text) = replay.body() else {
            panic!("problem body")
        };
        assert!(text.contains("idempotency-response-not-stored"), "{text}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let codec = codec();
        let good = codec
            .encode(&response(Body::Text("hello".repeat(1000))))
            .unwrap();
        for len in 0..good.len().min(64) {
            let _ = codec.decode(&good[..len]);
        }
        assert!(codec.decode(&[]).is_err());
        assert!(
            codec.decode(&[2, 0, 0, 200, 0, 0, 0, 0]).is_err(),
            "unknown version"
        );
        assert!(codec.decode(&[1, 0, 0, 5, 0, 0, 0, 0]).is_err(), "status 5");
        assert!(
            codec.decode(&[1, 0, 0, 200, 255, 255, 255, 255]).is_err(),
            "header count past the end"
        );
        let mut bad_deflate = vec![1, FLAG_DEFLATE | FLAG_TEXT, 0, 200, 0, 0, 0, 0];
        bad_deflate.extend_from_slice(b"not deflate");
        assert!(codec.decode(&bad_deflate).is_err());
    }

    /// Issue 10, item 14: a body that compresses into an item but decodes
    /// past the replay limit used to be stored, and then every retry got a
    /// corrupt-record 500.
    #[test]
    fn a_body_past_the_replay_limit_is_refused_at_store_time() {
        let codec = codec();
        let huge = "a".repeat(MAX_BODY as usize + 1);
        let bytes = codec.encode(&response(Body::Text(huge))).unwrap();
        assert_eq!(bytes[1] & FLAG_NOT_STORED, FLAG_NOT_STORED);
        let replay = codec.decode(&bytes).expect("replayable");
        assert_eq!(replay.status(), StatusCode::CREATED);
        let Body::Text(text) = replay.body() else {
            panic!("problem body")
        };
        assert!(text.contains("idempotency-response-not-stored"), "{text}");
        let limit = "a".repeat(MAX_BODY as usize);
        let bytes = codec.encode(&response(Body::Text(limit.clone()))).unwrap();
        assert_eq!(codec.decode(&bytes).unwrap().body(), &Body::Text(limit));
    }
}
