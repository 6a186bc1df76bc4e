//! The PostgreSQL store: the protocol as conditional `INSERT … ON CONFLICT`,
//! `UPDATE` and `DELETE` statements (feature `postgres`).
//!
//! # Driver and pool
//!
//! [tokio-postgres] with a [deadpool-postgres] pool, built once in `main`
//! and shared by every invocation of the execution environment. A Lambda
//! execution environment handles one invocation at a time, so a pool of one
//! or two connections is enough; the pool reconnects a connection that died
//! while the environment was frozen.
//!
//! Every statement is sent **unprepared** with its parameter types
//! (`query_typed`): one round trip, and nothing that depends on a named
//! prepared statement surviving from one statement to the next, which RDS
//! Proxy and PgBouncer in transaction mode do not guarantee. Transactions
//! (a completion with the handler's writes, a single-write commit) are
//! `BEGIN`…`COMMIT` on one connection, which both poolers keep together.
//! For TLS (RDS, Aurora, RDS Proxy), [`PostgresStore::connect_tls`]
//! connects with rustls, trusting the certificate authorities you give it
//! (Amazon's RDS bundle) and checking the host name; [`tls_connector`]
//! builds the same connector for a pool of your own.
//!
//! # The table
//!
//! ```sql
//!
//! # Deploying
//!
//! **RDS Proxy**: the function in the VPC as above, the proxy's endpoint in
//!   `IDEMPOTENCY_STORE_URL`
//!   (`postgres://user:password@<proxy endpoint>:5432/db`), the RDS CA bundle
//!   in `IDEMPOTENCY_STORE_ROOT_CERTIFICATE`, and the proxy's `RequireTLS` on.
//!   With IAM authentication, the role needs `rds-db:connect` on
//!   `arn:aws:rds-db:<region>:<account>:dbuser:<proxy resource id>/<user>`.
//!   The table must exist before the first request, or the function's database
//!   user needs `CREATE` on the schema (`charges` creates it when missing).
#![doc = include_str!("table.sql")]
//! ```
//!
//! [`PostgresStore::create_table`] runs it (`IF NOT EXISTS`). Nothing in
//! PostgreSQL deletes expired rows by itself: every read and condition
//! compares `expiration_s`, so they are never served, and
//! [`PostgresStore::purge_expired`] deletes them in batches. Schedule it
//! (an EventBridge rule invoking a small function, `pg_cron`), or run
//! `lambda-idempotency --store postgres://… purge-expired` (the `lambda-idempotency-cli` package);
//! it is safe to run concurrently with itself and with traffic.
//!
//! # Errors
//!
//! What each failure means, decided in one place (`errors.rs`, by
//! SQLSTATE, exact code first, then class; see
//! [`StoreErrorKind`] for what the engine does with
//! each kind):
//!
//! | failure | kind |
//! |---|---|
//! | no connection (refused, reset, closed, pool timeout); class `08` (PgBouncer's included), `53` (disk, memory, connections; not `53400`), `58`; `25006` (a writer demoted by a failover), `57014` (statement timeout), `57P01`, `57P02`, `57P03`, `57P05` | `Unavailable` (an outage) |
//! | `40001` (serialization failure, at `SERIALIZABLE` or `REPEATABLE READ`), `40P01` (deadlock), `55P03` (lock timeout) | `Conflict` (claimed again) |
//! | class `42` (syntax, no table or column, no privilege), `28` (authentication), `3D`, `3F`, `0A`, `23` (a constraint of the table's own), `53400`, `57P04`; a certificate the connector does not trust, a server without the TLS `connect_tls` requires; at construction: a table name that is not a plain identifier or is a reserved word, a URL without host or user | `Misconfigured` |
//! | class `22` (a value out of range); a number beyond `bigint`, refused before the statement | `Rejected` |
//! | a row that does not decode as a record | `CorruptRecord` |
//! | the operation's own writes refused (classes `22`, `23`, `42` in a [`PgWrite`]) | `WriteRejected` |
//! | any other SQLSTATE | `Other` (fails closed) |
//!
//! Any isolation level works: at `SERIALIZABLE` or `REPEATABLE READ` (a
//! server, database or role default), concurrent duplicates abort each
//! other's claims with `40001`, and the engine claims again until it reads
//! the winner's record.
//!
//! # Writes with the completion
//!
//! [`PgWrite`]s, the handler's own statements, commit in one transaction
//! with the fenced completion: a fenced-out completion commits none of them.
//!
//! [tokio-postgres]: https://docs.rs/tokio-postgres
//! [deadpool-postgres]: https://docs.rs/deadpool-postgres

mod errors;
mod tls;
mod write;

pub use tls::{tls_connector, TlsConnector};
pub use write::{PgValue, PgWrite};
/// The pool and driver crates, for building a pool of your own (TLS, other
/// settings).
pub use {deadpool_postgres, tokio_postgres};

use super::{
    Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal,
    Status, Store,
};
use crate::{Fingerprint, StoreError, StoreErrorKind};
use deadpool_postgres::{Object, Pool};
use std::sync::Arc;
use tokio_postgres::{
    types::{ToSql, Type},
    Row,
};

/// The record's columns, in the order every query returns them.
const COLUMNS: &str = "id, status, owner, fingerprint, expiration_s, lease_until_ms, response, \
     created_at_ms, completed_at_ms, attempt, first_started_ms";

/// Records in a PostgreSQL table. Cheap to clone.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    table: String,
    sql: Statements,
}

/// Every statement, with the table name in it, built once.
struct Statements {
    claim: String,
    take_over: String,
    extend: String,
    complete: String,
    fenced_complete: String,
    release: String,
    commit: String,
    remove_any: String,
    remove_unless_in_progress: String,
    get: String,
    list_in_progress: String,
    purge: String,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.table)
            .finish_non_exhaustive()
    }
}

/// The name of the answered write's common table expression: it hides a
/// table of the same name inside the statement, so no table may have it.
const WRITE_CTE: &str = "lambda_idempotency_write";

/// The longest bare table name: its index is `<name>_expiration_s`, and
/// PostgreSQL cuts every name at 63 bytes (the index would then take the
/// table's own name, and `IF NOT EXISTS` would skip it in silence).
const MAX_TABLE_NAME: usize = 63 - "_expiration_s".len();

/// Wraps a conditional write so that one round trip answers it: whether it
/// applied, and else the record as the statement found it.
fn answered(write: &str, table: &str) -> String {
    format!(
        "WITH {WRITE_CTE} AS ({write} RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM {WRITE_CTE}) AS applied, {r} \
         FROM (SELECT 1) one LEFT JOIN {table} r ON r.id = $1",
        r = COLUMNS
            .split(", ")
            .map(|column| format!("r.{column}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl Statements {
    fn new(t: &str) -> Self {
        let fence = "id = $1 AND status = 'IN_PROGRESS' AND owner = $2";
        let claim_values = "($1, 'IN_PROGRESS', $2, $3, $4, $5, NULL, $6, NULL, $7, $8)";
        let replace = "status = excluded.status, owner = excluded.owner, \
             fingerprint = excluded.fingerprint, expiration_s = excluded.expiration_s, \
             lease_until_ms = excluded.lease_until_ms, response = excluded.response, \
             created_at_ms = excluded.created_at_ms, completed_at_ms = excluded.completed_at_ms, \
             attempt = excluded.attempt, first_started_ms = excluded.first_started_ms";
        Self {
            claim: answered(
                &format!(
                    "INSERT INTO {t} AS r ({COLUMNS}) VALUES {claim_values} \
                     ON CONFLICT (id) DO UPDATE SET {replace} WHERE r.expiration_s < $9"
                ),
                t,
            ),
            take_over: answered(
                &format!(
                    "UPDATE {t} SET owner = $3, fingerprint = $4, expiration_s = $5, \
                     lease_until_ms = $6, created_at_ms = $7, attempt = $8, first_started_ms = $9 \
                     WHERE id = $1 AND status = 'IN_PROGRESS' AND owner = $2 AND lease_until_ms < $10"
                ),
                t,
            ),
            extend: answered(
                &format!("UPDATE {t} SET lease_until_ms = $3, expiration_s = $4 WHERE {fence}"),
                t,
            ),
            complete: answered(&Self::completion(t, fence), t),
            fenced_complete: format!("{} RETURNING 1", Self::completion(t, fence)),
            release: answered(&format!("DELETE FROM {t} WHERE {fence}"), t),
            commit: format!(
                "INSERT INTO {t} AS r ({COLUMNS}) \
                 VALUES ($1, 'COMPLETED', $2, $3, $4, NULL, $5, $6, $6, 1, $6) \
                 ON CONFLICT (id) DO UPDATE SET {replace} \
                 WHERE r.expiration_s < $7 \
                    OR (r.status = 'IN_PROGRESS' AND r.lease_until_ms < $6) \
                 RETURNING 1"
            ),
            remove_any: answered(&format!("DELETE FROM {t} WHERE id = $1"), t),
            remove_unless_in_progress: answered(
                &format!("DELETE FROM {t} WHERE id = $1 AND status <> 'IN_PROGRESS'"),
                t,
            ),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1"),
            list_in_progress: format!(
                "SELECT {COLUMNS} FROM {t} WHERE status = 'IN_PROGRESS' AND starts_with(id, $1) \
                 ORDER BY id LIMIT $2"
            ),
            // Batches of rows nobody else is deleting: safe to run from
            // several schedulers at once.
            purge: format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE expiration_s < $1 \
                 LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }

    fn completion(t: &str, fence: &str) -> String {
        format!(
            "UPDATE {t} SET status = 'COMPLETED', response = $3, expiration_s = $4, \
             completed_at_ms = $5, lease_until_ms = NULL WHERE {fence}"
        )
    }
}

/// PostgreSQL's reserved key words (`pg_get_keywords()`'s categories R
/// and T, PostgreSQL 15 to 17): none of them is a table or schema name
/// without quotes. A test compares the list with the server's.
pub(crate) const RESERVED_WORDS: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "binary",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
];

/// Why `name` is not a table name this store puts into its statements, if
/// it is not one: an identifier, optionally schema-qualified, never
/// anything to quote, and never a reserved word where PostgreSQL's grammar
/// refuses one (the table alone, or the schema: after a dot any word goes).
fn table_name_error(name: &str) -> Option<String> {
    let identifier = |part: &str| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && part.len() <= 63
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 || !parts.iter().all(|part| identifier(part)) {
        return Some(format!(
            "{name:?} is not a table name this store accepts: letters, digits and _, \
             optionally schema.table"
        ));
    }
    let bare = parts[parts.len() - 1].to_ascii_lowercase();
    if bare.len() > MAX_TABLE_NAME {
        return Some(format!(
            "{name:?} is not a table name this store accepts: at most {MAX_TABLE_NAME} \
             characters (its index is named <table>_expiration_s, and PostgreSQL cuts names \
             at 63)"
        ));
    }
    if bare == WRITE_CTE {
        return Some(format!(
            "{name:?} is not a table name this store accepts: the store's statements use \
             {WRITE_CTE} for a name of their own"
        ));
    }
    let first = parts[0].to_ascii_lowercase();
    RESERVED_WORDS.contains(&first.as_str()).then(|| {
        format!(
            "{name:?} is not a table name this store accepts: {first:?} is a reserved word in \
             PostgreSQL (every statement would fail as a syntax error); choose another name, or \
             qualify it with a schema (public.{name})"
        )
    })
}

/// The DDL of the module docs for `table`. An index lives in its table's
/// schema and its name cannot be schema-qualified: it takes the table's
/// bare name.
fn table_ddl(table: &str) -> String {
    let bare = table.rsplit('.').next().unwrap_or(table);
    include_str!("table.sql")
        .replace("idempotency_expiration_s", &format!("{bare}_expiration_s"))
        .replace("EXISTS idempotency (", &format!("EXISTS {table} ("))
        .replace("ON idempotency (", &format!("ON {table} ("))
}

/// The DDL's `CREATE TABLE` and the statements after it (the index).
fn split_ddl(ddl: &str) -> (&str, &str) {
    ddl.split_at(ddl.find("CREATE INDEX").unwrap_or(ddl.len()))
}

/// The record's columns and the types `format_type` names them by.
const COLUMN_TYPES: [(&str, &str); 11] = [
    ("id", "text"),
    ("status", "text"),
    ("owner", "text"),
    ("fingerprint", "text"),
    ("expiration_s", "bigint"),
    ("lease_until_ms", "bigint"),
    ("response", "bytea"),
    ("created_at_ms", "bigint"),
    ("completed_at_ms", "bigint"),
    ("attempt", "integer"),
    ("first_started_ms", "bigint"),
];

/// How a table's columns (name, type, required without a default) and its
/// `id` index differ from what the store reads and writes.
fn table_differences(found: &[(String, String, bool)], id_is_unique: bool) -> Vec<String> {
    let mut differences = Vec::new();
    for (name, expected) in COLUMN_TYPES {
        match found.iter().find(|(column, _, _)| column == name) {
            None => differences.push(format!("column `{name}` ({expected}) is missing")),
            Some((_, actual, _)) if actual != expected => {
                differences.push(format!("column `{name}` is {actual}, not {expected}"))
            }
            Some(_) => {}
        }
    }
    for (name, _, required) in found {
        if *required && !COLUMN_TYPES.iter().any(|(column, _)| column == name) {
            differences.push(format!(
                "column `{name}` is NOT NULL without a default: the store's inserts cannot fill it"
            ));
        }
    }
    if !id_is_unique {
        differences.push("`id` is not the primary key (nor unique on its own)".to_owned());
    }
    differences
}

/// A time or count as PostgreSQL's `bigint`, refused before any statement
/// when it does not fit.
fn int8(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| {
        StoreError::new(
            StoreErrorKind::Rejected,
            format!("{value} does not fit PostgreSQL's bigint; nothing was written"),
        )
    })
}

/// A claim's numbers as PostgreSQL's integers.
struct ClaimValues {
    expiration: i64,
    lease: i64,
    now: i64,
    attempt: i32,
    first_started: i64,
}

impl ClaimValues {
    fn of(claim: &Claim) -> Result<Self, StoreError> {
        Ok(Self {
            expiration: int8(claim.expiration_s)?,
            lease: int8(claim.lease_until_ms)?,
            now: int8(claim.now_ms)?,
            attempt: i32::try_from(claim.attempt).unwrap_or(i32::MAX),
            first_started: int8(claim.first_started_ms)?,
        })
    }
}

impl PostgresStore {
    /// A store over `table` (default `idempotency`; an identifier,
    /// optionally schema-qualified), through `pool`.
    pub fn new(pool: Pool, table: impl Into<String>) -> Result<Self, StoreError> {
        let table = table.into();
        if let Some(error) = table_name_error(&table) {
            return Err(StoreError::new(StoreErrorKind::Misconfigured, error));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&table),
                table,
            }),
        })
    }

    /// A store over `table`, through a new pool of at most `max_size`
    /// connections to `url` (`postgres://user:password@host:port/database`),
    /// without TLS. Connections open on first use. Build it once, in `main`.
    ///
    /// For RDS, Aurora and RDS Proxy, use
    /// [`connect_tls`](PostgresStore::connect_tls).
    pub fn connect(
        url: &str,
        table: impl Into<String>,
        max_size: usize,
    ) -> Result<Self, StoreError> {
        Self::new(pool(config(url)?, max_size, tokio_postgres::NoTls)?, table)
    }

    /// Like [`connect`](PostgresStore::connect), over TLS, trusting the
    /// certificate authorities in `root_certificates` (PEM) and nothing
    /// else: for RDS, Amazon's bundle
    /// (`https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem`,
    /// shipped with the function, for example with `include_bytes!`).
    ///
    /// TLS is required: a URL without `sslmode` (or with `prefer`) is
    /// taken as `sslmode=require`, a server that does not speak TLS is an
    /// error rather than a plain connection, and the certificate's chain
    /// and host name are always verified (libpq's `verify-full`). A URL
    /// that says `sslmode=disable` is a
    /// [`Misconfigured`](StoreErrorKind::Misconfigured) error.
    pub fn connect_tls(
        url: &str,
        table: impl Into<String>,
        max_size: usize,
        root_certificates: &[u8],
    ) -> Result<Self, StoreError> {
        let mut config = config(url)?;
        match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => {
                return Err(StoreError::new(
                    StoreErrorKind::Misconfigured,
                    "connect_tls was given a PostgreSQL URL with sslmode=disable",
                ))
            }
            _ => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
            }
        }
        let connector = tls::tls_connector(root_certificates)?;
        Self::new(pool(config, max_size, connector)?, table)
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// Creates the table and its expiration index if they are missing (the
    /// DDL in the module docs), then checks the table: one that was already
    /// there with another shape (a column missing or of another type, `id`
    /// not unique, a column of its own that inserts cannot leave empty) is
    /// a [`StoreErrorKind::Misconfigured`] error naming each difference,
    /// and is left as it is.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let ddl = table_ddl(&self.inner.table);
        // The table, then its check, then its index: an index is not added to
        // a table of another shape.
        let (create_table, create_index) = split_ddl(&ddl);
        client
            .batch_execute(create_table)
            .await
            .map_err(|e| errors::from_pg("CREATE TABLE", e))?;
        self.check_table(&client).await?;
        client
            .batch_execute(create_index)
            .await
            .map_err(|e| errors::from_pg("CREATE INDEX", e))
    }

    async fn check_table(&self, client: &Object) -> Result<(), StoreError> {
        let table = &self.inner.table;
        let columns = client
            .query_typed(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                        a.attnotnull AND NOT a.atthasdef \
                 FROM pg_attribute a \
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[(table, Type::TEXT)],
            )
            .await
            .map_err(|e| errors::from_pg("read the table's columns", e))?;
        let id_is_unique: bool = client
            .query_typed(
                "SELECT EXISTS (SELECT 1 FROM pg_index i \
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                   WHERE i.indrelid = to_regclass($1) AND i.indisunique \
                     AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = 'id')",
                &[(table, Type::TEXT)],
            )
            .await
            .map_err(|e| errors::from_pg("read the table's indexes", e))?
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or(false);
        let found: Vec<(String, String, bool)> = columns
            .iter()
            .filter_map(|row| {
                Some((
                    row.try_get(0).ok()?,
                    row.try_get(1).ok()?,
                    row.try_get(2).ok()?,
                ))
            })
            .collect();
        let differences = table_differences(&found, id_is_unique);
        if differences.is_empty() {
            return Ok(());
        }
        Err(StoreError::new(
            StoreErrorKind::Misconfigured,
            format!(
                "PostgreSQL table {table} exists with another shape than the store's (see the DDL \
                 in the postgres store's docs): {}",
                differences.join("; ")
            ),
        ))
    }

    /// Deletes records that expired before `now_s` (epoch seconds), in
    /// batches of `batch`, until none is left; returns how many. Safe to run
    /// concurrently: each batch skips rows another run holds.
    pub async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let now = int8(now_s)?;
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            let deleted = client
                .execute_typed(
                    &self.inner.sql.purge,
                    &[(&now, Type::INT8), (&batch, Type::INT8)],
                )
                .await
                .map_err(|e| errors::from_pg("DELETE (purge expired)", e))?;
            total += deleted;
            if deleted < batch as u64 {
                return Ok(total);
            }
        }
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.inner.pool.get().await.map_err(errors::from_pool)
    }

    /// Runs an answered conditional write.
    async fn answer(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_typed(sql, params)
            .await
            .map_err(|e| errors::from_pg(operation, e))?
            .into_iter()
            .next()
            .ok_or_else(|| {
                StoreError::new(StoreErrorKind::Other, format!("{operation}: no answer row"))
            })?;
        let applied: bool = row
            .try_get("applied")
            .map_err(|e| StoreError::corrupt("the answer has no `applied`").with_source(e))?;
        if applied {
            return Ok(Conditional::Applied);
        }
        Ok(Conditional::Refused(decode_optional(&row)?))
    }

    /// Runs `write` (a statement `RETURNING 1` when it applies) and the
    /// handler's writes in one transaction; a refusal rolls back and reports
    /// the record found.
    async fn transaction(
        &self,
        write: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        writes: &[PgWrite],
        id: &RecordId,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let mut client = self.client().await?;
        let transaction = client
            .transaction()
            .await
            .map_err(|e| errors::from_pg("BEGIN", e))?;
        let applied = !transaction
            .query_typed(write, params)
            .await
            .map_err(|e| errors::from_pg(operation, e))?
            .is_empty();
        if !applied {
            let rows = transaction
                .query_typed(&self.inner.sql.get, &[(&id.as_str(), Type::TEXT)])
                .await
                .map_err(|e| errors::from_pg("SELECT", e))?;
            let found = rows.first().map(decode).transpose()?;
            transaction
                .rollback()
                .await
                .map_err(|e| errors::from_pg("ROLLBACK", e))?;
            return Ok(Conditional::Refused(found));
        }
        for (index, write) in writes.iter().enumerate() {
            let params: Vec<_> = write.params.iter().map(PgValue::typed).collect();
            if let Err(error) = transaction.execute_typed(&write.sql, &params).await {
                // Dropping the transaction rolls it back.
                return Err(errors::from_write(index, error));
            }
        }
        transaction
            .commit()
            .await
            .map_err(|e| errors::from_pg("COMMIT", e))?;
        Ok(Conditional::Applied)
    }
}

impl Store for PostgresStore {
    type Write = PgWrite;

    const SINGLE_WRITE: bool = true;

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let v = ClaimValues::of(claim)?;
        let now_s = int8(claim.now_ms / 1000)?;
        self.answer(
            &self.inner.sql.claim,
            &[
                (&claim.id.as_str(), Type::TEXT),
                (&claim.owner.as_str(), Type::TEXT),
                (&claim.fingerprint.as_str(), Type::TEXT),
                (&v.expiration, Type::INT8),
                (&v.lease, Type::INT8),
                (&v.now, Type::INT8),
                (&v.attempt, Type::INT4),
                (&v.first_started, Type::INT8),
                (&now_s, Type::INT8),
            ],
            "INSERT (claim)",
        )
        .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let v = ClaimValues::of(claim)?;
        self.answer(
            &self.inner.sql.take_over,
            &[
                (&claim.id.as_str(), Type::TEXT),
                (&lapsed.as_str(), Type::TEXT),
                (&claim.owner.as_str(), Type::TEXT),
                (&claim.fingerprint.as_str(), Type::TEXT),
                (&v.expiration, Type::INT8),
                (&v.lease, Type::INT8),
                (&v.now, Type::INT8),
                (&v.attempt, Type::INT4),
                (&v.first_started, Type::INT8),
                (&v.now, Type::INT8),
            ],
            "UPDATE (take over)",
        )
        .await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        let (lease, expiration) = (
            int8(extension.lease_until_ms)?,
            int8(extension.expiration_s)?,
        );
        self.answer(
            &self.inner.sql.extend,
            &[
                (&extension.id.as_str(), Type::TEXT),
                (&extension.owner.as_str(), Type::TEXT),
                (&lease, Type::INT8),
                (&expiration, Type::INT8),
            ],
            "UPDATE (extend)",
        )
        .await
    }

    async fn complete(&self, completion: Completion<PgWrite>) -> Result<Conditional, StoreError> {
        let (expiration, now) = (int8(completion.expiration_s)?, int8(completion.now_ms)?);
        let params: [(&(dyn ToSql + Sync), Type); 5] = [
            (&completion.id.as_str(), Type::TEXT),
            (&completion.owner.as_str(), Type::TEXT),
            (&completion.response, Type::BYTEA),
            (&expiration, Type::INT8),
            (&now, Type::INT8),
        ];
        if completion.writes.is_empty() {
            return self
                .answer(&self.inner.sql.complete, &params, "UPDATE (complete)")
                .await;
        }
        self.transaction(
            &self.inner.sql.fenced_complete,
            &params,
            &completion.writes,
            &completion.id,
            "UPDATE (complete)",
        )
        .await
    }

    async fn commit(&self, commit: Commit<PgWrite>) -> Result<Conditional, StoreError> {
        let (expiration, now, now_s) = (
            int8(commit.expiration_s)?,
            int8(commit.now_ms)?,
            int8(commit.now_ms / 1000)?,
        );
        self.transaction(
            &self.inner.sql.commit,
            &[
                (&commit.id.as_str(), Type::TEXT),
                (&commit.owner.as_str(), Type::TEXT),
                (&commit.fingerprint.as_str(), Type::TEXT),
                (&expiration, Type::INT8),
                (&commit.response, Type::BYTEA),
                (&now, Type::INT8),
                (&now_s, Type::INT8),
            ],
            &commit.writes,
            &commit.id,
            "INSERT (commit)",
        )
        .await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.sql.release,
            &[(&id.as_str(), Type::TEXT), (&owner.as_str(), Type::TEXT)],
            "DELETE (release)",
        )
        .await
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let sql = match removal {
            Removal::Any => &self.inner.sql.remove_any,
            Removal::UnlessInProgress => &self.inner.sql.remove_unless_in_progress,
        };
        self.answer(sql, &[(&id.as_str(), Type::TEXT)], "DELETE (remove)")
            .await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query_typed(
                &self.inner.sql.list_in_progress,
                &[(&prefix, Type::TEXT), (&limit, Type::INT8)],
            )
            .await
            .map_err(|e| errors::from_pg("SELECT (list in progress)", e))?;
        rows.iter().map(decode).collect()
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query_typed(&self.inner.sql.get, &[(&id.as_str(), Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT", e))?;
        Ok(rows
            .first()
            .map(decode)
            .transpose()?
            .filter(|record| !record.is_expired(now_ms)))
    }
}

/// The record of a row whose columns may all be NULL (no record).
fn decode_optional(row: &Row) -> Result<Option<Record>, StoreError> {
    let id: Option<String> = column(row, "id")?;
    id.map(|_| decode(row)).transpose()
}

fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    name: &str,
) -> Result<T, StoreError> {
    row.try_get(name).map_err(|error| {
        StoreError::corrupt(format!("column `{name}` is missing or has the wrong type"))
            .with_source(error)
    })
}

fn unsigned(value: i64, name: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::corrupt(format!("column `{name}` is negative")))
}

fn optional_unsigned(value: Option<i64>, name: &str) -> Result<Option<u64>, StoreError> {
    value.map(|value| unsigned(value, name)).transpose()
}

/// Decodes a row; never panics on what the table holds.
fn decode(row: &Row) -> Result<Record, StoreError> {
    let id: String = column(row, "id")?;
    let status: String = column(row, "status")?;
    let status = status
        .parse::<Status>()
        .map_err(|_| StoreError::corrupt(format!("record {id}: unknown status {status:?}")))?;
    let record = Record {
        status,
        owner: OwnerToken::from_stored(column::<String>(row, "owner")?),
        fingerprint: Fingerprint::from_stored(column::<String>(row, "fingerprint")?),
        expiration_s: unsigned(column(row, "expiration_s")?, "expiration_s")?,
        lease_until_ms: optional_unsigned(column(row, "lease_until_ms")?, "lease_until_ms")?,
        response: column(row, "response")?,
        created_at_ms: optional_unsigned(column(row, "created_at_ms")?, "created_at_ms")?,
        completed_at_ms: optional_unsigned(column(row, "completed_at_ms")?, "completed_at_ms")?,
        attempt: u32::try_from(column::<i32>(row, "attempt")?)
            .map_err(|_| StoreError::corrupt(format!("record {id}: negative attempt")))?,
        first_started_ms: optional_unsigned(column(row, "first_started_ms")?, "first_started_ms")?,
        id: RecordId::from_stored(id),
    };
    record.checked()
}

/// The URL's configuration, refused here when it cannot connect at all:
/// the pool connects lazily, and would otherwise report an outage on every
/// call (one that fail-open runs through).
fn config(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    let config: tokio_postgres::Config = url.parse().map_err(|error| {
        StoreError::new(StoreErrorKind::Misconfigured, "invalid PostgreSQL URL").with_source(error)
    })?;
    let missing = if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        Some("no host (postgres://user@host:port/database)")
    } else if config.get_user().is_none() {
        Some("no user (postgres://user@host:port/database)")
    } else {
        None
    };
    match missing {
        Some(what) => Err(StoreError::new(
            StoreErrorKind::Misconfigured,
            format!("invalid PostgreSQL URL: it names {what}"),
        )),
        None => Ok(config),
    }
}

fn pool<T>(config: tokio_postgres::Config, max_size: usize, tls: T) -> Result<Pool, StoreError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
{
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tls,
        deadpool_postgres::ManagerConfig {
            // A connection that died while the environment was frozen is
            // replaced, not handed out.
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    // A server that does not answer is an unavailable store, not a hang.
    Pool::builder(manager)
        .max_size(max_size.max(1))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .create_timeout(Some(std::time::Duration::from_secs(5)))
        .wait_timeout(Some(std::time::Duration::from_secs(5)))
        .build()
        .map_err(|error| {
            StoreError::new(
                StoreErrorKind::Misconfigured,
                "the PostgreSQL pool could not be built",
            )
            .with_source(error)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ddl_names_the_table_and_a_bare_index() {
        assert_eq!(table_ddl("idempotency"), include_str!("table.sql"));
        let ddl = table_ddl("app.records");
        assert!(
            ddl.contains("CREATE TABLE IF NOT EXISTS app.records ("),
            "{ddl}"
        );
        assert!(
            ddl.contains("CREATE INDEX IF NOT EXISTS records_expiration_s ON app.records ("),
            "{ddl}"
        );
        assert!(!ddl.contains("idempotency"), "{ddl}");
        let (table, index) = split_ddl(&ddl);
        assert!(
            table.starts_with("CREATE TABLE") && !table.contains("INDEX"),
            "{table}"
        );
        assert!(
            index.starts_with("CREATE INDEX") && !index.contains("TABLE"),
            "{index}"
        );
    }

    #[test]
    fn only_plain_table_names_go_into_statements() {
        for good in [
            "idempotency",
            "app.idempotency",
            "_t1",
            "Records",
            "public.order",
            "orders",
            "app.select",
            "w",
            &"x".repeat(50),
        ] {
            assert_eq!(table_name_error(good), None, "{good}");
        }
        for reserved in ["order", "SELECT", "group", "user", "select.t"] {
            let error = table_name_error(reserved).expect(reserved);
            assert!(error.contains("reserved word"), "{error}");
        }
        for bad in [
            "",
            "1t",
            "a.b.c",
            "t;drop",
            "t t",
            "\"t\"",
            "a-b",
            &"x".repeat(64),
            &"x".repeat(51),
            "lambda_idempotency_write",
            "app.LAMBDA_IDEMPOTENCY_WRITE",
        ] {
            assert!(table_name_error(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn a_url_that_cannot_connect_is_refused_at_construction() {
        for url in [
            "postgresql://",
            "postgresql:///db",
            "postgres://:5432/db",
            "host= user=x",
        ] {
            let error = config(url).expect_err(url);
            assert_eq!(
                error.kind(),
                StoreErrorKind::Misconfigured,
                "{url}: {error}"
            );
        }
        for url in [
            "postgres://u@127.0.0.1:1/db",
            "postgresql://u@%2Frun%2Fpostgresql/db",
            "host=/run/postgresql user=u",
        ] {
            assert!(config(url).is_ok(), "{url}");
        }
    }
}
