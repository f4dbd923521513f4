//! The concerns every listener shares, as tower layers: bearer-token auth and load shedding.
//! Each edge pushes them onto its own stack with what is particular to it: the paths that
//! stay open (health), and how a refusal is written (a JSON body, or a gRPC status).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, Request, Response};
use tower::{Layer, Service};

use super::Gateway;
use crate::error::GatewayError;

/// What is particular to an edge: which paths a layer lets through untouched, and how a
/// refusal is written.
pub trait Policy: Clone + Send + Sync + 'static {
    type Body;
    fn exempt(&self, path: &str) -> bool;
    fn deny(&self, gw: &Gateway, path: &str, e: GatewayError) -> Response<Self::Body>;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Refuses a request without a valid bearer token (`[auth]`), before any handler sees it.
#[derive(Clone)]
pub struct AuthLayer<P> {
    gw: Arc<Gateway>,
    policy: P,
}

impl<P> AuthLayer<P> {
    pub fn new(gw: Arc<Gateway>, policy: P) -> Self {
        AuthLayer { gw, policy }
    }
}

impl<S, P: Clone> Layer<S> for AuthLayer<P> {
    type Service = Auth<S, P>;

    fn layer(&self, inner: S) -> Auth<S, P> {
        Auth {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Auth<S, P> {
    inner: S,
    layer: AuthLayer<P>,
}

impl<S, ReqB, B, P> Service<Request<ReqB>> for Auth<S, P>
where
    S: Service<Request<ReqB>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Send + 'static,
    P: Policy<Body = B>,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = futures_util::future::Either<
        std::future::Ready<Result<Response<B>, Infallible>>,
        S::Future,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        use futures_util::future::Either;
        let path = req.uri().path();
        if !self.layer.policy.exempt(path) {
            if let Err(e) = self
                .layer
                .gw
                .authorize(req.headers().get(header::AUTHORIZATION))
            {
                let denied = self.layer.policy.deny(&self.layer.gw, path, e);
                return Either::Left(std::future::ready(Ok(denied)));
            }
        }
        Either::Right(self.inner.call(req))
    }
}

/// Sheds a request at once (never queues it) when the gateway handles its limit of
/// `limits.max_concurrent_requests`; the permit is held until the inner service answers.
#[derive(Clone)]
pub struct ShedLayer<P> {
    gw: Arc<Gateway>,
    policy: P,
}

impl<P> ShedLayer<P> {
    pub fn new(gw: Arc<Gateway>, policy: P) -> Self {
        ShedLayer { gw, policy }
    }
}

impl<S, P: Clone> Layer<S> for ShedLayer<P> {
    type Service = Shed<S, P>;

    fn layer(&self, inner: S) -> Shed<S, P> {
        Shed {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Shed<S, P> {
    inner: S,
    layer: ShedLayer<P>,
}

impl<S, ReqB, B, P> Service<Request<ReqB>> for Shed<S, P>
where
    S: Service<Request<ReqB>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Send + 'static,
    P: Policy<Body = B>,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<B>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let path = req.uri().path();
        if self.layer.policy.exempt(path) {
            return Box::pin(self.inner.call(req));
        }
        match self.layer.gw.admit() {
            Ok(permit) => {
                let answer = self.inner.call(req);
                Box::pin(async move {
                    let r = answer.await;
                    drop(permit);
                    r
                })
            }
            Err(e) => {
                let denied = self.layer.policy.deny(&self.layer.gw, path, e);
                Box::pin(std::future::ready(Ok(denied)))
            }
        }
    }
}
