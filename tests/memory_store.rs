//! The engine's guarantees on the in-memory store (no DynamoDB needed).

mod support;

use lambda_idempotency::MemoryStore;
use support::scenarios;

#[tokio::test]
async fn first_call_runs_then_replays() {
    scenarios::first_call_runs_then_replays(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_duplicates_run_once() {
    scenarios::concurrent_duplicates_run_once(MemoryStore::new(), 64).await;
}

#[tokio::test]
async fn mismatch_is_rejected_without_running() {
    scenarios::mismatch_is_rejected_without_running(MemoryStore::new()).await;
}

#[tokio::test]
async fn failed_operation_releases_its_claim() {
    scenarios::failed_operation_releases_its_claim(MemoryStore::new()).await;
}

#[tokio::test]
async fn expired_lease_is_taken_over() {
    scenarios::expired_lease_is_taken_over(MemoryStore::new()).await;
}

#[tokio::test]
async fn lease_is_capped_by_max_lease() {
    scenarios::lease_is_capped_by_max_lease(MemoryStore::new()).await;
}

#[tokio::test]
async fn zombie_cannot_touch_its_successor() {
    scenarios::zombie_cannot_touch_its_successor(MemoryStore::new()).await;
}

#[tokio::test]
async fn own_landed_writes_are_recognised() {
    scenarios::own_landed_writes_are_recognised(MemoryStore::new()).await;
}

#[tokio::test]
async fn expired_completed_record_is_absent() {
    scenarios::expired_completed_record_is_absent(MemoryStore::new()).await;
}

#[tokio::test]
async fn store_failure_fails_closed() {
    let store = MemoryStore::new();
    store.fail_next(1);
    scenarios::store_failure_fails_closed(store).await;
}
