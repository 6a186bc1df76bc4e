//! [`SqlxMySqlWrite`]: one SQL statement of the operation's, committed
//! with its completion.

use sqlx::{mysql::MySqlArguments, query::Query, MySql};

/// A value bound to a [`SqlxMySqlWrite`] parameter.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MySqlValue {
    /// Text (`VARCHAR`, `TEXT`; a `JSON` column takes JSON as text).
    Text(String),
    /// A signed integer (`BIGINT`, `INT`).
    Int(i64),
    /// An unsigned integer (`BIGINT UNSIGNED`).
    UInt(u64),
    /// A boolean (`BOOLEAN`, `TINYINT(1)`).
    Bool(bool),
    /// Bytes (`BLOB`, `VARBINARY`).
    Bytes(Vec<u8>),
    /// `NULL`.
    Null,
}

macro_rules! value_from {
    ($($from:ty => $variant:ident),* $(,)?) => {
        $(impl From<$from> for MySqlValue {
            fn from(value: $from) -> Self {
                MySqlValue::$variant(value.into())
            }
        })*
    };
}

value_from! {
    String => Text, &str => Text, i64 => Int, i32 => Int, u64 => UInt, u32 => UInt,
    bool => Bool, Vec<u8> => Bytes, &[u8] => Bytes,
}

impl From<serde_json::Value> for MySqlValue {
    fn from(value: serde_json::Value) -> Self {
        MySqlValue::Text(value.to_string())
    }
}

impl<T: Into<MySqlValue>> From<Option<T>> for MySqlValue {
    fn from(value: Option<T>) -> Self {
        value.map_or(MySqlValue::Null, Into::into)
    }
}

/// One SQL statement run in the transaction that completes the record
/// ([`CommitWith`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.CommitWith.html),
/// [`Engine::execute_transactional`](crate::Engine::execute_transactional)):
/// committed with it, or not at all.
///
/// ```
/// use lambda_idempotency::store::sqlx::mysql::SqlxMySqlWrite;
///
/// let insert = SqlxMySqlWrite::new("INSERT INTO charges (id, amount) VALUES (?, ?)")
///     .bind("ch_1")
///     .bind(1250i64);
/// assert_eq!(insert.sql(), "INSERT INTO charges (id, amount) VALUES (?, ?)");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SqlxMySqlWrite {
    sql: String,
    params: Vec<MySqlValue>,
}

impl SqlxMySqlWrite {
    /// A statement with `?` placeholders, bound in order by
    /// [`bind`](Self::bind).
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// Binds the next `?`.
    #[must_use]
    pub fn bind(mut self, value: impl Into<MySqlValue>) -> Self {
        self.params.push(value.into());
        self
    }

    /// The statement.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The statement as a sqlx query, its values bound.
    pub(super) fn query(&self) -> Query<'_, MySql, MySqlArguments> {
        self.params
            .iter()
            .fold(sqlx::query(&self.sql), |query, value| match value {
                MySqlValue::Text(value) => query.bind(value.as_str()),
                MySqlValue::Int(value) => query.bind(*value),
                MySqlValue::UInt(value) => query.bind(*value),
                MySqlValue::Bool(value) => query.bind(*value),
                MySqlValue::Bytes(value) => query.bind(value.as_slice()),
                MySqlValue::Null => query.bind(None::<&str>),
            })
    }
}
