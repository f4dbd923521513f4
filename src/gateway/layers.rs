//! The concerns every listener shares, as tower layers: bearer-token auth and load shedding,
//! each a `Gate` behind one `GateLayer`.
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
    /// `extensions`: the refused request's, for who sent it.
    fn deny(
        &self,
        gw: &Gateway,
        path: &str,
        extensions: &http::Extensions,
        e: GatewayError,
    ) -> Response<Self::Body>;
}

/// One check a request passes before its handler: what it holds while it is handled (a
/// concurrency permit), or why it is refused.
pub trait Gate: Clone + Send + Sync + 'static {
    type Held: Send + 'static;
    fn pass(&self, gw: &Gateway, headers: &http::HeaderMap) -> Result<Self::Held, GatewayError>;
}

/// Bearer tokens (`[auth]`).
#[derive(Clone, Copy)]
pub struct Tokens;

impl Gate for Tokens {
    type Held = ();
    fn pass(&self, gw: &Gateway, headers: &http::HeaderMap) -> Result<(), GatewayError> {
        gw.authorize(headers.get(header::AUTHORIZATION))
    }
}

/// Load shedding: one of `limits.max_concurrent_requests` permits, held until the inner
/// service answers, or a refusal at once (never a queue).
#[derive(Clone, Copy)]
pub struct Permits;

impl Gate for Permits {
    type Held = tokio::sync::OwnedSemaphorePermit;
    fn pass(&self, gw: &Gateway, _: &http::HeaderMap) -> Result<Self::Held, GatewayError> {
        gw.admit()
    }
}

/// A `Gate` in front of an edge's handlers, with the edge's `Policy`.
#[derive(Clone)]
pub struct GateLayer<G, P> {
    gw: Arc<Gateway>,
    gate: G,
    policy: P,
}

pub type AuthLayer<P> = GateLayer<Tokens, P>;
pub type ShedLayer<P> = GateLayer<Permits, P>;
pub type Auth<S, P> = Gated<S, Tokens, P>;
pub type Shed<S, P> = Gated<S, Permits, P>;

impl<P> GateLayer<Tokens, P> {
    pub fn auth(gw: Arc<Gateway>, policy: P) -> Self {
        GateLayer {
            gw,
            gate: Tokens,
            policy,
        }
    }
}

impl<P> GateLayer<Permits, P> {
    pub fn shed(gw: Arc<Gateway>, policy: P) -> Self {
        GateLayer {
            gw,
            gate: Permits,
            policy,
        }
    }
}

impl<S, G: Clone, P: Clone> Layer<S> for GateLayer<G, P> {
    type Service = Gated<S, G, P>;

    fn layer(&self, inner: S) -> Gated<S, G, P> {
        Gated {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gated<S, G, P> {
    inner: S,
    layer: GateLayer<G, P>,
}

impl<S, ReqB, B, G, P> Service<Request<ReqB>> for Gated<S, G, P>
where
    S: Service<Request<ReqB>, Response = Response<B>, Error = Infallible>,
    G: Gate,
    P: Policy<Body = B>,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = GatedFuture<S::Future, G::Held, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let path = req.uri().path();
        if self.layer.policy.exempt(path) {
            return GatedFuture::Passed {
                answer: self.inner.call(req),
                held: None,
            };
        }
        match self.layer.gate.pass(&self.layer.gw, req.headers()) {
            Ok(held) => GatedFuture::Passed {
                answer: self.inner.call(req),
                held: Some(held),
            },
            Err(e) => GatedFuture::Denied {
                denied: Some(
                    self.layer
                        .policy
                        .deny(&self.layer.gw, path, req.extensions(), e),
                ),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of a gated service: the inner service's, with what the gate handed out
    /// (a permit) held until it is ready, or the refusal. A named future rather than a boxed
    /// one: two allocations fewer per request.
    #[project = GatedProj]
    pub enum GatedFuture<F, H, B> {
        Passed { #[pin] answer: F, held: Option<H> },
        Denied { denied: Option<Response<B>> },
    }
}

impl<F, H, B> Future for GatedFuture<F, H, B>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GatedProj::Passed { answer, held } => {
                let r = std::task::ready!(answer.poll(cx));
                // Released as the answer is ready, not when the future is dropped later.
                held.take();
                Poll::Ready(r)
            }
            GatedProj::Denied { denied } => Poll::Ready(Ok(denied
                .take()
                .expect("a gated future is not polled after it is ready"))),
        }
    }
}
