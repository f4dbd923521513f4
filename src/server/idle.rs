//! An idle bound for h2 connections. hyper closes an HTTP/1 connection whose next request
//! does not begin within the header-read timeout; for h2 it has no such bound, so a client
//! could hold any number of connections that send nothing, or stopped sending. Here each h2
//! connection counts its open streams (a request until its response body has ended), and one
//! that has had none for the timeout is told to go away (GOAWAY, which loses nothing).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};

/// One connection's open streams, and since when it has had none.
pub struct Activity(Mutex<State>);

struct State {
    open: usize,
    idle_since: Instant,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity(Mutex::new(State {
            open: 0,
            idle_since: Instant::now(),
        })))
    }

    fn begin(self: &Arc<Self>) -> StreamGuard {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).open += 1;
        StreamGuard(Arc::clone(self))
    }

    /// When the connection will have been idle for `idle`, if it has no open stream now.
    pub fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        let state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (state.open == 0).then(|| state.idle_since + idle)
    }
}

/// One open stream: it ends when this is dropped, with its response body (or its request,
/// if no response came).
pub struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut state = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        state.open -= 1;
        if state.open == 0 {
            state.idle_since = Instant::now();
        }
    }
}

/// A service whose every request is an open stream of `activity` until its answer's body
/// ends.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Self {
        Tracked { inner, activity }
    }
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for Tracked<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<TrackedBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let guard = self.activity.begin();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|inner| TrackedBody {
                inner,
                _guard: guard,
            }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its stream open until it is done with.
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        _guard: StreamGuard,
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_only_without_open_streams() {
        let a = Activity::new();
        let idle = Duration::from_secs(30);
        let first = a
            .idle_deadline(idle)
            .expect("a new connection has no stream");
        let one = a.begin();
        let two = a.begin();
        assert_eq!(a.idle_deadline(idle), None);
        drop(one);
        assert_eq!(a.idle_deadline(idle), None, "a stream is still open");
        drop(two);
        let after = a.idle_deadline(idle).expect("no stream is open");
        assert!(after >= first, "idle since the last stream ended");
    }
}
