//! Canonical JSON: the form of a document that two clients sending "the same
//! JSON" agree on, and that two documents a handler can tell apart never
//! share.
//!
//! - Object keys are sorted (by their UTF-8 bytes, after unescaping) and
//!   whitespace is dropped, so key order and formatting do not matter.
//! - Strings are unescaped and written back with the minimal escapes
//!   (`"\u0041"` and `"A"` are the same string).
//! - Numbers keep their source text: `1`, `1.0`, `1.00` and `1e0` stay four
//!   numbers, because an integer type rejects `1.0` and a decimal type keeps
//!   its scale; `100000000000000000000001` is never rounded through a float.
//!   Only the exponent is normalised, where that is exact: `1E+02` is written
//!   `1e2`.
//! - A document with a duplicate key in any object has no canonical form:
//!   parsers disagree on which value wins (serde-derived types reject it), so
//!   such a body is fingerprinted by its raw bytes.
//!
//! Parsing is strict RFC 8259 (jiter, without its `NaN`/`Infinity`
//! extension), nested at most [`MAX_DEPTH`] deep, as serde_json.

use jiter::{Jiter, JiterResult, Peek};
use std::{
    borrow::Cow,
    io::{self, Write},
};

/// The deepest nesting canonicalised, serde_json's own limit: a deeper
/// document is fingerprinted by its raw bytes.
pub(crate) const MAX_DEPTH: usize = 128;

/// One parsed JSON value; numbers, and strings without escapes, borrow
/// their text from the input.
enum Node<'a> {
    Null,
    Bool(bool),
    Number(&'a [u8]),
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
}

/// Why a document has no canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotCanonical {
    /// Not one well-formed JSON document.
    Invalid,
    /// An object holds the same key twice.
    DuplicateKey,
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// The canonical form of `json` from its tree: the writer pointers into a
/// document use, held to the same bytes as the one-pass writer.
#[cfg(test)]
pub(super) fn tree_canonical(json: &[u8]) -> Result<Vec<u8>, NotCanonical> {
    let mut out = Vec::with_capacity(json.len());
    write_node(&parse(json)?, &mut out).map_err(|_| NotCanonical::Invalid)?;
    Ok(out)
}

/// What an RFC 6901 JSON pointer finds in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pointed {
    /// Nothing, or `null`; or the document is not JSON, holds a duplicate
    /// key (parsers disagree on which value it has) or is too deep.
    Absent,
    /// A string, unescaped, or a number, by its exact text: never rounded
    /// through a float, so `98765432109876543210` and
    /// `98765432109876543211` stay two values.
    Text(String),
    /// A boolean, an array or an object.
    NotText,
}

/// The value at `pointer` in the JSON document `json`.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) fn pointed(json: &[u8], pointer: &str) -> Pointed {
    let Ok(document) = parse(json) else {
        return Pointed::Absent;
    };
    match find(&document, pointer) {
        None | Some(Node::Null) => Pointed::Absent,
        Some(Node::String(text)) => Pointed::Text(text.clone().into_owned()),
        Some(Node::Number(text)) => Pointed::Text(String::from_utf8_lossy(text).into_owned()),
        Some(Node::Bool(_) | Node::Array(_) | Node::Object(_)) => Pointed::NotText,
    }
}

/// The canonical form of the value at each of `pointers` in the JSON
/// document `json` (`None` where there is none; a `null` is `Some`), from
/// one parse; or why `json` has no canonical form.
pub(crate) fn select<'p>(
    json: &[u8],
    pointers: impl IntoIterator<Item = &'p str>,
) -> Result<Vec<Option<Vec<u8>>>, NotCanonical> {
    let document = parse(json)?;
    pointers
        .into_iter()
        .map(|pointer| {
            find(&document, pointer)
                .map(|node| {
                    let mut out = Vec::new();
                    write_node(node, &mut out).map(|()| out)
                })
                .transpose()
                .map_err(|_| NotCanonical::Invalid)
        })
        .collect()
}

/// The node `pointer` (RFC 6901) points at in `document`, if any.
fn find<'n, 'a>(document: &'n Node<'a>, pointer: &str) -> Option<&'n Node<'a>> {
    if pointer.is_empty() {
        return Some(document);
    }
    let mut node = document;
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        node = match node {
            Node::Object(entries) => entries
                .iter()
                .find(|(name, _)| *name == token)
                .map(|(_, value)| value)?,
            Node::Array(items) => items.get(array_index(&token)?)?,
            _ => return None,
        };
    }
    Some(node)
}

/// An array index as RFC 6901 spells it: digits, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

fn parse(json: &[u8]) -> Result<Node<'_>, NotCanonical> {
    // A JSON text is UTF-8 (RFC 8259): checked once here, so every string
    // without escapes can be borrowed from it as it stands.
    let text = std::str::from_utf8(json).map_err(|_| NotCanonical::Invalid)?;
    let mut jiter = Jiter::new(json);
    let peek = jiter.peek().map_err(|_| NotCanonical::Invalid)?;
    let node = value(text, &mut jiter, peek, 0)?;
    jiter.finish().map_err(|_| NotCanonical::Invalid)?;
    Ok(node)
}

pub(super) fn invalid<T>(result: JiterResult<T>) -> Result<T, NotCanonical> {
    result.map_err(|_| NotCanonical::Invalid)
}

fn value<'a>(
    text: &'a str,
    jiter: &mut Jiter<'a>,
    peek: Peek,
    depth: usize,
) -> Result<Node<'a>, NotCanonical> {
    match peek {
        Peek::Null => invalid(jiter.known_null()).map(|()| Node::Null),
        Peek::True | Peek::False => invalid(jiter.known_bool(peek)).map(Node::Bool),
        Peek::String => string_of(text, invalid(jiter.known_bytes())?).map(Node::String),
        Peek::Array => {
            let depth = deeper(depth)?;
            let mut items = Vec::new();
            let mut next = invalid(jiter.known_array())?;
            while let Some(peek) = next {
                items.push(value(text, jiter, peek, depth)?);
                next = invalid(jiter.array_step())?;
            }
            Ok(Node::Array(items))
        }
        Peek::Object => {
            let depth = deeper(depth)?;
            let mut entries = Vec::new();
            let mut key = invalid(jiter.next_object_bytes())?;
            while let Some(raw) = key {
                let name = string_of(text, raw)?;
                let peek = invalid(jiter.peek())?;
                entries.push((name, value(text, jiter, peek, depth)?));
                key = invalid(jiter.next_key_bytes())?;
            }
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            if entries.windows(2).any(|pair| pair[0].0 == pair[1].0) {
                return Err(NotCanonical::DuplicateKey);
            }
            Ok(Node::Object(entries))
        }
        _ if peek.is_num() => {
            let start = jiter.current_index();
            invalid(jiter.known_number_bytes(peek))?;
            Ok(Node::Number(jiter.slice_to_current(start)))
        }
        _ => Err(NotCanonical::Invalid),
    }
}

/// The string whose content jiter returned as `raw`, a slice of `text`:
/// borrowed from `text` as it stands, or unescaped (by jiter, from the
/// quoted text) when it holds an escape.
pub(super) fn string_of<'a>(text: &'a str, raw: &[u8]) -> Result<Cow<'a, str>, NotCanonical> {
    let start = (raw.as_ptr() as usize)
        .checked_sub(text.as_ptr() as usize)
        .ok_or(NotCanonical::Invalid)?;
    let end = start + raw.len();
    let content = text.get(start..end).ok_or(NotCanonical::Invalid)?;
    if !content.contains('\\') {
        return Ok(Cow::Borrowed(content));
    }
    let quoted = text
        .get(start.saturating_sub(1)..end + 1)
        .ok_or(NotCanonical::Invalid)?;
    let mut unescape = Jiter::new(quoted.as_bytes());
    Ok(Cow::Owned(invalid(unescape.next_str())?.to_owned()))
}

pub(super) fn deeper(depth: usize) -> Result<usize, NotCanonical> {
    if depth >= MAX_DEPTH {
        Err(NotCanonical::TooDeep)
    } else {
        Ok(depth + 1)
    }
}

fn write_node<W: Write>(node: &Node<'_>, out: &mut W) -> io::Result<()> {
    match node {
        Node::Null => out.write_all(b"null"),
        Node::Bool(true) => out.write_all(b"true"),
        Node::Bool(false) => out.write_all(b"false"),
        Node::Number(text) => write_number(text, out),
        Node::String(text) => write_string(text, out),
        Node::Array(items) => {
            out.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_node(item, out)?;
            }
            out.write_all(b"]")
        }
        Node::Object(entries) => {
            out.write_all(b"{")?;
            for (i, (key, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_string(key, out)?;
                out.write_all(b":")?;
                write_node(value, out)?;
            }
            out.write_all(b"}")
        }
    }
}

fn write_string<W: Write>(text: &str, out: &mut W) -> io::Result<()> {
    serde_json::to_writer(out, text).map_err(io::Error::other)
}

/// A number as written in the document (already checked against the JSON
/// grammar), with its exponent normalised: `e`, no `+`, no leading zeros.
pub(super) fn write_number<W: Write>(text: &[u8], out: &mut W) -> io::Result<()> {
    let Some(e) = text.iter().position(|&b| b == b'e' || b == b'E') else {
        return out.write_all(text);
    };
    out.write_all(&text[..e])?;
    out.write_all(b"e")?;
    let mut exponent = &text[e + 1..];
    match exponent.first() {
        Some(b'-') => {
            out.write_all(b"-")?;
            exponent = &exponent[1..];
        }
        Some(b'+') => exponent = &exponent[1..],
        _ => {}
    }
    let significant = exponent
        .iter()
        .position(|&b| b != b'0')
        .map_or(&b"0"[..], |first| &exponent[first..]);
    out.write_all(significant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::streaming::canonical;

    fn canon(json: &str) -> Result<String, NotCanonical> {
        canonical(json.as_bytes()).map(|bytes| String::from_utf8(bytes).unwrap())
    }

    #[test]
    fn keys_sorted_whitespace_dropped_strings_unescaped() {
        assert_eq!(
            canon(" { \"b\" : [1, {\"z\":null,\"a\":true}], \"a\" : \"\\u0041\\n\" } ").unwrap(),
            r#"{"a":"A\n","b":[1,{"a":true,"z":null}]}"#
        );
        assert_eq!(canon("\"\\/\"").unwrap(), r#""/""#);
        assert_eq!(canon("[]").unwrap(), "[]");
        assert_eq!(canon("{}").unwrap(), "{}");
    }

    #[test]
    fn numbers_keep_their_text_and_only_the_exponent_is_normalised() {
        for (input, expected) in [
            ("100000000000000000000001", "100000000000000000000001"),
            ("100000000000000000000002", "100000000000000000000002"),
            ("0.1", "0.1"),
            ("0.10000000000000001", "0.10000000000000001"),
            ("1.0", "1.0"),
            ("1.00", "1.00"),
            ("-0", "-0"),
            ("1E+02", "1e2"),
            ("1e-007", "1e-7"),
            ("2.5E000", "2.5e0"),
            ("1e400", "1e400"),
        ] {
            assert_eq!(canon(input).unwrap(), expected, "{input}");
        }
    }

    #[test]
    fn duplicate_keys_invalid_json_and_deep_nesting_have_no_canonical_form() {
        assert_eq!(
            canon(r#"{"amount":1,"amount":2}"#),
            Err(NotCanonical::DuplicateKey)
        );
        assert_eq!(
            canon(r#"{"a":{"k":1,"\u006b":2}}"#),
            Err(NotCanonical::DuplicateKey),
            "duplicates after unescaping"
        );
        for invalid in [
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "+1",
            "1e",
            "NaN",
            "Infinity",
            "[1] x",
            "'a'",
            "\"\\x\"",
            "tru",
            "{1:2}",
        ] {
            assert_eq!(canon(invalid), Err(NotCanonical::Invalid), "{invalid:?}");
        }
        assert_eq!(
            canonical(b"\"\xff\""),
            Err(NotCanonical::Invalid),
            "not UTF-8"
        );
        let deep = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(canon(&deep).is_ok());
        let deeper = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(canon(&deeper), Err(NotCanonical::TooDeep));
    }

    #[test]
    fn pointers_find_exact_numbers_and_unescaped_strings() {
        let json = br#"{"data":{"object":{"id":98765432109876543211,"ref":"a\u002Fb"}},"a/b":{"~":[1.50,"x"]},"n":null,"t":true}"#;
        let text = |value: &str| Pointed::Text(value.to_owned());
        assert_eq!(
            pointed(json, "/data/object/id"),
            text("98765432109876543211")
        );
        assert_ne!(
            pointed(json, "/data/object/id"),
            text("98765432109876543210")
        );
        assert_eq!(pointed(json, "/data/object/ref"), text("a/b"));
        assert_eq!(pointed(json, "/a~1b/~0/0"), text("1.50"));
        assert_eq!(pointed(json, "/a~1b/~0/1"), text("x"));
        assert_eq!(pointed(json, "/a~1b/~0/01"), Pointed::Absent);
        assert_eq!(pointed(json, "/a~1b/~0/2"), Pointed::Absent);
        assert_eq!(pointed(json, "/n"), Pointed::Absent);
        assert_eq!(pointed(json, "/missing"), Pointed::Absent);
        assert_eq!(pointed(json, "data"), Pointed::Absent);
        assert_eq!(pointed(json, "/t"), Pointed::NotText);
        assert_eq!(pointed(json, "/data"), Pointed::NotText);
        assert_eq!(pointed(br#"{"id":1,"id":2}"#, "/id"), Pointed::Absent);
        assert_eq!(pointed(b"not json", "/id"), Pointed::Absent);
        assert_eq!(pointed(b"7", ""), text("7"));
    }

    #[test]
    fn the_canonical_form_is_a_fixed_point() {
        for input in [
            r#"{"b":1,"a":{"z":[1,2.5,-3,{"y":null,"x":true}],"a":"\u00e9\"q"},"c":"plain"}"#,
            r#"[1E+400, 1111111111111166111667, -0.0, 18446744073709551615]"#,
            "\"\\ud83d\\ude00 and \\u0000\"",
        ] {
            let once = canonical(input.as_bytes()).unwrap();
            assert_eq!(canonical(&once).unwrap(), once, "{input}");
        }
    }
}
