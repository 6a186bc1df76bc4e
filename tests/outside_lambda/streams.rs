//! Responses that stream, whatever their kind: an NDJSON export without a
//! length reaches the client as the handler writes it, and its record
//! completes when it ends (stored whole if it fit, "not stored" and why
//! if it did not), so that nothing runs twice and no byte waits for the
//! layer.

use super::*;
use tokio::sync::Notify;

const FIRST_ROW: &[u8] = b"{\"row\":1}\n";
const SECOND_ROW: &[u8] = b"{\"row\":2}\n";

/// `POST /v1/exports`: an NDJSON body without a length, whose first row
/// comes at once and whose second waits for `more`; with an
/// `x-fail-part-way` header, the stream fails instead of the second row;
/// with `x-panic-part-way`, it panics there; with `x-short`, it declares a
/// `content-length` of 100 000 and ends there (its producer gone).
fn exports_app(
    engine: Engine<DynamoDbStore>,
    runs: &Arc<AtomicUsize>,
    more: &Arc<Notify>,
) -> Router {
    let runs = Arc::clone(runs);
    let more = Arc::clone(more);
    Router::new()
        .route(
            "/v1/exports",
            post(move |headers: HeaderMap| {
                runs.fetch_add(1, Ordering::SeqCst);
                let more = Arc::clone(&more);
                async move {
                    let fail = headers.contains_key("x-fail-part-way");
                    let panics = headers.contains_key("x-panic-part-way");
                    let short = headers.contains_key("x-short");
                    let first = futures::stream::once(async { Ok(Bytes::from_static(FIRST_ROW)) });
                    let more_for_short = Arc::clone(&more);
                    let rest = futures::stream::once(async move {
                        more.notified().await;
                        if panics {
                            panic!("the export's source panicked part-way");
                        }
                        if fail {
                            Err(std::io::Error::other("the export's source went away"))
                        } else {
                            Ok(Bytes::from_static(SECOND_ROW))
                        }
                    });
                    let body = if short {
                        Body::from_stream(first.chain(futures::stream::once(async move {
                            more_for_short.notified().await;
                            Ok::<_, std::io::Error>(Bytes::new())
                        })))
                    } else {
                        Body::from_stream(first.chain(rest))
                    };
                    let mut response = axum::response::IntoResponse::into_response((
                        [(header::CONTENT_TYPE, "application/x-ndjson")],
                        body,
                    ));
                    if short {
                        response
                            .headers_mut()
                            .insert(header::CONTENT_LENGTH, header::HeaderValue::from(100_000));
                    }
                    response
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine).shared_scope())
}

/// Retries `POST /v1/exports` until it is answered with something else
/// than 409 (the record completes just after the body ends), for at most
/// ten seconds.
async fn export_once_done(addr: SocketAddr, key: &str) -> Answer {
    let started = Instant::now();
    loop {
        // Bounded: a retry that ran the export again would wait for
        // `more` with it.
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            send(
                addr,
                "POST",
                "/v1/exports",
                &[("idempotency-key", key)],
                "{}",
            ),
        )
        .await
        .expect("a retry is answered without running the export again");
        if answer.status != 409 || started.elapsed() > Duration::from_secs(10) {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The response head, which must come while the handler still streams
/// (bounded, so a layer that held the body back fails rather than hangs).
async fn head_of(
    response: impl std::future::Future<Output = hyper::Response<hyper::body::Incoming>>,
) -> hyper::Response<hyper::body::Incoming> {
    tokio::time::timeout(Duration::from_secs(30), response)
        .await
        .expect("the response head arrives while the handler still streams")
}

/// The rest of a streaming body, to its end.
async fn rest_of(body: hyper::body::Incoming) -> Bytes {
    tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("the stream ends")
        .expect("no error")
        .to_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_without_a_length_streams_from_its_first_row_and_is_stored_when_it_ends() {
    let runs = Arc::new(AtomicUsize::new(0));
    let more = Arc::new(Notify::new());
    let addr = serve(exports_app(engine().await, &runs, &more)).await;
    let started = Instant::now();
    let response = head_of(request(
        addr,
        "POST",
        "/v1/exports",
        &[("idempotency-key", "ndjson-1")],
        "{}",
    ))
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // The second row waits for this test, which waits for the first: a
    // layer that held the body until its end would never send it.
    assert_eq!(next_event(&mut body).await.as_ref(), FIRST_ROW);
    println!(
        "NDJSON first byte through the layer after {:?}",
        started.elapsed()
    );

    // While it streams, the request is in progress: a retry runs nothing.
    let during = send(
        addr,
        "POST",
        "/v1/exports",
        &[("idempotency-key", "ndjson-1")],
        "{}",
    )
    .await;
    assert_eq!(during.status, 409, "{}", during.json);

    more.notify_one();
    assert_eq!(rest_of(body).await.as_ref(), SECOND_ROW);

    // It fit: stored whole, and every retry gets every row; at once, since
    // the client gets the end of the body only once it is recorded.
    let retry = send(
        addr,
        "POST",
        "/v1/exports",
        &[("idempotency-key", "ndjson-1")],
        "{}",
    )
    .await;
    assert_eq!(retry.status, 200);
    assert!(retry.replayed());
    assert_eq!(retry.headers[header::CONTENT_TYPE], "application/x-ndjson");
    let Value::String(rows) = &retry.json else {
        panic!("two NDJSON rows are not one JSON value: {}", retry.json);
    };
    assert_eq!(rows.as_bytes(), [FIRST_ROW, SECOND_ROW].concat());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_part_way_is_not_stored_and_never_runs_again() {
    a_broken_stream("x-fail-part-way").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_panics_part_way_is_not_stored_and_never_runs_again() {
    a_broken_stream("x-panic-part-way").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_short_of_its_length_is_not_stored_and_never_runs_again() {
    a_broken_stream("x-short").await;
}

/// The stream breaks after its first row as `how` says: the client sees
/// the cut, every retry the not-stored answer, and the export runs once.
async fn a_broken_stream(how: &str) {
    let runs = Arc::new(AtomicUsize::new(0));
    let more = Arc::new(Notify::new());
    let addr = serve(exports_app(engine().await, &runs, &more)).await;
    let key = format!("ndjson-broken-{how}");
    let headers = [("idempotency-key", key.as_str()), (how, "1")];
    let response = head_of(request(addr, "POST", "/v1/exports", &headers, "{}")).await;
    let mut body = response.into_body();
    assert_eq!(next_event(&mut body).await.as_ref(), FIRST_ROW);
    more.notify_one();
    let cut = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("the stream ends");
    assert!(cut.is_err(), "the client sees the stream cut short");

    let retry = export_once_done(addr, &key).await;
    assert_eq!(retry.status, 200, "the original status: {}", retry.json);
    assert_eq!(
        retry.json["type"],
        "urn:lambda-idempotency:problem:idempotency-response-not-stored"
    );
    let detail = retry.json["detail"].as_str().expect("a detail");
    assert!(detail.contains("its stream failed part-way"), "{detail}");
    assert!(!detail.contains("too large"), "{detail}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_leaves_a_record_stored_whole() {
    let runs = Arc::new(AtomicUsize::new(0));
    let more = Arc::new(Notify::new());
    let addr = serve(exports_app(engine().await, &runs, &more)).await;
    let response = head_of(request(
        addr,
        "POST",
        "/v1/exports",
        &[("idempotency-key", "ndjson-left")],
        "{}",
    ))
    .await;
    let mut body = response.into_body();
    assert_eq!(next_event(&mut body).await.as_ref(), FIRST_ROW);
    // The client leaves; hyper drops the response body when it notices.
    drop(body);
    tokio::time::sleep(Duration::from_millis(300)).await;
    more.notify_one();

    // The rest was read for the record all the same.
    let retry = export_once_done(addr, "ndjson-left").await;
    assert_eq!(retry.status, 200, "{}", retry.json);
    assert!(retry.replayed());
    let Value::String(rows) = &retry.json else {
        panic!("two NDJSON rows are not one JSON value: {}", retry.json);
    };
    assert_eq!(rows.as_bytes(), [FIRST_ROW, SECOND_ROW].concat());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_still_going_near_the_end_of_its_lease_is_recorded_and_never_runs_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let more = Arc::new(Notify::new());
    let addr = serve(exports_app(engine().await, &runs, &more)).await;
    let response = head_of(request(
        addr,
        "POST",
        "/v1/exports",
        &[("idempotency-key", "ndjson-slow")],
        "{}",
    ))
    .await;
    let mut body = response.into_body();
    assert_eq!(next_event(&mut body).await.as_ref(), FIRST_ROW);

    // Past the lease (3 s) the stream still goes on: it was recorded
    // before, as not stored, so a retry neither waits nor runs it again.
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    let retry = export_once_done(addr, "ndjson-slow").await;
    assert_eq!(retry.status, 200, "{}", retry.json);
    assert_eq!(
        retry.json["type"],
        "urn:lambda-idempotency:problem:idempotency-response-not-stored"
    );
    let detail = retry.json["detail"].as_str().expect("a detail");
    assert!(detail.contains("still streaming"), "{detail}");

    // The client still gets every byte.
    more.notify_one();
    assert_eq!(rest_of(body).await.as_ref(), SECOND_ROW);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `POST /v1/mislabelled`: a body whose frames are all ready at once but
/// which does not hold the `content-length` it declares (`x-length`): its
/// producer stopped short, or it lies.
fn mislabelled_app(engine: Engine<DynamoDbStore>, runs: &Arc<AtomicUsize>) -> Router {
    let runs = Arc::clone(runs);
    Router::new()
        .route(
            "/v1/mislabelled",
            post(move |headers: HeaderMap| {
                runs.fetch_add(1, Ordering::SeqCst);
                let declared: u64 = headers
                    .get("x-length")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                async move {
                    let rows = futures::stream::iter([Ok::<_, std::io::Error>(
                        Bytes::from_static(FIRST_ROW),
                    )]);
                    let mut response = axum::response::Response::new(Body::from_stream(rows));
                    response
                        .headers_mut()
                        .insert(header::CONTENT_LENGTH, header::HeaderValue::from(declared));
                    response
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine).shared_scope())
}

/// A body read whole that its `content-length` contradicts (shorter: its
/// producer stopped; longer: it lies) is a response that failed while
/// read: never stored, never replayed as a whole one (an outside review
/// found the shorter one replayed as complete, marked a replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_contradicts_its_content_length_is_never_replayed_as_whole() {
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve(mislabelled_app(engine().await, &runs)).await;
    for (n, declared) in ["1000", "5"].into_iter().enumerate() {
        let key = format!("mislabelled-{declared}");
        let headers = [("idempotency-key", key.as_str()), ("x-length", declared)];
        for attempt in 1..=2 {
            let answer = send(addr, "POST", "/v1/mislabelled", &headers, "{}").await;
            assert_eq!(
                answer.status, 500,
                "{declared}, attempt {attempt}: {}",
                answer.json
            );
            assert!(!answer.replayed(), "{declared}, attempt {attempt}");
            assert_eq!(
                answer.json["type"],
                "urn:lambda-idempotency:problem:idempotency-response-unreadable"
            );
        }
        // Released, as any response that fails while read whole: the
        // retry processes it again.
        assert_eq!(runs.load(Ordering::SeqCst), 2 * (n + 1));
    }
}
