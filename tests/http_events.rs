//! API Gateway events (REST v1 and HTTP v2, with and without authorizers)
//! through the HTTP layer: scopes from the trusted request context, binary
//! bodies, tenants kept apart.

use lambda_http::{request::from_str, Body, Request, Response};
use lambda_idempotency::{
    http::{default_scope, principal, request_fingerprint, IdempotencyLayer, REPLAYED_HEADER},
    Engine, MemoryStore,
};
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};
use tower::{Layer, ServiceExt};

fn event(json: &str) -> Request {
    from_str(json).expect("a valid API Gateway event")
}

const V2_TENANT_A: &str = include_str!("data/apigw_v2_jwt_tenant_a.json");
const V2_TENANT_B: &str = include_str!("data/apigw_v2_jwt_tenant_b.json");
const V2_ANONYMOUS: &str = include_str!("data/apigw_v2_no_authorizer.json");
const V2_LAMBDA: &str = include_str!("data/apigw_v2_lambda_authorizer.json");
const V2_IAM: &str = include_str!("data/apigw_v2_iam.json");
const V2_BINARY: &str = include_str!("data/apigw_v2_binary.json");
const V1_COGNITO: &str = include_str!("data/apigw_v1_cognito.json");
const V1_LAMBDA: &str = include_str!("data/apigw_v1_lambda_authorizer.json");
const V1_API_KEY: &str = include_str!("data/apigw_v1_api_key.json");
const V1_IAM: &str = include_str!("data/apigw_v1_iam.json");
const V1_ANONYMOUS: &str = include_str!("data/apigw_v1_no_authorizer.json");

const V1_ASSUMED_ROLE: &str = include_str!("data/apigw_v1_assumed_role.json");
const V1_IDENTITY_POOL_USER_1: &str = include_str!("data/apigw_v1_cognito_identity_user_1.json");
const V1_IDENTITY_POOL_USER_2: &str = include_str!("data/apigw_v1_cognito_identity_user_2.json");
const V2_ASSUMED_ROLE: &str = include_str!("data/apigw_v2_assumed_role.json");
const V2_IDENTITY_POOL_USER_1: &str = include_str!("data/apigw_v2_cognito_identity_user_1.json");
const V2_IDENTITY_POOL_USER_2: &str = include_str!("data/apigw_v2_cognito_identity_user_2.json");
const V2_CLIENT_A: &str = include_str!("data/apigw_v2_jwt_client_credentials_a.json");
const V2_CLIENT_B: &str = include_str!("data/apigw_v2_jwt_client_credentials_b.json");
const V2_CLIENT_A_AZP: &str = include_str!("data/apigw_v2_jwt_azp.json");
const V2_CLAIMS_ONLY_1: &str = include_str!("data/apigw_v2_jwt_claims_only_1.json");
const V2_CLAIMS_ONLY_2: &str = include_str!("data/apigw_v2_jwt_claims_only_2.json");
const V2_CLAIMS_ONLY_3: &str = include_str!("data/apigw_v2_jwt_claims_only_3.json");
const FUNCTION_URL_IAM: &str = include_str!("data/function_url_iam.json");
const FUNCTION_URL_NONE: &str =
    include_str!("data/upstream/lambda_http/lambda_function_url_request.json");
const ALB: &str = include_str!("data/upstream/lambda_http/alb_request.json");

const COGNITO_ISSUER: &str = "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Example";
const IDENTITY_POOL: &str = "eu-west-1:99999999-9999-4999-8999-999999999999";
const IDENTITY_1: &str = "eu-west-1:11111111-1111-4111-8111-111111111111";
const IDENTITY_2: &str = "eu-west-1:22222222-2222-4222-8222-222222222222";
const OAUTH_ISSUER: &str = "https://auth.example.com/oauth2/default";

fn tagged(parts: &[&str]) -> Option<String> {
    Some(serde_json::to_string(parts).unwrap())
}

/// The table of the `http` module docs and the README, row by row: for each
/// integration and authorizer kind, the fields that make the principal.
#[test]
fn the_principal_of_every_integration_and_authorizer_kind() {
    let rows: Vec<(&str, &str, Option<String>)> = vec![
        ("REST, none", V1_ANONYMOUS, None),
        (
            "REST, Cognito user pool",
            V1_COGNITO,
            tagged(&["jwt", COGNITO_ISSUER, "tenant-a-user"]),
        ),
        (
            "REST, Lambda authorizer",
            V1_LAMBDA,
            tagged(&[
                "lambda",
                r#"{"principalId":"user|acme-42","tenantId":"acme"}"#,
            ]),
        ),
        (
            "REST, IAM user",
            V1_IAM,
            tagged(&["iam", "arn:aws:iam::123456789012:user/bob"]),
        ),
        (
            "REST, IAM assumed role",
            V1_ASSUMED_ROLE,
            tagged(&[
                "iam",
                "arn:aws:sts::123456789012:assumed-role/OrdersRole/worker-7",
            ]),
        ),
        (
            "REST, Cognito identity pool",
            V1_IDENTITY_POOL_USER_1,
            tagged(&["cognito_identity", IDENTITY_POOL, IDENTITY_1]),
        ),
        ("REST, API key", V1_API_KEY, tagged(&["api_key", "k3y1d"])),
        ("HTTP, none", V2_ANONYMOUS, None),
        (
            "HTTP, JWT",
            V2_TENANT_A,
            tagged(&["jwt", COGNITO_ISSUER, "tenant-a-user"]),
        ),
        (
            "HTTP, JWT without sub",
            V2_CLIENT_A,
            tagged(&["jwt_client", OAUTH_ISSUER, "7d1a2client-a"]),
        ),
        (
            "HTTP, JWT with azp",
            V2_CLIENT_A_AZP,
            tagged(&["jwt_client", OAUTH_ISSUER, "7d1a2client-a"]),
        ),
        (
            "HTTP, JWT without sub, client_id or azp",
            V2_CLAIMS_ONLY_1,
            tagged(&[
                "jwt_claims",
                r#"{"aud":"charges-api","iss":"https://auth.example.com","tenant":"acme"}"#,
            ]),
        ),
        (
            "HTTP, Lambda authorizer",
            V2_LAMBDA,
            tagged(&["lambda", r#"{"plan":"gold","tenantId":"acme"}"#]),
        ),
        (
            "HTTP, IAM user",
            V2_IAM,
            tagged(&["iam", "arn:aws:iam::123456789012:user/alice"]),
        ),
        (
            "HTTP, IAM assumed role",
            V2_ASSUMED_ROLE,
            tagged(&[
                "iam",
                "arn:aws:sts::123456789012:assumed-role/OrdersRole/worker-7",
            ]),
        ),
        (
            "HTTP, Cognito identity pool",
            V2_IDENTITY_POOL_USER_2,
            tagged(&["cognito_identity", IDENTITY_POOL, IDENTITY_2]),
        ),
        ("ALB", ALB, None),
        ("Function URL, NONE", FUNCTION_URL_NONE, None),
        (
            "Function URL, AWS_IAM",
            FUNCTION_URL_IAM,
            tagged(&["iam", "arn:aws:iam::123456789012:user/carol"]),
        ),
    ];
    for (row, json, expected) in rows {
        let request = event(json);
        assert_eq!(principal(&request), expected, "{row}");
        let scope = default_scope(&request);
        let (length, rest) = scope.split_once(':').expect("length prefix");
        let expected = expected.unwrap_or_else(|| "anonymous".to_owned());
        assert_eq!(
            length.parse::<usize>().unwrap(),
            expected.len(),
            "{row}: {scope}"
        );
        assert!(rest.starts_with(&format!("{expected} ")), "{row}: {scope}");
    }
}

#[test]
fn routes_complete_the_scope() {
    for (json, route) in [
        (V2_TENANT_A, " POST /v1/charges"),
        (V1_IAM, " POST /v1/charges"),
        (FUNCTION_URL_IAM, " POST /my/path"),
        (ALB, " GET /"),
    ] {
        assert!(default_scope(&event(json)).ends_with(route), "{route}");
    }
}

/// Issue 10, items 1 and 2: identity-pool users share one role ARN, and
/// client-credentials tokens carry no `sub`; each caller keeps its own scope.
#[test]
fn callers_that_share_a_role_or_lack_a_sub_are_told_apart() {
    for (a, b) in [
        (V1_IDENTITY_POOL_USER_1, V1_IDENTITY_POOL_USER_2),
        (V2_IDENTITY_POOL_USER_1, V2_IDENTITY_POOL_USER_2),
        (V2_CLIENT_A, V2_CLIENT_B),
        (V2_CLAIMS_ONLY_1, V2_CLAIMS_ONLY_3),
    ] {
        let (a, b) = (event(a), event(b));
        assert!(principal(&a).is_some() && principal(&b).is_some());
        assert_ne!(default_scope(&a), default_scope(&b));
    }
    // A refreshed token of the same caller (other exp, iat, jti) is the
    // same caller.
    assert_eq!(
        default_scope(&event(V2_CLAIMS_ONLY_1)),
        default_scope(&event(V2_CLAIMS_ONLY_2))
    );
}

#[test]
fn a_client_header_cannot_choose_the_scope() {
    let mut forged = event(V2_ANONYMOUS);
    for (name, value) in [
        ("x-tenant-id", "tenant-a-user"),
        ("authorization", "Bearer forged"),
        ("x-amzn-oidc-identity", "tenant-a-user"),
    ] {
        forged.headers_mut().insert(name, value.parse().unwrap());
    }
    assert_eq!(default_scope(&forged), default_scope(&event(V2_ANONYMOUS)));
    assert_ne!(default_scope(&forged), default_scope(&event(V2_TENANT_A)));
}

/// Answers 201 with a new charge per run (binary bodies echoed), counting runs.
#[derive(Clone, Default)]
struct Charges {
    runs: Arc<AtomicUsize>,
}

impl tower::Service<Request> for Charges {
    type Response = Response<Body>;
    type Error = lambda_http::Error;
    type Future = std::future::Ready<Result<Response<Body>, lambda_http::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let (body, content_type) = match request.body() {
            Body::Binary(bytes) => (Body::Binary(bytes.clone()), "application/octet-stream"),
            _ => (
                Body::Text(format!("{{\"charge\":\"ch_{run}\"}}")),
                "application/json",
            ),
        };
        std::future::ready(
            Response::builder()
                .status(201)
                .header("content-type", content_type)
                .body(body)
                .map_err(Into::into),
        )
    }
}

fn counting_service() -> (Arc<AtomicUsize>, Charges) {
    let service = Charges::default();
    (Arc::clone(&service.runs), service)
}

#[tokio::test]
async fn tenant_a_key_never_collides_with_tenant_b() {
    let (runs, service) = counting_service();
    let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).layer(service);
    let a = service.clone().oneshot(event(V2_TENANT_A)).await.unwrap();
    let b = service.clone().oneshot(event(V2_TENANT_B)).await.unwrap();
    assert!(
        b.headers().get(REPLAYED_HEADER).is_none(),
        "tenant B is not served tenant A's charge"
    );
    assert_ne!(a.body(), b.body());
    let a_again = service.clone().oneshot(event(V2_TENANT_A)).await.unwrap();
    assert_eq!(a_again.headers()[REPLAYED_HEADER], "true");
    assert_eq!(a_again.body(), a.body());
    let anonymous = service.clone().oneshot(event(V2_ANONYMOUS)).await.unwrap();
    assert!(anonymous.headers().get(REPLAYED_HEADER).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // REST v1: two principals with one key, two charges.
    let (runs, service) = counting_service();
    let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).layer(service);
    for json in [V1_COGNITO, V1_LAMBDA, V1_API_KEY, V1_IAM, V1_ANONYMOUS] {
        let response = service.clone().oneshot(event(json)).await.unwrap();
        assert_eq!(response.status(), 201);
        assert!(response.headers().get(REPLAYED_HEADER).is_none());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

/// Issue 10, item 1, through the layer: user B of a Cognito identity pool
/// used to get user A's stored charge as a replay.
#[tokio::test]
async fn identity_pool_users_with_one_key_get_their_own_charges() {
    for (a, b) in [
        (V1_IDENTITY_POOL_USER_1, V1_IDENTITY_POOL_USER_2),
        (V2_IDENTITY_POOL_USER_1, V2_IDENTITY_POOL_USER_2),
        (V2_CLIENT_A, V2_CLIENT_B),
    ] {
        let (runs, service) = counting_service();
        let service =
            IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).layer(service);
        let first = service.clone().oneshot(event(a)).await.unwrap();
        let second = service.clone().oneshot(event(b)).await.unwrap();
        assert_eq!(
            (first.status().as_u16(), second.status().as_u16()),
            (201, 201)
        );
        assert!(second.headers().get(REPLAYED_HEADER).is_none());
        assert_ne!(first.body(), second.body());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn base64_binary_bodies_round_trip_exactly() {
    let request = event(V2_BINARY);
    let expected: Vec<u8> = (0..=255).collect();
    assert_eq!(
        request.body().as_ref(),
        expected.as_slice(),
        "lambda_http decodes the base64 body"
    );
    let (runs, service) = counting_service();
    let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).layer(service);
    let first = service.clone().oneshot(event(V2_BINARY)).await.unwrap();
    let replay = service.clone().oneshot(event(V2_BINARY)).await.unwrap();
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(first.body(), &Body::Binary(expected.clone()));
    assert_eq!(replay.body(), &Body::Binary(expected));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Issue 10, item 5: `lambda_http` rebuilds a REST API query from a hash
/// map, so the same retried event used to fingerprint differently from one
/// parse to the next, and identical retries were answered 422.
#[tokio::test]
async fn identical_rest_api_retries_with_a_query_are_replays() {
    let mut json: serde_json::Value = serde_json::from_str(V1_IAM).unwrap();
    json["multiValueQueryStringParameters"] = serde_json::json!({
        "expand": ["customer", "invoice"], "currency": ["eur"], "capture": ["true"], "source": ["web"]
    });
    json["queryStringParameters"] = serde_json::json!({
        "expand": "invoice", "currency": "eur", "capture": "true", "source": "web"
    });
    let json = json.to_string();
    let (runs, service) = counting_service();
    let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).layer(service);
    let first = service.clone().oneshot(event(&json)).await.unwrap();
    assert_eq!(first.status(), 201);
    for _ in 0..20 {
        let retry = service.clone().oneshot(event(&json)).await.unwrap();
        assert_eq!(retry.status(), 201);
        assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Two stages of one API, or two APIs, invoking one function with the same
/// route, caller and key never share records.
#[test]
fn stages_and_apis_are_part_of_the_scope() {
    let with = |json: &str, field: &str, value: &str| {
        let mut event: serde_json::Value = serde_json::from_str(json).unwrap();
        event["requestContext"][field] = value.into();
        default_scope(&self::event(&event.to_string()))
    };
    for json in [V1_IAM, V2_TENANT_A] {
        let scope = default_scope(&event(json));
        assert_eq!(scope, with(json, "stage", event_stage(json).as_str()));
        assert_ne!(scope, with(json, "stage", "test"), "another stage");
        assert_ne!(scope, with(json, "apiId", "other-api"), "another API");
    }
}

fn event_stage(json: &str) -> String {
    let event: serde_json::Value = serde_json::from_str(json).unwrap();
    event["requestContext"]["stage"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Found by the `http_event` fuzz target: with a `Host` holding `?` or `/`,
/// `lambda_http` builds a URI whose query swallows the path and the first
/// parameter, in the hash map's order of the moment, so one event gave two
/// fingerprints. The fingerprint reads the event's path and parameters, not
/// that URI.
#[test]
fn a_hostile_host_header_does_not_change_the_fingerprint() {
    let mut json: serde_json::Value = serde_json::from_str(V1_IAM).unwrap();
    json["multiValueQueryStringParameters"] =
        serde_json::json!({"name": ["me"], "multiValueName": ["you", "me"], "expand": ["x"]});
    for host in [
        "gy415nuibc.execut?-api.us-east/1.amazonaws.com",
        "h/x",
        "h?y",
    ] {
        json["headers"]["Host"] = host.into();
        json["multiValueHeaders"]["Host"] = serde_json::json!([host]);
        let text = json.to_string();
        let expected = request_fingerprint(&event(&text));
        for _ in 0..50 {
            assert_eq!(request_fingerprint(&event(&text)), expected, "{host}");
        }
    }
}

/// Found by the `http_event` fuzz target: `lambda_http` decodes an ALB query
/// by joining the event's parameters in a hash map's order and splitting the
/// result again, so a literal `&` in a name (which ALB would have encoded)
/// reorders values between parses.
#[test]
fn alb_queries_give_one_fingerprint_whatever_lambda_http_decodes() {
    let json = serde_json::json!({
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/t/1"}},
        "httpMethod": "POST",
        "path": "/v1/charges",
        "queryStringParameters": {"": "first", "x&": "second", "x=": "third", "a": "1"},
        "headers": {"idempotency-key": "k"},
        "isBase64Encoded": false
    })
    .to_string();
    let expected = request_fingerprint(&event(&json));
    for _ in 0..50 {
        assert_eq!(request_fingerprint(&event(&json)), expected);
    }
}

/// What `keep_trace_context` keeps in Lambda without the `opentelemetry`
/// feature: the docs say X-Ray's `X-Amzn-Trace-Id`. The events Lambda
/// delivers carry it with `Root` only (API Gateway HTTP APIs, Function
/// URLs, ALB: every upstream fixture here), so there is no span in it to
/// point to. The invocation's own trace header, `Lambda-Runtime-Trace-Id`
/// (`Root`, `Parent`: the function's segment, `Sampled`), is in the
/// request's extensions as `lambda_runtime::Context::xray_trace_id`, which
/// `lambda_http` puts there for every event.
#[tokio::test]
async fn in_lambda_the_replay_names_the_invocation_that_ran() {
    use lambda_http::RequestExt;
    let header = lambda_http::http::HeaderName::from_static("idempotency-replay-of");
    let (runs, service) = counting_service();
    let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
        .replay_trace_header(header.clone())
        .layer(service);
    let invocation = |parent: &str| {
        let mut context = lambda_http::Context::default();
        context.xray_trace_id = Some(format!(
            "Root=1-5eb33c07-de25b420912dee103a5db434;Parent={parent};Sampled=1"
        ));
        // The event as Function URLs deliver it: `Root=` only.
        let request = event(FUNCTION_URL_IAM);
        assert_eq!(
            request.headers()["x-amzn-trace-id"],
            "Root=1-5eb33c07-de25b420912dee103a5db434"
        );
        request.with_lambda_context(context)
    };
    service
        .clone()
        .oneshot(invocation("53995c3f42cd8ad8"))
        .await
        .unwrap();
    let replay = service
        .clone()
        .oneshot(invocation("7f2e32a1c4a4a8b1"))
        .await
        .unwrap();
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        replay
            .headers()
            .get(&header)
            .map(|value| value.to_str().unwrap()),
        Some("00-5eb33c07de25b420912dee103a5db434-53995c3f42cd8ad8-01"),
        "the first invocation's segment"
    );
}

/// Each kind of event Lambda delivers, as upstream ships it: none carries
/// an X-Ray header with a `Parent`, which `TraceContext::from_xray` needs.
#[test]
fn upstream_events_carry_xray_roots_without_a_parent() {
    for json in [
        FUNCTION_URL_NONE,
        ALB,
        include_str!("data/upstream/aws_lambda_events/example-apigw-v2-request-no-authorizer.json"),
        include_str!("data/upstream/lambda_http/apigw_v2_proxy_request_minimal.json"),
    ] {
        let request = event(json);
        let value = request.headers()["x-amzn-trace-id"].to_str().unwrap();
        assert!(value.starts_with("Root=1-"), "{value}");
        assert!(!value.contains("Parent="), "{value}");
        assert_eq!(
            lambda_idempotency::http::TraceContext::from_xray(value),
            None
        );
    }
}
