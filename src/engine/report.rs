//! What the engine tells its observers ([`observe`](crate::observe)): how
//! each attempt was answered, at each entry point, and what it met on the
//! way.

use super::{attempt::Attempt, outcome::Outcome, state::Engine};
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

    /// Tells the observers how `attempt`, started at `started`, was
    /// answered (unless its port reports it).
    pub(crate) fn report_answer<T, E>(
        &self,
        attempt: &Attempt<'_>,
        started: Option<Instant>,
        result: &Result<Outcome<T>, Error<E>>,
    ) {
        let port = attempt.port;
        if let (Some(started), true) = (started, attempt.reported) {
            let answer = match result {
                Ok(outcome) => Answer::Outcome(outcome.kind()),
                Err(error) => Answer::Error(error.kind()),
            };
            self.report(port, started, answer);
        }
    }

    /// Tells the observers that an attempt through `port`, started at
    /// `started`, was answered with `answer`: for the answers given outside
    /// the engine's runs (a durable execution's, the Powertools mode's).
    pub(crate) fn report(&self, port: Port, started: Instant, answer: Answer) {
        self.inner.observers.tell(Event::Answered {
            port,
            answer,
            elapsed: started.elapsed(),
        });
    }
}
