//! The example events that `aws_lambda_events` and `lambda_http` ship in
//! their sources (`tests/data/upstream/`, see its README): shapes nobody
//! here wrote. Each one, parsed again and again, gives one fingerprint; its
//! principal is the documented one, and never anonymous when the event
//! carries an authorizer or a caller identity.

use lambda_http::{request::from_str, Request};
use lambda_idempotency::http::{principal, request_fingerprint};
use serde_json::Value;
use std::{collections::HashSet, panic::catch_unwind};

/// Every upstream request event, with the principal its context names.
macro_rules! upstream {
    ($($dir:literal / $file:literal => $principal:expr,)*) => {
        &[$((
            concat!($dir, "/", $file),
            include_str!(concat!("data/upstream/", $dir, "/", $file)),
            $principal,
        ),)*]
    };
}

const REST_LAMBDA_AUTHORIZER: Option<&str> =
    Some(r#"["lambda","{\"clientId\":1,\"clientName\":\"Exata\",\"principalId\":\"admin\"}"]"#);
const HTTP_LAMBDA_AUTHORIZER: Option<&str> = Some(r#"["lambda","{\"key\":\"value\"}"]"#);
const HTTP_JWT_WITHOUT_SUB: Option<&str> =
    Some(r#"["jwt_claims","{\"claim1\":\"value1\",\"claim2\":\"value2\"}"]"#);

const EVENTS: &[(&str, &str, Option<&str>)] = upstream! {
    "aws_lambda_events" / "example-alb-lambda-target-request-headers-only.json" => None,
    "aws_lambda_events" / "example-alb-lambda-target-request-multivalue-headers.json" => None,
    "aws_lambda_events" / "example-apigw-console-request.json" => None,
    "aws_lambda_events" / "example-apigw-console-test-request.json" =>
        Some(r#"["iam","arn:aws:sts::xxxxx:assumed-role/xxxxx/xxxxx"]"#),
    "aws_lambda_events" / "example-apigw-request-catch-all.json" => REST_LAMBDA_AUTHORIZER,
    "aws_lambda_events" / "example-apigw-request-multi-value-parameters.json" => REST_LAMBDA_AUTHORIZER,
    "aws_lambda_events" / "example-apigw-request.json" => REST_LAMBDA_AUTHORIZER,
    "aws_lambda_events" / "example-apigw-restapi-openapi-request.json" => REST_LAMBDA_AUTHORIZER,
    "aws_lambda_events" / "example-apigw-sam-http-request.json" => None,
    "aws_lambda_events" / "example-apigw-sam-rest-request.json" => None,
    "aws_lambda_events" / "example-apigw-v2-request-iam.json" => Some(
        r#"["cognito_identity","us-east-1:4f291106-8703-466b-8f2b-3ecee1ca56ce","us-east-1:3f291106-8703-466b-8f2b-3ecee1ca56ce"]"#,
    ),
    "aws_lambda_events" / "example-apigw-v2-request-jwt-authorizer.json" => HTTP_JWT_WITHOUT_SUB,
    "aws_lambda_events" / "example-apigw-v2-request-lambda-authorizer.json" => HTTP_LAMBDA_AUTHORIZER,
    "aws_lambda_events" / "example-apigw-v2-request-multi-value-parameters.json" => HTTP_LAMBDA_AUTHORIZER,
    "aws_lambda_events" / "example-apigw-v2-request-no-authorizer.json" => None,
    "lambda_http" / "alb_health_check.json" => None,
    "lambda_http" / "alb_multi_value_request.json" => None,
    "lambda_http" / "alb_multi_value_request_encoded_query_parameters.json" => None,
    "lambda_http" / "alb_no_host.json" => None,
    "lambda_http" / "alb_request.json" => None,
    "lambda_http" / "alb_request_encoded_query_parameters.json" => None,
    "lambda_http" / "apigw_multi_value_proxy_request.json" => None,
    "lambda_http" / "apigw_no_host.json" => None,
    "lambda_http" / "apigw_proxy_request.json" => None,
    "lambda_http" / "apigw_request_path_with_space.json" => HTTP_JWT_WITHOUT_SUB,
    "lambda_http" / "apigw_v2_proxy_request.json" => HTTP_JWT_WITHOUT_SUB,
    "lambda_http" / "apigw_v2_proxy_request_minimal.json" => None,
    "lambda_http" / "apigw_v2_proxy_request_with_stage_in_path.json" => HTTP_JWT_WITHOUT_SUB,
    "lambda_http" / "apigw_v2_sam_local.json" => None,
    "lambda_http" / "lambda_function_url_request.json" => None,
};

/// `lambda_http` 1.3 itself panics converting this event: its `Host` header
/// (`1234567890.execute-api.{dns_suffix}`) is no valid URI authority. The
/// panic happens before any layer runs; it is listed so that a fixed
/// `lambda_http` shows up here.
const LAMBDA_HTTP_REJECTS: &[&str] = &["aws_lambda_events/example-apigw-console-request.json"];

fn parse(json: &str) -> Option<Request> {
    catch_unwind(|| from_str(json)).ok()?.ok()
}

/// Every event that parses, with its name, text, principal and request;
/// only the known `lambda_http` rejections may fail to parse.
fn parsed_events(
) -> impl Iterator<Item = (&'static str, &'static str, Option<&'static str>, Request)> {
    EVENTS
        .iter()
        .filter_map(|&(name, json, principal)| match parse(json) {
            Some(request) => Some((name, json, principal, request)),
            None => {
                assert!(LAMBDA_HTTP_REJECTS.contains(&name), "{name} does not parse");
                None
            }
        })
}

#[test]
fn every_upstream_request_event_is_listed() {
    let listed: HashSet<&str> = EVENTS.iter().map(|(name, ..)| *name).collect();
    for dir in ["aws_lambda_events", "lambda_http"] {
        let path = format!("{}/tests/data/upstream/{dir}", env!("CARGO_MANIFEST_DIR"));
        for entry in std::fs::read_dir(path).unwrap() {
            let file = entry.unwrap().file_name().into_string().unwrap();
            if file.ends_with(".json") {
                let name = format!("{dir}/{file}");
                assert!(listed.contains(name.as_str()), "{name} is not tested");
            }
        }
    }
}

#[test]
fn one_event_gives_one_fingerprint_however_often_it_is_parsed() {
    for (name, json, _, first) in parsed_events() {
        let expected = request_fingerprint(&first);
        for _ in 0..50 {
            let again = parse(json).expect("parsed once");
            assert_eq!(request_fingerprint(&again), expected, "{name}");
        }
    }
}

#[test]
fn each_event_has_its_documented_principal_and_is_never_anonymous_when_authenticated() {
    for (name, json, expected, request) in parsed_events() {
        let found = principal(&request);
        assert_eq!(found.as_deref(), expected, "{name}");
        if carries_a_caller(json) {
            assert!(found.is_some(), "{name}: authenticated but anonymous");
        }
    }
}

/// Whether the raw event names a caller: a non-empty authorizer (beyond the
/// latency API Gateway adds), or a REST API caller identity.
fn carries_a_caller(json: &str) -> bool {
    let event: Value = serde_json::from_str(json).unwrap();
    let context = &event["requestContext"];
    let authorizer = match &context["authorizer"] {
        Value::Object(fields) => fields
            .iter()
            .any(|(name, value)| name != "integrationLatency" && !value.is_null()),
        _ => false,
    };
    let identity = ["userArn", "cognitoIdentityId", "apiKeyId", "user", "caller"]
        .iter()
        .any(|field| {
            context["identity"][field]
                .as_str()
                .is_some_and(|v| !v.is_empty())
        });
    authorizer || identity
}
