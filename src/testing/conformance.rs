//! The macro that runs every scenario against one store.

/// Generates one `#[tokio::test]` per [scenario](crate::testing::scenarios),
/// each on a fresh store from the `store` expression (a future that yields
/// the store), and the fail-closed scenario on the `unavailable` one (a
/// future that yields a store whose calls fail as unavailable).
///
/// Invoke it once per store, in its own test file or module: the tests are
/// named after the scenarios. End with `single_write` for a store whose
/// [`Store::SINGLE_WRITE`](crate::store::Store::SINGLE_WRITE) is `true`,
/// to run the single-write scenarios too. See the
/// [module docs](crate::testing).
///
/// `store_conformance!(steps: store)` runs the recovery-point scenarios
/// on a store that records steps
/// ([`Store::record_step`](crate::store::Store::record_step)), beside
/// the call above.
///
/// `store_conformance!(abandoned: store)` runs the completer's scenarios
/// on a store that lists abandoned claims
/// ([`Store::list_abandoned`](crate::store::Store::list_abandoned)), and
/// `store_conformance!(abandoned_steps: store)` the one that needs steps
/// too.
#[macro_export]
macro_rules! store_conformance {
    (abandoned: $store:expr $(,)?) => {
        $crate::store_conformance!(@each $store;
            abandoned_claims_are_listed_in_bounded_pages,
            the_completer_settles_abandoned_claims_by_policy,
            a_claim_that_came_back_is_left_alone,
        );
        $crate::store_conformance!(@each_in_real_time $store;
            the_completer_and_a_retry_never_both_own_a_claim,
            the_completer_releasing_never_deletes_a_retrys_claim,
        );
    };
    (abandoned_steps: $store:expr $(,)?) => {
        $crate::store_conformance!(@each $store;
            release_keeps_a_record_with_steps,
        );
    };
    (steps: $store:expr $(,)?) => {
        $crate::store_conformance!(@each $store;
            steps_are_fenced_on_their_claim,
            a_claim_starts_without_steps,
            a_takeover_resumes_after_the_recorded_steps,
            a_failure_after_a_step_keeps_it,
            step_limits_are_enforced,
            steps_at_the_edges,
        );
    };
    (store: $store:expr, unavailable: $unavailable:expr, single_write $(,)?) => {
        $crate::store_conformance!(store: $store, unavailable: $unavailable);
        $crate::store_conformance!(@each $store;
            single_write_follows_the_claim_rules,
        );
        $crate::store_conformance!(@each_in_real_time $store;
            single_write_commits_one_of_concurrent_duplicates,
        );
    };
    (store: $store:expr, unavailable: $unavailable:expr $(,)?) => {
        $crate::store_conformance!(@each $store;
            first_call_runs_then_replays,
            reused_key_is_rejected_without_running,
            failed_operation_releases_its_claim,
            expired_lease_is_taken_over,
            lease_is_capped_by_max_lease,
            zombie_cannot_touch_its_successor,
            own_landed_writes_are_recognised,
            expired_completed_record_is_absent,
            clock_offsets_change_nothing,
            a_refused_write_reports_what_it_found,
            extensions_are_fenced,
            a_takeover_is_told_it_may_follow_an_attempt_that_acted,
            a_failed_takeover_is_not_forgotten,
            forget_removes_records_but_keeps_claims_in_progress,
            list_in_progress_finds_live_and_stuck_claims,
        );

        $crate::store_conformance!(@each_in_real_time $store;
            heartbeat_keeps_a_long_operation_claimed,
            without_a_heartbeat_a_long_operation_is_taken_over,
        );

        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn sixty_four_concurrent_duplicates_run_once() {
            $crate::testing::scenarios::concurrent_duplicates_run_once($store.await, 64).await;
        }

        #[::tokio::test]
        async fn store_failure_fails_closed() {
            $crate::testing::scenarios::store_failure_fails_closed($unavailable.await).await;
        }
    };
    (@each_in_real_time $store:expr; $($scenario:ident),* $(,)?) => {$(
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            $crate::testing::scenarios::$scenario($store.await).await;
        }
    )*};
    (@each $store:expr; $($scenario:ident),* $(,)?) => {$(
        #[::tokio::test]
        async fn $scenario() {
            $crate::testing::scenarios::$scenario($store.await).await;
        }
    )*};
}
