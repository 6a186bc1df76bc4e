//! The request's span when a subscriber's filter disables it (the layer
//! does not instrument the request then), and the engine's boxed rare paths, against a real
//! `axum::serve` server, a hyper client and a real subscriber (a
//! registry with a capturing layer whose filter enables or disables the
//! `idempotency` span at run time).
//!
//! What must hold: with the span enabled, the handler's events, the
//! engine's (fail-open, panic, error paths) and the layer's are inside it,
//! under the caller's span; with it disabled, they are inside the caller's
//! span, never orphaned; the protocol (replay, release on a panic, fail-open
//! running the handler unprotected) is unchanged.

use axum::{
    extract::Request as AxumRequest,
    middleware::{self, Next},
    response::Response,
    routing::post,
    Router,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lambda_idempotency::{
    http::{IdempotencyLayer, REPLAYED_HEADER},
    Engine, MemoryStore,
};
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
};
use tracing::{
    field::{Field, Visit},
    subscriber::Interest,
    Instrument, Metadata,
};
use tracing_subscriber::{layer::Context, prelude::*, registry::LookupSpan, Layer};

/// Whether the filter lets the `idempotency` span through.
static IDEMPOTENCY_SPAN: AtomicBool = AtomicBool::new(true);
/// One test at a time (the subscriber is global).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Debug, Clone)]
struct Seen {
    message: String,
    /// Span names from the root to the event's parent.
    scope: Vec<String>,
    /// The `req` field of the outermost `request` span, if any.
    req: Option<String>,
}

fn seen() -> &'static Mutex<Vec<Seen>> {
    static SEEN: OnceLock<Mutex<Vec<Seen>>> = OnceLock::new();
    SEEN.get_or_init(Default::default)
}

struct Capture;

#[derive(Default)]
struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

struct Req(String);

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        !(metadata.is_span() && metadata.name() == "idempotency")
            || IDEMPOTENCY_SPAN.load(Ordering::SeqCst)
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        if attrs.metadata().name() == "request" {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            if let (Some(span), Some((_, req))) =
                (ctx.span(id), fields.0.into_iter().find(|(n, _)| n == "req"))
            {
                span.extensions_mut().insert(Req(req));
            }
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields
            .0
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut scope = Vec::new();
        let mut req = None;
        if let Some(spans) = ctx.event_scope(event) {
            for span in spans.from_root() {
                if let Some(Req(r)) = span.extensions().get::<Req>() {
                    req.get_or_insert_with(|| r.clone());
                }
                scope.push(span.name().to_owned());
            }
        }
        seen().lock().unwrap().push(Seen {
            message,
            scope,
            req,
        });
    }
}

fn init() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        tracing_subscriber::registry()
            .with(Capture)
            .try_init()
            .expect("the only subscriber");
    });
}

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

async fn send(addr: SocketAddr, path: &str, key: &str, req: &str, body: &str) -> (u16, bool) {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("x-req", req)
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let replayed = response.headers().contains_key(REPLAYED_HEADER);
    let status = response.status().as_u16();
    response.into_body().collect().await.expect("body");
    (status, replayed)
}

/// The caller's span around everything, named by the `x-req` header.
async fn request_span(request: AxumRequest, next: Next) -> Response {
    let req = request
        .headers()
        .get("x-req")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    next.run(request)
        .instrument(tracing::info_span!("request", req = %req))
        .await
}

struct App {
    router: Router,
    runs: Arc<AtomicUsize>,
    store: MemoryStore,
}

fn app(fail_open: bool) -> App {
    let runs = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).fail_open(fail_open).build();
    let layer = IdempotencyLayer::new(engine).shared_scope();
    let (ok_runs, panic_runs) = (Arc::clone(&runs), Arc::clone(&runs));
    let router = Router::new()
        .route(
            "/ok",
            post(move |body: Bytes| {
                ok_runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    tracing::info!(len = body.len(), "handler ran");
                    tokio::task::yield_now().await;
                    tokio::spawn(async { tracing::info!("handler task") }.in_current_span())
                        .await
                        .expect("task");
                    tracing::info!("handler done");
                    "ok"
                }
            }),
        )
        .route(
            "/panics",
            post(move || {
                let run = panic_runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    tracing::info!("handler about to panic");
                    if run % 2 == 0 {
                        panic!("boom {run}");
                    }
                    "survived"
                }
            }),
        )
        .layer(layer)
        .layer(tower_http::catch_panic::CatchPanicLayer::new())
        .layer(middleware::from_fn(request_span));
    App {
        router,
        runs,
        store,
    }
}

fn events_of(req: &str) -> Vec<Seen> {
    seen()
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.req.as_deref() == Some(req) || s.message.contains(req))
        .cloned()
        .collect()
}

fn with_message<'a>(events: &'a [Seen], needle: &str) -> Vec<&'a Seen> {
    events
        .iter()
        .filter(|e| e.message.contains(needle))
        .collect()
}

/// The scope every event of a request must have: the caller's span, then
/// the layer's when it is enabled.
fn expected_scope(enabled: bool) -> Vec<String> {
    let mut scope = vec!["request".to_owned()];
    if enabled {
        scope.push("idempotency".to_owned());
    }
    scope
}

async fn scenario(enabled: bool, tag: &str) {
    IDEMPOTENCY_SPAN.store(enabled, Ordering::SeqCst);
    tracing::callsite::rebuild_interest_cache();
    let App { router, runs, .. } = app(false);
    let (addr, server) = serve(router).await;
    let first = format!("{tag}-1");
    let second = format!("{tag}-2");
    assert_eq!(
        send(addr, "/ok", &format!("k-{tag}"), &first, r#"{"b":1,"a":2}"#).await,
        (200, false)
    );
    assert_eq!(
        send(
            addr,
            "/ok",
            &format!("k-{tag}"),
            &second,
            r#"{"a":2,"b":1}"#
        )
        .await,
        (200, true)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let events = events_of(&first);
    for message in ["handler ran", "handler task", "handler done"] {
        let found = with_message(&events, message);
        assert_eq!(found.len(), 1, "{message}: {events:#?}");
        assert_eq!(found[0].scope, expected_scope(enabled), "{message}");
    }
    // The layer's own "handled" event (explicit parent: the span itself).
    let handled: Vec<_> = seen()
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.message.contains("idempotent request handled"))
        .cloned()
        .collect();
    if enabled {
        assert!(
            handled.iter().any(
                |e| e.req.as_deref() == Some(first.as_str()) && e.scope == expected_scope(true)
            ),
            "{handled:#?}"
        );
    }
    // Nothing of this request's escaped its caller's span.
    for event in events_of(&second) {
        assert_eq!(
            event.scope.first().map(String::as_str),
            Some("request"),
            "{event:?}"
        );
    }
    server.abort();
    let _ = server.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_are_attributed_with_the_span_enabled_and_disabled() {
    let _serial = SERIAL.lock().await;
    init();
    scenario(true, "on").await;
    scenario(false, "off").await;
    scenario(true, "on-again").await;
}

async fn panics_and_outages(enabled: bool, tag: &str) {
    IDEMPOTENCY_SPAN.store(enabled, Ordering::SeqCst);
    tracing::callsite::rebuild_interest_cache();

    // A panicking handler: 500, the claim released (boxed release), the
    // retry runs it again, the warning inside the request's spans.
    let App {
        router,
        runs,
        store,
    } = app(false);
    let (addr, server) = serve(router).await;
    let key = format!("p-{tag}");
    let first = format!("{tag}-panic-1");
    let (status, _) = send(addr, "/panics", &key, &first, "{}").await;
    assert_eq!(status, 500);
    let panicked = with_message(&events_of(&first), "outcome=panicked")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(panicked.len(), 1, "{:#?}", events_of(&first));
    assert_eq!(panicked[0].scope, expected_scope(enabled));
    assert!(
        store.records().is_empty(),
        "released: {:?}",
        store.records()
    );
    assert_eq!(
        send(addr, "/panics", &key, &format!("{tag}-panic-2"), "{}").await,
        (200, false)
    );
    assert_eq!(
        send(addr, "/panics", &key, &format!("{tag}-panic-3"), "{}").await,
        (200, true)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    server.abort();
    let _ = server.await;

    // Fail-open through an outage (boxed unprotected run): the handler runs,
    // nothing is recorded, the warning inside the request's spans; once the
    // store is back, the key is claimed normally.
    let App {
        router,
        runs,
        store,
    } = app(true);
    let (addr, server) = serve(router).await;
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    let outage = format!("{tag}-outage");
    assert_eq!(
        send(addr, "/ok", &format!("o-{tag}"), &outage, "{}").await,
        (200, false)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(store.records().is_empty());
    let events = events_of(&outage);
    let unprotected = with_message(&events, "fail-open");
    assert_eq!(unprotected.len(), 1, "{events:#?}");
    assert_eq!(unprotected[0].scope, expected_scope(enabled));
    assert_eq!(
        with_message(&events, "handler ran")[0].scope,
        expected_scope(enabled)
    );
    assert_eq!(
        send(
            addr,
            "/ok",
            &format!("o-{tag}"),
            &format!("{tag}-after-1"),
            "{}"
        )
        .await,
        (200, false)
    );
    assert_eq!(
        send(
            addr,
            "/ok",
            &format!("o-{tag}"),
            &format!("{tag}-after-2"),
            "{}"
        )
        .await,
        (200, true)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Fail-closed (the default) through an outage: refused, not run.
    let App {
        router,
        runs,
        store,
    } = app(false);
    let (addr2, server2) = serve(router).await;
    store.fail_next(2);
    let (status, _) = send(
        addr2,
        "/ok",
        &format!("c-{tag}"),
        &format!("{tag}-closed"),
        "{}",
    )
    .await;
    assert!(status >= 500, "{status}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    for s in [server, server2] {
        s.abort();
        let _ = s.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panics_and_outages_with_the_span_enabled_and_disabled() {
    let _serial = SERIAL.lock().await;
    init();
    panics_and_outages(true, "pon").await;
    panics_and_outages(false, "poff").await;
}
