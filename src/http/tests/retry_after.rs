//! The `Retry-After` of a `409` in progress: what is left of the route's
//! typical duration, a bounded default on a route with none yet, never past
//! the lease. Durations are on a `ManualClock`: the handler moves it by
//! what it "takes", so nothing here depends on the machine's speed.

use super::*;
use crate::http::{RetryAfter, DEFAULT_FIRST_RETRY_AFTER};
use tokio::sync::Semaphore;

/// A handler on the manual clock: it "takes" `x-took-ms` (moving the clock
/// by that much), and a request with `x-hold` waits until the test adds a
/// permit to `gate`.
#[derive(Clone)]
struct Timed {
    clock: ManualClock,
    gate: Arc<Semaphore>,
    runs: Arc<AtomicUsize>,
}

impl Timed {
    fn new(clock: &ManualClock) -> Self {
        Self {
            clock: clock.clone(),
            gate: Arc::new(Semaphore::new(0)),
            runs: Arc::default(),
        }
    }

    fn service(
        &self,
        layer: IdempotencyLayer<MemoryStore>,
    ) -> impl Service<Request, Response = Response<Body>, Error = BoxError, Future: Send>
           + Clone
           + Send
           + 'static {
        let timed = self.clone();
        layer.layer(service_fn(move |request: Request| {
            let timed = timed.clone();
            async move {
                timed.runs.fetch_add(1, Ordering::SeqCst);
                let took_ms = request
                    .headers()
                    .get("x-took-ms")
                    .and_then(|v| v.to_str().ok()?.parse().ok());
                if let Some(took_ms) = took_ms {
                    timed.clock.advance(Duration::from_millis(took_ms));
                }
                if request.headers().contains_key("x-hold") {
                    timed.gate.acquire().await?.forget();
                }
                Ok::<_, BoxError>(Response::builder().status(201).body(Body::from("done"))?)
            }
        }))
    }
}

fn request(path: &str, key: &str, headers: &[(&'static str, &str)]) -> Request {
    let mut builder = http::Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::from("{}")).expect("request")
}

fn retry_after_s(response: &Response<Body>) -> u64 {
    response.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Holds a request on `path` in its handler, then sends its duplicate
/// `after` later on the clock: the duplicate's `Retry-After`, in seconds.
async fn duplicate_after<S>(
    service: &S,
    timed: &Timed,
    path: &str,
    key: &str,
    after: Duration,
) -> u64
where
    S: Service<Request, Response = Response<Body>, Error = BoxError, Future: Send>
        + Clone
        + Send
        + 'static,
{
    let runs = timed.runs.load(Ordering::SeqCst);
    let first = tokio::spawn(
        service
            .clone()
            .oneshot(request(path, key, &[("x-hold", "1")])),
    );
    while timed.runs.load(Ordering::SeqCst) == runs {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    timed.clock.advance(after);
    let duplicate = service
        .clone()
        .oneshot(request(path, key, &[]))
        .await
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    timed.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    retry_after_s(&duplicate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_is_told_what_is_left_of_the_routes_typical_duration() {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .build();
    let timed = Timed::new(&clock);
    let service = timed.service(IdempotencyLayer::new(engine).shared_scope());

    // A route whose requests take 1 s, a few times over: a duplicate 300 ms
    // into the next is told 1 s, not the 60 s lease.
    for n in 0..3 {
        let key = format!("fast-{n}");
        let done = service
            .clone()
            .oneshot(request("/v1/charges", &key, &[("x-took-ms", "1000")]))
            .await
            .unwrap();
        assert_eq!(done.status(), StatusCode::CREATED);
    }
    let told = duplicate_after(
        &service,
        &timed,
        "/v1/charges",
        "fast",
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(told, 1);

    // A route whose requests take 4 s: 1 s in, 3 s are left; 6 s in (a
    // slow one), one more typical run.
    for n in 0..3 {
        let key = format!("slow-{n}");
        service
            .clone()
            .oneshot(request("/v1/exports", &key, &[("x-took-ms", "4000")]))
            .await
            .unwrap();
    }
    let exports = "/v1/exports";
    assert_eq!(
        duplicate_after(&service, &timed, exports, "a", Duration::from_secs(1)).await,
        3
    );
    assert_eq!(
        duplicate_after(&service, &timed, exports, "b", Duration::from_secs(6)).await,
        4
    );
    // The charges' estimate is their own.
    let told = duplicate_after(&service, &timed, "/v1/charges", "fast-2b", Duration::ZERO).await;
    assert_eq!(told, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_no_completion_yet_gets_the_default_never_past_the_lease() {
    let clock = ManualClock::starting_now();
    let engine = || {
        Engine::builder(MemoryStore::new())
            .clock(clock.clone())
            .build()
    };
    let timed = Timed::new(&clock);

    // The first request on a route: its duplicate gets the default.
    let service = timed.service(IdempotencyLayer::new(engine()).shared_scope());
    let told = duplicate_after(&service, &timed, "/v1/new", "k", Duration::ZERO).await;
    assert_eq!(told, DEFAULT_FIRST_RETRY_AFTER.as_secs());

    // An estimate longer than the lease (60 s): what is left of the lease.
    let hours = RetryAfter::estimated(Duration::from_secs(3 * 3600));
    let service = timed.service(
        IdempotencyLayer::new(engine())
            .shared_scope()
            .in_progress_retry_after(hours),
    );
    let told = duplicate_after(&service, &timed, "/v1/new", "k", Duration::from_secs(20)).await;
    assert_eq!(told, 40);
    let told = duplicate_after(
        &service,
        &timed,
        "/v1/new",
        "l",
        Duration::from_millis(59_700),
    )
    .await;
    assert_eq!(told, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_and_a_fixed_wait_as_settings() {
    let clock = ManualClock::starting_now();
    let timed = Timed::new(&clock);
    for (setting, expected) in [
        (RetryAfter::lease(), 50),
        (RetryAfter::fixed(Duration::from_secs(7)), 7),
    ] {
        let engine = Engine::builder(MemoryStore::new())
            .clock(clock.clone())
            .build();
        let service = timed.service(
            IdempotencyLayer::new(engine)
                .shared_scope()
                .in_progress_retry_after(setting),
        );
        let told = duplicate_after(&service, &timed, "/v1/x", "k", Duration::from_secs(10)).await;
        assert_eq!(told, expected, "{setting:?}");
    }
}
