//! The server benchmark: one axum app, 1 KB JSON POSTs from 64 keep-alive
//! connections for a fixed time, each implementation in a server process of
//! its own (so that its CPU time is its own), the load from this process.
//!
//! `server-bench run` prints the table; `server-bench serve <variant>` is
//! the server it starts. Variants: `bare` (the handler alone), `memory`,
//! `redis` (`IDEMPOTENCY_TEST_REDIS_URL`), `dynamodb`
//! (`AWS_ENDPOINT_URL_DYNAMODB`): this crate's layer on each store;
//! `axum-idempotent` (0.6, on its in-memory `MokaStore` session store,
//! keyed by the `Idempotency-Key` header alone: it reads no body);
//! `axum-idempotent-hash` (the same, in its default mode: keyed by a hash
//! of the method, path, headers and body, so that it reads and hashes every
//! body, as this layer does to check the payload);
//! `memory-key-only`, a diagnostic: the memory store with the payload
//! check left out; `memory-encrypted` and `redis-encrypted`, the layer
//! on the memory store and Redis with responses sealed at rest
//! (AES-256-GCM under a raw key: the CPU encryption adds, beside
//! `memory` and `redis`). Two controls, for reading the figures over the bare
//! app's: `bare-again`, the bare app in a server of its own (how far two
//! runs of the same server differ: the resolution of every other row), and
//! `bare-spin-<n>`, the bare app with `n` microseconds of CPU added to each
//! request (what a known amount of work reads as).
//!
//! `BENCH_CONNECTIONS` sets the number of keep-alive connections (64).
//! `BENCH_TOGETHER=1` (with `BENCH_RATE`) runs a round's servers at once
//! rather than in turn, each at `BENCH_RATE`.

use axum::{extract::Json, routing::post, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Request};
use hyper_util::rt::TokioIo;
use lambda_idempotency::{
    encryption::{Encryption, RawKeys},
    http::{FingerprintSource, IdempotencyLayer},
    store::redis::RedisStore,
    DynamoDbStore, Engine, Fingerprint, MemoryStore,
};
use serde_json::{json, Value};
use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};
use tokio::net::{TcpListener, TcpStream};

/// Keep-alive connections (BENCH_CONNECTIONS, default 64).
fn connections() -> usize {
    env_or("BENCH_CONNECTIONS", 64)
}

async fn charge(Json(order): Json<Value>) -> (axum::http::StatusCode, Json<Value>) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    (
        axum::http::StatusCode::CREATED,
        Json(json!({ "id": format!("ch_{id}"), "amount": order["amount"] })),
    )
}

/// Responses sealed under one raw key, as a deployment with
/// `KmsKeys` does between two data keys (KMS is not called per request).
fn encryption() -> Encryption {
    Encryption::new(
        RawKeys::new("bench", &[7; 32]).expect("a 32-byte key"),
        "server-bench",
    )
}

async fn app(variant: &str) -> Router {
    let routes = Router::new().route("/v1/charges", post(charge));
    match variant {
        "bare" | "bare-again" => routes,
        // A calibration: the bare app with `n` microseconds of CPU added to
        // each request (spinning in the handler), to show what a known
        // amount of work costs a server under this load.
        spin if spin.starts_with("bare-spin-") => {
            let micros: u64 = spin["bare-spin-".len()..]
                .parse()
                .expect("bare-spin-<microseconds>");
            let spin = Duration::from_micros(micros);
            Router::new().route(
                "/v1/charges",
                post(move |order: Json<Value>| async move {
                    let started = Instant::now();
                    while started.elapsed() < spin {
                        std::hint::spin_loop();
                    }
                    charge(order).await
                }),
            )
        }
        "memory" => routes.layer(
            IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope(),
        ),
        // A diagnostic, not a configuration to deploy: the layer with the
        // payload check left out (every request's fingerprint the same),
        // to show what that check costs beside axum-idempotent, which
        // makes none.
        "memory-key-only" => routes.layer(
            IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
                .shared_scope()
                .fingerprint_source(FingerprintSource::from_fn(|_| Fingerprint::of_bytes(b""))),
        ),
        "memory-encrypted" => routes.layer(
            IdempotencyLayer::new(
                Engine::builder(MemoryStore::new())
                    .encryption(encryption())
                    .build(),
            )
            .shared_scope(),
        ),
        "redis" | "redis-encrypted" => {
            let url = std::env::var("IDEMPOTENCY_TEST_REDIS_URL").expect("a Redis URL");
            // Each variant a prefix of its own: they share one server.
            let store = RedisStore::open(&url)
                .expect("redis")
                .namespace(format!("{variant}-{}", std::process::id()));
            let engine = Engine::builder(store);
            let engine = if variant == "redis-encrypted" {
                engine.encryption(encryption())
            } else {
                engine
            };
            routes.layer(IdempotencyLayer::new(engine.build()).shared_scope())
        }
        "dynamodb" => {
            let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
            let table = format!("server-bench-{}", std::process::id());
            let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), table);
            store.create_table().await.expect("table");
            routes.layer(IdempotencyLayer::new(Engine::builder(store).build()).shared_scope())
        }
        "axum-idempotent" | "axum-idempotent-hash" => {
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
                    if variant == "axum-idempotent" {
                        IdempotentOptions::new(3600)
                            .use_idempotency_key_header(Some("idempotency-key"), true)
                    } else {
                        IdempotentOptions::new(3600)
                    },
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
/// With a `pace`, its requests leave one `period` apart from `first` on
/// (or at once, when the connection is behind), instead of each on the
/// heels of the last answer.
async fn connection(
    run: u32,
    port: u16,
    index: usize,
    repeated: bool,
    session: bool,
    body: Bytes,
    until: Instant,
    pace: Option<Pace>,
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
        if let Some(pace) = pace {
            tokio::time::sleep_until((pace.first + pace.period * i as u32).into()).await;
            if Instant::now() >= until {
                break;
            }
        }
        // Keys of their own per run: a store outside the server process
        // (Redis) keeps the records of earlier rounds.
        let key = if repeated {
            format!("k-{run}-{index}")
        } else {
            format!("k-{run}-{index}-{i}")
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

/// User plus system CPU time of a process, in microseconds: its CPU-time
/// clock, which the kernel keeps to the nanosecond over all its threads.
/// (`/proc/<pid>/stat` counts in ticks of 10 ms: over a run of 12,000
/// requests, steps of 0.8 us a request.)
fn cpu_us(pid: u32) -> u64 {
    let mut clock: libc::clockid_t = 0;
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both calls only write the values they are given pointers to,
    // which live for the calls.
    let read = unsafe {
        libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) == 0
            && libc::clock_gettime(clock, &mut time) == 0
    };
    assert!(read, "the CPU-time clock of process {pid}");
    time.tv_sec as u64 * 1_000_000 + time.tv_nsec as u64 / 1_000
}

/// Starts the server of `variant`; `<variant>@<path>` starts it from
/// another build of this benchmark (an earlier commit's, for before and
/// after figures in one run).
fn start(variant: &str) -> (Child, u16) {
    let (variant, program) = match variant.split_once('@') {
        Some((variant, path)) => (variant, std::path::PathBuf::from(path)),
        None => (variant, std::env::current_exe().expect("self")),
    };
    let mut child = Command::new(program)
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

/// When a paced connection sends its requests.
#[derive(Clone, Copy)]
struct Pace {
    first: Instant,
    period: Duration,
}

/// The connections' paces for `rate` requests a second in all, spread
/// over the first period so that they do not leave together.
fn paces(rate: Option<f64>, from: Instant) -> Vec<Option<Pace>> {
    let connections = connections();
    (0..connections)
        .map(|i| {
            rate.map(|rate| {
                let period = Duration::from_secs_f64(connections as f64 / rate);
                Pace {
                    first: from + period.mul_f64(i as f64 / connections as f64),
                    period,
                }
            })
        })
        .collect()
}

/// One run's figures.
#[derive(Clone, Copy)]
struct Figures {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us: f64,
    replayed: f64,
}

async fn load(
    port: u16,
    pid: u32,
    repeated: bool,
    session: bool,
    seconds: f64,
    rate: Option<f64>,
) -> Figures {
    let body = Bytes::from(server_bench::json_body(1024));
    // Warm-up: a second of the same load, not counted.
    let warm = Instant::now() + Duration::from_secs(1);
    let paced = paces(rate, Instant::now());
    let tasks: Vec<_> = (0..connections())
        .map(|i| {
            tokio::spawn(connection(
                pid,
                port,
                i + 1000,
                repeated,
                session,
                body.clone(),
                warm,
                paced[i],
            ))
        })
        .collect();
    for task in tasks {
        task.await.expect("warm-up");
    }
    let cpu_before = cpu_us(pid);
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let paced = paces(rate, started);
    let tasks: Vec<_> = (0..connections())
        .map(|i| {
            tokio::spawn(connection(
                pid,
                port,
                i,
                repeated,
                session,
                body.clone(),
                until,
                paced[i],
            ))
        })
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
    Figures {
        requests_per_s: n as f64 / elapsed,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        cpu_us: cpu as f64 / n as f64,
        replayed: 100.0 * replays as f64 / n as f64,
    }
}

/// One run of every variant's server at once (`BENCH_TOGETHER`), each
/// under the same load at the same pace, their CPU read over the same
/// window.
async fn load_together(
    variants: &[String],
    repeated: bool,
    seconds: f64,
    rate: Option<f64>,
) -> Vec<Figures> {
    let servers: Vec<(Child, u16)> = variants.iter().map(|variant| start(variant)).collect();
    let loads: Vec<_> = servers
        .iter()
        .zip(variants)
        .map(|((child, port), variant)| {
            tokio::spawn(load(
                *port,
                child.id(),
                repeated,
                variant.starts_with("axum-idempotent"),
                seconds,
                rate,
            ))
        })
        .collect();
    let mut runs = Vec::new();
    for load in loads {
        runs.push(load.await.expect("load"));
    }
    for (mut child, _) in servers {
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
    runs
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// Every variant in every round, the order rotating from round to round
/// (so that no variant always runs first, on the coolest machine), after
/// a warm-up round that is not counted; then the medians of each variant
/// and the ratios of this layer on the memory store to each axum-idempotent
/// variant, taken within each round.
async fn run() {
    let seconds: f64 = env_or("BENCH_SECONDS", 4.0);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    // Requests a second in all, when set: every server gets the same load,
    // below what the slowest serves, instead of as many as it can take.
    // What a server spends a request then does not depend on how many
    // requests each wake-up finds (which is more, the faster it answers).
    let rate: Option<f64> = std::env::var("BENCH_RATE")
        .ok()
        .and_then(|rate| rate.parse().ok());
    let variants: Vec<String> = std::env::var("BENCH_VARIANTS")
        .unwrap_or_else(|_| {
            "bare,memory,memory-encrypted,axum-idempotent,axum-idempotent-hash,redis,redis-encrypted,dynamodb,bare-again,bare-spin-10"
                .to_owned()
        })
        .split(',')
        .map(str::to_owned)
        .collect();
    // Every server of a round at once, each under its own connections at
    // the same pace (BENCH_RATE each), so that what slows the machine
    // for a while (the host, the clock's speed) slows every server in the
    // same window, not only the one whose turn it is: the differences
    // within a round then carry less of it.
    let together = std::env::var("BENCH_TOGETHER").is_ok_and(|value| value == "1");
    if together && rate.is_none() {
        panic!("BENCH_TOGETHER needs BENCH_RATE: servers run as fast as they can would take each other's CPU");
    }
    let modes = [("distinct", false), ("repeated (replays)", true)];
    // figures[variant][mode] = one per counted round
    let mut figures = vec![vec![Vec::<Figures>::new(); modes.len()]; variants.len()];
    for round in 0..=rounds {
        let label = if round == 0 {
            "warm-up round, not counted".to_owned()
        } else {
            format!("round {round} of {rounds}")
        };
        eprintln!("{label}");
        if together {
            let seconds = if round == 0 { 1.0 } else { seconds };
            for (m, (keys, repeated)) in modes.iter().enumerate() {
                let runs = load_together(&variants, *repeated, seconds, rate).await;
                for (v, run) in runs.into_iter().enumerate() {
                    if round > 0 {
                        eprintln!(
                            "  {} {keys}: {:.0} requests/s, {:.1} us CPU per request",
                            variants[v], run.requests_per_s, run.cpu_us
                        );
                        figures[v][m].push(run);
                    }
                }
            }
            continue;
        }
        for offset in 0..variants.len() {
            let v = (offset + round) % variants.len();
            for (m, (_, repeated)) in modes.iter().enumerate() {
                let (mut child, port) = start(&variants[v]);
                let seconds = if round == 0 { 1.0 } else { seconds };
                let run = load(
                    port,
                    child.id(),
                    *repeated,
                    variants[v].starts_with("axum-idempotent"),
                    seconds,
                    rate,
                )
                .await;
                child.kill().expect("kill");
                child.wait().expect("wait");
                if round > 0 {
                    eprintln!(
                        "  {} {}: {:.0} requests/s, {:.1} us CPU per request",
                        variants[v], modes[m].0, run.requests_per_s, run.cpu_us
                    );
                    figures[v][m].push(run);
                }
            }
        }
    }
    let offered = match rate {
        Some(rate) => format!("{rate:.0} requests/s offered"),
        None => "as fast as each server answers".to_owned(),
    };
    println!(
        "\n{} keep-alive connections, 1 KB JSON POSTs, {offered}, {seconds} s per run after a 1 s warm-up, \
         {rounds} rounds (medians); CPU is the server process's user + system time per request",
        connections()
    );
    println!("| server | keys | requests/s | p50 / p99 (ms) | CPU per request (us) | replayed |");
    println!("|---|---|---|---|---|---|");
    for (v, variant) in variants.iter().enumerate() {
        for (m, (keys, _)) in modes.iter().enumerate() {
            let runs = &figures[v][m];
            let of = |field: fn(&Figures) -> f64| median(runs.iter().map(field).collect());
            println!(
                "| {variant} | {keys} | {:.0} | {:.2} / {:.2} | {:.1} | {:.1}% |",
                of(|f| f.requests_per_s),
                of(|f| f.p50_ms),
                of(|f| f.p99_ms),
                of(|f| f.cpu_us),
                of(|f| f.replayed),
            );
        }
    }
    if let Some(bare) = variants.iter().position(|v| v == "bare") {
        println!("\nCPU per request over the bare app's, within each round (us):");
        print_over(&figures, &variants, bare, &modes);
    }
    // What sealing responses at rest adds: each encrypted variant against
    // the same store in plaintext, within each round.
    for (v, variant) in variants.iter().enumerate() {
        let Some(plain) = variant.strip_suffix("-encrypted") else {
            continue;
        };
        if let Some(p) = variants.iter().position(|other| other == plain) {
            println!(
                "
CPU per request of {variant} over {plain}'s, within each round (us):"
            );
            println!("| keys | median | each round |");
            println!("|---|---|---|");
            for (m, (keys, _)) in modes.iter().enumerate() {
                let over: Vec<f64> = figures[v][m]
                    .iter()
                    .zip(&figures[p][m])
                    .map(|(ours, theirs)| ours.cpu_us - theirs.cpu_us)
                    .collect();
                let each: Vec<String> = over.iter().map(|d| format!("{d:.1}")).collect();
                println!("| {keys} | {:.1} | {} |", median(over), each.join(", "));
            }
        }
    }
    // The goal's test, made directly: this layer against a server doing
    // exactly the goal's work, in the same rounds.
    if let Some(line) = variants.iter().position(|v| v == "bare-spin-10") {
        println!(
            "\nCPU per request over bare-spin-10's (the bare app with 10 us of CPU added: \
             the goal's line), within each round (us; at most 0 meets it):"
        );
        print_over(&figures, &variants, line, &modes);
    }
    let Some(ours) = variants.iter().position(|v| v == "memory") else {
        return;
    };
    for (theirs, other) in variants.iter().enumerate() {
        if other.starts_with("axum-idempotent") {
            print_ratios(&figures[ours], &figures[theirs], other, &modes);
        }
    }
}

/// What each server spends a request beyond the server `reference`,
/// within each round (the median of the rounds' differences, and each
/// round's).
fn print_over(
    figures: &[Vec<Vec<Figures>>],
    variants: &[String],
    reference: usize,
    modes: &[(&str, bool)],
) {
    println!("| server | keys | median | each round |");
    println!("|---|---|---|---|");
    for (v, variant) in variants.iter().enumerate() {
        if v == reference {
            continue;
        }
        for (m, (keys, _)) in modes.iter().enumerate() {
            let over: Vec<f64> = figures[v][m]
                .iter()
                .zip(&figures[reference][m])
                .map(|(ours, theirs)| ours.cpu_us - theirs.cpu_us)
                .collect();
            let each: Vec<String> = over.iter().map(|d| format!("{d:.1}")).collect();
            let label = match variant.as_str() {
                "bare-again" => "bare-again (control: the same app)",
                "bare-spin-10" => "bare-spin-10 (control: 10 us of CPU added, the goal's line)",
                other => other,
            };
            println!(
                "| {label} | {keys} | {:.1} | {} |",
                median(over.clone()),
                each.join(", ")
            );
        }
    }
}

/// This layer on the memory store beside `other`, within each round.
fn print_ratios(
    ours: &[Vec<Figures>],
    theirs: &[Vec<Figures>],
    other: &str,
    modes: &[(&str, bool)],
) {
    println!(
        "\nThis layer on the memory store / {other}, within each round (median, worst, best):"
    );
    println!("| keys | requests/s ratio | CPU per request ratio | each round (requests/s) |");
    println!("|---|---|---|---|");
    for (m, (keys, _)) in modes.iter().enumerate() {
        let pairs = ours[m].iter().zip(&theirs[m]);
        let throughput: Vec<f64> = pairs
            .clone()
            .map(|(a, b)| a.requests_per_s / b.requests_per_s)
            .collect();
        let cpu: Vec<f64> = pairs.map(|(a, b)| a.cpu_us / b.cpu_us).collect();
        let low = |values: &[f64]| values.iter().copied().fold(f64::INFINITY, f64::min);
        let high = |values: &[f64]| values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let each: Vec<String> = throughput.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "| {keys} | {:.2} ({:.2}, {:.2}) | {:.2} ({:.2}, {:.2}) | {} |",
            median(throughput.clone()),
            low(&throughput),
            high(&throughput),
            median(cpu.clone()),
            high(&cpu),
            low(&cpu),
            each.join(", ")
        );
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(args.get(2).expect("a variant")).await,
        Some("run") => run().await,
        _ => eprintln!("server-bench run | server-bench serve <variant>"),
    }
}
