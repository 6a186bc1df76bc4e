//! A proxy in front of the server that hangs up on the client after the
//! whole request reached the server, on its first connections; later ones
//! pass through.

use super::raw::read_head;
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// When the connection is dropped.
#[derive(Debug, Clone, Copy)]
pub enum When {
    /// Once the request is forwarded whole: the server reads it, and its
    /// handler may still be running.
    RequestRead,
    /// When the server's answer begins: the server has answered, and the
    /// client never hears it.
    AnswerLost,
}

pub struct HangUpProxy {
    pub addr: SocketAddr,
    hung_up: Arc<AtomicUsize>,
}

impl HangUpProxy {
    /// Hangs up on the first `times` connections, at `when`.
    pub async fn start(upstream: SocketAddr, times: usize, when: When) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let hung_up = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&hung_up);
        tokio::spawn(async move {
            let mut connections = 0;
            while let Ok((client, _)) = listener.accept().await {
                connections += 1;
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                if connections <= times {
                    let count = Arc::clone(&count);
                    tokio::spawn(async move {
                        if hang_up(client, server, when).await {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                } else {
                    tokio::spawn(async move {
                        let (mut client, mut server) = (client, server);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                }
            }
        });
        Self { addr, hung_up }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many connections it hung up on after forwarding their request.
    pub fn hung_up(&self) -> usize {
        self.hung_up.load(Ordering::SeqCst)
    }
}

/// Forwards one request whole, then drops both connections at `when`.
async fn hang_up(mut client: TcpStream, mut server: TcpStream, when: When) -> bool {
    let Some((head, mut body)) = read_head(&mut client).await else {
        return false;
    };
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: usize = text
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    while body.len() < length {
        let mut buffer = [0u8; 4096];
        match client.read(&mut buffer).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => body.extend_from_slice(&buffer[..n]),
        }
    }
    if server.write_all(&head).await.is_err() || server.write_all(&body).await.is_err() {
        return false;
    }
    if let When::AnswerLost = when {
        let mut buffer = [0u8; 1];
        let _ = server.read(&mut buffer).await;
    }
    true
}
