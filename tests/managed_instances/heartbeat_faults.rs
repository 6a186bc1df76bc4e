//! The heartbeat under Managed Instances when the store misbehaves: a
//! blip of failed extensions, extensions answered slowly, and a
//! `max_lease` under the shortest lease. A handler runs past its 1 s
//! deadline while retries keep coming; none may run beside it. (Found by
//! an outside review: each ran a retry beside the late first run while a
//! claim with the heartbeat was leased to its deadline, extended by what
//! was left then, and a failed beat was tried again only a third of that
//! later. Now its lease starts at and keeps the heartbeat's floor, 10 s.)

use super::*;
use lambda_idempotency::{
    store::{
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal,
        Store,
    },
    testing::CountingStore,
    StoreError, StoreErrorKind,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A store whose `extend` fails (a transient outage) or is slow while the
/// test says so; every other call goes straight through.
#[derive(Clone)]
struct Flaky<St> {
    inner: St,
    /// Extensions fail while this is set.
    failing: Arc<std::sync::atomic::AtomicBool>,
    /// Extensions take this long (ms) before they are made.
    slow_ms: Arc<std::sync::atomic::AtomicU64>,
    extends: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

impl<St> Flaky<St> {
    fn new(inner: St) -> Self {
        Self {
            inner,
            failing: Arc::default(),
            slow_ms: Arc::default(),
            extends: Arc::default(),
            failed: Arc::default(),
        }
    }
}

impl<St: Store> Store for Flaky<St> {
    type Write = St::Write;
    const SINGLE_WRITE: bool = St::SINGLE_WRITE;

    async fn commit(&self, commit: Commit<St::Write>) -> Result<Conditional, StoreError> {
        self.inner.commit(commit).await
    }
    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.inner.claim(claim).await
    }
    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.inner.take_over(claim, lapsed).await
    }
    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        let slow = self.slow_ms.load(Ordering::SeqCst);
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow)).await;
        }
        if self.failing.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::new(
                StoreErrorKind::Throttled,
                "review: throttled",
            ));
        }
        self.inner.extend(extension).await
    }
    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        self.inner.remove(id, removal).await
    }
    async fn complete(&self, completion: Completion<St::Write>) -> Result<Conditional, StoreError> {
        self.inner.complete(completion).await
    }
    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.inner.release(id, owner).await
    }
    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list_in_progress(prefix, limit).await
    }
    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        self.inner.get(id, now_ms).await
    }
}

/// Retries of `key` every `every`, from `from` after now until `until`,
/// each with a 1 s deadline; their statuses.
async fn retries(
    api: &RuntimeApi,
    key: &str,
    work: Duration,
    from: Duration,
    every: Duration,
    until: Duration,
) -> Vec<Option<(u64, bool)>> {
    let mut calls = Vec::new();
    let mut at = from;
    while at < until {
        calls.push(async move {
            tokio::time::sleep(at).await;
            api.invoke(charge_event(key, work), Duration::from_secs(1))
                .await
        });
        at += every;
    }
    futures::future::join_all(calls)
        .await
        .iter()
        .map(|r| match r {
            Reported::TimedOut => None,
            other => status_of(other),
        })
        .collect()
}

/// A handler that works `work` past its 1 s deadline on `store`'s engine
/// (built by `engine`), retried every `every` from 1.05 s until `until`,
/// while `meanwhile` runs: the most runs of the key at once, after both end.
async fn late_run_retried<St, F>(
    store: St,
    engine: impl FnOnce(St) -> Engine<St>,
    key: &str,
    work: Duration,
    every: Duration,
    until: Duration,
    meanwhile: F,
) -> usize
where
    St: Store,
    F: std::future::Future<Output = ()>,
{
    lambda_environment();
    let engine = engine(store);
    assert!(
        engine.has_heartbeat(),
        "on by default in a Managed Instance"
    );
    let api = RuntimeApi::start().await;
    let ledger = Ledger::default();
    let _runtime = start_layer(&api, IdempotencyLayer::new(engine), &ledger).await;
    let first = api.invoke(charge_event(key, work), Duration::from_secs(1));
    let retried = retries(&api, key, work, Duration::from_millis(1_050), every, until);
    let (_, (), statuses) = tokio::join!(first, meanwhile, retried);
    // Let a run that began late end before counting.
    tokio::time::sleep(work).await;
    eprintln!(
        "{key}: runs {}, most at once {}, retries {statuses:?}",
        ledger.started(key),
        ledger.most_at_once(key)
    );
    ledger.most_at_once(key)
}

/// A store blip of a second and a half (extensions throttled from 3 s to
/// 4.5 s, over the heartbeat's first beat at 3.3 s) while a handler runs
/// past its 1 s deadline: retries keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_blip_past_the_deadline_does_not_let_a_retry_run_beside_it() {
    let store = Flaky::new(MemoryStore::new());
    let failing = Arc::clone(&store.failing);
    let blip = async move {
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        failing.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        failing.store(false, Ordering::SeqCst);
    };
    let most = late_run_retried(
        store.clone(),
        |store| Engine::builder(store).build(),
        "blip",
        Duration::from_millis(5_000),
        Duration::from_millis(200),
        Duration::from_millis(5_000),
        blip,
    )
    .await;
    assert!(store.failed.load(Ordering::SeqCst) > 0, "extensions failed");
    assert_eq!(most, 1, "a retry ran beside the late first run");
}

/// No error at all: extensions that take 0.7 s each (a store slow under
/// load, an SDK retrying a throttle) while a handler runs past its 1 s
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_answered_slowly_do_not_let_a_retry_run_beside_it() {
    let store = Flaky::new(MemoryStore::new());
    store.slow_ms.store(700, Ordering::SeqCst);
    let most = late_run_retried(
        store.clone(),
        |store| Engine::builder(store).build(),
        "slow-extensions",
        Duration::from_millis(4_000),
        Duration::from_millis(100),
        Duration::from_millis(3_500),
        async {},
    )
    .await;
    assert!(
        store.extends.load(Ordering::SeqCst) > 0,
        "extensions were made"
    );
    assert_eq!(most, 1, "a retry ran beside the late first run");
}

/// `max_lease` under a third of the 1 s lease floor: each extension was
/// capped by it, under the lease the claim already had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_lease_under_a_second_does_not_defeat_the_heartbeat() {
    let most = late_run_retried(
        CountingStore::new(MemoryStore::new()),
        |store| {
            Engine::builder(store)
                .max_lease(Duration::from_millis(200))
                .build()
        },
        "short-max-lease",
        Duration::from_millis(3_000),
        Duration::from_millis(50),
        Duration::from_millis(2_500),
        async {},
    )
    .await;
    assert_eq!(most, 1, "a retry ran beside the late first run");
}

/// A process that dies mid-run: its heartbeat stops (every extension fails
/// from 2 s on, and the run never ends), and a retry in another process
/// finds the key in progress until the lease lapses, 10 s after the claim
/// (the heartbeat's floor), then takes it over and is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_process_dies_its_claim_lapses_one_lease_later_and_is_taken_over() {
    lambda_environment();
    let store = Flaky::new(MemoryStore::new());
    let dying = Engine::builder(store.clone()).build();
    let elsewhere = Engine::builder(store.inner.clone()).build();
    // An invocation's attempt: a deadline a second away.
    let deadline = std::time::SystemTime::now() + Duration::from_secs(1);
    let attempt = move || {
        lambda_idempotency::Attempt::new(
            "managed",
            "dies",
            lambda_idempotency::Fingerprint::of_bytes(b"dies"),
        )
        .deadline(deadline)
    };
    let claimed = Instant::now();
    let _dead = {
        let dying = dying.clone();
        tokio::spawn(async move {
            dying
                .execute(&attempt(), || async {
                    std::future::pending::<Result<u32, std::io::Error>>().await
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    store.failing.store(true, Ordering::SeqCst);
    let taken_over = loop {
        let retry = elsewhere
            .run(
                &attempt(),
                lambda_idempotency::Mode::Plain,
                &lambda_idempotency::Json,
                |handle: lambda_idempotency::ClaimHandle| async move {
                    let takeover = handle.takeover().map(|t| t.attempt);
                    Ok::<_, std::io::Error>((takeover, Vec::new()))
                },
            )
            .await;
        match retry {
            Err(lambda_idempotency::Error::InProgress { .. }) => {
                assert!(
                    claimed.elapsed() < Duration::from_secs(11),
                    "still in progress 11 s after the claim"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(outcome) => break outcome,
            Err(other) => panic!("{other:?}"),
        }
    };
    let at = claimed.elapsed();
    assert!(
        at >= Duration::from_millis(9_500),
        "taken over {at:?} after the claim, before its lease lapsed"
    );
    assert_eq!(taken_over.kind(), lambda_idempotency::OutcomeKind::Fresh);
    assert_eq!(
        *taken_over.value(),
        Some(2),
        "told it takes over the dead process's claim"
    );
    assert!(
        store.failed.load(Ordering::SeqCst) > 0,
        "the heartbeat tried"
    );
}
