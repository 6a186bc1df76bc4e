//! What an [`IdempotentEventLayer`](super::IdempotentEventLayer) is
//! configured with, shared by the services it makes.

use crate::{Engine, Fingerprint};
use std::sync::Arc;

pub(crate) type KeyFn<E> = Arc<dyn Fn(&E) -> Option<String> + Send + Sync>;
pub(crate) type FingerprintFn<E> =
    Arc<dyn Fn(&E) -> Result<Fingerprint, serde_json::Error> + Send + Sync>;

pub(crate) struct Config<St, E> {
    pub(crate) engine: Engine<St>,
    pub(crate) scope: Arc<str>,
    pub(crate) key: Option<KeyFn<E>>,
    pub(crate) fingerprint: FingerprintFn<E>,
    pub(crate) require_key: bool,
    /// The handler inside the store transaction that holds its claim,
    /// within these bounds.
    pub(crate) in_transaction: Option<crate::store::TransactionLimits>,
    /// How the handler's output is stored: as JSON, with what the user's
    /// redaction takes out.
    pub(crate) codec: crate::RedactedJson,
}

impl<St, E: serde::Serialize + 'static> Config<St, E> {
    /// The defaults: no key (every event refused until one is set), the
    /// whole event fingerprinted, key required.
    pub(crate) fn new(engine: Engine<St>, scope: Arc<str>) -> Self {
        Self {
            engine,
            scope,
            key: None,
            // An event that cannot be serialised is refused (see the
            // service), never fingerprinted by an error message that every
            // such event would share.
            fingerprint: Arc::new(|event: &E| Fingerprint::of_json(event)),
            require_key: true,
            in_transaction: None,
            codec: crate::RedactedJson::default(),
        }
    }
}

impl<St, E> Clone for Config<St, E> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            scope: Arc::clone(&self.scope),
            key: self.key.clone(),
            fingerprint: Arc::clone(&self.fingerprint),
            require_key: self.require_key,
            in_transaction: self.in_transaction,
            codec: self.codec.clone(),
        }
    }
}
