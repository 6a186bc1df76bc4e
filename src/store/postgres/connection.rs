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
    /// form that may be open at once in this process: `per_invocation` of
    /// them for each invocation it serves at once (one in a Lambda function
    /// of the default kind, `AWS_LAMBDA_MAX_CONCURRENCY` in a Managed
    /// Instance). A handler inside its transaction holds its connection
    /// until it commits, so with fewer connections the others wait for one,
    /// one after another, and answer `503` after the pool's wait (5 s).
    /// Warns when it cannot, saying what to set; the shortfall is returned.
    #[cfg_attr(not(any(feature = "http", feature = "consumers")), allow(dead_code))]
    pub(crate) fn warn_if_pool_short(&self, per_invocation: usize) -> Option<usize> {
        let invocations = crate::managed_instances_concurrency().unwrap_or(1) as usize;
        let max_size = self.inner.pool.status().max_size;
        let short = shortfall(max_size, invocations, per_invocation)?;
        let needed = max_size + short;
        tracing::warn!(
            pool_max_size = max_size,
            needed,
            concurrent_invocations = invocations,
            transactions_per_invocation = per_invocation,
            "the PostgreSQL pool is smaller than the transactions the in-transaction form may hold \
             open at once (concurrent invocations, AWS_LAMBDA_MAX_CONCURRENCY under Lambda Managed \
             Instances, times the transactions each runs): handlers will wait for a connection, \
             one after another, and answer 503 once the pool's wait runs out; make the pool's \
             max_size at least {needed}"
        );
        Some(short)
    }
}

/// How many connections a pool of `max_size` lacks for `invocations` at once
/// running `per_invocation` transactions each; `None` when it has enough.
fn shortfall(max_size: usize, invocations: usize, per_invocation: usize) -> Option<usize> {
    let needed = invocations.saturating_mul(per_invocation.max(1));
    needed.checked_sub(max_size).filter(|short| *short > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_short_when_the_invocations_at_once_need_more_transactions() {
        // A function of the default kind: one invocation, one transaction.
        assert_eq!(shortfall(2, 1, 1), None);
        // Managed Instances: eight invocations at once.
        assert_eq!(shortfall(2, 8, 1), Some(6));
        assert_eq!(shortfall(8, 8, 1), None);
        // A batch of eight records at once, in each of eight invocations.
        assert_eq!(shortfall(8, 8, 8), Some(56));
        assert_eq!(shortfall(64, 8, 8), None);
        assert_eq!(shortfall(1, 1, 0), None, "a batch counts at least one");
        assert_eq!(shortfall(1, usize::MAX, 2), Some(usize::MAX - 1));
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
