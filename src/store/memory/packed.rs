//! A record as the memory store keeps it: in one allocation.
//!
//! A server keeps every completed record until it expires, so each one is
//! memory retained among the short-lived allocations of every request.
//! Kept as a [`Record`] under its id, a record held five allocations (the
//! map's key, the id, the owner, the fingerprint, the response), and those
//! small long-lived chunks, scattered through the heap, cost the allocator
//! about 3 µs of every later request of the server benchmark (glibc walks
//! fragmented bins). Packed, it holds one: its strings, then its response.
//! A completion writes the record again with its response (the claim's
//! allocation, freed, is the size the next claim asks for).

use crate::{
    store::{Claim, OwnerToken, Record, RecordId, Status},
    Fingerprint,
};

/// A record, found in a set by its id (`Borrow<str>`).
#[derive(Debug)]
pub(super) struct Packed {
    /// The id, the owner and the fingerprint (text), one after the other,
    /// then the response, if there is one.
    data: Box<[u8]>,
    id_end: usize,
    owner_end: usize,
    fingerprint_end: usize,
    has_response: bool,
    pub(super) status: Status,
    pub(super) expiration_s: u64,
    /// When `expiration_s` passes by this process's monotonic clock
    /// ([`monotonic_ms`]), as the write that set it (a completion, an
    /// extension, a single write) measured the time left; `u64::MAX` for a
    /// claim's record until one of those sets it, and for a record
    /// put without a time of its own (`MemoryStore::insert_record`). A
    /// record is dropped only once both clocks say it expired
    /// ([`Packed::can_be_dropped`]).
    lapses_at_ms: u64,
    pub(super) lease_until_ms: Option<u64>,
    created_at_ms: Option<u64>,
    attempt: u32,
    first_started_ms: Option<u64>,
    pub(super) completed_at_ms: Option<u64>,
}

/// The strings, one after the other, in one allocation (a completion
/// adds the response after them: [`Packed::set_response`]).
fn pack(id: &str, owner: &str, fingerprint: &str) -> Box<[u8]> {
    let mut data = Vec::with_capacity(id.len() + owner.len() + fingerprint.len());
    data.extend_from_slice(id.as_bytes());
    data.extend_from_slice(owner.as_bytes());
    data.extend_from_slice(fingerprint.as_bytes());
    data.into_boxed_slice()
}

/// Milliseconds on this process's monotonic clock, which no change of the
/// wall clock moves.
pub(super) fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = START.get_or_init(std::time::Instant::now).elapsed();
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// When a record that expires at `expiration_s`, written at `now_ms`,
/// expires by the monotonic clock, read as `monotonic_ms` at the write:
/// the time its writer left it (to the end of its expiry's second, as
/// [`Packed::is_expired`] counts), from then.
fn lapses_at(expiration_s: u64, now_ms: u64, monotonic_ms: u64) -> u64 {
    let left_ms = expiration_s
        .saturating_add(1)
        .saturating_mul(1000)
        .saturating_sub(now_ms);
    monotonic_ms.saturating_add(left_ms)
}

impl Packed {
    pub(super) fn new(record: Record) -> Self {
        let mut packed = Self::claimed_from(&Claim {
            id: record.id,
            owner: record.owner,
            fingerprint: record.fingerprint,
            now_ms: 0,
            lease_until_ms: 0,
            expiration_s: record.expiration_s,
            attempt: record.attempt,
            first_started_ms: 0,
        });
        if let Some(response) = &record.response {
            packed.set_response(response);
        }
        packed.status = record.status;
        packed.lease_until_ms = record.lease_until_ms;
        packed.created_at_ms = record.created_at_ms;
        packed.first_started_ms = record.first_started_ms;
        packed.completed_at_ms = record.completed_at_ms;
        packed
    }

    /// The fresh `IN_PROGRESS` record a claim writes, packed from the
    /// claim's strings as they are (not cloned into a [`Record`] first:
    /// every new request makes one).
    pub(super) fn claimed_from(claim: &Claim) -> Self {
        let (id, owner, fingerprint) = (
            claim.id.as_str(),
            claim.owner.as_str(),
            claim.fingerprint.as_str(),
        );
        Self {
            data: pack(id, owner, fingerprint),
            id_end: id.len(),
            owner_end: id.len() + owner.len(),
            fingerprint_end: id.len() + owner.len() + fingerprint.len(),
            has_response: false,
            status: Status::InProgress,
            expiration_s: claim.expiration_s,
            // No clock is read for it: every new request claims.
            lapses_at_ms: u64::MAX,
            lease_until_ms: Some(claim.lease_until_ms),
            created_at_ms: Some(claim.now_ms),
            attempt: claim.attempt,
            first_started_ms: Some(claim.first_started_ms),
            completed_at_ms: None,
        }
    }

    /// Packs the record again, with `response` after its strings.
    pub(super) fn set_response(&mut self, response: &[u8]) {
        // The strings are packed already: copied as they stand, in one
        // piece, rather than read back as text one by one.
        let strings = &self.data[..self.fingerprint_end];
        let mut data = Vec::with_capacity(strings.len() + response.len());
        data.extend_from_slice(strings);
        data.extend_from_slice(response);
        self.data = data.into_boxed_slice();
        self.has_response = true;
    }

    /// The record, unpacked.
    pub(super) fn record(&self) -> Record {
        Record {
            id: RecordId::from_stored_text(self.id()),
            status: self.status,
            owner: OwnerToken::from_stored_text(self.owner()),
            fingerprint: Fingerprint::from_stored_text(self.fingerprint()),
            expiration_s: self.expiration_s,
            lease_until_ms: self.lease_until_ms,
            response: self.response().map(<[u8]>::to_vec),
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

    /// Sets the record's expiry, written at `now_ms` (the writer's clock)
    /// and `monotonic_ms`.
    pub(super) fn expire_at(&mut self, expiration_s: u64, now_ms: u64, monotonic_ms: u64) {
        self.expiration_s = expiration_s;
        self.lapses_at_ms = lapses_at(expiration_s, now_ms, monotonic_ms);
    }

    /// Whether the record may be dropped: expired at `now_ms` (the
    /// caller's clock), and as long after its write by the monotonic clock
    /// as its writer's clock gave it. A clock stepped ahead, or one
    /// engine's clock ahead of another's, finds records expired that are
    /// not: alone, it would drop them, and their keys would run again.
    pub(super) fn can_be_dropped(&self, now_ms: u64, monotonic_ms: u64) -> bool {
        self.is_expired(now_ms) && monotonic_ms >= self.lapses_at_ms
    }

    /// Whether the record's id is `id` (its bytes compared, not checked
    /// for UTF-8 again: a look-up compares ids).
    pub(super) fn is(&self, id: &str) -> bool {
        self.data.get(..self.id_end) == Some(id.as_bytes())
    }

    /// Whether `owner`'s claim holds the record: in progress, under its token.
    pub(super) fn held_by(&self, owner: &OwnerToken) -> bool {
        self.status == Status::InProgress
            && self.data.get(self.id_end..self.owner_end) == Some(owner.as_str().as_bytes())
    }

    fn owner(&self) -> &str {
        self.part(self.id_end, self.owner_end)
    }

    fn fingerprint(&self) -> &str {
        self.part(self.owner_end, self.fingerprint_end)
    }

    fn response(&self) -> Option<&[u8]> {
        self.has_response
            .then(|| self.data.get(self.fingerprint_end..).unwrap_or_default())
    }

    /// The offsets are the lengths of the strings packed in `pack`, so they
    /// bound whole UTF-8 strings.
    fn part(&self, start: usize, end: usize) -> &str {
        self.data
            .get(start..end)
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_unpacks_as_it_was_packed() {
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
        // A response, none, and an empty one stay apart; a completion packs
        // the response after the strings.
        for response in [None, Some(Vec::new())] {
            let other = Record {
                response: response.clone(),
                ..record.clone()
            };
            assert_eq!(Packed::new(other.clone()).record(), other);
        }
        let mut claimed = Packed::new(Record {
            response: None,
            ..record.clone()
        });
        claimed.set_response(b"{}");
        assert_eq!(claimed.record(), record);
        assert_eq!(packed.id(), "charges#é1");
    }
}
