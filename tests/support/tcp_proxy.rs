//! A TCP proxy that injects faults between a client and a server that
//! speaks any protocol (PostgreSQL, Redis): an outage (connections refused
//! and cut), answers lost after the request reached the server (the
//! connection reset after the write), and delays.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

#[derive(Debug, Default)]
struct Faults {
    down: bool,
    /// Answers to drop, each with its connection, after the request reached
    /// the server.
    lose_answers: usize,
    /// PostgreSQL only: the lost answer to a request that begins a
    /// transaction is the end of the transaction's (`COMMIT` or
    /// `ROLLBACK`); the answers before it reach the client.
    lose_at_transaction_end: bool,
    delay: Duration,
}

/// Whether a chunk of PostgreSQL's answers holds the `CommandComplete` of
/// a transaction's end.
fn ends_transaction(chunk: &[u8]) -> bool {
    [&b"COMMIT\0"[..], &b"ROLLBACK\0"[..]]
        .iter()
        .any(|tag| chunk.windows(tag.len()).any(|window| window == *tag))
}

/// The proxy. Dropping it stops it.
pub struct TcpFaultProxy {
    addr: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    /// Bumped to cut every open connection.
    generation: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl Drop for TcpFaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.generation.send_modify(|g| *g += 1);
    }
}

impl TcpFaultProxy {
    /// A proxy on a free port of 127.0.0.1 in front of `upstream`
    /// (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let faults = Arc::new(Mutex::new(Faults::default()));
        let (generation, _) = watch::channel(0u64);
        let accept = {
            let (faults, generation, upstream) =
                (Arc::clone(&faults), generation.clone(), upstream.to_owned());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if faults.lock().unwrap().down {
                        drop(client);
                        continue;
                    }
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    tokio::spawn(pump(
                        client,
                        server,
                        Arc::clone(&faults),
                        generation.subscribe(),
                    ));
                }
            })
        };
        Self {
            addr,
            faults,
            generation,
            accept,
        }
    }

    /// `host:port` of the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Refuses new connections and cuts the open ones.
    pub fn go_down(&self) {
        self.faults.lock().unwrap().down = true;
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        let mut faults = self.faults.lock().unwrap();
        faults.down = false;
        faults.lose_answers = 0;
        faults.delay = Duration::ZERO;
    }

    /// Drops the answer to each of the next `n` requests, after the request
    /// reached the server, and resets that connection.
    pub fn lose_answers(&self, n: usize) {
        self.faults.lock().unwrap().lose_answers = n;
    }

    /// Makes a lost answer the end of a transaction's (PostgreSQL): for a
    /// write sent as a pipelined transaction (`BEGIN`, …, `COMMIT`), whose
    /// first answer (`BEGIN`'s) comes before the server has acted. The
    /// server then acts, and only the answer that says so is lost.
    pub fn lose_answers_at_transaction_end(&self) {
        self.faults.lock().unwrap().lose_at_transaction_end = true;
    }

    /// Delays every request by `delay`.
    pub fn delay(&self, delay: Duration) {
        self.faults.lock().unwrap().delay = delay;
    }
}

/// Forwards both ways until either side closes, a fault cuts it, or the
/// proxy's generation changes.
async fn pump(
    mut client: TcpStream,
    mut server: TcpStream,
    faults: Arc<Mutex<Faults>>,
    mut generation: watch::Receiver<u64>,
) {
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    // Set when a request went up whose answer is to be lost.
    let mut losing = false;
    // Set when that request began a transaction, and its lost answer is
    // the transaction's end.
    let mut losing_at_end = false;
    loop {
        tokio::select! {
            biased;
            _ = generation.changed() => return,
            read = client_read.read(&mut up) => {
                let Ok(n) = read else { return };
                if n == 0 { return; }
                let (delay, lose) = {
                    let mut faults = faults.lock().unwrap();
                    // Down: nothing more reaches the server, even a
                    // request read in the instant before this connection
                    // saw the generation change (the select below may
                    // take either when both are ready).
                    if faults.down {
                        return;
                    }
                    let lose = faults.lose_answers > 0;
                    if lose {
                        faults.lose_answers -= 1;
                    }
                    (faults.delay, lose)
                };
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                    if faults.lock().unwrap().down {
                        return;
                    }
                }
                if server_write.write_all(&up[..n]).await.is_err() { return; }
                if lose && !losing {
                    losing_at_end = faults.lock().unwrap().lose_at_transaction_end
                        && up[..n].windows(5).any(|window| window == b"BEGIN");
                }
                losing |= lose;
            }
            read = server_read.read(&mut down) => {
                let Ok(n) = read else { return };
                if n == 0 { return; }
                if losing && (!losing_at_end || ends_transaction(&down[..n])) {
                    // The server acted; the client never hears of it.
                    return;
                }
                if client_write.write_all(&down[..n]).await.is_err() { return; }
            }
        }
    }
}
