//! The table-size gauge: the store's own count of what it holds, sampled
//! when an operator (or a scheduled task) asks, and told to the observers.

use super::state::Engine;
use crate::{
    observe::Event,
    store::{Store, TableSize},
    StoreError,
};
use std::time::Duration;

impl<St: Store> Engine<St> {
    /// Asks the store how many records it holds
    /// ([`Store::table_size`]: its own count or estimate, never a scan,
    /// so cheap enough to scrape) and tells the observers
    /// ([`Event::TableSized`]: `observe::Metrics` sets the gauge
    /// `idempotency_table_records`, `EmfMetrics` writes `TableRecords`).
    /// `None` when the store has no cheap count; nothing is reported then.
    ///
    /// The figure is the store's, for the whole table: every key prefix
    /// sharing it, and expired records not yet deleted
    /// ([`table_size`](mod@crate::store::table_size) says what each store
    /// counts, and how fresh it is).
    ///
    /// ```
    /// use lambda_idempotency::{Engine, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lambda_idempotency::StoreError> {
    /// let engine = Engine::builder(MemoryStore::new()).build();
    /// let size = engine.sample_table_size().await?.expect("the memory store counts");
    /// assert_eq!(size.records, 0);
    /// # Ok(()) }
    /// ```
    pub async fn sample_table_size(&self) -> Result<Option<TableSize>, StoreError> {
        let now_ms = self.inner.clock.now_ms();
        let size = self.inner.store.table_size(now_ms).await?;
        if let Some(size) = size {
            self.inner.observers.tell(Event::TableSized {
                store: St::DB_SYSTEM,
                size,
            });
        }
        Ok(size)
    }

    /// Samples the table size now and then every `interval` (a second at
    /// least), for as long as the future runs: spawn it beside a server, so that its gauge is
    /// fresh when scraped. A failed sample is logged (WARN) and the next
    /// one is tried; a store with no cheap count ends it at once (logged
    /// at INFO). Keep the interval at a minute or more: each sample is a
    /// call to the store (a `DescribeTable`, a catalog query), and the
    /// estimates change slowly.
    ///
    /// ```no_run
    /// use lambda_idempotency::{Engine, MemoryStore};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let engine = Engine::builder(MemoryStore::new()).build();
    /// tokio::spawn(engine.clone().sample_table_size_every(Duration::from_secs(60)));
    /// # }
    /// ```
    pub async fn sample_table_size_every(self, interval: Duration) {
        let mut ticks = tokio::time::interval(interval.max(Duration::from_secs(1)));
        // A slow store delays the samples after it; it does not bunch them.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.sample_table_size().await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    tracing::info!(
                        store = St::DB_SYSTEM,
                        "the store has no cheap count of its records: no table-size gauge"
                    );
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "the store's table size could not be read");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        observe::Event,
        store::{Claim, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal},
        testing::RecordingObserver,
        Attempt, Fingerprint, MemoryStore, StoreErrorKind,
    };

    fn sized(observer: &RecordingObserver) -> Vec<(&'static str, TableSize)> {
        observer
            .events()
            .into_iter()
            .filter_map(|event| match event {
                Event::TableSized { store, size } => Some((store, size)),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_sample_is_told_to_the_observers_as_the_store_counted_it() {
        let observer = RecordingObserver::default();
        let engine = Engine::builder(MemoryStore::new())
            .observer(observer.clone())
            .build();
        for key in ["a", "b", "c"] {
            let attempt = Attempt::new("charges", key, Fingerprint::of_bytes(b"{}"));
            engine
                .execute(&attempt, || async { Ok::<_, ()>(1) })
                .await
                .unwrap();
        }
        let size = engine.sample_table_size().await.unwrap().unwrap();
        assert_eq!((size.records, size.in_progress), (3, Some(0)));
        assert_eq!(sized(&observer), [("memory", size)]);
        assert!(observer.store_calls().contains(&("table_size", "ok")));
    }

    #[tokio::test]
    async fn a_failed_sample_reports_no_size() {
        let observer = RecordingObserver::default();
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone())
            .observer(observer.clone())
            .build();
        store.fail_next(1);
        let error = engine.sample_table_size().await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Unavailable);
        assert!(sized(&observer).is_empty());
        assert_eq!(observer.store_calls(), [("table_size", "unavailable")]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_scheduled_sampler_samples_each_interval_and_goes_on_after_a_failure() {
        let observer = RecordingObserver::default();
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone())
            .observer(observer.clone())
            .build();
        store.fail_next(1);
        let sampler = tokio::spawn(engine.sample_table_size_every(Duration::from_secs(60)));
        // The first tick is at once (it fails), then one every minute.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        tokio::task::yield_now().await;
        let calls = observer.store_calls();
        assert_eq!(calls.first(), Some(&("table_size", "unavailable")));
        assert_eq!(sized(&observer).len(), 3, "{calls:?}");
        sampler.abort();
    }

    /// A store that leaves `table_size` at its default, as a store of
    /// yours may.
    struct Uncounted(MemoryStore);

    impl Store for Uncounted {
        type Write = ();
        async fn claim(&self, c: &Claim) -> Result<Conditional, StoreError> {
            self.0.claim(c).await
        }
        async fn take_over(&self, c: &Claim, o: &OwnerToken) -> Result<Conditional, StoreError> {
            self.0.take_over(c, o).await
        }
        async fn extend(&self, e: &Extension) -> Result<Conditional, StoreError> {
            self.0.extend(e).await
        }
        async fn complete(&self, _: Completion<()>) -> Result<Conditional, StoreError> {
            Ok(Conditional::Refused(None))
        }
        async fn release(&self, i: &RecordId, o: &OwnerToken) -> Result<Conditional, StoreError> {
            self.0.release(i, o).await
        }
        async fn remove(&self, i: &RecordId, r: Removal) -> Result<Conditional, StoreError> {
            self.0.remove(i, r).await
        }
        async fn list_in_progress(&self, p: &str, l: usize) -> Result<Vec<Record>, StoreError> {
            self.0.list_in_progress(p, l).await
        }
        async fn get(&self, i: &RecordId, n: u64) -> Result<Option<Record>, StoreError> {
            self.0.get(i, n).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_without_a_count_reports_nothing_and_ends_the_sampler() {
        let observer = RecordingObserver::default();
        let engine = Engine::builder(Uncounted(MemoryStore::new()))
            .observer(observer.clone())
            .build();
        assert_eq!(engine.sample_table_size().await.unwrap(), None);
        let sampler = tokio::spawn(engine.sample_table_size_every(Duration::from_secs(60)));
        tokio::time::timeout(Duration::from_secs(1), sampler)
            .await
            .expect("ended at its first sample")
            .unwrap();
        assert!(sized(&observer).is_empty());
        assert_eq!(observer.store_calls(), [("table_size", "ok"); 2]);
    }
}
