//! What the Lambda event says of a request, through `lambda_http`'s
//! request extensions: the caller (the authorizer's identity), the entry
//! point and the route, the invocation's deadline, the path and query as
//! the event carries them. `no_lambda_context.rs` answers the same
//! questions, with nothing, when the `lambda` feature is off.
//!
//! The caller is the most specific identity the context holds (see the
//! table in the [module docs](super#who-the-caller-is)): a Cognito identity
//! id rather than the role every identity-pool user shares, and an
//! authenticated request is never anonymous.

use http::Request;
use lambda_http::{
    aws_lambda_events::{
        apigw::{
            ApiGatewayProxyRequestContext, ApiGatewayRequestAuthorizer,
            ApiGatewayRequestAuthorizerIamDescription, ApiGatewayV2httpRequestContext,
        },
        query_map::QueryMap,
    },
    request::RequestContext,
    RequestExt,
};
use serde_json::{Map, Value};
use std::{
    collections::HashMap,
    panic::{catch_unwind, AssertUnwindSafe},
};

/// Claims that change with every token of the same caller: left out when a
/// token without `sub`, `client_id` or `azp` is identified by its claims, so
/// a retry with a refreshed token is the same caller.
const PER_TOKEN_CLAIMS: [&str; 5] = ["exp", "iat", "nbf", "jti", "auth_time"];

/// What API Gateway adds to a Lambda authorizer's context on every request.
const PER_REQUEST_FIELDS: [&str; 1] = ["integrationLatency"];

/// Whether `request` came from a Lambda event (it has a request context).
pub(crate) fn has_context<B>(request: &Request<B>) -> bool {
    request.request_context_ref().is_some()
}

/// Whether the entry point serves a Lambda response without `statusCode`
/// as 200 JSON (API Gateway's payload format 2.0: HTTP APIs, Function
/// URLs) rather than refusing it (format 1.0, REST APIs, ALB).
#[cfg_attr(not(feature = "powertools"), allow(dead_code))]
pub(crate) fn infers_plain_responses<B>(request: &Request<B>) -> bool {
    matches!(
        request.request_context_ref(),
        Some(RequestContext::ApiGatewayV2(_)) | None
    )
}

/// The invocation's own X-Ray trace header (`Root`, `Parent`: the
/// function's segment, `Sampled`), which `lambda_http` puts in the
/// request's Lambda context.
pub(crate) fn xray_trace_id<B>(request: &Request<B>) -> Option<&str> {
    request
        .lambda_context_ref()
        .and_then(|context| context.xray_trace_id.as_deref())
}

/// The invocation's deadline, in epoch milliseconds; none when the
/// context's cannot be one (`invocation_deadline_ms`).
pub(crate) fn deadline_ms<B>(request: &Request<B>) -> Option<u64> {
    request
        .lambda_context_ref()
        .and_then(|context| crate::clock::invocation_deadline_ms(context.deadline))
}

/// The path as the event carries it; empty for a request built by hand.
pub(crate) fn raw_path<B>(request: &Request<B>) -> &str {
    request.raw_http_path()
}

/// The query parameters `lambda_http` read from the event, `None` for a
/// request that did not come from one: sorted by name, the values of a
/// repeated name in their order (for ALB events sorted too).
pub(crate) fn event_query_pairs<B>(request: &Request<B>) -> Option<Vec<(String, String)>> {
    let context = request.request_context_ref()?;
    let Some(map) = request.query_string_parameters_ref() else {
        return Some(Vec::new());
    };
    Some(sorted_pairs(map, matches!(context, RequestContext::Alb(_))))
}

/// The event's `queryStringParameters` as the integration wrote them, for
/// the Powertools view: a REST API (and ALB) keeps the last value of a
/// repeated name, an HTTP API (and a Function URL) joins its values with
/// commas, in their order; `null` when there are none (a REST API writes
/// `null`, an HTTP API leaves the field out) or the request came from no
/// event. The values are `lambda_http`'s: those of
/// `multiValueQueryStringParameters` (REST), of `rawQueryString` decoded
/// as a form (HTTP API), percent-decoded (ALB, which delivers them as sent).
#[cfg_attr(not(feature = "powertools"), allow(dead_code))]
pub(crate) fn event_query_parameters<B>(request: &Request<B>) -> Value {
    let (Some(context), Some(map)) = (
        request.request_context_ref(),
        request.query_string_parameters_ref(),
    ) else {
        return Value::Null;
    };
    let joined = matches!(context, RequestContext::ApiGatewayV2(_));
    // As `sorted_pairs`: a map built by hand may panic on iteration.
    let names = catch_unwind(AssertUnwindSafe(|| {
        map.iter()
            .map(|(name, _)| name.to_owned())
            .collect::<Vec<_>>()
    }))
    .unwrap_or_default();
    let mut parameters = Map::new();
    for name in names {
        if parameters.contains_key(&name) {
            continue;
        }
        let values = map.all(&name).unwrap_or_default();
        let value = if joined {
            Some(values.join(","))
        } else {
            values.last().map(|last| (*last).to_owned())
        };
        if let Some(value) = value {
            parameters.insert(name, Value::String(value));
        }
    }
    if parameters.is_empty() {
        return Value::Null;
    }
    Value::Object(parameters)
}

fn sorted_pairs(map: &QueryMap, alb: bool) -> Vec<(String, String)> {
    // `QueryMap::iter` panics on a name without values, which no event
    // yields (lambda_http has iterated such a map already) but a map built
    // by hand could: such a query counts as none rather than a panic.
    let pairs = catch_unwind(AssertUnwindSafe(|| {
        map.iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect::<Vec<_>>()
    }));
    let mut pairs = pairs.unwrap_or_default();
    if alb {
        // lambda_http decodes an ALB query by joining its parameters in a
        // hash map's order and splitting the result again, so a name or
        // value holding a literal `&` or `=` (which ALB itself would have
        // percent-encoded) comes out in an order of the moment: sort the
        // values too.
        pairs.sort();
    } else {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
    }
    pairs
}

/// The authenticated caller of `request`, or `None` when its context holds
/// no caller identity (no authorizer, an ALB, a Function URL with auth type
/// `NONE`).
///
/// The value is a JSON array naming the kind of identity and its
/// identifying fields, for example `["jwt","https://issuer","user-1"]` or
/// `["cognito_identity","eu-west-1:pool","eu-west-1:id"]`: unambiguous, so
/// no identity of one kind can be made to read as another. Which fields
/// make it, for every integration and authorizer, is the table in the
/// [module docs](super#who-the-caller-is).
pub fn principal<B>(request: &Request<B>) -> Option<String> {
    match request.request_context_ref()? {
        RequestContext::ApiGatewayV1(context) => rest_api_principal(context),
        RequestContext::ApiGatewayV2(context) => http_api_principal(context),
        _ => None,
    }
}

pub(crate) fn entry_point<B>(request: &Request<B>) -> Option<String> {
    let (api, stage) = match request.request_context_ref()? {
        RequestContext::ApiGatewayV1(context) => (&context.apiid, &context.stage),
        RequestContext::ApiGatewayV2(context) => (&context.apiid, &context.stage),
        RequestContext::Alb(context) => return context.elb.target_group_arn.clone(),
        _ => return None,
    };
    Some(tagged(
        "api",
        &[
            non_empty(api).unwrap_or_default(),
            non_empty(stage).unwrap_or_default(),
        ],
    ))
}

pub(crate) fn lambda_route<B>(request: &Request<B>) -> Option<String> {
    match request.request_context_ref()? {
        RequestContext::ApiGatewayV2(context) => context
            .route_key
            .clone()
            .filter(|route| route != "$default"),
        RequestContext::ApiGatewayV1(context) => context
            .resource_path
            .as_ref()
            .map(|resource| format!("{} {resource}", context.http_method)),
        _ => None,
    }
}

/// REST API (v1): the authorizer's claims or context first, then the
/// caller's IAM identity (a Cognito identity before the role it assumed),
/// then the API key.
fn rest_api_principal(context: &ApiGatewayProxyRequestContext) -> Option<String> {
    if let Some(principal) = authorizer_fields_principal(&context.authorizer.fields) {
        return Some(principal);
    }
    let identity = &context.identity;
    if let Some(id) = non_empty(&identity.cognito_identity_id) {
        let pool = non_empty(&identity.cognito_identity_pool_id).unwrap_or_default();
        return Some(tagged("cognito_identity", &[pool, id]));
    }
    if let Some(arn) = non_empty(&identity.user_arn) {
        return Some(tagged("iam", &[arn]));
    }
    if let Some(user) = non_empty(&identity.user).or(non_empty(&identity.caller)) {
        return Some(tagged("iam_user", &[user]));
    }
    // The key's id, never the key itself (a secret).
    non_empty(&identity.api_key_id).map(|id| tagged("api_key", &[id]))
}

/// HTTP API (v2) and Function URLs: the JWT authorizer's claims, the IAM
/// identity (a Cognito identity before the role it assumed), or the Lambda
/// authorizer's context.
fn http_api_principal(context: &ApiGatewayV2httpRequestContext) -> Option<String> {
    let authorizer: &ApiGatewayRequestAuthorizer = context.authorizer.as_ref()?;
    if let Some(jwt) = &authorizer.jwt {
        let claims: Map<String, Value> = jwt
            .claims
            .iter()
            .map(|(name, value)| (name.clone(), Value::String(value.clone())))
            .collect();
        return Some(claims_principal(&claims));
    }
    if let Some(iam) = &authorizer.iam {
        return Some(iam_principal(iam));
    }
    authorizer_fields_principal(&authorizer.fields)
}

fn iam_principal(iam: &ApiGatewayRequestAuthorizerIamDescription) -> String {
    if let Some(cognito) = &iam.cognito_identity {
        if let Some(id) = non_empty(&cognito.identity_id) {
            let pool = non_empty(&cognito.identity_pool_id).unwrap_or_default();
            return tagged("cognito_identity", &[pool, id]);
        }
    }
    if let Some(arn) = non_empty(&iam.user_arn) {
        return tagged("iam", &[arn]);
    }
    if let Some(user) = non_empty(&iam.user_id).or(non_empty(&iam.caller_id)) {
        return tagged("iam_user", &[user]);
    }
    // Authenticated, but with nothing that names the caller: everything
    // the context says, so such callers are at least not anonymous.
    let context = serde_json::to_value(iam).unwrap_or_default();
    tagged("iam_context", &[&canonical_text(&context)])
}

/// A REST API authorizer's fields (a Cognito user pool's `claims`, or a
/// Lambda authorizer's `principalId` and context), or an HTTP API Lambda
/// authorizer's context.
fn authorizer_fields_principal(fields: &HashMap<String, Value>) -> Option<String> {
    if let Some(claims) = fields.get("claims").and_then(Value::as_object) {
        return Some(claims_principal(claims));
    }
    let context: Map<String, Value> = fields
        .iter()
        .filter(|(name, _)| !PER_REQUEST_FIELDS.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    if context.is_empty() {
        return None;
    }
    // The whole context, not only `principalId`: authorizers that return a
    // fixed principalId and put the user in the context are common, and
    // their callers must not share a scope.
    Some(tagged(
        "lambda",
        &[&canonical_text(&Value::Object(context))],
    ))
}

/// A JWT's caller: `iss` and `sub`; without `sub` (client-credentials
/// tokens of many identity providers), `iss` and `client_id` (or `azp`);
/// without either, every claim but the per-token ones.
fn claims_principal(claims: &Map<String, Value>) -> String {
    let claim = |name: &str| claims.get(name).map(text).filter(|value| !value.is_empty());
    let issuer = claim("iss").unwrap_or_default();
    if let Some(subject) = claim("sub") {
        return tagged("jwt", &[&issuer, &subject]);
    }
    if let Some(client) = claim("client_id").or_else(|| claim("azp")) {
        return tagged("jwt_client", &[&issuer, &client]);
    }
    let stable: Map<String, Value> = claims
        .iter()
        .filter(|(name, _)| !PER_TOKEN_CLAIMS.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    tagged("jwt_claims", &[&canonical_text(&Value::Object(stable))])
}

/// `["kind", part, …]` as JSON: a principal no other kind or split of parts
/// can spell.
fn tagged(kind: &str, parts: &[&str]) -> String {
    let mut array = Vec::with_capacity(parts.len() + 1);
    array.push(kind);
    array.extend_from_slice(parts);
    // An array of strings always serialises.
    serde_json::to_string(&array).unwrap_or_default()
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => canonical_text(other),
    }
}

fn canonical_text(value: &Value) -> String {
    String::from_utf8_lossy(&crate::fingerprint::canonical_json(value)).into_owned()
}

fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|value| !value.is_empty())
}
