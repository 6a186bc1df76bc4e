//! API Gateway events (REST v1 and HTTP v2, with and without authorizers)
//! through the HTTP layer: scopes from the trusted request context, binary
//! bodies, tenants kept apart.

use lambda_http::{request::from_str, Body, Request, Response};
use lambda_idempotency::{
    http::{default_scope, IdempotencyLayer, REPLAYED_HEADER},
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

#[test]
fn scopes_come_from_the_authorizer_and_the_route() {
    let cases = [
        (V2_TENANT_A, "jwt:https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Example:tenant-a-user POST /v1/charges"),
        (V2_TENANT_B, "jwt:https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Example:tenant-b-user POST /v1/charges"),
        (V2_ANONYMOUS, "anonymous POST /v1/charges"),
        (V2_LAMBDA, r#"lambda:{"plan":"gold","tenantId":"acme"} POST /v1/charges"#),
        (V2_IAM, "iam:arn:aws:iam::123456789012:user/alice POST /v1/charges"),
        (V1_COGNITO, "jwt:https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Example:tenant-a-user POST /v1/charges"),
        (V1_LAMBDA, "lambda:user|acme-42 POST /v1/charges"),
        (V1_API_KEY, "api_key:k3y1d POST /v1/charges"),
        (V1_IAM, "iam:arn:aws:iam::123456789012:user/bob POST /v1/charges"),
        (V1_ANONYMOUS, "anonymous POST /v1/charges"),
    ];
    for (json, expected) in cases {
        let scope = default_scope(&event(json));
        let (length, rest) = scope.split_once(':').expect("length prefix");
        assert_eq!(rest, expected);
        let principal_len = expected.find(" POST").expect("route");
        assert_eq!(length.parse::<usize>().unwrap(), principal_len, "{scope}");
    }
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
