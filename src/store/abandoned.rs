//! Abandoned claims, as a store finds them: `IN_PROGRESS` records whose
//! lease passed and that nobody took over (their caller died and never
//! retried), for the completer
//! ([`Engine::complete_abandoned`](crate::Engine::complete_abandoned)).
//!
//! Finding them is a walk of the store in pages
//! ([`Store::list_abandoned`](super::Store::list_abandoned)): each call
//! does a bounded amount of work and hands back a [`PageCursor`] to go on
//! from, so a large table is walked a page at a time and never read in
//! one call. The capability is optional: the default answers
//! [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported), so
//! a store written outside this crate keeps compiling.
//!
//! Listing writes nothing. What the completer then does to a record is a
//! takeover, fenced as any takeover is, never a write of its own kind.

use super::Record;

/// Which abandoned claims to list, and from where
/// ([`Store::list_abandoned`](super::Store::list_abandoned)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AbandonedQuery {
    /// Only records whose id starts with this (an engine's prefix and `#`).
    pub prefix: String,
    /// The current time, epoch milliseconds: records expired at it are
    /// not listed.
    pub now_ms: u64,
    /// Only claims whose lease ended before this, epoch milliseconds
    /// (`now_ms` less how long ago it must have ended): a claim without a
    /// lease is never listed.
    pub lease_before_ms: u64,
    /// The most records one page holds; at least 1.
    pub limit: usize,
    /// Where the previous page ended; `None` for the first page.
    pub cursor: Option<PageCursor>,
}

impl AbandonedQuery {
    /// The first page of up to `limit` claims under `prefix`, abandoned at
    /// `now_ms` with their lease ended before `lease_before_ms`.
    pub fn new(prefix: impl Into<String>, now_ms: u64, lease_before_ms: u64, limit: usize) -> Self {
        Self {
            prefix: prefix.into(),
            now_ms,
            lease_before_ms: lease_before_ms.min(now_ms),
            limit: limit.max(1),
            cursor: None,
        }
    }

    /// The page after `cursor`.
    #[must_use]
    pub fn after(mut self, cursor: Option<PageCursor>) -> Self {
        self.cursor = cursor;
        self
    }

    /// Whether `record` is one this query lists: `IN_PROGRESS` under the
    /// prefix, not expired at `now_ms`, its lease ended before
    /// `lease_before_ms`. What every store's filter says, for a store that
    /// filters in the process.
    pub fn matches(&self, record: &Record) -> bool {
        record.status == super::Status::InProgress
            && record.id.as_str().starts_with(&self.prefix)
            && !record.is_expired(self.now_ms)
            && record
                .lease_until_ms
                .is_some_and(|lease| lease < self.lease_before_ms)
    }
}

/// One page of abandoned claims.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AbandonedPage {
    /// The claims found, at most the query's `limit`; possibly none while
    /// `next` is `Some` (a store that filters what it read, as DynamoDB's
    /// scan and Redis's `SCAN` do, can read a page of records none of which
    /// is abandoned).
    pub records: Vec<Record>,
    /// Where the next page starts; `None` when the walk is over.
    pub next: Option<PageCursor>,
}

impl AbandonedPage {
    /// A page of `records`, followed by the page at `next`.
    pub fn new(records: Vec<Record>, next: Option<PageCursor>) -> Self {
        Self { records, next }
    }
}

/// Where a walk of abandoned claims goes on: opaque, and the store's own
/// (the last id a SQL page read, DynamoDB's `LastEvaluatedKey`, Redis's
/// `SCAN` cursor). Only the store that made it reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor(String);

impl PageCursor {
    /// A cursor as the store wrote it.
    pub fn from_stored(cursor: impl Into<String>) -> Self {
        Self(cursor.into())
    }

    /// The cursor as the store wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
