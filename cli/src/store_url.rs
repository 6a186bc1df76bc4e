//! The store named by `IDEMPOTENCY_STORE_URL`, shared by the operator tool
//! and the reference functions (which include this file: they are not
//! published, the tool is).
//!
//! - `postgres://…`, `postgresql://…` (feature `postgres`): the table
//!   `idempotency` for the functions, created if missing.
//! - `redis://…`, `rediss://…`, `redis+cluster://…`, `rediss+cluster://…`
//!   (feature `redis`): a server, or a Redis Cluster through one of its
//!   nodes (ElastiCache's configuration endpoint, ElastiCache Serverless,
//!   MemoryDB).
//!
//! `IDEMPOTENCY_STORE_ROOT_CERTIFICATE`, a PEM file shipped with the
//! function, is the certificate authority to trust for TLS: Amazon's RDS
//! bundle for PostgreSQL (which then always connects over TLS), a private
//! CA for Redis.

/// What `lambda_http` and `lambda_runtime` call `Error`: this file is shared
/// by the tool and by functions on either runtime.
type Error = Box<dyn std::error::Error + Send + Sync>;

/// A store other than DynamoDB.
pub enum OtherStore {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(lambda_idempotency::store::postgres::PostgresStore),
    /// Redis, Valkey, a Redis Cluster.
    #[cfg(feature = "redis")]
    Redis(lambda_idempotency::store::redis::RedisStore),
}

/// The PostgreSQL table of the reference functions.
pub const POSTGRES_TABLE: &str = "idempotency";

/// Opens the store at `url`, with its records in `postgres_table` on
/// PostgreSQL (created if missing, and its shape checked, when `create`),
/// or says why this build cannot.
pub async fn open(url: &str, postgres_table: &str, create: bool) -> Result<OtherStore, Error> {
    let root_certificate = match std::env::var_os("IDEMPOTENCY_STORE_ROOT_CERTIFICATE") {
        Some(path) if !path.is_empty() => Some(std::fs::read(&path).map_err(|e| {
            format!("IDEMPOTENCY_STORE_ROOT_CERTIFICATE {path:?} cannot be read: {e}")
        })?),
        _ => None,
    };
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    #[cfg(feature = "postgres")]
    if matches!(scheme, "postgres" | "postgresql") {
        use lambda_idempotency::store::postgres::PostgresStore;
        // Two connections for each invocation served at once: one in a
        // function of the default kind, AWS_LAMBDA_MAX_CONCURRENCY under
        // Lambda Managed Instances.
        let invocations = lambda_idempotency::managed_instances_concurrency().unwrap_or(1);
        let max_size = 2 * invocations as usize;
        let store = match &root_certificate {
            Some(root) => PostgresStore::connect_tls(url, postgres_table, max_size, root)?,
            None => PostgresStore::connect(url, postgres_table, max_size)?,
        };
        if create {
            store.create_table().await?;
        }
        return Ok(OtherStore::Postgres(store));
    }
    #[cfg(feature = "redis")]
    if matches!(
        scheme,
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster"
    ) {
        use lambda_idempotency::store::redis::RedisStore;
        let store = match &root_certificate {
            Some(root) => RedisStore::open_with_root_certificate(url, root)?,
            None => RedisStore::open(url)?,
        };
        return Ok(OtherStore::Redis(store));
    }
    let _ = (root_certificate, postgres_table, create);
    Err(format!(
        "IDEMPOTENCY_STORE_URL: scheme {scheme:?} is not one this build knows: postgres:// and \
         postgresql:// (feature `postgres`), redis://, rediss://, redis+cluster:// and \
         rediss+cluster:// (feature `redis`); build with `--features postgres,redis`"
    )
    .into())
}
