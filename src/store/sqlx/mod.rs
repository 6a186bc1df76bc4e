//! The SQL stores on sqlx, over the application's own pool: each a store
//! of the protocol's conditional writes and a [`TransactionalStore`]
//! (the handler inside the transaction that holds its claim).
//!
//! The PostgreSQL store here reads and writes the same records, in the
//! same table with the same statements, as `store::postgres::PostgresStore`
//! (tokio-postgres): pick the one whose driver the application already
//! uses, and switch without a migration.
//!
//! [`TransactionalStore`]: crate::store::TransactionalStore

#[cfg(feature = "sqlx-mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-mysql")))]
pub mod mysql;

#[cfg(feature = "sqlx-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-postgres")))]
pub mod postgres;
