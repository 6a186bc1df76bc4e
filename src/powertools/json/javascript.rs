//! TypeScript's `JSON.stringify(deepSort(value))` after `JSON.parse`, byte
//! for byte: what Powertools (TypeScript) hashes into a record id.
//!
//! `deepSort` rebuilds each object with its keys sorted by
//! `toLowerCase()` (full Unicode, final sigma included; JavaScript's `<` on
//! UTF-16 code units; keys equal once lowercased keep their order), but a
//! JavaScript object lists integer-like keys ("0", "42") first, in
//! ascending order, whatever the insertion order: so does this. It copies
//! members by assignment, so a `__proto__` member is not copied (it sets
//! the copy's prototype, or nothing). Numbers are doubles, written as
//! JavaScript writes them (`-0` is `0`, `1e21` is `1e+21`, a 30-digit
//! integer loses its last digits); strings keep non-ASCII characters as
//! they are and escape lone surrogates.

use super::{Json, Utf16};

/// `JSON.stringify(deepSort(value))`. Iterative: the JavaScript dialect
/// reads payloads far deeper than a recursive writer's stack would hold.
pub(crate) fn stringify(value: &Json) -> String {
    /// A container being written, and whether a member was written yet.
    enum Open<'a> {
        Array(std::slice::Iter<'a, Json>, bool),
        Object(std::vec::IntoIter<(&'a Utf16, &'a Json)>, bool),
    }
    let mut out = String::new();
    let mut stack: Vec<Open<'_>> = Vec::new();
    let mut next = Some(value);
    loop {
        match next.take() {
            Some(Json::Array(items)) => {
                out.push('[');
                stack.push(Open::Array(items.iter(), false));
            }
            Some(Json::Object(members)) => {
                out.push('{');
                let members = property_order(Json::unique_members(members));
                stack.push(Open::Object(members.into_iter(), false));
            }
            Some(scalar) => write_scalar(&mut out, scalar),
            None => {}
        }
        let Some(open) = stack.last_mut() else {
            return out;
        };
        match open {
            Open::Array(items, started) => match items.next() {
                Some(item) => {
                    if std::mem::replace(started, true) {
                        out.push(',');
                    }
                    next = Some(item);
                }
                None => {
                    out.push(']');
                    stack.pop();
                }
            },
            Open::Object(members, started) => match members.next() {
                Some((key, item)) => {
                    if std::mem::replace(started, true) {
                        out.push(',');
                    }
                    write_string(&mut out, key);
                    out.push(':');
                    next = Some(item);
                }
                None => {
                    out.push('}');
                    stack.pop();
                }
            },
        }
    }
}

/// A value that is neither an array nor an object.
fn write_scalar(out: &mut String, value: &Json) {
    match value {
        Json::Null | Json::Array(_) | Json::Object(_) => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Number(text) => match text.parse::<f64>() {
            Ok(number) if number.is_finite() => out.push_str(&number_to_string(number)),
            // JSON.parse makes Infinity of 1e400, which stringify writes as null.
            _ => out.push_str("null"),
        },
        Json::String(text) => write_string(out, text),
    }
}

/// The members `deepSort`'s rebuilt object holds, in the order it lists
/// them. `sortObject` copies each member into `{}` by assignment, and
/// `acc["__proto__"] = v` is no member: it sets the object's prototype
/// (an object, an array or null) or is ignored (any other value), so a
/// `__proto__` that `JSON.parse` made an own member is left out.
fn property_order<'a>(members: Vec<(&'a Utf16, &'a Json)>) -> Vec<(&'a Utf16, &'a Json)> {
    let mut members: Vec<_> = members
        .into_iter()
        .filter(|(key, _)| !key.eq_str("__proto__"))
        .collect();
    // `(a, b) => a.toLowerCase() < b.toLowerCase() ? -1 : 1`: V8's TimSort
    // only asks whether a later key compares below an earlier one, so keys
    // equal once lowercased keep their order, as in this stable sort.
    members.sort_by_cached_key(|(key, _)| lowercase(key));
    let (mut indices, names): (Vec<_>, Vec<_>) = members
        .into_iter()
        .partition(|(key, _)| array_index(key).is_some());
    indices.sort_by_key(|(key, _)| array_index(key));
    indices.extend(names);
    indices
}

/// `String.prototype.toLowerCase`, as UTF-16 code units (the units `<`
/// compares): full Unicode lowercasing, with its contextual final sigma
/// (`Σ` ending a word is `ς`) and `İ` as `i̇`, as Rust's `str::to_lowercase`
/// does them (both at Unicode 17 here: Node 20.20's ICU 78, Rust 1.95). A
/// lone surrogate has no case and is neither cased nor case-ignorable, so
/// it ends a word for the final sigma: each run between lone surrogates is
/// lowercased on its own.
fn lowercase(key: &Utf16) -> Vec<u16> {
    let mut lowered = Vec::with_capacity(key.0.len());
    let mut run = String::new();
    for unit in char::decode_utf16(key.0.iter().copied()) {
        match unit {
            Ok(c) => run.push(c),
            Err(lone) => {
                lowered.extend(run.to_lowercase().encode_utf16());
                run.clear();
                lowered.push(lone.unpaired_surrogate());
            }
        }
    }
    lowered.extend(run.to_lowercase().encode_utf16());
    lowered
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
    fn check(cases: &[(&str, &str)]) {
        for (input, expected) in cases {
            let value =
                loads(input, Dialect::JavaScript).unwrap_or_else(|e| panic!("{input}: {e}"));
            // The expected texts escape non-ASCII for legibility; stringify
            // writes it as it is.
            let expected = loads(expected, Dialect::JavaScript).unwrap();
            let expected = write_raw(&expected);
            assert_eq!(stringify(&value), expected, "{input}");
        }
    }

    /// What JSON.stringify writes for a value already in deepSort's order
    /// (members as they are), to compare with.
    fn write_raw(value: &Json) -> String {
        match value {
            Json::Array(items) => format!(
                "[{}]",
                items.iter().map(write_raw).collect::<Vec<_>>().join(",")
            ),
            Json::Object(members) => format!(
                "{{{}}}",
                members
                    .iter()
                    .map(|(key, item)| {
                        let mut out = String::new();
                        write_string(&mut out, key);
                        format!("{out}:{}", write_raw(item))
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            scalar => {
                let mut out = String::new();
                write_scalar(&mut out, scalar);
                out
            }
        }
    }

    /// `deepSort` assigns each member into `{}`: a `__proto__` sets the
    /// prototype (object, array, null) or is ignored (anything else), and is
    /// never a member. Expected: Node 20.20 with Powertools 2.35's deepSort.
    #[test]
    fn proto_members_vanish_as_in_deep_sort() {
        check(&[
            (r#"{"__proto__": {"x": 1}, "a": 1}"#, r#"{"a":1}"#),
            (r#"{"__proto__": [1, 2], "a": 1}"#, r#"{"a":1}"#),
            (r#"{"__proto__": "s", "a": 1}"#, r#"{"a":1}"#),
            (r#"{"__proto__": 5, "a": 1}"#, r#"{"a":1}"#),
            (r#"{"__proto__": null, "a": 1}"#, r#"{"a":1}"#),
            (r#"{"__proto__": {"a": 1}, "a": 2}"#, r#"{"a":2}"#),
            (
                r#"{"b": {"__proto__": {"q": 1}, "c": 2}, "__PROTO__": 3}"#,
                r#"{"__PROTO__":3,"b":{"c":2}}"#,
            ),
            (r#"[{"__proto__": true}, {"__proto__": {}}]"#, r#"[{},{}]"#),
            (
                r#"{"__proto__": 1, "__proto__": {"z": 1}, "y": 2}"#,
                r#"{"y":2}"#,
            ),
            (r#"{"__proto__": {"q": 1}}"#, r#"{}"#),
        ]);
    }

    /// Keys sorted by `toLowerCase()` (full Unicode: accented letters, final
    /// sigma, İ, a lone surrogate beside letters, letters equal once
    /// lowercased keeping their order over 200 keys, past V8's insertion
    /// sort). Expected: Node 20.20 with Powertools 2.35's deepSort.
    #[test]
    fn keys_sort_by_javascript_lowercase() {
        check(&[
            (
                r#"{"\u00e9b": 1, "\u00c9a": 2, "\u00c9B": 3, "ea": 4}"#,
                r#"{"ea":4,"\u00c9a":2,"\u00e9b":1,"\u00c9B":3}"#,
            ),
            (
                r#"{"\u0391\u03a3": 1, "\u03b1\u03c2": 2, "\u03b1\u03c3": 3, "\u0391\u03a3A": 4, "\u03b1\u03c3a": 5}"#,
                r#"{"\u0391\u03a3":1,"\u03b1\u03c2":2,"\u03b1\u03c3":3,"\u0391\u03a3A":4,"\u03b1\u03c3a":5}"#,
            ),
            (
                r#"{"\u0391\u03a3\ud800": 1, "\u03b1\u03c3\ud800": 2, "\u03b1\u03c2\ud800": 3, "Z\udc00": 4, "a\udc00": 5, "\u00c9\udc00": 6, "\u00e9\udc00": 7, "f\udc00": 8}"#,
                r#"{"a\udc00":5,"f\udc00":8,"Z\udc00":4,"\u00c9\udc00":6,"\u00e9\udc00":7,"\u0391\u03a3\ud800":1,"\u03b1\u03c2\ud800":3,"\u03b1\u03c3\ud800":2}"#,
            ),
            (
                r#"{"A\ud800\u03a3": 1, "a\ud800\u03c2": 2, "a\ud800\u03c3": 3}"#,
                r#"{"a\ud800\u03c2":2,"A\ud800\u03a3":1,"a\ud800\u03c3":3}"#,
            ),
            (
                r#"{"\u0130": 1, "i\u0307": 2, "i": 3, "I": 4, "\u0131": 5, "j": 6, "i\u0308": 7}"#,
                r#"{"i":3,"I":4,"\u0130":1,"i\u0307":2,"i\u0308":7,"j":6,"\u0131":5}"#,
            ),
            (
                r#"{"\u2126": 1, "\u03c9": 2, "\u03a9": 3, "\ud83d\ude00": 4, "\uff5a": 5, "\uff3a": 6, "\u212a": 7, "k": 8, "l": 9}"#,
                r#"{"\u212a":7,"k":8,"l":9,"\u2126":1,"\u03c9":2,"\u03a9":3,"\ud83d\ude00":4,"\uff5a":5,"\uff3a":6}"#,
            ),
            (
                r#"{"\u01c5": 1, "\u01c6": 2, "\u01c4": 3, "\u00df": 4, "\u1e9e": 5, "ss": 6, "st": 7}"#,
                r#"{"ss":6,"st":7,"\u00df":4,"\u1e9e":5,"\u01c5":1,"\u01c6":2,"\u01c4":3}"#,
            ),
            (
                r#"{"zABcDefg": 0, "abcdEFg": 1, "\u00c9AbCdEfG": 2, "zaBcDEFG": 3, "ABCDEfg": 4, "\u00c9abCdefG": 5, "zAbcDeFG": 6, "aBCDefg": 7, "\u00c9ABcdEFg": 8, "zabcDEfG": 9, "AbCDEFG": 10, "\u00c9aBcdeFg": 11, "zABCdefG": 12, "abCDeFG": 13, "\u00c9AbcdEfg": 14, "zaBCdEFg": 15, "ABcDEfG": 16, "\u00c9abcdefg": 17, "zAbCdeFg": 18, "aBcDefG": 19, "\u00c9ABCDeFG": 20, "zabCdEfg": 21, "AbcDEFg": 22, "\u00c9aBCDEfG": 23, "zABcdefg": 24, "abcDeFg": 25, "\u00c9AbCDefG": 26, "zaBcdEFG": 27, "ABCdEfg": 28, "\u00c9abCDEFg": 29, "zAbcdeFG": 30, "aBCdefg": 31, "\u00c9ABcDeFg": 32, "zabcdEfG": 33, "AbCdEFG": 34, "\u00c9aBcDEfg": 35, "zABCDEFg": 36, "abCdeFG": 37, "\u00c9AbcDefg": 38, "zaBCDeFg": 39, "ABcdEfG": 40, "\u00c9abcDEFG": 41, "zAbCDEfg": 42, "aBcdefG": 43, "\u00c9ABCdeFG": 44, "zabCDefg": 45, "AbcdEFg": 46, "\u00c9aBCdEfG": 47, "zABcDEFG": 48, "abcdeFg": 49, "\u00c9AbCdefG": 50, "zaBcDeFG": 51, "ABCDefg": 52, "\u00c9abCdEFg": 53, "zAbcDEfG": 54, "aBCDEFG": 55, "\u00c9ABcdeFg": 56, "zabcDefG": 57, "AbCDeFG": 58, "\u00c9aBcdEfg": 59, "zABCdEFg": 60, "abCDEfG": 61, "\u00c9Abcdefg": 62, "zaBCdeFg": 63, "ABcDefG": 64, "\u00c9abcdEFG": 65, "zAbCdEfg": 66, "aBcDEFg": 67, "\u00c9ABCDEfG": 68, "zabCdefg": 69, "AbcDeFg": 70, "\u00c9aBCDefG": 71, "zABcdEFG": 72, "abcDEfg": 73, "\u00c9AbCDEFg": 74, "zaBcdeFG": 75, "ABCdefg": 76, "\u00c9abCDeFg": 77, "zAbcdEfG": 78, "aBCdEFG": 79, "\u00c9ABcDEfg": 80, "zabcdefG": 81, "AbCdeFG": 82, "\u00c9aBcDefg": 83, "zABCDeFg": 84, "abCdEfG": 85, "\u00c9AbcDEFG": 86, "zaBCDEfg": 87, "ABcdefG": 88, "\u00c9abcDeFG": 89, "zAbCDefg": 90, "aBcdEFg": 91, "\u00c9ABCdEfG": 92, "zabCDEFG": 93, "AbcdeFg": 94, "\u00c9aBCdefG": 95, "zABcDeFG": 96, "abcdEfg": 97, "\u00c9AbCdEFg": 98, "zaBcDEfG": 99, "ABCDEFG": 100, "\u00c9abCdeFg": 101, "zAbcDefG": 102, "aBCDeFG": 103, "\u00c9ABcdEfg": 104, "zabcDEFg": 105, "AbCDEfG": 106, "\u00c9aBcdefg": 107, "zABCdeFg": 108, "abCDefG": 109, "\u00c9AbcdEFG": 110, "zaBCdEfg": 111, "ABcDEFg": 112, "\u00c9abcdeFG": 113, "zAbCdefg": 114, "aBcDeFg": 115, "\u00c9ABCDefG": 116, "zabCdEFG": 117, "AbcDEfg": 118, "\u00c9aBCDEFg": 119, "zABcdeFG": 120, "abcDefg": 121, "\u00c9AbCDeFg": 122, "zaBcdEfG": 123, "ABCdEFG": 124, "\u00c9abCDEfg": 125, "zAbcdefG": 126, "aBCdeFG": 127, "\u00c9ABcDefg": 128, "zabcdEFg": 129, "AbCdEfG": 130, "\u00c9aBcDEFG": 131, "zABCDEfg": 132, "abCdefG": 133, "\u00c9AbcDeFG": 134, "zaBCDefg": 135, "ABcdEFg": 136, "\u00c9abcDEfG": 137, "zAbCDEFG": 138, "aBcdeFg": 139, "\u00c9ABCdefG": 140, "zabCDeFG": 141, "AbcdEfg": 142, "\u00c9aBCdEFg": 143, "zABcDEfG": 144, "abcdefg": 145, "\u00c9AbCdeFg": 146, "zaBcDefG": 147, "ABCDeFG": 148, "\u00c9abCdEfg": 149, "zAbcDEFg": 150, "aBCDEfG": 151, "\u00c9ABcdefg": 152, "zabcDeFg": 153, "AbCDefG": 154, "\u00c9aBcdEFG": 155, "zABCdEfg": 156, "abCDEFg": 157, "\u00c9AbcdeFG": 158, "zaBCdefg": 159, "ABcDeFg": 160, "\u00c9abcdEfG": 161, "zAbCdEFG": 162, "aBcDEfg": 163, "\u00c9ABCDEFg": 164, "zabCdeFG": 165, "AbcDefg": 166, "\u00c9aBCDeFg": 167, "zABcdEfG": 168, "abcDEFG": 169, "\u00c9AbCDEfg": 170, "zaBcdefG": 171, "ABCdeFG": 172, "\u00c9abCDefg": 173, "zAbcdEFg": 174, "aBCdEfG": 175, "\u00c9ABcDEFG": 176, "zabcdeFg": 177, "AbCdefG": 178, "\u00c9aBcDeFG": 179, "zABCDefg": 180, "abCdEFg": 181, "\u00c9AbcDEfG": 182, "zaBCDEFG": 183, "ABcdeFg": 184, "\u00c9abcDefG": 185, "zAbCDeFG": 186, "aBcdEfg": 187, "\u00c9ABCdEFg": 188, "zabCDEfG": 189, "Abcdefg": 190, "\u00c9aBCdeFg": 191, "zABcDefG": 192, "abcdEFG": 193, "\u00c9AbCdEfg": 194, "zaBcDEFg": 195, "ABCDEfG": 196, "\u00c9abCdefg": 197, "zAbcDeFg": 198, "aBCDefG": 199}"#,
                r#"{"abcdEFg":1,"ABCDEfg":4,"aBCDefg":7,"AbCDEFG":10,"abCDeFG":13,"ABcDEfG":16,"aBcDefG":19,"AbcDEFg":22,"abcDeFg":25,"ABCdEfg":28,"aBCdefg":31,"AbCdEFG":34,"abCdeFG":37,"ABcdEfG":40,"aBcdefG":43,"AbcdEFg":46,"abcdeFg":49,"ABCDefg":52,"aBCDEFG":55,"AbCDeFG":58,"abCDEfG":61,"ABcDefG":64,"aBcDEFg":67,"AbcDeFg":70,"abcDEfg":73,"ABCdefg":76,"aBCdEFG":79,"AbCdeFG":82,"abCdEfG":85,"ABcdefG":88,"aBcdEFg":91,"AbcdeFg":94,"abcdEfg":97,"ABCDEFG":100,"aBCDeFG":103,"AbCDEfG":106,"abCDefG":109,"ABcDEFg":112,"aBcDeFg":115,"AbcDEfg":118,"abcDefg":121,"ABCdEFG":124,"aBCdeFG":127,"AbCdEfG":130,"abCdefG":133,"ABcdEFg":136,"aBcdeFg":139,"AbcdEfg":142,"abcdefg":145,"ABCDeFG":148,"aBCDEfG":151,"AbCDefG":154,"abCDEFg":157,"ABcDeFg":160,"aBcDEfg":163,"AbcDefg":166,"abcDEFG":169,"ABCdeFG":172,"aBCdEfG":175,"AbCdefG":178,"abCdEFg":181,"ABcdeFg":184,"aBcdEfg":187,"Abcdefg":190,"abcdEFG":193,"ABCDEfG":196,"aBCDefG":199,"zABcDefg":0,"zaBcDEFG":3,"zAbcDeFG":6,"zabcDEfG":9,"zABCdefG":12,"zaBCdEFg":15,"zAbCdeFg":18,"zabCdEfg":21,"zABcdefg":24,"zaBcdEFG":27,"zAbcdeFG":30,"zabcdEfG":33,"zABCDEFg":36,"zaBCDeFg":39,"zAbCDEfg":42,"zabCDefg":45,"zABcDEFG":48,"zaBcDeFG":51,"zAbcDEfG":54,"zabcDefG":57,"zABCdEFg":60,"zaBCdeFg":63,"zAbCdEfg":66,"zabCdefg":69,"zABcdEFG":72,"zaBcdeFG":75,"zAbcdEfG":78,"zabcdefG":81,"zABCDeFg":84,"zaBCDEfg":87,"zAbCDefg":90,"zabCDEFG":93,"zABcDeFG":96,"zaBcDEfG":99,"zAbcDefG":102,"zabcDEFg":105,"zABCdeFg":108,"zaBCdEfg":111,"zAbCdefg":114,"zabCdEFG":117,"zABcdeFG":120,"zaBcdEfG":123,"zAbcdefG":126,"zabcdEFg":129,"zABCDEfg":132,"zaBCDefg":135,"zAbCDEFG":138,"zabCDeFG":141,"zABcDEfG":144,"zaBcDefG":147,"zAbcDEFg":150,"zabcDeFg":153,"zABCdEfg":156,"zaBCdefg":159,"zAbCdEFG":162,"zabCdeFG":165,"zABcdEfG":168,"zaBcdefG":171,"zAbcdEFg":174,"zabcdeFg":177,"zABCDefg":180,"zaBCDEFG":183,"zAbCDeFG":186,"zabCDEfG":189,"zABcDefG":192,"zaBcDEFg":195,"zAbcDeFg":198,"\u00c9AbCdEfG":2,"\u00c9abCdefG":5,"\u00c9ABcdEFg":8,"\u00c9aBcdeFg":11,"\u00c9AbcdEfg":14,"\u00c9abcdefg":17,"\u00c9ABCDeFG":20,"\u00c9aBCDEfG":23,"\u00c9AbCDefG":26,"\u00c9abCDEFg":29,"\u00c9ABcDeFg":32,"\u00c9aBcDEfg":35,"\u00c9AbcDefg":38,"\u00c9abcDEFG":41,"\u00c9ABCdeFG":44,"\u00c9aBCdEfG":47,"\u00c9AbCdefG":50,"\u00c9abCdEFg":53,"\u00c9ABcdeFg":56,"\u00c9aBcdEfg":59,"\u00c9Abcdefg":62,"\u00c9abcdEFG":65,"\u00c9ABCDEfG":68,"\u00c9aBCDefG":71,"\u00c9AbCDEFg":74,"\u00c9abCDeFg":77,"\u00c9ABcDEfg":80,"\u00c9aBcDefg":83,"\u00c9AbcDEFG":86,"\u00c9abcDeFG":89,"\u00c9ABCdEfG":92,"\u00c9aBCdefG":95,"\u00c9AbCdEFg":98,"\u00c9abCdeFg":101,"\u00c9ABcdEfg":104,"\u00c9aBcdefg":107,"\u00c9AbcdEFG":110,"\u00c9abcdeFG":113,"\u00c9ABCDefG":116,"\u00c9aBCDEFg":119,"\u00c9AbCDeFg":122,"\u00c9abCDEfg":125,"\u00c9ABcDefg":128,"\u00c9aBcDEFG":131,"\u00c9AbcDeFG":134,"\u00c9abcDEfG":137,"\u00c9ABCdefG":140,"\u00c9aBCdEFg":143,"\u00c9AbCdeFg":146,"\u00c9abCdEfg":149,"\u00c9ABcdefg":152,"\u00c9aBcdEFG":155,"\u00c9AbcdeFG":158,"\u00c9abcdEfG":161,"\u00c9ABCDEFg":164,"\u00c9aBCDeFg":167,"\u00c9AbCDEfg":170,"\u00c9abCDefg":173,"\u00c9ABcDEFG":176,"\u00c9aBcDeFG":179,"\u00c9AbcDEfG":182,"\u00c9abcDefG":185,"\u00c9ABCdEFg":188,"\u00c9aBCdeFg":191,"\u00c9AbCdEfg":194,"\u00c9abCdefg":197}"#,
            ),
        ]);
    }

    /// The deepest payload the JavaScript dialect reads, as arrays, objects
    /// and both, read, copied, written and dropped on a thread with a
    /// 128 KiB stack: nothing recurses per level.
    #[test]
    fn the_deepest_payload_needs_no_stack() {
        let depth = Dialect::JavaScript.max_depth() - 1;
        let shapes = [
            ("[".repeat(depth), "]".repeat(depth)),
            ("{\"a\":".repeat(depth), "}".repeat(depth)),
            ("{\"B\":[".repeat(depth / 2), "]}".repeat(depth / 2)),
        ];
        for (open, close) in shapes {
            let text = format!("{open}1{close}");
            let worker = std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    let value = loads(&text, Dialect::JavaScript).map_err(|e| e.to_string())?;
                    let copy = value.clone();
                    drop(value);
                    let written = stringify(&copy);
                    Ok::<_, String>(written == text)
                })
                .unwrap();
            assert_eq!(worker.join().unwrap(), Ok(true));
        }
    }

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
