//! Property tests of the request fingerprint (issue 10): what must not
//! change it (object key order, whitespace, string escapes, query parameter
//! order, header case) and what must (any value, a number's text, the path,
//! a query value, the method).

use lambda_http::{http, Body, Request};
use lambda_idempotency::http::request_fingerprint;
use proptest::{
    prelude::*,
    test_runner::{RngAlgorithm, TestRng},
};
use std::fmt::Write;

/// A JSON document, with numbers as the text a client sent.
#[derive(Debug, Clone)]
enum Doc {
    Null,
    Bool(bool),
    Number(String),
    Text(String),
    Array(Vec<Doc>),
    Object(Vec<(String, Doc)>),
}

/// JSON number texts: integers of any width, decimals, exponents.
fn number() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        "(0|[1-9][0-9]{0,30})",
        proptest::option::of("[0-9]{1,20}"),
        proptest::option::of((
            prop_oneof![Just("e"), Just("E")],
            prop_oneof![Just(""), Just("+"), Just("-")],
            "[0-9]{1,3}",
        )),
    )
        .prop_map(|(negative, int, fraction, exponent)| {
            let mut text = String::new();
            if negative {
                text.push('-');
            }
            text.push_str(&int);
            if let Some(fraction) = fraction {
                text.push('.');
                text.push_str(&fraction);
            }
            if let Some((e, sign, digits)) = exponent {
                text.push_str(e);
                text.push_str(sign);
                text.push_str(&digits);
            }
            text
        })
}

fn doc() -> impl Strategy<Value = Doc> {
    let leaf = prop_oneof![
        Just(Doc::Null),
        any::<bool>().prop_map(Doc::Bool),
        number().prop_map(Doc::Number),
        any::<String>().prop_map(Doc::Text),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Doc::Array),
            prop::collection::btree_map("[a-z\u{e9}\"\\\\]{0,6}", inner, 0..6)
                .prop_map(|entries| Doc::Object(entries.into_iter().collect())),
        ]
    })
}

/// Renders `doc` as JSON text; with an `rng`, in a random but equivalent
/// form: objects' keys shuffled, whitespace added, characters escaped.
fn render(doc: &Doc, rng: &mut Option<TestRng>, out: &mut String) {
    let space = |rng: &mut Option<TestRng>, out: &mut String| {
        if let Some(rng) = rng {
            for _ in 0..rng.next_u32() % 3 {
                out.push([' ', '\n', '\t', '\r'][(rng.next_u32() % 4) as usize]);
            }
        }
    };
    space(rng, out);
    match doc {
        Doc::Null => out.push_str("null"),
        Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Doc::Number(text) => out.push_str(text),
        Doc::Text(text) => render_string(text, rng, out),
        Doc::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                render(item, rng, out);
            }
            space(rng, out);
            out.push(']');
        }
        Doc::Object(entries) => {
            let mut order: Vec<usize> = (0..entries.len()).collect();
            if let Some(rng) = rng {
                for i in (1..order.len()).rev() {
                    order.swap(i, (rng.next_u32() as usize) % (i + 1));
                }
            }
            out.push('{');
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                space(rng, out);
                render_string(&entries[i].0, rng, out);
                space(rng, out);
                out.push(':');
                render(&entries[i].1, rng, out);
            }
            space(rng, out);
            out.push('}');
        }
    }
}

fn render_string(text: &str, rng: &mut Option<TestRng>, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        let escape = rng.as_mut().is_some_and(|rng| rng.next_u32() % 4 == 0);
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if escape => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04X}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn text(doc: &Doc, seed: Option<[u8; 32]>) -> String {
    let mut rng = seed.map(|seed| TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let mut out = String::new();
    render(doc, &mut rng, &mut out);
    out
}

fn request(method: &str, target: &str, content_type: &str, body: &str) -> Request {
    http::Request::builder()
        .method(method)
        .uri(target)
        .header("content-type", content_type)
        .body(Body::from(body.to_owned()))
        .expect("request")
}

fn fingerprint_of(body: &str) -> String {
    request_fingerprint(&request("POST", "/v1/charges", "application/json", body)).to_string()
}

/// Every leaf of `doc`, by its path (indices into arrays and objects).
fn leaves(doc: &Doc, path: &mut Vec<usize>, found: &mut Vec<Vec<usize>>) {
    match doc {
        Doc::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i);
                leaves(item, path, found);
                path.pop();
            }
        }
        Doc::Object(entries) => {
            for (i, (_, value)) in entries.iter().enumerate() {
                path.push(i);
                leaves(value, path, found);
                path.pop();
            }
        }
        _ => found.push(path.clone()),
    }
}

fn leaf_mut<'a>(doc: &'a mut Doc, path: &[usize]) -> &'a mut Doc {
    match (doc, path.split_first()) {
        (doc, None) => doc,
        (Doc::Array(items), Some((i, rest))) => leaf_mut(&mut items[*i], rest),
        (Doc::Object(entries), Some((i, rest))) => leaf_mut(&mut entries[*i].1, rest),
        (doc, Some(_)) => doc,
    }
}

/// Another value for a leaf, one a handler can tell apart.
fn changed(leaf: &Doc) -> Doc {
    match leaf {
        Doc::Null => Doc::Bool(false),
        Doc::Bool(b) => Doc::Bool(!b),
        // One more significant digit: beyond what an f64 holds, if need be.
        Doc::Number(text) => match text.find(['e', 'E']) {
            Some(e) if text[..e].contains('.') => {
                Doc::Number(format!("{}1{}", &text[..e], &text[e..]))
            }
            Some(e) => Doc::Number(format!("{}.0{}", &text[..e], &text[e..])),
            None if text.contains('.') => Doc::Number(format!("{text}1")),
            None => Doc::Number(format!("{text}.0")),
        },
        Doc::Text(text) => Doc::Text(format!("{text}x")),
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        // Integration tests have no lib.rs beside them to persist to; a
        // failure prints its minimal input instead.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn key_order_whitespace_and_escapes_do_not_change_it(
        doc in doc(),
        seed_a in any::<[u8; 32]>(),
        seed_b in any::<[u8; 32]>(),
    ) {
        let (a, b) = (text(&doc, Some(seed_a)), text(&doc, Some(seed_b)));
        prop_assert_eq!(fingerprint_of(&a), fingerprint_of(&b), "{} vs {}", a, b);
        prop_assert_eq!(fingerprint_of(&a), fingerprint_of(&text(&doc, None)));
    }

    #[test]
    fn any_changed_value_changes_it(doc in doc(), pick in any::<prop::sample::Index>()) {
        let mut found = Vec::new();
        leaves(&doc, &mut Vec::new(), &mut found);
        prop_assume!(!found.is_empty());
        let path = pick.get(&found);
        let mut other = doc.clone();
        let leaf = leaf_mut(&mut other, path);
        *leaf = changed(leaf);
        prop_assert_ne!(
            fingerprint_of(&text(&doc, None)),
            fingerprint_of(&text(&other, None)),
            "{} vs {}", text(&doc, None), text(&other, None)
        );
    }

    #[test]
    fn query_order_does_not_change_it_but_values_method_and_path_do(
        pairs in prop::collection::vec(("[a-d]{1,2}", "[a-z0-9%+]{0,4}"), 0..8),
        shuffle in any::<[u8; 32]>(),
        pick in any::<prop::sample::Index>(),
    ) {
        let query = |pairs: &[(String, String)]| {
            pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
        };
        let fingerprint = |method: &str, path: &str, pairs: &[(String, String)]| {
            request_fingerprint(&request(method, &format!("{path}?{}", query(pairs)), "application/json", "{}"))
        };
        let base = fingerprint("POST", "/v1/charges", &pairs);
        // Another order in which each name keeps the order of its values.
        let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &shuffle);
        let mut names: Vec<&String> = pairs.iter().map(|(k, _)| k).collect();
        names.dedup();
        let mut reordered = Vec::new();
        let mut remaining: Vec<(String, String)> = pairs.clone();
        while !remaining.is_empty() {
            let name = remaining[(rng.next_u32() as usize) % remaining.len()].0.clone();
            let first = remaining.iter().position(|(k, _)| *k == name).expect("present");
            reordered.push(remaining.remove(first));
        }
        prop_assert_eq!(&base, &fingerprint("POST", "/v1/charges", &reordered));
        prop_assert_ne!(&base, &fingerprint("PATCH", "/v1/charges", &pairs));
        prop_assert_ne!(&base, &fingerprint("POST", "/v1/refunds", &pairs));
        if !pairs.is_empty() {
            let mut other = pairs.clone();
            let i = pick.index(other.len());
            other[i].1.push('x');
            prop_assert_ne!(&base, &fingerprint("POST", "/v1/charges", &other));
        }
    }

    #[test]
    fn content_type_case_and_parameters_do_not_change_it(doc in doc()) {
        let body = text(&doc, None);
        let canonical = request_fingerprint(&request("POST", "/x", "application/json", &body));
        for content_type in [
            "Application/JSON",
            "application/json; charset=UTF-8",
            "APPLICATION/JSON ;charset=utf-8",
        ] {
            let other = http::Request::post("/x")
                .header("Content-Type", content_type)
                .body(Body::from(body.clone()))
                .expect("request");
            prop_assert_eq!(&canonical, &request_fingerprint(&other));
        }
    }
}

/// The leaves `changed` produces really are other numbers to a handler.
#[test]
fn changed_numbers_differ_beyond_an_f64() {
    for (a, b) in [
        ("0.1", "0.11"),
        ("1", "1.0"),
        ("1e5", "1.0e5"),
        ("100000000000000000000001", "100000000000000000000001.0"),
    ] {
        assert_eq!(changed(&Doc::Number(a.into())).as_number(), b);
    }
}

impl Doc {
    fn as_number(&self) -> &str {
        match self {
            Doc::Number(text) => text,
            _ => "",
        }
    }
}
