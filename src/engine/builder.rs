//! Engine configuration.

use super::{
    cache::RecordCache,
    state::{Engine, Inner},
};
use crate::{store::Store, Clock, SystemClock};
use std::{num::NonZeroUsize, sync::Arc, time::Duration};

/// How long completed records are kept by default: 24 hours, as Stripe does.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// The default cap on a lease: 15 minutes, the longest a Lambda invocation
/// can run, so the cap never cuts a real invocation's lease short.
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(15 * 60);
/// The lease when an attempt has no deadline: 60 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The longest retention or lease an engine accepts: 100 years. Every
/// store keeps a record's times as epoch milliseconds in a signed 64-bit
/// integer (PostgreSQL's `bigint`) or a Lua number (exact below 2^53), so a
/// longer one would overflow there; [`EngineBuilder::try_build`] refuses it
/// before anything is written.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
/// The record id prefix outside Lambda; inside, [`default_key_prefix`] adds
/// the function's name.
pub const DEFAULT_KEY_PREFIX: &str = "idempotency";

/// The environment variable Lambda sets to the function's name.
const FUNCTION_NAME_VARIABLE: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// Set to `true` to turn idempotency off, for local tests of a handler: every
/// operation runs, nothing is stored. Read by [`EngineBuilder::build`].
pub const DISABLED_VARIABLE: &str = "IDEMPOTENCY_DISABLED";

/// Set to `true`, with [`DISABLED_VARIABLE`], to turn idempotency off even
/// inside Lambda (where `AWS_LAMBDA_FUNCTION_NAME` is set): without it, the
/// switch is refused there.
pub const DISABLED_IN_LAMBDA_VARIABLE: &str = "IDEMPOTENCY_DISABLED_IN_LAMBDA";

/// Whether the environment turns idempotency off: `Err` with the reason
/// when it asks to inside Lambda without forcing it.
fn disabled_by(
    disabled: Option<&str>,
    function_name: Option<&str>,
    in_lambda: Option<&str>,
) -> Result<bool, &'static str> {
    let yes = |value: Option<&str>| value.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if !yes(disabled) {
        return Ok(false);
    }
    if function_name.is_some_and(|name| !name.is_empty()) && !yes(in_lambda) {
        return Err("IDEMPOTENCY_DISABLED=true is refused inside Lambda (AWS_LAMBDA_FUNCTION_NAME is set); \
                    idempotency stays ON. Set IDEMPOTENCY_DISABLED_IN_LAMBDA=true as well to force it");
    }
    Ok(true)
}

/// The record id prefix an engine gets unless
/// [`key_prefix`](EngineBuilder::key_prefix) sets one:
/// `idempotency:<function name>` inside a Lambda function (from
/// `AWS_LAMBDA_FUNCTION_NAME`, as Powertools does), [`DEFAULT_KEY_PREFIX`]
/// elsewhere.
///
/// With the function's name in it, two functions sharing one table never
/// share records, even for the same route, principal and key. The name is
/// the function's, not a version's or an alias's, so records survive
/// deployments; renaming the function starts afresh.
pub fn default_key_prefix() -> String {
    match std::env::var(FUNCTION_NAME_VARIABLE) {
        Ok(name) if !name.is_empty() => format!("{DEFAULT_KEY_PREFIX}:{name}"),
        _ => DEFAULT_KEY_PREFIX.to_owned(),
    }
}

/// Whether an engine whose heartbeat was not set has one: where invocations
/// outlive their deadlines (Lambda Managed Instances), logged once per
/// engine.
fn heartbeat_by_default() -> bool {
    let Some(concurrency) = super::managed_instances_concurrency() else {
        return false;
    };
    tracing::debug!(
        concurrency,
        "Lambda Managed Instances (AWS_LAMBDA_MAX_CONCURRENCY is set): invocations are not \
         stopped at their deadlines, so the heartbeat keeps each claim while its work runs"
    );
    true
}

/// Builds an [`Engine`]; start from [`Engine::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct EngineBuilder<St> {
    store: St,
    key_prefix: String,
    retention: Duration,
    max_lease: Duration,
    default_lease: Duration,
    cache_capacity: Option<NonZeroUsize>,
    fail_open: bool,
    /// `None` until set: then on exactly where invocations outlive their
    /// deadlines (Lambda Managed Instances).
    heartbeat: Option<bool>,
    read_before_claim: bool,
    step_limits: crate::store::StepLimits,
    clock: Arc<dyn Clock>,
    observers: crate::observe::Observers,
    #[cfg(feature = "encryption")]
    encryption: Option<crate::encryption::Encryption>,
}

impl<St: Store> Engine<St> {
    /// Starts configuring an engine over `store`.
    pub fn builder(store: St) -> EngineBuilder<St> {
        EngineBuilder::new(store)
    }
}

impl<St: Store> EngineBuilder<St> {
    pub(super) fn new(store: St) -> Self {
        Self {
            store,
            key_prefix: default_key_prefix(),
            retention: DEFAULT_RETENTION,
            max_lease: DEFAULT_MAX_LEASE,
            default_lease: DEFAULT_LEASE,
            cache_capacity: None,
            fail_open: false,
            heartbeat: None,
            read_before_claim: false,
            step_limits: Default::default(),
            clock: Arc::new(SystemClock),
            observers: Default::default(),
            #[cfg(feature = "encryption")]
            encryption: None,
        }
    }

    /// Tells `observer` how every attempt was answered, through any port,
    /// and what the engine met on the way (takeovers, claims found in
    /// progress and their age, conflicts retried): see
    /// [`observe`](crate::observe). Several observers may be added; each
    /// is told every event, in the order they were added.
    pub fn observer(mut self, observer: impl crate::observe::Observer) -> Self {
        self.observers.add(Arc::new(observer));
        self
    }

    /// Encrypts stored responses: every completion seals its response
    /// (AES-256-GCM, bound to its record), and every replay opens it, on
    /// any store. A record that fails to open is never replayed, never
    /// overwritten and never run again: an
    /// [`Unauthentic`](crate::StoreErrorKind::Unauthentic) error. Records
    /// stored in the clear before keep replaying unless
    /// [`Encryption::refuse_plaintext`](crate::encryption::Encryption::refuse_plaintext)
    /// says otherwise. See [`encryption`](crate::encryption) for the keys,
    /// the envelope, turning it on and off on a live table, and the threat
    /// model.
    #[cfg(feature = "encryption")]
    #[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
    pub fn encryption(mut self, encryption: crate::encryption::Encryption) -> Self {
        self.encryption = Some(encryption);
        self
    }

    /// The prefix of every record id (default: [`default_key_prefix`],
    /// `idempotency:<function name>` in Lambda). Records under another
    /// prefix are invisible, so keep it stable across deployments. Set the
    /// same prefix on two functions only when they must share keys (two
    /// front ends of one operation, say).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// How long a completed outcome is replayed (default 24 hours). It is
    /// also the floor of an in-progress record's expiration.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The longest lease a claim gets (default 15 minutes). A claim's lease
    /// runs until the attempt's deadline, capped by this. An operation that
    /// outlives its lease can be run a second time by a retry, so keep it at
    /// least as long as the operation can take.
    pub fn max_lease(mut self, max_lease: Duration) -> Self {
        self.max_lease = max_lease;
        self
    }

    /// The lease of an attempt without a deadline (default 60 seconds),
    /// capped by [`max_lease`](EngineBuilder::max_lease).
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// Keeps up to `capacity` completed records in this process, so a replay
    /// in a warm execution environment costs no store call; `0` turns the
    /// cache off (the default). Fingerprint and expiration are checked on
    /// every hit; records still in progress are never cached. A record
    /// deleted from the store by hand stays cached until it expires here.
    pub fn cache(mut self, capacity: usize) -> Self {
        self.cache_capacity = NonZeroUsize::new(capacity);
        self
    }

    /// Reads the key's record before claiming it, the cheapest way the
    /// store offers ([`Store::peek`]: on
    /// DynamoDB an eventually consistent `GetItem`), and answers from a
    /// completed record without the claim (off by default).
    ///
    /// On DynamoDB a refused conditional write is billed by the size of
    /// the record it found, so without this a replay, or a 422, of a
    /// 16 KB response costs 17 write units; with it, the read costs 2.5
    /// read units (a fifth of the price per unit), and a new request one
    /// more round trip and half a read unit (`make bench-cost`,
    /// BENCHMARKS.md). Choose it where replays of large responses are
    /// common; leave it off where latency counts more than cost.
    ///
    /// No guarantee changes: only a completed record is acted on, and a
    /// completed record does not change until it expires, so a stale read
    /// can only miss it (then the claim decides, as without the read). A
    /// record an operator deleted ([`Engine::forget`](crate::Engine::forget))
    /// may be replayed once more for as long as the store's reads lag
    /// (DynamoDB: usually under a second). A read that fails is passed
    /// over: the claim decides.
    ///
    /// [`run_single_write`](crate::Engine::run_single_write) reads first too,
    /// so that a retry of a completed request is answered without running
    /// the operation at all.
    pub fn read_before_claim(mut self, read: bool) -> Self {
        self.read_before_claim = read;
        self
    }

    /// **Dangerous.** When the store cannot be reached to claim a key, run the
    /// operation anyway, without any idempotency protection (default
    /// `false`: fail closed, the operation does not run). Duplicates that
    /// arrive during a store outage all run. Only an outage
    /// ([`StoreErrorKind::is_outage`](crate::StoreErrorKind::is_outage):
    /// unreachable, timed out, failing over, throttled) is failed open; a
    /// misconfigured store, a rejected value or a lost race never runs the
    /// operation without a claim. The outage is confirmed by a read of the
    /// key's record first: a store that still answers it is answered from
    /// the record it holds (in progress, a replay), or fails closed. The outcome is marked
    /// [`OutcomeKind::Unprotected`](crate::OutcomeKind::Unprotected) and
    /// logged as a warning. Transactional executions always fail closed:
    /// their writes need the store; so do attempts marked
    /// [`Attempt::fail_closed`](crate::Attempt::fail_closed), and every
    /// call of [`split`](crate::split) (every claim of a durable function,
    /// in `lambda-idempotency-durable`).
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// Keeps every claim alive while its operation runs: the claim's lease
    /// is at least 10 seconds (capped by [`max_lease`](EngineBuilder::max_lease)),
    /// and every third of it the lease is extended by its length again (a
    /// fenced write, one store call), until the operation ends; an
    /// extension that fails is tried again within a tenth of a second. An
    /// extension that finds the claim lost tells the operation
    /// ([`ClaimHandle::lost`](crate::ClaimHandle::lost)) and stops.
    /// Operations can also extend by hand with
    /// [`ClaimHandle::extend`](crate::ClaimHandle::extend).
    ///
    /// **Default: on in a Lambda Managed Instance, off elsewhere.** A
    /// claim's lease ends at its invocation's deadline (capped by
    /// [`max_lease`](EngineBuilder::max_lease)). In a Lambda function of the
    /// default kind the invocation is stopped there, with its execution
    /// environment, so the lease ends with the work. Under Managed
    /// Instances ([`managed_instances_concurrency`](crate::managed_instances_concurrency):
    /// `AWS_LAMBDA_MAX_CONCURRENCY` is set) Lambda does not stop an
    /// invocation at its deadline: its code runs on while Lambda reports the
    /// timeout, and the retry that follows would take over a lease that
    /// ended at the deadline and run beside it. With the heartbeat the
    /// retry finds the key in progress (a `409`, or the replay once the
    /// first completes) for as long as the first run goes on.
    ///
    /// Set it either way to decide yourself. Turn it on for operations that
    /// may outlive any lease worth guessing (long jobs, work outside
    /// Lambda, where the lease is [`default_lease`](EngineBuilder::default_lease)).
    /// Turning it off under Managed Instances brings back the second run
    /// beside a late first; to stop work at its deadline instead, bound it
    /// yourself (`tokio::time::timeout` with the time the Lambda context
    /// says is left), knowing that whatever it did before the cut is
    /// repeated by the retry.
    ///
    /// If the process dies, the heartbeat stops with it and the claim lapses
    /// one lease later (10 seconds, or what was left to the invocation's
    /// deadline when it claimed, if longer): the retry after that takes it
    /// over and is told so
    /// ([`ClaimHandle::takeover`](crate::ClaimHandle::takeover)).
    pub fn heartbeat(mut self, heartbeat: bool) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// The bounds on the steps an operation records
    /// ([`ClaimHandle::step`](crate::ClaimHandle::step)): the largest
    /// encoded output of one step, and the most steps one key records
    /// (default: 16 KiB and 16). A step beyond either fails before it runs
    /// (its count) or before it is recorded (its size), as
    /// [`StoreErrorKind::Rejected`](crate::StoreErrorKind::Rejected).
    pub fn step_limits(mut self, limits: crate::store::StepLimits) -> Self {
        self.step_limits = limits;
        self
    }

    /// The clock leases and expirations are measured with (default: the
    /// system clock). Tests use a `testing::ManualClock` (feature `testing`).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Builds the engine.
    ///
    /// With `IDEMPOTENCY_DISABLED=true` in the environment the engine is
    /// **off**, for local tests of a handler: every operation runs and
    /// nothing is stored or replayed
    /// ([`OutcomeKind::Disabled`](crate::OutcomeKind::Disabled)); an
    /// operation that returns writes gets
    /// [`Error::WritesNotCommitted`](crate::Error::WritesNotCommitted).
    /// It is logged as an error when the engine is built. Inside Lambda
    /// (`AWS_LAMBDA_FUNCTION_NAME` set) the switch is refused, and logged,
    /// unless `IDEMPOTENCY_DISABLED_IN_LAMBDA=true` forces it.
    ///
    /// # Panics
    ///
    /// When the configuration is invalid (see [`try_build`](EngineBuilder::try_build)):
    /// a retention of zero or longer than [`MAX_DURATION`], a lease longer
    /// than it. Use `try_build` for settings read at run time.
    pub fn build(self) -> Engine<St> {
        match self.try_build() {
            Ok(engine) => engine,
            Err(error) => panic!("{error}"),
        }
    }

    /// Builds the engine, or says why its configuration cannot work: a
    /// retention of zero (nothing would ever be replayed), or a retention or
    /// lease longer than [`MAX_DURATION`] (the stores' integer types cannot
    /// hold its end). Checked once, here, so that no request ever meets it.
    ///
    /// ```
    /// # use lambda_idempotency::{Engine, MemoryStore};
    /// # use std::time::Duration;
    /// let error = Engine::builder(MemoryStore::new())
    ///     .retention(Duration::MAX)
    ///     .try_build()
    ///     .unwrap_err();
    /// assert!(error.to_string().contains("retention"));
    /// ```
    pub fn try_build(self) -> Result<Engine<St>, BuildError> {
        if self.retention.is_zero() {
            return Err(BuildError::new(
                "the retention is zero: no outcome would ever be replayed",
            ));
        }
        for (name, duration) in [
            ("retention", self.retention),
            ("max_lease", self.max_lease),
            ("default_lease", self.default_lease),
        ] {
            if duration > MAX_DURATION {
                return Err(BuildError::new(format!(
                    "the {name} ({duration:?}) is longer than the longest the stores can hold \
                     (MAX_DURATION, 100 years)"
                )));
            }
        }
        #[cfg(feature = "encryption")]
        if let Some(why) = self.encryption.as_ref().and_then(|e| e.invalid()) {
            return Err(BuildError::new(why));
        }
        Ok(self.build_checked())
    }

    fn build_checked(self) -> Engine<St> {
        let variable = |name: &str| std::env::var(name).ok();
        let disabled = match disabled_by(
            variable(DISABLED_VARIABLE).as_deref(),
            variable(FUNCTION_NAME_VARIABLE).as_deref(),
            variable(DISABLED_IN_LAMBDA_VARIABLE).as_deref(),
        ) {
            Ok(true) => {
                tracing::error!(
                    "IDEMPOTENCY IS DISABLED (IDEMPOTENCY_DISABLED=true): every operation runs, \
                     duplicates included, and nothing is stored. For local tests only"
                );
                true
            }
            Ok(false) => false,
            Err(refusal) => {
                tracing::error!("{refusal}");
                false
            }
        };
        Engine {
            inner: Arc::new(Inner {
                store: super::observed_store::ObservedStore::new(
                    self.store,
                    self.observers.clone(),
                ),
                key_prefix: self.key_prefix,
                retention: self.retention,
                max_lease: self.max_lease,
                default_lease: self.default_lease.min(self.max_lease),
                cache: self.cache_capacity.map(RecordCache::new),
                fail_open: self.fail_open,
                heartbeat: self.heartbeat.unwrap_or_else(heartbeat_by_default),
                read_before_claim: self.read_before_claim,
                step_limits: self.step_limits,
                stepped_claims: Default::default(),
                disabled,
                clock: self.clock,
                local_runs: Default::default(),
                observers: self.observers,
                #[cfg(feature = "encryption")]
                encryption: self.encryption,
            }),
        }
    }
}

/// Why [`EngineBuilder::try_build`] refused a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BuildError {
    message: String,
}

impl BuildError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid idempotency engine configuration: {}",
            self.message
        )
    }
}

impl std::error::Error for BuildError {}

#[cfg(test)]
mod tests {
    use super::disabled_by;

    #[test]
    fn the_switch_is_on_only_when_asked_and_refused_inside_lambda_unless_forced() {
        assert_eq!(disabled_by(None, None, None), Ok(false));
        assert_eq!(disabled_by(Some("false"), None, None), Ok(false));
        assert_eq!(disabled_by(Some("1"), None, None), Ok(false), "only `true`");
        assert_eq!(disabled_by(Some("true"), None, None), Ok(true));
        assert_eq!(disabled_by(Some(" TRUE "), Some(""), None), Ok(true));
        assert!(disabled_by(Some("true"), Some("charges"), None).is_err());
        assert!(disabled_by(Some("true"), Some("charges"), Some("no")).is_err());
        assert_eq!(
            disabled_by(Some("true"), Some("charges"), Some("true")),
            Ok(true)
        );
        assert_eq!(disabled_by(None, Some("charges"), Some("true")), Ok(false));
    }
}
