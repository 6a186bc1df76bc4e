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
/// Cloned and dropped without recursion (a JavaScript payload nests up to
/// 9,999 levels); compared and debugged recursively, which only the tests
/// do beyond the top level.
#[derive(Debug, PartialEq)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
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

impl Clone for Json {
    fn clone(&self) -> Self {
        /// A container being copied: what is left of the original, and the
        /// copy so far.
        enum Open<'a> {
            Array(std::slice::Iter<'a, Json>, Vec<Json>),
            Object(
                std::slice::Iter<'a, (Utf16, Json)>,
                Vec<(Utf16, Json)>,
                Utf16,
            ),
        }
        fn open(value: &Json) -> Result<Open<'_>, Json> {
            match value {
                Json::Array(items) => {
                    Ok(Open::Array(items.iter(), Vec::with_capacity(items.len())))
                }
                Json::Object(members) => Ok(Open::Object(
                    members.iter(),
                    Vec::with_capacity(members.len()),
                    Utf16::default(),
                )),
                Json::Null => Err(Json::Null),
                Json::Bool(flag) => Err(Json::Bool(*flag)),
                Json::Number(text) => Err(Json::Number(text.clone())),
                Json::String(text) => Err(Json::String(text.clone())),
            }
        }
        let mut stack = match open(self) {
            Ok(container) => vec![container],
            Err(scalar) => return scalar,
        };
        loop {
            let Some(top) = stack.last_mut() else {
                return Json::Null;
            };
            let next = match top {
                Open::Array(items, _) => items.next(),
                Open::Object(members, _, name) => members.next().map(|(key, item)| {
                    *name = key.clone();
                    item
                }),
            };
            let copied = match next.map(open) {
                Some(Ok(container)) => {
                    stack.push(container);
                    continue;
                }
                Some(Err(scalar)) => scalar,
                None => match stack.pop() {
                    Some(Open::Array(_, copy)) => Json::Array(copy),
                    Some(Open::Object(_, copy, _)) => Json::Object(copy),
                    None => Json::Null,
                },
            };
            match stack.last_mut() {
                None => return copied,
                Some(Open::Array(_, copy)) => copy.push(copied),
                Some(Open::Object(_, copy, name)) => copy.push((std::mem::take(name), copied)),
            }
        }
    }
}

impl Drop for Json {
    /// Containers nested in this one are emptied into a list first, so that
    /// none is dropped inside another's drop.
    fn drop(&mut self) {
        fn take_nested(value: &mut Json, into: &mut Vec<Json>) {
            let nested = |item: &Json| matches!(item, Json::Array(_) | Json::Object(_));
            match value {
                Json::Array(items) if items.iter().any(nested) => {
                    into.extend(items.drain(..).filter(nested));
                }
                Json::Object(members) if members.iter().any(|(_, item)| nested(item)) => {
                    into.extend(members.drain(..).map(|(_, item)| item).filter(nested));
                }
                _ => {}
            }
        }
        let mut pending = Vec::new();
        take_nested(self, &mut pending);
        while let Some(mut value) = pending.pop() {
            take_nested(&mut value, &mut pending);
        }
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
