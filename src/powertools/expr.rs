//! The `event_key_jmespath` forms Powertools users write, parsed and
//! evaluated as JMESPath would: a field path (`messageId`,
//! `headers."Idempotency-Key"`, `requestContext.identity.user`), a
//! multiselect list of paths (`[user, order_id]`), each optionally applied
//! to `powertools_json(<path>)` (a field holding a JSON document, such as an
//! API Gateway body), and the empty expression (the whole event).

use super::json::{self, Dialect, Json};
use serde_json::Value;
use std::fmt;

/// A supported `event_key_jmespath` (or `payload_validation_jmespath`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expression {
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

/// An expression outside the supported forms: give the key as a closure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedExpression {
    expression: String,
}

impl fmt::Display for UnsupportedExpression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unsupported Powertools JMESPath expression {:?}: supported are a field path \
             (a.b.\"C-d\"), a list of paths ([a, b.c]), either after powertools_json(path), \
             and the empty expression (the whole event); give a closure for anything else",
            self.expression
        )
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
            decode: None,
            selection: Selection::Path(Vec::new()),
        }
    }

    pub(crate) fn parse(text: &str) -> Result<Self, UnsupportedExpression> {
        let unsupported = || UnsupportedExpression {
            expression: text.to_owned(),
        };
        let mut rest = text.trim();
        let mut decode = None;
        if let Some(after) = rest.strip_prefix("powertools_json(") {
            let (inner, tail) = after.split_once(')').ok_or_else(unsupported)?;
            decode = Some(parse_path(inner.trim()).ok_or_else(unsupported)?);
            rest = tail.trim_start();
            if rest.is_empty() {
                return Ok(Self {
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
        Ok(Self { decode, selection })
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
        let decoded = json::loads(text, dialect).map_err(|_| EvalError::NotJson)?;
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
