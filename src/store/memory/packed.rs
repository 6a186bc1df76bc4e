//! A record as the memory store keeps it: its strings in one allocation.
//!
//! A server keeps every completed record until it expires, so each one is
//! memory retained among the short-lived allocations of every request.
//! Kept as a [`Record`] under its id, a record held five allocations (the
//! map's key, the id, the owner, the fingerprint, the response), and those
//! small long-lived chunks, scattered through the heap, cost the allocator
//! about 3 µs of every later request of the server benchmark (glibc walks
//! fragmented bins). Packed, it holds two: its strings and its response.

use crate::{
    store::{OwnerToken, Record, RecordId, Status},
    Fingerprint,
};
use std::{
    borrow::Borrow,
    hash::{Hash, Hasher},
};

/// A record, found in a set by its id (`Borrow<str>`).
#[derive(Debug)]
pub(super) struct Packed {
    /// The id, the owner and the fingerprint, one after the other.
    strings: Box<str>,
    id_end: usize,
    owner_end: usize,
    pub(super) status: Status,
    pub(super) expiration_s: u64,
    pub(super) lease_until_ms: Option<u64>,
    pub(super) response: Option<Vec<u8>>,
    created_at_ms: Option<u64>,
    attempt: u32,
    first_started_ms: Option<u64>,
    pub(super) completed_at_ms: Option<u64>,
}

impl Packed {
    pub(super) fn new(record: Record) -> Self {
        let (id, owner, fingerprint) = (
            record.id.as_str(),
            record.owner.as_str(),
            record.fingerprint.as_str(),
        );
        let mut strings = String::with_capacity(id.len() + owner.len() + fingerprint.len());
        strings.push_str(id);
        strings.push_str(owner);
        strings.push_str(fingerprint);
        Self {
            strings: strings.into_boxed_str(),
            id_end: id.len(),
            owner_end: id.len() + owner.len(),
            status: record.status,
            expiration_s: record.expiration_s,
            lease_until_ms: record.lease_until_ms,
            response: record.response,
            created_at_ms: record.created_at_ms,
            attempt: record.attempt,
            first_started_ms: record.first_started_ms,
            completed_at_ms: record.completed_at_ms,
        }
    }

    /// The record, unpacked.
    pub(super) fn record(&self) -> Record {
        Record {
            id: RecordId::from_stored(self.id()),
            status: self.status,
            owner: OwnerToken::from_stored(self.owner()),
            fingerprint: Fingerprint::from_stored(self.part(self.owner_end, self.strings.len())),
            expiration_s: self.expiration_s,
            lease_until_ms: self.lease_until_ms,
            response: self.response.clone(),
            created_at_ms: self.created_at_ms,
            attempt: self.attempt,
            first_started_ms: self.first_started_ms,
            completed_at_ms: self.completed_at_ms,
        }
    }

    pub(super) fn id(&self) -> &str {
        self.part(0, self.id_end)
    }

    /// As [`Record::is_expired`].
    pub(super) fn is_expired(&self, now_ms: u64) -> bool {
        self.expiration_s < now_ms / 1000
    }

    /// Whether `owner`'s claim holds the record: in progress, under its token.
    pub(super) fn held_by(&self, owner: &OwnerToken) -> bool {
        self.status == Status::InProgress && self.owner() == owner.as_str()
    }

    fn owner(&self) -> &str {
        self.part(self.id_end, self.owner_end)
    }

    /// The offsets are the lengths of the strings packed in `new`, so they
    /// fall on character boundaries.
    fn part(&self, start: usize, end: usize) -> &str {
        self.strings.get(start..end).unwrap_or_default()
    }
}

impl Borrow<str> for Packed {
    fn borrow(&self) -> &str {
        self.id()
    }
}

// By id alone, as `str` hashes and compares, so that a set finds a record
// by its id.
impl Hash for Packed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id().hash(state);
    }
}

impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Packed {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_record_unpacks_as_it_was_packed_and_is_found_by_its_id() {
        let record = Record {
            id: RecordId::from_stored("charges#é1"),
            status: Status::Completed,
            owner: OwnerToken::from_stored("owner-ü"),
            fingerprint: Fingerprint::from_stored("f1"),
            expiration_s: 7,
            lease_until_ms: Some(8),
            response: Some(b"{}".to_vec()),
            created_at_ms: Some(1),
            attempt: 3,
            first_started_ms: Some(2),
            completed_at_ms: Some(4),
        };
        let packed = Packed::new(record.clone());
        assert_eq!(packed.record(), record);
        assert!(
            !packed.held_by(&OwnerToken::from_stored("owner-ü")),
            "completed"
        );
        let mut set = HashSet::new();
        set.insert(packed);
        assert!(set.contains("charges#é1"));
        assert!(!set.contains("charges#é"));
    }
}
