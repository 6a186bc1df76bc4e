//! Python's `json.dumps(value, sort_keys=True)`, byte for byte: what
//! Powertools hashes into a record id. One character of difference is a
//! different id, and a miss.

use super::{PyStr, PyValue};

/// `value` as Python's `json.dumps(value, sort_keys=True)` writes it: `", "`
/// and `": "` separators, keys sorted by code point, every character
/// outside printable ASCII escaped (`ensure_ascii`), floats as Python's
/// `repr`.
pub(crate) fn dumps(value: &PyValue) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &PyValue) {
    match value {
        PyValue::None => out.push_str("null"),
        PyValue::Bool(true) => out.push_str("true"),
        PyValue::Bool(false) => out.push_str("false"),
        PyValue::Int(digits) => out.push_str(digits),
        PyValue::Float(float) => out.push_str(&python_float_repr(*float)),
        PyValue::Str(text) => write_string(out, text),
        PyValue::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        // Kept sorted by code point, as `sort_keys` sorts them.
        PyValue::Dict(entries) => {
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
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
fn write_string(out: &mut String, text: &PyStr) {
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
            assert_eq!(dumps(&PyValue::from(&value)), expected, "{input}");
        }
        assert_eq!(
            dumps(&PyValue::from(&json!(18446744073709551615u64))),
            "18446744073709551615"
        );
    }
}
