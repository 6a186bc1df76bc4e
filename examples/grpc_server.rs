//! A gRPC server (tonic) made idempotent: `Server::builder().layer(..)`
//! with the idempotency layer, the key in the `idempotency-key` metadata.
//!
//! ```text
//! cargo run --example grpc_server --features tonic
//! grpcurl -plaintext -H 'idempotency-key: 8e03978e' -d '{"amount": 1250}' \
//!     127.0.0.1:50051 charges.Charges/Create   # needs the .proto below
//! ```
//!
//! The message and the service are written by hand as tonic-build would
//! generate them from
//!
//! ```proto
//! syntax = "proto3";
//! package charges;
//! message CreateCharge { int64 amount = 1; }
//! message Charge { string id = 1; int64 amount = 2; }
//! service Charges { rpc Create(CreateCharge) returns (Charge); }
//! ```
//!
//! so that the example builds without protoc; a real service uses
//! tonic-build and puts the layer on the server the same way.

use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
use std::{convert::Infallible, time::Duration};
use tonic::{
    body::Body,
    codegen::{http, BoxFuture, Context, Poll, Service},
    server::{Grpc, NamedService, UnaryService},
    transport::Server,
    Request, Response, Status,
};
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateCharge {
    #[prost(int64, tag = "1")]
    pub amount: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Charge {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int64, tag = "2")]
    pub amount: i64,
}

/// The business logic: runs at most once per key.
async fn create(request: CreateCharge) -> Result<Response<Charge>, Status> {
    if request.amount <= 0 {
        // INVALID_ARGUMENT is stored and replayed: the answer to that message.
        return Err(Status::invalid_argument("amount must be positive"));
    }
    // UNAVAILABLE, INTERNAL and the other transient codes are not stored:
    // a retry with the same key runs again.
    Ok(Response::new(Charge {
        id: format!("ch_{}", request.amount),
        amount: request.amount,
    }))
}

#[derive(Clone)]
struct ChargesServer;

impl NamedService for ChargesServer {
    const NAME: &'static str = "charges.Charges";
}

struct Create;

impl UnaryService<CreateCharge> for Create {
    type Response = Charge;
    type Future = BoxFuture<Response<Charge>, Status>;

    fn call(&mut self, request: Request<CreateCharge>) -> Self::Future {
        Box::pin(create(request.into_inner()))
    }
}

impl Service<http::Request<Body>> for ChargesServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        Box::pin(async move {
            match request.uri().path() {
                "/charges.Charges/Create" => {
                    let mut grpc = Grpc::new(ProstCodec::<Charge, CreateCharge>::default());
                    Ok(grpc.unary(Create, request).await)
                }
                _ => Ok(Status::unimplemented("no such method").into_http()),
            }
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // A DynamoDbStore, RedisStore or PostgresStore in a real service.
    let engine = Engine::builder(MemoryStore::new()).build();
    // Every gRPC call is a POST: calls without a key pass through (reads),
    // calls with one are idempotent. There is no Lambda authorizer here:
    // name the caller from your authentication (`caller`), or declare a
    // single-tenant service.
    let layer = IdempotencyLayer::new(engine)
        .require_key(false)
        .shared_scope();
    let in_flight = layer.in_flight();
    let addr = std::env::var("GRPC_ADDR").unwrap_or_else(|_| "127.0.0.1:50051".into());
    println!("gRPC on {addr}");
    Server::builder()
        .layer(layer)
        .add_service(ChargesServer)
        .serve_with_shutdown(addr.parse()?, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Calls that claimed their key finish and record their result.
    let _all_done = in_flight.wait(Duration::from_secs(25)).await;
    Ok(())
}
