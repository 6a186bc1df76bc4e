//! The partitioned layout (`partitioned` on `PostgresStore` and on
//! `SqlxPostgresStore`, the same option, table and SQL) against a real
//! server, on both drivers (the sqlx store in both its statement modes):
//! the conformance kit, directly and through PgBouncer; two
//! claims on either side of a day's boundary; the two windows; the
//! cleanup that drops whole days while claims go on; partitions made on
//! demand; and the seed's schema, which PostgreSQL refuses.

use super::{tokio_postgres_client, url, TABLES};
use lambda_idempotency::{
    store::{
        postgres::{PartitionCleanup, PartitionInfo, Partitioning, PostgresStore},
        sqlx::postgres::SqlxPostgresStore,
        Claim, Conditional, Extension, OwnerToken, Record, RecordId, Store,
    },
    testing::{
        scenarios::{charge, payload},
        ManualClock,
    },
    Attempt, Engine, OutcomeKind, StoreError, StoreErrorKind,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

const DAY_MS: u64 = 86_400_000;

tokio::task_local! {
    /// Set by the sqlx driver's `prepared` runs: its statements are
    /// prepared and cached per connection (`BEGIN` with the record's lock,
    /// the statement, `COMMIT`), where by default the lock and the
    /// statement go in one simple query.
    static PREPARED: bool;
}

/// What these tests ask of a PostgreSQL store, on either driver: the same
/// option, table and upkeep.
pub(crate) trait Driver: Store + Clone + Send + Sync + 'static {
    /// A store over `table` at `url` through a pool of `size`, in the
    /// partitioned layout where `partitioning` says so.
    fn open(url: &str, table: &str, size: u32, partitioning: Option<Partitioning>) -> Self;
    fn table(&self) -> &str;
    async fn create_table(&self) -> Result<(), StoreError>;
    async fn history(&self, id: &RecordId) -> Result<Vec<Record>, StoreError>;
    async fn drop_expired_partitions(&self, now_s: u64) -> Result<PartitionCleanup, StoreError>;
    async fn partitions(&self) -> Result<Vec<PartitionInfo>, StoreError>;
    async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError>;
}

impl Driver for PostgresStore {
    fn open(url: &str, table: &str, size: u32, partitioning: Option<Partitioning>) -> Self {
        let store = PostgresStore::connect(url, table, size as usize).expect("pool");
        match partitioning {
            Some(partitioning) => store.partitioned(partitioning),
            None => store,
        }
    }
    fn table(&self) -> &str {
        PostgresStore::table(self)
    }
    async fn create_table(&self) -> Result<(), StoreError> {
        PostgresStore::create_table(self).await
    }
    async fn history(&self, id: &RecordId) -> Result<Vec<Record>, StoreError> {
        PostgresStore::history(self, id).await
    }
    async fn drop_expired_partitions(&self, now_s: u64) -> Result<PartitionCleanup, StoreError> {
        PostgresStore::drop_expired_partitions(self, now_s).await
    }
    async fn partitions(&self) -> Result<Vec<PartitionInfo>, StoreError> {
        PostgresStore::partitions(self).await
    }
    async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError> {
        PostgresStore::purge_expired(self, now_s, batch).await
    }
}

impl Driver for SqlxPostgresStore {
    fn open(url: &str, table: &str, size: u32, partitioning: Option<Partitioning>) -> Self {
        let pool = super::sqlx_store::pool(url, size);
        let prepared = PREPARED.try_with(|prepared| *prepared).unwrap_or(false);
        let store = SqlxPostgresStore::new(pool, table)
            .expect("store")
            .prepared_statements(prepared);
        match partitioning {
            Some(partitioning) => store.partitioned(partitioning),
            None => store,
        }
    }
    fn table(&self) -> &str {
        SqlxPostgresStore::table(self)
    }
    async fn create_table(&self) -> Result<(), StoreError> {
        SqlxPostgresStore::create_table(self).await
    }
    async fn history(&self, id: &RecordId) -> Result<Vec<Record>, StoreError> {
        SqlxPostgresStore::history(self, id).await
    }
    async fn drop_expired_partitions(&self, now_s: u64) -> Result<PartitionCleanup, StoreError> {
        SqlxPostgresStore::drop_expired_partitions(self, now_s).await
    }
    async fn partitions(&self) -> Result<Vec<PartitionInfo>, StoreError> {
        SqlxPostgresStore::partitions(self).await
    }
    async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError> {
        SqlxPostgresStore::purge_expired(self, now_s, batch).await
    }
}

/// Runs each test (an `async fn` generic over the [`Driver`]) on the
/// tokio-postgres store, on the sqlx store, and on the sqlx store with
/// its statements prepared.
macro_rules! on_both_drivers {
    ($($test:ident),* $(,)?) => {
        mod tokio_postgres_store {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                super::$test::<lambda_idempotency::store::postgres::PostgresStore>().await
            })*
        }
        mod sqlx_store {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                super::$test::<lambda_idempotency::store::sqlx::postgres::SqlxPostgresStore>().await
            })*
        }
        mod sqlx_store_prepared {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                super::PREPARED
                    .scope(
                        true,
                        super::$test::<lambda_idempotency::store::sqlx::postgres::SqlxPostgresStore>(),
                    )
                    .await
            })*
        }
    };
}

/// A partitioned store over a fresh table of its own, at `url`.
async fn store_at<S: Driver>(url: &str, partitioning: Partitioning) -> S {
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("parted_{}_{n}", std::process::id());
    let store = S::open(url, &table, 8, Some(partitioning));
    store.create_table().await.expect("create table");
    store
}

async fn store<S: Driver>() -> S {
    store_at(&url(), Partitioning::daily()).await
}

/// A partitioned store whose every call fails fast as unavailable (a
/// closed port).
fn unavailable<S: Driver>() -> S {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    S::open(
        &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        "idempotency",
        1,
        Some(Partitioning::daily()),
    )
}

lambda_idempotency::store_conformance! {
    store: store::<PostgresStore>(),
    unavailable: async { unavailable::<PostgresStore>() },
    single_write,
}

/// The completer in the partitioned layout: a record is its id's newest
/// row.
mod abandoned {
    use super::*;

    lambda_idempotency::store_conformance! {
        abandoned: store::<PostgresStore>(),
    }
    lambda_idempotency::store_conformance! {
        abandoned_steps: store::<PostgresStore>(),
    }

    mod sqlx {
        use super::super::*;

        lambda_idempotency::store_conformance! {
            abandoned: store::<SqlxPostgresStore>(),
        }
        lambda_idempotency::store_conformance! {
            abandoned_steps: store::<SqlxPostgresStore>(),
        }
    }
}

mod through_pgbouncer {
    use super::*;

    lambda_idempotency::store_conformance! {
        store: store_at::<PostgresStore>(&super::super::pgbouncer_url(), Partitioning::daily()),
        unavailable: async { unavailable::<PostgresStore>() },
        single_write,
    }

    /// Recovery points through the pooler too, on both drivers.
    mod steps {
        use super::*;

        lambda_idempotency::store_conformance! {
            steps: store_at::<PostgresStore>(&super::super::super::pgbouncer_url(), Partitioning::daily()),
        }

        mod on_sqlx {
            use super::*;

            lambda_idempotency::store_conformance! {
                steps: store_at::<SqlxPostgresStore>(&super::super::super::super::pgbouncer_url(), Partitioning::daily()),
            }
        }
    }
}

/// The kit on the sqlx store: directly, with its statements prepared, and
/// through PgBouncer in transaction mode.
mod on_sqlx {
    use super::*;

    lambda_idempotency::store_conformance! {
        store: store::<SqlxPostgresStore>(),
        unavailable: async { unavailable::<SqlxPostgresStore>() },
        single_write,
    }

    mod prepared {
        use super::*;

        lambda_idempotency::store_conformance! {
            store: async { store::<SqlxPostgresStore>().await.prepared_statements(true) },
            unavailable: async { unavailable::<SqlxPostgresStore>() },
            single_write,
        }
    }

    mod through_pgbouncer {
        use super::*;

        lambda_idempotency::store_conformance! {
            store: store_at::<SqlxPostgresStore>(&super::super::super::pgbouncer_url(), Partitioning::daily()),
            unavailable: async { unavailable::<SqlxPostgresStore>() },
            single_write,
        }
    }
}

on_both_drivers!(
    claims_on_either_side_of_midnight_never_both_apply,
    a_retry_past_the_dedup_window_runs_and_the_audit_window_keeps_the_first,
    cleanup_drops_only_the_days_whose_every_record_expired_while_claims_go_on,
    a_missing_partition_never_fails_a_claim,
    each_layout_refuses_the_others_table,
    pg_partman_manages_the_partitioned_table,
    a_single_write_refuses_a_lapsed_claim_that_holds_a_response,
    a_detach_that_gives_up_leaves_the_connection_usable,
    the_table_size_sums_the_partitions,
);

fn claim(id: &RecordId, owner: &str, now_ms: u64) -> Claim {
    Claim {
        id: id.clone(),
        owner: OwnerToken::from_stored(owner),
        fingerprint: payload(1),
        now_ms,
        lease_until_ms: now_ms + 30_000,
        expiration_s: now_ms / 1000 + 3600,
        attempt: 1,
        first_started_ms: now_ms,
    }
}

/// Midnight UTC of a day a little ahead of today: its partition and the
/// one before it exist (made ahead), and the boundary is between them.
fn next_midnight_ms() -> u64 {
    let now = lambda_idempotency::testing::ManualClock::starting_now();
    use lambda_idempotency::Clock;
    (now.now_ms() / DAY_MS + 1) * DAY_MS
}

/// Claims for one key on either side of midnight race each other, eight
/// at a time (four in the last milliseconds of a day, four in the first
/// of the next, each at a time of its own): their rows would go to two
/// partitions, and nothing but the record's lock stops them all from
/// inserting (the primary key is `(id, claimed_at)`). Exactly one applies,
/// every round, on both drivers, directly and through PgBouncer in transaction
/// mode (sqlx with prepared statements: directly only); the
/// others are refused with the winner's record. (Without the lock, 27 and 62
/// claims applied beside another in two runs of 100 rounds.)
async fn claims_on_either_side_of_midnight_never_both_apply<S: Driver>() {
    const ROUNDS: usize = 100;
    const AT_ONCE: u64 = 8;
    // Named prepared statements do not go through PgBouncer before 1.21
    // (the sqlx store's docs): prepared, on the server only.
    let urls = match PREPARED.try_with(|prepared| *prepared) {
        Ok(true) => vec![url()],
        _ => vec![url(), super::pgbouncer_url()],
    };
    for url in urls {
        let store: S = store_at(&url, Partitioning::daily()).await;
        let midnight = next_midnight_ms();
        let mut extra_winners = 0;
        for round in 0..ROUNDS {
            let id = RecordId::new("p", "t", &format!("boundary-{round}"));
            let barrier = Arc::new(tokio::sync::Barrier::new(AT_ONCE as usize));
            let racers: Vec<_> = (0..AT_ONCE)
                .map(|n| {
                    let at = if n % 2 == 0 {
                        midnight - 1 - n
                    } else {
                        midnight + n
                    };
                    let claim = claim(&id, &format!("owner-{n}"), at);
                    let (store, barrier) = (store.clone(), Arc::clone(&barrier));
                    tokio::spawn(async move {
                        barrier.wait().await;
                        store.claim(&claim).await.expect("claim")
                    })
                })
                .collect();
            let mut answers = Vec::new();
            for racer in racers {
                answers.push(racer.await.expect("racer"));
            }
            let applied = answers
                .iter()
                .filter(|answer| **answer == Conditional::Applied)
                .count();
            extra_winners += applied.saturating_sub(1);
            if applied != 1 {
                continue;
            }
            for answer in answers.iter().filter(|a| **a != Conditional::Applied) {
                assert!(
                    matches!(answer, Conditional::Refused(Some(record)) if record.id == id),
                    "round {round}: a loser is told of the winner's record: {answer:?}"
                );
            }
        }
        assert_eq!(
            extra_winners, 0,
            "{url}: claims that applied beside another"
        );
        let client = tokio_postgres_client().await;
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM {}", store.table()), &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(rows, ROUNDS as i64, "one row a key");
    }
}

/// Both drivers on one partitioned table (either made it): what one
/// completes, the other replays; a claim held by one is in progress for
/// the other (they take the same record's lock); either's cleanup and
/// history see the other's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_drivers_share_one_partitioned_table() {
    let made_by_sqlx: SqlxPostgresStore = store().await;
    let table = made_by_sqlx.table().to_owned();
    let tokio_pg = PostgresStore::open(&url(), &table, 2, Some(Partitioning::daily()));
    tokio_pg
        .create_table()
        .await
        .expect("the same table, accepted");
    let clock = ManualClock::starting_now();
    let on_sqlx = Engine::builder(made_by_sqlx.clone())
        .clock(clock.clone())
        .retention(Duration::from_secs(3600))
        .build();
    let on_pg = Engine::builder(tokio_pg.clone())
        .clock(clock.clone())
        .retention(Duration::from_secs(3600))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let a = Attempt::new("t", "by-sqlx", payload(1));
    let first = on_sqlx.execute(&a, charge(&runs, 1)).await.expect("ran");
    let replay = on_pg.execute(&a, charge(&runs, 1)).await.expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value(), first.value());
    let b = Attempt::new("t", "by-tokio-postgres", payload(2));
    let first = on_pg.execute(&b, charge(&runs, 2)).await.expect("ran");
    let replay = on_sqlx
        .execute(&b, charge(&runs, 2))
        .await
        .expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value(), first.value());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A claim held by one driver is the other's in-progress answer.
    let now = clock_now(&clock);
    let id = RecordId::new("p", "t", "held");
    assert_eq!(
        tokio_pg.claim(&claim(&id, "pg", now)).await.expect("claim"),
        Conditional::Applied
    );
    match made_by_sqlx
        .claim(&claim(&id, "sqlx", now + 1))
        .await
        .expect("refused")
    {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, OwnerToken::from_stored("pg"))
        }
        other => panic!("expected the other driver's claim: {other:?}"),
    }

    // Past the dedup window, a retry through sqlx runs again; the history,
    // read by either driver, holds both rows.
    clock.advance(Duration::from_secs(2 * 86_400));
    let again = on_sqlx.execute(&b, charge(&runs, 2)).await.expect("ran");
    assert_eq!(again.kind(), OutcomeKind::Fresh);
    let record = on_pg.record_id("t", "by-tokio-postgres");
    let by_pg = tokio_pg.history(&record).await.expect("history");
    assert_eq!(by_pg.len(), 2, "{by_pg:?}");
    assert_eq!(made_by_sqlx.history(&record).await.expect("history"), by_pg);
    let days = |partitions: Vec<PartitionInfo>| {
        partitions
            .into_iter()
            .map(|p| (p.name, p.until_s))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        days(made_by_sqlx.partitions().await.expect("partitions")),
        days(tokio_pg.partitions().await.expect("partitions"))
    );
}

/// The seed's schema, `PRIMARY KEY (key)` on a table partitioned by
/// `created_at`, is refused by PostgreSQL itself: what the docs say.
#[tokio::test]
async fn the_seeds_partitioned_schema_is_refused_by_postgresql() {
    let client = tokio_postgres_client().await;
    let error = client
        .batch_execute(
            "CREATE TABLE seed_idempotency_keys (
                key TEXT NOT NULL,
                status TEXT NOT NULL DEFAULT 'pending',
                response JSONB,
                created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                expires_at TIMESTAMPTZ NOT NULL,
                PRIMARY KEY (key)
            ) PARTITION BY RANGE (created_at)",
        )
        .await
        .expect_err("a primary key without the partition column");
    let db = error.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "0A000", "{db:?}");
    assert!(
        db.message()
            .contains("must include all partitioning columns"),
        "{}",
        db.message()
    );
}

/// The windows: a 1-hour dedup window (the engine's retention) and a
/// 7-day audit window. Inside the first, a retry replays; past it and
/// inside the second, it runs as a new request, and the first record,
/// response and all, is still there for support beside the new one.
async fn a_retry_past_the_dedup_window_runs_and_the_audit_window_keeps_the_first<S: Driver>() {
    let store: S = store().await;
    // 01:00 UTC today, not now: the first record's expiry (an hour on)
    // then falls in today's partition at any time of day. From now, after
    // 23:00 it fell in tomorrow's, and the cleanup past the audit window
    // dropped today's empty partition beside it.
    let clock = ManualClock::new(next_midnight_ms() - DAY_MS + 3_600_000);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .retention(Duration::from_secs(3600))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "windows", payload(7));
    let first = engine
        .execute(&attempt, charge(&runs, 7))
        .await
        .expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    clock.advance(Duration::from_secs(3000));
    let inside = engine
        .execute(&attempt, charge(&runs, 7))
        .await
        .expect("inside");
    assert_eq!(
        inside.kind(),
        OutcomeKind::Replay,
        "inside the dedup window"
    );
    assert_eq!(inside.value(), first.value());
    clock.advance(Duration::from_secs(2 * 86_400));
    let outside = engine
        .execute(&attempt, charge(&runs, 7))
        .await
        .expect("outside");
    assert_eq!(outside.kind(), OutcomeKind::Fresh, "past the dedup window");
    assert_ne!(outside.value(), first.value());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let id = engine.record_id("t", "windows");
    let history = store.history(&id).await.expect("history");
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(
        history[0].created_at_ms > history[1].created_at_ms,
        "newest first"
    );
    assert!(
        history[1].response.is_some(),
        "the first response, kept for support"
    );
    assert!(history[1].is_expired(clock_now(&clock)));

    // Two days on, the first record's partition is inside the audit window:
    // a cleanup keeps it.
    let cleanup = store
        .drop_expired_partitions(clock_now(&clock) / 1000)
        .await
        .expect("cleanup");
    assert!(cleanup.dropped.is_empty(), "{cleanup:?}");
    // Past the audit window, it goes, and the newer record stays.
    let later = clock_now(&clock) / 1000 + 6 * 86_400;
    let cleanup = store.drop_expired_partitions(later).await.expect("cleanup");
    assert_eq!(cleanup.dropped.len(), 1, "{cleanup:?}");
    let history = store.history(&id).await.expect("history");
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].created_at_ms, Some(clock_now(&clock)));
}

fn clock_now(clock: &ManualClock) -> u64 {
    use lambda_idempotency::Clock;
    clock.now_ms()
}

/// The cleanup, while claims go on: of ten days of records it drops the
/// days past the audit window whose records all expired, keeps a day
/// whose claim a heartbeat kept alive, and leaves the days inside the
/// window; no claim fails meanwhile, and nothing is deleted row by row.
async fn cleanup_drops_only_the_days_whose_every_record_expired_while_claims_go_on<S: Driver>() {
    let audit = Duration::from_secs(3 * 86_400);
    let store: S = store_at(&url(), Partitioning::daily().audit_window(audit)).await;
    let today = next_midnight_ms() - DAY_MS;
    let first_day = today - 9 * DAY_MS;
    // Twenty claims a day on the ten days up to today, expiring an hour on.
    for day in 0..10 {
        for n in 0..20 {
            let id = RecordId::new("p", "t", &format!("d{day}-{n}"));
            let at = first_day + day * DAY_MS + n * 60_000;
            assert_eq!(
                store.claim(&claim(&id, "o", at)).await.expect("claim"),
                Conditional::Applied
            );
        }
    }
    // Day 2's first claim is kept alive to today by its heartbeat.
    let kept = RecordId::new("p", "t", "d2-0");
    let extended = store
        .extend(&Extension {
            id: kept.clone(),
            owner: OwnerToken::from_stored("o"),
            lease_until_ms: today + 3 * 3_600_000,
            expiration_s: today / 1000 + 3 * 3600,
            now_ms: first_day + 2 * DAY_MS + 1000,
        })
        .await
        .expect("extend");
    assert_eq!(extended, Conditional::Applied);
    let rows_before = super::count(store.table()).await;

    // Claims go on while the cleanup runs.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, stop) = (store.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = RecordId::new("p", "t", &format!("live-{n}"));
                let answer = store.claim(&claim(&id, "w", today + 1000 + n)).await;
                assert_eq!(
                    answer.expect("a claim during cleanup"),
                    Conditional::Applied
                );
                n += 1;
            }
            n
        })
    };
    let now_s = today / 1000 + 3600 * 2;
    let cleanup = store.drop_expired_partitions(now_s).await.expect("cleanup");
    stop.store(true, Ordering::SeqCst);
    let written = writer.await.expect("writer");
    assert!(written > 0);

    // Days 0 to 5 ended at least 3 days (the audit window) before
    // today+2h; day 6 ends 2 days before today, and is kept, like days 7
    // to 9; day 2 holds a record that expires at today+3h.
    let name = |day: u64| {
        let (y, m, d) = civil((first_day + day * DAY_MS) / DAY_MS);
        format!("{}_p{y:04}{m:02}{d:02}", store.table())
    };
    let mut dropped = cleanup.dropped.clone();
    dropped.sort();
    assert_eq!(dropped, [0, 1, 3, 4, 5].map(name).to_vec(), "{cleanup:?}");
    assert_eq!(cleanup.kept_live, vec![name(2)], "{cleanup:?}");
    assert_eq!(
        super::count(store.table()).await,
        rows_before - 5 * 20 + written as i64,
        "the dropped days' rows, and no others, are gone"
    );
    assert!(
        store.get(&kept, today).await.expect("get").is_some(),
        "the record kept alive is still there"
    );
    // Nothing was deleted row by row: no dead tuple anywhere.
    let client = tokio_postgres_client().await;
    let deleted: i64 = client
        .query_one(
            "SELECT coalesce(sum(n_tup_del), 0)::bigint FROM pg_stat_all_tables \
             WHERE relname LIKE $1",
            &[&format!("{}_p%", store.table())],
        )
        .await
        .expect("stats")
        .get(0);
    assert_eq!(deleted, 0);
    // A second run has nothing left to drop.
    let again = store.drop_expired_partitions(now_s).await.expect("again");
    assert!(again.dropped.is_empty(), "{again:?}");
}

/// The days since 1970-01-01 as a date (as the store names partitions).
fn civil(day: u64) -> (u64, u64, u64) {
    let z = day + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

/// A claim on a day whose partition is missing (dropped by hand) makes it
/// and applies, in both forms; no DEFAULT partition is ever made.
async fn a_missing_partition_never_fails_a_claim<S: Driver>() {
    let store: S = store().await;
    let tomorrow = next_midnight_ms();
    let (y, m, d) = civil(tomorrow / DAY_MS);
    let partition = format!("{}_p{y:04}{m:02}{d:02}", store.table());
    let client = tokio_postgres_client().await;
    client
        .batch_execute(&format!("DROP TABLE {partition}"))
        .await
        .expect("drop tomorrow's partition");
    let id = RecordId::new("p", "t", "tomorrow");
    assert_eq!(
        store
            .claim(&claim(&id, "o", tomorrow + 5))
            .await
            .expect("claim"),
        Conditional::Applied
    );
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&partition])
        .await
        .expect("regclass")
        .get(0);
    assert!(exists);
    // Far ahead, past the partitions made ahead.
    let far = tomorrow + 40 * DAY_MS;
    let id = RecordId::new("p", "t", "far");
    assert_eq!(
        store.claim(&claim(&id, "o", far)).await.expect("claim"),
        Conditional::Applied
    );
    let defaults: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_partitioned_table \
             WHERE partrelid = to_regclass($1) AND partdefid <> 0",
            &[&store.table()],
        )
        .await
        .expect("default")
        .get(0);
    assert_eq!(defaults, 0);
}

/// A plain store over the partitioned table, and the partitioned layout
/// over a plain table, are refused at start-up; purging the partitioned
/// layout is refused.
async fn each_layout_refuses_the_others_table<S: Driver>() {
    let partitioned: S = store().await;
    let plain = S::open(&url(), partitioned.table(), 1, None);
    let error = plain
        .create_table()
        .await
        .expect_err("plain over partitioned");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");

    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("plain_{}_{n}", std::process::id());
    let plain = S::open(&url(), &table, 1, None);
    plain.create_table().await.expect("plain table");
    let error = S::open(&url(), &table, 1, Some(Partitioning::daily()))
        .create_table()
        .await
        .expect_err("partitioned over plain");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
    assert!(error.to_string().contains("not partitioned"), "{error}");

    let error = partitioned.purge_expired(0, 10).await.expect_err("purge");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
    let error = plain.drop_expired_partitions(0).await.expect_err("drop");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

/// The benchmark of BENCHMARKS.md's "A PostgreSQL table that never bloats"
/// (`make bench-pg-partitions`): a simulated week at the seeds' shape,
/// time compressed (each request's `now` fabricated, a simulated day's
/// requests sent as fast as `BENCH_WRITERS` writers go), once on a plain
/// table purged by `DELETE` batches (`purge_expired`, 1,000 rows a batch)
/// and once on the partitioned layout (`drop_expired_partitions`), each
/// cleaned up every simulated hour while the writes go on, in interleaved
/// rounds (plain first, then partitioned first). Both keep a response two
/// days: the plain table as its retention, the partitioned layout as its
/// audit window beside a one-day dedup window.
mod week_bench {
    use super::*;
    use std::{
        sync::atomic::{AtomicBool, AtomicU64},
        time::Instant,
    };

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Layout {
        Plain,
        Partitioned,
    }

    #[derive(Default)]
    struct Week {
        /// claim + complete, µs: all, and those that overlapped a cleanup.
        writes: Vec<u32>,
        during_cleanup: Vec<u32>,
        /// The claim alone, µs.
        claims: Vec<u32>,
        /// Per simulated day: dead tuples, live tuples, bytes.
        days: Vec<(i64, i64, i64)>,
        cleanups: u32,
        cleanup_ms: Vec<u32>,
        deleted_rows: u64,
        dropped_partitions: usize,
        seconds: f64,
    }

    fn variable(name: &str, default: u64) -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn percentile(values: &[u32], p: f64) -> f64 {
        if values.is_empty() {
            return f64::NAN;
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        f64::from(sorted[index]) / 1000.0
    }

    async fn stats(table: &str) -> (i64, i64, i64) {
        let client = tokio_postgres_client().await;
        let row = client
            .query_one(
                "WITH leaves AS (SELECT relid FROM pg_partition_tree($1::text::regclass) \
                                 WHERE isleaf UNION SELECT $1::text::regclass) \
                 SELECT coalesce(sum(s.n_dead_tup), 0)::bigint, \
                        coalesce(sum(s.n_live_tup), 0)::bigint, \
                        coalesce(sum(pg_total_relation_size(p.relid)), 0)::bigint \
                 FROM leaves p JOIN pg_class c ON c.oid = p.relid AND c.relkind = 'r' \
                 LEFT JOIN pg_stat_all_tables s ON s.relid = p.relid",
                &[&table],
            )
            .await
            .expect("stats");
        (row.get(0), row.get(1), row.get(2))
    }

    async fn week(layout: Layout, per_day: u64, writers: u64, kept_s: u64) -> Week {
        const DAY_S: u64 = 86_400;
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("week_{}_{n}", std::process::id());
        let store =
            PostgresStore::connect(&url(), table.as_str(), writers as usize + 2).expect("pool");
        let (store, retention_s) = match layout {
            Layout::Plain => (store, kept_s),
            Layout::Partitioned => (
                store.partitioned(Partitioning::daily().audit_window(Duration::from_secs(kept_s))),
                DAY_S.min(kept_s),
            ),
        };
        store.create_table().await.expect("table");
        let start_ms = next_midnight_ms() + 30 * DAY_MS;
        let step_ms = DAY_MS / per_day;
        let total = 7 * per_day;
        let next = Arc::new(AtomicU64::new(0));
        let cleaning = Arc::new(AtomicBool::new(false));
        let began = Instant::now();
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let (store, next, cleaning) =
                    (store.clone(), Arc::clone(&next), Arc::clone(&cleaning));
                tokio::spawn(async move {
                    let mut week = Week::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= total {
                            return week;
                        }
                        let now_ms = start_ms + i * step_ms;
                        let id = RecordId::new("bench", "t", &format!("k{i}"));
                        let claim = Claim {
                            expiration_s: now_ms / 1000 + retention_s,
                            ..claim(&id, "o", now_ms)
                        };
                        let during = cleaning.load(Ordering::SeqCst);
                        let t0 = Instant::now();
                        assert_eq!(
                            store.claim(&claim).await.expect("claim"),
                            Conditional::Applied
                        );
                        let claimed = t0.elapsed();
                        let completed = store
                            .complete(lambda_idempotency::store::Completion {
                                id: id.clone(),
                                owner: claim.owner.clone(),
                                response: vec![b'r'; 200],
                                now_ms,
                                expiration_s: now_ms / 1000 + retention_s,
                                writes: Vec::new(),
                            })
                            .await
                            .expect("complete");
                        assert_eq!(completed, Conditional::Applied);
                        let micros = t0.elapsed().as_micros() as u32;
                        week.claims.push(claimed.as_micros() as u32);
                        week.writes.push(micros);
                        if during || cleaning.load(Ordering::SeqCst) {
                            week.during_cleanup.push(micros);
                        }
                    }
                })
            })
            .collect();
        // The cleanup, every simulated hour, on the simulated clock; the
        // statistics at the end of every simulated day.
        let mut result = Week::default();
        let per_hour = per_day / 24;
        let mut hour = 1;
        while hour <= 7 * 24 {
            let done = next.load(Ordering::SeqCst);
            if done < hour * per_hour {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            let now_s = (start_ms + hour * per_hour * step_ms) / 1000;
            cleaning.store(true, Ordering::SeqCst);
            let t0 = Instant::now();
            match layout {
                Layout::Plain => {
                    result.deleted_rows += store.purge_expired(now_s, 1000).await.expect("purge")
                }
                Layout::Partitioned => {
                    result.dropped_partitions += store
                        .drop_expired_partitions(now_s)
                        .await
                        .expect("drop")
                        .dropped
                        .len()
                }
            }
            result.cleanup_ms.push(t0.elapsed().as_millis() as u32);
            cleaning.store(false, Ordering::SeqCst);
            result.cleanups += 1;
            if hour % 24 == 0 {
                // Let the writers' statistics reach the collector.
                tokio::time::sleep(Duration::from_millis(1100)).await;
                result.days.push(stats(&table).await);
            }
            hour += 1;
        }
        for task in tasks {
            let week = task.await.expect("writer");
            result.writes.extend(week.writes);
            result.during_cleanup.extend(week.during_cleanup);
            result.claims.extend(week.claims);
        }
        result.seconds = began.elapsed().as_secs_f64();
        result
    }

    /// Above this many requests a simulated day, the week is loaded in the
    /// server (`loaded_week`): at the seeds' 7,200,000 a day, a store call
    /// per request is hours per layout on two cores.
    const LOADED_ABOVE: u64 = 100_000;

    /// Requests a loader statement writes.
    const CHUNK: u64 = 10_000;

    /// The simulated day's requests `first..=last` as traffic writes them,
    /// in one `DO` block run by the server: for each, the claim's `INSERT`
    /// in the store's row shape, then the completion's `UPDATE` of that
    /// row (what leaves a dead tuple, or a HOT chain, behind), and a
    /// `COMMIT`: each request its own transaction, so that the next
    /// request's write on the page can prune the version the completion
    /// left dead, as it does in traffic (committed every 100 requests, the
    /// plain table kept 97% of those versions dead against 6%, and grew
    /// 1.35x, in trials in psql). The request `g` comes at
    /// `start_ms + g * DAY_MS / per_day`, with an id as `RecordId::new`
    /// makes them (the prefix, `#`, a SHA-256 in hex: spread over the
    /// primary key's index as real keys are, not appended at its end), an
    /// owner token of its own (32 hex digits, as `OwnerToken::generate`
    /// makes), the writers'
    /// fingerprint and a 200-byte response, as the writers' requests.
    #[allow(clippy::too_many_arguments)]
    fn load_sql(
        layout: Layout,
        table: &str,
        id_prefix: &str,
        fingerprint: &str,
        start_ms: u64,
        per_day: u64,
        expiration_s: u64,
        first: u64,
        last: u64,
    ) -> String {
        // The partitioned row's day is its claim's `now` (the store's
        // `to_timestamp($6::float8 / 1000)`), which also routes it.
        let (day_column, day_value, same_row, conflict) = match layout {
            Layout::Plain => ("", "", "", "(id)"),
            Layout::Partitioned => (
                ", claimed_at",
                ", to_timestamp(now_ms::float8 / 1000)",
                " AND claimed_at = to_timestamp(now_ms::float8 / 1000)",
                "(id, claimed_at)",
            ),
        };
        format!(
            "DO $bench$ DECLARE resp bytea := decode(repeat('72', 200), 'hex'); \
               now_ms bigint; k text; o text; \
             BEGIN FOR g IN {first}..{last} LOOP \
               now_ms := {start_ms} + g::bigint * {DAY_MS} / {per_day}; \
               k := '{id_prefix}' || encode(sha256(convert_to('{table}' || g, 'UTF8')), 'hex'); \
               o := md5('{table}' || g); \
               INSERT INTO {table} AS r (id, status, owner, fingerprint, expiration_s, \
                 lease_until_ms, response, created_at_ms, completed_at_ms, attempt, \
                 first_started_ms{day_column}) \
               VALUES (k, 'IN_PROGRESS', o, '{fingerprint}', now_ms / 1000 + {expiration_s}, \
                 now_ms + 30000, NULL, now_ms, NULL, 1, now_ms{day_value}) \
               ON CONFLICT {conflict} DO NOTHING; \
               UPDATE {table} SET status = 'COMPLETED', response = resp, \
                 expiration_s = now_ms / 1000 + {expiration_s}, completed_at_ms = now_ms, \
                 lease_until_ms = NULL \
               WHERE id = k{same_row} AND status = 'IN_PROGRESS' AND owner = o; \
               COMMIT; \
             END LOOP; END $bench$"
        )
    }

    /// A simulated week at `per_day` requests a day, loaded in the server
    /// (`load_sql`, one simulated hour after another), while `writers`
    /// writers make real claims and completions through the store at the
    /// simulated clock (the latency sampled), and the cleanup runs beside
    /// them once every simulated hour the load has passed (DELETE batches
    /// of 1,000 on the plain table; detach and drop on the partitioned
    /// one). A record expires `retention_s` after its claim on the plain
    /// table; on the partitioned one after a dedup window of a day at
    /// most, its day kept for an audit window of `retention_s`. Prints
    /// each day as it ends; drops the table at the end.
    async fn loaded_week(
        layout: Layout,
        per_day: u64,
        writers: u64,
        retention_s: u64,
        days: u64,
        stop_after: Option<Duration>,
    ) -> Week {
        const DAY_S: u64 = 86_400;
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("week_{}_{n}", std::process::id());
        let store =
            PostgresStore::connect(&url(), table.as_str(), writers as usize + 4).expect("pool");
        let (store, expiration_s) = match layout {
            Layout::Plain => (store, retention_s),
            Layout::Partitioned => (
                store.partitioned(
                    Partitioning::daily().audit_window(Duration::from_secs(retention_s)),
                ),
                DAY_S.min(retention_s),
            ),
        };
        store.create_table().await.expect("table");
        let start_ms = next_midnight_ms() + 30 * DAY_MS;
        let per_hour = per_day / 24;
        // The simulated clock: the `now` of the request the load is at.
        let clock = Arc::new(AtomicU64::new(start_ms));
        let loaded = Arc::new(AtomicBool::new(false));
        let cleaning = Arc::new(AtomicBool::new(false));
        let hours_done = Arc::new(AtomicU64::new(0));
        // The writers' samples of the day so far: (claim + completion µs,
        // overlapped a cleanup, claim µs).
        let samples = Arc::new(std::sync::Mutex::new(Vec::<(u32, bool, u32)>::new()));
        let began = Instant::now();

        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let (store, clock, loaded, cleaning, samples) = (
                    store.clone(),
                    Arc::clone(&clock),
                    Arc::clone(&loaded),
                    Arc::clone(&cleaning),
                    Arc::clone(&samples),
                );
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !loaded.load(Ordering::SeqCst) {
                        i += 1;
                        let now_ms = clock.load(Ordering::SeqCst);
                        let id = RecordId::new("bench", "t", &format!("w{w}-{i}"));
                        let owner = OwnerToken::generate().expect("owner");
                        let claim = Claim {
                            owner: owner.clone(),
                            expiration_s: now_ms / 1000 + expiration_s,
                            ..claim(&id, "o", now_ms)
                        };
                        let during = cleaning.load(Ordering::SeqCst);
                        let t0 = Instant::now();
                        assert_eq!(
                            store.claim(&claim).await.expect("claim"),
                            Conditional::Applied
                        );
                        let claimed = t0.elapsed();
                        let completed = store
                            .complete(lambda_idempotency::store::Completion {
                                id,
                                owner,
                                response: vec![b'r'; 200],
                                now_ms,
                                expiration_s: now_ms / 1000 + expiration_s,
                                writes: Vec::new(),
                            })
                            .await
                            .expect("complete");
                        assert_eq!(completed, Conditional::Applied);
                        let micros = t0.elapsed().as_micros() as u32;
                        let during = during || cleaning.load(Ordering::SeqCst);
                        samples.lock().expect("samples").push((
                            micros,
                            during,
                            claimed.as_micros() as u32,
                        ));
                        // A writer samples; the load makes the volume.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            })
            .collect();

        // The cleanup: whenever the load has passed an hour it has not
        // cleaned up after, at the end of the latest such hour.
        let cleanup = {
            let (store, loaded, cleaning, hours_done) = (
                store.clone(),
                Arc::clone(&loaded),
                Arc::clone(&cleaning),
                Arc::clone(&hours_done),
            );
            tokio::spawn(async move {
                let mut result = Week::default();
                let mut cleaned = 0;
                while !loaded.load(Ordering::SeqCst) {
                    let hour = hours_done.load(Ordering::SeqCst);
                    if hour == cleaned {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    cleaned = hour;
                    let now_s = (start_ms + hour * per_hour * DAY_MS / per_day) / 1000;
                    cleaning.store(true, Ordering::SeqCst);
                    let t0 = Instant::now();
                    let removed = match layout {
                        Layout::Plain => {
                            let rows = store.purge_expired(now_s, 1000).await.expect("purge");
                            result.deleted_rows += rows;
                            format!("{rows} rows deleted")
                        }
                        Layout::Partitioned => {
                            let dropped = store
                                .drop_expired_partitions(now_s)
                                .await
                                .expect("drop")
                                .dropped;
                            result.dropped_partitions += dropped.len();
                            format!("dropped {dropped:?}")
                        }
                    };
                    let ms = t0.elapsed().as_millis() as u32;
                    result.cleanup_ms.push(ms);
                    cleaning.store(false, Ordering::SeqCst);
                    result.cleanups += 1;
                    // Each run, so that a week stopped early still tells.
                    println!(
                        "  {layout:?} cleanup after simulated hour {hour}: {ms} ms, {removed}"
                    );
                }
                result
            })
        };

        let loader = tokio_postgres_client().await;
        // A record id is its prefix, `#`, and 64 hex digits.
        let template = RecordId::new("bench", "t", "b");
        let id_prefix = "bench#";
        assert!(template.as_str().starts_with(id_prefix) && template.as_str().len() == 70);
        let fingerprint = payload(1);
        let mut result = Week::default();
        let mut day_began = Instant::now();
        for hour in 0..days * 24 {
            let first = hour * per_hour;
            if hour % 24 == 0 {
                // The partitions of the day and the days ahead, as the
                // writers' claims and the cleanup would make them.
                store
                    .ensure_partitions((start_ms + first * DAY_MS / per_day) / 1000)
                    .await
                    .expect("partitions");
            }
            let mut from = first;
            while from < first + per_hour {
                let to = (from + CHUNK).min(first + per_hour) - 1;
                clock.store(start_ms + from * DAY_MS / per_day, Ordering::SeqCst);
                loader
                    .batch_execute(&load_sql(
                        layout,
                        &table,
                        id_prefix,
                        fingerprint.as_str(),
                        start_ms,
                        per_day,
                        expiration_s,
                        from,
                        to,
                    ))
                    .await
                    .expect("load");
                from = to + 1;
            }
            hours_done.store(hour + 1, Ordering::SeqCst);
            if (hour + 1) % 24 == 0 {
                // Let the statistics of every backend reach the collector.
                tokio::time::sleep(Duration::from_millis(1100)).await;
                let day = stats(&table).await;
                let (mut writes, mut during, mut claims) = (Vec::new(), Vec::new(), Vec::new());
                for (micros, overlapped, claim) in samples.lock().expect("samples").drain(..) {
                    writes.push(micros);
                    claims.push(claim);
                    if overlapped {
                        during.push(micros);
                    }
                }
                println!(
                    "  {layout:?} day {}: {:.0} s, dead tuples {}, live tuples {}, size {:.1} MB; \
                     write p50 {:.2} ms p99 {:.2} ms ({} writes), during cleanup p50 {:.2} ms \
                     p99 {:.2} ms ({} writes)",
                    result.days.len() + 1,
                    day_began.elapsed().as_secs_f64(),
                    day.0,
                    day.1,
                    day.2 as f64 / 1_048_576.0,
                    percentile(&writes, 0.5),
                    percentile(&writes, 0.99),
                    writes.len(),
                    percentile(&during, 0.5),
                    percentile(&during, 0.99),
                    during.len(),
                );
                result.writes.extend(writes);
                result.during_cleanup.extend(during);
                result.claims.extend(claims);
                result.days.push(day);
                day_began = Instant::now();
                if stop_after.is_some_and(|limit| began.elapsed() > limit) {
                    println!(
                        "  {layout:?}: stopped after day {} (BENCH_STOP_AFTER_S)",
                        hour / 24 + 1
                    );
                    break;
                }
            }
        }
        loaded.store(true, Ordering::SeqCst);
        let cleaned = cleanup.await.expect("cleanup");
        result.cleanups = cleaned.cleanups;
        result.cleanup_ms = cleaned.cleanup_ms;
        result.deleted_rows = cleaned.deleted_rows;
        result.dropped_partitions = cleaned.dropped_partitions;
        for task in tasks {
            task.await.expect("writer");
        }
        result.seconds = began.elapsed().as_secs_f64();
        // The next layout starts on an empty server (and the disk gets its
        // space back).
        loader
            .batch_execute(&format!("DROP TABLE {table}"))
            .await
            .expect("drop");
        result
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "a benchmark: make bench-pg-partitions"]
    async fn partitions_against_delete_batches_over_a_simulated_week() {
        let per_day = variable("BENCH_PER_DAY", 10_000);
        let loaded = per_day > LOADED_ABOVE;
        let rounds = variable("BENCH_ROUNDS", if loaded { 1 } else { 2 });
        let writers = variable("BENCH_WRITERS", if loaded { 2 } else { 8 });
        let retention_s = variable("BENCH_RETENTION_DAYS", 2) * 86_400;
        // The server-loaded week only: how many simulated days, and a
        // wall-clock budget past which it stops at the end of a day.
        let days = variable("BENCH_DAYS", 7);
        let stop_after = std::env::var("BENCH_STOP_AFTER_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs);
        // Which layouts, and in which order the first round runs them
        // (each round after swaps it): at the seeds' rate each layout can
        // run in a make of its own, on a server of its own.
        let layouts: Vec<Layout> = std::env::var("BENCH_LAYOUTS")
            .unwrap_or_else(|_| "plain,partitioned".into())
            .split(',')
            .map(|name| match name.trim() {
                "plain" => Layout::Plain,
                "partitioned" => Layout::Partitioned,
                other => panic!("BENCH_LAYOUTS: {other}? (plain, partitioned)"),
            })
            .collect();
        println!(
            "a simulated week: {per_day} requests a simulated day (the seeds' 5,000 a minute is \
             7,200,000){}, {writers} writers, {rounds} interleaved rounds, a response kept {} \
             day(s)",
            if loaded {
                " loaded in the server beside the writers"
            } else {
                ""
            },
            retention_s / 86_400
        );
        let mut weeks: Vec<(Layout, Week)> = Vec::new();
        for round in 0..rounds {
            let mut order = layouts.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for layout in order {
                let week = if loaded {
                    loaded_week(layout, per_day, writers, retention_s, days, stop_after).await
                } else {
                    week(layout, per_day, writers, retention_s).await
                };
                println!(
                    "round {round} {layout:?}: {:.1} s; write p50 {:.2} ms p99 {:.2} ms; during \
                     cleanup ({} writes) p50 {:.2} ms p99 {:.2} ms; claim p50 {:.2} ms p99 {:.2} \
                     ms; cleanups {} (p50 {:.1} ms, max {} ms), rows deleted {}, partitions \
                     dropped {}",
                    week.seconds,
                    percentile(&week.writes, 0.5),
                    percentile(&week.writes, 0.99),
                    week.during_cleanup.len(),
                    percentile(&week.during_cleanup, 0.5),
                    percentile(&week.during_cleanup, 0.99),
                    percentile(&week.claims, 0.5),
                    percentile(&week.claims, 0.99),
                    week.cleanups,
                    percentile(
                        &week
                            .cleanup_ms
                            .iter()
                            .map(|ms| ms * 1000)
                            .collect::<Vec<_>>(),
                        0.5
                    ),
                    week.cleanup_ms.iter().max().copied().unwrap_or(0),
                    week.deleted_rows,
                    week.dropped_partitions,
                );
                for (day, (dead, live, bytes)) in week.days.iter().enumerate() {
                    println!(
                        "  day {}: dead tuples {dead}, live tuples {live}, size {:.1} MB",
                        day + 1,
                        *bytes as f64 / 1_048_576.0
                    );
                }
                weeks.push((layout, week));
            }
        }
    }
}

/// pg_partman (Debian's, 4.7 for PostgreSQL 15: daily partitions named
/// `_pYYYY_MM_DD`, and a DEFAULT partition) manages the partitioned
/// layout's table: the store makes no partition of its own for the days
/// pg_partman's cover (it reads each partition's bounds, not its name),
/// claims and pg_partman's maintenance go on side by side, and the
/// store's cleanup drops pg_partman's days past both windows, detaching
/// without `CONCURRENTLY` (a DEFAULT partition forbids it) and never the
/// DEFAULT partition.
async fn pg_partman_manages_the_partitioned_table<S: Driver>() {
    let client = tokio_postgres_client().await;
    let available: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman')",
            &[],
        )
        .await
        .expect("extensions")
        .get(0);
    assert!(
        available,
        "pg_partman is not installed: scripts/with-postgres installs Debian's \
         postgresql-<major>-partman"
    );
    client
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS partman; \
             CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman",
        )
        .await
        .expect("pg_partman");
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("partman_{}_{n}", std::process::id());
    // The layout's DDL (the store docs'), then pg_partman's partitions.
    client
        .batch_execute(
            &include_str!("../../src/store/pg/table_partitioned.sql")
                .replace("EXISTS idempotency (", &format!("EXISTS {table} (")),
        )
        .await
        .expect("table");
    client
        .query_one(
            "SELECT partman.create_parent($1, 'claimed_at', 'native', 'daily', \
             p_premake := 3, p_start_partition := to_char(current_date, 'YYYY-MM-DD'))",
            &[&format!("public.{table}")],
        )
        .await
        .expect("create_parent");
    let audit = Duration::from_secs(3 * 86_400);
    let store = S::open(
        &url(),
        &table,
        4,
        Some(Partitioning::daily().audit_window(audit)),
    );
    store
        .create_table()
        .await
        .expect("the store accepts the table");
    let names = || async {
        let mut names: Vec<String> = store
            .partitions()
            .await
            .expect("partitions")
            .into_iter()
            .map(|p| p.name)
            .collect();
        names.sort();
        names
    };
    let before = names().await;
    assert!(
        before
            .iter()
            .all(|name| name.contains("_p20") && name.contains('_') || name.ends_with("_default")),
        "{before:?}"
    );
    assert!(
        before.iter().any(|name| name.ends_with("_default")),
        "{before:?}"
    );
    assert!(
        !before.iter().any(|name| {
            let suffix = name.rsplit("_p").next().unwrap_or("");
            suffix.len() == 8 && suffix.chars().all(|c| c.is_ascii_digit())
        }),
        "the store made none of its own: {before:?}"
    );

    // Claims on today's partition (pg_partman's), and pg_partman's upkeep.
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "partman", payload(3));
    let first = engine
        .execute(&attempt, charge(&runs, 3))
        .await
        .expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let again = engine
        .execute(&attempt, charge(&runs, 3))
        .await
        .expect("again");
    assert_eq!(again.kind(), OutcomeKind::Replay);
    client
        .batch_execute(&format!("SELECT partman.run_maintenance('public.{table}')"))
        .await
        .expect("pg_partman's maintenance");
    assert_eq!(names().await, before, "nothing for pg_partman to add");

    // Ten days on, the days past the audit window go, pg_partman's DEFAULT
    // partition stays, and the store has made the days ahead that pg_partman
    // had not.
    let later = clock_now(&clock) / 1000 + 10 * 86_400;
    let cleanup = store.drop_expired_partitions(later).await.expect("cleanup");
    assert!(!cleanup.dropped.is_empty(), "{cleanup:?}");
    assert!(
        cleanup
            .dropped
            .iter()
            .all(|name| !name.ends_with("_default")),
        "{cleanup:?}"
    );
    let after = names().await;
    assert!(
        after.iter().any(|name| name.ends_with("_default")),
        "{after:?}"
    );
    assert!(
        !after.iter().any(|name| cleanup.dropped.contains(name)),
        "{after:?}"
    );
    assert_eq!(cleanup.created.len(), 4, "{cleanup:?}");
}

/// A single write does not replace a completed record whose status was
/// turned back into a lapsed claim behind the store's back (it holds a
/// response), as on the plain table; a lapsed claim without one is
/// replaced in its row.
async fn a_single_write_refuses_a_lapsed_claim_that_holds_a_response<S: Driver>() {
    use lambda_idempotency::store::Commit;
    let store: S = store().await;
    let now = next_midnight_ms() - DAY_MS + 3_600_000;
    let commit = |id: &RecordId, owner: &str, at: u64| Commit {
        id: id.clone(),
        owner: OwnerToken::from_stored(owner),
        fingerprint: payload(1),
        response: b"second".to_vec(),
        now_ms: at,
        expiration_s: at / 1000 + 3600,
        writes: Vec::new(),
    };
    let client = tokio_postgres_client().await;
    for (key, tampered) in [("tampered", true), ("lapsed", false)] {
        let id = RecordId::new("p", "t", key);
        assert_eq!(
            store.claim(&claim(&id, "a", now)).await.expect("claim"),
            Conditional::Applied
        );
        let response = if tampered {
            "'\\x6669727374'::bytea"
        } else {
            "NULL"
        };
        client
            .batch_execute(&format!(
                "UPDATE {} SET status = 'IN_PROGRESS', lease_until_ms = 1, response = {response} \
                 WHERE id = '{}'",
                store.table(),
                id.as_str()
            ))
            .await
            .expect("tamper");
        let answer = store
            .commit(commit(&id, "b", now + 60_000))
            .await
            .expect("commit");
        if tampered {
            assert!(matches!(answer, Conditional::Refused(_)), "{answer:?}");
            let record = store
                .get(&id, now + 60_000)
                .await
                .expect("get")
                .expect("record");
            assert_eq!(
                record.response.as_deref(),
                Some(&b"first"[..]),
                "left as it is"
            );
        } else {
            assert_eq!(answer, Conditional::Applied);
        }
    }
}

/// A detach that gives up (beside a DEFAULT partition there is no
/// `CONCURRENTLY`: `BEGIN`, a 2 s `lock_timeout`, the detach, `COMMIT`,
/// in one simple query), behind a long transaction that reads the day,
/// is an error and leaves no aborted transaction on the connection: on a
/// pool of one, the next claim works. Once the reader is gone, the next
/// cleanup drops the day.
async fn a_detach_that_gives_up_leaves_the_connection_usable<S: Driver>() {
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("detach_{}_{n}", std::process::id());
    let audit = Duration::from_secs(86_400);
    let store = S::open(
        &url(),
        &table,
        1,
        Some(Partitioning::daily().audit_window(audit)),
    );
    store.create_table().await.expect("table");
    let client = tokio_postgres_client().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE {table}_default PARTITION OF {table} DEFAULT"
        ))
        .await
        .expect("a DEFAULT partition");
    let today = next_midnight_ms() - DAY_MS;
    let id = RecordId::new("p", "t", "today");
    assert_eq!(
        store
            .claim(&claim(&id, "o", today + 1000))
            .await
            .expect("claim"),
        Conditional::Applied
    );
    let (y, m, d) = civil(today / DAY_MS);
    let day = format!("{table}_p{y:04}{m:02}{d:02}");
    let reader = tokio_postgres_client().await;
    reader
        .batch_execute(&format!("BEGIN; SELECT count(*) FROM {day}"))
        .await
        .expect("a long reader of the day");
    let later_s = (today + 3 * DAY_MS) / 1000;
    let error = store
        .drop_expired_partitions(later_s)
        .await
        .expect_err("the detach gave up");
    assert!(error.to_string().contains("55P03"), "{error}");
    let next = RecordId::new("p", "t", "next");
    assert_eq!(
        store
            .claim(&claim(&next, "o", today + 2000))
            .await
            .expect("the pool's one connection is usable"),
        Conditional::Applied
    );
    reader.batch_execute("COMMIT").await.expect("reader gone");
    let cleanup = store
        .drop_expired_partitions(later_s)
        .await
        .expect("cleanup");
    assert!(cleanup.dropped.contains(&day), "{cleanup:?}");
}

/// In the partitioned layout the table size is the partitions' sum: the
/// same figures as the operator's `partitions` report, over two days'
/// partitions.
async fn the_table_size_sums_the_partitions<S: Driver>() {
    use lambda_idempotency::store::{Accuracy, SizeSource};
    let store = store::<S>().await;
    let clock = ManualClock::starting_now();
    let today = Engine::builder(store.clone()).clock(clock.clone()).build();
    crate::support::table_size::complete_records(&today, 5).await;
    clock.advance(Duration::from_secs(86_400));
    let tomorrow = Engine::builder(store.clone())
        .clock(clock.clone())
        .key_prefix("tomorrow")
        .build();
    crate::support::table_size::complete_records(&tomorrow, 4).await;
    let client = super::tokio_postgres_client().await;
    client
        .batch_execute(&format!("ANALYZE {}", store.table()))
        .await
        .expect("analyze");
    let size = tomorrow
        .sample_table_size()
        .await
        .unwrap()
        .expect("counted");
    let partitions = store.partitions().await.expect("the report");
    let holding = partitions.iter().filter(|p| p.estimated_rows > 0).count();
    assert_eq!(holding, 2, "{partitions:?}");
    let rows: i64 = partitions.iter().map(|p| p.estimated_rows).sum();
    let bytes: u64 = partitions.iter().map(|p| p.total_bytes).sum();
    assert_eq!(
        (size.records, size.bytes, size.accuracy, size.source),
        (9, Some(bytes), Accuracy::Estimated, SizeSource::PgClass)
    );
    assert_eq!(rows, 9);
}

/// Recovery points in the partitioned layout, on both drivers: the
/// column is the parent table's; a step lands on the record's row (the
/// newest of its id) only.
mod steps {
    use super::*;
    use crate::steps_kit;

    lambda_idempotency::store_conformance! {
        steps: store::<PostgresStore>(),
    }

    mod on_sqlx {
        use super::*;

        lambda_idempotency::store_conformance! {
            steps: store::<SqlxPostgresStore>(),
        }

        mod prepared {
            use super::*;

            lambda_idempotency::store_conformance! {
                steps: async { store::<SqlxPostgresStore>().await.prepared_statements(true) },
            }
        }
    }

    /// The `steps` column of `id`'s record (its newest row), as JSON.
    async fn raw(table: String, id: String) -> Option<serde_json::Value> {
        let row = crate::tokio_postgres_client()
            .await
            .query_one(
                &format!(
                    "SELECT steps::text FROM {table} WHERE id = $1 ORDER BY claimed_at DESC LIMIT 1"
                ),
                &[&id],
            )
            .await
            .expect("the record");
        row.get::<_, Option<String>>(0)
            .map(|text| serde_json::from_str(&text).expect("JSON"))
    }

    on_both_drivers!(
        steps_live_in_the_row_until_its_completion,
        a_takeover_resumes_after_steps_whose_answers_were_lost,
    );

    /// Every step write sent twice (its first answer lost): the engine
    /// recognises its own landed write.
    async fn a_takeover_resumes_after_steps_whose_answers_were_lost<S: Driver>() {
        use lambda_idempotency::testing::{scenarios, LostAnswers};
        scenarios::a_takeover_resumes_after_the_recorded_steps(LostAnswers(store::<S>().await))
            .await;
        scenarios::a_failure_after_a_step_keeps_it(LostAnswers(store::<S>().await)).await;
    }

    async fn steps_live_in_the_row_until_its_completion<S: Driver>() {
        let store = store::<S>().await;
        let table = store.table().to_owned();
        steps_kit::steps_live_in_the_row_until_its_completion(store, move |id| {
            raw(table.clone(), id)
        })
        .await;
    }

    /// A partitioned table made before the `steps` column: the check names
    /// the migration; run on the parent, it reaches the partition already
    /// there, and a record in it steps on.
    #[tokio::test]
    async fn a_partitioned_table_made_before_the_steps_column() {
        let table = format!("parted_before_column_{}", std::process::id());
        let old = include_str!("../../src/store/pg/table_partitioned.sql")
            .replace("    steps            jsonb,\n", "")
            .replace("idempotency", &table);
        assert!(!old.contains("steps"), "{old}");
        let client = tokio_postgres_client().await;
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table} CASCADE; {old}; \
                 CREATE TABLE {table}_all PARTITION OF {table} \
                   FOR VALUES FROM ('2000-01-01') TO ('2100-01-01')"
            ))
            .await
            .expect("the table as it was");
        let store = PostgresStore::open(&url(), &table, 2, Some(Partitioning::daily()));
        let error = Driver::create_table(&store).await.expect_err("refused");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(
            error
                .to_string()
                .contains("ALTER TABLE <table> ADD COLUMN IF NOT EXISTS steps jsonb"),
            "{error}"
        );
        client
            .batch_execute(&format!(
                "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS steps jsonb"
            ))
            .await
            .expect("migrated");
        Driver::create_table(&store)
            .await
            .expect("the migrated table");
        let id = RecordId::new("p", "t", "parted-before-column");
        let a = steps_kit::claim(&id, "owner-a");
        assert_eq!(store.claim(&a).await.expect("claim"), Conditional::Applied);
        let step = lambda_idempotency::store::StepWrite::new(
            id.clone(),
            a.owner.clone(),
            0,
            "charge",
            b"1".to_vec(),
            a.now_ms,
        );
        assert_eq!(
            store.record_step(&step).await.expect("step"),
            Conditional::Applied
        );
        let in_partition: i64 = client
            .query_one(
                &format!("SELECT count(*) FROM ONLY {table}_all WHERE steps IS NOT NULL"),
                &[],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(in_partition, 1);
    }
}
