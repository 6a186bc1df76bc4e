//! Duplicates racing on a Redis Cluster while it moves slots and fails
//! over: every slot of one primary migrates to another (`redis-cli
//! --cluster reshard`), the emptied primary becomes the other's replica,
//! and then takes its place (`CLUSTER FAILOVER`), all while waves of
//! concurrent duplicates claim, run and complete keys that hash to the
//! moving slots. One run per key, and every answer for a key the same.
//!
//! A binary of its own, so that no other test runs while slots move.
//! Needs `IDEMPOTENCY_TEST_REDIS_CLUSTER_URL` (`make test`, or
//! `scripts/with-redis cargo test --test redis_cluster_reshard`).

use lambda_idempotency::{
    store::redis::RedisStore,
    testing::scenarios::{payload, Declined},
    Attempt, ClaimHandle, Engine, Error, OutcomeKind,
};
use std::{
    collections::{HashMap, HashSet},
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

fn cluster_url() -> String {
    std::env::var("IDEMPOTENCY_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_REDIS_CLUSTER_URL is not set: run this test with `make test`, or \
             `scripts/with-redis cargo test --test redis_cluster_reshard`"
        )
    })
}

fn seed() -> String {
    cluster_url()
        .trim_start_matches("redis+cluster://")
        .to_owned()
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct Node {
    id: String,
    address: String,
    primary: bool,
    slots: Vec<(u16, u16)>,
}

impl Node {
    fn slot_count(&self) -> u32 {
        self.slots.iter().map(|(a, b)| u32::from(b - a) + 1).sum()
    }

    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }

    fn port(&self) -> String {
        self.address
            .rsplit_once(':')
            .map(|(_, port)| port.to_owned())
            .expect("host:port")
    }
}

fn redis_cli(args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli (Debian's redis-tools)");
    assert!(
        output.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn nodes() -> Vec<Node> {
    let seed = seed();
    let (host, port) = seed.rsplit_once(':').expect("host:port");
    redis_cli(&["-h", host, "-p", port, "cluster", "nodes"])
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let address = fields[1].split('@').next().expect("address").to_owned();
            let slots = fields[8..]
                .iter()
                .filter(|range| !range.starts_with('['))
                .map(|range| match range.split_once('-') {
                    Some((a, b)) => (a.parse().expect("slot"), b.parse().expect("slot")),
                    None => {
                        let slot = range.parse().expect("slot");
                        (slot, slot)
                    }
                })
                .collect();
            Node {
                id: fields[0].to_owned(),
                address,
                primary: fields[2].contains("master") && !fields[2].contains("fail"),
                slots,
            }
        })
        .collect()
}

/// Whether `replica` has caught up with its primary: the link is up and no
/// full sync is running (an operator checks as much before a failover).
fn in_sync(replica: &Node) -> bool {
    let info = redis_cli(&[
        "-h",
        "127.0.0.1",
        "-p",
        &replica.port(),
        "info",
        "replication",
    ]);
    info.contains("role:slave")
        && info.contains("master_link_status:up")
        && info.contains("master_sync_in_progress:0")
}

/// Moves every slot of `from` to `to`, waits for the emptied `from` to
/// become `to`'s replica, and fails over to it. Returns what it did.
fn reshard_then_fail_over(from: Node, to: Node) -> Vec<String> {
    let mut done = Vec::new();
    let slots = from.slot_count().to_string();
    redis_cli(&[
        "--cluster",
        "reshard",
        &seed(),
        "--cluster-from",
        &from.id,
        "--cluster-to",
        &to.id,
        "--cluster-slots",
        &slots,
        "--cluster-yes",
    ]);
    done.push(format!(
        "moved {slots} slots from {} to {}",
        from.address, to.address
    ));
    // An emptied primary follows the one that took its slots (Redis 7's
    // replica migration); then it can take over from it.
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if nodes().iter().any(|n| n.id == from.id && !n.primary) && in_sync(&from) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if in_sync(&from) {
        redis_cli(&["-h", "127.0.0.1", "-p", &from.port(), "cluster", "failover"]);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if nodes()
                .iter()
                .any(|n| n.id == from.id && n.primary && n.slot_count() > 0)
            {
                done.push(format!(
                    "failed over from {} to {}",
                    to.address, from.address
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    done
}

#[derive(Default)]
struct Tally {
    /// Runs of a first attempt, per key.
    runs: HashMap<String, usize>,
    /// Runs told they take over a lapsed claim, per key.
    takeovers: HashMap<String, usize>,
    /// Keys a caller was told of a failure for: the store failed, or the
    /// outcome was not recorded. Only these may be taken over.
    failed: HashSet<String>,
    /// What happened to each key, for the report of a failure.
    events: Vec<(String, String, Instant)>,
    answers: HashMap<String, Vec<u64>>,
    in_progress: usize,
    store_errors: Vec<String>,
}

impl Tally {
    /// Counts a run of `key`'s operation, as a first attempt or as a
    /// takeover, which the claim says.
    fn count_run(&mut self, key: &str) {
        let takeover = ClaimHandle::current().and_then(|claim| claim.takeover());
        let runs = match takeover {
            None => &mut self.runs,
            Some(_) => &mut self.takeovers,
        };
        *runs.entry(key.to_owned()).or_default() += 1;
        let what = format!("run, takeover {takeover:?}");
        self.events.push((key.to_owned(), what, Instant::now()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_race_through_a_resharding_and_a_failover() {
    let before = nodes();
    let mut primaries: Vec<Node> = before
        .iter()
        .filter(|n| n.primary && n.slot_count() > 0)
        .cloned()
        .collect();
    assert!(primaries.len() >= 2, "two primaries with slots: {before:?}");
    primaries.sort_by_key(|n| std::cmp::Reverse(n.slot_count()));
    let (from, to) = (primaries[0].clone(), primaries[1].clone());
    let moving_from = from.clone();

    let namespace = format!("reshard-{}:", std::process::id());
    // Three "execution environments", each with its own connections.
    let engines: Vec<_> = (0..3)
        .map(|_| {
            // A short lease: a claim whose answer was lost in a timeout
            // holds its key two seconds, not a minute.
            Engine::builder(
                RedisStore::open(&cluster_url())
                    .expect("url")
                    .namespace(&namespace),
            )
            .default_lease(Duration::from_secs(2))
            .build()
        })
        .collect();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let moving = Arc::new(AtomicBool::new(true));
    let runs_while_moving = Arc::new(AtomicUsize::new(0));

    let mover = {
        let moving = Arc::clone(&moving);
        tokio::task::spawn_blocking(move || {
            let done = reshard_then_fail_over(from, to);
            moving.store(false, Ordering::SeqCst);
            done
        })
    };

    let mut keys = Vec::new();
    let mut wave = 0;
    while moving.load(Ordering::SeqCst) || wave < 5 {
        let mut racers = Vec::new();
        for k in 0..24 {
            let key = format!("w{wave}-k{k}");
            keys.push(key.clone());
            for duplicate in 0..6 {
                let engine = engines[duplicate % engines.len()].clone();
                let (key, tally, moving, runs_while_moving) = (
                    key.clone(),
                    Arc::clone(&tally),
                    Arc::clone(&moving),
                    Arc::clone(&runs_while_moving),
                );
                racers.push(tokio::spawn(async move {
                    let attempt = Attempt::new("t", &key, payload(7));
                    let result = engine
                        .execute(&attempt, || async {
                            tally.lock().unwrap().count_run(&key);
                            if moving.load(Ordering::SeqCst) {
                                runs_while_moving.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(15)).await;
                            Ok::<_, Declined>(fastrand::u64(..))
                        })
                        .await;
                    let mut tally = tally.lock().unwrap();
                    match result {
                        Ok(outcome) => {
                            let what = format!("answer {} {:?}", outcome.value(), outcome.kind());
                            tally.events.push((key.clone(), what, Instant::now()));
                            if outcome.kind() == OutcomeKind::NotRecorded {
                                tally.failed.insert(key);
                            } else {
                                tally.answers.entry(key).or_default().push(*outcome.value());
                            }
                        }
                        Err(Error::InProgress { .. }) => tally.in_progress += 1,
                        Err(other) => {
                            let what = other.to_string();
                            tally
                                .events
                                .push((key.clone(), what.clone(), Instant::now()));
                            tally.failed.insert(key);
                            tally.store_errors.push(what);
                        }
                    }
                }));
            }
        }
        for racer in racers {
            racer.await.expect("racer");
        }
        wave += 1;
    }
    let done = mover.await.expect("mover");

    // Every key once more, on the settled cluster: a replay of the one run;
    // the first run of a key whose racers all met an error; or, where a
    // claim or a completion was lost in a timeout, a takeover once its
    // lease lapsed.
    for key in &keys {
        let attempt = Attempt::new("t", key, payload(7));
        let mut tries = 0;
        let outcome = loop {
            let result = engines[0]
                .execute(&attempt, || async {
                    tally.lock().unwrap().count_run(key);
                    Ok::<_, Declined>(fastrand::u64(..))
                })
                .await;
            match result {
                Err(Error::InProgress { retry_after }) if tries < 5 => {
                    tries += 1;
                    tokio::time::sleep(retry_after.min(Duration::from_secs(3))).await;
                }
                other => break other.expect("the settled cluster answers"),
            }
        };
        tally
            .lock()
            .unwrap()
            .answers
            .entry(key.clone())
            .or_default()
            .push(*outcome.value());
    }

    let mut seed_connection = redis::Client::open(format!("redis://{}", seed()))
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut moved_keys = 0;
    for key in &keys {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("{namespace}{}", engines[0].record_id("t", key)))
            .query_async(&mut seed_connection)
            .await
            .expect("CLUSTER KEYSLOT");
        if moving_from.owns(slot) {
            moved_keys += 1;
        }
    }
    let tally = tally.lock().unwrap();
    println!(
        "{done:?}; {wave} waves, {} keys ({moved_keys} on the moving slots), {} runs while slots moved, \
         {} answered in progress, {} store errors {:?}",
        keys.len(),
        runs_while_moving.load(Ordering::SeqCst),
        tally.in_progress,
        tally.store_errors.len(),
        tally.store_errors.iter().take(3).collect::<Vec<_>>(),
    );
    for key in &keys {
        let first = tally.runs.get(key).copied().unwrap_or(0);
        let taken_over = tally.takeovers.get(key).copied().unwrap_or(0);
        let events = || -> Vec<_> { tally.events.iter().filter(|e| &e.0 == key).collect() };
        assert!(first <= 1, "{key}: {first} first runs: {:?}", events());
        assert!(first + taken_over >= 1, "{key}: it ran");
        // A second run follows a failure a caller was told of, and is told
        // it takes over.
        assert!(
            taken_over == 0 || tally.failed.contains(key),
            "{key}: taken over without a failure: {:?}",
            events()
        );
        // Every recorded answer (fresh or replayed) is the stored run's.
        let answers = &tally.answers[key];
        assert!(
            answers.iter().all(|a| *a == answers[0]),
            "{key}: every answer the one stored run's: {:?}",
            events()
        );
    }
    assert!(
        done.len() == 2,
        "the cluster resharded and failed over: {done:?}"
    );
    assert!(moved_keys > 0, "some keys lived on the moving slots");
    assert!(
        runs_while_moving.load(Ordering::SeqCst) > 0,
        "duplicates raced while slots moved"
    );
}
