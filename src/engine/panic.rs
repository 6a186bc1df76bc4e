//! Panics in operations, told in logs.

use std::any::Any;

/// The text a panic was raised with, when it was a string (as `panic!`
/// and `unwrap` raise).
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)")
}
