//! Business-rule refusals: the SQLSTATEs and constraints an application
//! expects its own SQL to fail with, told apart from the unexpected. One
//! set of rules for both PostgreSQL stores: each driver's error says its
//! SQLSTATE, constraint and message through [`RefusalSource`].

use std::fmt;

/// The SQLSTATEs and constraint names that are business-rule refusals (a
/// balance check, a unique order number) rather than faults: an error that
/// matches is answered as the application chooses (a 409 or 422 with a
/// problem body, stored or not by the outcome policy like any other
/// response); anything else stays a fault.
///
/// ```
/// use lambda_idempotency::store::postgres::RefusalRules;
///
/// let rules = RefusalRules::new()
///     .constraint("accounts_balance_not_negative")
///     .sqlstate("23505"); // unique_violation
/// # let _ = rules;
/// ```
///
/// Inside the transaction ([`Engine::run_in_transaction`](crate::Engine::run_in_transaction)):
///
/// ```no_run
/// # use lambda_idempotency::store::postgres::{tokio_postgres, PgTransaction, RefusalRules};
/// # async fn pay(tx: PgTransaction, rules: &RefusalRules) -> Result<(u16, String), Box<dyn std::error::Error + Send + Sync>> {
/// let debit = tx
///     .execute("UPDATE accounts SET balance = balance - 1250 WHERE id = 'acct_1'", &[])
///     .await;
/// if let Err(error) = &debit {
///     if let Some(refusal) = rules.refusal(error) {
///         // Undo the handler's writes, keep the claim, store the answer.
///         tx.roll_back_writes().await?;
///         return Ok((409, format!("refused: {refusal}")));
///     }
/// }
/// debit?;
/// Ok((201, "paid".to_owned()))
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefusalRules {
    sqlstates: Vec<String>,
    constraints: Vec<String>,
}

impl RefusalRules {
    /// No refusals: every failure is a fault.
    pub fn new() -> Self {
        Self::default()
    }

    /// An error with this SQLSTATE (five characters, such as `23514`,
    /// `check_violation`, or `P0001`, a `RAISE EXCEPTION` of a function) is
    /// a refusal.
    #[must_use]
    pub fn sqlstate(mut self, code: impl Into<String>) -> Self {
        self.sqlstates.push(code.into());
        self
    }

    /// An error raised by this constraint (a `CHECK`, `UNIQUE`, foreign key
    /// or exclusion constraint, by name) is a refusal.
    #[must_use]
    pub fn constraint(mut self, name: impl Into<String>) -> Self {
        self.constraints.push(name.into());
        self
    }

    /// The refusal `error` is, if these rules name it; `None` for anything
    /// else (a fault). `error` is a `tokio_postgres::Error` (feature
    /// `postgres`) or a `sqlx::Error` (feature `sqlx-postgres`).
    pub fn refusal<E: RefusalSource + ?Sized>(&self, error: &E) -> Option<Refusal> {
        let (sqlstate, constraint, message) = error.server_error()?;
        let named = self.sqlstates.iter().any(|code| code == sqlstate)
            || constraint.is_some_and(|name| self.constraints.iter().any(|c| c == name));
        named.then(|| Refusal {
            sqlstate: sqlstate.to_owned(),
            constraint: constraint.map(str::to_owned),
            message: message.to_owned(),
        })
    }
}

/// A business-rule refusal [`RefusalRules`] recognised: what the database
/// said, for the application to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// The SQLSTATE, such as `23514`.
    pub sqlstate: String,
    /// The constraint that refused, when the error names one.
    pub constraint: Option<String>,
    /// The server's message.
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.constraint {
            Some(constraint) => write!(f, "{} ({constraint}): {}", self.sqlstate, self.message),
            None => write!(f, "{}: {}", self.sqlstate, self.message),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A PostgreSQL driver's error, as [`RefusalRules::refusal`] reads it:
/// implemented for `tokio_postgres::Error` (feature `postgres`) and
/// `sqlx::Error` (feature `sqlx-postgres`). Sealed.
pub trait RefusalSource: sealed::Sealed {
    /// The server's SQLSTATE, the constraint it names, and its message;
    /// `None` when the server did not refuse (the connection failed).
    fn server_error(&self) -> Option<(&str, Option<&str>, &str)>;
}

#[cfg(feature = "postgres")]
impl sealed::Sealed for tokio_postgres::Error {}

#[cfg(feature = "postgres")]
impl RefusalSource for tokio_postgres::Error {
    fn server_error(&self) -> Option<(&str, Option<&str>, &str)> {
        let db = self.as_db_error()?;
        Some((db.code().code(), db.constraint(), db.message()))
    }
}

#[cfg(feature = "sqlx-postgres")]
impl sealed::Sealed for sqlx::Error {}

#[cfg(feature = "sqlx-postgres")]
impl RefusalSource for sqlx::Error {
    fn server_error(&self) -> Option<(&str, Option<&str>, &str)> {
        let db = self
            .as_database_error()?
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
        Some((db.code(), db.constraint(), db.message()))
    }
}
