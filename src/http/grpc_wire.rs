//! What tells gRPC apart on the wire: its content type and its status
//! codes. A leaf, so that the problems, the stored responses and the
//! layer's gRPC answers can all read it.

use http::{header, HeaderMap};

/// gRPC status codes, as the gRPC spec numbers them.
pub(crate) mod code {
    pub(crate) const OK: u32 = 0;
    pub(crate) const UNKNOWN: u32 = 2;
    pub(crate) const INVALID_ARGUMENT: u32 = 3;
    pub(crate) const NOT_FOUND: u32 = 5;
    pub(crate) const ALREADY_EXISTS: u32 = 6;
    pub(crate) const RESOURCE_EXHAUSTED: u32 = 8;
    pub(crate) const FAILED_PRECONDITION: u32 = 9;
    pub(crate) const ABORTED: u32 = 10;
    pub(crate) const OUT_OF_RANGE: u32 = 11;
    pub(crate) const INTERNAL: u32 = 13;
    pub(crate) const UNAVAILABLE: u32 = 14;
    pub(crate) const DATA_LOSS: u32 = 15;
}

/// Whether these are the headers of a gRPC request or response:
/// `application/grpc`, with or without a `+proto`-like suffix or
/// parameters. gRPC-Web (`application/grpc-web`), whose trailers travel in
/// the body, is not.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    // Asked three times a request (of the request, of the response, and
    // of whether it streams), nearly always of another type: told apart by
    // its first bytes before the value is read as text.
    const GRPC: &[u8] = b"application/grpc";
    let head = value.as_bytes().trim_ascii_start();
    if !head
        .get(..GRPC.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(GRPC))
    {
        return false;
    }
    let Ok(value) = value.to_str() else {
        return false;
    };
    let media = value.split(';').next().unwrap_or_default().trim();
    media
        .get(GRPC.len()..)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('+'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn grpc_content_types() {
        let headers = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            headers
        };
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC; charset=x",
            " application/grpc ",
            "\tapplication/grpc+json ; charset=x",
        ] {
            assert!(is_grpc(&headers(grpc)), "{grpc}");
        }
        for other in [
            "application/grpc-web",
            "application/grpcx",
            "application/json",
            "text/plain",
            "application/gr",
            "",
            " ",
            "application/grpc web",
        ] {
            assert!(!is_grpc(&headers(other)), "{other}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }
}
