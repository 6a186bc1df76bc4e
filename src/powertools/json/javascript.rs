//! TypeScript's `JSON.stringify(deepSort(value))` after `JSON.parse`, byte
//! for byte: what Powertools (TypeScript) hashes into a record id.
//!
//! `deepSort` rebuilds each object with its keys sorted by their lowercase
//! form (JavaScript's `<` on UTF-16 code units; ties keep their order),
//! but a JavaScript object lists integer-like keys ("0", "42") first, in
//! ascending order, whatever the insertion order: so does this. Numbers are
//! doubles, written as JavaScript writes them (`-0` is `0`, `1e21` is
//! `1e+21`, a 30-digit integer loses its last digits); strings keep
//! non-ASCII characters as they are and escape lone surrogates.

use super::{Json, Utf16};

/// `JSON.stringify(deepSort(value))`.
pub(crate) fn stringify(value: &Json) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Json) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Number(text) => match text.parse::<f64>() {
            Ok(number) if number.is_finite() => out.push_str(&number_to_string(number)),
            // JSON.parse makes Infinity of 1e400, which stringify writes as null.
            _ => out.push_str("null"),
        },
        Json::String(text) => write_string(out, text),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Json::Object(members) => {
            let members = property_order(Json::unique_members(members));
            out.push('{');
            for (i, (key, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// The order `deepSort`'s rebuilt object lists its keys in.
fn property_order<'a>(mut members: Vec<(&'a Utf16, &'a Json)>) -> Vec<(&'a Utf16, &'a Json)> {
    // Stable, like V8's TimSort with deepSort's comparator (ties never
    // compare as less, so they keep their order).
    members.sort_by_cached_key(|(key, _)| lowercase(key));
    let (mut indices, names): (Vec<_>, Vec<_>) = members
        .into_iter()
        .partition(|(key, _)| array_index(key).is_some());
    indices.sort_by_key(|(key, _)| array_index(key));
    indices.extend(names);
    indices
}

/// `String.prototype.toLowerCase`, compared as UTF-16 code units.
fn lowercase(key: &Utf16) -> Vec<u16> {
    let lowered: String = char::decode_utf16(key.0.iter().copied())
        .map(|unit| unit.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect::<String>()
        .to_lowercase();
    if key.0.iter().all(|unit| !(0xD800..0xE000).contains(unit)) {
        lowered.encode_utf16().collect()
    } else {
        // A lone surrogate has no case: lower the rest unit by unit.
        key.0
            .iter()
            .map(|&unit| match char::from_u32(u32::from(unit)) {
                Some(c) if c.is_ascii_uppercase() => unit + 32,
                _ => unit,
            })
            .collect()
    }
}

/// A key JavaScript treats as an array index: the canonical decimal form
/// of an integer from 0 to 2^32 - 2.
fn array_index(key: &Utf16) -> Option<u32> {
    let text = String::from_utf16(&key.0).ok()?;
    if text.is_empty() || (text.len() > 1 && text.starts_with('0')) {
        return None;
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u32>().ok().filter(|&index| index < u32::MAX)
}

/// `Number.prototype.toString()` of a finite double (ECMAScript's
/// Number::toString): the shortest digits that read back, in fixed notation
/// from 1e-7 up to 1e21, otherwise `d.ddde±x`.
pub(crate) fn number_to_string(value: f64) -> String {
    if value == 0.0 {
        return "0".to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as ECMAScript
    // asks; only the layout differs.
    let scientific = format!("{:e}", value.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i32;
    // ECMAScript's n: the value is 0.digits × 10^n.
    let n = exponent + 1;
    let mut out = String::new();
    if value < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if n - 1 < 0 { '-' } else { '+' });
        out.push_str(&(n - 1).unsigned_abs().to_string());
    }
    out
}

/// A string as `JSON.stringify` writes it (well-formed since ES2019):
/// short escapes, other control characters and lone surrogates as
/// lowercase `\uXXXX`, everything else as it is.
fn write_string(out: &mut String, text: &Utf16) {
    out.push('"');
    for unit in char::decode_utf16(text.0.iter().copied()) {
        match unit {
            Ok('"') => out.push_str("\\\""),
            Ok('\\') => out.push_str("\\\\"),
            Ok('\n') => out.push_str("\\n"),
            Ok('\r') => out.push_str("\\r"),
            Ok('\t') => out.push_str("\\t"),
            Ok('\u{08}') => out.push_str("\\b"),
            Ok('\u{0c}') => out.push_str("\\f"),
            Ok(c) if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            Ok(c) => out.push(c),
            Err(lone) => out.push_str(&format!("\\u{:04x}", lone.unpaired_surrogate())),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::super::{loads, Dialect};
    use super::*;

    /// Each expected string is what Node 20 prints for
    /// `JSON.stringify(deepSort(JSON.parse(text)))` with Powertools'
    /// `deepSort`.
    #[test]
    fn writes_what_javascript_writes() {
        let cases = [
            (r#"{"b": 1, "a": [true, null, "x"]}"#, r#"{"a":[true,null,"x"],"b":1}"#),
            (r#"{"b": 1, "B": 2, "a": 3, "10": 4, "9": 5, "01": 6}"#, r#"{"9":5,"10":4,"01":6,"a":3,"b":1,"B":2}"#),
            (r#"[-0, 0.0, 1.50, 1e21, 1e20, 1e-7, 1e-6, 123456789012345678901234567890, 0.1, -2.5e-8]"#,
             "[0,0,1.5,1e+21,100000000000000000000,1e-7,0.000001,1.2345678901234568e+29,0.1,-2.5e-8]"),
            (r#""é€😀\u007f/\u0001\n""#, "\"é€😀\u{7f}/\\u0001\\n\""),
            (r#""a\ud800b\udc00""#, r#""a\ud800b\udc00""#),
            (r#"{"a": 1, "a": 2}"#, r#"{"a":2}"#),
            ("1E400", "null"),
            ("4294967295", "4294967295"),
            (r#"{"4294967295": 1, "4294967294": 2}"#, r#"{"4294967294":2,"4294967295":1}"#),
        ];
        for (input, expected) in cases {
            let value =
                loads(input, Dialect::JavaScript).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(stringify(&value), expected, "{input}");
        }
    }
}
