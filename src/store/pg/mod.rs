//! What the PostgreSQL stores share, whatever their driver (tokio-postgres
//! in [`postgres`](super::postgres), sqlx in `sqlx::postgres`): the table,
//! the SQL text of every statement, what each SQLSTATE means, and the
//! business-rule refusals. Both stores read and write the same records in
//! the same table, with the same statements, so that one can replace the
//! other (or both serve one table) without a migration.

// Each item is used by one store or both: with one feature, some are not.
#![cfg_attr(
    not(all(feature = "postgres", feature = "sqlx-postgres")),
    allow(dead_code)
)]

pub(crate) mod abandoned;
pub(crate) mod partitioned;
pub(crate) mod partitioning;
pub(crate) mod refusal;
pub(crate) mod sqlstate;
pub(crate) mod statements;
pub(crate) mod table;
pub(crate) mod table_size;
pub(crate) mod upkeep;

use crate::{StoreError, StoreErrorKind};

/// A time or count as PostgreSQL's `bigint`, refused before any statement
/// when it does not fit.
pub(crate) fn int8(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| {
        StoreError::new(
            StoreErrorKind::Rejected,
            format!("{value} does not fit PostgreSQL's bigint; nothing was written"),
        )
    })
}

/// How many connections a pool of `max_size` lacks for `at_once`
/// transactions of the in-transaction form; `None` when it has enough.
pub(crate) fn shortfall(max_size: usize, at_once: usize) -> Option<usize> {
    at_once
        .max(1)
        .checked_sub(max_size)
        .filter(|short| *short > 0)
}

/// Warns that a pool of `max_size` connections is shorter than the
/// `at_once` transactions the in-transaction form may hold open (each
/// holds its connection until it commits, so the others wait for one and
/// answer 503 once the pool's wait runs out); the shortfall is returned.
pub(crate) fn warn_if_pool_short(max_size: usize, at_once: usize) -> Option<usize> {
    let short = shortfall(max_size, at_once)?;
    let needed = max_size + short;
    tracing::warn!(
        pool_max_size = max_size,
        needed,
        transactions_at_once = at_once,
        "the PostgreSQL pool is smaller than the transactions the in-transaction form may hold \
         open at once (concurrent invocations, AWS_LAMBDA_MAX_CONCURRENCY under Lambda Managed \
         Instances, times the transactions each runs): handlers will wait for a connection, \
         one after another, and answer 503 once the pool's wait runs out; make the pool's \
         max_size at least {needed}"
    );
    Some(short)
}

/// The savepoint after the claim: `roll_back_writes` returns to it.
pub(crate) const HANDLER_SAVEPOINT: &str = "lambda_idempotency_handler";

/// The statements that open a transaction bounded by `limits`, in one
/// round trip. Numbers, formatted into the SQL: `SET` takes no parameters.
/// All of it `LOCAL`, so nothing outlives the transaction (PgBouncer in
/// transaction mode hands the server connection on at `COMMIT`).
pub(crate) fn begin_bounded(limits: &crate::store::TransactionLimits) -> String {
    use crate::store::transaction::bounded_ms;
    let time_limit_ms = bounded_ms(limits.time_limit_value());
    format!(
        "BEGIN; SET LOCAL lock_timeout = {claim_wait}; \
         SET LOCAL statement_timeout = {statement}; \
         SET LOCAL idle_in_transaction_session_timeout = {idle}",
        claim_wait = bounded_ms(limits.claim_wait_value()),
        statement = time_limit_ms,
        idle = time_limit_ms + 1_000,
    )
}

/// Once the claim is the transaction's: the operation's own locks wait as
/// the server's setting says (the claim waited only as long as a duplicate
/// may), and a savepoint marks where its writes begin.
pub(crate) fn hold_statement() -> String {
    format!("SET LOCAL lock_timeout TO DEFAULT; SAVEPOINT {HANDLER_SAVEPOINT}")
}

/// Undoes the operation's statements, keeping the claim.
pub(crate) fn roll_back_writes_statement() -> String {
    format!("ROLLBACK TO SAVEPOINT {HANDLER_SAVEPOINT}")
}

/// What a completion inside the transaction says when a statement of the
/// operation failed (`25P02`) and the operation returned a value anyway.
pub(crate) const FAILED_TRANSACTION: &str = "25P02";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_short_when_more_transactions_may_be_open_at_once() {
        assert_eq!(shortfall(2, 1), None);
        assert_eq!(shortfall(2, 8), Some(6));
        assert_eq!(shortfall(8, 8), None);
        assert_eq!(shortfall(8, 64), Some(56));
        assert_eq!(shortfall(1, 0), None, "one at least");
        assert_eq!(shortfall(1, usize::MAX), Some(usize::MAX - 1));
    }
}
