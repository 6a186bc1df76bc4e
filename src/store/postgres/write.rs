//! [`PgWrite`]: one SQL statement of the handler's, committed with its
//! completion.

use std::fmt;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// A value bound to a [`PgWrite`] parameter, with its PostgreSQL type
/// (statements are sent unprepared, so every parameter says its type).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum PgValue {
    /// `text`.
    Text(String),
    /// `bigint`.
    Int8(i64),
    /// `integer`.
    Int4(i32),
    /// `boolean`.
    Bool(bool),
    /// `bytea`.
    Bytea(Vec<u8>),
    /// `jsonb`.
    Jsonb(serde_json::Value),
    /// `NULL` of the given type.
    Null(Type),
}

impl PgValue {
    pub(super) fn typed(&self) -> (&(dyn ToSql + Sync), Type) {
        match self {
            PgValue::Text(value) => (value, Type::TEXT),
            PgValue::Int8(value) => (value, Type::INT8),
            PgValue::Int4(value) => (value, Type::INT4),
            PgValue::Bool(value) => (value, Type::BOOL),
            PgValue::Bytea(value) => (value, Type::BYTEA),
            PgValue::Jsonb(value) => (value, Type::JSONB),
            PgValue::Null(ty) => (&Null, ty.clone()),
        }
    }
}

/// SQL `NULL`, of whatever type its parameter is declared with.
#[derive(Debug)]
struct Null;

impl ToSql for Null {
    fn to_sql(
        &self,
        _: &Type,
        _: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        Ok(IsNull::Yes)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

impl From<&str> for PgValue {
    fn from(value: &str) -> Self {
        PgValue::Text(value.to_owned())
    }
}

impl From<String> for PgValue {
    fn from(value: String) -> Self {
        PgValue::Text(value)
    }
}

impl From<i64> for PgValue {
    fn from(value: i64) -> Self {
        PgValue::Int8(value)
    }
}

impl From<i32> for PgValue {
    fn from(value: i32) -> Self {
        PgValue::Int4(value)
    }
}

impl From<bool> for PgValue {
    fn from(value: bool) -> Self {
        PgValue::Bool(value)
    }
}

impl From<Vec<u8>> for PgValue {
    fn from(value: Vec<u8>) -> Self {
        PgValue::Bytea(value)
    }
}

impl From<serde_json::Value> for PgValue {
    fn from(value: serde_json::Value) -> Self {
        PgValue::Jsonb(value)
    }
}

/// One SQL statement of the handler's own, committed in one PostgreSQL
/// transaction with the fenced completion (or the single-write commit):
/// all or nothing. The store's [`Store::Write`](crate::store::Store::Write).
///
/// ```
/// use lambda_idempotency::store::postgres::PgWrite;
///
/// let write = PgWrite::new("INSERT INTO charges (id, amount, currency) VALUES ($1, $2, $3)")
///     .bind("ch_1")
///     .bind(1250_i64)
///     .bind("EUR");
/// # let _ = write;
/// ```
///
/// A statement that fails (a constraint, a missing table) rolls the whole
/// transaction back: the completion too, and the claim is released, as
/// with a rejected DynamoDB write.
#[derive(Clone, PartialEq)]
pub struct PgWrite {
    pub(super) sql: String,
    pub(super) params: Vec<PgValue>,
}

impl PgWrite {
    /// A statement with `$1`, `$2`, … placeholders, bound in order with
    /// [`bind`](PgWrite::bind).
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// Binds the next parameter.
    #[must_use]
    pub fn bind(mut self, value: impl Into<PgValue>) -> Self {
        self.params.push(value.into());
        self
    }

    /// The statement.
    pub fn sql(&self) -> &str {
        &self.sql
    }
}

impl fmt::Debug for PgWrite {
    // Parameters may hold personal data: the statement and how many.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgWrite")
            .field("sql", &self.sql)
            .field("params", &self.params.len())
            .finish()
    }
}
