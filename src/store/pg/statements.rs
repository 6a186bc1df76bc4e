//! Every SQL statement the store sends, built once per table name.

/// The record's columns, in the order every query returns them.
pub(crate) const COLUMNS: &str =
    "id, status, owner, fingerprint, expiration_s, lease_until_ms, response, \
     created_at_ms, completed_at_ms, attempt, first_started_ms";

/// Every statement, with the table name in it, built once.
pub(crate) struct Statements {
    pub(crate) claim: String,
    pub(crate) take_over: String,
    pub(crate) extend: String,
    pub(crate) complete: String,
    pub(crate) fenced_complete: String,
    pub(crate) release: String,
    pub(crate) commit: String,
    pub(crate) remove_any: String,
    pub(crate) remove_unless_in_progress: String,
    pub(crate) get: String,
    pub(crate) list_in_progress: String,
    pub(crate) purge: String,
    /// A step's fenced write: `$1` id, `$2` owner, `$3` name, `$4`
    /// output, `$5` how many steps the record holds before it (and, in the
    /// partitioned layout, `$6` the writer's now in milliseconds).
    pub(crate) step: String,
    /// The steps of the `IN_PROGRESS` record `$1` not expired at `$2`
    /// (epoch seconds), in order: `name` and `output` (bytea) each.
    pub(crate) steps: String,
}

/// A step as the `steps` column keeps it: an element of a `jsonb` array,
/// its output base64 (one line: PostgreSQL's `encode` breaks lines every
/// 76 characters). `$3` is the name, `$4` the output.
pub(crate) const STEP_ELEMENT: &str = "jsonb_build_array(jsonb_build_object('name', $3::text, \
     'output', translate(encode($4::bytea, 'base64'), chr(10), '')))";

/// The steps of the record `r` in order, as rows of `name` and `output`;
/// none when the column is NULL.
pub(crate) const STEP_ROWS: &str = "SELECT s.step ->> 'name' AS name, \
     decode(s.step ->> 'output', 'base64') AS output";

/// How many steps the record `r` holds (a NULL column: none).
pub(crate) const STEP_COUNT: &str = "coalesce(jsonb_array_length(r.steps), 0)";

/// The name of the answered write's common table expression: it hides a
/// table of the same name inside the statement, so no table may have it.
pub(crate) const WRITE_CTE: &str = "lambda_idempotency_write";

/// Wraps a conditional write so that one round trip answers it: whether it
/// applied, and else the record as the statement found it.
pub(crate) fn answered(write: &str, table: &str) -> String {
    format!(
        "WITH {WRITE_CTE} AS ({write} RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM {WRITE_CTE}) AS applied, {r} \
         FROM (SELECT 1) one LEFT JOIN {table} r ON r.id = $1",
        r = COLUMNS
            .split(", ")
            .map(|column| format!("r.{column}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl Statements {
    pub(crate) fn new(t: &str) -> Self {
        let fence = "id = $1 AND status = 'IN_PROGRESS' AND owner = $2";
        let claim_values = "($1, 'IN_PROGRESS', $2, $3, $4, $5, NULL, $6, NULL, $7, $8)";
        let replace = "status = excluded.status, owner = excluded.owner, \
             fingerprint = excluded.fingerprint, expiration_s = excluded.expiration_s, \
             lease_until_ms = excluded.lease_until_ms, response = excluded.response, \
             created_at_ms = excluded.created_at_ms, completed_at_ms = excluded.completed_at_ms, \
             attempt = excluded.attempt, first_started_ms = excluded.first_started_ms, \
             steps = NULL";
        Self {
            claim: answered(
                &format!(
                    "INSERT INTO {t} AS r ({COLUMNS}) VALUES {claim_values} \
                     ON CONFLICT (id) DO UPDATE SET {replace} WHERE r.expiration_s < $9"
                ),
                t,
            ),
            take_over: answered(
                &format!(
                    "UPDATE {t} SET owner = $3, fingerprint = $4, expiration_s = $5, \
                     lease_until_ms = $6, created_at_ms = $7, attempt = $8, first_started_ms = $9 \
                     WHERE id = $1 AND status = 'IN_PROGRESS' AND owner = $2 AND lease_until_ms < $10"
                ),
                t,
            ),
            extend: answered(
                &format!("UPDATE {t} SET lease_until_ms = $3, expiration_s = $4 WHERE {fence}"),
                t,
            ),
            complete: answered(&Self::completion(t, fence), t),
            fenced_complete: format!("{} RETURNING 1", Self::completion(t, fence)),
            release: answered(&format!("DELETE FROM {t} WHERE {fence}"), t),
            commit: format!(
                "INSERT INTO {t} AS r ({COLUMNS}) \
                 VALUES ($1, 'COMPLETED', $2, $3, $4, NULL, $5, $6, $6, 1, $6) \
                 ON CONFLICT (id) DO UPDATE SET {replace} \
                 WHERE r.expiration_s < $7 \
                    OR (r.status = 'IN_PROGRESS' AND r.lease_until_ms < $6 AND r.response IS NULL) \
                 RETURNING 1"
            ),
            remove_any: answered(&format!("DELETE FROM {t} WHERE id = $1"), t),
            remove_unless_in_progress: answered(
                &format!("DELETE FROM {t} WHERE id = $1 AND status <> 'IN_PROGRESS'"),
                t,
            ),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1"),
            list_in_progress: format!(
                "SELECT {COLUMNS} FROM {t} WHERE status = 'IN_PROGRESS' AND starts_with(id, $1) \
                 ORDER BY id LIMIT $2"
            ),
            // Batches of rows nobody else is deleting: safe to run from
            // several schedulers at once.
            purge: format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE expiration_s < $1 \
                 LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
            step: answered(
                &format!(
                    "UPDATE {t} r SET steps = coalesce(r.steps, '[]'::jsonb) || {STEP_ELEMENT} \
                     WHERE {fence} AND {STEP_COUNT} = $5"
                ),
                t,
            ),
            steps: format!(
                "{STEP_ROWS} FROM {t} r \
                 CROSS JOIN LATERAL jsonb_array_elements(r.steps) WITH ORDINALITY AS s(step, n) \
                 WHERE r.id = $1 AND r.status = 'IN_PROGRESS' AND r.expiration_s >= $2 \
                 ORDER BY s.n"
            ),
        }
    }

    fn completion(t: &str, fence: &str) -> String {
        format!(
            "UPDATE {t} SET status = 'COMPLETED', response = $3, expiration_s = $4, \
             completed_at_ms = $5, lease_until_ms = NULL, steps = NULL WHERE {fence}"
        )
    }
}
