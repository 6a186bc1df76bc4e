//! Python's `json` module as Powertools (Python) uses it: `json.loads` of a
//! payload (`powertools_json`) and `json.dumps(value, sort_keys=True)` of
//! the selection it hashes into a record id. One character of difference is
//! a different id, and a miss, so the values keep what Python keeps and
//! serde_json does not: an integer's exact digits (`-0` is the integer 0, a
//! 30-digit id stays exact), lone surrogates in strings (`"\ud800"`), and
//! nesting deeper than serde_json's 128 levels.

mod dumps;
mod loads;

pub(crate) use dumps::dumps;
pub(crate) use loads::loads;

use serde_json::Value;
use std::cmp::Ordering;

/// A value as `json.loads` returns it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PyValue {
    None,
    Bool(bool),
    /// An `int`, as Python's `repr` writes it.
    Int(String),
    Float(f64),
    Str(PyStr),
    List(Vec<PyValue>),
    /// A `dict`, its keys sorted by code point (as `sort_keys` writes them)
    /// and unique (the last of repeated keys wins, as in Python).
    Dict(Vec<(PyStr, PyValue)>),
}

/// A Python `str`: its UTF-16 code units, so that a lone surrogate (which
/// Python keeps and Rust's `String` cannot hold) survives. A valid pair is
/// one code point above the BMP, as Python reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PyStr(pub(crate) Vec<u16>);

impl PyStr {
    pub(crate) fn new(text: &str) -> Self {
        Self(text.encode_utf16().collect())
    }

    /// Python's order of strings: by code point (a lone surrogate is its
    /// own code point), which UTF-16 code units do not follow above U+D7FF.
    fn code_points(&self) -> impl Iterator<Item = u32> + '_ {
        char::decode_utf16(self.0.iter().copied())
            .map(|unit| unit.map_or_else(|lone| u32::from(lone.unpaired_surrogate()), u32::from))
    }

    pub(crate) fn eq_str(&self, text: &str) -> bool {
        self.0.iter().copied().eq(text.encode_utf16())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Ord for PyStr {
    fn cmp(&self, other: &Self) -> Ordering {
        self.code_points().cmp(other.code_points())
    }
}

impl PartialOrd for PyStr {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PyValue {
    /// A dict from its entries in document order: sorted, the last of
    /// repeated keys kept.
    pub(crate) fn dict(mut entries: Vec<(PyStr, PyValue)>) -> Self {
        // Stable: repeated keys stay in document order, and the last wins.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut unique: Vec<(PyStr, PyValue)> = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            match unique.last_mut() {
                Some(last) if last.0 == key => last.1 = value,
                _ => unique.push((key, value)),
            }
        }
        PyValue::Dict(unique)
    }

    /// The value of `key` in a dict; `None` for anything else or no such key.
    pub(crate) fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            PyValue::Dict(entries) => entries
                .iter()
                .find(|(name, _)| name.eq_str(key))
                .map(|(_, value)| value),
            _ => None,
        }
    }

    /// Powertools' `is_missing_idempotency_key`: no key was found.
    pub(crate) fn is_missing(&self) -> bool {
        match self {
            PyValue::None => true,
            PyValue::Bool(_) | PyValue::Int(_) | PyValue::Float(_) => false,
            PyValue::Str(text) => text.is_empty(),
            PyValue::List(items) => items.iter().all(|item| *item == PyValue::None),
            PyValue::Dict(entries) => entries.iter().all(|(_, value)| *value == PyValue::None),
        }
    }
}

/// A serde value as Python would have read its JSON text: integers exact,
/// other numbers floats.
impl From<&Value> for PyValue {
    fn from(value: &Value) -> Self {
        match value {
            Value::Null => PyValue::None,
            Value::Bool(flag) => PyValue::Bool(*flag),
            Value::Number(number) if number.is_i64() || number.is_u64() => {
                PyValue::Int(number.to_string())
            }
            Value::Number(number) => PyValue::Float(number.as_f64().unwrap_or(f64::NAN)),
            Value::String(text) => PyValue::Str(PyStr::new(text)),
            Value::Array(items) => PyValue::List(items.iter().map(PyValue::from).collect()),
            Value::Object(map) => PyValue::dict(
                map.iter()
                    .map(|(key, value)| (PyStr::new(key), PyValue::from(value)))
                    .collect(),
            ),
        }
    }
}
