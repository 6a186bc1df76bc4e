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
use std::time::Duration;

/// Fail fast: an unreachable store is a 503 now, not after a long backoff
/// that eats the invocation's time.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the records live: how to connect, not yet connected.
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
                    .set_connection_timeout(CONNECT_TIMEOUT)
                    .set_response_timeout(RESPONSE_TIMEOUT)
                    .set_number_of_retries(1)
                    .set_factor(10)
                    .set_max_delay(100);
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
                // A PING to every primary answers with their addresses.
                let primaries = connection
                    .route_command(
                        &redis::cmd("PING"),
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await
                    .map_err(|e| errors::from_redis("PING", e))?;
                let Value::Map(primaries) = primaries else {
                    return Err(StoreError::new(
                        crate::StoreErrorKind::Other,
                        "Redis Cluster: the primaries answered in an unexpected shape",
                    ));
                };
                let mut keys = Vec::new();
                for (address, _) in primaries {
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
                                format!(
                                    "Redis Cluster: a primary's address {address:?} has no port"
                                ),
                            )
                        })?;
                    keys.extend(scan_node(connection, pattern, Some(route)).await?);
                }
                Ok(keys)
            }
        }
    }
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
            redis::from_redis_value(&answer).map_err(|e| errors::from_redis("SCAN", e))?;
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
                self.route_command(command, RoutingInfo::SingleNode(route))
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
