//! The canonical form of a whole document in one pass, without a tree:
//! what every request fingerprint computes, so it runs near the speed of
//! the parser and the hash.
//!
//! Values are written to the output as they are parsed. An object's
//! entries are written in document order and their places noted; when the
//! object closes, entries whose keys are already in order (most JSON,
//! written from a struct) stay where they are, and the others are moved
//! into order once. The form is exactly the tree writer's
//! ([`super::canonical`]), which pointers into a document still use: a
//! test holds the two to the same bytes.

use super::canonical::{deeper, invalid, string_of, write_number, NotCanonical};
use jiter::{Jiter, Peek};
use std::{borrow::Cow, io::Write};

/// One object entry already written: its key (unescaped, for ordering)
/// and where `"key":value` lies in the output.
struct Entry<'a> {
    key: Cow<'a, str>,
    start: usize,
    end: usize,
}

struct Writer<'a> {
    text: &'a str,
    jiter: Jiter<'a>,
    out: Vec<u8>,
    /// The entries of the objects being written, innermost last: one
    /// allocation for the whole document.
    entries: Vec<Entry<'a>>,
    /// Where an object's entries are reordered.
    scratch: Vec<u8>,
}

/// Writes the canonical form of the JSON document `json` to `out`.
///
/// Nothing is written unless the whole document is canonical, so `out` can
/// be a hash that falls back to the raw bytes on an error.
pub(crate) fn write_canonical<W: Write>(json: &[u8], out: &mut W) -> Result<(), NotCanonical> {
    let canonical = canonical(json)?;
    out.write_all(&canonical).map_err(|_| NotCanonical::Invalid)
}

/// The canonical form of the JSON document `json`.
pub(crate) fn canonical(json: &[u8]) -> Result<Vec<u8>, NotCanonical> {
    // A JSON text is UTF-8 (RFC 8259): checked once here, so every string
    // without escapes can be copied from it as it stands.
    let text = std::str::from_utf8(json).map_err(|_| NotCanonical::Invalid)?;
    let mut writer = Writer {
        text,
        jiter: Jiter::new(json),
        out: Vec::with_capacity(json.len()),
        entries: Vec::new(),
        scratch: Vec::new(),
    };
    let peek = invalid(writer.jiter.peek())?;
    writer.value(peek, 0)?;
    invalid(writer.jiter.finish())?;
    Ok(writer.out)
}

impl<'a> Writer<'a> {
    fn value(&mut self, peek: Peek, depth: usize) -> Result<(), NotCanonical> {
        match peek {
            Peek::Null => {
                invalid(self.jiter.known_null())?;
                self.out.extend_from_slice(b"null");
            }
            Peek::True | Peek::False => {
                let value = invalid(self.jiter.known_bool(peek))?;
                self.out
                    .extend_from_slice(if value { b"true" } else { b"false" });
            }
            Peek::String => {
                let raw = invalid(self.jiter.known_bytes())?;
                let text = string_of(self.text, raw)?;
                self.string(&text)?;
            }
            Peek::Array => {
                let depth = deeper(depth)?;
                self.out.push(b'[');
                let mut next = invalid(self.jiter.known_array())?;
                let mut first = true;
                while let Some(peek) = next {
                    if !first {
                        self.out.push(b',');
                    }
                    first = false;
                    self.value(peek, depth)?;
                    next = invalid(self.jiter.array_step())?;
                }
                self.out.push(b']');
            }
            Peek::Object => self.object(deeper(depth)?)?,
            _ if peek.is_num() => {
                let start = self.jiter.current_index();
                invalid(self.jiter.known_number_bytes(peek))?;
                write_number(self.jiter.slice_to_current(start), &mut self.out)
                    .map_err(|_| NotCanonical::Invalid)?;
            }
            _ => return Err(NotCanonical::Invalid),
        }
        Ok(())
    }

    /// A string: copied as it stands when its source held no escape (valid
    /// JSON then holds nothing that needs one), else written with the
    /// minimal escapes.
    // Borrowed or owned says whether the source held an escape.
    #[allow(clippy::ptr_arg)]
    fn string(&mut self, text: &Cow<'a, str>) -> Result<(), NotCanonical> {
        if let Cow::Borrowed(verbatim) = text {
            self.out.push(b'"');
            self.out.extend_from_slice(verbatim.as_bytes());
            self.out.push(b'"');
            return Ok(());
        }
        serde_json::to_writer(&mut self.out, &**text).map_err(|_| NotCanonical::Invalid)
    }

    fn object(&mut self, depth: usize) -> Result<(), NotCanonical> {
        self.out.push(b'{');
        let body = self.out.len();
        let first = self.entries.len();
        let mut key = invalid(self.jiter.next_object_bytes())?;
        while let Some(raw) = key {
            if self.entries.len() > first {
                self.out.push(b',');
            }
            let start = self.out.len();
            let name = string_of(self.text, raw)?;
            self.string(&name)?;
            self.out.push(b':');
            let peek = invalid(self.jiter.peek())?;
            self.value(peek, depth)?;
            self.entries.push(Entry {
                key: name,
                start,
                end: self.out.len(),
            });
            key = invalid(self.jiter.next_key_bytes())?;
        }
        let entries = &mut self.entries[first..];
        let in_order = entries.windows(2).all(|pair| pair[0].key < pair[1].key);
        if !in_order {
            entries.sort_unstable_by(|a, b| a.key.cmp(&b.key));
            if entries.windows(2).any(|pair| pair[0].key == pair[1].key) {
                return Err(NotCanonical::DuplicateKey);
            }
            self.scratch.clear();
            self.scratch.extend_from_slice(&self.out[body..]);
            self.out.truncate(body);
            for (i, entry) in entries.iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                self.out
                    .extend_from_slice(&self.scratch[entry.start - body..entry.end - body]);
            }
        }
        self.entries.truncate(first);
        self.out.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::canonical::tree_canonical;
    use super::*;
    use proptest::prelude::*;

    /// A JSON document, to be written with any key order, whitespace and
    /// escapes.
    #[derive(Debug, Clone)]
    enum Json {
        Null,
        Bool(bool),
        Number(&'static str),
        String(String),
        Array(Vec<Json>),
        Object(Vec<(String, Json)>),
    }

    const NUMBERS: &[&str] = &[
        "0",
        "-0",
        "1",
        "1.0",
        "1.00",
        "-12.5e-003",
        "1E+02",
        "2.5E000",
        "1e400",
        "100000000000000000000001",
        "18446744073709551616",
        "0.1",
    ];

    fn json() -> impl Strategy<Value = Json> {
        let text = "[ab\"\\\\/é😀\u{1}\u{7f}]{0,4}";
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            prop::sample::select(NUMBERS).prop_map(Json::Number),
            text.prop_map(Json::String),
        ];
        leaf.prop_recursive(5, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                prop::collection::vec((text, inner), 0..6).prop_map(Json::Object),
            ]
        })
    }

    /// Writes `json` with the escapes and spaces `noise` picks.
    fn write(json: &Json, noise: &mut impl Iterator<Item = u8>, out: &mut String) {
        let mut pick = |n: u8| noise.next().unwrap_or(0) % n;
        if pick(3) == 0 {
            out.push_str(" \n\t");
        }
        match json {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(n),
            Json::String(s) => write_string(s, &mut pick, out),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, noise, out);
                }
                out.push(']');
            }
            Json::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let mut pick = |n: u8| noise.next().unwrap_or(0) % n;
                    write_string(key, &mut pick, out);
                    out.push(':');
                    write(value, noise, out);
                }
                out.push('}');
            }
        }
    }

    fn write_string(s: &str, pick: &mut impl FnMut(u8) -> u8, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if pick(4) == 0 => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
                '/' if pick(2) == 0 => out.push_str("\\/"),
                c => out.push(c),
            }
        }
        out.push('"');
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The one-pass writer and the tree writer agree on every document:
        /// the same bytes, or the same reason there are none.
        #[test]
        fn the_one_pass_and_the_tree_writer_agree(json in json(), noise in prop::collection::vec(any::<u8>(), 0..256)) {
            let mut text = String::new();
            write(&json, &mut noise.into_iter().cycle(), &mut text);
            prop_assert_eq!(canonical(text.as_bytes()), tree_canonical(text.as_bytes()), "{}", text);
        }
    }

    #[test]
    fn entries_out_of_order_are_moved_once_and_nested_objects_stay_whole() {
        let text = br#"{"z":{"b":[{"d":1,"c":2}],"a":"x"},"a\u0062":3,"a":{"y":null,"x":true}}"#;
        let expected = r#"{"a":{"x":true,"y":null},"ab":3,"z":{"a":"x","b":[{"c":2,"d":1}]}}"#;
        assert_eq!(canonical(text).as_deref(), Ok(expected.as_bytes()));
        assert_eq!(
            canonical(br#"{"b":1,"a":2,"b":3}"#),
            Err(NotCanonical::DuplicateKey)
        );
        assert_eq!(
            canonical(br#"{"a":1,"\u0061":2}"#),
            Err(NotCanonical::DuplicateKey),
            "in order, but the same key once unescaped"
        );
    }
}
