//! gRPC through the HTTP layer, for real: tonic's `Server` on 127.0.0.1
//! with `IdempotencyLayer` around it, and tonic's client over HTTP/2. The
//! messages and the service are written by hand as tonic-build would
//! generate them (no protoc). The memory store: no process to start.

use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tonic::{
    body::Body,
    codegen::{http, BoxFuture, BoxStream, Bytes, Context, Pin, Poll, Service},
    metadata::MetadataMap,
    server::{Grpc, NamedService, ServerStreamingService, UnaryService},
    transport::{Channel, Endpoint, Server},
    Code, Request, Response, Status,
};
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChargeRequest {
    #[prost(int64, tag = "1")]
    pub amount: i64,
    /// What the handler does: "" (charge), "slow", "unavailable", "invalid".
    #[prost(string, tag = "2")]
    pub behaviour: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Charge {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int64, tag = "2")]
    pub amount: i64,
}

const CREATE: &str = "/test.Charges/Create";
const EXPORT: &str = "/test.Charges/Export";

/// The handlers, and how often they ran.
#[derive(Clone, Default)]
struct Charges {
    runs: Arc<AtomicUsize>,
    /// Releases the third message of an export.
    go_on: Arc<tokio::sync::Notify>,
}

impl Charges {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    async fn create(&self, request: ChargeRequest) -> Result<Response<Charge>, Status> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        match request.behaviour.as_str() {
            "slow" => tokio::time::sleep(Duration::from_millis(300)).await,
            "unavailable" => return Err(Status::unavailable(format!("ledger down (run {run})"))),
            "invalid" => {
                let mut metadata = MetadataMap::new();
                metadata.insert("x-field", "amount".parse().expect("ascii"));
                return Err(Status::with_metadata(
                    Code::InvalidArgument,
                    "amount must be positive",
                    metadata,
                ));
            }
            _ => {}
        }
        let mut response = Response::new(Charge {
            id: format!("ch_{run}"),
            amount: request.amount,
        });
        response
            .metadata_mut()
            .insert("x-charge-run", run.to_string().parse().expect("ascii"));
        Ok(response)
    }
}

/// The server side, as tonic-build generates it.
#[derive(Clone)]
struct ChargesServer(Charges);

impl NamedService for ChargesServer {
    const NAME: &'static str = "test.Charges";
}

struct Create(Charges);

impl UnaryService<ChargeRequest> for Create {
    type Response = Charge;
    type Future = BoxFuture<Response<Charge>, Status>;

    fn call(&mut self, request: Request<ChargeRequest>) -> Self::Future {
        let charges = self.0.clone();
        Box::pin(async move { charges.create(request.into_inner()).await })
    }
}

struct Export(Charges);

impl ServerStreamingService<ChargeRequest> for Export {
    type Response = Charge;
    type ResponseStream = BoxStream<Charge>;
    type Future = BoxFuture<Response<BoxStream<Charge>>, Status>;

    fn call(&mut self, request: Request<ChargeRequest>) -> Self::Future {
        let charges = self.0.clone();
        Box::pin(async move {
            charges.runs.fetch_add(1, Ordering::SeqCst);
            let stream = match request.into_inner().behaviour.as_str() {
                "" => async_stream(charges.go_on.clone()),
                breaks => broken_stream(breaks.to_owned()),
            };
            Ok(Response::new(stream))
        })
    }
}

/// Two charges at once, then a third once the client has seen them.
fn async_stream(go_on: Arc<tokio::sync::Notify>) -> BoxStream<Charge> {
    let charge = |n: i64| Charge {
        id: format!("ch_{n}"),
        amount: n,
    };
    let first = futures::stream::iter([Ok(charge(1)), Ok(charge(2))]);
    let third = futures::stream::once(async move {
        go_on.notified().await;
        Ok(charge(3))
    });
    Box::pin(futures::StreamExt::chain(first, third))
}

/// A first charge, then the stream breaks as `how` says: `panic` (the
/// stream panics while polled) or `error` (an error status part-way).
fn broken_stream(how: String) -> BoxStream<Charge> {
    let first = futures::stream::once(async {
        Ok(Charge {
            id: "ch_1".into(),
            amount: 1,
        })
    });
    let breaks = futures::stream::once(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if how == "panic" {
            panic!("the export's source panicked part-way");
        }
        Err(Status::internal("the export's source failed part-way"))
    });
    Box::pin(futures::StreamExt::chain(first, breaks))
}

impl Service<http::Request<Body>> for ChargesServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let charges = self.0.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<Charge, ChargeRequest>::default());
            match request.uri().path() {
                CREATE => {
                    let response = grpc.unary(Create(charges.clone()), request).await;
                    // A trailer of the handler's own, after gRPC's status
                    // (as grpc-go's SetTrailer): replayed as it was sent.
                    let ledger = http::HeaderValue::from(charges.runs());
                    Ok(response.map(|body| Body::new(WithTrailer { body, ledger })))
                }
                EXPORT => Ok(grpc.server_streaming(Export(charges), request).await),
                _ => Ok(Status::unimplemented("no such method").into_http()),
            }
        })
    }
}

/// Adds `x-ledger` to a body's trailers.
struct WithTrailer {
    body: Body,
    ledger: http::HeaderValue,
}

impl http_body::Body for WithTrailer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let ledger = self.ledger.clone();
        Pin::new(&mut self.body).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|frame| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        trailers.insert("x-ledger", ledger);
                        http_body::Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

/// A tonic server with the layer, on a free port, stopped when dropped.
struct Running {
    channel: Channel,
    charges: Charges,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Running {
    async fn start(layer: IdempotencyLayer<MemoryStore>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("address");
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let charges = Charges::default();
        let server = Server::builder()
            .layer(layer)
            .add_service(ChargesServer(charges.clone()))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            });
        let server = tokio::spawn(server);
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connects");
        Self {
            channel,
            charges,
            stop: Some(stop),
            server: Some(server),
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("joins").expect("serves");
        }
    }

    fn request(key: Option<&str>, message: ChargeRequest) -> Request<ChargeRequest> {
        let mut request = Request::new(message);
        if let Some(key) = key {
            request
                .metadata_mut()
                .insert("idempotency-key", key.parse().expect("ascii"));
        }
        request
    }

    async fn create(
        &self,
        key: Option<&str>,
        message: ChargeRequest,
    ) -> Result<Response<Charge>, Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.expect("ready");
        let path = http::uri::PathAndQuery::from_static(CREATE);
        grpc.unary(Self::request(key, message), path, ProstCodec::default())
            .await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.abort();
        }
    }
}

fn layer() -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope()
}

fn charge(amount: i64, behaviour: &str) -> ChargeRequest {
    ChargeRequest {
        amount,
        behaviour: behaviour.into(),
    }
}

/// The metadata a retry must match: all but the date, which hyper sets on
/// each response, and the replay marker.
fn comparable(metadata: &MetadataMap) -> Vec<(String, String)> {
    let mut pairs: Vec<_> = metadata
        .clone()
        .into_headers()
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "date" | "idempotent-replayed"))
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or("?").to_owned()))
        .collect();
    pairs.sort();
    pairs
}

#[tokio::test]
async fn a_unary_call_and_its_retry_get_one_run_and_the_same_answer() {
    let server = Running::start(layer()).await;
    let first = server
        .create(Some("k-unary"), charge(1250, ""))
        .await
        .expect("the first call succeeds (its status is in the trailers)");
    assert_eq!(first.get_ref().id, "ch_1");
    // tonic merges the trailers into a unary response's metadata.
    assert_eq!(first.metadata().get("x-ledger").expect("trailer"), "1");
    assert_eq!(first.metadata().get("x-charge-run").expect("header"), "1");
    assert!(first.metadata().get("idempotent-replayed").is_none());

    let retry = server
        .create(Some("k-unary"), charge(1250, ""))
        .await
        .expect("the retry succeeds");
    assert_eq!(retry.get_ref(), first.get_ref(), "the same message");
    assert_eq!(comparable(retry.metadata()), comparable(first.metadata()));
    assert_eq!(
        retry.metadata().get("idempotent-replayed").expect("marked"),
        "true"
    );
    assert_eq!(server.charges.runs(), 1, "the handler ran once");
    server.stop().await;
}

#[tokio::test]
async fn a_deterministic_error_is_replayed_with_its_status_message_and_metadata() {
    let server = Running::start(layer()).await;
    let first = server
        .create(Some("k-invalid"), charge(-1, "invalid"))
        .await
        .expect_err("invalid");
    let retry = server
        .create(Some("k-invalid"), charge(-1, "invalid"))
        .await
        .expect_err("invalid again");
    for status in [&first, &retry] {
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "amount must be positive");
        assert_eq!(
            status.metadata().get("x-field").expect("metadata"),
            "amount"
        );
    }
    assert_eq!(
        retry.metadata().get("idempotent-replayed").expect("marked"),
        "true"
    );
    assert_eq!(server.charges.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn concurrent_duplicates_run_once_the_others_get_aborted_or_the_replay() {
    let server = Running::start(layer()).await;
    let calls = (0..4).map(|_| server.create(Some("k-concurrent"), charge(10, "slow")));
    let results = futures::future::join_all(calls).await;
    let (mut fresh, mut aborted) = (0, 0);
    for result in results {
        match result {
            Ok(response) => {
                assert_eq!(response.get_ref().id, "ch_1");
                if response.metadata().get("idempotent-replayed").is_none() {
                    fresh += 1;
                }
            }
            Err(status) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert!(
                    status.message().contains("still being processed"),
                    "{status:?}"
                );
                aborted += 1;
            }
        }
    }
    assert_eq!(fresh, 1, "one call ran");
    assert!(aborted >= 1, "the duplicates were refused while it ran");
    assert_eq!(server.charges.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_key_reused_with_another_message_is_a_failed_precondition() {
    let server = Running::start(layer()).await;
    server
        .create(Some("k-reused"), charge(1250, ""))
        .await
        .expect("first");
    let reused = server
        .create(Some("k-reused"), charge(9999, ""))
        .await
        .expect_err("another message");
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert!(reused.message().contains("different request"), "{reused:?}");
    assert_eq!(server.charges.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn an_unavailable_status_is_not_stored_so_the_retry_runs_again() {
    let server = Running::start(layer()).await;
    for run in 1..=2 {
        let status = server
            .create(Some("k-unavailable"), charge(5, "unavailable"))
            .await
            .expect_err("unavailable");
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), format!("ledger down (run {run})"));
        assert!(status.metadata().get("idempotent-replayed").is_none());
        assert_eq!(server.charges.runs(), run, "the retry ran");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_missing_or_invalid_key_is_an_invalid_argument() {
    let server = Running::start(layer()).await;
    let missing = server
        .create(None, charge(1, ""))
        .await
        .expect_err("a key is required");
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    assert!(missing.message().contains("idempotency-key"), "{missing:?}");
    let long = "k".repeat(256);
    let invalid = server
        .create(Some(&long), charge(1, ""))
        .await
        .expect_err("too long");
    assert_eq!(invalid.code(), Code::InvalidArgument, "{invalid:?}");
    assert_eq!(server.charges.runs(), 0, "nothing ran");
    server.stop().await;
}

#[tokio::test]
async fn a_server_stream_passes_through_and_is_not_stored() {
    let server = Running::start(layer()).await;
    let export = |server: &Running| {
        let mut grpc = tonic::client::Grpc::new(server.channel.clone());
        async move {
            grpc.ready().await.expect("ready");
            let path = http::uri::PathAndQuery::from_static(EXPORT);
            grpc.server_streaming(
                Running::request(Some("k-export"), charge(0, "")),
                path,
                ProstCodec::<ChargeRequest, Charge>::default(),
            )
            .await
        }
    };
    // The response's head too: a layer that read the whole body first
    // would hold it until the end, which the handler holds back.
    let mut stream = tokio::time::timeout(Duration::from_secs(5), export(&server))
        .await
        .expect("the head before the end, not buffered")
        .expect("streams")
        .into_inner();
    // The first two arrive while the handler still holds the third: the
    // response was not read whole first.
    for n in 1..=2 {
        let next = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("streamed before the end, not buffered")
            .expect("a message")
            .expect("not the end");
        assert_eq!(next.amount, n);
    }
    server.charges.go_on.notify_one();
    assert_eq!(
        stream
            .message()
            .await
            .expect("third")
            .expect("a message")
            .amount,
        3
    );
    assert!(stream.message().await.expect("ends").is_none());
    assert_eq!(server.charges.runs(), 1);

    // Not stored, and processed: the retry does not run it again.
    let retry = export(&server).await.expect_err("not replayed");
    assert_eq!(retry.code(), Code::AlreadyExists, "{retry:?}");
    assert!(retry.message().contains("not stored"), "{retry:?}");
    assert_eq!(server.charges.runs(), 1);
    server.stop().await;
}

/// A server stream that breaks part-way: the client sees the failure (an
/// error, never a clean end). A panic cuts the stream, and the retry is told
/// the call was processed and not stored, without running it again.
async fn a_broken_server_stream(how: &str) {
    let server = Running::start(layer()).await;
    let key = format!("k-broken-{how}");
    let export = |server: &Running| {
        let mut grpc = tonic::client::Grpc::new(server.channel.clone());
        let request = Running::request(Some(&key), charge(0, how));
        async move {
            grpc.ready().await.expect("ready");
            let path = http::uri::PathAndQuery::from_static(EXPORT);
            grpc.server_streaming(
                request,
                path,
                ProstCodec::<ChargeRequest, Charge>::default(),
            )
            .await
        }
    };
    let mut stream = export(&server).await.expect("streams").into_inner();
    let first = stream
        .message()
        .await
        .expect("the first")
        .expect("a message");
    assert_eq!(first.amount, 1);
    let broken = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream ends");
    assert!(
        broken.is_err(),
        "{how}: a failure, not a clean end: {broken:?}"
    );
    if how == "error" {
        // The handler's own status, in the trailers: the outcome policy
        // decides on it as on a unary call's (INTERNAL is released), so
        // the retry runs the call again, as the handler asked.
        assert_eq!(broken.expect_err("failed").code(), Code::Internal);
        let mut retry = export(&server).await.expect("runs again").into_inner();
        assert_eq!(
            retry
                .message()
                .await
                .expect("first")
                .expect("a message")
                .amount,
            1
        );
        assert_eq!(server.charges.runs(), 2);
        server.stop().await;
        return;
    }
    let started = std::time::Instant::now();
    let retry = loop {
        let retry = export(&server).await.expect_err("not replayed");
        if retry.code() != Code::Aborted || started.elapsed() > Duration::from_secs(10) {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(retry.code(), Code::AlreadyExists, "{how}: {retry:?}");
    assert!(retry.message().contains("not stored"), "{how}: {retry:?}");
    assert_eq!(server.charges.runs(), 1, "{how}");
    server.stop().await;
}

#[tokio::test]
async fn a_server_stream_that_panics_part_way_fails_for_the_client_and_is_not_stored() {
    a_broken_server_stream("panic").await;
}

#[tokio::test]
async fn a_server_stream_that_fails_part_way_fails_for_the_client_and_its_status_decides() {
    a_broken_server_stream("error").await;
}

/// Outside review, surface held: `withhold_bodies` on a gRPC service. The
/// first call gets its message; the retry gets `ALREADY_EXISTS` with the
/// SHA-256 of the body first sent (the length-prefixed message) in its
/// `idempotency-response-digest` metadata, through tonic's client over
/// HTTP/2; and `redact_json`, which cannot read a gRPC body, withholds it
/// the same way, as documented.
#[tokio::test]
async fn a_withheld_grpc_answer_carries_its_digest_to_a_tonic_client() {
    use base64::Engine as _;
    use lambda_idempotency::{JsonPointer, JsonRedaction};
    use prost::Message as _;
    use sha2::Digest as _;
    let redaction = JsonRedaction::new().remove(JsonPointer::new("/id").unwrap());
    for (name, layer) in [
        ("withhold_bodies", layer().withhold_bodies()),
        ("redact_json", layer().redact_json(redaction)),
    ] {
        let server = Running::start(layer).await;
        let first = server
            .create(Some("k-withheld"), charge(1250, ""))
            .await
            .expect("the first call gets its answer");
        assert_eq!(first.get_ref().id, "ch_1", "{name}");
        let retry = server
            .create(Some("k-withheld"), charge(1250, ""))
            .await
            .expect_err("the retry is told the answer was not stored");
        assert_eq!(retry.code(), Code::AlreadyExists, "{name}");
        let message = first.get_ref().encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        let digest = format!(
            "sha-256=:{}:",
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&framed))
        );
        assert_eq!(
            retry
                .metadata()
                .get("idempotency-response-digest")
                .expect("the digest metadata"),
            digest.as_str(),
            "{name}"
        );
        assert_eq!(server.charges.runs(), 1, "{name}");
        server.stop().await;
    }
}

/// Outside review: a gRPC response's trailing metadata (a handler's own
/// trailer, after the status, as grpc-go's `SetTrailer`) reached every
/// retry whatever the hook did. The hook now finds the trailers in the
/// response's extensions, as an `http::HeaderMap`, and what it leaves
/// there is what is stored.
#[tokio::test]
async fn a_redact_hook_can_take_a_trailer_out_of_the_record() {
    let server = Running::start(layer().redact(|response| {
        response.headers_mut().remove("x-charge-run");
        if let Some(trailers) = response.extensions_mut().get_mut::<http::HeaderMap>() {
            trailers.remove("x-ledger");
        }
        Ok(())
    }))
    .await;
    let first = server
        .create(Some("k-trailer"), charge(1250, ""))
        .await
        .expect("the first call");
    assert_eq!(first.metadata().get("x-ledger").expect("trailer"), "1");
    let retry = server
        .create(Some("k-trailer"), charge(1250, ""))
        .await
        .expect("the replay");
    assert_eq!(
        retry.metadata().get("idempotent-replayed").expect("marked"),
        "true"
    );
    assert!(
        retry.metadata().get("x-charge-run").is_none(),
        "a header the hook removed is not replayed (held)"
    );
    assert!(
        retry.metadata().get("x-ledger").is_none(),
        "a trailer the hook removed is replayed: {:?}",
        retry.metadata()
    );
    server.stop().await;
}

/// The engine's observers hear a gRPC call's answers through the gRPC
/// port, once each: the first call's, its retry's and a reused key's.
#[tokio::test]
async fn each_call_is_reported_through_the_grpc_port() {
    use lambda_idempotency::{observe::Port, testing::RecordingObserver};
    let observer = RecordingObserver::default();
    let engine = Engine::builder(MemoryStore::new())
        .observer(observer.clone())
        .build();
    let server = Running::start(IdempotencyLayer::new(engine).shared_scope()).await;
    for amount in [1250, 1250, 99] {
        let _ = server.create(Some("k-observed"), charge(amount, "")).await;
    }
    assert_eq!(
        observer.answers_through(Port::Grpc),
        ["fresh", "replay", "key_reused"]
    );
    assert_eq!(observer.answers().len(), 3, "{:?}", observer.answers());
    server.stop().await;
}

/// A gRPC replay names the trace of the call that ran (its `traceparent`
/// metadata), for an answer with a message and for a status alone
/// (trailers-only), as an HTTP replay does.
#[tokio::test]
async fn a_grpc_replay_names_the_trace_of_the_call_that_ran() {
    const FIRST: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const RETRY: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let server = Running::start(
        layer().replay_trace_header(http::HeaderName::from_static("idempotency-replay-of")),
    )
    .await;
    let traced = |key: &'static str, message: ChargeRequest, traceparent: &'static str| {
        let mut request = Running::request(Some(key), message);
        request
            .metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
        let channel = server.channel.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.expect("ready");
            let path = http::uri::PathAndQuery::from_static(CREATE);
            grpc.unary::<_, Charge, _>(request, path, ProstCodec::default())
                .await
        }
    };
    let first = traced("k-traced", charge(1250, ""), FIRST).await.unwrap();
    assert!(first.metadata().get("idempotency-replay-of").is_none());
    let retry = traced("k-traced", charge(1250, ""), RETRY).await.unwrap();
    assert_eq!(retry.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(
        retry.metadata().get("idempotency-replay-of").unwrap(),
        FIRST
    );

    traced("k-traced-invalid", charge(-1, "invalid"), FIRST)
        .await
        .expect_err("invalid");
    let status = traced("k-traced-invalid", charge(-1, "invalid"), RETRY)
        .await
        .expect_err("invalid again");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(
        status.metadata().get("idempotency-replay-of").unwrap(),
        FIRST
    );
    assert_eq!(server.charges.runs(), 2);
    server.stop().await;
}
