//! `json.loads` (Python) and `JSON.parse` (JavaScript), for what
//! Powertools' `powertools_json` reads: the grammar of RFC 8259 (plus
//! Python's `NaN`, `Infinity` and `-Infinity`) and each language's limits,
//! into a [`Json`] document.

use super::{Json, Utf16};
use std::fmt;

/// Whose reader the text is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Python's `json.loads`: `NaN` and `Infinity`, integers up to 4,300
    /// digits, nesting below 1,000 levels.
    Python,
    /// JavaScript's `JSON.parse`: RFC 8259 only; nesting below 10,000
    /// levels (what Powertools could hash, with a margin).
    JavaScript,
}

impl Dialect {
    /// The nesting this dialect refuses: arrays and objects nested this
    /// deep or deeper are not read.
    pub(crate) fn max_depth(self) -> usize {
        match self {
            Dialect::Python => PYTHON_MAX_DEPTH,
            Dialect::JavaScript => JAVASCRIPT_MAX_DEPTH,
        }
    }
}

/// Nesting Python's decoder refuses (`RecursionError` at its recursion
/// limit, 1,000 frames by default, of which the caller's stack uses a few):
/// Powertools then raised, and wrote no record.
const PYTHON_MAX_DEPTH: usize = 1_000;

/// Nesting refused for JavaScript. `JSON.parse` has no limit, but
/// Powertools' `deepSort` and `JSON.stringify` recurse: under Node 20's
/// default stack, Powertools 2.35 raised `RangeError` from somewhere
/// between about 1,500 and 3,400 levels (measured; it depends on the shape,
/// on the stack already in use and on what V8 compiled). Reading up to
/// 9,999 misses none it hashed (nor what a `--stack-size` about three
/// times the default lets it hash); a deeper payload has no record, and is
/// not looked up.
const JAVASCRIPT_MAX_DEPTH: usize = 10_000;

/// The digits CPython 3.11+ converts to an `int` at most
/// (`sys.get_int_max_str_digits()`); longer raises `ValueError`.
const MAX_INT_DIGITS: usize = 4_300;

/// Text the language's reader refuses (or would not finish reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotJson {
    at: usize,
}

impl fmt::Display for NotJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not JSON at byte {}", self.at)
    }
}

/// `json.loads(text)` or `JSON.parse(text)`, nesting bounded by the
/// dialect's limit ([`Dialect::max_depth`]). Iterative: no input, however
/// deep, grows the thread's stack.
pub(crate) fn loads(text: &str, dialect: Dialect) -> Result<Json, NotJson> {
    let mut parser = Parser {
        text: text.as_bytes(),
        at: 0,
        dialect,
    };
    parser.skip_whitespace();
    let value = parser.document()?;
    parser.skip_whitespace();
    if parser.at != parser.text.len() {
        return Err(parser.error());
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
    dialect: Dialect,
}

impl Parser<'_> {
    fn error(&self) -> NotJson {
        NotJson { at: self.at }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// Python's `WHITESPACE`: space, tab, newline, carriage return.
    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, literal: &str) -> bool {
        let matched = self
            .text
            .get(self.at..)
            .is_some_and(|rest| rest.starts_with(literal.as_bytes()));
        if matched {
            self.at += literal.len();
        }
        matched
    }

    /// One value and everything nested in it, with the open arrays and
    /// objects on a stack of their own rather than on the thread's.
    fn document(&mut self) -> Result<Json, NotJson> {
        /// An array or object read up to a member.
        enum Open {
            Array(Vec<Json>),
            /// The members so far, and the name of the one being read.
            Object(Vec<(Utf16, Json)>, Utf16),
        }
        let max_depth = self.dialect.max_depth();
        let mut stack: Vec<Open> = Vec::new();
        loop {
            self.skip_whitespace();
            let mut value = match self.peek() {
                Some(open @ (b'[' | b'{')) => {
                    if stack.len() + 1 >= max_depth {
                        return Err(self.error());
                    }
                    self.at += 1;
                    self.skip_whitespace();
                    if open == b'[' {
                        if self.eat("]") {
                            Json::Array(Vec::new())
                        } else {
                            stack.push(Open::Array(Vec::new()));
                            continue;
                        }
                    } else if self.eat("}") {
                        Json::Object(Vec::new())
                    } else {
                        let name = self.member_name()?;
                        stack.push(Open::Object(Vec::new(), name));
                        continue;
                    }
                }
                _ => self.scalar()?,
            };
            // A whole value: into the container it is in, closing each
            // container it completes.
            loop {
                let Some(open) = stack.last_mut() else {
                    return Ok(value);
                };
                self.skip_whitespace();
                let closed = match open {
                    Open::Array(items) => {
                        items.push(value);
                        if self.eat(",") {
                            break;
                        }
                        if !self.eat("]") {
                            return Err(self.error());
                        }
                        Json::Array(std::mem::take(items))
                    }
                    Open::Object(members, name) => {
                        members.push((std::mem::take(name), value));
                        if self.eat(",") {
                            self.skip_whitespace();
                            *name = self.member_name()?;
                            break;
                        }
                        if !self.eat("}") {
                            return Err(self.error());
                        }
                        Json::Object(std::mem::take(members))
                    }
                };
                stack.pop();
                value = closed;
            }
        }
    }

    /// A member's name and its colon, up to its value.
    fn member_name(&mut self) -> Result<Utf16, NotJson> {
        if self.peek() != Some(b'"') {
            return Err(self.error());
        }
        let name = self.string()?;
        self.skip_whitespace();
        if !self.eat(":") {
            return Err(self.error());
        }
        Ok(name)
    }

    /// A value that is neither an array nor an object.
    fn scalar(&mut self) -> Result<Json, NotJson> {
        let python = self.dialect == Dialect::Python;
        match self.peek() {
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b'-') if python && self.eat("-Infinity") => Ok(Json::Number("-Infinity".into())),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ if self.eat("null") => Ok(Json::Null),
            _ if self.eat("true") => Ok(Json::Bool(true)),
            _ if self.eat("false") => Ok(Json::Bool(false)),
            _ if python && self.eat("NaN") => Ok(Json::Number("NaN".into())),
            _ if python && self.eat("Infinity") => Ok(Json::Number("Infinity".into())),
            _ => Err(self.error()),
        }
    }

    /// A number: `-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`, kept as written
    /// (Python's `NUMBER_RE`, which makes an `int` of it without fraction
    /// or exponent: at most 4,300 digits, `sys.get_int_max_str_digits()`).
    fn number(&mut self) -> Result<Json, NotJson> {
        let start = self.at;
        self.eat("-");
        let digits = |parser: &mut Self| {
            let from = parser.at;
            while matches!(parser.peek(), Some(b'0'..=b'9')) {
                parser.at += 1;
            }
            parser.at - from
        };
        let integer_digits = match self.peek() {
            Some(b'0') => {
                self.at += 1;
                1
            }
            Some(b'1'..=b'9') => digits(self),
            _ => return Err(self.error()),
        };
        let mut integer = true;
        // A fraction or exponent without digits is not part of the number
        // (both readers stop before it), and what follows is an error.
        if self.peek() == Some(b'.') && matches!(self.text.get(self.at + 1), Some(b'0'..=b'9')) {
            self.at += 1;
            digits(self);
            integer = false;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let mark = self.at;
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if digits(self) == 0 {
                self.at = mark;
            } else {
                integer = false;
            }
        }
        if integer && self.dialect == Dialect::Python && integer_digits > MAX_INT_DIGITS {
            return Err(self.error());
        }
        let literal = std::str::from_utf8(&self.text[start..self.at]).map_err(|_| self.error())?;
        Ok(Json::Number(literal.to_owned()))
    }

    /// A string, as both readers take it (no raw control characters):
    /// `\uXXXX` escapes kept as code units, so that a lone surrogate stays
    /// one and an escaped pair is the character it encodes.
    fn string(&mut self) -> Result<Utf16, NotJson> {
        self.at += 1;
        let mut units = Vec::new();
        loop {
            let run_start = self.at;
            while let Some(byte) = self.peek() {
                if byte == b'"' || byte == b'\\' || byte < 0x20 {
                    break;
                }
                self.at += 1;
            }
            let run =
                std::str::from_utf8(&self.text[run_start..self.at]).map_err(|_| self.error())?;
            units.extend(run.encode_utf16());
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(Utf16(units));
                }
                Some(b'\\') => {
                    self.at += 1;
                    let escaped = self.peek().ok_or_else(|| self.error())?;
                    self.at += 1;
                    let unit = match escaped {
                        b'"' => u16::from(b'"'),
                        b'\\' => u16::from(b'\\'),
                        b'/' => u16::from(b'/'),
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => u16::from(b'\n'),
                        b'r' => u16::from(b'\r'),
                        b't' => u16::from(b'\t'),
                        b'u' => self.hex4()?,
                        _ => return Err(self.error()),
                    };
                    units.push(unit);
                }
                _ => return Err(self.error()),
            }
        }
    }

    fn hex4(&mut self) -> Result<u16, NotJson> {
        let hex = self
            .text
            .get(self.at..self.at + 4)
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .filter(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.error())?;
        let unit = u16::from_str_radix(hex, 16).map_err(|_| self.error())?;
        self.at += 4;
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::super::python::dumps;
    use super::*;

    /// Each expected string is what CPython 3.11 prints for
    /// `json.dumps(json.loads(text), sort_keys=True)`.
    #[test]
    fn reads_what_python_reads() {
        let cases = [
            ("-0", "0"),
            ("[-0, -0.0, -0e0, 0]", "[0, -0.0, -0.0, 0]"),
            ("12345678901234567890123", "12345678901234567890123"),
            ("1E400", "Infinity"),
            ("[NaN, -Infinity, Infinity]", "[NaN, -Infinity, Infinity]"),
            (r#""a\ud800b""#, r#""a\ud800b""#),
            (r#""\udc00\ud800""#, r#""\udc00\ud800""#),
            (r#""\ud83d\ude00""#, r#""\ud83d\ude00""#),
            ("\"😀\"", r#""\ud83d\ude00""#),
            (r#"{"b": 1, "a": 2, "b": 3}"#, r#"{"a": 2, "b": 3}"#),
            (" \t\n\r{\"k\" : [ ] } \n", r#"{"k": []}"#),
            (r#""\/\b\f""#, r#""/\b\f""#),
            ("1e5", "100000.0"),
        ];
        for (input, expected) in cases {
            let value = loads(input, Dialect::Python).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(dumps(&value), expected, "{input}");
        }
    }

    #[test]
    fn keys_sort_by_code_point_not_by_utf16_unit() {
        // U+FF01 sorts before U+1F600 as a code point, after it as UTF-16
        // (0xFF01 > 0xD83D).
        let value = loads(r#"{"😀": 1, "！": 2}"#, Dialect::Python).unwrap();
        assert_eq!(dumps(&value), r#"{"\uff01": 2, "\ud83d\ude00": 1}"#);
    }

    #[test]
    fn nests_as_deep_as_python_and_no_deeper() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let value = loads(&nested(150), Dialect::Python).unwrap();
        assert_eq!(dumps(&value), nested(150));
        assert!(loads(&nested(PYTHON_MAX_DEPTH - 1), Dialect::Python).is_ok());
        assert!(loads(&nested(PYTHON_MAX_DEPTH), Dialect::Python).is_err());
        // Deep enough to overflow a recursive reader's stack: refused, no crash.
        assert!(loads(&nested(1_000_000), Dialect::Python).is_err());
    }

    #[test]
    fn javascript_nests_to_its_own_limit() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let objects = |depth: usize| format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        for depth in [PYTHON_MAX_DEPTH, JAVASCRIPT_MAX_DEPTH - 1] {
            assert!(
                loads(&nested(depth), Dialect::JavaScript).is_ok(),
                "{depth}"
            );
            assert!(
                loads(&objects(depth), Dialect::JavaScript).is_ok(),
                "{depth}"
            );
        }
        assert!(loads(&nested(JAVASCRIPT_MAX_DEPTH), Dialect::JavaScript).is_err());
        assert!(loads(&objects(JAVASCRIPT_MAX_DEPTH), Dialect::JavaScript).is_err());
        assert!(loads(&nested(1_000_000), Dialect::JavaScript).is_err());
        // Python's limit is its own.
        assert!(loads(&nested(PYTHON_MAX_DEPTH), Dialect::Python).is_err());
    }

    #[test]
    fn refuses_what_python_refuses() {
        let long_int = "1".repeat(MAX_INT_DIGITS + 1);
        for input in [
            "",
            "01",
            "1.",
            ".5",
            "+1",
            "-",
            "1e",
            "[1,]",
            "{\"a\" 1}",
            "{1: 2}",
            "\"\u{1}\"",
            r#""\x""#,
            r#""\u12G4""#,
            "\"open",
            "nul",
            "[1] x",
            "\u{feff}1",
            long_int.as_str(),
        ] {
            assert!(loads(input, Dialect::Python).is_err(), "{input:?}");
        }
        assert!(loads(&"1".repeat(MAX_INT_DIGITS), Dialect::Python).is_ok());
    }

    #[test]
    fn javascript_reads_json_only() {
        for input in ["NaN", "[Infinity]", "-Infinity"] {
            assert!(loads(input, Dialect::JavaScript).is_err(), "{input}");
            assert!(loads(input, Dialect::Python).is_ok(), "{input}");
        }
        // No digit limit: JSON.parse makes a double of any integer.
        assert!(loads(&"1".repeat(MAX_INT_DIGITS + 1), Dialect::JavaScript).is_ok());
    }
}
