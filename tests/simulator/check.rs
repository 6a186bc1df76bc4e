//! The invariants, checked on a finished history from the outside: from
//! what the operations did, what the store saw land (with the record
//! before and after), and what every attempt returned.

use crate::sim::{Answer, Ending, Event, History, Op, Way, PREFIX, SKEW_MS};
use lambda_idempotency::{
    store::{Conditional, Record, RecordId, Status},
    Fingerprint, OutcomeKind,
};
use std::collections::HashMap;

/// Two clocks differ by up to this much.
const TOLERANCE_MS: u64 = 2 * SKEW_MS;

/// A completion that landed.
#[derive(Debug, Clone)]
struct Landed {
    at_ms: u64,
    value: u64,
    fingerprint: Fingerprint,
    expiration_s: u64,
    /// The completing attempt's clock offset.
    skew: i64,
    effects: bool,
}

impl Landed {
    /// When its record expires, true time (the expiration is on the
    /// completer's clock).
    fn retained_until_ms(&self) -> u64 {
        (self.expiration_s as i64 * 1000 - self.skew) as u64
    }
}

/// An operation running.
#[derive(Debug, Clone)]
struct Running {
    att: usize,
    key: usize,
    claimed: bool,
}

#[derive(Debug, Default, Clone)]
struct PerAttempt {
    begin_clock_ms: Option<u64>,
    begin_at_ms: u64,
    /// The owner token of its claim, and the claim's attempt number.
    owner: Option<String>,
    claim_attempt: u32,
    claim_landed_at_ms: Option<u64>,
    execs: Vec<u64>,
    ended: Option<Ending>,
    /// What its operation was told: the takeover's attempt.
    told: Option<u32>,
    /// Where in the history its claim landed.
    claim_seq: usize,
    /// Its completion landed, and the answer it got said so.
    completion_confirmed: bool,
}

/// The heartbeat's lease floor (`engine::lease::HEARTBEAT_LEASE_FLOOR`,
/// documented on `EngineBuilder::heartbeat`).
const HEARTBEAT_LEASE_FLOOR_MS: u64 = 10_000;

/// The first invariant `history` breaks, said in a sentence.
pub fn check(history: &History) -> Result<(), String> {
    if let Some(hang) = &history.hung {
        return Err(format!("nothing hangs: {hang}"));
    }
    let config = &history.config;
    let max_lease_ms = config.max_lease_ms.max(1_000);
    let keys: HashMap<String, usize> = (0..config.keys)
        .map(|k| {
            (
                RecordId::new(PREFIX, "scope", &format!("k{k}"))
                    .as_str()
                    .to_owned(),
                k,
            )
        })
        .collect();
    let mut attempts = vec![PerAttempt::default(); history.attempts.len()];
    let mut owners: HashMap<String, usize> = HashMap::new();
    // The last lease each owner wrote (its clock) and when it landed.
    let mut leases: HashMap<String, u64> = HashMap::new();
    // The furthest lease each owner's writes have landed, and the request
    // (numbered as sent) that landed it.
    let mut furthest: HashMap<String, (usize, u64)> = HashMap::new();
    let mut lease_writes: Vec<Vec<(u64, String)>> = vec![Vec::new(); config.keys];
    let mut completions: Vec<Vec<Landed>> = vec![Vec::new(); config.keys];
    let mut current: Vec<Option<Record>> = vec![None; config.keys];
    let mut running: HashMap<u64, Running> = HashMap::new();
    // Where each key's record was completed.
    let mut completed_at: Vec<Vec<usize>> = vec![Vec::new(); config.keys];
    // Where a claim replaced an in-progress record whose retention passed.
    let mut expired_at: Vec<Vec<usize>> = vec![Vec::new(); config.keys];
    // The transactions that held each key: whose, from, and until (`None`
    // while open). A transaction's end may be logged twice (its client's,
    // and its COMMIT's landing): the last one counts.
    let mut holds: Vec<Vec<(usize, u64, Option<u64>)>> = vec![Vec::new(); config.keys];

    for (seq, entry) in history.entries.iter().enumerate() {
        let at = entry.at_ms;
        match &entry.event {
            // The steps' invariants are `steps.rs`'s.
            Event::Arrive { .. }
            | Event::Advance
            | Event::Crash { .. }
            | Event::StepEffect { .. }
            | Event::StepDone { .. } => {}
            Event::Held { att, key } => {
                let Some(&key) = keys.get(key.as_str()) else {
                    return Err(format!("a transaction held an unknown record {key}"));
                };
                holds[key].push((*att, at, None));
            }
            Event::Unheld { att, key } => {
                let Some(&key) = keys.get(key.as_str()) else {
                    return Err(format!("a transaction held an unknown record {key}"));
                };
                for hold in holds[key].iter_mut().filter(|hold| hold.0 == *att) {
                    hold.2 = Some(hold.2.map_or(at, |until| until.max(at)));
                }
            }
            Event::Begin { att, clock_ms } => {
                attempts[*att].begin_clock_ms = Some(*clock_ms);
                attempts[*att].begin_at_ms = at;
            }
            Event::Landed {
                req,
                att,
                op,
                before,
                after,
                answer,
                lost,
            } => {
                let Some(&key) = keys.get(op.id().as_str()) else {
                    return Err(format!("a write to an unknown record {}", op.id()));
                };
                // A completion the attempt was told landed is never given
                // back after it: the release would find nothing of its to
                // give back (or, on a store that did not fence it, delete
                // the completed record).
                match op {
                    Op::Release(..) if attempts[*att].completion_confirmed => {
                        return Err(format!(
                            "a claim is never given back after its completion landed: a{att} released k{key}"
                        ));
                    }
                    Op::Complete(_)
                        if lost.is_none()
                            && matches!(answer, Answer::Write(Conditional::Applied)) =>
                    {
                        attempts[*att].completion_confirmed = true;
                    }
                    _ => {}
                }
                if matches!(answer, Answer::Fault(..)) {
                    continue;
                }
                current[key] = after.clone();
                let applied = matches!(answer, Answer::Write(Conditional::Applied));
                if !applied {
                    continue;
                }
                let skew = history.attempts[*att].skew;
                let fenced = |owner: &str| -> Result<(), String> {
                    match before {
                        Some(b) if b.status == Status::InProgress && b.owner.as_str() == owner => {
                            Ok(())
                        }
                        _ => Err(format!(
                            "no fenced-out write lands: a{att}'s {} landed on a record it does not hold ({})",
                            op.name(),
                            before.as_ref().map_or("none".to_owned(), |b| format!(
                                "{} try {} of a{}",
                                b.status.as_str(),
                                b.attempt,
                                owners.get(b.owner.as_str()).map_or("?".to_owned(), |a| a.to_string())
                            ))
                        )),
                    }
                };
                match op {
                    Op::Claim(c) | Op::TakeOver(c, _) => {
                        if let Op::TakeOver(_, lapsed) = op {
                            match before {
                                Some(b)
                                    if b.status == Status::InProgress
                                        && b.owner == *lapsed
                                        && b.lease_until_ms.is_some_and(|l| l < c.now_ms) =>
                                {
                                    if c.attempt != b.attempt + 1 {
                                        return Err(format!(
                                            "a takeover counts attempts: a{att} took over attempt {} as attempt {}",
                                            b.attempt, c.attempt
                                        ));
                                    }
                                }
                                _ => {
                                    return Err(format!(
                                        "no fenced-out write lands: a{att}'s takeover landed on a claim that had not lapsed"
                                    ))
                                }
                            }
                        } else if before.as_ref().is_some_and(|b| !b.is_expired(c.now_ms)) {
                            return Err(format!(
                                "no fenced-out write lands: a{att}'s claim replaced a record that had not expired"
                            ));
                        } else if before
                            .as_ref()
                            .is_some_and(|b| b.status == Status::InProgress)
                        {
                            expired_at[key].push(seq);
                        }
                        // The lease is measured on the claimant's clock.
                        let true_clock = (at as i64 + skew) as u64;
                        if c.now_ms > true_clock
                            || c.lease_until_ms <= c.now_ms
                            || c.lease_until_ms > c.now_ms + max_lease_ms
                        {
                            return Err(format!(
                                "a lease is measured on the claimant's clock: a{att} claimed at {} (its clock reads {}) until {}, max lease {} ms",
                                crate::sim::ms(c.now_ms),
                                crate::sim::ms(true_clock),
                                crate::sim::ms(c.lease_until_ms),
                                max_lease_ms
                            ));
                        }
                        // With the heartbeat, a claim's lease starts at the
                        // heartbeat's floor (10 s, capped by max_lease),
                        // however near its deadline: a store that fails for
                        // a moment must not let it lapse under a run that
                        // goes on. (A durable execution's lease is its own.)
                        let info = &history.attempts[*att];
                        let floor_ms = HEARTBEAT_LEASE_FLOOR_MS.min(config.max_lease_ms);
                        if info.heartbeat
                            && info.way != Way::Split
                            && c.lease_until_ms < c.now_ms + floor_ms
                        {
                            return Err(format!(
                                "a heartbeat's claim starts at its floor: a{att} claimed at {} until {}, under {floor_ms} ms",
                                crate::sim::ms(c.now_ms),
                                crate::sim::ms(c.lease_until_ms)
                            ));
                        }
                        let owner = c.owner.as_str().to_owned();
                        furthest.insert(owner.clone(), (*req, c.lease_until_ms));
                        owners.insert(owner.clone(), *att);
                        leases.insert(owner.clone(), c.lease_until_ms);
                        lease_writes[key].push((at, owner.clone()));
                        let a = &mut attempts[*att];
                        a.owner = Some(owner);
                        a.claim_attempt = c.attempt;
                        a.claim_landed_at_ms = Some(at);
                        a.claim_seq = seq;
                    }
                    Op::Extend(e) => {
                        fenced(e.owner.as_str())?;
                        if e.lease_until_ms > e.now_ms + max_lease_ms {
                            return Err(format!(
                                "a lease is measured on the claimant's clock: a{att} extended to {} at {}",
                                crate::sim::ms(e.lease_until_ms),
                                crate::sim::ms(e.now_ms)
                            ));
                        }
                        // An extension asks for at least what its earlier
                        // ones asked (their answers may be lost after they
                        // landed); only one sent earlier and delivered late
                        // may land less, or a claim given back (a lease
                        // ended on purpose, before its own `now`).
                        let owner = e.owner.as_str().to_owned();
                        if let Some(&(by, furthest_ms)) = furthest.get(&owner) {
                            if e.lease_until_ms < furthest_ms
                                && e.lease_until_ms >= e.now_ms
                                && *req > by
                            {
                                return Err(format!(
                                    "an extension never shortens a lease it cannot see: a{att}'s #{req} to {} landed after #{by} to {}",
                                    crate::sim::ms(e.lease_until_ms),
                                    crate::sim::ms(furthest_ms)
                                ));
                            }
                        }
                        if furthest
                            .get(&owner)
                            .is_none_or(|&(_, l)| e.lease_until_ms > l)
                        {
                            furthest.insert(owner, (*req, e.lease_until_ms));
                        }
                        leases.insert(e.owner.as_str().to_owned(), e.lease_until_ms);
                        lease_writes[key].push((at, e.owner.as_str().to_owned()));
                    }
                    Op::Release(_, owner) => {
                        fenced(owner.as_str())?;
                    }
                    Op::Complete(c) => {
                        fenced(c.owner.as_str())?;
                        completed_at[key].push(seq);
                        let fingerprint = before
                            .as_ref()
                            .map(|b| b.fingerprint.clone())
                            .expect("fenced");
                        landed(
                            &mut completions[key],
                            Landed {
                                at_ms: at,
                                value: value_of(&c.response)?,
                                fingerprint,
                                expiration_s: c.expiration_s,
                                skew,
                                effects: !c.writes.is_empty(),
                            },
                            att,
                        )?;
                    }
                    Op::Commit(c) => {
                        completed_at[key].push(seq);
                        if before.as_ref().is_some_and(|b| b.is_live(c.now_ms)) {
                            return Err(format!(
                                "no fenced-out write lands: a{att}'s single write replaced a live record"
                            ));
                        }
                        owners.insert(c.owner.as_str().to_owned(), *att);
                        landed(
                            &mut completions[key],
                            Landed {
                                at_ms: at,
                                value: value_of(&c.response)?,
                                fingerprint: c.fingerprint.clone(),
                                expiration_s: c.expiration_s,
                                skew,
                                effects: !c.writes.is_empty(),
                            },
                            att,
                        )?;
                    }
                    Op::CommitTransaction(c) => {
                        // The claim, made in the transaction, and its
                        // completion land together: on no live record (the
                        // transaction held the key since its claim).
                        completed_at[key].push(seq);
                        if before.as_ref().is_some_and(|b| b.is_live(c.claim.now_ms)) {
                            return Err(format!(
                                "no fenced-out write lands: a{att}'s COMMIT replaced a live record"
                            ));
                        }
                        landed(
                            &mut completions[key],
                            Landed {
                                at_ms: at,
                                value: value_of(&c.completion.response)?,
                                fingerprint: c.claim.fingerprint.clone(),
                                expiration_s: c.completion.expiration_s,
                                skew,
                                // The operation wrote its effect in it.
                                effects: true,
                            },
                            att,
                        )?;
                    }
                    // A step is fenced as a completion is: `steps.rs`.
                    Op::Get(..) | Op::Peek(..) | Op::Step(_) | Op::Steps(..) => {}
                }
            }
            Event::Start {
                att,
                exec,
                key,
                takeover,
                claimed,
            } => {
                attempts[*att].execs.push(*exec);
                if *claimed {
                    let me = &attempts[*att];
                    let Some(landed_at) = me.claim_landed_at_ms else {
                        return Err(format!("a{att} ran under a claim that never landed"));
                    };
                    // Told it took over, with the attempt it is. A durable
                    // execution is not told (`SplitClaim::Ours` says
                    // nothing of a takeover): the attempt its claim wrote
                    // stands for it.
                    let takeover = if history.attempts[*att].way == Way::Split {
                        (me.claim_attempt > 1).then_some(me.claim_attempt)
                    } else {
                        *takeover
                    };
                    let told = takeover.unwrap_or(1);
                    if told != me.claim_attempt {
                        return Err(format!(
                            "a takeover is told so: a{att} runs as attempt {} but was told {:?}",
                            me.claim_attempt, takeover
                        ));
                    }
                    attempts[*att].told = takeover;
                    let lease_true = |a: usize| {
                        attempts[a]
                            .owner
                            .as_ref()
                            .and_then(|o| leases.get(o))
                            .map_or(0, |l| (*l as i64 - history.attempts[a].skew) as u64)
                    };
                    // Inside a transaction the key is held by the
                    // transaction's lock, not by a lease: no other claim
                    // lands while it is open, whatever the lease says.
                    let in_transaction = history.attempts[*att].way == Way::InTransaction;
                    if in_transaction {
                        let holding = holds[*key]
                            .iter()
                            .any(|(holder, _, until)| holder == att && until.is_none());
                        if !holding {
                            return Err(format!(
                                "an operation in a transaction runs while its transaction holds the key: a{att} does not"
                            ));
                        }
                    } else if at > lease_true(*att) + TOLERANCE_MS {
                        return Err(format!(
                            "an operation starts on a live lease: a{att} starts at {}, its lease ended at {}",
                            crate::sim::ms(at),
                            crate::sim::ms(lease_true(*att))
                        ));
                    }
                    for other in running.values() {
                        if other.key != *key || !other.claimed {
                            continue;
                        }
                        // Of two overlapping executions, the later is the
                        // one whose claim landed later.
                        let them = &attempts[other.att];
                        let (early, late) = if them.claim_seq < attempts[*att].claim_seq {
                            (other.att, *att)
                        } else {
                            (*att, other.att)
                        };
                        let (e, l) = (&attempts[early], &attempts[late]);
                        let late_landed = l.claim_landed_at_ms.unwrap_or(0);
                        let between = |seq: &usize| (e.claim_seq..=l.claim_seq).contains(seq);
                        // After its record's retention, a claim is gone
                        // (RELIABILITY.md, "Retention is finite"), and so
                        // is a key completed since (a single write replaces
                        // a lapsed claim) whose retention has passed.
                        if completed_at[*key].iter().any(between)
                            || expired_at[*key].iter().any(between)
                        {
                            continue;
                        }
                        if l.told.is_none()
                            || l.claim_attempt <= e.claim_attempt
                            || late_landed + TOLERANCE_MS < lease_true(early)
                        {
                            return Err(format!(
                                "no two executions overlap: a{late} (attempt {}, told {:?}, claimed at {}) runs beside a{early} (attempt {}, claimed at {}, lease until {})",
                                l.claim_attempt,
                                l.told,
                                crate::sim::ms(late_landed),
                                e.claim_attempt,
                                crate::sim::ms(e.claim_landed_at_ms.unwrap_or(0)),
                                crate::sim::ms(lease_true(early))
                            ));
                        }
                    }
                    // A completed key does not run again within its retention.
                    for done in &completions[*key] {
                        if done.at_ms < landed_at
                            && landed_at + TOLERANCE_MS < done.retained_until_ms()
                        {
                            return Err(format!(
                                "a completed key never runs again within its retention: a{att} claimed k{key} at {}, completed at {} and kept until {}",
                                crate::sim::ms(landed_at),
                                crate::sim::ms(done.at_ms),
                                crate::sim::ms(done.retained_until_ms())
                            ));
                        }
                    }
                }
                running.insert(
                    *exec,
                    Running {
                        att: *att,
                        key: *key,
                        claimed: *claimed,
                    },
                );
            }
            Event::End { exec, .. } => {
                running.remove(exec);
            }
            Event::Done {
                att,
                ending,
                clock_ms: _,
            } => {
                let info = &history.attempts[*att];
                let me = &attempts[*att];
                let key = info.key;
                let fingerprint = Fingerprint::of_bytes(&[info.payload]);
                let ran = !me.execs.is_empty();
                match ending {
                    Ending::Ok { kind, value } => match kind {
                        OutcomeKind::Replay | OutcomeKind::CachedReplay => {
                            let Some(done) = completions[key].iter().find(|d| d.value == *value)
                            else {
                                return Err(format!(
                                    "every replay equals a stored response: a{att} replayed e{value}, never stored"
                                ));
                            };
                            if done.fingerprint != fingerprint {
                                return Err(format!(
                                    "every replay is of its own payload: a{att} got e{value}, stored for another payload"
                                ));
                            }
                            let begin = me.begin_clock_ms.unwrap_or(0);
                            if done.expiration_s < begin / 1000 {
                                return Err(format!(
                                    "a replay is of a live record: a{att} (its clock {}) replayed e{value}, expired at {}",
                                    crate::sim::ms(begin),
                                    crate::sim::ms(done.expiration_s * 1000)
                                ));
                            }
                            if ran && info.way != Way::SingleWrite {
                                return Err(format!("a replay runs nothing: a{att} ran and replayed"));
                            }
                        }
                        OutcomeKind::Fresh => {
                            if !me.execs.contains(value)
                                || !completions[key].iter().any(|d| d.value == *value)
                            {
                                return Err(format!(
                                    "a fresh outcome is this attempt's, stored: a{att} returned e{value}"
                                ));
                            }
                        }
                        OutcomeKind::LeaseLost | OutcomeKind::NotRecorded => {
                            if !me.execs.contains(value) {
                                return Err(format!(
                                    "an unstored outcome is this attempt's: a{att} returned e{value}"
                                ));
                            }
                        }
                        other => {
                            return Err(format!(
                                "every attempt ends typed: a{att} ended {other:?}, which this engine never gives"
                            ))
                        }
                    },
                    Ending::Store(kind) => {
                        if info.faults == 0 && info.conflicts == 0 {
                            return Err(format!(
                                "a store error has a cause: a{att} failed with {} and met no fault",
                                kind.as_str()
                            ));
                        }
                    }
                    Ending::Operation => {
                        if !ran {
                            return Err(format!("a{att} reported its operation's error, and ran none"));
                        }
                    }
                    Ending::InProgress if info.conflicts == 0 => {
                        if let Some(record) = &current[key] {
                            if record.status == Status::InProgress
                                && me.owner.as_deref() == Some(record.owner.as_str())
                                && me.claim_landed_at_ms.is_some()
                            {
                                return Err(format!(
                                    "an attempt is never refused by its own claim: a{att} was told in progress while it held k{key}"
                                ));
                            }
                        }
                        let since = me.begin_at_ms.saturating_sub(max_lease_ms + TOLERANCE_MS);
                        // Or a transaction of another attempt's held the key
                        // while this one ran.
                        let held = holds[key].iter().any(|(holder, from, until)| {
                            holder != att
                                && *from <= at
                                && until.is_none_or(|until| until + TOLERANCE_MS >= me.begin_at_ms)
                        });
                        let backed = held
                            || lease_writes[key].iter().any(|(t, owner)| {
                                *t >= since && owners.get(owner) != Some(att)
                            });
                        if !backed {
                            return Err(format!(
                                "a key in progress is held by a live lease: a{att} was told k{key} is in progress, and no lease was written since {}",
                                crate::sim::ms(since)
                            ));
                        }
                    }
                    Ending::WritesNotCommitted => {
                        return Err(format!(
                            "a{att}: writes not committed, from an engine that never fails open"
                        ))
                    }
                    Ending::TimeLimitExceeded if info.way != Way::InTransaction => {
                        return Err(format!(
                            "a{att}: a time limit exceeded, outside a transaction"
                        ))
                    }
                    Ending::InProgress
                    | Ending::KeyReused
                    | Ending::LeaseLost
                    | Ending::TimeLimitExceeded => {}
                }
                attempts[*att].ended = Some(ending.clone());
            }
        }
    }
    // Every attempt ends: it returned, or it crashed.
    for (att, a) in attempts.iter().enumerate() {
        let crashed = history
            .entries
            .iter()
            .any(|e| matches!(e.event, Event::Crash { att: c } if c == att));
        if a.ended.is_none() && !crashed {
            return Err(format!("every attempt ends: a{att} never returned"));
        }
    }
    Ok(())
}

/// Records a completion, after checking that its effects land once within
/// the retention of the last one.
fn landed(list: &mut Vec<Landed>, new: Landed, att: &usize) -> Result<(), String> {
    if new.effects {
        if let Some(old) = list
            .iter()
            .find(|old| old.effects && new.at_ms + TOLERANCE_MS < old.retained_until_ms())
        {
            return Err(format!(
                "effects land once: a{att}'s writes landed at {} after e{}'s at {}, kept until {}",
                crate::sim::ms(new.at_ms),
                old.value,
                crate::sim::ms(old.at_ms),
                crate::sim::ms(old.retained_until_ms())
            ));
        }
    }
    list.push(new);
    Ok(())
}

fn value_of(response: &[u8]) -> Result<u64, String> {
    #[derive(serde::Deserialize)]
    struct Receipt {
        exec: u64,
    }
    serde_json::from_slice::<Receipt>(response)
        .map(|r| r.exec)
        .map_err(|e| format!("a stored response does not decode: {e}"))
}
