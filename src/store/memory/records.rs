//! The memory store's records, found by id: each kept beside its id's
//! hash.
//!
//! A server keeps every record until it expires, so the table grows with
//! the requests, and each time it grows every record is placed again. A
//! set of records hashed its ids again for that (SipHash over some 80
//! bytes each: about 0.5 µs of every new request of the server benchmark,
//! amortised); here the hash is computed once, when the record is put, and
//! an update is made in place rather than by a removal and an insertion.
//!
//! Before a large table grows, it is rebuilt without the records that have
//! expired ([`Records::make_room`]), so a long-running server's table does
//! not hold every key of its life.

use super::packed::Packed;
use hashbrown::{hash_table::Entry, HashTable};
use std::hash::{BuildHasher, RandomState};

/// The fewest records a table is rebuilt without its expired ones at: a
/// small table (a test's) keeps every record it was given.
pub(super) const SWEPT_FROM: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct Records {
    /// Each record with its id's hash.
    table: HashTable<(u64, Packed)>,
    /// Keyed per store: ids come from requests, so their hashes must not
    /// be guessable (SipHash with a random key, as `HashMap`'s).
    hasher: RandomState,
}

impl Records {
    fn hash(&self, id: &str) -> u64 {
        self.hasher.hash_one(id.as_bytes())
    }

    pub(super) fn get(&self, id: &str) -> Option<&Packed> {
        let hash = self.hash(id);
        self.table
            .find(hash, |(_, record)| record.is(id))
            .map(|(_, record)| record)
    }

    pub(super) fn get_mut(&mut self, id: &str) -> Option<&mut Packed> {
        let hash = self.hash(id);
        self.table
            .find_mut(hash, |(_, record)| record.is(id))
            .map(|(_, record)| record)
    }

    /// The place of the record under `id`, found once: to read what is
    /// there, then put a record in its place (a claim).
    pub(super) fn slot<'a>(&'a mut self, id: &str) -> Slot<'a> {
        let hash = self.hash(id);
        let entry = self
            .table
            .entry(hash, |(_, record)| record.is(id), |(hash, _)| *hash);
        Slot { hash, entry }
    }

    /// Room for a new record: a table of [`SWEPT_FROM`] records or more
    /// that is full (a new record would grow it) is first rebuilt without
    /// the records that may be dropped ([`Packed::can_be_dropped`]: expired
    /// at `now_ms`, and by the monotonic clock, which `monotonic_ms` reads
    /// only when the table is rebuilt).
    /// It is rebuilt with room for twice its live records (at least
    /// [`SWEPT_FROM`]): larger when few expired, smaller after a peak, and
    /// a rebuild comes only after at least as many new records as it kept,
    /// so that its cost, like a growth's, is spread over them. Swept in
    /// place first, each record read once (its fields are in its own
    /// allocation: a read per record is a cache miss in a large table),
    /// then moved into the new table by its kept hash: a sweep alone would
    /// not do, as a table's removals leave marks that its capacity counts
    /// as taken, and it would fill again at once.
    pub(super) fn make_room(&mut self, now_ms: u64, monotonic_ms: impl FnOnce() -> u64) {
        let (len, capacity) = (self.table.len(), self.table.capacity());
        if len < SWEPT_FROM || len < capacity {
            return;
        }
        let monotonic_ms = monotonic_ms();
        #[cfg(test)]
        tests::REBUILDS.with(|rebuilds| rebuilds.set(rebuilds.get() + 1));
        self.table
            .retain(|(_, record)| !record.can_be_dropped(now_ms, monotonic_ms));
        let live = self.table.len();
        let mut table = HashTable::with_capacity((live * 2).max(SWEPT_FROM));
        for (hash, record) in std::mem::take(&mut self.table) {
            table.insert_unique(hash, (hash, record), |(hash, _)| *hash);
        }
        self.table = table;
    }

    /// Puts `record` in place of the one under its id, if there is one.
    pub(super) fn put(&mut self, record: Packed) {
        self.slot(record.id()).put(record);
    }

    pub(super) fn remove(&mut self, id: &str) {
        let hash = self.hash(id);
        if let Ok(found) = self.table.find_entry(hash, |(_, record)| record.is(id)) {
            found.remove();
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Packed> {
        self.table.iter().map(|(_, record)| record)
    }
}

/// The place of a record in [`Records`], whether one is there or not.
pub(super) struct Slot<'a> {
    hash: u64,
    entry: Entry<'a, (u64, Packed)>,
}

impl Slot<'_> {
    /// The record there.
    pub(super) fn get(&self) -> Option<&Packed> {
        match &self.entry {
            Entry::Occupied(kept) => Some(&kept.get().1),
            Entry::Vacant(_) => None,
        }
    }

    /// Puts `record` there, in place of the one there if there is one.
    /// `record` must have the id the slot was found by.
    pub(super) fn put(self, record: Packed) {
        match self.entry {
            Entry::Occupied(mut kept) => kept.get_mut().1 = record,
            Entry::Vacant(free) => {
                free.insert((self.hash, record));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        store::{OwnerToken, Record, RecordId, Status},
        Fingerprint,
    };

    thread_local! {
        /// The rebuilds made on this thread.
        pub(super) static REBUILDS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    fn record(id: &str, expiration_s: u64) -> Packed {
        Packed::new(Record {
            id: RecordId::from_stored(id),
            status: Status::Completed,
            owner: OwnerToken::from_stored("o"),
            fingerprint: Fingerprint::from_stored("f"),
            expiration_s,
            lease_until_ms: None,
            response: None,
            created_at_ms: None,
            attempt: 1,
            first_started_ms: None,
            completed_at_ms: None,
        })
    }

    /// Puts `count` new records from `first` on, written at `now_s` to
    /// expire at `expiration_s`, making room first as `MemoryStore::claim`
    /// does.
    fn claim_new(records: &mut Records, first: usize, count: usize, now_s: u64, expiration_s: u64) {
        // The writer's clock and the monotonic one agree here.
        let (now_ms, monotonic_ms) = (now_s * 1000, now_s * 1000);
        for i in first..first + count {
            records.make_room(now_ms, || monotonic_ms);
            let mut written = record(&format!("charges#{i}"), 0);
            written.expire_at(expiration_s, now_ms, monotonic_ms);
            records.put(written);
        }
    }

    #[test]
    fn a_full_table_is_rebuilt_without_its_expired_records_before_it_grows() {
        let mut records = Records::default();
        // 5,000 records claimed at 10 s that expire at 100 s: all live.
        claim_new(&mut records, 0, 5000, 10, 100);
        assert_eq!(records.iter().count(), 5000, "no live record is dropped");
        // 5,000 more at 200 s: the first 5,000 have expired, and go before
        // the table would grow for the new ones.
        let capacity = records.table.capacity();
        claim_new(&mut records, 5000, 5000, 200, 300);
        assert!(
            records.iter().all(|r| r.expiration_s() == 300),
            "every expired record went"
        );
        assert_eq!(records.iter().count(), 5000);
        assert!(
            records.table.capacity() <= capacity,
            "the table did not grow"
        );
        assert!((5000..10_000).all(|i| records.get(&format!("charges#{i}")).is_some()));
    }

    #[test]
    fn a_clock_ahead_alone_drops_nothing() {
        // 5,000 records written at 10 s, live until 100 s; then a write
        // whose clock reads 10,000 s (stepped ahead, or another engine's)
        // one millisecond later by the monotonic clock, at a full table.
        let mut records = Records::default();
        claim_new(&mut records, 0, 5000, 10, 100);
        while records.table.len() < records.table.capacity() {
            let i = records.table.len();
            claim_new(&mut records, i, 1, 10, 100);
        }
        let held = records.table.len();
        records.make_room(10_000_000, || 10_001);
        assert_eq!(records.iter().count(), held, "no record dropped");
    }

    #[test]
    fn a_table_is_rebuilt_smaller_after_a_peak() {
        let mut records = Records::default();
        claim_new(&mut records, 0, 50_000, 10, 11);
        let peak = records.table.capacity();
        // Well after: new records until the table is full and rebuilt
        // with room for the live ones only; by then at the latest (a bound,
        // so that a table that is never rebuilt smaller fails here rather
        // than growing for ever).
        let mut i = 50_000;
        while records.table.capacity() >= peak && i <= peak {
            claim_new(&mut records, i, 1, 100, 200);
            i += 1;
        }
        assert!(
            records.table.capacity() < peak,
            "rebuilt smaller when it was full"
        );
        assert!(records.iter().all(|r| r.expiration_s() == 200));
        assert_eq!(records.iter().count(), i - 50_000);
    }

    #[test]
    fn a_small_table_and_a_table_with_room_keep_their_expired_records() {
        let mut records = Records::default();
        claim_new(&mut records, 0, SWEPT_FROM - 1, 10, 5);
        assert_eq!(
            records.iter().count(),
            SWEPT_FROM - 1,
            "below the size rebuilt"
        );
        let mut records = Records::default();
        claim_new(&mut records, 0, SWEPT_FROM, 10, 100);
        let (len, capacity) = (records.table.len(), records.table.capacity());
        assert!(len < capacity, "the table has room: {len} of {capacity}");
        claim_new(&mut records, SWEPT_FROM, 1, 200, 300);
        assert_eq!(
            records.iter().count(),
            SWEPT_FROM + 1,
            "kept while there is room"
        );
    }

    #[test]
    fn a_table_mostly_live_grows_rather_than_rebuilding_at_every_record() {
        // One record in a hundred expired: a rebuild frees too little, so
        // the table grows, and the next rebuild waits for it to fill again.
        REBUILDS.with(|rebuilds| rebuilds.set(0));
        let mut records = Records::default();
        for i in 0..20_000 {
            let expiration_s = if i % 100 == 0 { 1 } else { 1_000 };
            records.make_room(50_000, || 50_000);
            let mut written = record(&format!("charges#{i}"), 0);
            written.expire_at(expiration_s, 0, 0);
            records.put(written);
        }
        let rebuilds = REBUILDS.with(std::cell::Cell::get);
        assert!(rebuilds <= 6, "{rebuilds} rebuilds for 20,000 records");
        assert!(records.iter().count() > 19_000);
    }

    #[test]
    fn records_are_found_replaced_updated_and_removed_by_id_as_the_table_grows() {
        let mut records = Records::default();
        for i in 0..1000 {
            records.put(record(&format!("charges#é{i}"), i));
        }
        records.put(record("charges#é7", 70));
        assert_eq!(records.iter().count(), 1000, "replaced, not added");
        assert_eq!(
            records.get("charges#é7").map(|r| r.expiration_s()),
            Some(70)
        );
        assert!(records.get("charges#é").is_none());
        if let Some(kept) = records.get_mut("charges#é999") {
            kept.expire_at(1, 0, 0);
        }
        assert_eq!(
            records.get("charges#é999").map(|r| r.expiration_s()),
            Some(1)
        );
        let slot = records.slot("charges#é8");
        assert_eq!(slot.get().map(|r| r.expiration_s()), Some(8));
        slot.put(record("charges#é8", 80));
        assert_eq!(
            records.get("charges#é8").map(|r| r.expiration_s()),
            Some(80)
        );
        let slot = records.slot("charges#new");
        assert!(slot.get().is_none());
        slot.put(record("charges#new", 5));
        assert_eq!(
            records.get("charges#new").map(|r| r.expiration_s()),
            Some(5)
        );
        records.remove("charges#new");
        records.remove("charges#é0");
        records.remove("charges#é0");
        assert!(records.get("charges#é0").is_none());
        assert_eq!(records.iter().count(), 999);
        assert!((1..1000).all(|i| records.get(&format!("charges#é{i}")).is_some()));
    }
}
