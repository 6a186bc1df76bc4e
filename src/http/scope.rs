//! The scope of a request's key: who is calling, and which operation, from
//! the trusted request context that API Gateway or Lambda fills in (see
//! `lambda_context`), or from the layer's configuration outside Lambda.
//! Never from a header: the client controls those.

use super::config::ScopeRule;
use super::fingerprint::request_path;
#[cfg(feature = "lambda")]
pub use super::lambda_context::principal;
use super::lambda_context::{self, entry_point, lambda_route};
use bytes::Bytes;
use http::Request;
use std::hash::{Hash, Hasher};

/// The principal of requests without an authenticated caller.
pub const ANONYMOUS: &str = "anonymous";

/// The principal, the entry point and the route of `request`, as one scope
/// string.
///
/// The principal is [`principal`]'s, or [`ANONYMOUS`]. The entry point is
/// the API and its stage (API Gateway, Function URLs) or the target group
/// (ALB), so two stages of one API, or two APIs, on one function never
/// share records. The route is [`route`]'s: API Gateway's route key (HTTP
/// API) or method and resource (REST API), then axum's route template
/// (with the `axum` feature), then the method and path.
///
/// A request without a Lambda request context (axum or hyper outside
/// Lambda, or a request built by hand) has no principal: every caller is
/// [`ANONYMOUS`]. The layer scopes such a request this way only when told
/// that its callers share records
/// ([`IdempotencyLayer::shared_scope`](super::IdempotencyLayer::shared_scope));
/// otherwise it answers it with a `500` that names the fix. Name the caller
/// with [`IdempotencyLayer::caller`](super::IdempotencyLayer::caller).
#[cfg_attr(
    not(feature = "lambda"),
    doc = "",
    doc = "[`principal`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/fn.principal.html"
)]
pub fn default_scope<B>(request: &Request<B>) -> String {
    scope_of(super::lambda_context::principal(request), request)
}

/// The scope of `request` for the caller `principal` (`None`: anonymous):
/// the caller, the entry point and the route, length-prefixed so that no
/// principal or entry point can be chosen to look like another followed by
/// more.
pub(crate) fn scope_of<B>(principal: Option<String>, request: &Request<B>) -> String {
    let principal = principal.as_deref().unwrap_or(ANONYMOUS);
    let entry = entry_point(request);
    let entry = entry.as_deref().unwrap_or_default();
    // Every request computes its scope: one string, written once.
    let mut scope = String::with_capacity(principal.len() + entry.len() + 64);
    // `{len}:{principal} {len}:{entry} `, without the formatting
    // machinery (a few hundred instructions a request).
    let mut digits = itoa::Buffer::new();
    for part in [principal, entry] {
        scope.push_str(digits.format(part.len()));
        scope.push(':');
        scope.push_str(part);
        scope.push(' ');
    }
    write_route(&mut scope, request);
    scope
}

/// The operation `request` asks for, as the application defines its
/// routes: API Gateway's route key (HTTP API, unless it is `$default`), or
/// the method and resource (REST API); with the `axum` feature, the method
/// and axum's route template (`MatchedPath`, the whole template of a nested
/// router: `POST /accounts/{id}/charges`); under actix-web's middleware
/// (`http::actix::Idempotency`, feature `actix`), the method and actix's
/// route template (`match_pattern`); otherwise the method and the path,
/// before axum's `Router::nest` stripped it.
///
/// Two requests to one route template share a scope, and their concrete
/// paths are part of the [fingerprint](super::request_fingerprint): the
/// same key sent to `/accounts/a/charges` and then to `/accounts/b/charges`
/// is answered `422`, never with the other account's response.
pub fn route<B>(request: &Request<B>) -> String {
    let mut route = String::new();
    write_route(&mut route, request);
    route
}

fn write_route<B>(out: &mut String, request: &Request<B>) {
    match route_parts(request) {
        Route::Lambda(route) => out.push_str(&route),
        Route::Method { method, template } => {
            out.push_str(method);
            out.push(' ');
            out.push_str(template);
        }
    }
}

/// A key for `request`'s [`route`], the same for every request to it,
/// without building its text outside Lambda (for the layer's table of
/// durations per route, on every request).
pub(crate) fn route_key<B>(request: &Request<B>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match route_parts(request) {
        Route::Lambda(route) => route.as_str().hash(&mut hasher),
        Route::Method { method, template } => (method, template).hash(&mut hasher),
    }
    hasher.finish()
}

/// The route template of a request from a router that is not axum's
/// (actix-web's `match_pattern`), in the request's extensions.
#[cfg(feature = "actix")]
#[derive(Clone, Debug)]
pub(crate) struct RouteTemplate(pub(crate) String);

/// A route as API Gateway's request context names it, or as the method
/// and the template (or path).
enum Route<'a> {
    Lambda(String),
    Method { method: &'a str, template: &'a str },
}

fn route_parts<B>(request: &Request<B>) -> Route<'_> {
    if let Some(route) = lambda_route(request) {
        return Route::Lambda(route);
    }
    #[cfg(feature = "axum")]
    let template = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| request_path(request), axum::extract::MatchedPath::as_str);
    #[cfg(not(feature = "axum"))]
    let template = request_path(request);
    // actix-web's route template, carried over from its request.
    #[cfg(feature = "actix")]
    let template = request
        .extensions()
        .get::<RouteTemplate>()
        .map_or(template, |route| route.0.as_str());
    Route::Method {
        method: request.method().as_str(),
        template,
    }
}

/// The scope of the request's key, as the layer is configured; `None`
/// (logged as an error) for a request that nothing can name the caller of:
/// outside Lambda, with neither a caller, a scope nor a shared scope, or
/// with a caller function that names no caller for it.
pub(crate) fn scope_for(rule: &ScopeRule, request: &Request<Bytes>) -> Option<String> {
    match rule {
        ScopeRule::Custom(scope) => Some(scope(request)),
        ScopeRule::Caller(caller) => match caller(request) {
            // Tagged, so that no name a function returns spells a Lambda
            // authorizer's principal.
            Some(name) => Some(scope_of(
                Some(serde_json::json!(["caller", name]).to_string()),
                request,
            )),
            // Never the anonymous scope: a caller function that finds no
            // caller most often runs before the middleware that would have
            // named one (the layers in the wrong order), and every caller
            // would then share records.
            None => {
                tracing::error!(
                    method = %request.method(),
                    path = request.uri().path(),
                    "idempotent request refused (500): the caller function given to \
                     IdempotencyLayer::caller (or actix's Idempotency::caller) named no \
                     caller. Is the authentication middleware layered outside the idempotency \
                     layer, so that it runs first? A service that also serves anonymous callers \
                     returns a name for them (Some(\"anonymous\")), and they share records"
                );
                None
            }
        },
        ScopeRule::Shared => Some(default_scope(request)),
        ScopeRule::LambdaContext if lambda_context::has_context(request) => {
            Some(default_scope(request))
        }
        ScopeRule::LambdaContext => {
            tracing::error!(
                method = %request.method(),
                path = request.uri().path(),
                "idempotent request refused (500): it has no Lambda request context to name its \
                 caller, and the layer was given no other way, so two callers that send the same \
                 key would share its record. Name the caller with IdempotencyLayer::caller (from \
                 what your authentication middleware put in the request's extensions), or declare \
                 a single-tenant service with IdempotencyLayer::shared_scope"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scope is part of every record id: its text is pinned, so that a
    /// change in how it is written cannot orphan the records already stored.
    #[test]
    fn a_scope_is_written_as_it_always_was() {
        let request = Request::post("/v1/charges?x=1").body(()).expect("request");
        assert_eq!(scope_of(None, &request), "9:anonymous 0: POST /v1/charges");
        assert_eq!(
            scope_of(Some("tenant-7".to_owned()), &request),
            "8:tenant-7 0: POST /v1/charges"
        );
    }
}
