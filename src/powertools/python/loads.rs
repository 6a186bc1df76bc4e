//! Python's `json.loads`, for what Powertools' `powertools_json` reads: the
//! grammar of RFC 8259 plus `NaN`, `Infinity` and `-Infinity`, with
//! Python's values (see [`PyValue`]) and Python's limits.

use super::{PyStr, PyValue};
use std::fmt;

/// Nesting Python's decoder refuses (`RecursionError` at its recursion
/// limit, 1,000 frames by default, of which the caller's stack uses a few):
/// Powertools then raised, and wrote no record.
const MAX_DEPTH: usize = 1_000;

/// The digits CPython 3.11+ converts to an `int` at most
/// (`sys.get_int_max_str_digits()`); longer raises `ValueError`.
const MAX_INT_DIGITS: usize = 4_300;

/// Text that Python's `json.loads` refuses (or would not finish reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotPythonJson {
    at: usize,
}

impl fmt::Display for NotPythonJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not JSON to Python at byte {}", self.at)
    }
}

/// `json.loads(text)`.
pub(crate) fn loads(text: &str) -> Result<PyValue, NotPythonJson> {
    let mut parser = Parser {
        text: text.as_bytes(),
        at: 0,
    };
    parser.skip_whitespace();
    let value = parser.value(0)?;
    parser.skip_whitespace();
    if parser.at != parser.text.len() {
        return Err(parser.error());
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self) -> NotPythonJson {
        NotPythonJson { at: self.at }
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

    fn value(&mut self, depth: usize) -> Result<PyValue, NotPythonJson> {
        match self.peek() {
            Some(b'"') => Ok(PyValue::Str(self.string()?)),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'-' | b'0'..=b'9') => {
                if self.eat("-Infinity") {
                    return Ok(PyValue::Float(f64::NEG_INFINITY));
                }
                self.number()
            }
            _ if self.eat("null") => Ok(PyValue::None),
            _ if self.eat("true") => Ok(PyValue::Bool(true)),
            _ if self.eat("false") => Ok(PyValue::Bool(false)),
            _ if self.eat("NaN") => Ok(PyValue::Float(f64::NAN)),
            _ if self.eat("Infinity") => Ok(PyValue::Float(f64::INFINITY)),
            _ => Err(self.error()),
        }
    }

    fn array(&mut self, depth: usize) -> Result<PyValue, NotPythonJson> {
        if depth >= MAX_DEPTH {
            return Err(self.error());
        }
        self.at += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.eat("]") {
            return Ok(PyValue::List(items));
        }
        loop {
            self.skip_whitespace();
            items.push(self.value(depth)?);
            self.skip_whitespace();
            if self.eat("]") {
                return Ok(PyValue::List(items));
            }
            if !self.eat(",") {
                return Err(self.error());
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<PyValue, NotPythonJson> {
        if depth >= MAX_DEPTH {
            return Err(self.error());
        }
        self.at += 1;
        let mut entries = Vec::new();
        self.skip_whitespace();
        if self.eat("}") {
            return Ok(PyValue::dict(entries));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.error());
            }
            let key = self.string()?;
            self.skip_whitespace();
            if !self.eat(":") {
                return Err(self.error());
            }
            self.skip_whitespace();
            let value = self.value(depth)?;
            entries.push((key, value));
            self.skip_whitespace();
            if self.eat("}") {
                return Ok(PyValue::dict(entries));
            }
            if !self.eat(",") {
                return Err(self.error());
            }
        }
    }

    /// Python's `NUMBER_RE`: `-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`, an
    /// `int` without fraction or exponent, a `float` with either.
    fn number(&mut self) -> Result<PyValue, NotPythonJson> {
        let start = self.at;
        let negative = self.eat("-");
        let digits = |parser: &mut Self| {
            let from = parser.at;
            while matches!(parser.peek(), Some(b'0'..=b'9')) {
                parser.at += 1;
            }
            parser.at - from
        };
        let integer_start = self.at;
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.error()),
        }
        let integer_digits = self.at - integer_start;
        let mut float = false;
        // A fraction or exponent without digits is not part of the number
        // (Python's regex stops before it), and what follows is an error.
        if self.peek() == Some(b'.') && matches!(self.text.get(self.at + 1), Some(b'0'..=b'9')) {
            self.at += 1;
            digits(self);
            float = true;
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
                float = true;
            }
        }
        let literal = std::str::from_utf8(&self.text[start..self.at]).map_err(|_| self.error())?;
        if float {
            // Rust's parse is correctly rounded, as Python's float() is;
            // beyond f64's range both give an infinity.
            return literal
                .parse::<f64>()
                .map(PyValue::Float)
                .map_err(|_| self.error());
        }
        if integer_digits > MAX_INT_DIGITS {
            return Err(self.error());
        }
        // JSON forbids leading zeros, so the literal is Python's repr but
        // for `-0`, which is the int 0.
        Ok(PyValue::Int(if negative && literal == "-0" {
            "0".to_owned()
        } else {
            literal.to_owned()
        }))
    }

    /// A string, as Python's `scanstring` reads it (strict: no raw control
    /// characters): `\uXXXX` escapes kept as code units, so that a lone
    /// surrogate stays one and an escaped pair is the character it encodes.
    fn string(&mut self) -> Result<PyStr, NotPythonJson> {
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
                    return Ok(PyStr(units));
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

    fn hex4(&mut self) -> Result<u16, NotPythonJson> {
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
    use super::super::dumps;
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
            let value = loads(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(dumps(&value), expected, "{input}");
        }
    }

    #[test]
    fn keys_sort_by_code_point_not_by_utf16_unit() {
        // U+FF01 sorts before U+1F600 as a code point, after it as UTF-16
        // (0xFF01 > 0xD83D).
        let value = loads(r#"{"😀": 1, "！": 2}"#).unwrap();
        assert_eq!(dumps(&value), r#"{"\uff01": 2, "\ud83d\ude00": 1}"#);
    }

    #[test]
    fn nests_as_deep_as_python_and_no_deeper() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let value = loads(&nested(150)).unwrap();
        assert_eq!(dumps(&value), nested(150));
        assert!(loads(&nested(MAX_DEPTH - 1)).is_ok());
        assert!(loads(&nested(MAX_DEPTH)).is_err());
        // Deep enough to overflow a recursive reader's stack: refused, no crash.
        assert!(loads(&nested(1_000_000)).is_err());
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
            assert!(loads(input).is_err(), "{input:?}");
        }
        assert!(loads(&"1".repeat(MAX_INT_DIGITS)).is_ok());
    }
}
