//! Real event shapes with arbitrary contents (issue 10): every example event
//! under `tests/data/`, with random parts replaced by random JSON, through
//! the whole HTTP layer. Never a panic; only the handler's answer or a 400;
//! one scope and one fingerprint per event. The `http_event` fuzz target
//! (`make fuzz`) runs the same check on arbitrary bytes.

#[path = "support/http_event.rs"]
mod http_event;

use proptest::prelude::*;
use serde_json::{Map, Value};
use std::sync::OnceLock;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    })
}

/// Every JSON event under tests/data (ours and upstream) and events/.
fn events() -> &'static [Value] {
    static EVENTS: OnceLock<Vec<Value>> = OnceLock::new();
    EVENTS.get_or_init(|| {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut events = Vec::new();
        for dir in [
            "tests/data",
            "tests/data/upstream/aws_lambda_events",
            "tests/data/upstream/lambda_http",
            "events",
        ] {
            for entry in std::fs::read_dir(format!("{root}/{dir}")).expect("fixture folder") {
                let path = entry.expect("entry").path();
                if path.extension().is_some_and(|e| e == "json") {
                    let text = std::fs::read_to_string(&path).expect("fixture");
                    events.push(serde_json::from_str(&text).expect("fixture JSON"));
                }
            }
        }
        events
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[ -~]{0,12}".prop_map(Value::String),
        Just(Value::String("key-one,key-two".into())),
        Just(Value::String("POST".into())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z-]{1,8}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Paths to every node of `value`.
fn paths(value: &Value, path: &mut Vec<String>, found: &mut Vec<Vec<String>>) {
    found.push(path.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                path.push(key.clone());
                paths(child, path, found);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                path.push(i.to_string());
                paths(child, path, found);
                path.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(value: &'a mut Value, path: &[String]) -> &'a mut Value {
    match path.split_first() {
        None => value,
        Some((step, rest)) => match value {
            Value::Object(map) => node_mut(map.get_mut(step).expect("path"), rest),
            Value::Array(items) => {
                node_mut(&mut items[step.parse::<usize>().expect("index")], rest)
            }
            other => other,
        },
    }
}

/// A replacement for `node` of the same JSON type (so the event keeps its
/// shape and still parses), or, with `anything`, any JSON at all.
fn replacement(node: &Value, seed: &Value, anything: bool) -> Value {
    if anything {
        return seed.clone();
    }
    match (node, seed) {
        (Value::String(_), Value::String(_) | Value::Number(_) | Value::Bool(_)) => {
            Value::String(match seed {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            })
        }
        (Value::Number(_), Value::Number(_)) | (Value::Bool(_), Value::Bool(_)) => seed.clone(),
        (Value::Null, _) => seed.clone(),
        _ => node.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn real_shapes_with_arbitrary_contents_never_break_the_layer(
        which in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(
            (any::<prop::sample::Index>(), json_value(), prop::bool::weighted(0.1)),
            1..6,
        ),
    ) {
        let mut event = which.get(events()).clone();
        for (at, seed, anything) in mutations {
            let mut found = Vec::new();
            paths(&event, &mut Vec::new(), &mut found);
            // Never the whole event: keep its shape recognisable.
            found.retain(|path| !path.is_empty());
            if found.is_empty() {
                break;
            }
            let path = at.get(&found).clone();
            let node = node_mut(&mut event, &path);
            *node = replacement(node, &seed, anything);
        }
        http_event::check(runtime(), &event.to_string());
    }
}

#[test]
fn every_fixture_passes_unchanged() {
    for event in events() {
        http_event::check(runtime(), &event.to_string());
    }
}
