//! [`Idempotency`] (the `Transform` given to `App::wrap`) and
//! [`IdempotencyMiddleware`] (the service it makes): an actix request
//! through the layer's pipeline, its handler called on a local task.

use super::convert::{self, Caller};
use crate::{
    error::BoxError,
    http::{config::Config, pipeline, IdempotencyLayer, InFlight},
    store::Store,
    ClaimHandle, Takeover,
};
use actix_web::{
    body::{BoxBody, MessageBody},
    dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform},
    error::ErrorInternalServerError,
    Error, HttpMessage, HttpRequest,
};
use futures_util::future::{BoxFuture, LocalBoxFuture};
use std::{
    cell::RefCell,
    fmt,
    future::{ready, Ready},
    rc::Rc,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::sync::oneshot;

type CallerFn = Arc<dyn Fn(&ServiceRequest) -> Option<String> + Send + Sync>;

/// actix-web middleware that makes the services it wraps idempotent, with
/// an [`IdempotencyLayer`]'s configuration and semantics: give it to
/// `App::wrap`, `Scope::wrap` or `Resource::wrap`. See the [module
/// docs](super).
pub struct Idempotency<St> {
    config: Arc<Config<St>>,
    caller: Option<CallerFn>,
}

// Not derived: the store need not be `Clone` (the configuration is shared).
impl<St> Clone for Idempotency<St> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
            caller: self.caller.clone(),
        }
    }
}

impl<St: Store> Idempotency<St> {
    /// The middleware with `layer`'s configuration. Outside Lambda, a
    /// request's caller must be named ([`caller`](Self::caller)) or the
    /// callers declared to share records
    /// ([`shared_scope`](Self::shared_scope)); otherwise every idempotent
    /// request is refused (`500`, `idempotency-scope-unset`).
    pub fn new(layer: IdempotencyLayer<St>) -> Self {
        Self {
            config: Arc::new(layer.config),
            caller: None,
        }
    }

    /// Names the caller of a request from what actix knows of it (what an
    /// authentication middleware wrapped outside this one put in its
    /// extensions, a validated token): requests of different callers never
    /// share a record. `None` refuses the request (`500`,
    /// `idempotency-scope-unset`) rather than scope it as anonymous: such a
    /// function most often runs before the middleware that names the
    /// caller: authentication must be the outer one (on the same `App` or
    /// `Scope`, `wrap`ped after this one: actix runs the last `wrap`
    /// first). Never name the caller from a header the client controls.
    pub fn caller(
        mut self,
        caller: impl Fn(&ServiceRequest) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        let layer = IdempotencyLayer {
            config: Config::clone(&self.config),
        };
        let layer = layer.caller(|request| {
            request
                .extensions()
                .get::<Caller>()
                .and_then(|c| c.0.clone())
        });
        self.config = Arc::new(layer.config);
        self.caller = Some(Arc::new(caller));
        self
    }

    /// Declares that all callers share records (a single-tenant service):
    /// [`IdempotencyLayer::shared_scope`].
    pub fn shared_scope(mut self) -> Self {
        let layer = IdempotencyLayer {
            config: Config::clone(&self.config),
        };
        self.config = Arc::new(layer.shared_scope().config);
        self.caller = None;
        self
    }

    /// The work of requests that have claimed their key, which runs to its
    /// end when actix drops the request's future: wait for it at shutdown,
    /// before actix's workers (and the tasks on them) stop
    /// ([`IdempotencyLayer::in_flight`]).
    pub fn in_flight(&self) -> InFlight {
        InFlight::new(&self.config.settings.in_flight)
    }
}

impl<St: fmt::Debug> fmt::Debug for Idempotency<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("engine", &self.config.engine)
            .field("caller", &self.caller.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, B, St> Transform<S, ServiceRequest> for Idempotency<St>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
    St: Store,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Transform = IdempotencyMiddleware<S, St>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(IdempotencyMiddleware {
            service: Rc::new(service),
            config: Arc::clone(&self.config),
            caller: self.caller.clone(),
        }))
    }
}

/// The service an [`Idempotency`] middleware wraps around an actix service.
pub struct IdempotencyMiddleware<S, St> {
    service: Rc<S>,
    config: Arc<Config<St>>,
    caller: Option<CallerFn>,
}

impl<S, St> fmt::Debug for IdempotencyMiddleware<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyMiddleware")
            .finish_non_exhaustive()
    }
}

/// Where actix's request is while the layer has its own copy: here until
/// the handler's task takes it, and back with the handler's response (the
/// router needs it unshared while the handler runs); or the error the
/// service answered with instead of a response.
enum Held {
    Request(HttpRequest),
    Failed(Error),
    Gone,
}

impl<S, B, St> Service<ServiceRequest> for IdempotencyMiddleware<S, St>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
    St: Store,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let caller = self.caller.as_ref().map(|caller| Caller(caller(&request)));
        let template = request.match_pattern();
        let (actix_request, payload) = request.into_parts();
        let converted = convert::request(
            &actix_request,
            convert::request_body(payload),
            caller,
            template,
        );
        let held = Rc::new(RefCell::new(Held::Request(actix_request)));
        let (handler, calls) = oneshot::channel();
        // The handler runs on a task of its own: when the client leaves
        // and this future is dropped, the layer's detached work still gets
        // its response, and completes the record.
        actix_web::rt::spawn(handle::<S, B, St::Write>(
            Rc::clone(&self.service),
            Rc::clone(&held),
            calls,
        ));
        let config = Arc::clone(&self.config);
        Box::pin(async move {
            let converted = converted.map_err(ErrorInternalServerError)?;
            let bridge = Bridge {
                handler: Some(handler),
            };
            let result = pipeline::serve(config, bridge, converted).await;
            match (result, held.replace(Held::Gone)) {
                (_, Held::Failed(error)) => Err(error),
                (Ok(response), Held::Request(request)) => Ok(ServiceResponse::new(
                    request,
                    convert::actix_response(response),
                )),
                (Err(error), _) => Err(ErrorInternalServerError(error)),
                (Ok(_), Held::Gone) => Err(ErrorInternalServerError(
                    "the actix handler's task ended without its request",
                )),
            }
        })
    }
}

/// A call of the handler from the layer: the request, and where its
/// response goes.
type Call = (
    http::Request<convert::Body>,
    oneshot::Sender<http::Response<convert::Body>>,
);

/// The actix service, as the layer's pipeline calls it (a tower service,
/// `Send`): the request goes to the handler's local task, the response
/// comes back. Called at most once.
struct Bridge {
    handler: Option<oneshot::Sender<Call>>,
}

impl tower::Service<http::Request<convert::Body>> for Bridge {
    type Response = http::Response<convert::Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<convert::Body>) -> Self::Future {
        let handler = self.handler.take();
        Box::pin(async move {
            let handler = handler.ok_or("the actix service was called twice for one request")?;
            let (reply, response) = oneshot::channel();
            handler
                .send((request, reply))
                .map_err(|_| "the actix handler's task is gone")?;
            response
                .await
                .map_err(|_| BoxError::from("the actix handler's task ended without a response"))
        })
    }
}

/// The handler's task: waits for the layer to call the handler (it never
/// does for a replay or a refusal), calls it with actix's request (the
/// claim in its extensions), and sends the response back.
async fn handle<S, B, W>(service: Rc<S>, held: Rc<RefCell<Held>>, calls: oneshot::Receiver<Call>)
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
    W: Clone + Send + Sync + 'static,
{
    let Ok((request, reply)) = calls.await else {
        return;
    };
    let Held::Request(actix_request) = held.replace(Held::Gone) else {
        return;
    };
    let (parts, body) = request.into_parts();
    {
        let mut extensions = actix_request.extensions_mut();
        if let Some(claim) = parts.extensions.get::<ClaimHandle>() {
            extensions.insert(claim.clone());
        }
        if let Some(takeover) = parts.extensions.get::<Takeover>() {
            extensions.insert(*takeover);
        }
    }
    let service_request = ServiceRequest::from_parts(actix_request, convert::payload(body));
    let response = match service.call(service_request).await {
        Ok(response) => {
            let (request, response) = response.into_parts();
            *held.borrow_mut() = Held::Request(request);
            response.map_into_boxed_body()
        }
        Err(error) => {
            // The layer decides on the response the error would render
            // (a 5xx: released); the error itself goes to actix.
            let response = error.error_response();
            *held.borrow_mut() = Held::Failed(error);
            response
        }
    };
    let _ = reply.send(convert::response::<W>(response).await);
}
