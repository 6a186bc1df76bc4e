//! The per-thread buffers of the canonical-JSON writer
//! (`src/fingerprint/streaming.rs`, `Spare`): a fingerprint must be the
//! same whatever the thread fingerprinted before (valid, invalid, huge,
//! deep, duplicate keys, escapes, bodies around the 64 KiB cap), on many
//! threads at once, on tokio workers, during thread exit, and through a
//! real axum server.
//!
//! The oracle is the same fingerprint computed on a fresh thread: its
//! thread-local buffers are empty, as a writer's own buffers would be.

use axum::{routing::post, Router};
use bytes::Bytes;
use http::Request;
use lambda_idempotency::{
    http::{request_fingerprint, FingerprintSource, IdempotencyLayer, REPLAYED_HEADER},
    Engine, Fingerprint, JsonPointer, MemoryStore,
};
use proptest::prelude::*;
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

const CAP: usize = 64 * 1024;

fn fp(body: &[u8]) -> Fingerprint {
    let request = Request::post("/v1/charges?b=2&a=1")
        .body(body.to_vec())
        .expect("request");
    request_fingerprint(&request)
}

/// Everything a fingerprint of `body` can be computed by (the whole
/// request, pointers, `of_json` of a value parsed from it).
fn all(body: &[u8]) -> (Fingerprint, Fingerprint, Option<Fingerprint>) {
    let pointers = [
        JsonPointer::new("/a").expect("pointer"),
        JsonPointer::new("/b/0").expect("pointer"),
    ];
    let value = serde_json::from_slice::<serde_json::Value>(body).ok();
    (
        fp(body),
        Fingerprint::of_json_pointers(body, &pointers),
        value.map(|value| Fingerprint::of_json(&value).expect("serialisable")),
    )
}

fn fresh(body: &[u8]) -> (Fingerprint, Fingerprint, Option<Fingerprint>) {
    let body = body.to_vec();
    std::thread::spawn(move || all(&body))
        .join()
        .expect("no panic on a fresh thread")
}

// ---------------------------------------------------------------------
// A generator of documents of every kind.

const KEYS: &[&str] = &[
    "a",
    "b",
    "ab",
    "aa",
    "",
    "é",
    "e\u{301}",
    "z",
    "\u{1F600}",
    "A",
    "a\"q",
    "back\\slash",
    "nl\n",
    "ctl\u{1}",
    "\u{7f}",
    "\u{2028}",
    "id",
    "amount",
    "0",
    "10",
    "9",
];
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "12345678901234567890123",
    "1.0",
    "1.50",
    "-0.0",
    "1e3",
    "1E+03",
    "1e-3",
    "2.5E-0",
    "0e0",
    "-1.5e+10",
    "123456789012345678901234567890e-5",
];

struct Gen {
    rng: fastrand::Rng,
    /// Whether the document may be refused (duplicates, damage).
    hostile: bool,
    /// Plain integers only (for the serde_json oracle).
    plain: bool,
}

impl Gen {
    fn ws(&mut self, out: &mut Vec<u8>) {
        if self.rng.u8(..) < 60 {
            for _ in 0..self.rng.usize(1..4) {
                out.push(*self.rng.choice(b" \t\n\r").expect("ws"));
            }
        }
    }

    fn string(&mut self, text: &str, out: &mut Vec<u8>) {
        out.push(b'"');
        for c in text.chars() {
            let escape = self.rng.u8(..) < 50;
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                c if (c as u32) < 0x20 => {
                    out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
                }
                '/' if escape => out.extend_from_slice(b"\\/"),
                c if escape => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let hex = if self.rng.bool() {
                            format!("\\u{:04x}", unit)
                        } else {
                            format!("\\u{:04X}", unit)
                        };
                        out.extend_from_slice(hex.as_bytes());
                    }
                }
                c => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        out.push(b'"');
    }

    fn text(&mut self) -> String {
        let len = self.rng.usize(0..12);
        (0..len)
            .map(|_| match self.rng.u8(0..10) {
                0 => '"',
                1 => '\\',
                2 => 'é',
                3 => '\u{1F600}',
                4 => '\n',
                5 => '/',
                _ => self.rng.alphanumeric(),
            })
            .collect()
    }

    fn value(&mut self, depth: usize, out: &mut Vec<u8>) {
        self.ws(out);
        let kind = if depth > 5 {
            self.rng.u8(0..4)
        } else {
            self.rng.u8(0..7)
        };
        match kind {
            0 => out.extend_from_slice(
                self.rng
                    .choice([&b"null"[..], b"true", b"false"])
                    .expect("lit"),
            ),
            1 if self.plain => out.extend_from_slice(
                self.rng
                    .choice(["0", "1", "-1", "42", "123456"])
                    .expect("n")
                    .as_bytes(),
            ),
            1 => out.extend_from_slice(self.rng.choice(NUMBERS).expect("n").as_bytes()),
            2 | 3 => {
                let text = self.text();
                self.string(&text, out)
            }
            4 => {
                out.push(b'[');
                let n = self.rng.usize(0..5);
                for i in 0..n {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.value(depth + 1, out);
                }
                self.ws(out);
                out.push(b']');
            }
            _ => {
                let n = self.rng.usize(0..7);
                self.object(depth, n, out)
            }
        }
        self.ws(out);
    }

    fn object(&mut self, depth: usize, n: usize, out: &mut Vec<u8>) {
        let mut keys: Vec<String> = Vec::new();
        while keys.len() < n {
            let key = if self.rng.bool() {
                self.rng.choice(KEYS).expect("key").to_string()
            } else {
                self.text()
            };
            if self.hostile || !keys.contains(&key) {
                keys.push(key);
            } else if keys.len() > KEYS.len() {
                break;
            }
        }
        if self.rng.bool() {
            keys.sort();
            if self.rng.bool() {
                keys.reverse();
            }
        }
        out.push(b'{');
        for (i, key) in keys.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            self.ws(out);
            self.string(key, out);
            self.ws(out);
            out.push(b':');
            self.value(depth + 1, out);
        }
        self.ws(out);
        out.push(b'}');
    }

    /// A wide object (many entries: the entries and root-order buffers
    /// around and past the cap), keys shuffled or in order.
    fn wide(&mut self, n: usize, out: &mut Vec<u8>) {
        let mut keys: Vec<usize> = (0..n).collect();
        if self.rng.bool() {
            self.rng.shuffle(&mut keys);
        }
        out.push(b'{');
        for (i, key) in keys.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(format!("\"k{key:06}\":{{\"y\":1,\"x\":[{key}]}}").as_bytes());
        }
        out.push(b'}');
    }

    fn document(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        match self.rng.u8(0..14) {
            // Around the 64 KiB cap: one long string (the out buffer).
            0 => {
                let len = (CAP as isize + self.rng.isize(-40..40)).max(0) as usize;
                let pad = "x".repeat(len);
                let doc = if self.rng.bool() {
                    format!(r#"{{"z":"{pad}","a":[{{"d":1,"c":"é\n"}}]}}"#)
                } else {
                    format!(r#"["{pad}",{{"b":1,"a":2}}]"#)
                };
                out.extend_from_slice(doc.as_bytes());
            }
            // Scratch buffer past the cap: a nested, unsorted object with
            // escaped (hence copied) content over 64 KiB.
            1 => {
                let pad = "\\u00e9".repeat(CAP / 2 + self.rng.usize(0..4000) - 2000);
                out.extend_from_slice(format!(r#"{{"o":{{"z":"{pad}","a":1}},"a":0}}"#).as_bytes());
            }
            // Many entries (the entries and the root order buffers).
            2 => {
                let n = *self
                    .rng
                    .choice(&[1, 2, 100, 1600, 1700, 4090, 4200])
                    .expect("n");
                self.wide(n, &mut out)
            }
            // Deep nesting around the limit (128).
            3 => {
                let depth = self.rng.usize(120..135);
                for i in 0..depth {
                    out.extend_from_slice(if i % 2 == 0 { b"{\"b\":1,\"a\":" } else { b"[" });
                }
                out.extend_from_slice(b"0");
                for i in (0..depth).rev() {
                    out.extend_from_slice(if i % 2 == 0 { b"}" } else { b"]" });
                }
            }
            // Invalid UTF-8 / not JSON at all.
            4 => {
                out.extend_from_slice(b"{\"a\":\"");
                out.push(0xff);
                out.extend_from_slice(b"\"}");
            }
            5 => out.extend_from_slice(
                self.rng
                    .choice([
                        &b""[..],
                        b" ",
                        b"{",
                        b"}",
                        b"nul",
                        b"1 2",
                        b"{}x",
                        b"[]]",
                        b"\"\\x\"",
                    ])
                    .expect("x"),
            ),
            _ => {
                if self.rng.bool() {
                    let n = self.rng.usize(0..9);
                    self.object(0, n, &mut out);
                } else {
                    self.value(0, &mut out);
                }
            }
        }
        // Damage: truncate, insert a byte, or append trailing garbage.
        if self.hostile && !out.is_empty() && self.rng.u8(..) < 70 {
            match self.rng.u8(0..3) {
                0 => out.truncate(self.rng.usize(0..out.len())),
                1 => {
                    let at = self.rng.usize(0..=out.len());
                    let byte = *self.rng.choice(b"{}[]\",:\\ a0\x00\xc3").expect("b");
                    out.insert(at, byte);
                }
                _ => out.extend_from_slice(b",{\"a\":1}"),
            }
        }
        out
    }
}

fn documents(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut gen = Gen {
        rng: fastrand::Rng::with_seed(seed),
        hostile: seed.is_multiple_of(3),
        plain: false,
    };
    (0..n).map(|_| gen.document()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    /// A sequence of documents on one thread: each fingerprint is the one a
    /// fresh thread computes.
    #[test]
    fn a_threads_earlier_documents_never_change_a_fingerprint(seed in any::<u64>(), n in 1usize..10) {
        let docs = documents(seed, n);
        for (i, doc) in docs.iter().enumerate() {
            let here = all(doc);
            let there = fresh(doc);
            prop_assert_eq!(&here, &there, "document {} of seed {}: {:?}", i, seed,
                String::from_utf8_lossy(&doc[..doc.len().min(300)]));
            // Twice in a row: the second through the buffers the first left.
            prop_assert_eq!(all(doc), here);
        }
    }
}

/// An independent oracle where one exists: for a document with no
/// duplicate keys and only plain integers, serde_json's sorted form (a
/// `BTreeMap`) is the canonical form, so both have one fingerprint.
#[test]
fn the_fingerprint_is_that_of_serde_jsons_sorted_form_for_plain_documents() {
    let mut checked = 0;
    for seed in 0..3000u64 {
        let mut gen = Gen {
            rng: fastrand::Rng::with_seed(seed),
            hostile: false,
            plain: true,
        };
        let mut doc = Vec::new();
        let n = gen.rng.usize(0..9);
        gen.object(0, n, &mut doc);
        let text = String::from_utf8(doc.clone()).expect("utf-8");
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&doc) else {
            continue;
        };
        let sorted = serde_json::to_vec(&value).expect("serialises");
        // Warm the thread's buffers with something else first.
        fp(&documents(seed, 1)[0]);
        assert_eq!(fp(&doc), fp(&sorted), "{text}");
        checked += 1;
    }
    assert!(checked > 500, "only {checked} plain documents");
}

/// Bodies just under, at and over the cap, in every order, on one thread.
#[test]
fn bodies_around_the_cap_in_any_order() {
    let bodies: Vec<Vec<u8>> = [
        CAP - 20,
        CAP - 9,
        CAP - 8,
        CAP - 7,
        CAP - 1,
        CAP,
        CAP + 1,
        CAP + 64,
        2 * CAP,
        10,
    ]
    .iter()
    .flat_map(|&len| {
        let pad = "y".repeat(len.saturating_sub(9));
        [
            format!(r#"{{"b":"{pad}","a":1}}"#).into_bytes(),
            format!(r#"{{"a":1,"b":"{pad}"}}"#).into_bytes(),
            format!(r#"{{"b":"{pad}","a":1,"a":2}}"#).into_bytes(),
            format!(r#"{{"b":"{pad}","a":1"#).into_bytes(),
        ]
    })
    .collect();
    let expected: Vec<_> = bodies.iter().map(|b| fresh(b)).collect();
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..400 {
        let i = rng.usize(0..bodies.len());
        assert_eq!(all(&bodies[i]), expected[i], "body {i}");
    }
}

/// A shared corpus fingerprinted at once on many OS threads and on the
/// workers of a multi-thread tokio runtime, each in its own order.
#[test]
fn many_threads_and_tokio_workers_agree_with_a_fresh_thread() {
    let corpus: Arc<Vec<Vec<u8>>> = Arc::new((0..40).flat_map(|seed| documents(seed, 6)).collect());
    let expected: Arc<Vec<_>> = Arc::new(corpus.iter().map(|doc| fresh(doc)).collect());
    let threads: Vec<_> = (0..12)
        .map(|t| {
            let (corpus, expected) = (Arc::clone(&corpus), Arc::clone(&expected));
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t);
                for _ in 0..3 * corpus.len() {
                    let i = rng.usize(0..corpus.len());
                    assert_eq!(all(&corpus[i]), expected[i], "thread {t}, document {i}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no thread panicked");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(6)
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let tasks: Vec<_> = (0..corpus.len() * 4)
            .map(|k| {
                let (corpus, expected) = (Arc::clone(&corpus), Arc::clone(&expected));
                tokio::spawn(async move {
                    let i = (k * 7919) % corpus.len();
                    let first = all(&corpus[i]);
                    tokio::task::yield_now().await;
                    let j = (k * 104729 + 3) % corpus.len();
                    assert_eq!(all(&corpus[j]), expected[j]);
                    assert_eq!(first, expected[i]);
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("no task panicked");
        }
    });
}

struct OnExit {
    body: Vec<u8>,
    done: std::sync::mpsc::Sender<
        std::thread::Result<(Fingerprint, Fingerprint, Option<Fingerprint>)>,
    >,
}

impl Drop for OnExit {
    fn drop(&mut self) {
        let body = self.body.clone();
        let _ = self.done.send(std::panic::catch_unwind(move || all(&body)));
    }
}

thread_local! {
    static ON_EXIT: std::cell::RefCell<Option<OnExit>> = const { std::cell::RefCell::new(None) };
}

/// A fingerprint computed by another thread-local's destructor, as the
/// thread exits (before or after the writer's buffers are destroyed), is
/// still right, and nothing panics.
#[test]
fn a_fingerprint_during_thread_exit() {
    let small = br#"{"b":[1,{"d":1,"c":2}],"a":"\u00e9"}"#.to_vec();
    let expected = fresh(&small);
    for order in 0..4 {
        let (done, results) = std::sync::mpsc::channel();
        let body = small.clone();
        let thread = std::thread::spawn(move || {
            if order % 2 == 0 {
                all(br#"{"z":1,"y":{"x":2,"w":3}}"#);
            }
            ON_EXIT.with(|slot| *slot.borrow_mut() = Some(OnExit { body, done }));
            if order % 2 == 1 {
                all(br#"{"z":1,"y":{"x":2,"w":3}}"#);
            }
            if order >= 2 {
                all(format!(r#"{{"b":"{}","a":1}}"#, "q".repeat(CAP + 5)).as_bytes());
            }
        });
        thread.join().expect("the thread exits cleanly");
        let result = results.recv().expect("the destructor ran");
        assert_eq!(
            result.expect("no panic in the destructor"),
            expected,
            "order {order}"
        );
    }
}

// ---------------------------------------------------------------------
// Through a real server.

async fn serve(app: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("port");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serves");
    });
    (addr, server)
}

async fn send(addr: SocketAddr, key: &str, body: Vec<u8>) -> (u16, bool) {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post("/v1/charges")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let replayed = response.headers().contains_key(REPLAYED_HEADER);
    let status = response.status().as_u16();
    response.into_body().collect().await.expect("body");
    (status, replayed)
}

/// A server whose fingerprint source itself calls `request_fingerprint`
/// (and `Fingerprint::of_json`) several times per request: the same JSON
/// in another key order and spacing is a replay on any worker, after any
/// earlier bodies; another JSON is a 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_replays_the_same_json_and_refuses_another_whatever_came_before() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let source = FingerprintSource::from_fn(|request: &Request<Bytes>| {
        let first = request_fingerprint(request);
        let noise = format!(
            r#"{{"z":"{}","a":1}}"#,
            "n".repeat(request.body().len() % (2 * CAP))
        );
        let _ = fp(noise.as_bytes());
        let _ = Fingerprint::of_json(&serde_json::json!({"b": 1, "a": [1, 2]}));
        let second = request_fingerprint(request);
        assert_eq!(first, second);
        second
    });
    let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
        .shared_scope()
        .fingerprint_source(source);
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move |body: Bytes| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { format!("{}", body.len()) }
            }),
        )
        .layer(layer);
    let (addr, server) = serve(app).await;
    let mut tasks = Vec::new();
    for seed in 0..48u64 {
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            let pad = "p".repeat(if seed % 4 == 0 {
                CAP + rng.usize(0..50) - 25
            } else {
                rng.usize(0..100)
            });
            let a = format!(r#"{{"b":[{{"y":1,"x":"{pad}"}}],"a":"\u00e9{seed}"}}"#);
            let b =
                format!("{{ \"a\" : \"é{seed}\",\n \"b\" : [ {{\"x\":\"{pad}\" , \"y\":1}} ] }}");
            let other = format!(r#"{{"a":"é{seed}","b":[{{"x":"{pad}","y":2}}]}}"#);
            let key = format!("key-{seed}");
            let (first, replayed) = send(addr, &key, a.into_bytes()).await;
            assert_eq!((first, replayed), (200, false), "seed {seed}");
            // Another body (any size) through the same server in between.
            let noise = documents(seed, 1).remove(0);
            send(addr, &format!("noise-{seed}"), noise).await;
            assert_eq!(
                send(addr, &key, b.into_bytes()).await,
                (200, true),
                "seed {seed}: same JSON"
            );
            assert_eq!(
                send(addr, &key, other.into_bytes()).await.0,
                422,
                "seed {seed}: other JSON"
            );
        }));
    }
    for task in tasks {
        task.await.expect("no task panicked");
    }
    assert!(runs.load(Ordering::SeqCst) >= 48);
    server.abort();
    let _ = server.await;
}
