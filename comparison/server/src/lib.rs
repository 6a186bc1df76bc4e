//! What the server benchmark's binaries share.

/// A JSON object of about `size` bytes.
pub fn json_body(size: usize) -> String {
    let mut body = String::from(r#"{"currency":"EUR","amount":1250,"customer":"cus_42","items":["#);
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
