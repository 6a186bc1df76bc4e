//! The recovery points' invariants (`ClaimHandle::step`), checked on a
//! finished history beside `check.rs`'s:
//!
//! 1. a recorded step's effect never repeats within the record's
//!    retention, by an attempt that holds the record (a zombie, whose claim
//!    was taken over, may act before it learns so: fencing stops its
//!    writes, not its effects, as for any operation);
//! 2. a takeover never skips a step that did not finish: a completion by a
//!    run in steps lands only once each of its steps has finished, in its
//!    record's lineage (since the fresh claim that began it);
//! 3. a zombie's late step write never lands: a step lands only on a record
//!    in progress under its writer's token.

use crate::sim::{Answer, Event, History, Op, PREFIX, SKEW_MS};
use lambda_idempotency::store::{Conditional, OwnerToken, Record, RecordId, Status};
use std::collections::{HashMap, HashSet};

/// Two clocks differ by up to this much.
const TOLERANCE_MS: u64 = 2 * SKEW_MS;

/// What the step histories did, to show the invariants were put to work.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Step writes that landed.
    pub recorded: usize,
    /// Step writes refused (by a successor's record, a completed one, or
    /// their own landed retry).
    pub refused: usize,
    /// Reads of the steps that found some: takeovers that resumed.
    pub resumed: usize,
}

/// The first step invariant `history` breaks, or what it did.
pub fn check(history: &History) -> Result<Counts, String> {
    let config = &history.config;
    let keys: HashMap<String, usize> = (0..config.keys)
        .map(|k| {
            let id = RecordId::new(PREFIX, "scope", &format!("k{k}"));
            (id.as_str().to_owned(), k)
        })
        .collect();
    let mut counts = Counts::default();
    // The record of each key, as the last landing left it.
    let mut current: Vec<Option<Record>> = vec![None; config.keys];
    // Each attempt's claim token, once its claim landed.
    let mut owner_of: HashMap<usize, OwnerToken> = HashMap::new();
    // The steps recorded on each key, and until when (true time) the
    // record that holds them is retained.
    let mut recorded: Vec<HashMap<String, u64>> = vec![HashMap::new(); config.keys];
    // The steps finished in each key's lineage.
    let mut finished: Vec<HashSet<usize>> = vec![HashSet::new(); config.keys];

    for entry in &history.entries {
        let at = entry.at_ms;
        match &entry.event {
            Event::StepEffect { att, key, step } => {
                let holds = match (&current[*key], owner_of.get(att)) {
                    (Some(record), Some(owner)) => {
                        record.status == Status::InProgress && record.owner == *owner
                    }
                    _ => false,
                };
                if let Some(&until_ms) = recorded[*key].get(&format!("s{step}")) {
                    if holds && at + TOLERANCE_MS < until_ms {
                        return Err(format!(
                            "a recorded step's effect never repeats within the retention: a{att} acted on step s{step} of k{key}, recorded before and retained until {}",
                            crate::sim::ms(until_ms)
                        ));
                    }
                }
            }
            Event::StepDone { key, step, .. } => {
                finished[*key].insert(*step);
            }
            Event::Landed {
                req,
                att,
                op,
                before,
                after,
                answer,
                ..
            } => {
                let Some(&key) = keys.get(op.id().as_str()) else {
                    continue;
                };
                if matches!(answer, Answer::Fault(..)) {
                    continue;
                }
                current[key] = after.clone();
                if let (Op::Steps(..), Answer::Steps(steps)) = (op, answer) {
                    if !steps.is_empty() {
                        counts.resumed += 1;
                    }
                }
                let applied = matches!(answer, Answer::Write(Conditional::Applied));
                if let Op::Step(_) = op {
                    if !applied {
                        counts.refused += 1;
                    }
                }
                if !applied {
                    continue;
                }
                let skew = history.attempts[*att].skew;
                match op {
                    Op::Claim(c) => {
                        owner_of.insert(*att, c.owner.clone());
                        // A fresh record: a lineage begins. Not a claim
                        // inside a transaction (`req` none): it may roll
                        // back, and the record it replaced comes back (with
                        // no landing here to say so; `current` is stale
                        // until the record's next landing, and the first
                        // invariant is not checked meanwhile).
                        if *req != usize::MAX {
                            finished[key].clear();
                        }
                    }
                    Op::TakeOver(c, _) => {
                        owner_of.insert(*att, c.owner.clone());
                    }
                    Op::Step(step) => {
                        let held = before.as_ref().is_some_and(|b| {
                            b.status == Status::InProgress && b.owner == step.owner
                        });
                        if !held {
                            return Err(format!(
                                "a zombie's late step write never lands: a{att}'s step {} landed on a record it does not hold",
                                step.name
                            ));
                        }
                        counts.recorded += 1;
                        let expiration_s = after.as_ref().map_or(0, |r| r.expiration_s);
                        let until_ms = (expiration_s as i64 * 1000 - skew) as u64;
                        recorded[key].insert(step.name.clone(), until_ms);
                    }
                    Op::Complete(_) => {
                        let steps = history.attempts[*att].steps;
                        if let Some(skipped) = (0..steps).find(|s| !finished[key].contains(s)) {
                            return Err(format!(
                                "a takeover never skips a step that did not finish: a{att} completed k{key} without step s{skipped} having finished"
                            ));
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Ok(counts)
}
