//! How an operation's outcome is committed.

/// How [`Engine::run`](crate::Engine::run) commits an operation's outcome,
/// and what it does when it cannot. (An operation whose only effects are
/// its writes can also skip the claim:
/// [`Engine::run_single_write`](crate::Engine::run_single_write).)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// The value is stored after the operation ran. If it cannot be (the
    /// store failed, or the lease passed and the key was taken over), the
    /// value is still returned, as
    /// [`OutcomeKind::NotRecorded`](crate::OutcomeKind::NotRecorded) or
    /// [`OutcomeKind::LeaseLost`](crate::OutcomeKind::LeaseLost): the
    /// operation's effects happened, and hiding its value would not undo
    /// them. An engine that fails open runs the operation unprotected when
    /// the store is down.
    #[default]
    Plain,
    /// The operation's effects are the writes it returns, committed in one
    /// transaction with the completion: all or nothing. An outcome that
    /// cannot be stored is an error
    /// ([`Error::LeaseLost`](crate::Error::LeaseLost),
    /// [`Error::Store`](crate::Error::Store)), since its writes did not
    /// happen either; the engine never fails open, since the writes need
    /// the store.
    Transactional,
}
