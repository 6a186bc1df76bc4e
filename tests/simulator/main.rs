//! A deterministic simulator of the protocol: the real engine, unchanged,
//! over a simulated store with the stores' faults, on a scheduler and a
//! virtual time that a seed drives (see `sim.rs`). Each history is checked
//! against the invariants in `check.rs`; a failing seed prints its history
//! and the command that replays it.
//!
//! - `cargo test --test simulator`: a bounded budget (`SIM_SEEDS`, 10,000
//!   seeds from `SIM_START`, 0 by default), as `make test` runs it;
//! - `make simulate`: as long as asked (`SIM_SECONDS`, or `SIM_SEEDS`),
//!   from a fresh start seed, with the rate;
//! - `SIM_SEED=… make simulate`: one history, printed.

mod check;
mod rng;
mod sim;
mod steps;

use sim::{Answer, Ending, Entry, Event, History, Op};
use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn simulated_histories_keep_every_invariant() {
    if let Some(seed) = env("SIM_SEED") {
        let history = sim::run(seed);
        println!("{}", render(seed, &history));
        if let Err(broken) = check::check(&history) {
            panic!("seed {seed}: {broken}");
        }
        println!("seed {seed}: every invariant holds");
        return;
    }
    let seconds = env("SIM_SECONDS");
    let budget = env("SIM_SEEDS").unwrap_or(if seconds.is_some() { u64::MAX } else { 10_000 });
    let start = env("SIM_START").unwrap_or(0);
    let deadline = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let began = Instant::now();
    let mut runs = 0u64;
    let mut events = 0u64;
    let mut replayed_in_process = 0usize;
    let mut committed = 0usize;
    for seed in start..start.saturating_add(budget) {
        if deadline.is_some_and(|d| runs.is_multiple_of(256) && Instant::now() >= d) {
            break;
        }
        let history = sim::run(seed);
        events += history.entries.len() as u64;
        replayed_in_process += replays_in_process(&history);
        committed += transactions_committed(&history);
        runs += 1;
        if let Err(broken) = check::check(&history) {
            panic!(
                "{}\nseed {seed} broke an invariant after {runs} histories: {broken}\nreplay it: SIM_SEED={seed} make simulate",
                render(seed, &history)
            );
        }
    }
    let elapsed = began.elapsed().as_secs_f64();
    println!(
        "{runs} histories (seeds {start}..{}), {events} events, in {elapsed:.1} s: {:.0} histories a minute; {replayed_in_process} replays waited for in process; {committed} transactions committed; every invariant held",
        start + runs,
        runs as f64 * 60.0 / elapsed
    );
    if runs >= 1_000 {
        assert!(
            replayed_in_process > 0,
            "some duplicates waited on a run in their process"
        );
        assert!(committed > 0, "some runs inside a transaction committed");
    }
}

/// The transactions of `history` whose COMMIT landed.
fn transactions_committed(history: &History) -> usize {
    history
        .entries
        .iter()
        .filter(|entry| {
            matches!(
                &entry.event,
                Event::Landed {
                    op: Op::CommitTransaction(_),
                    answer: Answer::Write(_),
                    ..
                }
            )
        })
        .count()
}

/// Attempts of `history` replayed without a store call of their own: they
/// waited on a run of their key in their process.
fn replays_in_process(history: &History) -> usize {
    let asked: std::collections::HashSet<usize> = history
        .entries
        .iter()
        .filter_map(|entry| match &entry.event {
            Event::Landed { att, .. } => Some(*att),
            _ => None,
        })
        .collect();
    history
        .entries
        .iter()
        .filter(|entry| {
            matches!(
                &entry.event,
                Event::Done {
                    att,
                    ending: Ending::Ok {
                        kind: lambda_idempotency::OutcomeKind::Replay,
                        ..
                    },
                    ..
                } if !asked.contains(att)
            )
        })
        .count()
}

/// The same, with every engine reading before it claims
/// (`EngineBuilder::read_before_claim`), over a store whose reads before a
/// claim miss a record that is there three times in ten (stale):
/// `SIM_READ_FIRST_SEEDS` seeds (2,000 by default) from `SIM_START`.
#[test]
fn histories_with_a_read_before_each_claim_keep_every_invariant() {
    let budget = env("SIM_READ_FIRST_SEEDS").unwrap_or(2_000);
    let start = env("SIM_START").unwrap_or(0);
    let mut peeks = 0usize;
    for seed in start..start.saturating_add(budget) {
        let history = sim::run_with(
            seed,
            sim::Options {
                read_before_claim: true,
                ..Default::default()
            },
        );
        peeks += history
            .entries
            .iter()
            .filter(|entry| {
                matches!(
                    &entry.event,
                    Event::Landed {
                        op: Op::Peek(..),
                        ..
                    }
                )
            })
            .count();
        if let Err(broken) = check::check(&history) {
            panic!(
                "{}\nseed {seed} (reading before each claim) broke an invariant: {broken}",
                render(seed, &history)
            );
        }
    }
    assert!(peeks > 0, "the engines read before their claims");
    println!("{budget} histories reading before each claim ({peeks} reads): every invariant held");
}

/// The same, with two attempts in five durable executions (`split::claim`,
/// `split::complete`, `split::release`, each step tried again under the
/// execution's token, as the durable crate's are) beside the engine's
/// other runs: `SIM_SPLIT_SEEDS` seeds (2,000 by default) from
/// `SIM_START`. `SIM_SEED` with `SIM_SPLIT=1` prints one.
#[test]
fn histories_with_durable_executions_keep_every_invariant() {
    let options = sim::Options {
        split_executions: true,
        ..Default::default()
    };
    if let (Some(seed), Some(1)) = (env("SIM_SEED"), env("SIM_SPLIT")) {
        let history = sim::run_with(seed, options);
        println!("{}", render(seed, &history));
        if let Err(broken) = check::check(&history) {
            panic!("seed {seed} (durable executions): {broken}");
        }
        return;
    }
    let budget = env("SIM_SPLIT_SEEDS").unwrap_or(2_000);
    let start = env("SIM_START").unwrap_or(0);
    let (mut completed, mut taken_over) = (0usize, 0usize);
    for seed in start..start.saturating_add(budget) {
        let history = sim::run_with(seed, options);
        let split = |att: &usize| history.attempts[*att].way == sim::Way::Split;
        for entry in &history.entries {
            match &entry.event {
                Event::Done {
                    att,
                    ending:
                        Ending::Ok {
                            kind: lambda_idempotency::OutcomeKind::Fresh,
                            ..
                        },
                    ..
                } if split(att) => completed += 1,
                Event::Landed {
                    att,
                    op: Op::TakeOver(..),
                    answer: Answer::Write(lambda_idempotency::store::Conditional::Applied),
                    ..
                } if split(att) => taken_over += 1,
                _ => {}
            }
        }
        if let Err(broken) = check::check(&history) {
            panic!(
                "{}\nseed {seed} (durable executions) broke an invariant: {broken}\nreplay it: SIM_SEED={seed} SIM_SPLIT=1 cargo test --test simulator histories_with_durable",
                render(seed, &history)
            );
        }
    }
    if budget >= 1_000 {
        assert!(completed > 0, "some durable executions completed");
        assert!(
            taken_over > 0,
            "some durable executions took a lapsed claim over"
        );
    }
    println!("{budget} histories with durable executions ({completed} completed, {taken_over} takeovers): every invariant held");
}

/// The same, with the plain runs' work done in steps
/// (`ClaimHandle::step`, recovery points), checked against the step
/// invariants too (`steps.rs`): `SIM_STEPS_SEEDS` seeds (2,000 by
/// default) from `SIM_START`. `SIM_SEED` with `SIM_STEPS=1` prints one.
#[test]
fn histories_with_steps_keep_every_invariant() {
    let options = sim::Options {
        steps: true,
        ..Default::default()
    };
    let check = |seed: u64, history: &History| -> Result<steps::Counts, String> {
        check::check(history)?;
        steps::check(history).map_err(|broken| format!("seed {seed} (steps): {broken}"))
    };
    if let (Some(seed), Some(1)) = (env("SIM_SEED"), env("SIM_STEPS")) {
        let history = sim::run_with(seed, options);
        println!("{}", render(seed, &history));
        if let Err(broken) = check(seed, &history) {
            panic!("seed {seed} (steps): {broken}");
        }
        return;
    }
    let budget = env("SIM_STEPS_SEEDS").unwrap_or(2_000);
    let start = env("SIM_START").unwrap_or(0);
    let mut total = steps::Counts::default();
    for seed in start..start.saturating_add(budget) {
        let history = sim::run_with(seed, options);
        match check(seed, &history) {
            Ok(counts) => {
                total.recorded += counts.recorded;
                total.refused += counts.refused;
                total.resumed += counts.resumed;
            }
            Err(broken) => panic!(
                "{}\nseed {seed} (steps) broke an invariant: {broken}\nreplay it: SIM_SEED={seed} SIM_STEPS=1 cargo test --test simulator histories_with_steps -- --nocapture",
                render(seed, &history)
            ),
        }
    }
    if budget >= 1_000 {
        assert!(total.recorded > 0, "some steps were recorded");
        assert!(total.refused > 0, "some step writes were refused");
        assert!(
            total.resumed > 0,
            "some takeovers resumed after recorded steps"
        );
    }
    println!(
        "{budget} histories in steps ({} steps recorded, {} step writes refused, {} takeovers resumed): every invariant held",
        total.recorded, total.refused, total.resumed
    );
}

#[test]
fn a_seed_replays_its_history_exactly() {
    for seed in 0..50 {
        let (first, second) = (sim::run(seed), sim::run(seed));
        assert_eq!(
            render(seed, &first),
            render(seed, &second),
            "seed {seed} gave two histories"
        );
    }
}

/// A history, one line an event.
fn render(seed: u64, history: &History) -> String {
    let c = &history.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "history of seed {seed}: retention {} s, default lease {} ms, max lease {} ms, {} key(s), faults {}% conflicts {}% lost answers {}%, outage {}",
        c.retention_s,
        c.default_lease_ms,
        c.max_lease_ms,
        c.keys,
        c.p_fault,
        c.p_conflict,
        c.p_lost,
        c.outage
            .map_or("none".to_owned(), |(a, b)| format!("{}..{}", sim::ms(a), sim::ms(b)))
    );
    for (i, p) in c.processes.iter().enumerate() {
        let _ = writeln!(
            out,
            "  process {i}: clock {:+} ms, heartbeat {}, cache {}",
            p.skew, p.heartbeat, p.cache
        );
    }
    for Entry { at_ms, event } in &history.entries {
        let line = match event {
            Event::Advance => continue,
            Event::Arrive {
                att,
                key,
                payload,
                process,
                way,
                clock_ms,
            } => format!(
                "a{att} arrives at process {process}: k{key} payload {payload} {way:?} (its clock {})",
                sim::ms(*clock_ms)
            ),
            Event::Begin { att, clock_ms } => {
                format!("a{att} enters the engine (its clock {})", sim::ms(*clock_ms))
            }
            Event::Landed {
                req,
                att,
                op,
                after,
                answer,
                lost,
                ..
            } => {
                let detail = match op {
                    Op::Claim(c) | Op::TakeOver(c, _) => format!(
                        " try {} now {} lease {}",
                        c.attempt,
                        sim::ms(c.now_ms),
                        sim::ms(c.lease_until_ms)
                    ),
                    Op::Extend(e) => format!(" to {}", sim::ms(e.lease_until_ms)),
                    _ => String::new(),
                };
                let lost = match lost {
                    Some(true) => ", answer lost: sent again",
                    Some(false) => ", answer lost: timed out",
                    None => "",
                };
                let state = match (answer, after) {
                    (Answer::Fault(..), _) => String::new(),
                    (_, Some(r)) => format!(
                        "  [k now {} try {} lease {}]",
                        r.status.as_str(),
                        r.attempt,
                        r.lease_until_ms.map_or("-".to_owned(), sim::ms)
                    ),
                    (_, None) => "  [k now absent]".to_owned(),
                };
                // A claim in a transaction crosses no simulated network.
                let req = if *req == usize::MAX {
                    "in its transaction".to_owned()
                } else {
                    format!("#{req}")
                };
                format!(
                    "a{att} {req} {}{detail} -> {}{lost}{state}",
                    op.name(),
                    answer.short()
                )
            }
            Event::Start {
                att,
                exec,
                key,
                takeover,
                claimed,
            } => format!(
                "a{att} RUNS e{exec} on k{key}{}{}",
                takeover.map_or(String::new(), |t| format!(", told takeover (attempt {t})")),
                if *claimed { "" } else { ", unclaimed" }
            ),
            Event::End { exec, crashed } => {
                format!("e{exec} {}", if *crashed { "dropped" } else { "returns" })
            }
            Event::Crash { att } => format!("a{att} CRASHES"),
            Event::StepEffect { att, key, step } => format!("a{att} step s{step} of k{key} acts"),
            Event::StepDone { att, key, step } => format!("a{att} step s{step} of k{key} done"),
            Event::Held { att, key } => format!("a{att}'s transaction holds {key}"),
            Event::Unheld { att, key } => format!("a{att}'s transaction ends: {key} free"),
            Event::Done {
                att,
                ending,
                clock_ms,
            } => match ending {
                Ending::Ok { kind, value } => format!(
                    "a{att} -> {} e{value} (its clock {})",
                    kind.as_str(),
                    sim::ms(*clock_ms)
                ),
                other => format!("a{att} -> {other:?} (its clock {})", sim::ms(*clock_ms)),
            },
        };
        let _ = writeln!(out, "  {:>7} {line}", sim::ms(*at_ms));
    }
    if let Some(hang) = &history.hung {
        let _ = writeln!(out, "  HUNG: {hang}");
    }
    out
}
