//! Completed records' bytes, many to a block.
//!
//! A server keeps every completed record for its hour, and a record kept
//! in an allocation of its own is a small long-lived chunk among the
//! short-lived allocations of every later request: the allocator's heap
//! fills with holes that it must search, split and merge around them.
//! Kept one to a chunk, the memory store's records cost the server
//! benchmark's app about 3 µs of every new request: its CPU a request over
//! the bare app's was 12.8 µs with them, 10.0 with the same records
//! written one after the other into blocks of [`BLOCK`] bytes, some two
//! hundred records to a block (medians of 15 rounds, lower in every round;
//! CHANGELOG.md; the figure now: BENCHMARKS.md, "The layer's CPU").
//!
//! A block is given back when none of its records is kept any more.
//! Records are written as they complete and, living as long as each other
//! (a store's requests share an expiry), expire in about the order they
//! were written: a block's records go together, and the rebuild of the
//! table that drops them frees the whole block. Records that outlive their
//! neighbours (a longer expiry, or neighbours whose keys came again) are
//! written again, together, by the first write that finds the blocks held
//! more than twice the records' bytes.

/// The bytes of a block.
pub(super) const BLOCK: usize = 64 * 1024;

/// The largest record written into a block: a larger one (a large
/// response) keeps an allocation of its own, which is not small, and would
/// leave a block mostly empty.
pub(super) const LARGEST: usize = BLOCK / 8;

/// Where a record is in an [`Arena`]: eight bytes, so that the table,
/// which holds one beside each record's hash, is no larger for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    block: u32,
    /// Within a block (`BLOCK` is 64 KiB), a record of at most [`LARGEST`]
    /// bytes.
    start: u16,
    len: u16,
}

impl Place {
    fn block(self) -> usize {
        self.block as usize
    }

    fn range(self) -> std::ops::Range<usize> {
        let start = usize::from(self.start);
        start..start + usize::from(self.len)
    }
}

/// Blocks of records, each written to its end and then only read, and
/// given back once no record in it is kept.
#[derive(Default)]
pub(super) struct Arena {
    /// The blocks, by index; a block given back is empty (no allocation)
    /// until its index is taken again.
    blocks: Vec<Vec<u8>>,
    /// The bytes of each block's records still kept.
    kept: Vec<usize>,
    /// The bytes of every record kept.
    kept_bytes: usize,
    /// The bytes of the records no longer kept, since the arena was made.
    given_back: usize,
    /// The least mark of each block's records (`u64::MAX` for none).
    least_mark: Vec<u64>,
    /// The indexes of blocks given back.
    free: Vec<usize>,
    /// The block being written, if there is one.
    filling: Option<usize>,
}

/// Its size, not its bytes.
impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("blocks", &(self.blocks.len() - self.free.len()))
            .field("kept_bytes", &self.kept_bytes)
            .finish()
    }
}

impl Arena {
    /// Writes a record made of `parts`, one after the other, if it is at
    /// most [`LARGEST`] bytes in all (and the arena has fewer than 2^32
    /// blocks); `None` otherwise, for the caller to keep it apart. Its
    /// block keeps the least `mark` of its records (the store's: when a
    /// record may be dropped), so that a block none of whose records may
    /// be dropped yet is passed over whole, its records not read.
    pub(super) fn push(&mut self, parts: &[&[u8]], mark: u64) -> Option<Place> {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len > LARGEST {
            return None;
        }
        let block = match self.filling {
            Some(block) if BLOCK - self.blocks[block].len() >= len => block,
            _ => self.new_block()?,
        };
        let bytes = &mut self.blocks[block];
        // Within a block of 64 KiB, of at most `LARGEST` bytes; the block's
        // index checked when it was made.
        let place = Place {
            block: u32::try_from(block).ok()?,
            start: u16::try_from(bytes.len()).ok()?,
            len: u16::try_from(len).ok()?,
        };
        for part in parts {
            bytes.extend_from_slice(part);
        }
        self.kept[block] += len;
        self.kept_bytes += len;
        self.least_mark[block] = self.least_mark[block].min(mark);
        Some(place)
    }

    /// The least mark of the records written into `place`'s block.
    pub(super) fn least_mark(&self, place: Place) -> u64 {
        self.least_mark[place.block()]
    }

    /// The record at `place`.
    pub(super) fn get(&self, place: Place) -> &[u8] {
        &self.blocks[place.block()][place.range()]
    }

    /// The record at `place`, to change in place (its fixed fields): its
    /// block's mark is then the least there is, since the change may
    /// have lowered the record's.
    pub(super) fn get_mut(&mut self, place: Place) -> &mut [u8] {
        self.least_mark[place.block()] = 0;
        &mut self.blocks[place.block()][place.range()]
    }

    /// The record at `place` is no longer kept: its block is given back if
    /// it was the last one there and the block is full.
    pub(super) fn remove(&mut self, place: Place) {
        let block = place.block();
        self.kept[block] -= usize::from(place.len);
        self.kept_bytes -= usize::from(place.len);
        self.given_back += usize::from(place.len);
        if self.kept[block] == 0 && self.filling != Some(block) {
            self.blocks[block] = Vec::new();
            self.free.push(block);
        }
    }

    /// Whether the blocks held are more than twice the bytes of the
    /// records kept in them (and more than two).
    pub(super) fn is_sparse(&self) -> bool {
        let held = self.blocks.len() - self.free.len();
        held > 2 && self.kept_bytes * 2 < held * BLOCK
    }

    /// The bytes of every record kept.
    pub(super) fn kept_bytes(&self) -> usize {
        self.kept_bytes
    }

    /// The bytes of the records no longer kept, since the arena was made.
    pub(super) fn given_back(&self) -> usize {
        self.given_back
    }

    /// A block to write into, in place of the one being written (which
    /// is given back if none of its records is kept).
    fn new_block(&mut self) -> Option<usize> {
        if let Some(full) = self.filling.take() {
            if self.kept[full] == 0 {
                self.blocks[full] = Vec::new();
                self.free.push(full);
            }
        }
        let block = match self.free.pop() {
            Some(block) => {
                self.blocks[block] = Vec::with_capacity(BLOCK);
                self.least_mark[block] = u64::MAX;
                block
            }
            None => {
                // A place holds a block's index in 32 bits.
                u32::try_from(self.blocks.len()).ok()?;
                self.blocks.push(Vec::with_capacity(BLOCK));
                self.kept.push(0);
                self.least_mark.push(u64::MAX);
                self.blocks.len() - 1
            }
        };
        self.filling = Some(block);
        Some(block)
    }

    /// The blocks that hold an allocation.
    #[cfg(test)]
    pub(super) fn blocks(&self) -> usize {
        self.blocks
            .iter()
            .filter(|block| block.capacity() > 0)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_and_changed_where_they_were_written() {
        let mut arena = Arena::default();
        let first = arena.push(&[b"head", b"", b"tail"], 0).expect("small");
        let second = arena.push(&[b"x"], 0).expect("small");
        assert_eq!(arena.get(first), b"headtail");
        assert_eq!(arena.get(second), b"x");
        arena.get_mut(first)[0] = b'H';
        assert_eq!(arena.get(first), b"Headtail");
        assert_eq!(arena.get(second), b"x", "its neighbour unchanged");
        assert_eq!(arena.blocks(), 1, "one block for both");
        assert_eq!(arena.push(&[&[0; LARGEST], b"1"], 0), None, "too large");
        let third = arena.push(&[b"y"], 5).expect("small");
        assert_eq!(arena.least_mark(third), 0, "the block's least");
        assert_eq!(arena.get(second), b"x");
    }

    #[test]
    fn a_block_is_given_back_when_none_of_its_records_is_kept() {
        let mut arena = Arena::default();
        let record = [7u8; LARGEST];
        let per_block = BLOCK / LARGEST;
        let places: Vec<Place> = (0..3 * per_block)
            .map(|_| arena.push(&[&record], 0).expect("at most LARGEST"))
            .collect();
        assert_eq!(arena.blocks(), 3);
        assert!(places.iter().all(|&place| arena.get(place) == record));
        // The first block's records all go but one: kept.
        for &place in &places[..per_block - 1] {
            arena.remove(place);
        }
        assert_eq!(arena.blocks(), 3, "a record still kept holds its block");
        arena.remove(places[per_block - 1]);
        assert_eq!(arena.blocks(), 2, "the last one gone, the block is");
        // The block being written stays while it is written, even without
        // a record kept; once full, it is given back and its index taken
        // again.
        for &place in &places[2 * per_block..] {
            arena.remove(place);
        }
        assert_eq!(arena.blocks(), 2, "the block being written stays");
        let next = arena.push(&[b"next"], 0).expect("small");
        assert_eq!(arena.get(next), b"next");
        assert_eq!(arena.blocks(), 2, "the full, empty block given back");
        assert_eq!(next.block, places[2 * per_block].block, "its index again");
        for &place in &places[per_block..2 * per_block] {
            arena.remove(place);
        }
        assert_eq!(arena.blocks(), 1, "only the block being written");
        // No more block indexes than blocks ever held at once.
        for _ in 0..4 * per_block {
            let place = arena.push(&[&record], 0).expect("at most LARGEST");
            arena.remove(place);
        }
        assert!(
            arena.blocks.len() <= 3,
            "{} block indexes",
            arena.blocks.len()
        );
    }
}
