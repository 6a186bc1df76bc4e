//! A Lambda Runtime API that serves several `/next` long-polls at once, as
//! a Managed Instance's does: each invocation goes to the first worker
//! waiting, carries its own deadline, and is reported timed out at that
//! deadline while the worker's code runs on (Lambda does not stop it
//! there). A response that arrives after the deadline is refused with
//! `410 Gone`, as Lambda refuses a stale one.
//!
//! It listens on 127.0.0.1 on a free port and stops when dropped.

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::{get, post},
    Router,
};
use serde_json::Value;
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tokio::sync::{mpsc, oneshot};

/// What Lambda reports for one invocation.
#[derive(Debug)]
pub enum Reported {
    /// The function's response, before the deadline.
    Response(Value),
    /// The function's error, before the deadline.
    Error(Value),
    /// The deadline passed first: Lambda reports a timeout (the code may
    /// still be running).
    TimedOut,
    /// A streamed response (`Lambda-Runtime-Function-Response-Mode:
    /// streaming`), whole: its metadata prelude, the eight NUL bytes, the
    /// body, and the error lambda_runtime writes after it when the stream
    /// failed part-way (`Lambda-Runtime-Function-Error-Type: …`).
    Streamed(Bytes),
}

struct Queued {
    id: String,
    deadline_ms: u64,
    event: Value,
}

#[derive(Default)]
struct Pending {
    answers: HashMap<String, oneshot::Sender<Reported>>,
    deadlines: HashMap<String, u64>,
}

struct Shared {
    queue: tokio::sync::Mutex<mpsc::UnboundedReceiver<Queued>>,
    pending: Mutex<Pending>,
    polling: AtomicUsize,
    late_responses: AtomicUsize,
}

/// The stub: queue invocations with [`RuntimeApi::invoke`].
pub struct RuntimeApi {
    pub addr: SocketAddr,
    sender: mpsc::UnboundedSender<Queued>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

impl RuntimeApi {
    pub async fn start() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            queue: tokio::sync::Mutex::new(receiver),
            pending: Mutex::default(),
            polling: AtomicUsize::new(0),
            late_responses: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port on 127.0.0.1");
        let addr = listener.local_addr().expect("bound");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the stub serves");
        });
        Self {
            addr,
            sender,
            shared,
            next_id: AtomicU64::new(1),
            server,
        }
    }

    /// The `host:port` for `AWS_LAMBDA_RUNTIME_API`.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// How many `/next` long-polls are waiting now.
    pub fn polling(&self) -> usize {
        self.shared.polling.load(Ordering::SeqCst)
    }

    /// Responses that came after their invocation's deadline (refused).
    pub fn late_responses(&self) -> usize {
        self.shared.late_responses.load(Ordering::SeqCst)
    }

    /// Waits until `workers` long-polls wait at once (the runtime's
    /// workers are up).
    pub async fn wait_for_workers(&self, workers: usize) {
        for _ in 0..500 {
            if self.polling() >= workers {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "{} of {workers} workers polled the Runtime API",
            self.polling()
        );
    }

    /// Queues one invocation with `timeout` from now, and waits for what
    /// Lambda reports: the response or error before the deadline, or a
    /// time-out at it.
    pub async fn invoke(&self, event: Value, timeout: Duration) -> Reported {
        let id = format!("invocation-{}", self.next_id.fetch_add(1, Ordering::SeqCst));
        let deadline_ms = epoch_ms() + timeout.as_millis() as u64;
        let (answer, answered) = oneshot::channel();
        {
            let mut pending = self.shared.pending.lock().expect("not poisoned");
            pending.answers.insert(id.clone(), answer);
            pending.deadlines.insert(id.clone(), deadline_ms);
        }
        self.sender
            .send(Queued {
                id: id.clone(),
                deadline_ms,
                event,
            })
            .expect("the stub is running");
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(reported)) => reported,
            Ok(Err(_)) => panic!("the stub dropped invocation {id}"),
            Err(_) => {
                self.shared
                    .pending
                    .lock()
                    .expect("not poisoned")
                    .answers
                    .remove(&id);
                Reported::TimedOut
            }
        }
    }
}

async fn next(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    shared.polling.fetch_add(1, Ordering::SeqCst);
    let queued = shared.queue.lock().await.recv().await;
    shared.polling.fetch_sub(1, Ordering::SeqCst);
    let Some(queued) = queued else {
        // The stub is going away: the poll is never answered (an answer
        // without an invocation would make the worker panic).
        return std::future::pending().await;
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        "lambda-runtime-aws-request-id",
        queued.id.parse().expect("an id"),
    );
    headers.insert(
        "lambda-runtime-deadline-ms",
        queued.deadline_ms.to_string().parse().expect("a number"),
    );
    headers.insert(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:us-east-1:123456789012:function:managed"
            .parse()
            .expect("an arn"),
    );
    headers.insert("content-type", "application/json".parse().expect("a type"));
    let body = serde_json::to_vec(&queued.event).expect("an event");
    (StatusCode::OK, headers, body)
}

/// Hands the report to the invocation's caller; `410 Gone` once its
/// deadline has passed.
fn report(shared: &Shared, id: &str, reported: Reported) -> StatusCode {
    let mut pending = shared.pending.lock().expect("not poisoned");
    let deadline_ms = pending.deadlines.get(id).copied();
    let Some(deadline_ms) = deadline_ms else {
        return StatusCode::NOT_FOUND;
    };
    let answer = pending.answers.remove(id);
    match answer {
        Some(answer) if epoch_ms() <= deadline_ms => {
            let _ = answer.send(reported);
            StatusCode::ACCEPTED
        }
        _ => {
            shared.late_responses.fetch_add(1, Ordering::SeqCst);
            StatusCode::GONE
        }
    }
}

async fn response(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let streamed = headers
        .get("lambda-runtime-function-response-mode")
        .is_some_and(|mode| mode == "streaming");
    if streamed {
        return report(&shared, &id, Reported::Streamed(body));
    }
    let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    report(&shared, &id, Reported::Response(value))
}

async fn error(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> StatusCode {
    let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    report(&shared, &id, Reported::Error(value))
}

async fn init_error(body: Bytes) -> StatusCode {
    eprintln!(
        "the function reported an init error: {}",
        String::from_utf8_lossy(&body)
    );
    StatusCode::ACCEPTED
}
