//! A statement of the store's with its values, sent as the store is set:
//! by default as one simple query with the values written into its text
//! as literals; with
//! [`prepared_statements`](super::SqlxPostgresStore::prepared_statements),
//! as a named statement, prepared once per connection, with its values
//! bound.
//!
//! sqlx sends a statement with parameters in two exchanges (parse and
//! describe, then bind and execute) unless it is cached, and a pooler in
//! transaction mode may move the session to another server connection
//! between the two. A simple query is one message and one exchange: the
//! server runs its single statement as a transaction of its own, so no
//! pooler can split it, no statement is kept on the server, and no
//! `BEGIN` and `COMMIT` around it are needed.

use crate::{lower_hex::push_lower_hex, StoreError, StoreErrorKind};
use sqlx::{
    postgres::{PgArguments, PgQueryResult, PgRow},
    Arguments, Executor, Postgres,
};

/// One value of a statement of the store's: only these types.
#[derive(Clone, Copy, Debug)]
pub(super) enum Value<'a> {
    /// `text`.
    Text(&'a str),
    /// `bytea`.
    Bytes(&'a [u8]),
    /// `bigint`.
    Int8(i64),
    /// `integer`.
    Int4(i32),
}

/// A statement of the store's (`$1`, `$2`, … placeholders) with its
/// values, ready to send.
pub(super) enum Query<'q> {
    /// The statement's text with the values in it.
    Simple(String),
    /// The statement, named and cached by sqlx, and its values bound.
    Prepared(&'q str, PgArguments),
}

impl<'q> Query<'q> {
    /// `sql` with `values` (its `$1`, `$2`, … in order), prepared or
    /// simple.
    pub(super) fn new(
        sql: &'q str,
        values: &[Value<'_>],
        prepared: bool,
    ) -> Result<Self, StoreError> {
        if prepared {
            Ok(Query::Prepared(sql, arguments(values)?))
        } else {
            Ok(Query::Simple(fill(sql, values)))
        }
    }

    /// Runs the statement on `executor` (a pool or a connection); its rows.
    pub(super) async fn fetch_all<'c, E>(self, executor: E) -> Result<Vec<PgRow>, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
    {
        match self {
            Query::Simple(sql) => executor.fetch_all(sqlx::raw_sql(&sql)).await,
            Query::Prepared(sql, arguments) => {
                executor
                    .fetch_all(sqlx::query_with(sql, arguments).persistent(true))
                    .await
            }
        }
    }

    /// Runs `lock` (a statement without parameters that returns one row:
    /// the record's lock), then this statement, on `connection`; this
    /// statement's rows. A simple statement goes in the lock's message: one
    /// exchange, and outside a transaction block the two are one implicit
    /// transaction, which an error rolls back whole and which leaves the
    /// session idle. A prepared one follows the lock, in the transaction
    /// the caller opened.
    pub(super) async fn fetch_all_after(
        self,
        lock: &str,
        connection: &mut sqlx::PgConnection,
    ) -> Result<Vec<PgRow>, sqlx::Error> {
        use futures_util::TryStreamExt;
        use sqlx::Either;
        match self {
            Query::Simple(sql) => {
                let both = format!("{lock}; {sql}");
                let mut results = Executor::fetch_many(&mut *connection, sqlx::raw_sql(&both));
                let mut lock_done = false;
                let mut rows = Vec::new();
                while let Some(item) = results.try_next().await? {
                    match item {
                        // The lock's statement ends first: the rows after
                        // it are this statement's.
                        Either::Left(_) => lock_done = true,
                        Either::Right(row) if lock_done => rows.push(row),
                        Either::Right(_) => {}
                    }
                }
                Ok(rows)
            }
            prepared => {
                Executor::execute(&mut *connection, sqlx::raw_sql(lock)).await?;
                prepared.fetch_all(&mut *connection).await
            }
        }
    }

    /// Runs the statement on `executor`; its first row, if any.
    pub(super) async fn fetch_optional<'c, E>(
        self,
        executor: E,
    ) -> Result<Option<PgRow>, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
    {
        Ok(self.fetch_all(executor).await?.into_iter().next())
    }

    /// Runs the statement on `executor`; how many rows it changed.
    pub(super) async fn execute<'c, E>(self, executor: E) -> Result<PgQueryResult, sqlx::Error>
    where
        E: Executor<'c, Database = Postgres>,
    {
        match self {
            Query::Simple(sql) => executor.execute(sqlx::raw_sql(&sql)).await,
            Query::Prepared(sql, arguments) => {
                executor
                    .execute(sqlx::query_with(sql, arguments).persistent(true))
                    .await
            }
        }
    }
}

/// `values` bound in order, for a prepared statement. The store binds only
/// `text`, `bigint`, `integer` and `bytea`, which always encode; an
/// encoding error is still reported rather than dropped.
fn arguments(values: &[Value<'_>]) -> Result<PgArguments, StoreError> {
    let mut arguments = PgArguments::default();
    for value in values {
        let added = match *value {
            Value::Text(text) => arguments.add(text),
            Value::Bytes(bytes) => arguments.add(bytes),
            Value::Int8(number) => arguments.add(number),
            Value::Int4(number) => arguments.add(number),
        };
        added.map_err(|error| {
            StoreError::new(
                StoreErrorKind::Rejected,
                format!("a value could not be encoded for PostgreSQL: {error}"),
            )
        })?;
    }
    Ok(arguments)
}

/// `template` with each `$n` replaced by `values[n - 1]` written as a
/// literal that reads the same whatever the session's settings:
///
/// - text as an escape string, `E'…'`, with `'` doubled and `\` escaped:
///   an escape string's backslashes are escapes whatever
///   `standard_conforming_strings` says, and a doubled quote is one
///   whatever `backslash_quote` says, so no value can end its literal.
///   sqlx opens every connection with `client_encoding` UTF8, in which no
///   byte of a multibyte character is a quote or a backslash. Its type is
///   left to the statement, as a bound parameter's is: `text`, with the
///   collation of the column it is compared with (the primary key's index
///   serves it). A NUL is written `\000`, which the server refuses as it
///   refuses a bound one (`22021`, invalid byte sequence), rather than
///   cutting the statement's message short;
/// - bytes as `decode('<hex>', 'hex')`: nothing but hex digits in the
///   quotes, folded into a constant when the statement is planned;
/// - numbers as decimal digits, cast to their type (`bigint` or
///   `integer`), as a bound parameter has it.
///
/// The templates hold no `$` but their parameters: table names are
/// letters, digits and `_`, and the statements have no dollar quotes.
pub(super) fn fill(template: &str, values: &[Value<'_>]) -> String {
    let mut filled = String::with_capacity(template.len() + 48 * values.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        filled.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let value = after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|index| values.get(index));
        match value {
            Some(value) => push_literal(&mut filled, *value),
            // Not a parameter, or one without a value (a mistake of the
            // store's, which the server refuses): left as it is.
            None => filled.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &after[digits..];
    }
    filled.push_str(rest);
    filled
}

fn push_literal(out: &mut String, value: Value<'_>) {
    match value {
        Value::Text(text) => {
            out.push_str("E'");
            for c in text.chars() {
                match c {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    '\0' => out.push_str("\\000"),
                    c => out.push(c),
                }
            }
            out.push('\'');
        }
        Value::Bytes(bytes) => {
            out.push_str("decode('");
            push_lower_hex(out, bytes);
            out.push_str("', 'hex')");
        }
        // In parentheses, so that a negative number is cast, not negated
        // after the cast; `::` binds tighter than a minus.
        Value::Int8(number) => {
            out.push('(');
            out.push_str(itoa::Buffer::new().format(number));
            out.push_str(")::int8");
        }
        Value::Int4(number) => {
            out.push('(');
            out.push_str(itoa::Buffer::new().format(number));
            out.push_str(")::int4");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fill, Value::*};

    #[test]
    fn no_value_can_end_its_literal() {
        assert_eq!(
            fill(
                "UPDATE t SET a = $2, b = $3 WHERE id = $1 AND n < $4 AND m = $10",
                &[
                    Text("k'; DROP TABLE t; --\\"),
                    Bytes(b"\x00'\\"),
                    Int8(i64::MIN),
                    Int4(7),
                    Int8(0),
                    Int8(0),
                    Int8(0),
                    Int8(0),
                    Int8(0),
                    Int8(9),
                ]
            ),
            "UPDATE t SET a = decode('00275c', 'hex'), b = (-9223372036854775808)::int8 \
             WHERE id = E'k''; DROP TABLE t; --\\\\' AND n < (7)::int4 AND m = (9)::int8"
        );
        assert_eq!(fill("SELECT $1", &[Bytes(b"")]), "SELECT decode('', 'hex')");
        assert_eq!(
            fill("SELECT $1, $1", &[Text("é\\x41\0🦀")]),
            "SELECT E'é\\\\x41\\000🦀', E'é\\\\x41\\000🦀'"
        );
    }

    #[test]
    fn a_dollar_that_is_no_parameter_of_the_values_is_left_as_it_is() {
        assert_eq!(
            fill("SELECT $2, $, $0, $x", &[Int4(1)]),
            "SELECT $2, $, $0, $x"
        );
    }
}
