//! The memory store's table (`hashbrown::HashTable` beside
//! each id's hash, claims through one `slot`, completions in place): a
//! model-based test against a plain reference model of its semantics
//! (a `BTreeMap` of records, the conditions as a set of records had them),
//! over random operation sequences on ids that are prefixes of each other,
//! non-ASCII, empty, sharing bytes with owners, and many ids (growth).

use futures::executor::block_on;
use lambda_idempotency::store::memory::MemoryWrite;
use lambda_idempotency::{
    store::{
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal,
        Status, Store,
    },
    Fingerprint, MemoryStore, StoreError, StoreErrorKind,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

const IDS: &[&str] = &[
    "",
    "a",
    "ab",
    "abc",
    "b",
    "bc",
    "é",
    "é1",
    "e\u{301}",
    "a\u{0}",
    "ab#1",
    "charges#é",
    "\u{1F600}",
    "c",
];
const OWNERS: &[&str] = &["o1", "o1x", "", "bc", "c", "1"];
const KEYS: &[&str] = &["k1", "k2", "k3"];

#[derive(Debug, Clone)]
enum Op {
    Claim {
        id: usize,
        owner: usize,
        now: u64,
        lease: u64,
        exp: u64,
        attempt: u32,
    },
    TakeOver {
        id: usize,
        owner: usize,
        lapsed: usize,
        now: u64,
        lease: u64,
        exp: u64,
    },
    Extend {
        id: usize,
        owner: usize,
        lease: u64,
        exp: u64,
        now: u64,
    },
    Complete {
        id: usize,
        owner: usize,
        response: Vec<u8>,
        now: u64,
        exp: u64,
        writes: Vec<(usize, bool)>,
    },
    Release {
        id: usize,
        owner: usize,
    },
    Commit {
        id: usize,
        owner: usize,
        response: Vec<u8>,
        now: u64,
        exp: u64,
        writes: Vec<(usize, bool)>,
    },
    Remove {
        id: usize,
        any: bool,
    },
    List {
        prefix: usize,
        limit: usize,
    },
    Get {
        id: usize,
        now: u64,
    },
    Insert {
        id: usize,
        owner: usize,
        completed: bool,
        exp: u64,
        lease: Option<u64>,
        response: Option<Vec<u8>>,
    },
    Fail {
        n: usize,
        kind: u8,
    },
    /// Claims `n` fresh ids (the table grows), some of which later ops use.
    Bulk {
        n: usize,
        now: u64,
    },
}

/// Ids: the fixed ones, then bulk ones (`bulk#i` and `bulk#i#`: prefixes).
fn id_of(i: usize) -> String {
    if i < IDS.len() {
        IDS[i].to_owned()
    } else {
        let k = i - IDS.len();
        if k.is_multiple_of(2) {
            format!("bulk#{}", k / 2)
        } else {
            format!("bulk#{}#", k / 2)
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0usize..IDS.len() + 60;
    let owner = 0usize..OWNERS.len();
    let now = 0u64..12_000;
    let exp = 0u64..14;
    let lease = 0u64..12_000;
    let writes = prop::collection::vec((0usize..KEYS.len(), any::<bool>()), 0..3);
    let response = prop::collection::vec(any::<u8>(), 0..6);
    prop_oneof![
        4 => (id.clone(), owner.clone(), now.clone(), lease.clone(), exp.clone(), 1u32..4)
            .prop_map(|(id, owner, now, lease, exp, attempt)| Op::Claim { id, owner, now, lease, exp, attempt }),
        2 => (id.clone(), owner.clone(), owner.clone(), now.clone(), lease.clone(), exp.clone())
            .prop_map(|(id, owner, lapsed, now, lease, exp)| Op::TakeOver { id, owner, lapsed, now, lease, exp }),
        2 => (id.clone(), owner.clone(), lease.clone(), exp.clone(), now.clone())
            .prop_map(|(id, owner, lease, exp, now)| Op::Extend { id, owner, lease, exp, now }),
        3 => (id.clone(), owner.clone(), response.clone(), now.clone(), exp.clone(), writes.clone())
            .prop_map(|(id, owner, response, now, exp, writes)| Op::Complete { id, owner, response, now, exp, writes }),
        2 => (id.clone(), owner.clone()).prop_map(|(id, owner)| Op::Release { id, owner }),
        2 => (id.clone(), owner.clone(), response.clone(), now.clone(), exp.clone(), writes)
            .prop_map(|(id, owner, response, now, exp, writes)| Op::Commit { id, owner, response, now, exp, writes }),
        1 => (id.clone(), any::<bool>()).prop_map(|(id, any)| Op::Remove { id, any }),
        1 => (0usize..IDS.len() + 4, 0usize..8).prop_map(|(prefix, limit)| Op::List { prefix, limit }),
        2 => (id.clone(), now.clone()).prop_map(|(id, now)| Op::Get { id, now }),
        1 => (id, owner, any::<bool>(), exp, prop::option::of(lease), prop::option::of(response))
            .prop_map(|(id, owner, completed, exp, lease, response)| Op::Insert { id, owner, completed, exp, lease, response }),
        1 => (1usize..3, 0u8..3).prop_map(|(n, kind)| Op::Fail { n, kind }),
        1 => (1usize..400, now).prop_map(|(n, now)| Op::Bulk { n, now }),
    ]
}

/// The store's semantics, written plainly.
struct Model {
    records: BTreeMap<String, Record>,
    items: HashMap<String, Vec<u8>>,
    failures: usize,
    kind: StoreErrorKind,
    bulk: usize,
}

fn claim_record(claim: &Claim) -> Record {
    Record {
        id: claim.id.clone(),
        status: Status::InProgress,
        owner: claim.owner.clone(),
        fingerprint: claim.fingerprint.clone(),
        expiration_s: claim.expiration_s,
        lease_until_ms: Some(claim.lease_until_ms),
        response: None,
        created_at_ms: Some(claim.now_ms),
        attempt: claim.attempt,
        first_started_ms: Some(claim.first_started_ms),
        completed_at_ms: None,
    }
}

fn held(record: &Record, owner: &OwnerToken) -> bool {
    record.status == Status::InProgress && record.owner == *owner
}

type Answer = Result<Conditional, (StoreErrorKind, String)>;

impl Model {
    fn enter(&mut self) -> Result<(), (StoreErrorKind, String)> {
        if self.failures > 0 {
            self.failures -= 1;
            return Err((self.kind, "memory store: injected failure".into()));
        }
        Ok(())
    }

    fn check_writes(&self, writes: &[MemoryWrite]) -> Result<(), (StoreErrorKind, String)> {
        match writes
            .iter()
            .find(|w| w.if_absent && self.items.contains_key(&w.key))
        {
            Some(taken) => Err((
                StoreErrorKind::WriteRejected,
                format!("memory store: an item already exists under {:?}", taken.key),
            )),
            None => Ok(()),
        }
    }

    fn claim(&mut self, claim: &Claim) -> Answer {
        self.enter()?;
        if let Some(existing) = self.records.get(claim.id.as_str()) {
            if !existing.is_expired(claim.now_ms) {
                return Ok(Conditional::Refused(Some(existing.clone())));
            }
        }
        self.records
            .insert(claim.id.as_str().to_owned(), claim_record(claim));
        Ok(Conditional::Applied)
    }

    fn take_over(&mut self, claim: &Claim, lapsed: &OwnerToken) -> Answer {
        self.enter()?;
        match self.records.get(claim.id.as_str()) {
            Some(existing)
                if held(existing, lapsed)
                    && existing
                        .lease_until_ms
                        .is_some_and(|lease| lease < claim.now_ms) =>
            {
                self.records
                    .insert(claim.id.as_str().to_owned(), claim_record(claim));
                Ok(Conditional::Applied)
            }
            found => Ok(Conditional::Refused(found.cloned())),
        }
    }

    fn extend(&mut self, extension: &Extension) -> Answer {
        self.enter()?;
        match self.records.get_mut(extension.id.as_str()) {
            Some(record) if held(record, &extension.owner) => {
                record.lease_until_ms = Some(extension.lease_until_ms);
                record.expiration_s = extension.expiration_s;
                Ok(Conditional::Applied)
            }
            found => Ok(Conditional::Refused(found.map(|r| r.clone()))),
        }
    }

    fn complete(&mut self, completion: Completion<MemoryWrite>) -> Answer {
        self.enter()?;
        match self.records.get(completion.id.as_str()) {
            Some(record) if held(record, &completion.owner) => {}
            found => return Ok(Conditional::Refused(found.cloned())),
        }
        self.check_writes(&completion.writes)?;
        let record = self.records.get_mut(completion.id.as_str()).expect("held");
        record.status = Status::Completed;
        record.response = Some(completion.response);
        record.expiration_s = completion.expiration_s;
        record.lease_until_ms = None;
        record.completed_at_ms = Some(completion.now_ms);
        for write in completion.writes {
            self.items.insert(write.key, write.value);
        }
        Ok(Conditional::Applied)
    }

    fn release(&mut self, id: &RecordId, owner: &OwnerToken) -> Answer {
        self.enter()?;
        match self.records.get(id.as_str()) {
            Some(existing) if held(existing, owner) => {
                self.records.remove(id.as_str());
                Ok(Conditional::Applied)
            }
            found => Ok(Conditional::Refused(found.cloned())),
        }
    }

    fn commit(&mut self, commit: Commit<MemoryWrite>) -> Answer {
        self.enter()?;
        if let Some(existing) = self.records.get(commit.id.as_str()) {
            // A lapsed claim holding a response is a completed record
            // whose status was changed: never replaced (Store::commit).
            let changed = existing.is_lapsed(commit.now_ms) && existing.response.is_some();
            if existing.is_live(commit.now_ms) || changed {
                return Ok(Conditional::Refused(Some(existing.clone())));
            }
        }
        self.check_writes(&commit.writes)?;
        for write in commit.writes {
            self.items.insert(write.key, write.value);
        }
        self.records.insert(
            commit.id.as_str().to_owned(),
            Record {
                id: commit.id,
                status: Status::Completed,
                owner: commit.owner,
                fingerprint: commit.fingerprint,
                expiration_s: commit.expiration_s,
                lease_until_ms: None,
                response: Some(commit.response),
                created_at_ms: Some(commit.now_ms),
                attempt: 1,
                first_started_ms: Some(commit.now_ms),
                completed_at_ms: Some(commit.now_ms),
            },
        );
        Ok(Conditional::Applied)
    }

    fn remove(&mut self, id: &RecordId, removal: Removal) -> Answer {
        self.enter()?;
        match self.records.get(id.as_str()) {
            Some(record)
                if removal == Removal::UnlessInProgress && record.status == Status::InProgress =>
            {
                Ok(Conditional::Refused(Some(record.clone())))
            }
            Some(_) => {
                self.records.remove(id.as_str());
                Ok(Conditional::Applied)
            }
            None => Ok(Conditional::Refused(None)),
        }
    }

    fn list(
        &mut self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, (StoreErrorKind, String)> {
        self.enter()?;
        Ok(self
            .records
            .values()
            .filter(|r| r.status == Status::InProgress && r.id.as_str().starts_with(prefix))
            .take(limit)
            .cloned()
            .collect())
    }

    fn get(
        &mut self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Option<Record>, (StoreErrorKind, String)> {
        self.enter()?;
        Ok(self
            .records
            .get(id.as_str())
            .filter(|r| !r.is_expired(now_ms))
            .cloned())
    }
}

fn plain<T>(result: Result<T, StoreError>) -> Result<T, (StoreErrorKind, String)> {
    result.map_err(|e| {
        let text = e.to_string();
        let message = text
            .rsplit_once(" (")
            .map(|(m, _)| m.to_owned())
            .unwrap_or(text);
        (e.kind(), message)
    })
}

fn claim(id: &str, owner: &str, now: u64, lease: u64, exp: u64, attempt: u32) -> Claim {
    Claim {
        id: RecordId::from_stored(id),
        owner: OwnerToken::from_stored(owner),
        fingerprint: Fingerprint::from_stored(format!("fp-{id}-{owner}")),
        now_ms: now,
        lease_until_ms: lease,
        expiration_s: exp,
        attempt,
        first_started_ms: now / 2,
    }
}

fn writes(writes: &[(usize, bool)], tag: u8) -> Vec<MemoryWrite> {
    writes
        .iter()
        .map(|&(k, if_absent)| MemoryWrite {
            key: KEYS[k].into(),
            value: vec![tag, k as u8],
            if_absent,
        })
        .collect()
}

fn kind(k: u8) -> StoreErrorKind {
    match k {
        0 => StoreErrorKind::Unavailable,
        1 => StoreErrorKind::Throttled,
        _ => StoreErrorKind::WriteRejected,
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let store = MemoryStore::new();
    // A clone shares the records (and must find them by the same hashes).
    let other = store.clone();
    let mut model = Model {
        records: BTreeMap::new(),
        items: HashMap::new(),
        failures: 0,
        kind: StoreErrorKind::Unavailable,
        bulk: 0,
    };
    for (step, op) in ops.iter().enumerate() {
        let s: &MemoryStore = if step % 2 == 0 { &store } else { &other };
        match op.clone() {
            Op::Claim {
                id,
                owner,
                now,
                lease,
                exp,
                attempt,
            } => {
                let c = claim(&id_of(id), OWNERS[owner], now, lease, exp, attempt);
                prop_assert_eq!(
                    plain(block_on(s.claim(&c))),
                    model.claim(&c),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::TakeOver {
                id,
                owner,
                lapsed,
                now,
                lease,
                exp,
            } => {
                let c = claim(&id_of(id), OWNERS[owner], now, lease, exp, 2);
                let lapsed = OwnerToken::from_stored(OWNERS[lapsed]);
                prop_assert_eq!(
                    plain(block_on(s.take_over(&c, &lapsed))),
                    model.take_over(&c, &lapsed),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::Extend {
                id,
                owner,
                lease,
                exp,
                now,
            } => {
                let e = Extension {
                    id: RecordId::from_stored(id_of(id)),
                    owner: OwnerToken::from_stored(OWNERS[owner]),
                    lease_until_ms: lease,
                    expiration_s: exp,
                    now_ms: now,
                };
                prop_assert_eq!(
                    plain(block_on(s.extend(&e))),
                    model.extend(&e),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::Complete {
                id,
                owner,
                response,
                now,
                exp,
                writes: w,
            } => {
                let c = Completion {
                    id: RecordId::from_stored(id_of(id)),
                    owner: OwnerToken::from_stored(OWNERS[owner]),
                    response,
                    now_ms: now,
                    expiration_s: exp,
                    writes: writes(&w, step as u8),
                };
                prop_assert_eq!(
                    plain(block_on(s.complete(c.clone()))),
                    model.complete(c),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::Release { id, owner } => {
                let (id, owner) = (
                    RecordId::from_stored(id_of(id)),
                    OwnerToken::from_stored(OWNERS[owner]),
                );
                prop_assert_eq!(
                    plain(block_on(s.release(&id, &owner))),
                    model.release(&id, &owner),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::Commit {
                id,
                owner,
                response,
                now,
                exp,
                writes: w,
            } => {
                let c = Commit {
                    id: RecordId::from_stored(id_of(id)),
                    owner: OwnerToken::from_stored(OWNERS[owner]),
                    fingerprint: Fingerprint::from_stored("commit"),
                    response,
                    now_ms: now,
                    expiration_s: exp,
                    writes: writes(&w, step as u8),
                };
                prop_assert_eq!(
                    plain(block_on(s.commit(c.clone()))),
                    model.commit(c),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::Remove { id, any } => {
                let id = RecordId::from_stored(id_of(id));
                let removal = if any {
                    Removal::Any
                } else {
                    Removal::UnlessInProgress
                };
                prop_assert_eq!(
                    plain(block_on(s.remove(&id, removal))),
                    model.remove(&id, removal),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::List { prefix, limit } => {
                let prefix = match prefix.checked_sub(IDS.len()) {
                    None => IDS[prefix],
                    Some(0) => "bulk#",
                    Some(1) => "bulk#1",
                    Some(2) => "a\u{0}",
                    _ => "\u{1F6}",
                };
                prop_assert_eq!(
                    plain(block_on(s.list_in_progress(prefix, limit))),
                    model.list(prefix, limit),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::Get { id, now } => {
                let id = RecordId::from_stored(id_of(id));
                prop_assert_eq!(
                    plain(block_on(s.get(&id, now))),
                    model.get(&id, now),
                    "step {} {:?}",
                    step,
                    op
                );
                prop_assert_eq!(
                    plain(block_on(s.peek(&id, now))),
                    model.get(&id, now),
                    "step {} {:?}",
                    step,
                    op
                );
            }
            Op::Insert {
                id,
                owner,
                completed,
                exp,
                lease,
                response,
            } => {
                let record = Record {
                    id: RecordId::from_stored(id_of(id)),
                    status: if completed {
                        Status::Completed
                    } else {
                        Status::InProgress
                    },
                    owner: OwnerToken::from_stored(OWNERS[owner]),
                    fingerprint: Fingerprint::from_stored("inserted"),
                    expiration_s: exp,
                    lease_until_ms: lease,
                    response,
                    created_at_ms: lease.map(|l| l / 3),
                    attempt: 7,
                    first_started_ms: None,
                    completed_at_ms: lease,
                };
                s.insert_record(record.clone());
                model.records.insert(record.id.as_str().to_owned(), record);
            }
            Op::Fail { n, kind: k } => {
                s.fail_next_with(n, kind(k));
                model.failures = n;
                model.kind = kind(k);
            }
            Op::Bulk { n, now } => {
                for _ in 0..n {
                    let i = IDS.len() + model.bulk;
                    model.bulk += 1;
                    let c = claim(&id_of(i), "bulk", now, now + 5, 13, 1);
                    prop_assert_eq!(
                        plain(block_on(s.claim(&c))),
                        model.claim(&c),
                        "bulk claim {}",
                        i
                    );
                }
            }
        }
        // The store drops the expired records of a table of 1,024 or more
        // that a new record would grow: only in a claim or a commit, and
        // only those expired at its time. The model follows.
        let made_at = match *op {
            Op::Claim { now, .. } | Op::Commit { now, .. } | Op::Bulk { now, .. } => Some(now),
            _ => None,
        };
        // Read once, for this and for the comparison below.
        let mut records = store.records();
        records.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        let dropped: Vec<String> = model
            .records
            .keys()
            .filter(|id| {
                records
                    .binary_search_by(|record| record.id.as_str().cmp(id.as_str()))
                    .is_err()
            })
            .cloned()
            .collect();
        let held = model.records.len();
        for id in dropped {
            let record = model.records.remove(&id).expect("listed");
            prop_assert!(
                held >= 1024 && made_at.is_some_and(|now| record.expiration_s < now / 1000),
                "{:?} dropped at step {} {:?}, {} records held",
                record,
                step,
                op,
                held
            );
        }
        // The whole state, after every step (read without injected faults).
        if model.failures == 0 {
            let expected: Vec<Record> = model.records.values().cloned().collect();
            prop_assert_eq!(records, expected, "records after step {} {:?}", step, op);
            for i in 0..IDS.len() + model.bulk {
                let id = RecordId::from_stored(id_of(i));
                prop_assert_eq!(
                    other.record(&id),
                    model.records.get(id.as_str()).cloned(),
                    "record {:?}",
                    id
                );
            }
            for key in KEYS {
                prop_assert_eq!(
                    store.item(key),
                    model.items.get(*key).cloned(),
                    "item {}",
                    key
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_memory_store_behaves_as_the_reference_model(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }
}

/// Many records (the table grows many times): every one found by its id,
/// none by a prefix or an extension of it, after updates in place and
/// removals, from clones and from many threads at once.
#[test]
fn many_records_through_growth_and_concurrency() {
    let store = MemoryStore::new();
    let ids: Vec<String> = (0..20_000)
        .map(|i| match i % 4 {
            0 => format!("scope#{i}"),
            1 => format!("scope#{}é", i - 1),
            2 => format!("scope#{}é\u{0}", i - 2),
            _ => format!("{}", i),
        })
        .collect();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (store, ids) = (store.clone(), ids.clone());
            std::thread::spawn(move || {
                for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 8 == t) {
                    let c = claim(id, &format!("o{i}"), 1_000, 5_000, 100, 1);
                    assert_eq!(block_on(store.claim(&c)).expect("claims"), Conditional::Applied, "{id}");
                    let again = claim(id, "other", 1_000, 5_000, 100, 1);
                    assert!(matches!(block_on(store.claim(&again)), Ok(Conditional::Refused(Some(r))) if r.id.as_str() == id));
                    if i % 3 == 0 {
                        let done = Completion {
                            id: RecordId::from_stored(id.as_str()),
                            owner: OwnerToken::from_stored(format!("o{i}")),
                            response: id.as_bytes().to_vec(),
                            now_ms: 2_000,
                            expiration_s: 200,
                            writes: vec![],
                        };
                        assert_eq!(block_on(store.complete(done)).expect("completes"), Conditional::Applied);
                    } else if i % 3 == 1 {
                        let (rid, owner) = (RecordId::from_stored(id.as_str()), OwnerToken::from_stored(format!("o{i}")));
                        assert_eq!(block_on(store.release(&rid, &owner)).expect("releases"), Conditional::Applied);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no panic");
    }
    for (i, id) in ids.iter().enumerate() {
        let found = store.record(&RecordId::from_stored(id.as_str()));
        match i % 3 {
            0 => {
                let r = found.expect("completed");
                assert_eq!(
                    (r.status, r.response.as_deref(), r.owner.as_str()),
                    (
                        Status::Completed,
                        Some(id.as_bytes()),
                        format!("o{i}").as_str()
                    )
                );
            }
            1 => assert!(found.is_none(), "{id} released"),
            _ => assert_eq!(found.expect("in progress").status, Status::InProgress),
        }
    }
    assert_eq!(
        store.records().len(),
        (0..ids.len()).filter(|i| i % 3 != 1).count()
    );
    let listed = block_on(store.list_in_progress("scope#1", usize::MAX)).expect("lists");
    let expected: Vec<&String> = {
        let mut v: Vec<&String> = ids
            .iter()
            .enumerate()
            .filter(|(i, id)| i % 3 == 2 && id.starts_with("scope#1"))
            .map(|(_, id)| id)
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        listed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        expected.iter().map(|s| s.as_str()).collect::<Vec<_>>()
    );
}
