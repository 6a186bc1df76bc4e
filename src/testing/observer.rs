//! An observer that keeps every event, for tests that check what was
//! reported.

use crate::observe::{Event, Observer, Port};
use std::sync::{Arc, Mutex, PoisonError};

/// Keeps every [`Event`] it is told, in order; clones share them.
///
/// ```
/// use lambda_idempotency::{testing::RecordingObserver, Attempt, Engine, Fingerprint, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let observer = RecordingObserver::default();
/// let engine = Engine::builder(MemoryStore::new()).observer(observer.clone()).build();
/// let attempt = Attempt::new("charges", "k1", Fingerprint::of_bytes(b"{}"));
/// for _ in 0..2 {
///     engine.execute(&attempt, || async { Ok::<_, ()>(1) }).await.unwrap();
/// }
/// assert_eq!(observer.answers(), [("engine", "fresh"), ("engine", "replay")]);
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct RecordingObserver {
    events: Arc<Mutex<Vec<Event>>>,
}

impl RecordingObserver {
    /// Every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Each answer so far, as its port's name and its own.
    pub fn answers(&self) -> Vec<(&'static str, &'static str)> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                Event::Answered { port, answer, .. } => Some((port.as_str(), answer.as_str())),
                _ => None,
            })
            .collect()
    }

    /// Each store call so far, as its operation's name and its result
    /// (`ok`, or the error's kind).
    pub fn store_calls(&self) -> Vec<(&'static str, &'static str)> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                Event::StoreCalled {
                    operation, failed, ..
                } => Some((
                    operation.as_str(),
                    failed.map_or("ok", crate::StoreErrorKind::as_str),
                )),
                _ => None,
            })
            .collect()
    }

    /// The answers reported through `port`.
    pub fn answers_through(&self, port: Port) -> Vec<&'static str> {
        self.answers()
            .into_iter()
            .filter(|(name, _)| *name == port.as_str())
            .map(|(_, answer)| answer)
            .collect()
    }
}

impl Observer for RecordingObserver {
    fn observe(&self, event: &Event) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(*event);
    }
}
