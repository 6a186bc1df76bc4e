//! The canonical form of a whole document in one pass, without a tree:
//! what every request fingerprint computes, so it runs near the speed of
//! the hash.
//!
//! A scanner of its own walks the bytes once, checks them against the JSON
//! grammar (RFC 8259, as strict as the tree parser) and writes the
//! canonical form as it goes: strings without escapes and numbers are
//! copied as they stand, an escaped string is unescaped by jiter (as the
//! tree writer does). An object's entries are written in document order
//! and their places noted; when the object closes, entries whose keys are
//! already in order (most JSON, written from a struct) stay where they
//! are, and the others are moved into order once. A flat object within
//! the document (a struct's or a row's: a few entries whose values are
//! strings, numbers and literals, without escapes or spaces) is read in a
//! loop of its own, its entries noted on the stack; one that turns out not
//! to be flat is read again from its start, so no byte is read more than
//! twice. The form is exactly the
//! tree writer's ([`super::canonical`](mod@super::canonical)), which pointers into a document
//! still use: property tests hold the two to the same bytes, and to the
//! same refusals on damaged documents.

use super::canonical::{deeper, string_of, write_number, NotCanonical};
use std::io::Write;

/// One object entry already written: its key (unescaped, for ordering)
/// and where `"key":value` lies in the output. Plain data: the entries of
/// an object that closes are dropped without a destructor each.
#[derive(Clone, Copy)]
struct Entry {
    key: Key,
    start: usize,
    end: usize,
}

/// Where an object's key is, unescaped: in the document as it stands
/// (a key without escapes, nearly every key), or in the writer's `keys`.
#[derive(Clone, Copy)]
struct Key {
    from: usize,
    len: usize,
    unescaped: bool,
}

struct Writer<'a> {
    text: &'a str,
    bytes: &'a [u8],
    /// The next byte to read.
    at: usize,
    /// The source bytes before this one are accounted for in `out`; those
    /// from it to `at` are canonical as they stand and not copied yet, so
    /// that compact JSON is copied in long runs rather than token by token.
    copied: usize,
    out: Vec<u8>,
    /// The entries of the objects being written, innermost last: one
    /// allocation for the whole document.
    entries: Vec<Entry>,
    /// The open objects' keys that held escapes, unescaped.
    keys: Vec<u8>,
    /// Where an object's entries are reordered.
    scratch: Vec<u8>,
    /// The outermost object's key order, when it is not its document order.
    root: Option<Root>,
    /// Room for that order.
    spare_root: Vec<(usize, usize)>,
}

/// Bytes that end the plain run of a string: the quote, the backslash and
/// the control characters JSON refuses unescaped.
const STRING_STOP: [bool; 256] = {
    let mut stop = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        stop[b] = true;
        b += 1;
    }
    stop[b'"' as usize] = true;
    stop[b'\\' as usize] = true;
    stop
};

/// Where the plain run of a string that goes on at `at` ends: the first
/// byte from `at` that [`STRING_STOP`] holds, or the end of `bytes`. Eight
/// bytes at a time: a byte below 0x20, a quote or a backslash is marked
/// by its top bit (a borrow can mark bytes above a marked one, never
/// below, so the lowest mark is exact).
fn plain_run(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const TOPS: u64 = ONES << 7;
    let zero = |word: u64| word.wrapping_sub(ONES) & !word;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        let stops = (control
            | zero(word ^ (ONES * u64::from(b'"')))
            | zero(word ^ (ONES * u64::from(b'\\'))))
            & TOPS;
        if stops != 0 {
            return at + (stops.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while bytes.get(at).is_some_and(|&b| !STRING_STOP[usize::from(b)]) {
        at += 1;
    }
    at
}

/// Writes the canonical form of the JSON document `json` to `out`.
///
/// Nothing is written unless the whole document is canonical, so `out` can
/// be a hash that falls back to the raw bytes on an error.
/// The writer's buffers are the thread's, kept from one document to the
/// next: a request fingerprint allocates nothing here once its thread has
/// fingerprinted a body as large.
pub(crate) fn write_canonical<W: Write>(json: &[u8], out: &mut W) -> Result<(), NotCanonical> {
    let written = written(json, Spare::take())?;
    let result = written.write_to(out).map_err(|_| NotCanonical::Invalid);
    Spare::keep(written.into_spare());
    result
}

/// The canonical form of the JSON document `json`.
pub(crate) fn canonical(json: &[u8]) -> Result<Vec<u8>, NotCanonical> {
    let written = written(json, Spare::default())?;
    if written.root.is_none() {
        return Ok(written.bytes);
    }
    let mut bytes = Vec::with_capacity(written.bytes.len());
    written
        .write_to(&mut bytes)
        .map_err(|_| NotCanonical::Invalid)?;
    Ok(bytes)
}

/// A document's canonical form as the writer leaves it: in order, but for
/// the outermost object's entries when they were not. Those are written
/// out in key order by [`Written::write_to`] rather than moved into order
/// in the buffer: the outermost object holds the whole document, and most
/// request bodies do not list their keys in order, so moving it would copy
/// every body twice more.
struct Written {
    bytes: Vec<u8>,
    root: Option<Root>,
    /// The writer's other buffers, for the thread's next document.
    spare: Spare,
}

/// The outermost object's entries, in key order: their places in the
/// written bytes (in document order), after `open` and before `close`.
struct Root {
    open: usize,
    entries: Vec<(usize, usize)>,
    close: usize,
}

impl Written {
    fn into_spare(self) -> Spare {
        let mut spare = self.spare;
        spare.out = self.bytes;
        if let Some(root) = self.root {
            spare.root = root.entries;
        }
        spare
    }

    fn write_to<W: Write>(&self, out: &mut W) -> std::io::Result<()> {
        let Some(root) = &self.root else {
            return out.write_all(&self.bytes);
        };
        out.write_all(&self.bytes[..root.open])?;
        for (i, &(start, end)) in root.entries.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            out.write_all(&self.bytes[start..end])?;
        }
        out.write_all(&self.bytes[root.close..])
    }
}

/// A writer's buffers, empty, with the room a thread's earlier documents
/// left in them.
#[derive(Default)]
struct Spare {
    out: Vec<u8>,
    entries: Vec<Entry>,
    keys: Vec<u8>,
    scratch: Vec<u8>,
    root: Vec<(usize, usize)>,
}

/// A thread keeps buffers of at most this many bytes: one large document
/// does not hold its room for the thread's life.
const SPARE_BYTES: usize = 64 * 1024;

thread_local! {
    static SPARE: std::cell::Cell<Option<Spare>> = const { std::cell::Cell::new(None) };
}

impl Spare {
    /// The thread's buffers (none yet, or taken by a writer further up
    /// this thread's stack: new ones).
    fn take() -> Self {
        SPARE
            .try_with(|spare| spare.take())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Gives the buffers back to the thread, emptied, unless one of them
    /// grew past [`SPARE_BYTES`].
    fn keep(mut self) {
        if self.out.capacity() > SPARE_BYTES
            || self.scratch.capacity() > SPARE_BYTES
            || self.entries.capacity() * size_of::<Entry>() > SPARE_BYTES
            || self.keys.capacity() > SPARE_BYTES
            || self.root.capacity() * size_of::<(usize, usize)>() > SPARE_BYTES
        {
            return;
        }
        self.out.clear();
        self.scratch.clear();
        self.root.clear();
        // Already empty: a writer drops its entries (and their keys) as
        // their objects close.
        self.entries.clear();
        self.keys.clear();
        let _ = SPARE.try_with(|spare| spare.set(Some(self)));
    }
}

fn written(json: &[u8], spare: Spare) -> Result<Written, NotCanonical> {
    // A JSON text is UTF-8 (RFC 8259): checked once here, so every string
    // without escapes can be copied from it as it stands.
    let text = std::str::from_utf8(json).map_err(|_| NotCanonical::Invalid)?;
    let Spare {
        mut out,
        mut entries,
        keys,
        scratch,
        root,
    } = spare;
    out.reserve(json.len());
    // The open objects' entries: room for most documents, so that they
    // are not reallocated entry by entry.
    entries.reserve(16);
    let mut writer = Writer {
        text,
        bytes: json,
        at: 0,
        copied: 0,
        out,
        entries,
        keys,
        scratch,
        root: None,
        spare_root: root,
    };
    let ended = writer.value(0).and_then(|()| {
        writer.whitespace();
        if writer.at == json.len() {
            Ok(())
        } else {
            Err(NotCanonical::Invalid)
        }
    });
    if let Err(refused) = ended {
        Spare::keep(writer.into_spare());
        return Err(refused);
    }
    writer.flush();
    let root = writer.root.take();
    let bytes = std::mem::take(&mut writer.out);
    Ok(Written {
        bytes,
        root,
        spare: writer.into_spare(),
    })
}

impl<'a> Writer<'a> {
    /// The writer's buffers, for the thread's next document.
    fn into_spare(self) -> Spare {
        Spare {
            out: self.out,
            entries: self.entries,
            keys: self.keys,
            scratch: self.scratch,
            root: match self.root {
                Some(root) => root.entries,
                None => self.spare_root,
            },
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// Copies the pending run of source bytes, up to `at`.
    fn flush(&mut self) {
        self.out
            .extend_from_slice(&self.bytes[self.copied..self.at]);
        self.copied = self.at;
    }

    /// Where the output stands, counting the pending run.
    fn written(&self) -> usize {
        self.out.len() + (self.at - self.copied)
    }

    /// Skips whitespace, which the canonical form drops. Checked between
    /// every two tokens, and compact JSON has none: the check is inlined
    /// and the skip is not, so that the check does not pay for the skip's
    /// registers.
    #[inline(always)]
    fn whitespace(&mut self) {
        if matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.skip_whitespace();
        }
    }

    #[inline(never)]
    fn skip_whitespace(&mut self) {
        self.flush();
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
        self.copied = self.at;
    }

    fn value(&mut self, depth: usize) -> Result<(), NotCanonical> {
        self.whitespace();
        match self.peek() {
            Some(b'{') => self.object(deeper(depth)?),
            Some(b'[') => self.array(deeper(depth)?),
            Some(b'"') => self.string(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(NotCanonical::Invalid),
        }
    }

    fn literal(&mut self, literal: &'static [u8]) -> Result<(), NotCanonical> {
        self.at = literal_end(self.bytes, self.at, literal).ok_or(NotCanonical::Invalid)?;
        Ok(())
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`; an exponent is
    /// written normalised, the rest as it stands.
    fn number(&mut self) -> Result<(), NotCanonical> {
        let start = self.at;
        self.at = mantissa_end(self.bytes, self.at).ok_or(NotCanonical::Invalid)?;
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.at = some_digits_end(self.bytes, self.at).ok_or(NotCanonical::Invalid)?;
            self.out.extend_from_slice(&self.bytes[self.copied..start]);
            write_number(&self.bytes[start..self.at], &mut self.out)
                .map_err(|_| NotCanonical::Invalid)?;
            self.copied = self.at;
        }
        Ok(())
    }

    /// A string value at `"`, written canonical: as it stands when it
    /// holds no escape (valid JSON then holds nothing that needs one), else
    /// unescaped (by jiter, as the tree parser does) and written with the
    /// minimal escapes.
    #[inline(always)]
    fn string(&mut self) -> Result<(), NotCanonical> {
        let open = self.at;
        if self.scan_string()? {
            self.rewrite_escaped(open)?;
        }
        Ok(())
    }

    /// Reads the string at `"` to past its closing quote: whether it holds
    /// an escape.
    #[inline(always)]
    fn scan_string(&mut self) -> Result<bool, NotCanonical> {
        self.at += 1;
        let mut escaped = false;
        loop {
            self.at = plain_run(self.bytes, self.at);
            match self.peek() {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                }
                _ => return Err(NotCanonical::Invalid),
            }
        }
        self.at += 1;
        Ok(escaped)
    }

    /// Writes the string from `open` to `at` (its closing quote read) with
    /// the minimal escapes, and gives its text. Apart from the scan: few
    /// strings hold an escape, and every string would otherwise pay for
    /// this path's registers.
    #[inline(never)]
    fn rewrite_escaped(&mut self, open: usize) -> Result<String, NotCanonical> {
        let content = &self.bytes[open + 1..self.at - 1];
        let text = string_of(self.text, content)?.into_owned();
        self.out.extend_from_slice(&self.bytes[self.copied..open]);
        serde_json::to_writer(&mut self.out, &text).map_err(|_| NotCanonical::Invalid)?;
        self.copied = self.at;
        Ok(text)
    }

    /// An object's key at `"`, written canonical, and where its text is.
    #[inline(always)]
    fn key(&mut self) -> Result<Key, NotCanonical> {
        let open = self.at;
        if !self.scan_string()? {
            // Between two ASCII quotes: the text as it stands.
            return Ok(Key {
                from: open + 1,
                len: self.at - open - 2,
                unescaped: false,
            });
        }
        let text = self.rewrite_escaped(open)?;
        let from = self.keys.len();
        self.keys.extend_from_slice(text.as_bytes());
        Ok(Key {
            from,
            len: text.len(),
            unescaped: true,
        })
    }

    /// One escape at `\\`: `\\["\\/bfnrt]` or `\\u` and four hex digits.
    fn escape(&mut self) -> Result<(), NotCanonical> {
        match self.bytes.get(self.at + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.at += 2,
            Some(b'u') => {
                let hex = self.bytes.get(self.at + 2..self.at + 6);
                if !hex.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
                    return Err(NotCanonical::Invalid);
                }
                self.at += 6;
            }
            _ => return Err(NotCanonical::Invalid),
        }
        Ok(())
    }

    /// A value in an array or an object: a string or a number (most
    /// values) read here, without the call that an array or an object
    /// within needs.
    #[inline(always)]
    fn member(&mut self, depth: usize) -> Result<(), NotCanonical> {
        self.whitespace();
        match self.peek() {
            Some(b'"') => self.string(),
            Some(b'-' | b'0'..=b'9') => self.number(),
            // An object within another value: flat ones (a row of a list,
            // a struct's fields) are read here, without the call through
            // `value`, and any other by the general path. The outermost
            // object is not a member: its order is noted rather than
            // written (see `Written`).
            Some(b'{') => {
                let depth = deeper(depth)?;
                match self.flat_object() {
                    Some(read) => read,
                    None => self.object(depth),
                }
            }
            _ => self.value(depth),
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), NotCanonical> {
        self.at += 1;
        self.whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.member(depth)?;
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(NotCanonical::Invalid),
            }
        }
    }

    /// An object at `{`, by the general path (a flat one within another
    /// value is read by [`Writer::member`] first).
    fn object(&mut self, depth: usize) -> Result<(), NotCanonical> {
        self.at += 1;
        let body = self.written();
        let first = self.entries.len();
        let first_key = self.keys.len();
        let mut ordered = true;
        self.whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.whitespace();
            if self.peek() != Some(b'"') {
                return Err(NotCanonical::Invalid);
            }
            let start = self.written();
            let key = self.key()?;
            self.whitespace();
            if self.peek() != Some(b':') {
                return Err(NotCanonical::Invalid);
            }
            self.at += 1;
            self.member(depth)?;
            let end = self.written();
            // Checked as each entry comes, against the one before: an
            // object whose keys are in order (most) is not looked at again.
            if ordered && self.entries.len() > first {
                let last = self.entries[self.entries.len() - 1].key;
                let (before, this) = (
                    key_text(self.bytes, &self.keys, last),
                    key_text(self.bytes, &self.keys, key),
                );
                ordered = key_order(before, this).is_lt();
            }
            self.entries.push(Entry { key, start, end });
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => break,
                _ => return Err(NotCanonical::Invalid),
            }
        }
        if !ordered {
            // The document's own value is at depth 0; its object's entries at 1.
            self.sort_entries(body, first, depth == 1)?;
        }
        self.entries.truncate(first);
        self.keys.truncate(first_key);
        self.at += 1;
        Ok(())
    }

    /// The object at `{`, if it is flat: at most [`FLAT_ENTRIES`] entries,
    /// each a key and a value without escapes, whitespace or an exponent,
    /// the value a string, a number or a literal (a struct's object, each
    /// row of a list: most objects within a request body). Read in one
    /// loop, its entries noted on the stack, and, when its keys are not in
    /// order, written in key order at its close. `None`, with nothing read
    /// or written, for any other object: the general path reads it, and
    /// refuses it if it must, as it always has.
    #[inline(never)]
    fn flat_object(&mut self) -> Option<Result<(), NotCanonical>> {
        let bytes = self.bytes;
        let open = self.at;
        // Each entry's `"key":value` as `(start, key's end, end)`.
        let mut entries = [(0, 0, 0); FLAT_ENTRIES];
        let mut count = 0;
        let mut ordered = true;
        let mut at = open + 1;
        loop {
            if count == FLAT_ENTRIES || bytes.get(at) != Some(&b'"') {
                return None;
            }
            let start = at;
            at = plain_run(bytes, at + 1);
            if bytes.get(at) != Some(&b'"') {
                return None;
            }
            let key_end = at;
            at += 1;
            if bytes.get(at) != Some(&b':') {
                return None;
            }
            at = flat_value(bytes, at + 1)?;
            if ordered && count > 0 {
                let (before, before_end, _) = entries[count - 1];
                ordered =
                    key_order(&bytes[before + 1..before_end], &bytes[start + 1..key_end]).is_lt();
            }
            entries[count] = (start, key_end, at);
            count += 1;
            match bytes.get(at) {
                Some(b',') => at += 1,
                Some(b'}') => break,
                _ => return None,
            }
        }
        if !ordered {
            let entries = &mut entries[..count];
            let key = |&(start, key_end, _): &(usize, usize, usize)| &bytes[start + 1..key_end];
            if let Err(refused) = insertion_sort(entries, |a, b| key_order(key(a), key(b))) {
                return Some(Err(refused));
            }
            append(&mut self.out, bytes, self.copied, open + 1);
            for (i, &(start, _, end)) in entries.iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                append(&mut self.out, bytes, start, end);
            }
            // The `}` is still to copy.
            self.copied = at;
        }
        self.at = at + 1;
        Some(Ok(()))
    }

    /// Puts the entries of the object whose body starts at `body` in the
    /// output (its entries from `first`, not in order) in key order,
    /// refusing a key twice; for the outermost object (`root`), notes the
    /// order instead (see [`Written`]). Called at the object's `}`, not yet
    /// consumed; the caller drops the object's entries.
    #[inline(never)]
    fn sort_entries(&mut self, body: usize, first: usize, root: bool) -> Result<(), NotCanonical> {
        let (document, keys) = (self.bytes, &self.keys);
        let order = |a: &Entry, b: &Entry| {
            key_order(
                key_text(document, keys, a.key),
                key_text(document, keys, b.key),
            )
        };
        let entries = &mut self.entries[first..];
        if entries.len() > INSERTION_SORTED {
            // A large object (a body may hold hundreds of thousands of
            // keys, in reverse order): in n log n, then checked for a key
            // given twice.
            entries.sort_unstable_by(order);
            if entries
                .windows(2)
                .any(|pair| order(&pair[0], &pair[1]).is_eq())
            {
                return Err(NotCanonical::DuplicateKey);
            }
        } else {
            // Most objects are small.
            insertion_sort(entries, order)?;
        }
        if root {
            let mut order = std::mem::take(&mut self.spare_root);
            order.extend(entries.iter().map(|entry| (entry.start, entry.end)));
            self.root = Some(Root {
                open: body,
                entries: order,
                close: self.written(),
            });
            return Ok(());
        }
        let pending = self.out.len();
        if body >= pending {
            // The whole body is still the source's, not copied yet (no
            // spacing, escape or reordered object in it): its entries
            // are copied from the source, in order, once.
            let source = |position: usize| position - pending + self.copied;
            self.out
                .extend_from_slice(&self.bytes[self.copied..source(body)]);
            for (i, entry) in self.entries[first..].iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                self.out
                    .extend_from_slice(&self.bytes[source(entry.start)..source(entry.end)]);
            }
            self.copied = self.at;
            return Ok(());
        }
        self.out
            .extend_from_slice(&self.bytes[self.copied..self.at]);
        self.copied = self.at;
        // The entries in order, then over the body in one copy.
        self.scratch.clear();
        for (i, entry) in entries.iter().enumerate() {
            if i > 0 {
                self.scratch.push(b',');
            }
            self.scratch
                .extend_from_slice(&self.out[entry.start..entry.end]);
        }
        self.out[body..].copy_from_slice(&self.scratch);
        Ok(())
    }
}

/// Appends `bytes[start..end]` to `out`. A short run (a row's entry, the
/// bytes between two rows) is copied as a fixed window of [`SHORT_RUN`]
/// bytes, which the compiler writes inline, and the bytes past its end
/// cut off again: a flat object out of order is written in a few such
/// runs, and a call to `memcpy` for each, with its length to dispatch on,
/// cost more than the copy.
#[inline(always)]
fn append(out: &mut Vec<u8>, bytes: &[u8], start: usize, end: usize) {
    if end - start <= SHORT_RUN {
        if let Some(window) = bytes.get(start..start + SHORT_RUN) {
            let len = out.len() + (end - start);
            out.extend_from_slice(window);
            out.truncate(len);
            return;
        }
    }
    out.extend_from_slice(&bytes[start..end]);
}

/// The longest run [`append`] copies as a fixed window.
const SHORT_RUN: usize = 32;

/// A key's text, unescaped: in the document, or in the writer's `keys`.
#[inline(always)]
fn key_text<'t>(document: &'t [u8], keys: &'t [u8], key: Key) -> &'t [u8] {
    let from = if key.unescaped { keys } else { document };
    &from[key.from..key.from + key.len]
}

/// The most entries of an object read by [`Writer::flat_object`]: a
/// struct's fields fit, and its entries stay on the stack.
const FLAT_ENTRIES: usize = 8;

/// The end of a flat object's value at `at`: a string without escapes, a
/// number without an exponent, or a literal, each written as it stands.
/// `None` for anything else (the general path reads it).
#[inline(always)]
fn flat_value(bytes: &[u8], at: usize) -> Option<usize> {
    match *bytes.get(at)? {
        b'"' => {
            let end = plain_run(bytes, at + 1);
            (bytes.get(end) == Some(&b'"')).then_some(end + 1)
        }
        b'-' | b'0'..=b'9' => {
            let end = mantissa_end(bytes, at)?;
            // An exponent is written normalised: the general path's.
            (!matches!(bytes.get(end), Some(b'e' | b'E'))).then_some(end)
        }
        b't' => literal_end(bytes, at, b"true"),
        b'f' => literal_end(bytes, at, b"false"),
        b'n' => literal_end(bytes, at, b"null"),
        _ => None,
    }
}

/// The end of a number's part before any exponent at `at`,
/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?`; `None` if there is none.
#[inline(always)]
fn mantissa_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    match *bytes.get(at)? {
        b'0' => at += 1,
        b'1'..=b'9' => at = digits_end(bytes, at + 1),
        _ => return None,
    }
    if bytes.get(at) == Some(&b'.') {
        at = some_digits_end(bytes, at + 1)?;
    }
    Some(at)
}

fn digits_end(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b'0'..=b'9') = bytes.get(at) {
        at += 1;
    }
    at
}

/// The end of the digits at `at`, if there is at least one.
fn some_digits_end(bytes: &[u8], at: usize) -> Option<usize> {
    let end = digits_end(bytes, at);
    (end > at).then_some(end)
}

/// The end of `literal` at `at`, if it is there.
fn literal_end(bytes: &[u8], at: usize, literal: &[u8]) -> Option<usize> {
    bytes[at..]
        .starts_with(literal)
        .then_some(at + literal.len())
}

/// Sorts a small object's entries by insertion, refusing a key given twice:
/// an entry stops at the greatest key not above its own, which is its own
/// if the object holds it twice. Without the generic sort's set-up, which
/// costs more than a few entries' sort.
#[inline(always)]
fn insertion_sort<T>(
    entries: &mut [T],
    order: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Result<(), NotCanonical> {
    for i in 1..entries.len() {
        let mut j = i;
        while j > 0 {
            match order(&entries[j - 1], &entries[j]) {
                std::cmp::Ordering::Greater => entries.swap(j - 1, j),
                std::cmp::Ordering::Equal => return Err(NotCanonical::DuplicateKey),
                std::cmp::Ordering::Less => break,
            }
            j -= 1;
        }
    }
    Ok(())
}

/// The most entries an object out of order is sorted by insertion: beyond,
/// an insertion sort's n² comparisons (a 520 KB body of 40,000 keys in
/// reverse order took 4.4 s, 6 MiB would take minutes) give way to the
/// library's sort.
const INSERTION_SORTED: usize = 16;

/// Keys in byte order (as `str`'s `Ord`), decided by their first bytes
/// when those differ: most keys of an object do, and a library call per
/// comparison of short keys cost more than the rest of the sort.
fn key_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    #[cfg(test)]
    tests::COMPARISONS.with(|count| count.set(count.get() + 1));
    match (a.first(), b.first()) {
        (Some(x), Some(y)) if x != y => x.cmp(y),
        _ => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::super::canonical::{tree_canonical, MAX_DEPTH};
    use super::*;
    use proptest::prelude::*;

    thread_local! {
        /// Key comparisons made on this thread, for the bound on sorting.
        pub(super) static COMPARISONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// An object of `keys` keys (`k` and a number), in the order
    /// `permute` gives, with the key at `repeat.0` given again at
    /// `repeat.1`.
    fn object_of(
        keys: usize,
        permute: impl Fn(usize) -> usize,
        repeat: Option<(usize, usize)>,
    ) -> String {
        let mut names: Vec<String> = (0..keys).map(|i| format!("k{}", permute(i))).collect();
        if let Some((from, at)) = repeat {
            let name = names[from].clone();
            names.insert(at.min(names.len()), name);
        }
        let entries: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("\"{name}\":{i}"))
            .collect();
        format!("{{{}}}", entries.join(","))
    }

    /// A flat object read from a list's member is refused one level past
    /// the depth limit, as any object there is, and read within it.
    #[test]
    fn a_flat_object_at_the_depth_limit_is_read_and_past_it_refused() {
        let nested = |arrays: usize| {
            format!(
                "{}{{\"b\":1,\"a\":2}}{}",
                "[".repeat(arrays),
                "]".repeat(arrays)
            )
        };
        let within = nested(MAX_DEPTH - 1);
        assert_eq!(
            canonical(within.as_bytes()).map_err(|_| ()),
            tree_canonical(within.as_bytes()).map_err(|_| ())
        );
        assert!(canonical(within.as_bytes()).is_ok());
        let past = nested(MAX_DEPTH);
        assert!(matches!(
            canonical(past.as_bytes()),
            Err(NotCanonical::TooDeep)
        ));
        assert!(matches!(
            tree_canonical(past.as_bytes()),
            Err(NotCanonical::TooDeep)
        ));
    }

    /// Objects past the insertion sort's size go to the library's sort: the
    /// same bytes and refusals as the tree writer, outermost or nested, in
    /// reverse, shuffled and nearly sorted orders, with a key repeated
    /// anywhere.
    #[test]
    fn large_objects_are_sorted_and_refused_as_the_tree_writer_does() {
        for keys in [15, 16, 17, 18, 33, 100, 257] {
            let orders: [&dyn Fn(usize) -> usize; 3] =
                [&|i| keys - 1 - i, &|i| (i * 7919) % keys * 1000 + i, &|i| {
                    if i == 3 {
                        keys + 5
                    } else {
                        i
                    }
                }];
            for permute in orders {
                for repeat in [
                    None,
                    Some((0, keys)),
                    Some((keys - 1, 0)),
                    Some((keys / 2, keys / 2 + 1)),
                    Some((1, keys / 3)),
                ] {
                    let object = object_of(keys, permute, repeat);
                    for document in [
                        object.clone(),
                        format!("[1,{object},{{\"z\":{object},\"a\":2}}]"),
                    ] {
                        assert_eq!(
                            canonical(document.as_bytes()),
                            tree_canonical(document.as_bytes()),
                            "{keys} keys, repeat {repeat:?}"
                        );
                    }
                }
            }
        }
    }

    /// A body of many keys in reverse order costs n log n comparisons, not
    /// an insertion sort's n² (200 million here): a client cannot make a
    /// request's fingerprint take minutes.
    #[test]
    fn a_large_object_in_reverse_order_is_sorted_in_n_log_n() {
        let keys = 20_000;
        let document = object_of(keys, |i| keys - 1 - i, None);
        COMPARISONS.with(|count| count.set(0));
        assert!(canonical(document.as_bytes()).is_ok());
        let comparisons = COMPARISONS.with(|count| count.get());
        assert!(comparisons < 1_000_000, "{comparisons} comparisons");
    }

    /// The plain run found eight bytes at a time ends where the byte-wise
    /// definition says, for every stop byte at every place in and across
    /// the words, after any plain byte (ASCII, UTF-8's high bytes, and the
    /// bytes next to the stops' values).
    #[test]
    fn a_plain_run_ends_at_the_first_stop_byte() {
        let bytewise = |bytes: &[u8], at: usize| {
            (at..bytes.len())
                .find(|&i| STRING_STOP[usize::from(bytes[i])])
                .unwrap_or(bytes.len())
        };
        let plain = [b'a', b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xc3, 0xff];
        let stops = [0x00, 0x01, 0x1f, b'"', b'\\'];
        for &fill in &plain {
            for len in 0..24 {
                let mut bytes = vec![fill; len];
                for start in 0..len.min(9) {
                    assert_eq!(plain_run(&bytes, start), bytewise(&bytes, start));
                }
                for place in 0..len {
                    for &stop in &stops {
                        bytes[place] = stop;
                        for start in 0..=place {
                            assert_eq!(
                                plain_run(&bytes, start),
                                place,
                                "fill {fill:#x}, stop {stop:#x} at {place} of {len}, from {start}"
                            );
                        }
                        // A second stop after the first does not move it.
                        if place + 1 < len {
                            bytes[place + 1] = stops[0];
                            assert_eq!(plain_run(&bytes, 0), place);
                            bytes[place + 1] = fill;
                        }
                        bytes[place] = fill;
                    }
                }
            }
        }
    }

    /// A JSON document, to be written with any key order, whitespace and
    /// escapes.
    #[derive(Debug, Clone)]
    enum Json {
        Null,
        Bool(bool),
        Number(&'static str),
        String(String),
        Array(Vec<Json>),
        Object(Vec<(String, Json)>),
    }

    const NUMBERS: &[&str] = &[
        "0",
        "-0",
        "1",
        "1.0",
        "1.00",
        "-12.5e-003",
        "1E+02",
        "2.5E000",
        "1e400",
        "100000000000000000000001",
        "18446744073709551616",
        "0.1",
    ];

    fn json() -> impl Strategy<Value = Json> {
        let text = "[ab\"\\\\/é😀\u{1}\u{7f}]{0,4}";
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            prop::sample::select(NUMBERS).prop_map(Json::Number),
            text.prop_map(Json::String),
        ];
        leaf.prop_recursive(5, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                prop::collection::vec((text, inner), 0..6).prop_map(Json::Object),
            ]
        })
    }

    /// Writes `json` with the escapes and spaces `noise` picks.
    fn write(json: &Json, noise: &mut impl Iterator<Item = u8>, out: &mut String) {
        let mut pick = |n: u8| noise.next().unwrap_or(0) % n;
        if pick(3) == 0 {
            out.push_str(" \n\t");
        }
        match json {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(n),
            Json::String(s) => write_string(s, &mut pick, out),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, noise, out);
                }
                out.push(']');
            }
            Json::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let mut pick = |n: u8| noise.next().unwrap_or(0) % n;
                    write_string(key, &mut pick, out);
                    out.push(':');
                    write(value, noise, out);
                }
                out.push('}');
            }
        }
    }

    fn write_string(s: &str, pick: &mut impl FnMut(u8) -> u8, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if pick(4) == 0 => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
                '/' if pick(2) == 0 => out.push_str("\\/"),
                c => out.push(c),
            }
        }
        out.push('"');
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The one-pass writer and the tree writer agree on every document:
        /// the same bytes, or the same reason there are none.
        #[test]
        fn the_one_pass_and_the_tree_writer_agree(json in json(), noise in prop::collection::vec(any::<u8>(), 0..256)) {
            let mut text = String::new();
            write(&json, &mut noise.into_iter().cycle(), &mut text);
            prop_assert_eq!(canonical(text.as_bytes()), tree_canonical(text.as_bytes()), "{}", text);
            prop_assert_eq!(through_kept_buffers(text.as_bytes()), canonical(text.as_bytes()), "{}", text);
        }
    }

    /// The canonical form as the fingerprint writes it, through the
    /// buffers the thread kept from its earlier documents (every case of a
    /// property test runs on one thread, after documents of every size,
    /// refused ones among them).
    fn through_kept_buffers(json: &[u8]) -> Result<Vec<u8>, NotCanonical> {
        let mut sink = Vec::new();
        write_canonical(json, &mut sink).map(|()| sink)
    }

    #[test]
    fn a_thread_keeps_its_buffers_but_not_a_large_documents() {
        let small = br#"{"b":1,"a":[{"d":1,"c":2}]}"#;
        through_kept_buffers(small).unwrap();
        let kept = SPARE.with(|spare| spare.take()).expect("kept");
        assert!(kept.out.capacity() >= small.len() && kept.entries.capacity() >= 2);
        assert!(
            kept.root.capacity() >= 2,
            "the outermost object's order too"
        );
        Spare::keep(kept);
        let large = format!(r#"{{"b":"{}","a":1}}"#, "x".repeat(SPARE_BYTES));
        assert_eq!(
            through_kept_buffers(large.as_bytes()),
            canonical(large.as_bytes())
        );
        assert!(SPARE.with(|spare| spare.take()).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Damaged documents (a byte changed, dropped or added, from the
        /// bytes JSON's grammar turns on): both refuse them, for the same
        /// reason, or both read the same document.
        #[test]
        fn the_one_pass_and_the_tree_writer_refuse_alike(
            json in json(),
            noise in prop::collection::vec(any::<u8>(), 0..64),
            edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, prop::sample::select(DAMAGE)), 1..4),
        ) {
            let mut text = String::new();
            write(&json, &mut noise.into_iter().cycle(), &mut text);
            let bytes = damaged(text.into_bytes(), edits);
            prop_assert_eq!(canonical(&bytes), tree_canonical(&bytes), "{:?}", String::from_utf8_lossy(&bytes));
            prop_assert_eq!(through_kept_buffers(&bytes), canonical(&bytes), "{:?}", String::from_utf8_lossy(&bytes));
        }
    }

    /// Compact documents of flat objects (see `Writer::flat_object`):
    /// rows in a list and an object within the outermost, each of up to
    /// ten entries (the flat path takes eight), keys from a small alphabet
    /// (so that many are out of order or given twice), values that are
    /// scalars, some of which the flat path leaves to the general one (an
    /// exponent, an escape).
    fn flat_document() -> impl Strategy<Value = String> {
        let scalar = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            prop::sample::select(NUMBERS).prop_map(str::to_owned),
            "[a-z0-9 é\\\\]{0,6}".prop_map(|text| format!("\"{text}\"")),
        ];
        let object = prop::collection::vec(("[ab]{0,3}", scalar), 0..11).prop_map(|entries| {
            let entries: Vec<String> = entries
                .iter()
                .map(|(key, value)| format!("\"{key}\":{value}"))
                .collect();
            format!("{{{}}}", entries.join(","))
        });
        (prop::collection::vec(object.clone(), 0..6), object)
            .prop_map(|(rows, one)| format!("{{\"rows\":[{}],\"one\":{one}}}", rows.join(",")))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Flat objects, in order or not, are written as the tree writer
        /// writes them, and refused as it refuses them, whole or damaged.
        #[test]
        fn flat_objects_are_written_and_refused_as_the_tree_writer_does(
            text in flat_document(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, prop::sample::select(DAMAGE)), 0..3),
        ) {
            let bytes = damaged(text.into_bytes(), edits);
            prop_assert_eq!(canonical(&bytes), tree_canonical(&bytes), "{:?}", String::from_utf8_lossy(&bytes));
            prop_assert_eq!(through_kept_buffers(&bytes), canonical(&bytes), "{:?}", String::from_utf8_lossy(&bytes));
        }
    }

    /// `bytes` with each edit made: at a place, a byte changed (0), dropped
    /// (1) or added (2; also 0 and 1 past the end).
    fn damaged(mut bytes: Vec<u8>, edits: Vec<(prop::sample::Index, u8, u8)>) -> Vec<u8> {
        for (at, kind, byte) in edits {
            let at = at.index(bytes.len() + 1);
            match kind {
                0 if at < bytes.len() => bytes[at] = byte,
                1 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at, byte),
            }
        }
        bytes
    }

    /// Bytes that matter to the grammar, and some that never may.
    const DAMAGE: &[u8] =
        b"{}[]\",:\\/ \t\n\r0123456789-+.eEtrufalsn\x00\x1f\x7fuABCDEF\xc3\xa9\xff";

    #[test]
    fn entries_out_of_order_are_moved_once_and_nested_objects_stay_whole() {
        let text = br#"{"z":{"b":[{"d":1,"c":2}],"a":"x"},"a\u0062":3,"a":{"y":null,"x":true}}"#;
        let expected = r#"{"a":{"x":true,"y":null},"ab":3,"z":{"a":"x","b":[{"c":2,"d":1}]}}"#;
        assert_eq!(canonical(text).as_deref(), Ok(expected.as_bytes()));
        assert_eq!(
            canonical(br#"{"b":1,"a":2,"b":3}"#),
            Err(NotCanonical::DuplicateKey)
        );
        assert_eq!(
            canonical(br#"{"a":1,"\u0061":2}"#),
            Err(NotCanonical::DuplicateKey),
            "in order, but the same key once unescaped"
        );
    }

    /// A nested object out of order is written from the source when its
    /// body is still the source's, and moved through the scratch buffer
    /// when something in it was rewritten (spacing, an escape, an object
    /// reordered inside it): the same form either way.
    #[test]
    fn a_nested_object_out_of_order_is_the_same_from_the_source_or_rewritten() {
        for text in [
            &br#"[{"b":1,"a":[2]}]"#[..],
            br#"[{"b":1, "a":[2]}]"#,
            br#"[{"\u0062":1,"a":[2]}]"#,
            br#"[{"b":1,"a":[2 ]}]"#,
        ] {
            assert_eq!(
                canonical(text).as_deref(),
                Ok(&br#"[{"a":[2],"b":1}]"#[..]),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        assert_eq!(
            canonical(br#"[{"d":{"y":1,"x":2},"c":3},{"f":1,"e":2}]"#).as_deref(),
            Ok(&br#"[{"c":3,"d":{"x":2,"y":1}},{"e":2,"f":1}]"#[..]),
            "a reordered object inside another, then one from the source after it"
        );
    }

    /// The outermost object is written out in key order, not moved into
    /// it: what a hash is given is the canonical form all the same.
    #[test]
    fn the_outermost_object_is_written_in_key_order() {
        for (text, expected) in [
            (
                &br#" { "b" : [ 1 , {"y":1,"x":2} ] , "a" : { } } "#[..],
                r#"{"a":{},"b":[1,{"x":2,"y":1}]}"#,
            ),
            (br#"{"c":1,"a":2,"b":3}"#, r#"{"a":2,"b":3,"c":1}"#),
            (br#"[{"b":1,"a":2}]"#, r#"[{"a":2,"b":1}]"#),
        ] {
            let mut sink = Vec::new();
            write_canonical(text, &mut sink).unwrap();
            assert_eq!(String::from_utf8(sink).unwrap(), expected);
            assert_eq!(canonical(text).unwrap(), expected.as_bytes());
        }
    }
}
