//! The client against this workspace's own server: `axum::serve` on a
//! loopback port behind the `lambda-idempotency` HTTP layer (memory
//! store), on every path of the protocol. Every test counts the handler's
//! runs and reads the key of every attempt that reached the server.

mod support;

use lambda_idempotency_client::{Idempotency, IdempotencyKey, IdempotencyMiddleware};
use serde_json::Value;
use std::time::Duration;
use support::{
    client,
    hang_up::{HangUpProxy, When},
    server::{Server, IN_PROGRESS_RETRY_AFTER},
};

fn idempotency(response: &reqwest::Response) -> Idempotency {
    response
        .extensions()
        .get::<Idempotency>()
        .cloned()
        .expect("the middleware's Idempotency on a keyed request's response")
}

async fn json(response: reqwest::Response) -> Value {
    serde_json::from_slice(&response.bytes().await.expect("a body")).expect("JSON")
}

fn charge(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: String,
    amount: u32,
) -> reqwest_middleware::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(format!(r#"{{"amount":{amount}}}"#))
}

/// Waits until the server's handlers have run `n` times (10 s at most).
async fn until_runs(server: &Server, n: usize) {
    let runs = async {
        while server.runs() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), runs)
        .await
        .expect("the handler runs");
}

/// Each attempt after a wait came no sooner than the wait asked: the
/// arrivals of one request's attempts, `asked` apart at least.
fn assert_waited(arrivals: &[std::time::Instant], asked: Duration) {
    for pair in arrivals.windows(2) {
        let waited = pair[1] - pair[0];
        assert!(
            waited >= asked,
            "an attempt came {waited:?} after the one told to wait {asked:?}"
        );
    }
}

#[tokio::test]
async fn a_fresh_request_sends_one_generated_key_and_runs_once() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());

    let response = charge(&client, server.url("/charges"), 1250)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 201);
    let sent = idempotency(&response);
    assert!(!sent.replayed());
    assert_eq!(sent.attempts(), 1);
    assert_eq!(sent.key().as_str().len(), 36, "a UUID: {}", sent.key());
    assert_eq!(json(response).await["run"], 1);
    assert_eq!(server.keys(), [sent.key().as_str()]);
    assert_eq!(server.runs(), 1);

    // A second logical request gets a key of its own.
    let again = charge(&client, server.url("/charges"), 1250)
        .send()
        .await
        .unwrap();
    assert_ne!(idempotency(&again).key(), sent.key());
    assert!(!idempotency(&again).replayed());
    assert_eq!(server.runs(), 2);

    // GET is left alone: no key sent, nothing on its response.
    let get = client.get(server.url("/charges")).send().await.unwrap();
    assert_eq!(get.status(), 405);
    assert!(get.extensions().get::<Idempotency>().is_none());
    assert_eq!(server.arrivals().last().unwrap().key, None);
}

#[tokio::test]
async fn the_same_key_again_gets_the_replay_and_says_so() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());
    let key = IdempotencyKey::new("order-1-charge").unwrap();

    let first = charge(&client, server.url("/charges"), 1250)
        .with_extension(key.clone())
        .send()
        .await
        .unwrap();
    let second = charge(&client, server.url("/charges"), 1250)
        .with_extension(key.clone())
        .send()
        .await
        .unwrap();

    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (201, 201)
    );
    assert!(!idempotency(&first).replayed());
    assert!(idempotency(&second).replayed());
    assert_eq!(idempotency(&second).key(), &key);
    assert_eq!(json(second).await["run"], 1);
    assert_eq!(server.runs(), 1);
    assert_eq!(server.keys(), ["order-1-charge", "order-1-charge"]);

    // A key header the caller set is sent as it is, and read back.
    let header = charge(&client, server.url("/charges"), 1250)
        .header("idempotency-key", "order-1-charge")
        .send()
        .await
        .unwrap();
    assert!(idempotency(&header).replayed());
    assert_eq!(idempotency(&header).key(), &key);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_duplicate_in_progress_waits_as_retry_after_says_then_gets_the_replay() {
    let server = Server::start().await;
    let key = IdempotencyKey::new("slow-1").unwrap();
    let first = tokio::spawn({
        let (client, url, key) = (
            client(IdempotencyMiddleware::new()),
            server.url("/slow"),
            key.clone(),
        );
        async move {
            charge(&client, url, 7)
                .with_extension(key)
                .send()
                .await
                .unwrap()
        }
    });
    until_runs(&server, 1).await;

    let second = charge(
        &client(IdempotencyMiddleware::new()),
        server.url("/slow"),
        7,
    )
    .with_extension(key.clone())
    .send()
    .await
    .unwrap();

    assert_eq!(second.status(), 201);
    let sent = idempotency(&second);
    assert!(sent.replayed(), "the first request's response, replayed");
    assert!(sent.attempts() >= 2, "told 409 first: {}", sent.attempts());
    assert_eq!(json(second).await["run"], 1);
    let first = first.await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(!idempotency(&first).replayed());
    assert_eq!(server.runs(), 1);
    // Every attempt with the one key; the second request's came as far
    // apart as Retry-After asked.
    let arrivals = server.arrivals();
    assert!(arrivals
        .iter()
        .all(|arrival| arrival.key.as_deref() == Some("slow-1")));
    let seconds: Vec<_> = arrivals[1..].iter().map(|arrival| arrival.at).collect();
    assert_eq!(seconds.len() as u32, sent.attempts());
    assert_waited(&seconds, IN_PROGRESS_RETRY_AFTER);
}

#[tokio::test]
async fn a_duplicate_in_progress_past_the_wait_budget_gets_the_409_and_its_key() {
    let server = Server::start().await;
    let first = tokio::spawn({
        let (client, url) = (client(IdempotencyMiddleware::new()), server.url("/slow"));
        async move {
            charge(&client, url, 7)
                .header("idempotency-key", "slow-2")
                .send()
                .await
                .unwrap()
        }
    });
    until_runs(&server, 1).await;

    // Retry-After says 1 s; this caller waits half a second at most.
    let impatient =
        client(IdempotencyMiddleware::new().wait_in_progress(Duration::from_millis(500)));
    let conflict = charge(&impatient, server.url("/slow"), 7)
        .header("idempotency-key", "slow-2")
        .send()
        .await
        .unwrap();
    assert_eq!(conflict.status(), 409);
    assert_eq!(idempotency(&conflict).attempts(), 1);
    let key = idempotency(&conflict).key().clone();
    assert_eq!(key.as_str(), "slow-2");

    // Later, with the key it was given back: the first request's result.
    first.await.unwrap();
    let later = charge(&impatient, server.url("/slow"), 7)
        .with_extension(key)
        .send()
        .await
        .unwrap();
    assert_eq!(later.status(), 201);
    assert!(idempotency(&later).replayed());
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_key_reused_with_another_payload_gets_422_once() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());
    let key = IdempotencyKey::new("order-2-charge").unwrap();
    let first = charge(&client, server.url("/charges"), 1)
        .with_extension(key.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 201);

    let reused = charge(&client, server.url("/charges"), 2)
        .with_extension(key)
        .send()
        .await
        .unwrap();

    assert_eq!(reused.status(), 422);
    assert_eq!(idempotency(&reused).attempts(), 1);
    assert!(!idempotency(&reused).replayed());
    assert_eq!(server.keys().len(), 2, "the 422 is not sent again");
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_bad_key_gets_400_once() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());

    // A structured-field string with no closing quote.
    let bad = charge(&client, server.url("/charges"), 1)
        .header("idempotency-key", "\"unterminated")
        .send()
        .await
        .unwrap();

    assert_eq!(bad.status(), 400);
    assert_eq!(idempotency(&bad).attempts(), 1);
    assert_eq!(server.arrivals().len(), 1);
    assert_eq!(server.runs(), 0);
}

#[tokio::test]
async fn a_store_outage_is_waited_out_as_retry_after_says_with_the_same_key() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());
    // The store fails the first request's call: the layer answers 503
    // with Retry-After, and the handler does not run.
    server.store.fail_next(1);

    let response = charge(&client, server.url("/charges"), 3)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 201);
    let sent = idempotency(&response);
    assert_eq!(sent.attempts(), 2);
    assert!(!sent.replayed());
    assert_eq!(server.runs(), 1);
    assert_eq!(server.keys(), [sent.key().as_str(), sent.key().as_str()]);
    let arrivals: Vec<_> = server.arrivals().iter().map(|arrival| arrival.at).collect();
    // The layer's Retry-After for a store outage: 1 s.
    assert_waited(&arrivals, Duration::from_secs(1));
}

#[tokio::test]
async fn a_store_outage_that_lasts_ends_in_the_last_503_after_max_attempts() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new().max_attempts(3));
    server.store.fail_next(usize::MAX);

    let response = charge(&client, server.url("/charges"), 4)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 503);
    let sent = idempotency(&response);
    assert_eq!(sent.attempts(), 3);
    assert_eq!(server.keys(), vec![sent.key().as_str(); 3]);
    assert_eq!(server.runs(), 0);

    // The store back: the key sent again runs the request once.
    server.store.fail_next(0);
    let later = charge(&client, server.url("/charges"), 4)
        .with_extension(sent.key().clone())
        .send()
        .await
        .unwrap();
    assert_eq!(later.status(), 201);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_hang_up_after_the_server_answered_is_retried_and_gets_the_replay() {
    let server = Server::start().await;
    // The first connection is dropped as the server's answer begins: the
    // handler ran and its response was stored, and the client never
    // heard it.
    let proxy = HangUpProxy::start(server.addr, 1, When::AnswerLost).await;
    let client = client(IdempotencyMiddleware::new());

    let response = charge(&client, proxy.url("/charges"), 5)
        .send()
        .await
        .unwrap();

    assert_eq!(proxy.hung_up(), 1);
    assert_eq!(response.status(), 201);
    let sent = idempotency(&response);
    // The retry, and a wait had it come before the record was complete.
    assert!(sent.attempts() >= 2);
    assert!(
        sent.replayed(),
        "the stored response of the run it did not hear"
    );
    assert_eq!(json(response).await["run"], 1);
    assert_eq!(server.runs(), 1);
    let keys = server.keys();
    assert_eq!(keys.len() as u32, sent.attempts());
    assert!(keys.iter().all(|key| key == sent.key().as_str()));
}

#[tokio::test]
async fn a_hang_up_once_the_request_was_read_is_retried_and_gets_the_one_result() {
    let server = Server::start().await;
    // The first connection is dropped once the server has the request
    // whole, while a slow handler would run: the retry finds it in
    // progress (409, then the replay), or never started (and runs it).
    let proxy = HangUpProxy::start(server.addr, 1, When::RequestRead).await;
    let client = client(IdempotencyMiddleware::new());

    let response = charge(&client, proxy.url("/slow"), 6).send().await.unwrap();

    assert_eq!(proxy.hung_up(), 1);
    assert_eq!(response.status(), 201);
    let sent = idempotency(&response);
    assert!(sent.attempts() >= 2);
    assert_eq!(json(response).await["run"], 1);
    // Let a run the server may still be finishing end, then count.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.runs(), 1);
    assert!(server.keys().iter().all(|key| key == sent.key().as_str()));
}

/// The server under `wait_for_result`: each duplicate is held up to that
/// long before its `409`. The client's `wait_in_progress` is time since
/// its first attempt, which those holds spend as its sleeps do.
#[tokio::test]
async fn wait_in_progress_bounds_the_time_against_a_server_that_holds_duplicates() {
    let server =
        Server::start_with(|layer| layer.wait_for_result(Duration::from_millis(1_500))).await;
    let body = r#"{"sleep_ms":20000}"#;
    let first = tokio::spawn({
        let (client, url) = (client(IdempotencyMiddleware::new()), server.url("/sleep"));
        async move {
            let _ = client
                .post(url)
                .header("content-type", "application/json")
                .header("idempotency-key", "held-1")
                .body(body)
                .send()
                .await;
        }
    });
    until_runs(&server, 1).await;

    let impatient = client(IdempotencyMiddleware::new().wait_in_progress(Duration::from_secs(2)));
    let started = std::time::Instant::now();
    let conflict = impatient
        .post(server.url("/sleep"))
        .header("content-type", "application/json")
        .header("idempotency-key", "held-1")
        .body(body)
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    first.abort();

    assert_eq!(conflict.status(), 409);
    // The budget, and the one attempt that finds it spent.
    assert!(
        took < Duration::from_millis(2_000 + 1_500 + 500),
        "a 2 s wait_in_progress took {took:?} over {} attempts",
        idempotency(&conflict).attempts()
    );
}

#[tokio::test]
async fn a_replay_header_of_the_servers_choosing_is_read_when_the_client_names_it() {
    let name = reqwest::header::HeaderName::from_static("x-idempotent-replay");
    let server = Server::start_with({
        let name = name.clone();
        |layer| layer.replayed_header(name)
    })
    .await;
    let client = client(IdempotencyMiddleware::new().replayed_header(name.clone()));
    let key = IdempotencyKey::new("custom-header-1").unwrap();

    let first = charge(&client, server.url("/charges"), 5)
        .with_extension(key.clone())
        .send()
        .await
        .unwrap();
    let again = charge(&client, server.url("/charges"), 5)
        .with_extension(key)
        .send()
        .await
        .unwrap();

    assert!(!idempotency(&first).replayed());
    assert!(idempotency(&again).replayed());
    assert_eq!(again.headers()[&name], "true");
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(server.runs(), 1);
}

/// A request builder cloned by the caller and sent twice: two logical
/// requests (two keys, two runs) unless the caller keyed it before the
/// clone, and then one run and a replay.
#[tokio::test]
async fn a_cloned_request_is_two_requests_unless_keyed_before_the_clone() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());

    let unkeyed = charge(&client, server.url("/charges"), 1);
    let copy = unkeyed.try_clone().expect("a bytes body clones");
    let (a, b) = (unkeyed.send().await.unwrap(), copy.send().await.unwrap());
    assert_ne!(idempotency(&a).key(), idempotency(&b).key());
    assert_eq!(server.runs(), 2);

    let keyed = charge(&client, server.url("/charges"), 1)
        .with_extension(IdempotencyKey::new("cloned-1").unwrap());
    let copy = keyed.try_clone().unwrap();
    let (a, b) = (keyed.send().await.unwrap(), copy.send().await.unwrap());
    assert_eq!(idempotency(&a).key(), idempotency(&b).key());
    assert!(!idempotency(&a).replayed() && idempotency(&b).replayed());
    assert_eq!(server.runs(), 3);
}

/// One client, many tasks at once: each request its own key, each run
/// once, nothing crossed between them.
#[tokio::test]
async fn concurrent_requests_on_one_client_each_get_their_own_key() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());
    let tasks: Vec<_> = (0..24)
        .map(|amount| {
            let (client, url) = (client.clone(), server.url("/charges"));
            tokio::spawn(async move {
                let response = charge(&client, url, amount).send().await.unwrap();
                let key = idempotency(&response).key().clone();
                let body = json(response).await;
                (key, body["amount"].as_u64().unwrap())
            })
        })
        .collect();
    let mut keys = std::collections::HashSet::new();
    for (amount, task) in tasks.into_iter().enumerate() {
        let (key, answered) = task.await.unwrap();
        assert_eq!(answered, amount as u64, "its own answer");
        assert!(keys.insert(key), "a key of its own");
    }
    assert_eq!(server.runs(), 24);
    let mut sent = server.keys();
    sent.sort();
    sent.dedup();
    assert_eq!(sent.len(), 24);
}

/// Post/Redirect/Get: the server stores the `303` and replays it, marked.
/// A client that follows redirects (reqwest's default) gets the last
/// hop's response, whose marker it reads (none, at the receipt): the
/// docs say so, and that a client built with `redirect::Policy::none()`
/// gets the replayed `303` itself, marked.
#[tokio::test]
async fn a_replayed_redirect_is_reported_as_a_replay() {
    let server = Server::start().await;
    let client = reqwest_middleware::ClientBuilder::new(
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
    )
    .with(IdempotencyMiddleware::new())
    .build();
    let key = IdempotencyKey::new("prg-1").unwrap();

    let first = charge(&client, server.url("/see-other"), 1)
        .with_extension(key.clone())
        .send()
        .await
        .unwrap();
    let again = charge(&client, server.url("/see-other"), 1)
        .with_extension(key)
        .send()
        .await
        .unwrap();

    assert_eq!(server.runs(), 1, "the server replayed the 303");
    assert_eq!(first.status(), again.status());
    assert!(!idempotency(&first).replayed());
    assert!(
        idempotency(&again).replayed(),
        "the second answer ({}, at {}) was the first's 303, replayed",
        again.status(),
        again.url()
    );
}

/// Many tasks of one client send one logical request at once (one key):
/// one run; every other gets the 409, waits as told, and gets the replay.
#[tokio::test]
async fn concurrent_duplicates_of_one_key_run_once_and_all_get_its_answer() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());
    let key = IdempotencyKey::new("together-1").unwrap();
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (client, url, key) = (client.clone(), server.url("/slow"), key.clone());
            tokio::spawn(async move {
                let response = charge(&client, url, 9)
                    .with_extension(key)
                    .send()
                    .await
                    .unwrap();
                let sent = idempotency(&response);
                (response.status(), sent.replayed(), json(response).await)
            })
        })
        .collect();
    let mut replayed = 0;
    for task in tasks {
        let (status, was_replayed, body) = task.await.unwrap();
        assert_eq!(status, 201);
        assert_eq!(body["run"], 1, "the one run's answer");
        replayed += usize::from(was_replayed);
    }
    assert_eq!(server.runs(), 1);
    assert_eq!(replayed, 9);
    assert!(server.keys().iter().all(|key| key == "together-1"));
}
