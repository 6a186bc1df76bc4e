//! The `event_key_jmespath` forms Powertools users write, parsed and
//! evaluated as JMESPath would: a field path (`messageId`,
//! `headers."Idempotency-Key"`, `requestContext.identity.user`), a
//! multiselect list of paths (`[user, order_id]`), each optionally applied
//! to `powertools_json(<path>)` (a field holding a JSON document, such as an
//! API Gateway body), and the empty expression (the whole event); and
//! which of them the HTTP layer's view of a request can evaluate as
//! Powertools did over the API Gateway event (`check_http`).

use super::json::{self, Dialect, Json};
use serde_json::Value;
use std::fmt;

/// A supported `event_key_jmespath` (or `payload_validation_jmespath`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expression {
    /// The expression as written.
    source: String,
    /// `powertools_json(path)` first, when present.
    decode: Option<Vec<String>>,
    selection: Selection,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Selection {
    /// A path; empty: the value itself.
    Path(Vec<String>),
    /// `[path, path, ...]`.
    List(Vec<Vec<String>>),
}

/// A Powertools JMESPath expression the compatibility mode cannot
/// evaluate as Powertools did: outside the supported forms
/// ([`PowertoolsCompat::event_key_jmespath`](super::PowertoolsCompat::event_key_jmespath)),
/// or, for the HTTP layer
/// ([`IdempotencyLayer::try_powertools`]),
/// over a part of the API Gateway event it does not see. Its message names
/// what is supported and the closure to give instead.
#[cfg_attr(
    feature = "http",
    doc = "",
    doc = "[`IdempotencyLayer::try_powertools`]: crate::http::IdempotencyLayer::try_powertools"
)]
#[cfg_attr(
    not(feature = "http"),
    doc = "",
    doc = "[`IdempotencyLayer::try_powertools`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.IdempotencyLayer.html#method.try_powertools"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedExpression {
    expression: String,
    /// Why the HTTP layer cannot evaluate it; `None`: not a supported form.
    http: Option<String>,
}

impl UnsupportedExpression {
    /// The expression refused.
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

impl fmt::Display for UnsupportedExpression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.http {
            None => write!(
                f,
                "unsupported Powertools JMESPath expression {:?}: supported are a field path \
                 (a.b.\"C-d\"), a list of paths ([a, b.c]), either after powertools_json(path), \
                 and the empty expression (the whole event); give a closure \
                 (PowertoolsCompat::event_key, payload_validation) for anything else",
                self.expression
            ),
            Some(why) => write!(
                f,
                "the HTTP layer cannot evaluate the Powertools JMESPath expression {:?} as \
                 Powertools did: {why}. Over an HTTP request it reads headers.<name>, \
                 queryStringParameters.<name> (or the whole map) and body, as API Gateway \
                 delivered them, in paths, lists of paths and after powertools_json(...), such \
                 as powertools_json(body).order_id; for anything else give a closure \
                 (PowertoolsCompat::event_key, payload_validation) over that view",
                self.expression
            ),
        }
    }
}

impl std::error::Error for UnsupportedExpression {}

/// Why an expression selected nothing that Powertools would have hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvalError {
    /// `powertools_json` on a value that is not a string holding JSON:
    /// Powertools raises, and writes no record.
    NotJson,
}

impl Expression {
    /// The empty expression: the whole event.
    pub(crate) fn whole() -> Self {
        Self {
            source: String::new(),
            decode: None,
            selection: Selection::Path(Vec::new()),
        }
    }

    /// `Ok` when the HTTP layer's view of a request (its headers, query
    /// string parameters and body: `crate::http::powertools::request_view`) gives what
    /// Powertools selected from the API Gateway event; otherwise why not.
    #[cfg(feature = "http")]
    pub(crate) fn check_http(&self) -> Result<(), UnsupportedExpression> {
        let paths: Vec<&[String]> = match (&self.decode, &self.selection) {
            // What follows powertools_json reads the decoded document.
            (Some(decoded), _) => vec![decoded],
            (None, Selection::Path(path)) => vec![path],
            (None, Selection::List(paths)) => paths.iter().map(Vec::as_slice).collect(),
        };
        paths
            .into_iter()
            .try_for_each(http_path)
            .map_err(|why| UnsupportedExpression {
                expression: self.source.clone(),
                http: Some(why),
            })
    }

    pub(crate) fn parse(text: &str) -> Result<Self, UnsupportedExpression> {
        let unsupported = || UnsupportedExpression {
            expression: text.to_owned(),
            http: None,
        };
        let mut rest = text.trim();
        let mut decode = None;
        if let Some(after) = rest.strip_prefix("powertools_json(") {
            let (inner, tail) = after.split_once(')').ok_or_else(unsupported)?;
            decode = Some(parse_path(inner.trim()).ok_or_else(unsupported)?);
            rest = tail.trim_start();
            if rest.is_empty() {
                return Ok(Self {
                    source: text.to_owned(),
                    decode,
                    selection: Selection::Path(Vec::new()),
                });
            }
            rest = rest.strip_prefix('.').ok_or_else(unsupported)?.trim_start();
        }
        let selection = if let Some(list) = rest.strip_prefix('[') {
            let list = list.strip_suffix(']').ok_or_else(unsupported)?;
            let paths = split_top(list)
                .into_iter()
                .map(|part| parse_path(part.trim()).filter(|p| !p.is_empty()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(unsupported)?;
            if paths.is_empty() {
                return Err(unsupported());
            }
            Selection::List(paths)
        } else {
            let path = parse_path(rest).ok_or_else(unsupported)?;
            if path.is_empty() && decode.is_some() {
                return Err(unsupported());
            }
            Selection::Path(path)
        };
        Ok(Self {
            source: text.to_owned(),
            decode,
            selection,
        })
    }

    /// What JMESPath selects from `event`, as Python holds it. `headers_any_case`: the first
    /// segment `headers` matches its field whatever the case (the HTTP
    /// layer sees header names lowercased).
    pub(crate) fn evaluate(
        &self,
        event: &Value,
        headers_any_case: bool,
        dialect: Dialect,
    ) -> Result<Json, EvalError> {
        let Some(path) = &self.decode else {
            // Only what is selected is converted: an event's body can be
            // megabytes that a key in a header never reads.
            return Ok(match &self.selection {
                Selection::Path(path) => Json::from(select(event, path, headers_any_case)),
                Selection::List(_) if event.is_null() => Json::Null,
                Selection::List(paths) => Json::Array(
                    paths
                        .iter()
                        .map(|path| Json::from(select(event, path, headers_any_case)))
                        .collect(),
                ),
            });
        };
        let Value::String(text) = select(event, path, headers_any_case) else {
            return Err(EvalError::NotJson);
        };
        let decoded = match json::loads(text, dialect) {
            Ok(decoded) => decoded,
            // Powertools TypeScript's JMESPath swallows `JSON.parse`'s
            // error: `powertools_json` is then `undefined`, which a path
            // reads as null (no record) and a multiselect list as a list of
            // nulls (a record, one for every such body). Python raises.
            Err(_) if dialect == Dialect::JavaScript => {
                return Ok(match &self.selection {
                    Selection::Path(_) => Json::Null,
                    Selection::List(paths) => Json::Array(vec![Json::Null; paths.len()]),
                });
            }
            Err(_) => return Err(EvalError::NotJson),
        };
        Ok(match &self.selection {
            Selection::Path(path) => select_decoded(&decoded, path).clone(),
            // JMESPath: a multiselect on null is null.
            Selection::List(_) if decoded == Json::Null => Json::Null,
            Selection::List(paths) => Json::Array(
                paths
                    .iter()
                    .map(|path| select_decoded(&decoded, path).clone())
                    .collect(),
            ),
        })
    }
}

/// Whether a path into the API Gateway event reads what the HTTP view
/// holds as Powertools read it; otherwise why not.
#[cfg(feature = "http")]
fn http_path(path: &[String]) -> Result<(), String> {
    let Some(root) = path.first() else {
        return Err(
            "the whole event holds API Gateway's request id and time, which \
                    change with every retry (Powertools keyed on it never matched a \
                    retry), and it is not available once lambda_http has parsed it"
                .to_owned(),
        );
    };
    match (root.as_str(), path.len()) {
        ("headers", 1) => Err("the whole `headers` map holds headers set anew on every \
                               request (X-Amzn-Trace-Id, X-Forwarded-For): no retry matched \
                               it; key on one header"
            .to_owned()),
        ("headers" | "queryStringParameters" | "body", _) => Ok(()),
        ("requestContext", _) => Err("`requestContext` is API Gateway's account of one \
                                      delivery (its `requestId` and `requestTime` change with \
                                      every retry), not the request the client repeats, and \
                                      the layer does not read it"
            .to_owned()),
        ("multiValueHeaders" | "multiValueQueryStringParameters", _) => Err(format!(
            "`{root}` (REST APIs' lists of values) is not part of the layer's view: key on \
             headers.<name> or queryStringParameters.<name>"
        )),
        _ => Err(format!(
            "`{root}` is not part of what the layer reads of a request"
        )),
    }
}

static NULL: Value = Value::Null;

/// A field path in the event; null where it leads nowhere, as in JMESPath.
fn select<'a>(value: &'a Value, path: &[String], headers_any_case: bool) -> &'a Value {
    let mut current = value;
    for (i, field) in path.iter().enumerate() {
        let Value::Object(map) = current else {
            return &NULL;
        };
        let found = map.get(field).or_else(|| {
            let in_headers = headers_any_case && i == 1 && path[0] == "headers";
            in_headers
                .then(|| {
                    map.iter()
                        .find(|(name, _)| name.eq_ignore_ascii_case(field))
                        .map(|(_, v)| v)
                })
                .flatten()
        });
        match found {
            Some(next) => current = next,
            None => return &NULL,
        }
    }
    current
}

static JSON_NULL: Json = Json::Null;

/// A field path in a document `powertools_json` decoded.
fn select_decoded<'a>(value: &'a Json, path: &[String]) -> &'a Json {
    path.iter()
        .try_fold(value, |current, field| current.get(field))
        .unwrap_or(&JSON_NULL)
}

/// `a.b."c-d"` into its fields; `None` when it is not a plain path.
fn parse_path(text: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    if text.is_empty() {
        return Some(fields);
    }
    let mut chars = text.chars().peekable();
    loop {
        let mut field = String::new();
        match chars.next()? {
            '"' => loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        '"' => field.push('"'),
                        '\\' => field.push('\\'),
                        '/' => field.push('/'),
                        _ => return None,
                    },
                    c => field.push(c),
                }
            },
            c if c.is_ascii_alphabetic() || c == '_' => {
                field.push(c);
                while let Some(&c) = chars.peek() {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        field.push(c);
                        chars.next();
                    } else {
                        break;
                    }
                }
            }
            _ => return None,
        }
        fields.push(field);
        match chars.next() {
            None => return Some(fields),
            Some('.') => {}
            Some(_) => return None,
        }
    }
}

/// Splits a multiselect list at its top-level commas (not inside quotes).
fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !text.trim().is_empty() {
        parts.push(&text[start..]);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn py(value: Value) -> Json {
        Json::from(&value)
    }

    fn eval(expression: &str, event: &Value) -> Result<Json, EvalError> {
        Expression::parse(expression)
            .unwrap()
            .evaluate(event, false, Dialect::Python)
    }

    #[test]
    fn the_common_forms_select_what_jmespath_selects() {
        let event = json!({
            "headers": {"Idempotency-Key": "k1"},
            "body": "{\"order\": {\"id\": 7}, \"user\": \"u\"}",
            "messageId": "m-1",
        });
        assert_eq!(
            eval("headers.\"Idempotency-Key\"", &event),
            Ok(py(json!("k1")))
        );
        assert_eq!(eval("messageId", &event), Ok(py(json!("m-1"))));
        assert_eq!(eval("", &event), Ok(py(event.clone())));
        assert_eq!(
            eval("powertools_json(body).order.id", &event),
            Ok(py(json!(7)))
        );
        assert_eq!(
            eval("powertools_json(body)", &event),
            Ok(py(json!({"order": {"id": 7}, "user": "u"})))
        );
        assert_eq!(
            eval("powertools_json(body).[user, order.id, nope]", &event),
            Ok(py(json!(["u", 7, null])))
        );
        assert_eq!(
            eval("[messageId, nope]", &event),
            Ok(py(json!(["m-1", null])))
        );
        assert_eq!(eval("nope.deeper", &event), Ok(Json::Null));
        assert_eq!(
            eval("powertools_json(messageId).x", &event),
            Err(EvalError::NotJson)
        );
        assert_eq!(
            eval("powertools_json(nope).x", &event),
            Err(EvalError::NotJson)
        );
    }

    #[test]
    fn headers_match_any_case_only_when_asked() {
        let event = json!({"headers": {"idempotency-key": "k1"}});
        let expression = Expression::parse("headers.\"Idempotency-Key\"").unwrap();
        assert_eq!(
            expression.evaluate(&event, true, Dialect::Python),
            Ok(py(json!("k1")))
        );
        assert_eq!(
            expression.evaluate(&event, false, Dialect::Python),
            Ok(Json::Null)
        );
    }

    /// Issue 37, item 4: over an HTTP request, an expression is refused
    /// at build time unless the layer's view holds what it reads as
    /// Powertools read it from the event.
    #[test]
    fn over_http_only_what_the_view_holds_is_accepted() {
        for accepted in [
            "headers.\"Idempotency-Key\"",
            "queryStringParameters.order",
            "queryStringParameters",
            "body",
            "powertools_json(body).order_id",
            "powertools_json(body)",
            "powertools_json(body).[a, b.c]",
            "[headers.\"Idempotency-Key\", queryStringParameters.x, body]",
            "powertools_json(headers.payload).id",
            "powertools_json(queryStringParameters.q).id",
        ] {
            let expression = Expression::parse(accepted).unwrap();
            assert_eq!(expression.check_http(), Ok(()), "{accepted}");
        }
        for (refused, why) in [
            ("", "whole event"),
            ("requestContext.requestId", "change with every retry"),
            ("requestContext.authorizer.claims.sub", "requestContext"),
            ("[requestContext.requestId, body]", "requestContext"),
            ("[headers.\"Idempotency-Key\", path]", "`path`"),
            ("headers", "whole `headers` map"),
            (
                "multiValueQueryStringParameters.x",
                "queryStringParameters.<name>",
            ),
            ("pathParameters.id", "`pathParameters`"),
            ("powertools_json(requestContext.x).y", "requestContext"),
        ] {
            let error = Expression::parse(refused)
                .unwrap()
                .check_http()
                .unwrap_err();
            let message = error.to_string();
            assert_eq!(error.expression(), refused);
            assert!(message.contains(why), "{refused}: {message}");
            assert!(message.contains("closure"), "{refused}: {message}");
            assert!(
                message.contains("queryStringParameters.<name>"),
                "{message}"
            );
        }
    }

    #[test]
    fn other_expressions_are_refused() {
        for expression in [
            "headers.*",
            "Records[0].messageId",
            "body | length(@)",
            "powertools_base64(body)",
            "powertools_json(body).",
            "[]",
            "a..b",
            "{a: b}",
        ] {
            assert!(Expression::parse(expression).is_err(), "{expression}");
        }
    }
}
