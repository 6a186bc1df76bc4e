//! `lambda-idempotency`: look at and evict idempotency records in DynamoDB,
//! and with the default features `postgres` and `redis` in those stores too.
//!
//! ```text
//! lambda-idempotency --store dynamodb://idempotency --prefix idempotency:charges \
//!     inspect --scope '<scope>' --key order-77 [--json]
//! lambda-idempotency --store dynamodb://idempotency forget --scope … --key … [--force]
//! lambda-idempotency --store dynamodb://idempotency list --in-progress [--limit 100] [--json]
//! lambda-idempotency --store dynamodb://idempotency abandoned [--older-than 15m] \
//!     [--policy report|release|fail] [--limit 100] [--json]   # the completer
//! lambda-idempotency --store postgres://… stats [--json]   # the table size, the store's own count
//! lambda-idempotency --store postgres://… purge-expired [--batch 1000]
//! lambda-idempotency --store postgres://… --postgres-partitioned [--audit-window-days 7] \
//!     maintain-partitions | partitions | history --scope … --key …
//! lambda-idempotency --table app --key-attr pk --sort-key-attr sk \
//!     --static-pk-value 'idempotency#charges' list --in-progress   # single-table
//! lambda-idempotency scope --event request.json   # the scope the HTTP layer derives
//! ```
//!
//! `--event <file>` (an API Gateway, ALB or Function URL event of the
//! request) stands for `--scope` anywhere: the tool derives the scope as the
//! HTTP layer does.
//!
//! Sealed responses (the engine's `encryption`): `inspect` shows the key id
//! a sealed response names and its size; given the keys and the context
//! the engine seals under, it opens it and shows what a retry gets back,
//! or says plainly that it does not open (a record never replayed: forget
//! it to let the key run again):
//!
//! ```text
//! lambda-idempotency --table idempotency --raw-key 2026-11=/run/secrets/idem-2026-11 \
//!     --encryption-context prod/idempotency inspect --scope … --key order-77
//! ```
//!
//! A key is read from a file (32 bytes, or 64 hex digits), never given on
//! the command line: a command line is visible to every user of the
//! machine (`ps`) and kept in shell histories.
//!
//! The store is named by URL, as the reference functions name it
//! (`IDEMPOTENCY_STORE_URL`): `dynamodb://<table>` (or `--table`),
//! `postgres://…` and `postgresql://…` (the table `idempotency`, or
//! `--postgres-table`), `redis://…`, `rediss://…`, `redis+cluster://…`,
//! `rediss+cluster://…` (under `--redis-namespace`, none by default). The
//! AWS client comes from the environment (credentials, region,
//! `AWS_ENDPOINT_URL_DYNAMODB`); `IDEMPOTENCY_STORE_ROOT_CERTIFICATE` names
//! the CA to trust for TLS, as for the functions. The prefix defaults to the
//! crate's default for the function named by `AWS_LAMBDA_FUNCTION_NAME`.
//! Records hold only a hash of the key: this tool prints the key only when
//! it was given one.
#![forbid(unsafe_code)]

#[cfg(feature = "postgres")]
mod partitions;
mod store_url;

use clap::{Args, Parser, Subcommand};
use lambda_idempotency::{
    default_key_prefix,
    encryption::{self, Encryption, RawKeys, KEY_LEN},
    http::{
        decode_stored_response, default_scope, BodyNotStored, StoredBody as Body, TraceContext,
    },
    store::{
        dynamodb::{AttributeNames, SingleTable},
        Accuracy, Record, Store, TableSize,
    },
    AbandonedPolicy, Completer, CompleterReport, DynamoDbStore, Engine, Forgotten, Settlement,
    StoreError, StoreErrorKind,
};
use serde_json::{json, Value};
use std::{path::PathBuf, process::ExitCode};

#[derive(Parser)]
#[command(version, about = "Look at and evict idempotency records")]
struct Cli {
    /// The store: dynamodb://<table>, postgres://…, redis://…,
    /// rediss://…, redis+cluster://…
    #[arg(long, env = "IDEMPOTENCY_STORE_URL")]
    store: Option<String>,
    /// The DynamoDB table (same as --store dynamodb://<table>).
    #[arg(long, env = "IDEMPOTENCY_TABLE")]
    table: Option<String>,
    /// The DynamoDB partition key attribute (AttributeNames::id; Powertools'
    /// `key_attr`).
    #[arg(long, env = "IDEMPOTENCY_KEY_ATTR", default_value = "id")]
    key_attr: String,
    /// A DynamoDB single-table layout: the sort key attribute that holds the
    /// record id (Powertools' `sort_key_attr`; DynamoDbStore::single_table).
    #[arg(long, env = "IDEMPOTENCY_SORT_KEY_ATTR")]
    sort_key_attr: Option<String>,
    /// The partition key value of a single-table layout (Powertools'
    /// `static_pk_value`; default `idempotency#<AWS_LAMBDA_FUNCTION_NAME>`).
    #[arg(long, env = "IDEMPOTENCY_STATIC_PK_VALUE", requires = "sort_key_attr")]
    static_pk_value: Option<String>,
    /// The PostgreSQL table of the records.
    #[arg(long, default_value = store_url::POSTGRES_TABLE)]
    postgres_table: String,
    /// The PostgreSQL table is the partitioned layout
    /// (PostgresStore::partitioned): records in day partitions, dropped
    /// whole by maintain-partitions.
    #[arg(long, env = "IDEMPOTENCY_POSTGRES_PARTITIONED")]
    postgres_partitioned: bool,
    /// How long after its claim a record stays readable for support
    /// (history), in days: the partitioned layout's audit window. Its
    /// dedup window is the engine's retention.
    #[arg(long, default_value_t = 7, requires = "postgres_partitioned")]
    audit_window_days: u64,
    /// Days of partitions to make ahead of today.
    #[arg(long, default_value_t = 3, requires = "postgres_partitioned")]
    premake_days: u32,
    /// The Redis key namespace of the records (RedisStore::namespace).
    #[arg(long, default_value = "")]
    redis_namespace: String,
    /// The Redis database holds the records and nothing else
    /// (RedisStore::owns_database): `stats` counts them with DBSIZE.
    #[arg(long)]
    redis_owns_database: bool,
    /// The record prefix of the function (default: the crate's default,
    /// `idempotency:<AWS_LAMBDA_FUNCTION_NAME>`).
    #[arg(long)]
    prefix: Option<String>,
    /// A raw key that opens sealed responses, as `<key id>=<file>`: the
    /// file holds the 32-byte key, or 64 hex digits. Repeat it for every
    /// key of a rotation (or separate them with commas in
    /// IDEMPOTENCY_RAW_KEYS). Never the key itself: a command line is
    /// visible to every user of the machine.
    #[arg(
        long = "raw-key",
        value_name = "ID=FILE",
        env = "IDEMPOTENCY_RAW_KEYS",
        value_delimiter = ','
    )]
    raw_keys: Vec<String>,
    /// The context the engine seals under (`Encryption::new`'s second
    /// argument): a response sealed under another does not open.
    #[arg(long, env = "IDEMPOTENCY_ENCRYPTION_CONTEXT")]
    encryption_context: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Shows the record of a key: what a client retrying it gets back.
    Inspect(KeyArgs),
    /// Deletes the record of a key, so that the next request with it runs.
    /// Keeps a record in progress unless --force.
    Forget {
        #[command(flatten)]
        key: KeyArgs,
        /// Delete it even if it is IN_PROGRESS (its operation may be
        /// running: if so, its completion will be refused).
        #[arg(long)]
        force: bool,
    },
    /// Lists records in progress: live claims, and stuck ones whose lease
    /// passed.
    List {
        /// Only records in progress (the only listing there is).
        #[arg(long, required = true)]
        in_progress: bool,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Finds abandoned claims (IN_PROGRESS, their lease passed, nobody took
    /// them over) and reports them, releases them or closes them as failed
    /// (the completer). Every write is a takeover, fenced as a retry's is:
    /// a claim a retry takes over meanwhile is left to it.
    Abandoned {
        /// Only claims whose lease ended at least this long ago: 90s, 15m,
        /// 2h, 1d (a bare number is seconds).
        #[arg(long, default_value = "15m", value_parser = parse_duration)]
        older_than: std::time::Duration,
        /// report: list them, write nothing. release: delete each (the
        /// next request with its key runs as a first attempt); a record
        /// holding steps is kept, lapsed, for the retry to resume. fail:
        /// complete each with the HTTP layer's `idempotency-abandoned`
        /// answer (a 500 problem+json every retry gets; nothing runs again).
        #[arg(long, default_value = "report", value_parser = ["report", "release", "fail"])]
        policy: String,
        /// At most this many claims handled.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Records a store call reads at most (DynamoDB: items a Scan
        /// evaluates; Redis: SCAN's COUNT).
        #[arg(long, default_value_t = 100)]
        page_size: usize,
        /// The prefix of the answer's problem `type`
        /// (IdempotencyLayer::problem_type_base).
        #[arg(long, default_value = lambda_idempotency::http::DEFAULT_PROBLEM_BASE)]
        problem_type_base: String,
    },
    /// How many records the store holds, by its own count or estimate
    /// (never a scan), every prefix's: what the table-size gauge reports.
    /// DynamoDB's count is refreshed by AWS about every six hours,
    /// PostgreSQL's as of the table's last VACUUM or ANALYZE.
    Stats,
    /// Prints the scope the HTTP layer derives for a request.
    Scope {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Deletes expired records, in batches: for PostgreSQL, which has no
    /// TTL (DynamoDB and Redis delete them themselves).
    PurgeExpired {
        /// Rows per DELETE.
        #[arg(long, default_value_t = 1000)]
        batch: u32,
    },
    /// PostgreSQL's partitioned layout: makes today's partition and the
    /// next days', and detaches and drops each day whose records are all
    /// past the dedup and audit windows. Schedule it (daily or more often).
    MaintainPartitions,
    /// PostgreSQL's partitioned layout: each partition, its end, size,
    /// estimated rows and dead tuples.
    Partitions,
    /// Every record PostgreSQL keeps for a key, newest first: in the
    /// partitioned layout, the record and those it replaced, responses
    /// included, until the audit window drops them (for support).
    History(KeyArgs),
}

impl ScopeArgs {
    /// The scope given, or derived from the event as the HTTP layer does.
    fn resolve(&self) -> Result<String, String> {
        if let Some(scope) = &self.scope {
            return Ok(scope.clone());
        }
        let Some(path) = &self.event else {
            return Err("give --scope or --event".into());
        };
        let text = if path.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).map_err(|e| format!("stdin: {e}"))?
        } else {
            std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
        };
        // lambda_http panics on some malformed events; an operator's typo
        // gets a message, not a backtrace.
        let parsed = std::panic::catch_unwind(|| lambda_http::request::from_str(&text));
        match parsed {
            Ok(Ok(request)) => Ok(default_scope(&request)),
            Ok(Err(error)) => Err(format!(
                "{}: not an API Gateway, ALB or Function URL event ({error})",
                path.display()
            )),
            Err(_) => Err(format!(
                "{}: an event lambda_http cannot read",
                path.display()
            )),
        }
    }
}

#[derive(Args)]
#[group(required = true, multiple = false, id = "where")]
struct ScopeArgs {
    /// The scope the key lives in, as the adapter derives it (for the HTTP
    /// layer: `http::default_scope`, from the authorizer and the route).
    #[arg(long, group = "where")]
    scope: Option<String>,
    /// An API Gateway, ALB or Function URL event of the request (a file,
    /// `-` for stdin): its scope is derived as the HTTP layer derives it.
    #[arg(long, group = "where")]
    event: Option<PathBuf>,
}

#[derive(Args)]
struct KeyArgs {
    #[command(flatten)]
    scope: ScopeArgs,
    /// The idempotency key, as the client sent it.
    #[arg(long)]
    key: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("lambda-idempotency: {message}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: &Cli) -> Result<ExitCode, String> {
    if let Command::Scope { scope } = &cli.command {
        let scope = scope.resolve()?;
        print(cli.json, json!({ "scope": scope }), || scope.clone());
        return Ok(ExitCode::SUCCESS);
    }
    let url = match (&cli.store, &cli.table) {
        // IDEMPOTENCY_TABLE beside IDEMPOTENCY_STORE_URL in a function's
        // environment is its DynamoDB table, unused with another store.
        (Some(url), _) if !url.starts_with("dynamodb://") => url.clone(),
        (Some(url), None) => url.clone(),
        (Some(url), Some(table)) => {
            if url.strip_prefix("dynamodb://") != Some(table.as_str()) {
                return Err(format!(
                    "--store {url} and --table {table} name two DynamoDB tables: give one"
                ));
            }
            url.clone()
        }
        (None, Some(table)) => format!("dynamodb://{table}"),
        (None, None) => {
            return Err(
                "name the store: --store <url> (dynamodb://<table>, postgres://…, \
                        redis://…) or --table <DynamoDB table>"
                    .into(),
            )
        }
    };
    if let Some(table) = url.strip_prefix("dynamodb://") {
        if table.is_empty() {
            return Err("--store dynamodb:// needs a table: dynamodb://<table>".into());
        }
        if matches!(cli.command, Command::PurgeExpired { .. }) {
            return Err(
                "DynamoDB deletes expired records itself (TTL on `expiration`); \
                        purge-expired is for PostgreSQL"
                    .into(),
            );
        }
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), table)
            .attribute_names(AttributeNames::default().id(&cli.key_attr));
        let store = match &cli.sort_key_attr {
            None => store,
            Some(sort_key) => store.single_table(match &cli.static_pk_value {
                Some(value) => SingleTable::new(value, sort_key),
                None => match std::env::var("AWS_LAMBDA_FUNCTION_NAME") {
                    Ok(function) if !function.is_empty() => {
                        SingleTable::for_function(&function, sort_key)
                    }
                    _ => {
                        return Err("--sort-key-attr needs the records' partition value: \
                                    --static-pk-value 'idempotency#<function>' (or \
                                    AWS_LAMBDA_FUNCTION_NAME for Powertools' default)"
                            .into())
                    }
                },
            }),
        };
        // A layout that is not the table's would answer "no record".
        store.check_key_schema().await.map_err(|e| e.to_string())?;
        return operate(cli, store).await;
    }
    open_other(cli, &url).await
}

/// A store other than DynamoDB, where this build has it.
async fn open_other(cli: &Cli, url: &str) -> Result<ExitCode, String> {
    let store = store_url::open(url, &cli.postgres_table, false)
        .await
        .map_err(|error| error.to_string())?;
    match store {
        #[cfg(feature = "postgres")]
        store_url::OtherStore::Postgres(store) => {
            let store = if cli.postgres_partitioned {
                use lambda_idempotency::store::postgres::Partitioning;
                store.partitioned(
                    Partitioning::daily()
                        .audit_window(std::time::Duration::from_secs(
                            cli.audit_window_days.saturating_mul(86_400),
                        ))
                        .premake_days(cli.premake_days),
                )
            } else {
                store
            };
            if let Some(code) = partitions::run(cli, &store).await? {
                return Ok(code);
            }
            if let Command::PurgeExpired { batch } = &cli.command {
                use lambda_idempotency::{Clock, SystemClock};
                let now_s = SystemClock.now_ms() / 1000;
                let purged = store
                    .purge_expired(now_s, *batch)
                    .await
                    .map_err(|error| error.to_string())?;
                print(cli.json, json!({ "purged": purged }), || {
                    format!("purged {purged} expired records from {}", store.table())
                });
                return Ok(ExitCode::SUCCESS);
            }
            operate(cli, store).await
        }
        #[cfg(feature = "redis")]
        store_url::OtherStore::Redis(store) => {
            if matches!(cli.command, Command::PurgeExpired { .. }) {
                return Err("Redis deletes expired records itself (PEXPIREAT); \
                            purge-expired is for PostgreSQL"
                    .into());
            }
            let store = store.namespace(&cli.redis_namespace);
            let store = if cli.redis_owns_database {
                store.owns_database()
            } else {
                store
            };
            operate(cli, store).await
        }
    }
}

/// inspect, forget and list, on any store.
async fn operate<St: Store>(cli: &Cli, store: St) -> Result<ExitCode, String> {
    let keys = Keys::from_args(&cli.raw_keys, cli.encryption_context.as_deref())?;
    let engine = Engine::builder(store)
        .key_prefix(cli.prefix.clone().unwrap_or_else(default_key_prefix))
        .build();
    let failed = |error: StoreError| error.to_string();
    match &cli.command {
        Command::Scope { .. } => Ok(ExitCode::SUCCESS),
        Command::Inspect(key) => {
            let scope = key.scope.resolve()?;
            let record = engine.inspect(&scope, &key.key).await.map_err(failed)?;
            let id = engine.record_id(&scope, &key.key);
            match record {
                Some(record) => {
                    let opened = match &keys {
                        Some(keys) => keys.open(&record).await,
                        None => None,
                    };
                    let now_ms = engine.now_ms();
                    let mut described = describe(&record, now_ms);
                    if let (Some(opened), Some(response)) = (&opened, described.get_mut("response"))
                    {
                        opened.add_to(response);
                    }
                    print(cli.json, described, || {
                        let mut line = text(&record, now_ms);
                        if let Some(opened) = &opened {
                            line.push_str(&opened.text());
                        }
                        line
                    });
                    // A record whose response does not open is there, and
                    // is never replayed: its own exit code, for scripts.
                    Ok(match opened {
                        Some(Opened::Failed { .. }) => ExitCode::from(3),
                        _ => ExitCode::SUCCESS,
                    })
                }
                None => {
                    print(
                        cli.json,
                        json!({ "id": id.as_str(), "record": null }),
                        || format!("no record for {id} (never claimed, forgotten, or expired)"),
                    );
                    Ok(ExitCode::from(1))
                }
            }
        }
        Command::Forget { key, force } => {
            let scope = key.scope.resolve()?;
            let forgotten = if *force {
                engine.forget_even_in_progress(&scope, &key.key).await
            } else {
                engine.forget(&scope, &key.key).await
            }
            .map_err(failed)?;
            let id = engine.record_id(&scope, &key.key);
            let (result, code, line) = match &forgotten {
                Forgotten::Removed => ("removed", 0, format!("removed {id}: the next request with the key runs")),
                Forgotten::Absent => ("absent", 1, format!("no record for {id}")),
                Forgotten::InProgress(_) => (
                    "in_progress",
                    1,
                    format!("{id} is IN_PROGRESS: kept (its operation may be running); --force deletes it"),
                ),
                _ => ("unknown", 1, format!("{id}: {forgotten:?}")),
            };
            print(
                cli.json,
                json!({ "id": id.as_str(), "result": result }),
                || line.clone(),
            );
            Ok(ExitCode::from(code))
        }
        Command::List { limit, .. } => {
            let records = engine.list_in_progress(*limit).await.map_err(failed)?;
            let now_ms = engine.now_ms();
            let values: Vec<Value> = records.iter().map(|r| describe(r, now_ms)).collect();
            print(cli.json, Value::Array(values), || {
                if records.is_empty() {
                    return "no record in progress".to_owned();
                }
                records
                    .iter()
                    .map(|r| text(r, now_ms))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(ExitCode::SUCCESS)
        }
        Command::Abandoned {
            older_than,
            policy,
            limit,
            page_size,
            problem_type_base,
        } => {
            let policy = match policy.as_str() {
                "release" => AbandonedPolicy::Release,
                "fail" => AbandonedPolicy::Fail {
                    answer: lambda_idempotency::http::abandoned_answer(problem_type_base)
                        .map_err(|error| error.to_string())?,
                },
                _ => AbandonedPolicy::Report,
            };
            let completer = Completer::new(policy)
                .older_than(*older_than)
                .limit(*limit)
                .page_size(*page_size);
            let report = engine
                .complete_abandoned(&completer)
                .await
                .map_err(failed)?;
            let now_ms = engine.now_ms();
            print(
                cli.json,
                completer_json(&report, &completer, now_ms),
                || completer_text(&report, &completer, now_ms),
            );
            Ok(if report.count("error") > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Stats => {
            let size = engine.sample_table_size().await.map_err(failed)?;
            let Some(size) = size else {
                print(cli.json, json!({ "records": null }), || {
                    "this store keeps no count of its records that is cheap to read (Redis: \
                     give --redis-owns-database when the database holds the records alone)"
                        .to_owned()
                });
                return Ok(ExitCode::from(1));
            };
            print(cli.json, table_size_json(&size), || table_size_text(&size));
            Ok(ExitCode::SUCCESS)
        }
        Command::PurgeExpired { .. } => Err("purge-expired is for PostgreSQL".into()),
        Command::MaintainPartitions | Command::Partitions | Command::History(_) => {
            Err("maintain-partitions, partitions and history are for PostgreSQL".into())
        }
    }
}

/// The keys and context that open sealed responses, from `--raw-key` and
/// `--encryption-context`.
struct Keys {
    encryption: Encryption,
    ids: Vec<String>,
}

impl Keys {
    /// `None` without `--raw-key`.
    fn from_args(raw_keys: &[String], context: Option<&str>) -> Result<Option<Self>, String> {
        if raw_keys.is_empty() {
            return Ok(None);
        }
        let Some(context) = context else {
            return Err(
                "--raw-key needs --encryption-context: the context the engine seals \
                        under (Encryption::new's second argument)"
                    .into(),
            );
        };
        let mut keys: Option<RawKeys> = None;
        let mut ids = Vec::new();
        for raw_key in raw_keys {
            let (id, path) = raw_key.split_once('=').ok_or_else(|| {
                format!("--raw-key {raw_key}: give <key id>=<file> (the file holds the key)")
            })?;
            let key = read_key(std::path::Path::new(path))?;
            keys = Some(
                match keys {
                    None => RawKeys::new(id, &key),
                    Some(keys) => keys.with_key(id, &key),
                }
                .map_err(|error| format!("--raw-key {id}: {error}"))?,
            );
            ids.push(id.to_owned());
        }
        let keys = keys.expect("at least one key");
        Ok(Some(Self {
            encryption: Encryption::new(keys, context).open_only(),
            ids,
        }))
    }

    /// The record's response opened, when it is sealed; `None` for a
    /// record without a sealed response.
    async fn open(&self, record: &Record) -> Option<Opened> {
        let key_id = encryption::key_id_of(record.response.as_deref()?)?.to_owned();
        Some(match self.encryption.open_response(record).await {
            Ok(Some(plaintext)) => Opened::Open(plaintext),
            Ok(None) => return None,
            Err(error) => {
                let reason = if error.kind() == StoreErrorKind::Unavailable {
                    "unavailable"
                } else if !self.ids.contains(&key_id) {
                    "unknown_key"
                } else {
                    "unauthentic"
                };
                Opened::Failed {
                    reason,
                    key_id,
                    message: error.to_string(),
                }
            }
        })
    }
}

/// A 32-byte key from `path`: the bytes themselves, or 64 hex digits.
fn read_key(path: &std::path::Path) -> Result<[u8; KEY_LEN], String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Ok(key) = <[u8; KEY_LEN]>::try_from(bytes.as_slice()) {
        return Ok(key);
    }
    let text = std::str::from_utf8(&bytes).unwrap_or_default().trim();
    let digits: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect();
    digits
        .and_then(|key| <[u8; KEY_LEN]>::try_from(key.as_slice()).ok())
        .ok_or_else(|| {
            format!(
                "{}: a key file holds the {KEY_LEN}-byte key, or {} hex digits",
                path.display(),
                KEY_LEN * 2
            )
        })
}

/// What opening a sealed response gave.
enum Opened {
    /// Its plaintext: what a retry gets back.
    Open(Vec<u8>),
    /// Why it does not open: such a record is never replayed.
    Failed {
        reason: &'static str,
        key_id: String,
        message: String,
    },
}

impl Opened {
    /// Adds what opening gave to `response`, the record's `response` value.
    fn add_to(&self, response: &mut Value) {
        let Some(response) = response.as_object_mut() else {
            return;
        };
        match self {
            Opened::Open(plaintext) => {
                response.insert("opened".into(), stored_response(plaintext));
            }
            Opened::Failed {
                reason,
                key_id,
                message,
            } => {
                response.insert(
                    "not_opened".into(),
                    json!({ "reason": reason, "key_id": key_id, "message": message }),
                );
            }
        }
    }

    fn text(&self) -> String {
        match self {
            Opened::Open(plaintext) => format!(", opened: {}", stored_response(plaintext)),
            Opened::Failed {
                reason,
                key_id,
                message,
            } => {
                let why = match *reason {
                    "unknown_key" => format!("no --raw-key is named {key_id}"),
                    "unavailable" => "its key cannot be had for now".to_owned(),
                    _ => "it fails authentication: changed in the store, copied from another \
                          record or table, sealed under another --encryption-context, or \
                          under another key of this id"
                        .to_owned(),
                };
                format!(
                    "\nDOES NOT OPEN ({reason}): {why}. The engine refuses it (never replayed, \
                     never run again); `forget` deletes it so that the key runs again.\n({message})"
                )
            }
        }
    }
}

/// A duration as an operator writes it: `90s`, `15m`, `2h`, `1d`, or
/// seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, "s"),
    };
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: give 90s, 15m, 2h or 1d")),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: give 90s, 15m, 2h or 1d"))?;
    Ok(std::time::Duration::from_secs(
        number.saturating_mul(seconds),
    ))
}

/// What the completer found and did, as one JSON object.
fn completer_json(report: &CompleterReport, completer: &Completer, now_ms: u64) -> Value {
    let claims: Vec<Value> = report
        .settled
        .iter()
        .map(|settled| {
            let mut claim = describe(&settled.record, now_ms);
            claim["steps"] = json!(settled.steps);
            claim["settlement"] = json!(settled.settlement.as_str());
            match &settled.settlement {
                Settlement::Error(error) => claim["error"] = json!(error.to_string()),
                Settlement::Lost(Some(found)) => claim["found"] = describe(found, now_ms),
                _ => {}
            }
            claim
        })
        .collect();
    let mut counts = serde_json::Map::new();
    for settlement in SETTLEMENTS {
        counts.insert(settlement.into(), json!(report.count(settlement)));
    }
    json!({
        "policy": completer.policy().as_str(),
        "found": report.settled.len(),
        "counts": counts,
        "walked_all": report.walked_all,
        "pages": report.pages,
        "claims": claims,
    })
}

/// Every settlement's name, for the counts.
const SETTLEMENTS: [&str; 6] = [
    "reported",
    "released",
    "kept_for_steps",
    "failed",
    "lost",
    "error",
];

fn completer_text(report: &CompleterReport, completer: &Completer, now_ms: u64) -> String {
    let mut lines: Vec<String> = report
        .settled
        .iter()
        .map(|settled| {
            let mut line = format!(
                "{}: {}",
                settled.settlement.as_str(),
                text(&settled.record, now_ms)
            );
            if !settled.steps.is_empty() {
                line.push_str(&format!(", steps: {}", settled.steps.join(", ")));
            }
            if let Settlement::Error(error) = &settled.settlement {
                line.push_str(&format!(", error: {error}"));
            }
            line
        })
        .collect();
    let counts: Vec<String> = SETTLEMENTS
        .iter()
        .filter(|settlement| report.count(settlement) > 0)
        .map(|settlement| format!("{} {settlement}", report.count(settlement)))
        .collect();
    lines.push(format!(
        "{} abandoned claims found ({}), policy {}{}",
        report.settled.len(),
        if counts.is_empty() {
            "none".to_owned()
        } else {
            counts.join(", ")
        },
        completer.policy().as_str(),
        if report.walked_all {
            ""
        } else {
            "; stopped at --limit: run again for more"
        }
    ));
    lines.join("\n")
}

fn table_size_json(size: &TableSize) -> Value {
    json!({
        "records": size.records,
        "in_progress": size.in_progress,
        "bytes": size.bytes,
        "accuracy": size.accuracy.as_str(),
        "source": size.source.as_str(),
    })
}

/// `12 records, 3 in progress, 4096 bytes (exact, memory)`; `about` before
/// an estimate.
fn table_size_text(size: &TableSize) -> String {
    let about = if size.accuracy == Accuracy::Estimated {
        "about "
    } else {
        ""
    };
    let mut line = format!("{about}{} records", size.records);
    if let Some(in_progress) = size.in_progress {
        line.push_str(&format!(", {in_progress} in progress"));
    }
    if let Some(bytes) = size.bytes {
        line.push_str(&format!(", {bytes} bytes"));
    }
    line.push_str(&format!(
        " ({}, {})",
        size.accuracy.as_str(),
        size.source.as_str()
    ));
    line
}

fn print(as_json: bool, value: Value, line: impl FnOnce() -> String) {
    if as_json {
        println!("{value}");
    } else {
        println!("{}", line());
    }
}

/// Where a record stands at `now_ms`, in words an operator acts on.
fn state(record: &Record, now_ms: u64) -> &'static str {
    if record.is_expired(now_ms) {
        "expired"
    } else if record.is_lapsed(now_ms) {
        "stuck"
    } else if record.status == lambda_idempotency::store::Status::InProgress {
        "in_progress"
    } else {
        "completed"
    }
}

fn describe(record: &Record, now_ms: u64) -> Value {
    json!({
        "id": record.id.as_str(),
        "status": record.status.as_str(),
        "state": state(record, now_ms),
        "attempt": record.attempt,
        "created_at_ms": record.created_at_ms,
        "first_started_at_ms": record.first_started_ms,
        "completed_at_ms": record.completed_at_ms,
        "lease_until_ms": record.lease_until_ms,
        "expiration_s": record.expiration_s,
        "fingerprint": record.fingerprint.as_str(),
        "response_bytes": record.response.as_ref().map(Vec::len),
        "response": record.response.as_deref().map(stored_response),
    })
}

/// What a retry gets back: the response as the HTTP layer stored it, or a
/// value stored as JSON by the engine, or (another codec) its size; or,
/// sealed by the engine's encryption, the key it names and its size (opened
/// by `inspect` when given the keys; a record that fails to open is
/// forgotten as any other).
fn stored_response(bytes: &[u8]) -> Value {
    if let Some(key_id) = lambda_idempotency::encryption::key_id_of(bytes) {
        return json!({ "sealed": { "key_id": key_id, "bytes": bytes.len() } });
    }
    if let Ok(response) = decode_stored_response(bytes) {
        let headers: serde_json::Map<String, Value> = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.to_string(),
                    Value::String(String::from_utf8_lossy(value.as_bytes()).into_owned()),
                )
            })
            .collect();
        let body = match response.body() {
            Body::Empty => Value::Null,
            Body::Text(text) => Value::String(text.clone()),
            Body::Binary(bytes) => Value::String(format!("<{} bytes of binary>", bytes.len())),
            _ => Value::String("<a body this tool cannot show>".into()),
        };
        let mut http =
            json!({ "status": response.status().as_u16(), "headers": headers, "body": body });
        if let Some(not_stored) = response.extensions().get::<BodyNotStored>() {
            http["body_not_stored"] =
                json!({ "why": not_stored.why, "digest": not_stored.repr_digest() });
        }
        // The trace of the work that made it, when the layer kept it.
        if let Some(trace) = response.extensions().get::<TraceContext>() {
            http["trace"] = Value::String(trace.to_string());
        }
        return json!({ "http": http });
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => json!({ "json": value }),
        Err(_) => json!({ "bytes": bytes.len() }),
    }
}

fn text(record: &Record, now_ms: u64) -> String {
    let mut line = format!(
        "{} {} ({}), attempt {}",
        record.id,
        record.status,
        state(record, now_ms),
        record.attempt
    );
    if let Some(lease) = record.lease_until_ms {
        let left = i128::from(lease) - i128::from(now_ms);
        line.push_str(&format!(
            ", lease {} ms {}",
            left.abs(),
            if left >= 0 { "left" } else { "ago" }
        ));
    }
    if let Some(response) = &record.response {
        line.push_str(&format!(", response: {}", stored_response(response)));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_idempotency::{
        encryption::{Encryption, RawKeys},
        store::RecordId,
        Fingerprint,
    };

    #[test]
    fn a_sealed_response_shows_its_key_id_and_size_only() {
        let encryption = Encryption::new(RawKeys::new("2026-11", &[1; 32]).unwrap(), "test");
        let sealed = futures_ready(encryption.seal_response(
            &RecordId::from_stored("p#1"),
            &Fingerprint::from_stored("f"),
            1,
            br#"{"card":"4242"}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            stored_response(&sealed),
            json!({ "sealed": { "key_id": "2026-11", "bytes": sealed.len() } })
        );
        assert_eq!(
            stored_response(br#"{"card":"4242"}"#),
            json!({ "json": { "card": "4242" } })
        );
    }

    /// A record the HTTP layer wrote with the trace of its work (frame
    /// version 3, written here byte by byte): the trace is shown.
    #[test]
    fn a_response_kept_with_its_trace_shows_it() {
        let traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut frame = vec![3, 0b0100];
        frame.extend_from_slice(&201u16.to_be_bytes());
        frame.extend_from_slice(&0u32.to_be_bytes()); // headers
        frame.extend_from_slice(&0u32.to_be_bytes()); // trailers
        frame.extend_from_slice(&(traceparent.len() as u32).to_be_bytes());
        frame.extend_from_slice(traceparent);
        frame.extend_from_slice(br#"{"id":"ch_1"}"#);
        let shown = stored_response(&frame);
        assert_eq!(shown["http"]["status"], 201);
        assert_eq!(shown["http"]["body"], r#"{"id":"ch_1"}"#);
        assert_eq!(
            shown["http"]["trace"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    fn futures_ready<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }
}
