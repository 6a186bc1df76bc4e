//! One server or a Redis Cluster, behind one connection type.
//!
//! A record is one key, so every script touches one slot, and the cluster
//! client routes it (following `MOVED` and `ASK` while slots migrate) like
//! any single-key command. Only the operator's key scan has to know about
//! the cluster's nodes.

use super::errors;
use crate::StoreError;
use redis::{
    aio::{ConnectionLike, ConnectionManager},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
    cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo},
    Cmd, Pipeline, RedisFuture, Value,
};
use std::{
    sync::{PoisonError, RwLock},
    time::Duration,
};

/// Fail fast: an unreachable store is a 503 now, not after a long backoff
/// that eats the invocation's time.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The store's connection: made on first use, so that a server down at
/// start-up is a store error at request time (fail closed), not a failed
/// init; and made again when a cluster connection stops answering.
///
/// The second is a workaround: under concurrent requests during a
/// resharding, redis-rs's cluster connection (0.32 and 1.8 alike) can stop
/// answering for good while a new connection to the same cluster works at
/// once. A single server's connection manager reconnects by itself.
pub(super) struct SharedConnection {
    endpoint: Endpoint,
    current: RwLock<Option<Leased>>,
    connecting: tokio::sync::Mutex<u64>,
}

/// A connection, with the generation that tells it from its replacements.
#[derive(Clone)]
pub(super) struct Leased {
    pub(super) connection: Connection,
    pub(super) generation: u64,
}

impl SharedConnection {
    pub(super) fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            current: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(0),
        }
    }

    pub(super) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The current connection, connecting first where there is none (the
    /// store checks its server's eviction policy).
    pub(super) async fn connection(&self) -> Result<Leased, StoreError> {
        if let Some(leased) = self.peek() {
            return Ok(leased);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(leased) = self.peek() {
            return Ok(leased);
        }
        let connection = self.endpoint.connect().await?;
        *generation += 1;
        let leased = Leased {
            connection,
            generation: *generation,
        };
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(leased.clone());
        Ok(leased)
    }

    /// Takes note of a failed command: a cluster connection that timed out
    /// is dropped, and the next command connects again.
    pub(super) fn failed(&self, leased: &Leased, error: &redis::RedisError) {
        if !matches!(leased.connection, Connection::Cluster(_)) || !error.is_timeout() {
            return;
        }
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current
            .as_ref()
            .is_some_and(|c| c.generation == leased.generation)
        {
            tracing::warn!("the Redis Cluster connection timed out: connecting again");
            *current = None;
        }
    }

    fn peek(&self) -> Option<Leased> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Where the records live: how to connect, not yet connected.
// One per store, built once: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(super) enum Endpoint {
    Server(redis::Client),
    Cluster(ClusterClient),
}

/// A connection to a server or to a cluster. Cheap to clone; both kinds
/// reconnect by themselves.
#[derive(Clone)]
pub(super) enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Endpoint {
    pub(super) async fn connect(&self) -> Result<Connection, StoreError> {
        match self {
            Self::Server(client) => {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(100));
                ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map(Connection::Server)
                    .map_err(|e| errors::from_redis("connect", e))
            }
            Self::Cluster(client) => client
                .get_async_connection()
                .await
                .map(Connection::Cluster)
                .map_err(|e| errors::from_redis("connect to the cluster", e)),
        }
    }
}

/// A cluster client with the store's timeouts. Retries cover the
/// redirections and reconnections of a resharding or a failover; each
/// waits at most a few hundred milliseconds.
pub(super) fn cluster_builder(
    nodes: Vec<redis::ConnectionInfo>,
) -> redis::cluster::ClusterClientBuilder {
    redis::cluster::ClusterClientBuilder::new(nodes)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .retries(8)
        .min_retry_wait(10)
        .max_retry_wait(400)
}

impl Connection {
    /// Every key that matches `pattern`, on every primary of a cluster.
    pub(super) async fn scan(&mut self, pattern: &str) -> Result<Vec<String>, StoreError> {
        match self {
            Self::Server(connection) => scan_node(connection, pattern, None).await,
            Self::Cluster(connection) => {
                let mut keys = Vec::new();
                for (_, route) in primaries(connection).await? {
                    keys.extend(scan_node(connection, pattern, Some(route)).await?);
                }
                Ok(keys)
            }
        }
    }
}

/// One `SCAN` call of a walk ([`Connection::scan_once`]).
pub(super) struct ScanStep {
    /// The keys it returned.
    pub(super) keys: Vec<String>,
    /// Where the walk goes on: the node and its `SCAN` cursor; `None`
    /// once every node was walked.
    pub(super) next: Option<(Option<String>, u64)>,
}

impl Connection {
    /// One `SCAN` of up to about `count` keys matching `pattern`, from
    /// `cursor` on `node`: the one server (`node` is `None`), or a primary
    /// of a cluster by address (primaries walked in address order; `None`
    /// for the first, and a primary gone since the last call is passed
    /// over to the next address after it, from its start).
    pub(super) async fn scan_once(
        &mut self,
        pattern: &str,
        node: Option<&str>,
        cursor: u64,
        count: usize,
    ) -> Result<ScanStep, StoreError> {
        let mut command = redis::cmd("SCAN");
        command
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let scanned = |answer: Value| -> Result<(u64, Vec<String>), StoreError> {
            redis::from_redis_value(answer).map_err(|e| errors::from_redis("SCAN", e.into()))
        };
        match self {
            Self::Server(connection) => {
                let answer = connection
                    .req_packed_command(&command)
                    .await
                    .map_err(|e| errors::from_redis("SCAN", e))?;
                let (next, keys) = scanned(answer)?;
                Ok(ScanStep {
                    keys,
                    next: (next != 0).then_some((None, next)),
                })
            }
            Self::Cluster(connection) => {
                let mut primaries = primaries(connection).await?;
                primaries.sort_by(|a, b| a.0.cmp(&b.0));
                let at = match node {
                    None => 0,
                    Some(node) => primaries.partition_point(|(address, _)| address.as_str() < node),
                };
                let Some((address, route)) = primaries.get(at).cloned() else {
                    return Ok(ScanStep {
                        keys: Vec::new(),
                        next: None,
                    });
                };
                let cursor = if node == Some(address.as_str()) {
                    cursor
                } else {
                    0
                };
                command = redis::cmd("SCAN");
                command
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(count);
                let answer = connection
                    .send(&command, Some(route))
                    .await
                    .map_err(|e| errors::from_redis("SCAN", e))?;
                let (next, keys) = scanned(answer)?;
                let next = if next != 0 {
                    Some((Some(address), next))
                } else {
                    primaries
                        .get(at + 1)
                        .map(|(address, _)| (Some(address.clone()), 0))
                };
                Ok(ScanStep { keys, next })
            }
        }
    }
}

/// Every primary of the cluster, by address and route: a PING to every
/// primary answers with their addresses.
async fn primaries(
    connection: &mut ClusterConnection,
) -> Result<Vec<(String, SingleNodeRoutingInfo)>, StoreError> {
    let answer = connection
        .route_command(
            redis::cmd("PING"),
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await
        .map_err(|e| errors::from_redis("PING", e))?;
    let Value::Map(answer) = answer else {
        return Err(StoreError::new(
            crate::StoreErrorKind::Other,
            "Redis Cluster: the primaries answered in an unexpected shape",
        ));
    };
    let mut primaries = Vec::new();
    for (address, _) in answer {
        let Value::BulkString(address) = address else {
            continue;
        };
        let address = String::from_utf8_lossy(&address).into_owned();
        let route = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
            .map(|(host, port)| SingleNodeRoutingInfo::ByAddress { host, port })
            .ok_or_else(|| {
                StoreError::new(
                    crate::StoreErrorKind::Other,
                    format!("Redis Cluster: a primary's address {address:?} has no port"),
                )
            })?;
        primaries.push((address, route));
    }
    Ok(primaries)
}

impl Connection {
    /// The keys of the connection's database (`DBSIZE`), summed over
    /// every primary of a cluster.
    pub(super) async fn dbsize(&mut self) -> redis::RedisResult<u64> {
        match self {
            Self::Server(connection) => redis::cmd("DBSIZE").query_async(connection).await,
            Self::Cluster(connection) => {
                let answer = connection
                    .route_command(
                        redis::cmd("DBSIZE"),
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await?;
                sum_of_counts(answer)
            }
        }
    }
}

/// The sum of the counts every primary answered (a map of node to count),
/// or the one count a single node answered.
fn sum_of_counts(answer: Value) -> redis::RedisResult<u64> {
    let counts = match answer {
        Value::Map(primaries) => primaries.into_iter().map(|(_, keys)| keys).collect(),
        one => vec![one],
    };
    counts
        .into_iter()
        .map(|keys| redis::from_redis_value::<u64>(keys).map_err(Into::into))
        .sum()
}

/// `SCAN` one node through to the end of its cursor.
async fn scan_node<C: ConnectionLike + ClusterRoute>(
    connection: &mut C,
    pattern: &str,
    route: Option<SingleNodeRoutingInfo>,
) -> Result<Vec<String>, StoreError> {
    let mut cursor = 0u64;
    let mut keys = Vec::new();
    loop {
        let mut command = redis::cmd("SCAN");
        command
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500);
        let answer = connection
            .send(&command, route.clone())
            .await
            .map_err(|e| errors::from_redis("SCAN", e))?;
        let (next, page): (u64, Vec<String>) =
            redis::from_redis_value(answer).map_err(|e| errors::from_redis("SCAN", e.into()))?;
        keys.extend(page);
        cursor = next;
        if cursor == 0 {
            return Ok(keys);
        }
    }
}

/// Sends a command to one node of a cluster, or to the one server.
trait ClusterRoute {
    fn send<'a>(
        &'a mut self,
        command: &'a Cmd,
        route: Option<SingleNodeRoutingInfo>,
    ) -> RedisFuture<'a, Value>;
}

impl ClusterRoute for ConnectionManager {
    fn send<'a>(
        &'a mut self,
        command: &'a Cmd,
        _route: Option<SingleNodeRoutingInfo>,
    ) -> RedisFuture<'a, Value> {
        self.req_packed_command(command)
    }
}

impl ClusterRoute for ClusterConnection {
    fn send<'a>(
        &'a mut self,
        command: &'a Cmd,
        route: Option<SingleNodeRoutingInfo>,
    ) -> RedisFuture<'a, Value> {
        match route {
            Some(route) => Box::pin(async move {
                self.route_command(command.clone(), RoutingInfo::SingleNode(route))
                    .await
            }),
            None => self.req_packed_command(command),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(connection) => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster's `DBSIZE`, routed to every primary, answers a map of
    /// node to count: the table size is their sum.
    #[test]
    fn every_primarys_count_is_summed() {
        let node = |name: &str| Value::BulkString(name.as_bytes().to_vec());
        let answer = Value::Map(vec![
            (node("10.0.0.1:6379"), Value::Int(3)),
            (node("10.0.0.2:6379"), Value::Int(4)),
            (node("10.0.0.3:6379"), Value::Int(5)),
        ]);
        assert_eq!(sum_of_counts(answer).unwrap(), 12);
        assert_eq!(sum_of_counts(Value::Int(7)).unwrap(), 7);
        assert!(sum_of_counts(Value::Map(vec![(node("a"), Value::Nil)])).is_err());
    }
}
