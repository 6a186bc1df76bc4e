//! Connecting: the URL checked at construction, and the pool.

use crate::{StoreError, StoreErrorKind};
use deadpool_postgres::Pool;

/// The URL's configuration, refused here when it cannot connect at all:
/// the pool connects lazily, and would otherwise report an outage on every
/// call (one that fail-open runs through).
pub(super) fn config(url: &str) -> Result<tokio_postgres::Config, StoreError> {
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

pub(super) fn pool<T>(
    config: tokio_postgres::Config,
    max_size: usize,
    tls: T,
) -> Result<Pool, StoreError>
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

impl super::PostgresStore {
    /// Whether the pool can hold every transaction of the in-transaction
    /// form that may be open at once in this process (the adapters count
    /// them: the invocations served at once, one in a Lambda function of
    /// the default kind and `AWS_LAMBDA_MAX_CONCURRENCY` in a Managed
    /// Instance, times the transactions each runs). A handler inside its
    /// transaction holds its connection until it commits, so with fewer
    /// connections the others wait for one, one after another, and answer
    /// `503` after the pool's wait (5 s). Warns when it cannot, saying what
    /// to set; the shortfall is returned.
    pub(crate) fn warn_if_pool_short(&self, at_once: usize) -> Option<usize> {
        crate::store::pg::warn_if_pool_short(self.inner.pool.status().max_size, at_once)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
