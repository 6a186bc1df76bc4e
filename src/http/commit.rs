//! [`CommitWith`]: a handler's own writes, committed atomically with the
//! stored response.

/// Writes that the layer commits in one transaction with the completed
/// record, so the business effect and the stored response appear together
/// or not at all. A handler puts it in its response's extensions; for the
/// DynamoDB store the writes are
/// [`TransactWriteItem`]s.
///
/// ```
/// # #[cfg(feature = "dynamodb")] {
/// use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
/// use lambda_http::{Body, Response};
/// use lambda_idempotency::http::CommitWith;
///
/// # fn handler() -> Result<Response<Body>, Box<dyn std::error::Error>> {
/// let put = Put::builder()
///     .table_name("charges")
///     .item("id", AttributeValue::S("ch_1".into()))
///     .condition_expression("attribute_not_exists(id)")
///     .build()?;
/// let mut response = Response::builder().status(201).body(Body::from(r#"{"id":"ch_1"}"#))?;
/// response
///     .extensions_mut()
///     .insert(CommitWith(vec![TransactWriteItem::builder().put(put).build()]));
/// # Ok(response) }
/// # }
/// ```
///
/// With the PostgreSQL store the writes are [`PgWrite`]s, SQL statements
/// with typed parameters, run in the transaction that completes the record:
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use http::Response;
/// use lambda_idempotency::{http::CommitWith, store::postgres::PgWrite};
///
/// # fn handler() -> Result<Response<String>, http::Error> {
/// let insert = PgWrite::new("INSERT INTO charges (id, amount) VALUES ($1, $2)")
///     .bind("ch_1")
///     .bind(1250i64);
/// let mut response = Response::builder().status(201).body(r#"{"id":"ch_1"}"#.to_owned())?;
/// response.extensions_mut().insert(CommitWith(vec![insert]));
/// # Ok(response) }
/// # }
/// ```
///
/// The writes are committed only when the response is stored: a response
/// the outcome policy releases (a 5xx, say) commits nothing. If the
/// transaction fails, the client gets a problem response instead of this
/// one (503 when the store failed, 409 when the lease had passed and
/// another attempt took the key over), never a response whose effect was
/// not committed.
#[cfg_attr(
    feature = "dynamodb",
    doc = "",
    doc = "[`TransactWriteItem`]: aws_sdk_dynamodb::types::TransactWriteItem"
)]
#[cfg_attr(
    not(feature = "dynamodb"),
    doc = "",
    doc = "[`TransactWriteItem`]: https://docs.rs/aws-sdk-dynamodb/latest/aws_sdk_dynamodb/types/struct.TransactWriteItem.html"
)]
#[cfg_attr(
    feature = "postgres",
    doc = "",
    doc = "[`PgWrite`]: crate::store::postgres::PgWrite"
)]
#[cfg_attr(
    not(feature = "postgres"),
    doc = "",
    doc = "[`PgWrite`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/struct.PgWrite.html"
)]
#[derive(Debug, Clone, PartialEq)]
pub struct CommitWith<W>(pub Vec<W>);
