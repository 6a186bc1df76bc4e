//! The table, for every PostgreSQL store: which names go into
//! statements, its DDL, and how a table found in the database is checked
//! against the store's columns.

use super::statements::WRITE_CTE;

/// The longest bare table name: its index is `<name>_expiration_s`, and
/// PostgreSQL cuts every name at 63 bytes (the index would then take the
/// table's own name, and `IF NOT EXISTS` would skip it in silence).
const MAX_TABLE_NAME: usize = 63 - "_expiration_s".len();

/// PostgreSQL's reserved key words (`pg_get_keywords()`'s categories R
/// and T, PostgreSQL 15 to 17): none of them is a table or schema name
/// without quotes. A test compares the list with the server's.
pub(crate) const RESERVED_WORDS: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "binary",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
];

/// Why `name` is not a table name this store puts into its statements, if
/// it is not one: an identifier, optionally schema-qualified, never
/// anything to quote, and never a reserved word where PostgreSQL's grammar
/// refuses one (the table alone, or the schema: after a dot any word goes).
pub(crate) fn table_name_error(name: &str) -> Option<String> {
    let identifier = |part: &str| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && part.len() <= 63
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 || !parts.iter().all(|part| identifier(part)) {
        return Some(format!(
            "{name:?} is not a table name this store accepts: letters, digits and _, \
             optionally schema.table"
        ));
    }
    let bare = parts[parts.len() - 1].to_ascii_lowercase();
    if bare.len() > MAX_TABLE_NAME {
        return Some(format!(
            "{name:?} is not a table name this store accepts: at most {MAX_TABLE_NAME} \
             characters (its index is named <table>_expiration_s, and PostgreSQL cuts names \
             at 63)"
        ));
    }
    if bare == WRITE_CTE {
        return Some(format!(
            "{name:?} is not a table name this store accepts: the store's statements use \
             {WRITE_CTE} for a name of their own"
        ));
    }
    let first = parts[0].to_ascii_lowercase();
    RESERVED_WORDS.contains(&first.as_str()).then(|| {
        format!(
            "{name:?} is not a table name this store accepts: {first:?} is a reserved word in \
             PostgreSQL (every statement would fail as a syntax error); choose another name, or \
             qualify it with a schema (public.{name})"
        )
    })
}

/// The DDL of the module docs for `table`. An index lives in its table's
/// schema and its name cannot be schema-qualified: it takes the table's
/// bare name.
pub(crate) fn table_ddl(table: &str) -> String {
    let bare = table.rsplit('.').next().unwrap_or(table);
    include_str!("table.sql")
        .replace("idempotency_expiration_s", &format!("{bare}_expiration_s"))
        .replace("EXISTS idempotency (", &format!("EXISTS {table} ("))
        .replace("ON idempotency (", &format!("ON {table} ("))
}

/// The DDL's `CREATE TABLE` and the statements after it (the index).
pub(crate) fn split_ddl(ddl: &str) -> (&str, &str) {
    ddl.split_at(ddl.find("CREATE INDEX").unwrap_or(ddl.len()))
}

/// The record's columns and the types `format_type` names them by.
const COLUMN_TYPES: [(&str, &str); 12] = [
    ("id", "text"),
    ("status", "text"),
    ("owner", "text"),
    ("fingerprint", "text"),
    ("expiration_s", "bigint"),
    ("lease_until_ms", "bigint"),
    ("response", "bytea"),
    ("created_at_ms", "bigint"),
    ("completed_at_ms", "bigint"),
    ("attempt", "integer"),
    ("first_started_ms", "bigint"),
    ("steps", "jsonb"),
];

/// The migration that adds `steps` (recovery points) to a table made
/// before it: without a default, PostgreSQL adds a nullable column to the
/// catalog only, rewriting no row (a partitioned table's goes to each
/// partition).
pub(crate) const ADD_STEPS: &str = "ALTER TABLE <table> ADD COLUMN IF NOT EXISTS steps jsonb";

/// How a table's columns (name, type, required without a default) and its
/// `id` index differ from what the store reads and writes.
pub(crate) fn table_differences(
    found: &[(String, String, bool)],
    id_is_unique: bool,
) -> Vec<String> {
    let mut differences = Vec::new();
    for (name, expected) in COLUMN_TYPES {
        match found.iter().find(|(column, _, _)| column == name) {
            None if name == "steps" => differences.push(format!(
                "column `steps` (jsonb) is missing: the table predates recovery points; \
                 `{ADD_STEPS}` adds it (the store's docs, \"Migrations\")"
            )),
            None => differences.push(format!("column `{name}` ({expected}) is missing")),
            Some((_, actual, _)) if actual != expected => {
                differences.push(format!("column `{name}` is {actual}, not {expected}"))
            }
            Some(_) => {}
        }
    }
    for (name, _, required) in found {
        if *required && !COLUMN_TYPES.iter().any(|(column, _)| column == name) {
            differences.push(format!(
                "column `{name}` is NOT NULL without a default: the store's inserts cannot fill it"
            ));
        }
    }
    if !id_is_unique {
        differences.push("`id` is not the primary key (nor unique on its own)".to_owned());
    }
    differences
}

/// The columns of `$1` (a table name): name, type as `format_type` names
/// it, and whether inserts must fill it (`NOT NULL` without a default).
pub(crate) const COLUMNS_QUERY: &str =
    "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
            a.attnotnull AND NOT a.atthasdef \
     FROM pg_attribute a \
     WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped";

/// Whether `$1`'s `id` is unique on its own (the primary key, or a unique
/// index without a predicate).
pub(crate) const ID_IS_UNIQUE_QUERY: &str = "SELECT EXISTS (SELECT 1 FROM pg_index i \
       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
       WHERE i.indrelid = to_regclass($1) AND i.indisunique \
         AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = 'id')";

/// The error for a table of another shape than the store's.
pub(crate) fn shape_error(table: &str, differences: &[String]) -> Option<crate::StoreError> {
    (!differences.is_empty()).then(|| {
        crate::StoreError::new(
            crate::StoreErrorKind::Misconfigured,
            format!(
                "PostgreSQL table {table} exists with another shape than the store's (see the DDL \
                 in the postgres store's docs): {}",
                differences.join("; ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ddl_names_the_table_and_a_bare_index() {
        assert_eq!(table_ddl("idempotency"), include_str!("table.sql"));
        let ddl = table_ddl("app.records");
        assert!(
            ddl.contains("CREATE TABLE IF NOT EXISTS app.records ("),
            "{ddl}"
        );
        assert!(
            ddl.contains("CREATE INDEX IF NOT EXISTS records_expiration_s ON app.records ("),
            "{ddl}"
        );
        assert!(!ddl.contains("idempotency"), "{ddl}");
        let (table, index) = split_ddl(&ddl);
        assert!(
            table.starts_with("CREATE TABLE") && !table.contains("INDEX"),
            "{table}"
        );
        assert!(
            index.starts_with("CREATE INDEX") && !index.contains("TABLE"),
            "{index}"
        );
    }

    #[test]
    fn only_plain_table_names_go_into_statements() {
        for good in [
            "idempotency",
            "app.idempotency",
            "_t1",
            "Records",
            "public.order",
            "orders",
            "app.select",
            "w",
            &"x".repeat(50),
        ] {
            assert_eq!(table_name_error(good), None, "{good}");
        }
        for reserved in ["order", "SELECT", "group", "user", "select.t"] {
            let error = table_name_error(reserved).expect(reserved);
            assert!(error.contains("reserved word"), "{error}");
        }
        for bad in [
            "",
            "1t",
            "a.b.c",
            "t;drop",
            "t t",
            "\"t\"",
            "a-b",
            &"x".repeat(64),
            &"x".repeat(51),
            "lambda_idempotency_write",
            "app.LAMBDA_IDEMPOTENCY_WRITE",
        ] {
            assert!(table_name_error(bad).is_some(), "{bad}");
        }
    }
}
