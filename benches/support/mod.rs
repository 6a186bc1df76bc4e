//! What the benchmarks share.

/// A JSON object of about `size` bytes: `head` (its first fields, up to
/// and with `"items":[`), then items of a SKU and a quantity until the
/// object reaches the size.
pub fn json_with_items(head: &str, size: usize) -> String {
    let mut body = String::from(head);
    let mut i = 0;
    while body.len() < size - 40 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(r#"{{"sku":"item-{i:05}","qty":{}}}"#, i % 7 + 1));
        i += 1;
    }
    body.push_str("]}");
    body
}
