//! Hands tonic's decoder only whole gRPC messages. tonic reserves a message's declared
//! length as soon as it reads the 5-byte header, before any of the message arrives: a
//! client that declares 256 MiB on each of many streams and sends a byte claims gigabytes,
//! and where the host caps memory the failed allocation aborts the process. Here a message
//! is held back, growing with what has arrived, until it is complete (or declares more than
//! tonic accepts, which tonic then refuses at once); tonic's reservation then matches bytes
//! that are really there. Complete messages at the start of a frame pass without a copy.
//! What is held back counts against the gateway's budget for bodies (`counted`); a message
//! that would exceed it ends the call with UNAVAILABLE. On a stream, a message must arrive
//! whole within `limits.body_read_timeout_ms` of its first bytes (`message_deadline`), as a
//! unary call's must: the stream's idle limit (300 s by default) counts only between
//! messages, and a half-sent message held its bytes, and its slot, for all of it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{sleep, Sleep};
use tonic::Status;

use crate::body::BoxError;
use crate::body_budget::Reservation;

const HEADER: usize = 5;

pin_project! {
    pub struct WholeMessages<B> {
        #[pin]
        inner: B,
        // Bytes of a message not yet complete.
        pending: BytesMut,
        // Declared lengths above this go to tonic at once, to be refused.
        max_message: usize,
        ended: bool,
        held: Reservation,
        // How long a message may take to arrive once it has begun, and when the one
        // pending now must be whole.
        message_timeout: Option<Duration>,
        due: Option<Pin<Box<Sleep>>>,
    }
}

impl<B> WholeMessages<B> {
    pub fn new(inner: B, max_message: usize) -> Self {
        WholeMessages {
            inner,
            pending: BytesMut::new(),
            max_message,
            ended: false,
            held: Reservation::default(),
            message_timeout: None,
            due: None,
        }
    }

    /// Ends the call with DEADLINE_EXCEEDED when a message begun does not arrive whole
    /// within `timeout`.
    pub fn message_deadline(mut self, timeout: Duration) -> Self {
        self.message_timeout = Some(timeout);
        self
    }

    /// Counts what is held back in `held`.
    pub fn counted(mut self, held: Reservation) -> Self {
        self.held = held;
        self
    }
}

/// How many leading bytes of `buf` may go to tonic now: its complete messages, or a header
/// whose length tonic will refuse; 0 while the first message is incomplete.
fn releasable(buf: &[u8], max_message: usize) -> usize {
    let mut at = 0;
    while buf.len() - at >= HEADER {
        let declared = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]);
        let declared = declared as usize;
        if declared > max_message {
            return buf.len();
        }
        if buf.len() - at - HEADER < declared {
            break;
        }
        at += HEADER + declared;
    }
    at
}

impl<B> Body for WholeMessages<B>
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
        loop {
            let ready = releasable(this.pending, *this.max_message);
            if ready > 0 {
                let whole = this.pending.split_to(ready).freeze();
                // What is left would share the message's allocation, and keep it alive for
                // as long as the stream idles: the tail (less than a frame) moves to a
                // buffer of its own.
                *this.pending = BytesMut::from(&this.pending[..]);
                // Handed on: no longer held here (shrinking always succeeds).
                let _ = this.held.hold(this.pending.len());
                // The tail, if any, is the next message begun.
                *this.due = None;
                return Poll::Ready(Some(Ok(Frame::data(whole))));
            }
            if this.pending.is_empty() {
                *this.due = None;
            } else if let Some(timeout) = *this.message_timeout {
                let due = this.due.get_or_insert_with(|| Box::pin(sleep(timeout)));
                if due.as_mut().poll(cx).is_ready() {
                    let status = Status::deadline_exceeded(format!(
                        "a stream's request message did not arrive whole within {} ms of its first bytes (limits.body_read_timeout_ms)",
                        timeout.as_millis()
                    ));
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
            }
            if *this.ended {
                // A message cut short: tonic says so ("Unexpected EOF").
                if this.pending.is_empty() {
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Ok(Frame::data(this.pending.split().freeze()))));
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(mut data) => {
                        if this.pending.is_empty() {
                            let ready = releasable(&data, *this.max_message);
                            if ready == data.len() {
                                return Poll::Ready(Some(Ok(Frame::data(data))));
                            }
                            let whole = data.split_to(ready);
                            this.pending.extend_from_slice(&data);
                            if let Err(e) = this.held.hold(this.pending.len()) {
                                return Poll::Ready(Some(Err(Box::new(e.to_grpc()))));
                            }
                            if !whole.is_empty() {
                                return Poll::Ready(Some(Ok(Frame::data(whole))));
                            }
                        } else {
                            this.pending.extend_from_slice(data.chunk());
                            if let Err(e) = this.held.hold(this.pending.len()) {
                                return Poll::Ready(Some(Err(Box::new(e.to_grpc()))));
                            }
                        }
                    }
                    // Trailers: whatever is pending first would be a message cut short,
                    // which tonic reports from the data it already has.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => *this.ended = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_empty() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    /// What tonic would see, frame by frame, for these incoming chunks.
    async fn frames(chunks: Vec<Vec<u8>>, max: usize) -> Vec<Vec<u8>> {
        let stream = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(c)))),
        );
        let mut body = WholeMessages::new(StreamBody::new(stream), max);
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            out.push(frame.unwrap().into_data().unwrap().to_vec());
        }
        out
    }

    #[test]
    fn releasable_counts_whole_messages_only() {
        let two = [message(3), message(0)].concat();
        assert_eq!(releasable(&two, 100), 13);
        assert_eq!(releasable(&two[..12], 100), 8);
        assert_eq!(releasable(&two[..7], 100), 0);
        assert_eq!(releasable(&two[..4], 100), 0);
        // A length over the limit goes through at once, for tonic to refuse.
        assert_eq!(releasable(&message(101)[..6], 100), 6);
    }

    #[tokio::test]
    async fn a_message_is_released_once_whole() {
        let m = message(10);
        let got = frames(
            vec![m[..3].to_vec(), m[3..9].to_vec(), m[9..].to_vec()],
            100,
        )
        .await;
        assert_eq!(got, vec![m.clone()]);
        // Whole messages pass as they came; a tail waits for the rest.
        let two = [message(2), message(4)].concat();
        let got = frames(vec![two[..9].to_vec(), two[9..].to_vec()], 100).await;
        assert_eq!(got, vec![message(2), message(4)]);
    }

    #[tokio::test]
    async fn a_message_cut_short_reaches_tonic_as_it_is() {
        let m = message(10);
        let got = frames(vec![m[..8].to_vec()], 100).await;
        assert_eq!(got, vec![m[..8].to_vec()]);
    }

    /// The point of it all: a header that declares a large message holds no more memory
    /// than what arrived.
    #[tokio::test]
    async fn a_large_declared_length_reserves_nothing() {
        let mut header = vec![0u8];
        header.extend_from_slice(&(200u32 << 20).to_be_bytes());
        header.push(1);
        let stream = futures_util::stream::iter(vec![Ok::<_, std::convert::Infallible>(
            Frame::data(Bytes::from(header)),
        )])
        .chain(futures_util::stream::pending());
        let mut body = WholeMessages::new(StreamBody::new(stream), 256 << 20);
        let polled = futures_util::FutureExt::now_or_never(body.frame());
        assert!(polled.is_none(), "nothing is released");
        assert!(
            body.pending.capacity() < 1024,
            "{}",
            body.pending.capacity()
        );
    }

    /// A message begun must arrive whole within its deadline; the time between whole
    /// messages is the stream's idle limit's, not this one's.
    #[tokio::test(start_paused = true)]
    async fn a_message_begun_must_arrive_whole_in_time() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rx = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut body = WholeMessages::new(StreamBody::new(rx), 1 << 20)
            .message_deadline(Duration::from_millis(1000));
        let m = message(10);
        let send = |b: &[u8]| {
            tx.send(Ok::<_, std::convert::Infallible>(Frame::data(
                Bytes::copy_from_slice(b),
            )))
            .unwrap()
        };
        // Whole, after a long quiet: no deadline was running.
        tokio::time::sleep(Duration::from_secs(5)).await;
        send(&m);
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), m);
        // Begun, and finished within the deadline.
        send(&m[..4]);
        assert!(futures_util::FutureExt::now_or_never(body.frame()).is_none());
        tokio::time::sleep(Duration::from_millis(900)).await;
        send(&m[4..]);
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), m);
        // Begun, and not finished.
        send(&m[..4]);
        let started = tokio::time::Instant::now();
        let refused = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_millis(1000));
        let status = refused.downcast::<Status>().unwrap();
        assert_eq!(
            (status.code(), status.message()),
            (
                tonic::Code::DeadlineExceeded,
                "a stream's request message did not arrive whole within 1000 ms of its first bytes (limits.body_read_timeout_ms)"
            )
        );
    }

    /// What is held back counts against the budget for bodies, is given back as whole
    /// messages go on, and a message that would exceed the budget ends the call.
    #[tokio::test]
    async fn what_is_held_back_counts_against_the_budget() {
        use crate::body_budget::BodyBudget;
        let gauge = prometheus::IntGauge::new("held", "held").unwrap();
        let budget = BodyBudget::new(4096, gauge.clone());
        let m = message(1000);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rx = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut body = WholeMessages::new(StreamBody::new(rx), 1 << 20).counted(budget.reserve());
        tx.send(Ok::<_, std::convert::Infallible>(Frame::data(
            Bytes::copy_from_slice(&m[..500]),
        )))
        .unwrap();
        assert!(futures_util::FutureExt::now_or_never(body.frame()).is_none());
        assert!(gauge.get() >= 500, "{}", gauge.get());
        tx.send(Ok(Frame::data(Bytes::copy_from_slice(&m[500..]))))
            .unwrap();
        let whole = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(whole.len(), m.len());
        assert_eq!(gauge.get(), 0);
        assert_eq!(body.pending.capacity(), 0, "nothing of the message is kept");

        // Another body holds 3000 of the 4096: 2000 bytes held back here do not fit.
        let mut other = budget.reserve();
        other.hold(3000).unwrap();
        let big = message(10_000);
        tx.send(Ok(Frame::data(Bytes::copy_from_slice(&big[..2000]))))
            .unwrap();
        let refused = body.frame().await.unwrap().unwrap_err();
        let status = refused.downcast::<tonic::Status>().unwrap();
        assert_eq!(
            (status.code(), status.message()),
            (
                tonic::Code::Unavailable,
                "tensorgate holds its limit of 4096 bytes of request bodies (limits.max_buffered_body_bytes); retry later"
            )
        );
        drop(body);
        assert_eq!(gauge.get(), 3000);
        drop(other);
        assert_eq!(gauge.get(), 0);
    }
}
