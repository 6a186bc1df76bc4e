//! What the engine tells its observers ([`observe`](crate::observe)): how
//! each attempt was answered, at each entry point, and what it met on the
//! way.

use super::{outcome::Outcome, state::Engine};
use crate::{
    observe::{Answer, Event, Port},
    Error,
};
use std::time::Instant;

impl<St> Engine<St> {
    /// When an attempt starts, if anyone observes: the start of its
    /// [`Event::Answered`]'s `elapsed`.
    pub(crate) fn observed_start(&self) -> Option<Instant> {
        self.inner.observers.any().then(Instant::now)
    }

    /// Tells the observers, if any, of `event`.
    pub(crate) fn observe(&self, event: impl FnOnce() -> Event) {
        if self.inner.observers.any() {
            self.inner.observers.tell(event());
        }
    }

    /// Tells the observers how an attempt through `port`, started at
    /// `started`, was answered.
    pub(crate) fn report_answer<T, E>(
        &self,
        port: Port,
        started: Option<Instant>,
        result: &Result<Outcome<T>, Error<E>>,
    ) {
        if let Some(started) = started {
            let answer = match result {
                Ok(outcome) => Answer::Outcome(outcome.kind()),
                Err(error) => Answer::Error(error.kind()),
            };
            self.inner.observers.tell(Event::Answered {
                port,
                answer,
                elapsed: started.elapsed(),
            });
        }
    }
}
