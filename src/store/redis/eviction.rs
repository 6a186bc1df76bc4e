//! Whether the server may evict records, checked on every new connection.
//!
//! Every record carries a TTL, so under `volatile-*` (ElastiCache's default
//! parameter group is `volatile-lru`) as under `allkeys-*`, a server at its
//! `maxmemory` deletes records it acknowledged, and their keys run again.
//! The store refuses such a server unless told to accept it
//! ([`RedisStore::allow_eviction`](super::RedisStore::allow_eviction)).
//! `INFO` is read rather than `CONFIG GET`: ElastiCache and MemoryDB
//! refuse `CONFIG`, not `INFO`.

use super::{
    connection::{Connection, Leased},
    errors,
};
use crate::{StoreError, StoreErrorKind};
use redis::{
    aio::ConnectionLike,
    cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo},
    Value,
};
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        PoisonError,
    },
    time::{Duration, Instant},
};

/// What one server (a cluster's primary) says about eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeReport {
    /// The node, `host:port` (`None` for the one server of a
    /// non-cluster store, which is the store's URL).
    pub node: Option<String>,
    /// `maxmemory_policy` from `INFO memory`; `None` when the server does
    /// not say (some serverless offerings).
    pub maxmemory_policy: Option<String>,
    /// `maxmemory` in bytes; `0` is no limit, so nothing is ever evicted.
    pub maxmemory: Option<u64>,
    /// `evicted_keys` from `INFO stats`: the keys this node evicted since
    /// it started (or since `CONFIG RESETSTAT`).
    pub evicted_keys: Option<u64>,
}

impl NodeReport {
    /// Whether this node evicts keys under memory pressure: a limit, and a
    /// policy other than `noeviction`.
    pub fn evicts(&self) -> bool {
        self.maxmemory != Some(0)
            && self
                .maxmemory_policy
                .as_deref()
                .is_some_and(|policy| policy != "noeviction")
    }

    fn name(&self) -> &str {
        self.node.as_deref().unwrap_or("the server")
    }
}

/// The server's (every reachable primary's) eviction settings and count:
/// see [`RedisStore::server_report`](super::RedisStore::server_report).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerReport {
    /// One entry per server: one, or each primary of a cluster.
    pub nodes: Vec<NodeReport>,
}

impl ServerReport {
    /// Keys evicted, summed over the nodes that report it.
    pub fn evicted_keys(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|node| node.evicted_keys)
            .fold(0, u64::saturating_add)
    }

    /// Whether any node evicts keys under memory pressure.
    pub fn evicts(&self) -> bool {
        self.nodes.iter().any(NodeReport::evicts)
    }
}

/// How long a passed check holds: `maxmemory-policy` is a dynamic setting
/// (an ElastiCache parameter group change reaches a live cluster), so a
/// warm process reads it again this often.
pub(super) const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// The check, once per connection and again every [`RECHECK_EVERY`], and
/// what it has warned about.
pub(super) struct Guard {
    allow_eviction: bool,
    /// The connection generation that passed the check (0: none).
    checked: AtomicU64,
    /// When it passed.
    checked_at: std::sync::Mutex<Option<Instant>>,
    checking: tokio::sync::Mutex<()>,
    warned_evicting: AtomicBool,
    warned_unknown: AtomicBool,
    /// The eviction count last seen, to warn when it grows.
    evicted: std::sync::Mutex<Option<u64>>,
}

impl Guard {
    pub(super) fn new(allow_eviction: bool) -> Self {
        Self {
            allow_eviction,
            checked: AtomicU64::new(0),
            checked_at: std::sync::Mutex::new(None),
            checking: tokio::sync::Mutex::new(()),
            warned_evicting: AtomicBool::new(false),
            warned_unknown: AtomicBool::new(false),
            evicted: std::sync::Mutex::new(None),
        }
    }

    pub(super) fn allow_eviction(&self) -> bool {
        self.allow_eviction
    }

    /// Checks the connection's server(s) once; a server that evicts
    /// refuses every call until it is fixed (each call checks again, so a
    /// fixed policy takes effect without a restart).
    pub(super) async fn check(&self, leased: &Leased) -> Result<(), StoreError> {
        if self.holds(leased) {
            return Ok(());
        }
        let _checking = self.checking.lock().await;
        if self.holds(leased) {
            return Ok(());
        }
        let report = match report(&mut leased.connection.clone()).await {
            Ok(report) => report,
            Err(error) if error.kind().is_outage() => return Err(error),
            Err(error) => {
                // An ACL without INFO: the store works, unchecked.
                if !self.warned_unknown.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %error,
                        "cannot read the Redis server's maxmemory-policy (INFO refused): \
                         if it evicts keys (volatile-*, allkeys-*), a completed idempotency \
                         key whose record is evicted runs again; use noeviction");
                }
                self.passed(leased);
                return Ok(());
            }
        };
        self.judge(&report)?;
        self.seen(&report);
        self.passed(leased);
        Ok(())
    }

    /// Whether this connection passed the check less than
    /// [`RECHECK_EVERY`] ago.
    fn holds(&self, leased: &Leased) -> bool {
        self.checked.load(Ordering::Acquire) == leased.generation
            && self
                .checked_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|at| at.elapsed() < RECHECK_EVERY)
    }

    fn passed(&self, leased: &Leased) {
        *self
            .checked_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.checked.store(leased.generation, Ordering::Release);
    }

    /// Judges a report read for an operator: a server found evicting makes
    /// the next call check again (and refuse it).
    pub(super) fn review(&self, report: &ServerReport) {
        if self.judge(report).is_err() {
            self.recheck();
        }
        self.seen(report);
    }

    /// The connection's server may have changed (a reconnection, perhaps to
    /// a promoted replica behind the same name): check it again.
    pub(super) fn recheck(&self) {
        self.checked.store(0, Ordering::Release);
    }

    fn judge(&self, report: &ServerReport) -> Result<(), StoreError> {
        for node in &report.nodes {
            match node.maxmemory_policy.as_deref() {
                None => {
                    if !self.warned_unknown.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            node = node.name(),
                            "the Redis server does not report its maxmemory_policy: if it \
                             evicts keys, a completed idempotency key whose record is evicted \
                             runs again"
                        );
                    }
                }
                Some(policy) if node.evicts() => {
                    if !self.allow_eviction {
                        return Err(StoreError::new(
                            StoreErrorKind::Misconfigured,
                            format!(
                                "Redis at {} evicts keys under memory pressure \
                                 (maxmemory-policy {policy}): every idempotency record has a \
                                 TTL, so an evicted completed key would run again. Set \
                                 maxmemory-policy noeviction (ElastiCache: a custom parameter \
                                 group with maxmemory-policy noeviction), use a cache of its own \
                                 or MemoryDB, or accept evictions with \
                                 RedisStore::allow_eviction()",
                                node.name()
                            ),
                        ));
                    }
                    if !self.warned_evicting.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            node = node.name(),
                            maxmemory_policy = policy,
                            "EVICTION ALLOWED: this Redis server evicts keys under memory \
                             pressure, and RedisStore::allow_eviction() accepts it: a completed \
                             idempotency key whose record is evicted RUNS AGAIN. Watch \
                             evicted_keys (RedisStore::server_report)"
                        );
                    }
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Takes note of the eviction count, and warns when it grew.
    pub(super) fn seen(&self, report: &ServerReport) {
        let now = report.evicted_keys();
        let mut last = self.evicted.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(before) = *last {
            if now > before {
                tracing::warn!(
                    evicted_keys = now,
                    since_last_report = now - before,
                    "the Redis server evicted keys: idempotency records among them run again"
                );
            }
        }
        *last = Some(now);
    }
}

/// Reads `INFO` from the server, or from every primary of a cluster.
/// Plain `INFO` (its default sections hold memory and stats) works on
/// every version, where `INFO memory stats` needs Redis 7.
pub(super) async fn report(connection: &mut Connection) -> Result<ServerReport, StoreError> {
    let info = redis::cmd("INFO");
    let nodes = match connection {
        Connection::Server(server) => {
            let value = server
                .req_packed_command(&info)
                .await
                .map_err(|e| errors::from_redis("INFO", e))?;
            vec![node_report(None, &value)]
        }
        Connection::Cluster(cluster) => {
            let value = cluster
                .route_command(
                    info,
                    RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                )
                .await
                .map_err(|e| errors::from_redis("INFO", e))?;
            let Value::Map(primaries) = value else {
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    "Redis Cluster: INFO answered in an unexpected shape",
                ));
            };
            primaries
                .iter()
                .map(|(node, value)| node_report(text(node), value))
                .collect()
        }
    };
    Ok(ServerReport { nodes })
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn node_report(node: Option<String>, info: &Value) -> NodeReport {
    let info = text(info).unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .filter_map(|line| line.trim_end().split_once(':'))
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_owned())
    };
    NodeReport {
        node,
        maxmemory_policy: field("maxmemory_policy"),
        maxmemory: field("maxmemory").and_then(|n| n.parse().ok()),
        evicted_keys: field("evicted_keys").and_then(|n| n.parse().ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn info_fields_are_read() {
        let node = node_report(
            None,
            &info(
                "# Memory\r\nused_memory:1000\r\nmaxmemory:4194304\r\n\
                 maxmemory_policy:volatile-lru\r\n# Stats\r\nevicted_keys:12\r\n",
            ),
        );
        assert_eq!(node.maxmemory_policy.as_deref(), Some("volatile-lru"));
        assert_eq!(node.maxmemory, Some(4_194_304));
        assert_eq!(node.evicted_keys, Some(12));
        assert!(node.evicts());
    }

    #[test]
    fn only_a_limit_with_an_evicting_policy_evicts() {
        let node = |policy: Option<&str>, maxmemory: Option<u64>| NodeReport {
            node: None,
            maxmemory_policy: policy.map(str::to_owned),
            maxmemory,
            evicted_keys: None,
        };
        assert!(!node(Some("noeviction"), Some(1 << 20)).evicts());
        assert!(!node(Some("allkeys-lru"), Some(0)).evicts(), "no limit");
        assert!(node(Some("allkeys-lru"), Some(1 << 20)).evicts());
        assert!(node(Some("volatile-ttl"), None).evicts(), "limit unknown");
        assert!(!node(None, Some(1 << 20)).evicts(), "policy unknown");
    }

    #[test]
    fn a_refusal_names_the_policy_and_the_fix() {
        let guard = Guard::new(false);
        let report = ServerReport {
            nodes: vec![NodeReport {
                node: Some("10.0.0.1:6379".into()),
                maxmemory_policy: Some("volatile-lru".into()),
                maxmemory: Some(1 << 20),
                evicted_keys: Some(0),
            }],
        };
        let error = guard.judge(&report).expect_err("refused");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
        let message = error.to_string();
        for needle in [
            "volatile-lru",
            "10.0.0.1:6379",
            "maxmemory-policy noeviction",
            "parameter group",
            "MemoryDB",
            "allow_eviction",
        ] {
            assert!(message.contains(needle), "{needle}: {message}");
        }
        assert!(Guard::new(true).judge(&report).is_ok());
    }
}
