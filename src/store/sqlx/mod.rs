//! The SQL stores on sqlx, over the application's own pool: each a store
//! of the protocol's conditional writes and a [`TransactionalStore`]
//! (the handler inside the transaction that holds its claim).
//!
//! [`TransactionalStore`]: crate::store::TransactionalStore

#[cfg(feature = "sqlx-mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-mysql")))]
pub mod mysql;
