//! The memory store's records, found by id: each kept beside its id's
//! hash.
//!
//! A server keeps every record until it expires, so the table grows with
//! the requests, and each time it grows every record is placed again. A
//! set of records hashed its ids again for that (SipHash over some 80
//! bytes each: about 0.5 µs of every new request of the server benchmark,
//! amortised); here the hash is computed once, when the record is put, and
//! an update is made in place rather than by a removal and an insertion.

use super::packed::Packed;
use hashbrown::{hash_table::Entry, HashTable};
use std::hash::{BuildHasher, RandomState};

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

    #[test]
    fn records_are_found_replaced_updated_and_removed_by_id_as_the_table_grows() {
        let mut records = Records::default();
        for i in 0..1000 {
            records.put(record(&format!("charges#é{i}"), i));
        }
        records.put(record("charges#é7", 70));
        assert_eq!(records.iter().count(), 1000, "replaced, not added");
        assert_eq!(records.get("charges#é7").map(|r| r.expiration_s), Some(70));
        assert!(records.get("charges#é").is_none());
        if let Some(kept) = records.get_mut("charges#é999") {
            kept.expiration_s = 1;
        }
        assert_eq!(records.get("charges#é999").map(|r| r.expiration_s), Some(1));
        let slot = records.slot("charges#é8");
        assert_eq!(slot.get().map(|r| r.expiration_s), Some(8));
        slot.put(record("charges#é8", 80));
        assert_eq!(records.get("charges#é8").map(|r| r.expiration_s), Some(80));
        let slot = records.slot("charges#new");
        assert!(slot.get().is_none());
        slot.put(record("charges#new", 5));
        assert_eq!(records.get("charges#new").map(|r| r.expiration_s), Some(5));
        records.remove("charges#new");
        records.remove("charges#é0");
        records.remove("charges#é0");
        assert!(records.get("charges#é0").is_none());
        assert_eq!(records.iter().count(), 999);
        assert!((1..1000).all(|i| records.get(&format!("charges#é{i}")).is_some()));
    }
}
