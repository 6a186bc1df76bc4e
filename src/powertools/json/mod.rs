//! JSON as the Powertools ports read and hash it. A payload
//! (`powertools_json`) is read once into a [`Json`] document that keeps
//! what each language's reader sees and serde_json drops: every number's
//! text, each string's UTF-16 code units (a lone surrogate escape survives,
//! as Python's `str` and JavaScript's strings keep it), and the members of
//! an object in document order. Each port's hash input is then written from
//! it: Python's `json.dumps(value, sort_keys=True)` ([`python::dumps`]) and
//! TypeScript's `JSON.stringify(deepSort(value))`
//! ([`javascript::stringify`]). One character of difference is a different
//! record id, and a miss.

pub(crate) mod javascript;
mod loads;
pub(crate) mod python;

pub(crate) use loads::{loads, Dialect};

use serde_json::Value;
use std::{cmp::Ordering, collections::HashMap};

/// A JSON document as read, before a language's reader made values of it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// The number's text as written (`-0`, `1.50`, `1E400`, a 30-digit
    /// integer), or Python's `NaN`, `Infinity`, `-Infinity`.
    Number(String),
    String(Utf16),
    Array(Vec<Json>),
    /// Members in document order, repeated names included.
    Object(Vec<(Utf16, Json)>),
}

/// A string as its UTF-16 code units: a lone surrogate (which Rust's
/// `String` cannot hold) survives; a valid pair is the character above the
/// BMP it encodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Utf16(pub(crate) Vec<u16>);

impl Utf16 {
    pub(crate) fn new(text: &str) -> Self {
        Self(text.encode_utf16().collect())
    }

    /// Code points (a lone surrogate is its own), the order Python sorts
    /// strings in, which UTF-16 code units do not follow above U+D7FF.
    fn code_points(&self) -> impl Iterator<Item = u32> + '_ {
        char::decode_utf16(self.0.iter().copied())
            .map(|unit| unit.map_or_else(|lone| u32::from(lone.unpaired_surrogate()), u32::from))
    }

    pub(crate) fn cmp_code_points(&self, other: &Self) -> Ordering {
        self.code_points().cmp(other.code_points())
    }

    pub(crate) fn eq_str(&self, text: &str) -> bool {
        self.0.iter().copied().eq(text.encode_utf16())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Json {
    /// The value of member `name`, the last of repeated ones (as both
    /// languages read them); `None` for anything but an object holding it.
    pub(crate) fn get(&self, name: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members
                .iter()
                .rev()
                .find(|(key, _)| key.eq_str(name))
                .map(|(_, value)| value),
            _ => None,
        }
    }

    /// The members of an object once each, with the last value of a
    /// repeated name at the position of its first (JavaScript's and
    /// Python's dicts both keep that position).
    pub(crate) fn unique_members(members: &[(Utf16, Json)]) -> Vec<(&Utf16, &Json)> {
        let mut unique: Vec<(&Utf16, &Json)> = Vec::with_capacity(members.len());
        let mut position: HashMap<&Utf16, usize> = HashMap::with_capacity(members.len());
        for (key, value) in members {
            match position.get(key) {
                Some(&at) => unique[at].1 = value,
                None => {
                    position.insert(key, unique.len());
                    unique.push((key, value));
                }
            }
        }
        unique
    }
}

/// An event's field as its JSON text would read: serde's numbers by the
/// text serde_json writes for them (the same integer, the same double).
impl From<&Value> for Json {
    fn from(value: &Value) -> Self {
        match value {
            Value::Null => Json::Null,
            Value::Bool(flag) => Json::Bool(*flag),
            Value::Number(number) => Json::Number(number.to_string()),
            Value::String(text) => Json::String(Utf16::new(text)),
            Value::Array(items) => Json::Array(items.iter().map(Json::from).collect()),
            Value::Object(map) => Json::Object(
                map.iter()
                    .map(|(key, value)| (Utf16::new(key), Json::from(value)))
                    .collect(),
            ),
        }
    }
}
