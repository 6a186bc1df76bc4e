//! Python's `json.dumps(value, sort_keys=True)`, byte for byte: what
//! Powertools (Python) hashes into a record id.

use super::{Json, Utf16};

/// `value` as Python's `json.dumps(value, sort_keys=True)` writes it after
/// `json.loads` read it: `", "` and `": "` separators, keys sorted by code
/// point (the last of repeated keys kept), every character outside
/// printable ASCII escaped (`ensure_ascii`), an integer's digits (`-0` is
/// the int 0), a float as Python's `repr`.
pub(crate) fn dumps(value: &Json) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Json) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Number(text) => write_number(out, text),
        Json::String(text) => write_string(out, text),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Json::Object(members) => {
            let mut members = Json::unique_members(members);
            members.sort_by(|a, b| a.0.cmp_code_points(b.0));
            out.push('{');
            for (i, (key, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, key);
                out.push_str(": ");
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// Python's reading of a number's text: an `int` without fraction or
/// exponent (JSON allows no leading zeros, so its digits are its repr, but
/// for `-0`), a `float` otherwise; `NaN` and the infinities as they are.
fn write_number(out: &mut String, text: &str) {
    if matches!(text, "NaN" | "Infinity" | "-Infinity") {
        out.push_str(text);
    } else if text.contains(['.', 'e', 'E']) {
        // Rust's parse is correctly rounded, as Python's float() is; beyond
        // f64's range both give an infinity.
        out.push_str(&python_float_repr(text.parse().unwrap_or(f64::NAN)));
    } else if text == "-0" {
        out.push('0');
    } else {
        out.push_str(text);
    }
}

/// Python's `repr(float)`: the shortest digits that read back to the same
/// float, fixed notation for exponents from -4 to 15 (with `.0` when
/// integral), otherwise `d.ddde+XX`.
pub(crate) fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's
    // repr; only the layout differs.
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exponent) {
        if exponent >= 0 {
            let whole = exponent as usize + 1;
            if digits.len() <= whole {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', whole - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..whole]);
                out.push('.');
                out.push_str(&digits[whole..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exponent.unsigned_abs()));
    }
    out
}

/// A JSON string as Python's `ensure_ascii` encoder writes it: lowercase
/// `\uXXXX` escapes, surrogate pairs above the BMP (and lone surrogates as
/// they are), and DEL escaped too.
fn write_string(out: &mut String, text: &Utf16) {
    out.push('"');
    for &unit in &text.0 {
        match unit {
            0x22 => out.push_str("\\\""),
            0x5c => out.push_str("\\\\"),
            0x0a => out.push_str("\\n"),
            0x0d => out.push_str("\\r"),
            0x09 => out.push_str("\\t"),
            0x08 => out.push_str("\\b"),
            0x0c => out.push_str("\\f"),
            0x20..=0x7e => out.push(char::from(unit as u8)),
            _ => out.push_str(&format!("\\u{unit:04x}")),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Each expected string is what CPython 3.11 prints for
    // json.dumps(json.loads(text), sort_keys=True), here from serde's values
    // (the events' own fields).
    #[test]
    fn matches_python_dumps() {
        let cases = [
            (
                r#"{"b": 1, "a": [true, null, "x"]}"#,
                r#"{"a": [true, null, "x"], "b": 1}"#,
            ),
            (r#""abc""#, r#""abc""#),
            (r#""é€😀\u007f/""#, r#""\u00e9\u20ac\ud83d\ude00\u007f/""#),
            (r#""a\"b\\c\n\t\u0001""#, r#""a\"b\\c\n\t\u0001""#),
            (
                r#"[1.0, 10.50, 1e2, 1e16, 1e15, 0.0001, 0.00001, -2.5e-7, 123.456]"#,
                r#"[1.0, 10.5, 100.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, -2.5e-07, 123.456]"#,
            ),
            (
                r#"{"Z": {}, "a": [], "_": -3}"#,
                r#"{"Z": {}, "_": -3, "a": []}"#,
            ),
            (r#"1.5e300"#, r#"1.5e+300"#),
            (r#"-0.0"#, r#"-0.0"#),
        ];
        for (input, expected) in cases {
            let value: serde_json::Value = serde_json::from_str(input).unwrap();
            assert_eq!(dumps(&Json::from(&value)), expected, "{input}");
        }
        assert_eq!(
            dumps(&Json::from(&json!(18446744073709551615u64))),
            "18446744073709551615"
        );
    }
}
