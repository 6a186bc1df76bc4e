//! The PostgreSQL commands of the partitioned layout: `maintain-partitions`,
//! `partitions`, and `history` (which a plain table answers too).

use super::{describe, print, text, Cli, Command};
use lambda_idempotency::{
    default_key_prefix, store::postgres::PostgresStore, Clock, Engine, SystemClock,
};
use serde_json::{json, Value};
use std::process::ExitCode;

/// Runs the command when it is one of these; `None` for the others.
pub(super) async fn run(cli: &Cli, store: &PostgresStore) -> Result<Option<ExitCode>, String> {
    let failed = |error: lambda_idempotency::StoreError| error.to_string();
    let now_s = SystemClock.now_ms() / 1000;
    match &cli.command {
        Command::MaintainPartitions => {
            let cleanup = store.drop_expired_partitions(now_s).await.map_err(failed)?;
            print(
                cli.json,
                json!({
                    "created": cleanup.created,
                    "dropped": cleanup.dropped,
                    "kept_live": cleanup.kept_live,
                }),
                || {
                    format!(
                        "{}: created {:?}, dropped {:?}; kept past the audit window (a record \
                         still live): {:?}",
                        store.table(),
                        cleanup.created,
                        cleanup.dropped,
                        cleanup.kept_live
                    )
                },
            );
            Ok(Some(ExitCode::SUCCESS))
        }
        Command::Partitions => {
            let partitions = store.partitions().await.map_err(failed)?;
            let values: Vec<Value> = partitions
                .iter()
                .map(|p| {
                    json!({
                        "name": p.name,
                        "until_s": p.until_s,
                        "total_bytes": p.total_bytes,
                        "estimated_rows": p.estimated_rows,
                        "dead_tuples": p.dead_tuples,
                    })
                })
                .collect();
            print(cli.json, Value::Array(values), || {
                if partitions.is_empty() {
                    return format!("{}: no partition (a plain table?)", store.table());
                }
                partitions
                    .iter()
                    .map(|p| {
                        format!(
                            "{} until {} s: {} bytes, ~{} rows, {} dead tuples",
                            p.name,
                            p.until_s.map_or("-".to_owned(), |s| s.to_string()),
                            p.total_bytes,
                            p.estimated_rows,
                            p.dead_tuples
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(Some(ExitCode::SUCCESS))
        }
        Command::History(key) => {
            let scope = key.scope.resolve()?;
            let engine = Engine::builder(store.clone())
                .key_prefix(cli.prefix.clone().unwrap_or_else(default_key_prefix))
                .build();
            let id = engine.record_id(&scope, &key.key);
            let records = store.history(&id).await.map_err(failed)?;
            let now_ms = SystemClock.now_ms();
            let values: Vec<Value> = records.iter().map(|r| describe(r, now_ms)).collect();
            print(
                cli.json,
                json!({ "id": id.as_str(), "records": values }),
                || {
                    if records.is_empty() {
                        return format!("no record kept for {id}");
                    }
                    records
                        .iter()
                        .map(|r| text(r, now_ms))
                        .collect::<Vec<_>>()
                        .join("\n")
                },
            );
            Ok(Some(ExitCode::from(u8::from(records.is_empty()))))
        }
        _ => Ok(None),
    }
}
