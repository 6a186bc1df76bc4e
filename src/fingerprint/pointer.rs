//! [`JsonPointer`]: an RFC 6901 pointer, checked once where it is written.

use std::fmt;

/// A JSON pointer (RFC 6901), such as `/id` or `/data/object/id`: where in
/// a JSON document a key ([`KeySource::json_pointer`])
/// or a part of the fingerprint ([`Fingerprint::of_json_pointers`](crate::Fingerprint::of_json_pointers))
/// is read.
///
/// Checked when it is made, so that a pointer written without its leading
/// `/` (`"id"`, which points at nothing) is an error in `main` rather than
/// a silent miss on every request.
///
/// ```
/// use lambda_idempotency::JsonPointer;
///
/// let amount = JsonPointer::new("/amount")?;
/// assert_eq!(amount.as_str(), "/amount");
/// assert!(JsonPointer::new("amount").is_err());
/// # Ok::<(), lambda_idempotency::InvalidJsonPointer>(())
/// ```
#[cfg_attr(
    feature = "http",
    doc = "",
    doc = "[`KeySource::json_pointer`]: crate::http::KeySource::json_pointer"
)]
#[cfg_attr(
    not(feature = "http"),
    doc = "",
    doc = "[`KeySource::json_pointer`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.KeySource.html#method.json_pointer"
)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonPointer(String);

impl JsonPointer {
    /// `pointer`, if it is one: empty (the whole document), or `/` and
    /// reference tokens, with `~` only in `~0` (a `~`) and `~1` (a `/`).
    pub fn new(pointer: impl Into<String>) -> Result<Self, InvalidJsonPointer> {
        let pointer = pointer.into();
        let escapes_valid = pointer
            .split('~')
            .skip(1)
            .all(|after| after.starts_with('0') || after.starts_with('1'));
        if (pointer.is_empty() || pointer.starts_with('/')) && escapes_valid {
            Ok(Self(pointer))
        } else {
            Err(InvalidJsonPointer { pointer })
        }
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A JSON pointer that is not one (RFC 6901), from [`JsonPointer::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidJsonPointer {
    /// The pointer as given.
    pub pointer: String,
}

impl fmt::Display for InvalidJsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hint = match self.pointer.strip_prefix('/') {
            None if !self.pointer.is_empty() => format!(" (did you mean \"/{}\"?)", self.pointer),
            _ => " (a `~` is escaped as `~0`, a `/` inside a name as `~1`)".to_owned(),
        };
        write!(
            f,
            "{:?} is not a JSON pointer (RFC 6901): it must be empty or start with `/`, as \"/id\" or \"/data/object/id\" do{hint}",
            self.pointer
        )
    }
}

impl std::error::Error for InvalidJsonPointer {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_are_checked_when_made() {
        for valid in [
            "",
            "/",
            "/id",
            "/data/object/id",
            "/a~1b",
            "/m~0n",
            "/items/0",
        ] {
            assert!(JsonPointer::new(valid).is_ok(), "{valid:?}");
        }
        let Err(error) = JsonPointer::new("id") else {
            panic!("\"id\" has no leading /");
        };
        assert_eq!(error.pointer, "id");
        assert!(
            error.to_string().contains(r#"did you mean "/id"?"#),
            "{error}"
        );
        for invalid in ["data/id", "/a~2b", "/a~", "~1"] {
            assert!(JsonPointer::new(invalid).is_err(), "{invalid:?}");
        }
    }
}
