//! The Redis/Valkey store: each step of the protocol one Lua script,
//! atomic on the server (feature `redis`).
//!
//! A record is one hash, under its record id as the key (one key: one
//! slot). Claim, takeover, extension, completion, release and removal are
//! each one script, loaded once and called by its SHA (`EVALSHA`, with
//! `EVAL` when the server lost it), with the same conditions as the
//! DynamoDB store; a refused write returns the record found in the same
//! round trip. Expiry is Redis's own: every write sets the record's TTL
//! (`PEXPIRE`) to the end of its `expiration_s` counted from the engine's
//! `now`, so that an offset between the function's clock and the server's
//! neither deletes a record at once nor keeps it too long; every condition
//! compares `expiration_s` itself too.
//!
//! Each script checks its arguments and the fields it reads before its
//! first write, and computes the TTL before it too: a script that refuses
//! has written nothing, and no record is ever left without a TTL. Lua
//! numbers are doubles, so a number above 2^53 − 1 (or an `expiration_s`
//! whose expiry in milliseconds is) is refused as
//! [`Rejected`](StoreErrorKind::Rejected) before the call.
//!
//! Unlike Powertools' Redis layer, completion and release are fenced on the
//! claim's owner token, so a zombie cannot touch its successor's record.
//!
//! A key of the namespace that holds anything but a record (a string, a
//! list, a hash without a record's fields, or whose `status`,
//! `expiration_s` or `lease_until_ms` is not what a record holds: another
//! application writing under the same names) is never claimed, overwritten,
//! deleted or replayed: every script and both reads fail on it with
//! [`StoreErrorKind::Misconfigured`], which says so, and fail-open does not
//! run the operation.
//!
#![doc = include_str!("docs.md")]

mod abandoned;
mod codec;
mod connection;
mod errors;
mod eviction;
#[cfg(feature = "powertools")]
mod powertools;
mod steps;

pub use eviction::{NodeReport, ServerReport};

use super::{
    Accuracy, Claim, Completion, Conditional, Extension, OwnerToken, Record, RecordId,
    RecordedStep, Removal, SizeSource, Status, StepWrite, Store, TableSize,
};
use crate::{StoreError, StoreErrorKind};
use codec::{decode, exact, expiration, glob_escape, unexpected};
use connection::{Connection, Endpoint, Leased, SharedConnection};
use redis::{IntoConnectionInfo, Script, Value};
use std::{fmt, sync::Arc};

/// Redis cannot commit writes of the handler's with a completion: this type
/// has no values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoWrites {}

/// Records in Redis or Valkey. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: SharedConnection,
    /// The check of the server's eviction policy, made on the connection
    /// before a call and again after a reconnection.
    eviction: eviction::Guard,
    namespace: String,
    /// The database holds the records and nothing else
    /// ([`RedisStore::owns_database`]): `DBSIZE` counts them.
    owns_database: bool,
    scripts: Scripts,
}

struct Scripts {
    claim: Script,
    take_over: Script,
    extend: Script,
    complete: Script,
    release: Script,
    remove: Script,
    step: Script,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

/// A script's text: the checks every script shares, then its own.
macro_rules! script {
    ($name:literal) => {
        concat!(
            include_str!("scripts/record.lua"),
            include_str!(concat!("scripts/", $name, ".lua"))
        )
    };
}

impl RedisStore {
    /// A store on the server at `url`: `redis://host:port/db`, or
    /// `rediss://…` for TLS. `redis+cluster://host:port` (`rediss+cluster://`
    /// with TLS) is a Redis Cluster reached through that node (ElastiCache's
    /// configuration endpoint, MemoryDB's cluster endpoint, an ElastiCache
    /// Serverless endpoint): the client learns the other nodes from it.
    ///
    /// It connects on first use, and reconnects by itself; build it once,
    /// in `main`. A malformed URL or an unknown scheme is a
    /// [`Misconfigured`](StoreErrorKind::Misconfigured) error here; a
    /// server that is down is an error at request time (a 503), never a
    /// run without a claim.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, None)
    }

    /// A store on the TLS server or cluster at `url` (`rediss://host:port`,
    /// `rediss+cluster://host:port`) whose certificate is signed by
    /// `root_certificate` (PEM) rather than a public authority (a private
    /// CA, a test server). ElastiCache and MemoryDB need only
    /// [`open`](RedisStore::open): their certificates chain to public
    /// roots, which the store trusts.
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn open_with_root_certificate(
        url: &str,
        root_certificate: &[u8],
    ) -> Result<Self, StoreError> {
        Self::open_with(url, Some(root_certificate))
    }

    /// A store on the Redis Cluster that `nodes` belong to (`redis://…` or
    /// `rediss://…` URLs; one is enough, more survive one being down at
    /// start-up). Every record is one key, so every step of the protocol
    /// is one script on one slot, routed by the cluster client, which
    /// follows the cluster through reshardings and failovers.
    pub fn open_cluster<'a>(nodes: impl IntoIterator<Item = &'a str>) -> Result<Self, StoreError> {
        let nodes = nodes
            .into_iter()
            .map(node_info)
            .collect::<Result<Vec<_>, _>>()?;
        cluster(nodes, None)
    }

    fn open_with(url: &str, root_certificate: Option<&[u8]>) -> Result<Self, StoreError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Misconfigured,
                "invalid Redis URL: it has no scheme (redis://, rediss://, redis+cluster://, rediss+cluster://)",
            )
        })?;
        tls_available(scheme)?;
        match scheme {
            "redis" | "rediss" => {
                let client = match root_certificate {
                    None => redis::Client::open(url),
                    #[cfg(feature = "redis-tls")]
                    Some(root) => redis::Client::build_with_tls(
                        url,
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(root.to_vec()),
                        },
                    ),
                    #[cfg(not(feature = "redis-tls"))]
                    Some(_) => unreachable!("a root certificate is only given with redis-tls"),
                }
                .map_err(|error| {
                    StoreError::new(
                        StoreErrorKind::Misconfigured,
                        "invalid Redis URL or root certificate",
                    )
                    .with_source(error)
                })?;
                Ok(Self::with(
                    Endpoint::Server(client),
                    String::new(),
                    false,
                    false,
                ))
            }
            "redis+cluster" | "rediss+cluster" => {
                let node = format!("{}://{rest}", scheme.trim_end_matches("+cluster"));
                cluster(vec![node_info(&node)?], root_certificate)
            }
            other => Err(StoreError::new(
                StoreErrorKind::Misconfigured,
                format!(
                    "invalid Redis URL: unknown scheme {other:?} (redis://, rediss://, \
                     redis+cluster://, rediss+cluster://)"
                ),
            )),
        }
    }

    /// Puts every record under `namespace` (prepended to its key), so that
    /// several applications, or tests, can share one server without ever
    /// meeting each other's records.
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        Self::with(
            self.inner.connection.endpoint().clone(),
            namespace.into(),
            self.inner.eviction.allow_eviction(),
            self.inner.owns_database,
        )
    }

    /// Accepts a server that evicts keys under memory pressure (a
    /// `maxmemory-policy` other than `noeviction`, with a `maxmemory`),
    /// which the store otherwise refuses: every call fails as
    /// [`Misconfigured`](StoreErrorKind::Misconfigured).
    ///
    /// Every record has a TTL, so `volatile-*` policies (ElastiCache's
    /// default parameter group is `volatile-lru`) evict records as readily
    /// as `allkeys-*`: **a completed key whose record is evicted runs
    /// again**, and an evicted claim lets a duplicate run concurrently.
    /// With this, the store logs a warning once, and
    /// [`server_report`](RedisStore::server_report) counts the evictions.
    #[must_use]
    pub fn allow_eviction(self) -> Self {
        Self::with(
            self.inner.connection.endpoint().clone(),
            self.inner.namespace.clone(),
            true,
            self.inner.owns_database,
        )
    }

    /// Declares that the store's database holds its records and nothing
    /// else (a database, or a cluster, of their own): then
    /// [`Store::table_size`] counts them with `DBSIZE` (exact, and O(1) on
    /// the server; summed over the primaries of a cluster), for the
    /// table-size gauge. Without it the store answers `None`: Redis keeps
    /// no count of the keys under a prefix, and counting them is a `SCAN`
    /// of every key, which is not cheap enough to scrape (what
    /// [`list_in_progress`](Store::list_in_progress) does, for operators).
    /// `DBSIZE` counts every key of the database, and keys whose TTL has
    /// passed until Redis reclaims them (within seconds, by its active
    /// expiry).
    #[must_use]
    pub fn owns_database(self) -> Self {
        Self::with(
            self.inner.connection.endpoint().clone(),
            self.inner.namespace.clone(),
            self.inner.eviction.allow_eviction(),
            true,
        )
    }

    /// The server's eviction settings (`maxmemory_policy`, `maxmemory`) and
    /// the keys it has evicted (`evicted_keys`), from `INFO`: one server,
    /// or every primary of a cluster. Logs a warning when the count grew
    /// since the last report (or since the connection's check). For an
    /// operator's scheduled check, or a metric of your own: each evicted
    /// record is a key that runs again. It answers for a server the store
    /// refuses too, so that an operator can see why.
    pub async fn server_report(&self) -> Result<ServerReport, StoreError> {
        let mut leased = self.inner.connection.connection().await?;
        let report = eviction::report(&mut leased.connection).await?;
        self.inner.eviction.review(&report);
        Ok(report)
    }

    fn with(
        endpoint: Endpoint,
        namespace: String,
        allow_eviction: bool,
        owns_database: bool,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                connection: SharedConnection::new(endpoint),
                eviction: eviction::Guard::new(allow_eviction),
                namespace,
                owns_database,
                scripts: Scripts {
                    claim: Script::new(script!("claim")),
                    take_over: Script::new(script!("take_over")),
                    extend: Script::new(script!("extend")),
                    complete: Script::new(script!("complete")),
                    release: Script::new(script!("release")),
                    remove: Script::new(script!("remove")),
                    step: Script::new(script!("step")),
                },
            }),
        }
    }

    /// The store's connection, its server's eviction policy checked.
    async fn leased(&self) -> Result<Leased, StoreError> {
        let leased = self.inner.connection.connection().await?;
        self.inner.eviction.check(&leased).await?;
        Ok(leased)
    }

    /// Takes note of a failed command.
    fn failed(&self, leased: &Leased, error: &redis::RedisError) {
        if error.is_io_error() || error.is_connection_dropped() || error.is_timeout() {
            // The connection manager reconnects by itself, perhaps to
            // another server behind the same name (a failover): check
            // that one's policy too.
            self.inner.eviction.recheck();
        }
        self.inner.connection.failed(leased, error);
    }

    /// Runs `command` (a script invocation, a command) on the store's
    /// connection.
    async fn query<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        command: impl AsyncFnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let mut leased = self.leased().await?;
        match command(&mut leased.connection).await {
            Ok(value) => Ok(value),
            Err(error) => {
                self.failed(&leased, &error);
                Err(errors::from_redis(operation, error))
            }
        }
    }

    async fn hgetall(&self, key: &str) -> Result<Vec<Value>, StoreError> {
        self.query("HGETALL", async |connection| {
            redis::cmd("HGETALL").arg(key).query_async(connection).await
        })
        .await
    }

    /// Runs a script and reads its answer: `{1, {}}` applied, `{0, fields}`
    /// refused with the record found (`{}` when there is none).
    async fn answer(
        &self,
        script: &Script,
        id: &RecordId,
        args: &[&[u8]],
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let mut invocation = script.key(self.key(id));
        for arg in args {
            invocation.arg(*arg);
        }
        let value: Value = self
            .query(operation, async |connection| {
                invocation.invoke_async(connection).await
            })
            .await?;
        let Value::Array(parts) = value else {
            return Err(unexpected(operation));
        };
        match parts.as_slice() {
            [Value::Int(1), _] => Ok(Conditional::Applied),
            [Value::Int(0), Value::Array(fields)] => Ok(Conditional::Refused(decode(fields)?)),
            _ => Err(unexpected(operation)),
        }
    }
}

/// A node's URL, checked.
fn node_info(url: &str) -> Result<redis::ConnectionInfo, StoreError> {
    if let Some((scheme, _)) = url.split_once("://") {
        tls_available(scheme)?;
    }
    url.into_connection_info().map_err(|error| {
        StoreError::new(
            StoreErrorKind::Misconfigured,
            "invalid Redis Cluster node URL",
        )
        .with_source(error)
    })
}

/// A `rediss` scheme needs the `redis-tls` feature: without it the redis
/// crate has no TLS, and the URL is refused here, by name, rather than by
/// the redis crate at the first request.
fn tls_available(scheme: &str) -> Result<(), StoreError> {
    tls_check(scheme, cfg!(feature = "redis-tls"))
}

fn tls_check(scheme: &str, built_with_tls: bool) -> Result<(), StoreError> {
    if built_with_tls || !scheme.starts_with("rediss") {
        return Ok(());
    }
    Err(StoreError::new(
        StoreErrorKind::Misconfigured,
        format!(
            "a {scheme}:// URL needs TLS, which the lambda-idempotency crate was built without: \
             enable its `redis-tls` feature (the `redis` feature alone connects over redis:// only)"
        ),
    ))
}

fn cluster(
    nodes: Vec<redis::ConnectionInfo>,
    root_certificate: Option<&[u8]>,
) -> Result<RedisStore, StoreError> {
    #[cfg_attr(not(feature = "redis-tls"), allow(unused_mut))]
    let mut builder = connection::cluster_builder(nodes);
    #[cfg(feature = "redis-tls")]
    if let Some(root) = root_certificate {
        builder = builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root.to_vec()),
        });
    }
    #[cfg(not(feature = "redis-tls"))]
    let _ = root_certificate;
    let client = builder.build().map_err(|error| {
        StoreError::new(
            StoreErrorKind::Misconfigured,
            "invalid Redis Cluster nodes or root certificate",
        )
        .with_source(error)
    })?;
    Ok(RedisStore::with(
        Endpoint::Cluster(client),
        String::new(),
        false,
        false,
    ))
}

impl RedisStore {
    fn key(&self, id: &RecordId) -> String {
        format!("{}{}", self.inner.namespace, id.as_str())
    }
}

impl Store for RedisStore {
    type Write = NoWrites;
    const DB_SYSTEM: &'static str = "redis";
    const STEPS: bool = true;

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.scripts.step,
            &step.id,
            &[
                step.owner.as_str().as_bytes(),
                &exact("index", u64::from(step.index))?,
                step.name.as_bytes(),
                &step.output,
            ],
            "step",
        )
        .await
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        let fields = self.hgetall(&self.key(id)).await?;
        match decode(&fields)? {
            Some(record) if !record.is_expired(now_ms) && record.status == Status::InProgress => {
                steps::decode_steps(id, &fields)
            }
            _ => Ok(Vec::new()),
        }
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.scripts.claim,
            &claim.id,
            &[
                &exact("now_ms", claim.now_ms / 1000)?,
                claim.id.as_str().as_bytes(),
                claim.owner.as_str().as_bytes(),
                claim.fingerprint.as_str().as_bytes(),
                &expiration(claim.expiration_s)?,
                &exact("lease_until_ms", claim.lease_until_ms)?,
                &exact("now_ms", claim.now_ms)?,
                &exact("attempt", u64::from(claim.attempt))?,
                &exact("first_started_ms", claim.first_started_ms)?,
            ],
            "claim",
        )
        .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.scripts.take_over,
            &claim.id,
            &[
                lapsed.as_str().as_bytes(),
                &exact("now_ms", claim.now_ms)?,
                claim.owner.as_str().as_bytes(),
                claim.fingerprint.as_str().as_bytes(),
                &expiration(claim.expiration_s)?,
                &exact("lease_until_ms", claim.lease_until_ms)?,
                &exact("attempt", u64::from(claim.attempt))?,
                &exact("first_started_ms", claim.first_started_ms)?,
            ],
            "take over",
        )
        .await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.scripts.extend,
            &extension.id,
            &[
                extension.owner.as_str().as_bytes(),
                &exact("lease_until_ms", extension.lease_until_ms)?,
                &expiration(extension.expiration_s)?,
                &exact("now_ms", extension.now_ms)?,
            ],
            "extend",
        )
        .await
    }

    async fn complete(&self, completion: Completion<NoWrites>) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.scripts.complete,
            &completion.id,
            &[
                completion.owner.as_str().as_bytes(),
                &completion.response,
                &expiration(completion.expiration_s)?,
                &exact("now_ms", completion.now_ms)?,
            ],
            "complete",
        )
        .await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.scripts.release,
            id,
            &[owner.as_str().as_bytes()],
            "release",
        )
        .await
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let unless_in_progress: &[u8] = match removal {
            Removal::Any => b"0",
            Removal::UnlessInProgress => b"1",
        };
        self.answer(
            &self.inner.scripts.remove,
            id,
            &[unless_in_progress],
            "remove",
        )
        .await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut leased = self.leased().await?;
        let pattern = format!(
            "{}{}*",
            glob_escape(&self.inner.namespace),
            glob_escape(prefix)
        );
        let mut records = Vec::new();
        for key in leased.connection.scan(&pattern).await? {
            let fields = self.hgetall(&key).await?;
            if let Some(record) = decode(&fields)? {
                if record.status == Status::InProgress {
                    records.push(record);
                }
            }
        }
        records.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        records.truncate(limit);
        Ok(records)
    }

    /// One `SCAN` of about `query.limit` keys under the prefix, and an
    /// `HGETALL` of each (the `abandoned` module).
    async fn list_abandoned(
        &self,
        query: &super::AbandonedQuery,
    ) -> Result<super::AbandonedPage, StoreError> {
        self.abandoned_page(query).await
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let fields = self.hgetall(&self.key(id)).await?;
        Ok(decode(&fields)?.filter(|record| !record.is_expired(now_ms)))
    }

    /// `DBSIZE` where the store owns its database
    /// ([`owns_database`](RedisStore::owns_database)); `None` otherwise.
    async fn table_size(&self, _now_ms: u64) -> Result<Option<TableSize>, StoreError> {
        if !self.inner.owns_database {
            return Ok(None);
        }
        let keys = self
            .query("DBSIZE", async |connection| connection.dbsize().await)
            .await?;
        Ok(Some(TableSize::new(
            keys,
            Accuracy::Exact,
            SizeSource::DbSize,
        )))
    }
}

#[cfg(test)]
mod tls_tests {
    use super::*;

    /// Built without `redis-tls` (the crate's own tests enable it, so the
    /// check is called as such a build calls it).
    #[test]
    fn without_tls_a_rediss_url_is_refused_by_name() {
        for scheme in ["rediss", "rediss+cluster"] {
            let error = tls_check(scheme, false).expect_err(scheme);
            assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
            assert!(error.to_string().contains("`redis-tls` feature"), "{error}");
            assert!(tls_check(scheme, true).is_ok());
        }
        assert!(tls_check("redis", false).is_ok());
        assert!(tls_check("redis+cluster", false).is_ok());
    }
}
