//! Bounds on reading a request message, which tonic leaves to its transport: a deadline for
//! the whole message of a unary call (`limits.body_read_timeout_ms`), so that a client that
//! trickles its body cannot hold a concurrency permit for ever, and a small size limit for
//! the health calls, which anyone may make without a token. A breach ends the call with a
//! gRPC status (tonic passes a `Status` from the body on as it is).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{sleep, Sleep};
use tonic::Status;

use crate::body::BoxError;

pin_project! {
    pub struct BoundedBody<B> {
        #[pin]
        inner: B,
        #[pin]
        deadline: Option<Sleep>,
        timeout: Duration,
        remaining: Option<usize>,
    }
}

impl<B> BoundedBody<B> {
    /// `timeout`: for the whole body (None: a stream, which may live as long as it likes);
    /// `limit`: most bytes the body may have.
    pub fn new(inner: B, timeout: Option<Duration>, limit: Option<usize>) -> Self {
        BoundedBody {
            inner,
            deadline: timeout.map(sleep),
            timeout: timeout.unwrap_or_default(),
            remaining: limit,
        }
    }
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if let Some(deadline) = this.deadline.as_mut().as_pin_mut() {
            if deadline.poll(cx).is_ready() {
                let status = Status::deadline_exceeded(format!(
                    "the request message did not arrive within {} ms (limits.body_read_timeout_ms)",
                    this.timeout.as_millis()
                ));
                return Poll::Ready(Some(Err(Box::new(status))));
            }
        }
        let frame = match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let (Some(remaining), Some(data)) = (this.remaining.as_mut(), frame.data_ref()) {
            match remaining.checked_sub(data.len()) {
                Some(left) => *remaining = left,
                None => {
                    let status = Status::resource_exhausted(
                        "a health check's request is limited to 64 KiB".to_string(),
                    );
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
