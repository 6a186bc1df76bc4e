//! The fencing decision, the protocol's core promise: whose record is this,
//! and may I act on it?
//!
//! Every step that meets a record decides it here and nowhere else: the
//! claim and its takeover (what a refused claim found, what a read found
//! after a lost answer), the single write, the completion, the release and
//! the lapse of a takeover, the lease extension, the in-transaction claim
//! and the durable steps. [`fence`] is a pure function of the record's
//! status, owner, lease and expiry, the caller's token and the time; each
//! step only says what the answer means for it.

use crate::store::{Claim, OwnerToken, Record, Status};

/// What a record found under a key means to the holder of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// No record holds the key: there is none, or it expired and counts as
    /// absent. Nothing of the caller's is there either.
    Free,
    /// The caller's own claim (or takeover) is in progress, under a lease
    /// that has not passed: a write of its that landed although its answer
    /// was lost. (Its own claim whose lease passed is [`Lapsed`](Fence::Lapsed):
    /// taken over, by its own token too, so that a lease is written again.)
    OwnClaim,
    /// The caller's own completed record, whatever its expiry: its
    /// completion (or single write) landed, or, for a durable execution
    /// whose token is the same in every invocation, it completed the key in
    /// an earlier one. Nobody else's write has replaced it.
    OwnCompletion,
    /// Another owner's live record holds the key: a completed one, or a
    /// claim whose lease has not passed (one without a lease lasts until it
    /// expires, as the stores' claim conditions read it).
    Held,
    /// A claim whose lease passed, not yet expired: the next claimant takes
    /// it over, told that its attempt may have acted. Another owner's, or
    /// the caller's own (a durable execution claiming again after it gave a
    /// takeover back, or a claim answered after its lease).
    Lapsed,
}

/// Decides what `record` means to the holder of `owner` at `now_ms`.
///
/// The order is the decision: the caller's own completion first (its
/// write, whatever its age), then its own live claim, then expiry (an
/// expired record is absent, whoever wrote it), then status and lease,
/// whoever's: a claim whose lease passed is lapsed, the caller's own too,
/// since nothing holds it any more.
pub(crate) fn fence(record: Option<&Record>, owner: &OwnerToken, now_ms: u64) -> Fence {
    let Some(record) = record else {
        return Fence::Free;
    };
    let own = record.owner == *owner;
    match record.status {
        Status::Completed if own => return Fence::OwnCompletion,
        Status::InProgress if own && record.is_live(now_ms) => return Fence::OwnClaim,
        _ => {}
    }
    if record.is_expired(now_ms) {
        return Fence::Free;
    }
    match record.status {
        Status::Completed => Fence::Held,
        Status::InProgress if record.is_live(now_ms) => Fence::Held,
        Status::InProgress => Fence::Lapsed,
    }
}

/// The takeover of `lapsed` by `claim`: the same claim under its own
/// token, as the next attempt, keeping when the first attempt began.
pub(crate) fn takeover_of(claim: &Claim, lapsed: &Record) -> Claim {
    Claim {
        attempt: lapsed.attempt.saturating_add(1),
        first_started_ms: lapsed
            .first_started_ms
            .or(lapsed.created_at_ms)
            .unwrap_or(claim.now_ms),
        ..claim.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{store::RecordId, Fingerprint};

    const NOW_MS: u64 = 1_700_000_000_500;

    fn token(name: &str) -> OwnerToken {
        OwnerToken::from_stored(name)
    }

    fn record(status: Status, owner: &str, lease: Option<u64>, expiration_s: u64) -> Record {
        Record {
            id: RecordId::new("p", "s", "k"),
            status,
            owner: token(owner),
            fingerprint: Fingerprint::of_bytes(b"{}"),
            expiration_s,
            lease_until_ms: lease,
            response: (status == Status::Completed).then(Vec::new),
            created_at_ms: None,
            attempt: 1,
            first_started_ms: None,
            completed_at_ms: None,
        }
    }

    /// Every combination of status, owner, lease and expiry, against the
    /// decision written out as a table.
    #[test]
    fn every_combination_of_status_owner_lease_and_expiry() {
        use Fence::*;
        let now_s = NOW_MS / 1000;
        // (lease, its name): none, passed, this very millisecond, ahead.
        let leases = [
            (None, "no lease"),
            (Some(NOW_MS - 1), "passed"),
            (Some(NOW_MS), "ends now"),
            (Some(NOW_MS + 1), "ahead"),
        ];
        // Expired only once `now` is past the expiration's second.
        let expiries = [(now_s - 1, true), (now_s, false), (now_s + 60, false)];
        let mut checked = 0;
        for status in [Status::InProgress, Status::Completed] {
            for own in [true, false] {
                for (lease, lease_name) in leases {
                    for (expiration_s, expired) in expiries {
                        let found = record(
                            status,
                            if own { "me" } else { "other" },
                            lease,
                            expiration_s,
                        );
                        let lease_live = lease.is_none_or(|until| until >= NOW_MS);
                        let expected = match (status, own, expired, lease_live) {
                            (Status::Completed, true, _, _) => OwnCompletion,
                            (Status::InProgress, true, false, true) => OwnClaim,
                            (_, _, true, _) => Free,
                            (Status::Completed, false, false, _) => Held,
                            (Status::InProgress, false, false, true) => Held,
                            (Status::InProgress, _, false, false) => Lapsed,
                        };
                        assert_eq!(
                            fence(Some(&found), &token("me"), NOW_MS),
                            expected,
                            "{status} owned by {} with lease {lease_name}, expiration {expiration_s}",
                            if own { "me" } else { "another" },
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 2 * 4 * 3);
        assert_eq!(fence(None, &token("me"), NOW_MS), Free);
    }

    #[test]
    fn a_takeover_is_the_next_attempt_and_keeps_the_first_start() {
        let claim = Claim {
            id: RecordId::new("p", "s", "k"),
            owner: token("me"),
            fingerprint: Fingerprint::of_bytes(b"{}"),
            now_ms: NOW_MS,
            lease_until_ms: NOW_MS + 1_000,
            expiration_s: NOW_MS / 1000 + 60,
            attempt: 1,
            first_started_ms: NOW_MS,
        };
        let mut lapsed = record(
            Status::InProgress,
            "other",
            Some(NOW_MS - 1),
            NOW_MS / 1000 + 60,
        );
        lapsed.attempt = 2;
        lapsed.created_at_ms = Some(5);
        let takeover = takeover_of(&claim, &lapsed);
        assert_eq!((takeover.attempt, takeover.first_started_ms), (3, 5));
        assert_eq!(takeover.owner, claim.owner);
        lapsed.first_started_ms = Some(3);
        assert_eq!(takeover_of(&claim, &lapsed).first_started_ms, 3);
        lapsed.created_at_ms = None;
        lapsed.first_started_ms = None;
        assert_eq!(takeover_of(&claim, &lapsed).first_started_ms, NOW_MS);
        lapsed.attempt = u32::MAX;
        assert_eq!(takeover_of(&claim, &lapsed).attempt, u32::MAX);
    }
}
