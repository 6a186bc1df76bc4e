//! The server benchmark: one axum app, 1 KB JSON POSTs from 64 keep-alive
//! connections for a fixed time, each implementation in a server process of
//! its own (so that its CPU time is its own), the load from this process.
//!
//! `server-bench run` prints the table; `server-bench serve <variant>` is
//! the server it starts. Variants: `bare` (the handler alone), `memory`,
//! `redis` (`IDEMPOTENCY_TEST_REDIS_URL`), `dynamodb`
//! (`AWS_ENDPOINT_URL_DYNAMODB`): this crate's layer on each store;
//! `axum-idempotent` (0.6, on its in-memory `MokaStore` session store).

use axum::{extract::Json, routing::post, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Request};
use hyper_util::rt::TokioIo;
use lambda_idempotency::{
    http::IdempotencyLayer, store::redis::RedisStore, DynamoDbStore, Engine, MemoryStore,
};
use serde_json::{json, Value};
use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};
use tokio::net::{TcpListener, TcpStream};

const CONNECTIONS: usize = 64;

async fn charge(Json(order): Json<Value>) -> (axum::http::StatusCode, Json<Value>) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    (
        axum::http::StatusCode::CREATED,
        Json(json!({ "id": format!("ch_{id}"), "amount": order["amount"] })),
    )
}

async fn app(variant: &str) -> Router {
    let routes = Router::new().route("/v1/charges", post(charge));
    match variant {
        "bare" => routes,
        "memory" => routes.layer(
            IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope(),
        ),
        "redis" => {
            let url = std::env::var("IDEMPOTENCY_TEST_REDIS_URL").expect("a Redis URL");
            let store = RedisStore::open(&url).expect("redis");
            routes.layer(IdempotencyLayer::new(Engine::builder(store).build()).shared_scope())
        }
        "dynamodb" => {
            let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
            let table = format!("server-bench-{}", std::process::id());
            let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), table);
            store.create_table().await.expect("table");
            routes.layer(IdempotencyLayer::new(Engine::builder(store).build()).shared_scope())
        }
        "axum-idempotent" => {
            use axum_idempotent::{IdempotentLayer, IdempotentOptions};
            use ruts::{store::moka::MokaStore, CookieOptions, Session, SessionLayer};
            let store = std::sync::Arc::new(MokaStore::builder().build());
            let session = SessionLayer::new(store).with_cookie_options(
                CookieOptions::build()
                    .name("session")
                    .max_age(3600)
                    .path("/"),
            );
            // A session must exist before anything is cached: the client
            // opens one per connection.
            let open = post(|session: Session<MokaStore>| async move {
                session
                    .set(
                        "open",
                        &true,
                        ruts::store::Ttl::new(3600).expect("ttl"),
                        None,
                    )
                    .await
                    .expect("session");
                "open"
            });
            routes
                .route("/session", open)
                .layer(IdempotentLayer::<MokaStore>::new(
                    IdempotentOptions::new(3600)
                        .use_idempotency_key_header(Some("idempotency-key"), true),
                ))
                .layer(session)
                .layer(tower_cookies::CookieManagerLayer::new())
        }
        other => panic!("unknown variant {other}"),
    }
}

async fn serve(variant: &str) {
    let router = app(variant).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{}", listener.local_addr().expect("address").port());
    axum::serve(listener, router).await.expect("serve");
}

/// One connection's requests until `until`: latencies in microseconds.
async fn connection(
    port: u16,
    index: usize,
    repeated: bool,
    session: bool,
    body: Bytes,
    until: Instant,
) -> Vec<u64> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut cookie = None;
    if session {
        let response = sender
            .send_request(
                Request::post("/session")
                    .header(header::HOST, "localhost")
                    // Its layer asks every request for a key, this one too.
                    .header("idempotency-key", format!("session-{index}"))
                    .body(Full::new(Bytes::new()))
                    .expect("request"),
            )
            .await
            .expect("session");
        assert!(
            response.status().is_success(),
            "opening a session: {}",
            response.status()
        );
        cookie = response
            .headers()
            .get(header::SET_COOKIE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .map(str::to_owned);
        response.into_body().collect().await.expect("body");
    }
    let mut latencies = Vec::new();
    let mut i = 0u64;
    while Instant::now() < until {
        let key = if repeated {
            format!("k-{index}")
        } else {
            format!("k-{index}-{i}")
        };
        let mut request = Request::post("/v1/charges")
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key);
        if let Some(cookie) = &cookie {
            request = request.header(header::COOKIE, cookie);
        }
        let started = Instant::now();
        let response = sender
            .send_request(request.body(Full::new(body.clone())).expect("request"))
            .await
            .expect("response");
        assert!(response.status().is_success(), "{}", response.status());
        let replayed = response.headers().contains_key("idempotent-replayed")
            || response.headers().contains_key("idempotency-replayed");
        response.into_body().collect().await.expect("body");
        // A replay is marked by the low bit, so the caller can count them.
        latencies.push((started.elapsed().as_micros() as u64) << 1 | u64::from(replayed));
        i += 1;
    }
    latencies
}

/// User plus system CPU time of a process, in microseconds.
fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks * 10_000 // USER_HZ = 100
}

fn start(variant: &str) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().expect("self"))
        .args(["serve", variant])
        .stdout(Stdio::piped())
        .spawn()
        .expect("server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("port");
    (child, line.trim().parse().expect("a port"))
}

async fn load(port: u16, pid: u32, repeated: bool, session: bool, seconds: u64) -> String {
    let body = Bytes::from(json_body(1024));
    // Warm-up: a second of the same load, not counted.
    let warm = Instant::now() + Duration::from_secs(1);
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            tokio::spawn(connection(
                port,
                i + 1000,
                repeated,
                session,
                body.clone(),
                warm,
            ))
        })
        .collect();
    for task in tasks {
        task.await.expect("warm-up");
    }
    let cpu_before = cpu_us(pid);
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| tokio::spawn(connection(port, i, repeated, session, body.clone(), until)))
        .collect();
    let mut latencies = Vec::new();
    let mut replays = 0usize;
    for task in tasks {
        for marked in task.await.expect("connection") {
            replays += (marked & 1) as usize;
            latencies.push(marked >> 1);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_us(pid) - cpu_before;
    latencies.sort_unstable();
    let n = latencies.len();
    let at = |q: f64| latencies[((n as f64 * q) as usize).min(n - 1)] as f64 / 1000.0;
    format!(
        "{:.0} | {:.2} / {:.2} | {:.1} | {:.1}%",
        n as f64 / elapsed,
        at(0.5),
        at(0.99),
        cpu as f64 / n as f64,
        100.0 * replays as f64 / n as f64
    )
}

/// A JSON object of about `size` bytes.
fn json_body(size: usize) -> String {
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

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(args.get(2).expect("a variant")).await,
        Some("run") => {
            let seconds: u64 = std::env::var("BENCH_SECONDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(10);
            let variants = std::env::var("BENCH_VARIANTS")
                .unwrap_or_else(|_| "bare,memory,axum-idempotent,redis,dynamodb".to_owned());
            println!(
                "\n{CONNECTIONS} keep-alive connections, 1 KB JSON POSTs, {seconds} s each after a 1 s warm-up; \
                 CPU is the server process's user + system time per request"
            );
            println!(
                "| server | keys | requests/s | p50 / p99 (ms) | CPU per request (us) | replayed |"
            );
            println!("|---|---|---|---|---|---|");
            for variant in variants.split(',') {
                for repeated in [false, true] {
                    let (mut child, port) = start(variant);
                    let row = load(
                        port,
                        child.id(),
                        repeated,
                        variant == "axum-idempotent",
                        seconds,
                    )
                    .await;
                    let keys = if repeated {
                        "repeated (replays)"
                    } else {
                        "distinct"
                    };
                    println!("| {variant} | {keys} | {row} |");
                    child.kill().expect("kill");
                    child.wait().expect("wait");
                }
            }
        }
        _ => eprintln!("server-bench run | server-bench serve <variant>"),
    }
}
