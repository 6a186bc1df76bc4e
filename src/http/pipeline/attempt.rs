//! One attempt through the engine, in the form the layer is configured
//! for.

use crate::{http::config::Config, store::Store, Attempt, ClaimHandle, Error};
use futures_util::future::Either;
use std::future::Future;

/// One attempt through the engine, as the layer is configured: inside the
/// store's transaction, in a single write, or claimed in its mode.
///
/// A plain function (see the pipeline's note): the engine's future is what
/// it returns, not a level that would hold it (and copy it whole into its
/// own as it awaits it).
pub(super) fn run_attempt<'a, St, T, E, C, R, F, Fut>(
    config: &'a Config<St>,
    attempt: &'a Attempt<'a>,
    codec: &'a C,
    refusal: R,
    operation: F,
) -> impl Future<Output = Result<crate::Outcome<T>, Error<E>>> + 'a
where
    St: Store,
    T: 'a,
    E: 'a,
    C: crate::Codec<T>,
    R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>> + 'a,
    F: FnOnce(ClaimHandle) -> Fut + 'a,
    Fut: std::future::Future<Output = Result<(T, Vec<St::Write>), E>> + 'a,
{
    // Set only on a store with transactions (`TransactionalStore`).
    if let Some(in_transaction) = &config.settings.in_transaction {
        return Either::Left(config.engine.transaction_run(
            attempt,
            in_transaction.limits,
            codec,
            refusal,
            operation,
        ));
    }
    let claimed = if config.settings.single_write {
        Either::Left(config.engine.single_write(attempt, codec, operation))
    } else {
        Either::Right(config.engine.run_with_refusals(
            attempt,
            config.settings.mode,
            codec,
            refusal,
            operation,
        ))
    };
    Either::Right(claimed)
}
