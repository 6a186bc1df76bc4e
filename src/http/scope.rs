//! The scope of a request's key: who is calling, and which operation, from
//! the trusted request context that API Gateway fills in. Never from a
//! header: the client controls those.

use lambda_http::{
    aws_lambda_events::apigw::ApiGatewayRequestAuthorizer, request::RequestContext, Request,
    RequestExt,
};
use serde_json::Value;

/// The scope of requests without an authenticated principal.
pub const ANONYMOUS: &str = "anonymous";

/// The principal and the route of `request`, as one scope string.
///
/// The principal is, by precedence: the JWT authorizer's `sub` (with its
/// `iss`), the Lambda authorizer's `principalId` (or its whole context,
/// canonicalised, when it has none), the IAM principal's ARN, the API key
/// id; or [`ANONYMOUS`] when the request carries no authorizer data. The
/// route is API Gateway's route key (HTTP API) or method and resource
/// (REST API), falling back to the method and path.
pub fn default_scope(request: &Request) -> String {
    let (principal, route) = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) => (
            context
                .authorizer
                .as_ref()
                .and_then(principal_of_authorizer),
            context
                .route_key
                .clone()
                .filter(|route| route != "$default"),
        ),
        Some(RequestContext::ApiGatewayV1(context)) => (
            principal_of_authorizer(&context.authorizer)
                .or_else(|| {
                    context
                        .identity
                        .user_arn
                        .as_ref()
                        .map(|arn| format!("iam:{arn}"))
                })
                .or_else(|| {
                    context
                        .identity
                        .api_key_id
                        .as_ref()
                        .map(|id| format!("api_key:{id}"))
                }),
            context
                .resource_path
                .as_ref()
                .map(|resource| format!("{} {resource}", context.http_method)),
        ),
        _ => (None, None),
    };
    let principal = principal.unwrap_or_else(|| ANONYMOUS.to_owned());
    let route = route.unwrap_or_else(|| format!("{} {}", request.method(), request.uri().path()));
    // Length-prefixed, so no principal can be chosen to look like another
    // principal followed by a route.
    format!("{}:{principal} {route}", principal.len())
}

fn principal_of_authorizer(authorizer: &ApiGatewayRequestAuthorizer) -> Option<String> {
    if let Some(jwt) = &authorizer.jwt {
        if let Some(sub) = jwt.claims.get("sub") {
            let issuer = jwt
                .claims
                .get("iss")
                .map(String::as_str)
                .unwrap_or_default();
            return Some(format!("jwt:{issuer}:{sub}"));
        }
    }
    let fields = &authorizer.fields;
    // REST API Cognito user pool authorizers put the claims here.
    if let Some(claims) = fields.get("claims").and_then(Value::as_object) {
        if let Some(sub) = claims.get("sub").and_then(Value::as_str) {
            let issuer = claims
                .get("iss")
                .and_then(Value::as_str)
                .unwrap_or_default();
            return Some(format!("jwt:{issuer}:{sub}"));
        }
    }
    if let Some(principal) = fields.get("principalId").and_then(Value::as_str) {
        return Some(format!("lambda:{principal}"));
    }
    if let Some(arn) = authorizer
        .iam
        .as_ref()
        .and_then(|iam| iam.user_arn.as_ref())
    {
        return Some(format!("iam:{arn}"));
    }
    // An HTTP API Lambda authorizer's context has no standard principal
    // field: the whole context, in canonical form, stands for it (less the
    // latency API Gateway adds, which changes with every request).
    let context: serde_json::Map<String, Value> = fields
        .iter()
        .filter(|(name, _)| name.as_str() != "integrationLatency")
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    if context.is_empty() {
        return None;
    }
    let canonical = crate::fingerprint::canonical_json(&Value::Object(context));
    Some(format!("lambda:{}", String::from_utf8_lossy(&canonical)))
}
