//! A fault-injecting HTTP proxy on 127.0.0.1, between the SDK and DynamoDB
//! Local: it delays, drops, loses answers to writes that landed, answers
//! throttling or 5xx errors, or refuses everything, per DynamoDB operation.

use std::{
    collections::{BTreeMap, VecDeque},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// What the proxy does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Forward it after a delay.
    Delay(Duration),
    /// Close the connection without forwarding: the write never happened.
    Drop,
    /// Forward it, read DynamoDB's answer, and close the connection instead
    /// of answering: the write landed and its answer is lost.
    LoseAnswer,
    /// Answer `ProvisionedThroughputExceededException` without forwarding.
    Throttle,
    /// Answer a 500 `InternalServerError` without forwarding.
    ServerError,
}

#[derive(Default)]
struct State {
    /// Faults to apply, per operation ("PutItem") or for any ("*"), in order.
    plan: BTreeMap<String, VecDeque<Fault>>,
    /// Faults to apply to every request of an operation from now on.
    always: BTreeMap<String, Fault>,
    /// Refuse every connection (the store is down).
    down: bool,
    /// Random faults: (probability in thousandths, the faults to pick from).
    chaos: Option<(u32, Vec<Fault>)>,
    /// Deterministic, so chaos is reproducible run to run.
    rng: fastrand::Rng,
    injected: BTreeMap<String, u64>,
    forwarded: u64,
}

/// The proxy. Dropping it stops it.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// A proxy to `upstream` (an `http://host:port` URL).
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("upstream host:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let _ = serve(client, upstream, state).await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// The URL to give the SDK.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Applies `fault` to the next `times` requests of `operation` ("*" for
    /// any operation).
    pub fn inject(&self, operation: &str, fault: Fault, times: usize) {
        let mut state = self.state.lock().unwrap();
        let plan = state.plan.entry(operation.to_owned()).or_default();
        plan.extend(std::iter::repeat_n(fault, times));
    }

    /// Applies `fault` to every request of `operation` until [`heal`](Self::heal).
    pub fn always(&self, operation: &str, fault: Fault) {
        self.state
            .lock()
            .unwrap()
            .always
            .insert(operation.to_owned(), fault);
    }

    /// Applies a fault picked at random from `faults` to `per_mille`
    /// thousandths of the requests, until [`heal`](Self::heal).
    pub fn chaos(&self, per_mille: u32, faults: &[Fault]) {
        let mut state = self.state.lock().unwrap();
        state.chaos = Some((per_mille, faults.to_vec()));
        state.rng = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
    }

    /// Refuses every connection until [`heal`](Self::heal).
    pub fn go_down(&self) {
        self.state.lock().unwrap().down = true;
    }

    /// Removes every fault.
    pub fn heal(&self) {
        let mut state = self.state.lock().unwrap();
        state.plan.clear();
        state.always.clear();
        state.down = false;
        state.chaos = None;
    }

    /// How many faults were injected, by kind.
    pub fn injected(&self) -> BTreeMap<String, u64> {
        self.state.lock().unwrap().injected.clone()
    }

    /// How many faults were injected in all.
    pub fn injected_total(&self) -> u64 {
        self.state.lock().unwrap().injected.values().sum()
    }

    /// How many requests reached DynamoDB Local.
    pub fn forwarded(&self) -> u64 {
        self.state.lock().unwrap().forwarded
    }
}

struct HttpMessage {
    head: Vec<u8>,
    body: Vec<u8>,
    target: String,
}

impl HttpMessage {
    fn bytes(&self) -> Vec<u8> {
        let mut bytes = self.head.clone();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

async fn read_message<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
) -> std::io::Result<Option<HttpMessage>> {
    let mut head = Vec::new();
    let mut content_length = 0usize;
    let mut target = String::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&line);
        if let Some((name, value)) = text.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse().unwrap_or(0);
            } else if name.eq_ignore_ascii_case("x-amz-target") {
                target = value
                    .trim()
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
            }
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" {
            break;
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body).await?;
    Ok(Some(HttpMessage { head, body, target }))
}

fn error_response(status: &str, kind: &str, message: &str) -> Vec<u8> {
    let body =
        format!(r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{kind}","message":"{message}"}}"#);
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-amz-json-1.0\r\nx-amzn-RequestId: fault-proxy\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn next_fault(state: &Mutex<State>, operation: &str) -> Option<Fault> {
    let mut state = state.lock().unwrap();
    let fault = [operation, "*"]
        .iter()
        .find_map(|key| state.plan.get_mut(*key).and_then(VecDeque::pop_front))
        .or_else(|| {
            state
                .always
                .get(operation)
                .or_else(|| state.always.get("*"))
                .copied()
        })
        .or_else(|| {
            let (per_mille, faults) = state.chaos.clone()?;
            (state.rng.u32(..1000) < per_mille).then(|| faults[state.rng.usize(..faults.len())])
        });
    match fault {
        Some(fault) => {
            let name = match fault {
                Fault::Delay(_) => "delay",
                Fault::Drop => "drop",
                Fault::LoseAnswer => "lose_answer",
                Fault::Throttle => "throttle",
                Fault::ServerError => "server_error",
            };
            *state.injected.entry(name.to_owned()).or_default() += 1;
        }
        None => state.forwarded += 1,
    }
    fault
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    state: Arc<Mutex<State>>,
) -> std::io::Result<()> {
    if state.lock().unwrap().down {
        *state
            .lock()
            .unwrap()
            .injected
            .entry("refused".into())
            .or_default() += 1;
        return Ok(());
    }
    let (client_read, mut client_write) = client.into_split();
    let mut client_read = BufReader::new(client_read);
    let server = TcpStream::connect(upstream).await?;
    let (server_read, mut server_write) = server.into_split();
    let mut server_read = BufReader::new(server_read);
    while let Some(request) = read_message(&mut client_read).await? {
        if state.lock().unwrap().down {
            return Ok(());
        }
        let fault = next_fault(&state, &request.target);
        match fault {
            Some(Fault::Drop) => return Ok(()),
            Some(Fault::Throttle) => {
                let response = error_response(
                    "400 Bad Request",
                    "ProvisionedThroughputExceededException",
                    "The level of configured provisioned throughput for the table was exceeded (fault proxy)",
                );
                client_write.write_all(&response).await?;
                continue;
            }
            Some(Fault::ServerError) => {
                let response = error_response(
                    "500 Internal Server Error",
                    "InternalServerError",
                    "fault proxy",
                );
                client_write.write_all(&response).await?;
                continue;
            }
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
            Some(Fault::LoseAnswer) | None => {}
        }
        server_write.write_all(&request.bytes()).await?;
        let Some(response) = read_message(&mut server_read).await? else {
            return Ok(());
        };
        if fault == Some(Fault::LoseAnswer) {
            // DynamoDB applied the write; the client never hears of it.
            return Ok(());
        }
        client_write.write_all(&response.bytes()).await?;
    }
    Ok(())
}
