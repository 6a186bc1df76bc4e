//! A record as the memory store keeps it: its bytes, in one piece.
//!
//! A header of its fixed fields, its strings, then its response. Kept as a
//! [`Record`] under its id, a record held five allocations (the map's key,
//! the id, the owner, the fingerprint, the response); packed, it is one
//! run of bytes: a claim's allocation, or a completed record's place in a
//! block ([`super::arena`]). A completion writes the record again with its
//! response ([`Packed::completed`]), and the claim's allocation, freed, is
//! the size the next claim asks for.
//!
//! The fixed fields are in the record's bytes, not beside them: the table
//! holds each record as its hash and where its bytes are (24 bytes, where
//! the fields beside a pointer made 136). A growing table is written again
//! at each growth, and every page of it is new memory the kernel must
//! fault in and zero: at 136 bytes a record, the table's pages were four
//! of every ten page faults of the server benchmark's app on the memory
//! store, new keys (measured 2026-11-27: `git log -p BENCHMARKS.md`).

use crate::{
    store::{Claim, OwnerToken, Record, RecordId, Status},
    Fingerprint,
};

/// A record's bytes: in an allocation of its own (`Box<[u8]>`: a claim's
/// record, a large one), or where the store keeps them (`&[u8]`,
/// `&mut [u8]`: a completed record in its block).
pub(super) struct Packed<D = Box<[u8]>> {
    /// The [header](Header), then the id, the owner and the fingerprint
    /// (text), one after the other, then the response, if there is one.
    data: D,
}

/// As the record it holds, not as its bytes.
impl<D: AsRef<[u8]>> std::fmt::Debug for Packed<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.record().fmt(f)
    }
}

/// Where each fixed field is in a packed record's header. Numbers are
/// little-endian; an optional time is present when its flag is set.
struct Header;

impl Header {
    /// The [flags](Flag).
    const FLAGS: usize = 0;
    const ATTEMPT: usize = 4;
    /// The ends of the id, the owner and the fingerprint, from the start
    /// of the record (the header's end is the id's start).
    const ID_END: usize = 8;
    const OWNER_END: usize = 16;
    const FINGERPRINT_END: usize = 24;
    const EXPIRATION_S: usize = 32;
    /// When `expiration_s` passes by this process's monotonic clock
    /// ([`monotonic_ms`]), as the write that set it (a completion, an
    /// extension, a single write) measured the time left; `u64::MAX` for a
    /// claim's record until one of those sets it, and for a record put
    /// without a time of its own (`MemoryStore::insert_record`). A record
    /// is dropped only once both clocks say it expired
    /// ([`Packed::can_be_dropped`]).
    const LAPSES_AT_MS: usize = 40;
    const LEASE_UNTIL_MS: usize = 48;
    const CREATED_AT_MS: usize = 56;
    const FIRST_STARTED_MS: usize = 64;
    const COMPLETED_AT_MS: usize = 72;
    /// The header's length.
    const LEN: usize = 80;
}

/// The bits of a header's flags.
struct Flag;

impl Flag {
    const COMPLETED: u8 = 1;
    const HAS_RESPONSE: u8 = 1 << 1;
    const LEASE_UNTIL_MS: u8 = 1 << 2;
    const CREATED_AT_MS: u8 = 1 << 3;
    const FIRST_STARTED_MS: u8 = 1 << 4;
    const COMPLETED_AT_MS: u8 = 1 << 5;
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
        packed.set_flag(Flag::COMPLETED, record.status == Status::Completed);
        packed.set_time(
            Header::LEASE_UNTIL_MS,
            Flag::LEASE_UNTIL_MS,
            record.lease_until_ms,
        );
        packed.set_time(
            Header::CREATED_AT_MS,
            Flag::CREATED_AT_MS,
            record.created_at_ms,
        );
        packed.set_time(
            Header::FIRST_STARTED_MS,
            Flag::FIRST_STARTED_MS,
            record.first_started_ms,
        );
        packed.set_time(
            Header::COMPLETED_AT_MS,
            Flag::COMPLETED_AT_MS,
            record.completed_at_ms,
        );
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
        let id_end = Header::LEN + id.len();
        let owner_end = id_end + owner.len();
        let fingerprint_end = owner_end + fingerprint.len();
        let mut data = Vec::with_capacity(fingerprint_end);
        data.resize(Header::LEN, 0);
        data.extend_from_slice(id.as_bytes());
        data.extend_from_slice(owner.as_bytes());
        data.extend_from_slice(fingerprint.as_bytes());
        let mut packed = Self {
            data: data.into_boxed_slice(),
        };
        packed.set_bytes_at(Header::ATTEMPT, claim.attempt.to_le_bytes());
        packed.set_u64(Header::ID_END, id_end as u64);
        packed.set_u64(Header::OWNER_END, owner_end as u64);
        packed.set_u64(Header::FINGERPRINT_END, fingerprint_end as u64);
        packed.set_u64(Header::EXPIRATION_S, claim.expiration_s);
        // No clock is read for it: every new request claims.
        packed.set_u64(Header::LAPSES_AT_MS, u64::MAX);
        packed.set_time(
            Header::LEASE_UNTIL_MS,
            Flag::LEASE_UNTIL_MS,
            Some(claim.lease_until_ms),
        );
        packed.set_time(
            Header::CREATED_AT_MS,
            Flag::CREATED_AT_MS,
            Some(claim.now_ms),
        );
        packed.set_time(
            Header::FIRST_STARTED_MS,
            Flag::FIRST_STARTED_MS,
            Some(claim.first_started_ms),
        );
        packed
    }

    /// Its bytes, to change in place.
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// Packs the record again, with `response` after its strings.
    fn set_response(&mut self, response: &[u8]) {
        // The header and the strings are packed already: copied as they
        // stand, in one piece, rather than read back one by one.
        let kept = &self.data[..self.end(Header::FINGERPRINT_END)];
        let mut data = Vec::with_capacity(kept.len() + response.len());
        data.extend_from_slice(kept);
        data.extend_from_slice(response);
        self.data = data.into_boxed_slice();
        self.set_flag(Flag::HAS_RESPONSE, true);
    }
}

impl<'a> Packed<&'a [u8]> {
    /// The record whose bytes, as a [`Packed`] record wrote them, are `data`.
    pub(super) fn of(data: &'a [u8]) -> Self {
        Self { data }
    }
}

impl<'a> Packed<&'a mut [u8]> {
    /// The record whose bytes, as a [`Packed`] record wrote them, are
    /// `data`, to change in place.
    pub(super) fn of_mut(data: &'a mut [u8]) -> Self {
        Self { data }
    }
}

/// A claim's record as its completion writes it: its header, then its
/// strings, then the response.
pub(super) struct Completed<'a> {
    header: [u8; Header::LEN],
    strings: &'a [u8],
    response: &'a [u8],
}

impl Completed<'_> {
    /// Its parts, in order.
    pub(super) fn parts(&self) -> [&[u8]; 3] {
        [&self.header[..], self.strings, self.response]
    }

    /// When it lapses by the monotonic clock (see [`Packed::can_be_dropped`]).
    pub(super) fn lapses_at_ms(&self) -> u64 {
        Packed { data: self.header }.lapses_at_ms()
    }

    /// In an allocation of its own.
    pub(super) fn packed(&self) -> Packed {
        Packed {
            data: self.parts().concat().into_boxed_slice(),
        }
    }
}

impl<D: AsRef<[u8]> + AsMut<[u8]>> Packed<D> {
    /// Extends the lease of the claim that holds the record to
    /// `lease_until_ms`, and its expiry to `expiration_s`, at `now_ms`.
    pub(super) fn extend(&mut self, lease_until_ms: u64, expiration_s: u64, now_ms: u64) {
        self.set_time(
            Header::LEASE_UNTIL_MS,
            Flag::LEASE_UNTIL_MS,
            Some(lease_until_ms),
        );
        self.expire_at(expiration_s, now_ms, monotonic_ms());
    }

    /// Sets the record's expiry, written at `now_ms` (the writer's clock)
    /// and `monotonic_ms`.
    pub(super) fn expire_at(&mut self, expiration_s: u64, now_ms: u64, monotonic_ms: u64) {
        self.set_u64(Header::EXPIRATION_S, expiration_s);
        self.set_u64(
            Header::LAPSES_AT_MS,
            lapses_at(expiration_s, now_ms, monotonic_ms),
        );
    }

    fn set_flag(&mut self, flag: u8, set: bool) {
        let flags = &mut self.data.as_mut()[Header::FLAGS];
        if set {
            *flags |= flag;
        } else {
            *flags &= !flag;
        }
    }

    fn set_time(&mut self, field: usize, flag: u8, time: Option<u64>) {
        self.set_flag(flag, time.is_some());
        self.set_u64(field, time.unwrap_or_default());
    }

    fn set_u64(&mut self, field: usize, value: u64) {
        self.set_bytes_at(field, value.to_le_bytes());
    }

    fn set_bytes_at<const N: usize>(&mut self, field: usize, bytes: [u8; N]) {
        self.data.as_mut()[field..field + N].copy_from_slice(&bytes);
    }
}

impl<D: AsRef<[u8]>> Packed<D> {
    /// The record as the completion of the claim that holds it writes it,
    /// at `now_ms`, to expire at `expiration_s`, with `response`.
    pub(super) fn completed<'a>(
        &'a self,
        response: &'a [u8],
        now_ms: u64,
        expiration_s: u64,
    ) -> Completed<'a> {
        let mut header = Packed {
            data: self.bytes_at::<{ Header::LEN }>(0),
        };
        header.set_flag(Flag::HAS_RESPONSE, true);
        header.set_flag(Flag::COMPLETED, true);
        header.expire_at(expiration_s, now_ms, monotonic_ms());
        header.set_time(Header::LEASE_UNTIL_MS, Flag::LEASE_UNTIL_MS, None);
        header.set_time(Header::COMPLETED_AT_MS, Flag::COMPLETED_AT_MS, Some(now_ms));
        Completed {
            header: header.data,
            strings: &self.data.as_ref()[Header::LEN..self.end(Header::FINGERPRINT_END)],
            response,
        }
    }

    /// Its bytes, as written.
    pub(super) fn bytes(&self) -> &[u8] {
        self.data.as_ref()
    }

    /// The record, in an allocation of its own.
    pub(super) fn copied(&self) -> Packed {
        Packed {
            data: self.bytes().into(),
        }
    }

    /// The record, unpacked.
    pub(super) fn record(&self) -> Record {
        Record {
            id: RecordId::from_stored_text(self.id()),
            status: self.status(),
            owner: OwnerToken::from_stored_text(self.owner()),
            fingerprint: Fingerprint::from_stored_text(self.fingerprint()),
            expiration_s: self.expiration_s(),
            lease_until_ms: self.lease_until_ms(),
            response: self.response().map(<[u8]>::to_vec),
            created_at_ms: self.time(Header::CREATED_AT_MS, Flag::CREATED_AT_MS),
            attempt: u32::from_le_bytes(self.bytes_at(Header::ATTEMPT)),
            first_started_ms: self.time(Header::FIRST_STARTED_MS, Flag::FIRST_STARTED_MS),
            completed_at_ms: self.time(Header::COMPLETED_AT_MS, Flag::COMPLETED_AT_MS),
        }
    }

    pub(super) fn id(&self) -> &str {
        self.part(Header::LEN, self.end(Header::ID_END))
    }

    pub(super) fn status(&self) -> Status {
        if self.flag(Flag::COMPLETED) {
            Status::Completed
        } else {
            Status::InProgress
        }
    }

    pub(super) fn expiration_s(&self) -> u64 {
        self.u64_at(Header::EXPIRATION_S)
    }

    pub(super) fn lease_until_ms(&self) -> Option<u64> {
        self.time(Header::LEASE_UNTIL_MS, Flag::LEASE_UNTIL_MS)
    }

    /// As [`Record::is_expired`].
    pub(super) fn is_expired(&self, now_ms: u64) -> bool {
        self.expiration_s() < now_ms / 1000
    }

    /// Whether the record may be dropped: expired at `now_ms` (the
    /// caller's clock), and as long after its write by the monotonic clock
    /// as its writer's clock gave it. A clock stepped ahead, or one
    /// engine's clock ahead of another's, finds records expired that are
    /// not: alone, it would drop them, and their keys would run again.
    pub(super) fn can_be_dropped(&self, now_ms: u64, monotonic_ms: u64) -> bool {
        self.is_expired(now_ms) && monotonic_ms >= self.lapses_at_ms()
    }

    /// When the record's expiry passes by the monotonic clock: it is not
    /// dropped before.
    pub(super) fn lapses_at_ms(&self) -> u64 {
        self.u64_at(Header::LAPSES_AT_MS)
    }

    /// Whether the record's id is `id` (its bytes compared, not checked
    /// for UTF-8 again: a look-up compares ids).
    pub(super) fn is(&self, id: &str) -> bool {
        self.data
            .as_ref()
            .get(Header::LEN..self.end(Header::ID_END))
            == Some(id.as_bytes())
    }

    /// Whether `owner`'s claim holds the record: in progress, under its token.
    pub(super) fn held_by(&self, owner: &OwnerToken) -> bool {
        self.status() == Status::InProgress
            && self
                .data
                .as_ref()
                .get(self.end(Header::ID_END)..self.end(Header::OWNER_END))
                == Some(owner.as_str().as_bytes())
    }

    fn owner(&self) -> &str {
        self.part(self.end(Header::ID_END), self.end(Header::OWNER_END))
    }

    fn fingerprint(&self) -> &str {
        self.part(
            self.end(Header::OWNER_END),
            self.end(Header::FINGERPRINT_END),
        )
    }

    fn response(&self) -> Option<&[u8]> {
        self.flag(Flag::HAS_RESPONSE).then(|| {
            self.data
                .as_ref()
                .get(self.end(Header::FINGERPRINT_END)..)
                .unwrap_or_default()
        })
    }

    /// The offsets are those of the strings packed in `claimed_from`, so
    /// they bound whole UTF-8 strings.
    fn part(&self, start: usize, end: usize) -> &str {
        self.data
            .as_ref()
            .get(start..end)
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .unwrap_or_default()
    }

    /// The end of a string (`field`: one of the header's ends).
    fn end(&self, field: usize) -> usize {
        usize::try_from(self.u64_at(field)).unwrap_or(usize::MAX)
    }

    fn flag(&self, flag: u8) -> bool {
        self.data.as_ref()[Header::FLAGS] & flag != 0
    }

    fn time(&self, field: usize, flag: u8) -> Option<u64> {
        self.flag(flag).then(|| self.u64_at(field))
    }

    fn u64_at(&self, field: usize) -> u64 {
        u64::from_le_bytes(self.bytes_at(field))
    }

    /// The header's `N` bytes at `field`.
    fn bytes_at<const N: usize>(&self, field: usize) -> [u8; N] {
        let mut bytes = [0; N];
        bytes.copy_from_slice(&self.data.as_ref()[field..field + N]);
        bytes
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
        assert_eq!(
            format!("{packed:?}"),
            format!("{record:?}"),
            "shown as its record"
        );
    }

    /// Each fixed field keeps its own value at the edges of its type, and
    /// each time is present or absent on its own (absent apart from zero).
    #[test]
    fn fixed_fields_unpack_at_the_edges_of_their_types() {
        for (value, attempt) in [(0, 0), (1, 1), (u64::MAX, u32::MAX)] {
            for present in 0..16 {
                let time =
                    |bit: u32, divisor: u64| (present & (1 << bit) != 0).then_some(value / divisor);
                let record = Record {
                    id: RecordId::from_stored(""),
                    status: Status::InProgress,
                    owner: OwnerToken::from_stored(""),
                    fingerprint: Fingerprint::from_stored(""),
                    expiration_s: value,
                    lease_until_ms: time(0, 1),
                    response: None,
                    created_at_ms: time(1, 2),
                    attempt,
                    first_started_ms: time(2, 3),
                    completed_at_ms: time(3, 5),
                };
                assert_eq!(Packed::new(record.clone()).record(), record);
            }
        }
    }

    /// A completion sets what a completed record holds, and keeps the rest.
    #[test]
    fn a_completion_clears_the_lease_and_keeps_the_claim_s_fields() {
        let claim = Claim {
            id: RecordId::from_stored("charges#1"),
            owner: OwnerToken::from_stored("owner"),
            fingerprint: Fingerprint::from_stored("f"),
            now_ms: 1_000,
            lease_until_ms: 31_000,
            expiration_s: 60,
            attempt: 2,
            first_started_ms: 500,
        };
        let packed = Packed::claimed_from(&claim);
        assert!(packed.held_by(&claim.owner));
        assert!(
            !packed.can_be_dropped(u64::MAX, u64::MAX - 1),
            "held until a write sets its expiry"
        );
        let packed = packed.completed(b"done", 2_000, 3_600).packed();
        assert_eq!(
            packed.record(),
            Record {
                id: claim.id.clone(),
                status: Status::Completed,
                owner: claim.owner.clone(),
                fingerprint: claim.fingerprint.clone(),
                expiration_s: 3_600,
                lease_until_ms: None,
                response: Some(b"done".to_vec()),
                created_at_ms: Some(1_000),
                attempt: 2,
                first_started_ms: Some(500),
                completed_at_ms: Some(2_000),
            }
        );
        assert!(!packed.held_by(&claim.owner), "completed");
    }
}
