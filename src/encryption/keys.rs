//! Where data keys come from: the [`KeyProvider`] trait, the data key it
//! hands out, and [`RawKeys`], keys the application holds itself.

use crate::error::BoxError;
use aws_lc_rs::aead::{RandomizedNonceKey, AES_256_GCM};
use std::{collections::HashMap, fmt, future::Future, pin::Pin, sync::Arc};

/// The length of an AES-256 key, in bytes.
pub const KEY_LEN: usize = 32;

/// The longest key id an envelope carries, in bytes.
pub const MAX_KEY_ID_LEN: usize = 255;

/// The longest wrapped data key an envelope carries, in bytes (a KMS
/// ciphertext blob of a 256-bit data key is under 200).
pub const MAX_WRAPPED_LEN: usize = 1024;

/// An AES-256-GCM data key, ready to seal and open, with the id and the
/// wrapped form that a sealed response carries so that a reader can find
/// the key again.
///
/// Cheap to clone (its parts are shared). Its `Debug` shows the id only.
#[derive(Clone)]
pub struct DataKey {
    // One shared allocation: a key is cloned on every seal and open, so
    // one reference count to touch rather than one per part.
    parts: Arc<DataKeyParts>,
}

struct DataKeyParts {
    id: Arc<str>,
    wrapped: Box<[u8]>,
    key: RandomizedNonceKey,
}

impl DataKey {
    /// A data key named `id`, from its 32 bytes. `wrapped` is the key
    /// encrypted under a master key (what a KMS `GenerateDataKey` returns as
    /// its ciphertext blob), empty for a key used as it is ([`RawKeys`]).
    ///
    /// An `id` must be 1 to [`MAX_KEY_ID_LEN`] bytes, and `wrapped` at most
    /// [`MAX_WRAPPED_LEN`]: both travel in the clear with every record.
    pub fn new(
        id: impl Into<String>,
        wrapped: Vec<u8>,
        key: &[u8; KEY_LEN],
    ) -> Result<Self, KeyError> {
        let id = id.into();
        check_id(&id)?;
        if wrapped.len() > MAX_WRAPPED_LEN {
            return Err(KeyError::new(
                KeyErrorKind::Invalid,
                format!(
                    "the wrapped data key of `{id}` is {} bytes, more than {MAX_WRAPPED_LEN}",
                    wrapped.len()
                ),
            ));
        }
        let key = RandomizedNonceKey::new(&AES_256_GCM, key)
            .map_err(|_| KeyError::new(KeyErrorKind::Invalid, "AES-256-GCM refused the key"))?;
        Ok(Self {
            parts: Arc::new(DataKeyParts {
                id: id.into(),
                wrapped: wrapped.into(),
                key,
            }),
        })
    }

    /// The key's id, in the clear in every record it sealed.
    pub fn id(&self) -> &str {
        &self.parts.id
    }

    /// The key wrapped under its master key; empty for a raw key.
    pub fn wrapped(&self) -> &[u8] {
        &self.parts.wrapped
    }

    pub(super) fn cipher(&self) -> &RandomizedNonceKey {
        &self.parts.key
    }
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataKey")
            .field("id", &self.parts.id)
            .field("wrapped_len", &self.parts.wrapped.len())
            .finish_non_exhaustive()
    }
}

fn check_id(id: &str) -> Result<(), KeyError> {
    if id.is_empty() || id.len() > MAX_KEY_ID_LEN {
        return Err(KeyError::new(
            KeyErrorKind::Invalid,
            format!(
                "a key id must be 1 to {MAX_KEY_ID_LEN} bytes; `{}` is {}",
                id.escape_debug(),
                id.len()
            ),
        ));
    }
    Ok(())
}

/// A data key found at once, or after a call (a KMS `Decrypt`, say).
///
/// A provider that holds its keys answers [`Ready`](KeyLookup::Ready), and
/// a request pays no allocation for it; one that must call out answers
/// [`Pending`](KeyLookup::Pending), a boxed future.
#[non_exhaustive]
pub enum KeyLookup<'a> {
    /// The key, or why there is none.
    Ready(Result<DataKey, KeyError>),
    /// A future of the key, or of why there is none.
    Pending(Pin<Box<dyn Future<Output = Result<DataKey, KeyError>> + Send + 'a>>),
}

impl KeyLookup<'_> {
    /// The key, awaited if it must be.
    pub async fn resolve(self) -> Result<DataKey, KeyError> {
        match self {
            KeyLookup::Ready(key) => key,
            KeyLookup::Pending(key) => key.await,
        }
    }
}

impl fmt::Debug for KeyLookup<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyLookup::Ready(key) => f.debug_tuple("Ready").field(key).finish(),
            KeyLookup::Pending(_) => f.write_str("Pending"),
        }
    }
}

/// Where the engine gets its data keys: the one to seal each new response
/// with, and the one a stored response names.
///
/// [`RawKeys`] holds the keys itself. A provider that wraps data keys under
/// a master key elsewhere (AWS KMS's `GenerateDataKey` and `Decrypt`)
/// implements the same two methods: it hands out a data key with its
/// wrapped form for sealing (reusing one within the bounds it sets, so
/// that a request does not pay a call), and unwraps the wrapped key a
/// record carries for opening (caching what it unwrapped). Its failures say
/// whether they are an outage ([`KeyErrorKind::Unavailable`]: the request
/// is answered as a store outage is, and may be retried) or final.
pub trait KeyProvider: Send + Sync + fmt::Debug + 'static {
    /// The data key to seal the next response with.
    fn sealing_key(&self) -> KeyLookup<'_>;

    /// The data key a stored response was sealed with, from the `key_id`
    /// and the `wrapped` key its envelope carries (read from the store:
    /// never trust either beyond looking them up). An id this provider
    /// does not know is [`KeyErrorKind::UnknownKey`].
    fn opening_key<'a>(&'a self, key_id: &'a str, wrapped: &'a [u8]) -> KeyLookup<'a>;
}

/// Keys the application holds itself, by id: one seals every new response
/// (the primary), and every one opens the responses sealed under it.
///
/// For tests, for keys kept outside AWS (another cloud's secret store, a
/// configuration secret), and as a plan for a KMS outage. Rotation: build
/// it with the new key as the primary and the old ones beside it
/// ([`with_key`](RawKeys::with_key)) until the records they sealed have
/// expired (the engine's retention), then drop them; a record sealed under
/// a key no longer there does not open, and is refused.
///
/// ```
/// use lambda_idempotency::encryption::RawKeys;
/// // In practice from a secret store, never from the source.
/// let (old, new) = ([7u8; 32], [9u8; 32]);
/// let keys = RawKeys::new("2026-11", &new)?.with_key("2026-05", &old)?;
/// assert_eq!(keys.primary_id(), "2026-11");
/// # Ok::<(), lambda_idempotency::encryption::KeyError>(())
/// ```
#[derive(Clone)]
pub struct RawKeys {
    primary: DataKey,
    by_id: HashMap<Arc<str>, DataKey>,
}

impl RawKeys {
    /// Keys with `key`, named `id`, as the primary: it seals every new
    /// response.
    pub fn new(id: impl Into<String>, key: &[u8; KEY_LEN]) -> Result<Self, KeyError> {
        let primary = DataKey::new(id, Vec::new(), key)?;
        let mut by_id = HashMap::new();
        by_id.insert(Arc::clone(&primary.parts.id), primary.clone());
        Ok(Self { primary, by_id })
    }

    /// These keys and `key`, named `id`, which opens the responses sealed
    /// under it (an older primary, during a rotation). An id already
    /// there is an error: two keys under one id would make records
    /// unreadable.
    pub fn with_key(
        mut self,
        id: impl Into<String>,
        key: &[u8; KEY_LEN],
    ) -> Result<Self, KeyError> {
        let key = DataKey::new(id, Vec::new(), key)?;
        if self.by_id.contains_key(key.id()) {
            return Err(KeyError::new(
                KeyErrorKind::Invalid,
                format!("two keys are named `{}`", key.id().escape_debug()),
            ));
        }
        self.by_id.insert(Arc::clone(&key.parts.id), key);
        Ok(self)
    }

    /// The id of the key that seals new responses.
    pub fn primary_id(&self) -> &str {
        self.primary.id()
    }
}

impl fmt::Debug for RawKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&str> = self.by_id.keys().map(|id| &**id).collect();
        ids.sort_unstable();
        f.debug_struct("RawKeys")
            .field("primary", &self.primary.id())
            .field("ids", &ids)
            .finish()
    }
}

impl KeyProvider for RawKeys {
    fn sealing_key(&self) -> KeyLookup<'_> {
        KeyLookup::Ready(Ok(self.primary.clone()))
    }

    fn opening_key<'a>(&'a self, key_id: &'a str, wrapped: &'a [u8]) -> KeyLookup<'a> {
        // The primary first: it sealed most records, and a comparison
        // costs less than hashing the id.
        let key = if self.primary.id() == key_id {
            Some(&self.primary)
        } else {
            self.by_id.get(key_id)
        };
        KeyLookup::Ready(match key {
            // A raw key is never wrapped: a record that says otherwise was
            // not sealed by these keys.
            Some(key) if wrapped.is_empty() => Ok(key.clone()),
            Some(_) => Err(KeyError::new(
                KeyErrorKind::UnknownKey,
                format!(
                    "key `{}` is a raw key, and the record carries a wrapped data key under it",
                    key_id.escape_debug()
                ),
            )),
            None => Err(KeyError::new(
                KeyErrorKind::UnknownKey,
                format!("no key named `{}` is configured", key_id.escape_debug()),
            )),
        })
    }
}

/// Why a [`KeyProvider`] has no key to give.
#[derive(Debug)]
pub struct KeyError {
    kind: KeyErrorKind,
    message: String,
    source: Option<BoxError>,
}

impl KeyError {
    /// An error of `kind`, described by `message`.
    pub fn new(kind: KeyErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error (the SDK's, say).
    #[must_use]
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> KeyErrorKind {
        self.kind
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for KeyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The kind of a [`KeyError`]: what it means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyErrorKind {
    /// The record names a key this provider does not have (removed after a
    /// rotation, or never configured here): the record does not open, and
    /// is refused as any record that fails to open is.
    UnknownKey,
    /// The key could not be had for now (a KMS outage, throttling): the
    /// request is answered as a store outage is (503, nothing run), and a
    /// retry later can succeed.
    Unavailable,
    /// A key or key id that cannot be used (a wrong length, an empty id).
    Invalid,
    /// Anything else.
    Other,
}
