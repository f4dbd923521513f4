//! The access line of every RPC that is not inference (metadata, readiness, configuration,
//! statistics, the repository, health, an unknown method): inference writes its own, with
//! the model, backend and bytes; these get one from their answer's gRPC status. An error
//! answer carries its status in its headers; a successful one in the trailers at the end of
//! its body, so the line is written when they go by, or, if the body is dropped first (the
//! client went away), as CANCELLED.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Frame, SizeHint};
use tonic::body::Body;

use crate::gateway::observe::{self, Observation, Protocol};

/// What the line will say, but for the status.
pub struct Line {
    path: String,
    obs: Observation,
    start: Instant,
}

impl Line {
    pub fn new(
        path: &str,
        request_headers: &HeaderMap,
        peer: Option<std::net::SocketAddr>,
    ) -> Self {
        let mut obs = Observation::new(Protocol::Grpc);
        obs.request_id = request_headers.get(&crate::gateway::REQUEST_ID).cloned();
        obs.peer = peer;
        Line {
            path: path.to_string(),
            obs,
            start: Instant::now(),
        }
    }

    fn write(self, code: tonic::Code, message: &str) {
        let error = (code != tonic::Code::Ok).then_some(message);
        observe::access_log(
            "gRPC",
            &self.path,
            &self.obs,
            code as u32,
            0,
            self.start.elapsed(),
            error,
        );
    }

    /// Logs `response` now if its headers hold its status, else once its trailers pass.
    pub fn on(self, response: Response<Body>) -> Response<Body> {
        if let Some(status) = tonic::Status::from_header_map(response.headers()) {
            self.write(status.code(), status.message());
            return response;
        }
        response.map(|body| {
            Body::new(Logged {
                inner: body,
                line: Some(self),
            })
        })
    }
}

struct Logged {
    inner: Body,
    line: Option<Line>,
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(trailers) = frame.trailers_ref() {
                if let (Some(line), Some(status)) =
                    (self.line.take(), tonic::Status::from_header_map(trailers))
                {
                    line.write(status.code(), status.message());
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            line.write(
                tonic::Code::Cancelled,
                "the answer was not sent to its end (the client went away)",
            );
        }
    }
}
