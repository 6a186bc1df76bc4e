//! The Redis/Valkey store: each step of the protocol one Lua script,
//! atomic on the server (feature `redis`).
//!
//! A record is one hash, under its record id as the key (one key: one
//! slot). Claim, takeover, extension, completion, release and removal are
//! each one script, loaded once and called by its SHA (`EVALSHA`, with
//! `EVAL` when the server lost it), with the same conditions as the
//! DynamoDB store; a refused write returns the record found in the same
//! round trip. Expiry is Redis's own: every write sets `PEXPIREAT` to the
//! end of the record's `expiration_s`, and every condition compares
//! `expiration_s` itself too.
//!
//! Unlike Powertools' Redis layer, completion and release are fenced on the
//! claim's owner token, so a zombie cannot touch its successor's record.
//!
//! Redis has no transaction that could hold the handler's own writes with
//! the completion: the store's [`Write`](crate::store::Store::Write) type
//! has no values, and single write
//! ([`Engine::run_single_write`](crate::Engine::run_single_write)) does not
//! compile with it.

mod errors;

use super::{
    Claim, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal, Status, Store,
};
use crate::{Fingerprint, StoreError, StoreErrorKind};
use redis::{aio::ConnectionManager, Script, Value};
use std::{collections::HashMap, fmt, sync::Arc, time::Duration};
use tokio::sync::OnceCell;

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
    client: redis::Client,
    /// Connected on first use, so that a server down at start-up is a
    /// store error at request time (fail closed), not a failed init.
    connection: OnceCell<ConnectionManager>,
    namespace: String,
    scripts: Scripts,
}

struct Scripts {
    claim: Script,
    take_over: Script,
    extend: Script,
    complete: Script,
    release: Script,
    remove: Script,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on the server at `url` (`redis://host:port/db`). It
    /// connects on first use, and reconnects by itself; build it once, in
    /// `main`.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|error| {
            StoreError::new(StoreErrorKind::Misconfigured, "invalid Redis URL").with_source(error)
        })?;
        Ok(Self::with(client, String::new()))
    }

    /// A store on the TLS server at `url` (`rediss://host:port`) whose
    /// certificate is signed by `root_certificate` (PEM) rather than a
    /// public authority (a private CA, a test server). ElastiCache and
    /// MemoryDB need only [`open`](RedisStore::open): their certificates
    /// chain to public roots, which the store trusts.
    pub fn open_with_root_certificate(
        url: &str,
        root_certificate: &[u8],
    ) -> Result<Self, StoreError> {
        let client = redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_certificate.to_vec()),
            },
        )
        .map_err(|error| {
            StoreError::new(
                StoreErrorKind::Misconfigured,
                "invalid Redis URL or root certificate",
            )
            .with_source(error)
        })?;
        Ok(Self::with(client, String::new()))
    }

    /// Puts every record under `namespace` (prepended to its key), so that
    /// several applications, or tests, can share one server without ever
    /// meeting each other's records.
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        Self::with(self.inner.client.clone(), namespace.into())
    }

    fn with(client: redis::Client, namespace: String) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                connection: OnceCell::new(),
                namespace,
                scripts: Scripts {
                    claim: Script::new(include_str!("scripts/claim.lua")),
                    take_over: Script::new(include_str!("scripts/take_over.lua")),
                    extend: Script::new(include_str!("scripts/extend.lua")),
                    complete: Script::new(include_str!("scripts/complete.lua")),
                    release: Script::new(include_str!("scripts/release.lua")),
                    remove: Script::new(include_str!("scripts/remove.lua")),
                },
            }),
        }
    }

    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let client = self.inner.client.clone();
        self.inner
            .connection
            .get_or_try_init(|| async move {
                // Fail fast: an unreachable store is a 503 now, not after a
                // long backoff that eats the invocation's time.
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Duration::from_secs(2))
                    .set_response_timeout(Duration::from_secs(2))
                    .set_number_of_retries(1)
                    .set_factor(10)
                    .set_max_delay(100);
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(|e| errors::from_redis("connect", e))
            })
            .await
            .cloned()
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
        let mut connection = self.connection().await?;
        let value: Value = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|e| errors::from_redis(operation, e))?;
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

impl RedisStore {
    fn key(&self, id: &RecordId) -> String {
        format!("{}{}", self.inner.namespace, id.as_str())
    }
}

fn unexpected(operation: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        format!("Redis {operation}: the script answered in an unexpected shape"),
    )
}

fn text(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

impl Store for RedisStore {
    type Write = NoWrites;

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.scripts.claim,
            &claim.id,
            &[
                &text(claim.now_ms / 1000),
                claim.id.as_str().as_bytes(),
                claim.owner.as_str().as_bytes(),
                claim.fingerprint.as_str().as_bytes(),
                &text(claim.expiration_s),
                &text(claim.lease_until_ms),
                &text(claim.now_ms),
                &text(u64::from(claim.attempt)),
                &text(claim.first_started_ms),
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
                &text(claim.now_ms),
                claim.owner.as_str().as_bytes(),
                claim.fingerprint.as_str().as_bytes(),
                &text(claim.expiration_s),
                &text(claim.lease_until_ms),
                &text(u64::from(claim.attempt)),
                &text(claim.first_started_ms),
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
                &text(extension.lease_until_ms),
                &text(extension.expiration_s),
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
                &text(completion.expiration_s),
                &text(completion.now_ms),
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
        let mut connection = self.connection().await?;
        let pattern = format!(
            "{}{}*",
            glob_escape(&self.inner.namespace),
            glob_escape(prefix)
        );
        let mut cursor = 0u64;
        let mut records = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut connection)
                .await
                .map_err(|e| errors::from_redis("SCAN", e))?;
            for key in keys {
                let fields: Vec<Value> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(&mut connection)
                    .await
                    .map_err(|e| errors::from_redis("HGETALL", e))?;
                if let Some(record) = decode(&fields)? {
                    if record.status == Status::InProgress {
                        records.push(record);
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        records.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        records.truncate(limit);
        Ok(records)
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let mut connection = self.connection().await?;
        let fields: Vec<Value> = redis::cmd("HGETALL")
            .arg(self.key(id))
            .query_async(&mut connection)
            .await
            .map_err(|e| errors::from_redis("HGETALL", e))?;
        Ok(decode(&fields)?.filter(|record| !record.is_expired(now_ms)))
    }
}

/// `prefix` with the glob characters of `SCAN MATCH` escaped.
fn glob_escape(prefix: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Decodes `HGETALL` fields; no fields is no record. Never panics on what
/// the server holds.
fn decode(fields: &[Value]) -> Result<Option<Record>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let mut map: HashMap<String, Vec<u8>> = HashMap::with_capacity(fields.len() / 2);
    for pair in fields.chunks(2) {
        match pair {
            [Value::BulkString(name), Value::BulkString(value)] => {
                map.insert(String::from_utf8_lossy(name).into_owned(), value.clone());
            }
            _ => {
                return Err(StoreError::corrupt(
                    "a record hash holds a field that is not a string",
                ))
            }
        }
    }
    let string = |name: &str| -> Result<String, StoreError> {
        let bytes = map
            .get(name)
            .ok_or_else(|| StoreError::corrupt(format!("field `{name}` is missing")))?;
        String::from_utf8(bytes.clone())
            .map_err(|_| StoreError::corrupt(format!("field `{name}` is not UTF-8")))
    };
    let number = |name: &str| -> Result<Option<u64>, StoreError> {
        map.get(name)
            .map(|bytes| {
                std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|text| text.parse::<u64>().ok())
                    .ok_or_else(|| StoreError::corrupt(format!("field `{name}` is not a number")))
            })
            .transpose()
    };
    let id = string("id")?;
    let status = string("status")?;
    let status = status
        .parse::<Status>()
        .map_err(|_| StoreError::corrupt(format!("record {id}: unknown status {status:?}")))?;
    let record = Record {
        status,
        owner: OwnerToken::from_stored(string("owner")?),
        fingerprint: Fingerprint::from_stored(string("fingerprint")?),
        expiration_s: number("expiration_s")?
            .ok_or_else(|| StoreError::corrupt(format!("record {id}: no expiration")))?,
        lease_until_ms: number("lease_until_ms")?,
        response: map.get("response").cloned(),
        created_at_ms: number("created_at_ms")?,
        completed_at_ms: number("completed_at_ms")?,
        attempt: number("attempt")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
            .unwrap_or(1),
        first_started_ms: number("first_started_ms")?,
        id: RecordId::from_stored(id),
    };
    record.checked().map(Some)
}
