//! [`SqlxPgWrite`]: one SQL statement of the handler's, committed with its
//! completion.

use sqlx::{postgres::PgArguments, Arguments, Postgres};
use std::fmt;

/// One SQL statement of the handler's own, committed in one PostgreSQL
/// transaction with the fenced completion (or the single-write commit):
/// all or nothing. The store's [`Store::Write`](crate::store::Store::Write).
/// Its parameters are any value sqlx binds (`String`, `i64`, `Uuid`,
/// `serde_json::Value` with sqlx's `json` feature, …), encoded when bound.
///
/// ```
/// use lambda_idempotency::store::sqlx::postgres::SqlxPgWrite;
///
/// let write = SqlxPgWrite::new("INSERT INTO charges (id, amount, currency) VALUES ($1, $2, $3)")
///     .bind("ch_1")
///     .bind(1250_i64)
///     .bind("EUR");
/// # let _ = write;
/// ```
///
/// A statement that fails (a constraint, a missing table, a value sqlx
/// could not encode) rolls the whole transaction back: the completion
/// too, and the claim is released, as with a rejected DynamoDB write.
#[derive(Clone)]
pub struct SqlxPgWrite {
    pub(super) sql: String,
    pub(super) arguments: PgArguments,
    /// The first value that could not be encoded: reported when the write
    /// runs, as sqlx's own `Query::bind` does.
    pub(super) unencodable: Option<String>,
}

impl SqlxPgWrite {
    /// A statement with `$1`, `$2`, … placeholders, bound in order with
    /// [`bind`](SqlxPgWrite::bind).
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            arguments: PgArguments::default(),
            unencodable: None,
        }
    }

    /// Binds the next parameter (encoded now: the write keeps no borrow).
    #[must_use]
    pub fn bind<'q, T>(mut self, value: T) -> Self
    where
        T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>,
    {
        if let Err(error) = self.arguments.add(value) {
            self.unencodable.get_or_insert_with(|| error.to_string());
        }
        self
    }

    /// The statement.
    pub fn sql(&self) -> &str {
        &self.sql
    }
}

impl fmt::Debug for SqlxPgWrite {
    // Parameters may hold personal data: the statement and how many.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPgWrite")
            .field("sql", &self.sql)
            .field("params", &self.arguments.len())
            .finish()
    }
}
