//! An adapter of your own, on the public entry point the crate's adapters
//! use: `Engine::run` with a `Mode`.
//!
//! Here the "framework" is a queue of commands, each with a message id;
//! the adapter makes the handler run once per id and turns every outcome
//! into the queue's own answer (done, retry later, dead-letter).
//!
//! `cargo run --example custom_adapter`

use lambda_idempotency::{
    store::Store, Attempt, Engine, Error, Fingerprint, Json, MemoryStore, Mode,
};
use serde::{Deserialize, Serialize};
use std::{
    future::Future,
    sync::atomic::{AtomicU32, Ordering},
};

/// A command as the queue delivers it.
#[derive(Debug, Clone, Serialize)]
struct Command {
    message_id: String,
    account: String,
    amount: u64,
}

/// What the handler returns; stored and replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    number: u32,
}

/// What the queue understands.
#[derive(Debug, PartialEq)]
enum Ack {
    /// Processed (now, or by an earlier delivery): delete the message.
    Done(Receipt),
    /// Try again later: another delivery holds the key, or the store is down.
    RetryLater,
    /// Never retry: the id was reused for another command.
    DeadLetter(&'static str),
}

/// The adapter: one call of `Engine::run` per delivery.
struct QueueAdapter<St> {
    engine: Engine<St>,
}

impl<St: Store> QueueAdapter<St> {
    async fn deliver<F, Fut>(&self, command: &Command, handler: F) -> Ack
    where
        F: FnOnce(Command) -> Fut,
        Fut: Future<Output = Result<Receipt, String>>,
    {
        let Ok(fingerprint) = Fingerprint::of_json(command) else {
            return Ack::DeadLetter("the command does not serialise");
        };
        // The scope says whose ids these are: one queue's message ids never
        // meet another's.
        let attempt = Attempt::new("commands", &command.message_id, fingerprint);
        let result = self
            .engine
            .run(&attempt, Mode::Plain, &Json, |claim| async move {
                // An earlier delivery claimed this id and died mid-way: it
                // may have acted. A real handler would look its effect up
                // (by a key derived from the id) before acting again.
                if let Some(takeover) = claim.takeover() {
                    println!(
                        "  attempt {} after a crash: reconcile first",
                        takeover.attempt
                    );
                }
                // No writes to commit with the completion: an empty Vec.
                handler(command.clone())
                    .await
                    .map(|receipt| (receipt, Vec::new()))
            })
            .await;
        match result {
            Ok(outcome) => Ack::Done(outcome.into_value()),
            Err(Error::KeyReused) => Ack::DeadLetter("message id reused for another command"),
            // In progress elsewhere, the store down, the handler's own
            // error (its claim was released): the queue redelivers.
            Err(_) => Ack::RetryLater,
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let adapter = QueueAdapter {
        engine: Engine::builder(MemoryStore::new()).build(),
    };
    let runs = AtomicU32::new(0);
    let handler = |command: Command| {
        let number = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            println!(
                "  handler runs: {} pays {}",
                command.account, command.amount
            );
            Ok(Receipt { number })
        }
    };

    let command = Command {
        message_id: "msg-1".into(),
        account: "acct-9".into(),
        amount: 1250,
    };
    println!("first delivery");
    let first = adapter.deliver(&command, handler).await;
    println!("  -> {first:?}");
    println!("redelivery");
    let again = adapter.deliver(&command, handler).await;
    println!("  -> {again:?} (nothing ran)");
    let reused = Command {
        amount: 1,
        ..command.clone()
    };
    println!("same id, another command");
    let rejected = adapter.deliver(&reused, handler).await;
    println!("  -> {rejected:?}");

    assert_eq!(first, Ack::Done(Receipt { number: 1 }));
    assert_eq!(again, first);
    assert!(matches!(rejected, Ack::DeadLetter(_)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
