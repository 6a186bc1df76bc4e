//! The memory store through the whole conformance kit.

use lambda_idempotency::MemoryStore;

lambda_idempotency::store_conformance! {
    store: async { MemoryStore::new() },
    unavailable: async {
        let store = MemoryStore::new();
        store.fail_next(1);
        store
    },
    single_write,
}
