//! Raw TCP servers on a free loopback port: each connection's request is
//! read whole (head and `Content-Length` body), recorded, and answered as
//! scripted, or the connection is dropped without an answer.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Instant,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// A request as the server read it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// The key header's bytes as they came (not made UTF-8).
    pub raw_key: Option<Vec<u8>>,
    pub key: Option<String>,
    pub body: Vec<u8>,
    pub at: Instant,
}

/// What the server does with a request it has read.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Hangs up: the connection is dropped without a byte of answer.
    HangUp,
    /// Resets the connection (RST, not FIN) without a byte of answer.
    Reset,
    /// Holds the connection open and never answers.
    Stall,
    /// Answers this status with these extra headers and a small body.
    Status(u16, Vec<(&'static str, String)>),
    /// Answers 201 with `Content-Length: 100` and these extra headers,
    /// sends 10 bytes of the body and hangs up: the answer's head arrived,
    /// its body is cut.
    Truncated(Vec<(&'static str, String)>),
    /// Answers this status with these headers given as raw bytes (a
    /// proxy's duplicated or non-ASCII fields).
    RawHead(u16, Vec<u8>),
}

pub struct RawServer {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl RawServer {
    /// Answers the requests in turn as `script` says, and every one past
    /// its end with its last answer.
    pub async fn start(script: Vec<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let mut script = VecDeque::from(script);
        let last = script.back().cloned().unwrap_or(Answer::HangUp);
        let record = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let Some(request) = read_request(&mut stream).await else {
                    continue;
                };
                record.lock().unwrap().push(request);
                match script.pop_front().unwrap_or_else(|| last.clone()) {
                    Answer::HangUp => drop(stream),
                    Answer::Reset => {
                        // SO_LINGER 0: the close sends RST.
                        let _ = stream.set_zero_linger();
                        drop(stream);
                    }
                    Answer::Stall => {
                        tokio::spawn(async move {
                            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                            drop(stream);
                        });
                    }
                    Answer::Status(status, headers) => {
                        let mut head = format!(
                            "HTTP/1.1 {status} Scripted\r\ncontent-length: 2\r\nconnection: close\r\n"
                        );
                        for (name, value) in headers {
                            head.push_str(&format!("{name}: {value}\r\n"));
                        }
                        head.push_str("\r\n{}");
                        let _ = stream.write_all(head.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    }
                    Answer::Truncated(headers) => {
                        let mut head = String::from(
                            "HTTP/1.1 201 Created\r\ncontent-length: 100\r\nconnection: close\r\n",
                        );
                        for (name, value) in headers {
                            head.push_str(&format!("{name}: {value}\r\n"));
                        }
                        head.push_str("\r\n{\"run\":1, ");
                        let _ = stream.write_all(head.as_bytes()).await;
                        let _ = stream.flush().await;
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        drop(stream);
                    }
                    Answer::RawHead(status, headers) => {
                        let mut head = format!(
                            "HTTP/1.1 {status} Scripted\r\ncontent-length: 2\r\nconnection: close\r\n"
                        )
                        .into_bytes();
                        head.extend_from_slice(&headers);
                        head.extend_from_slice(b"\r\n{}");
                        let _ = stream.write_all(&head).await;
                        let _ = stream.shutdown().await;
                    }
                }
            }
        });
        Self { addr, received }
    }

    pub fn url(&self) -> String {
        format!("http://{}/charges", self.addr)
    }

    /// Every request read, in order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// The key of each request read, in order.
    pub fn keys(&self) -> Vec<String> {
        self.received()
            .into_iter()
            .map(|request| request.key.unwrap_or_default())
            .collect()
    }
}

/// Reads one HTTP/1.1 request, head and `Content-Length` body; `None` if
/// the connection ends first.
pub async fn read_request(stream: &mut TcpStream) -> Option<Received> {
    let (head, mut body) = read_head(stream).await?;
    let text = String::from_utf8_lossy(&head).into_owned();
    let header = |name: &str| {
        text.lines().skip(1).find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field
                .trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    while body.len() < length {
        let mut buffer = [0u8; 4096];
        let n = stream.read(&mut buffer).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&buffer[..n]);
    }
    let method = text.split(' ').next().unwrap_or_default().to_owned();
    let path = text.split(' ').nth(1).unwrap_or_default().to_owned();
    let raw_key = head.split(|byte| *byte == b'\n').skip(1).find_map(|line| {
        let colon = line.iter().position(|byte| *byte == b':')?;
        line[..colon]
            .eq_ignore_ascii_case(b"idempotency-key")
            .then(|| line[colon + 1..].trim_ascii().to_vec())
    });
    Some(Received {
        method,
        path,
        raw_key,
        key: header("idempotency-key"),
        body,
        at: Instant::now(),
    })
}

/// The request's head (through its blank line) and what was read past it.
pub async fn read_head(stream: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut read = Vec::new();
    loop {
        if let Some(end) = read.windows(4).position(|window| window == b"\r\n\r\n") {
            let rest = read.split_off(end + 4);
            return Some((read, rest));
        }
        let mut buffer = [0u8; 4096];
        let n = stream.read(&mut buffer).await.ok()?;
        if n == 0 {
            return None;
        }
        read.extend_from_slice(&buffer[..n]);
    }
}
