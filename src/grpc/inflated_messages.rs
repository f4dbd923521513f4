//! Inflates a stream's compressed messages before tonic sees them, with
//! `gateway::inflate`: counted in the budget for bodies as they inflate, past 256 KiB on the
//! blocking pool, bytes after the compressed data refused. tonic inflated them itself, on
//! the async threads and uncounted (a tester: six gzip messages of zeros stalled liveness
//! for 11 s, and three held 650 MB while the budget's gauge read 1 MB), and took any bytes
//! after a gzip stream. Each message goes on re-framed as uncompressed, so tonic, which
//! inflates only what is flagged compressed, passes it as it is.
//!
//! Takes what `WholeMessages` releases: whole messages, or bytes tonic will refuse (a header
//! declaring too much, a message cut short), which pass unchanged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tonic::Status;

use super::decode::inflate_message;
use super::routes::message_too_large;
use crate::body::BoxError;
use crate::body_budget::BodyBudget;
use crate::gateway::inflate::Coding;

const HEADER: usize = 5;

/// A message inflating: its new header and its inflated bytes, or why not.
type Inflating = Pin<Box<dyn Future<Output = Result<(Bytes, Bytes), Status>> + Send>>;

pin_project! {
    pub struct InflatedMessages<B> {
        #[pin]
        inner: B,
        // What is left of the frame being read.
        rest: Bytes,
        coding: Option<Coding>,
        max_message: usize,
        budget: Arc<BodyBudget>,
        inflating: Option<Inflating>,
        // An inflated message's bytes, sent after its header (tonic copies both into its
        // buffer: joining them here would copy the message once more).
        next: Option<Bytes>,
    }
}

impl<B> InflatedMessages<B> {
    /// `coding`: the call's `grpc-encoding`, if one this inflates (messages flagged
    /// compressed in another go on as they are, for tonic to refuse).
    pub fn new(
        inner: B,
        coding: Option<Coding>,
        max_message: usize,
        budget: Arc<BodyBudget>,
    ) -> Self {
        InflatedMessages {
            inner,
            rest: Bytes::new(),
            coding,
            max_message,
            budget,
            inflating: None,
            next: None,
        }
    }
}

impl<B> Body for InflatedMessages<B>
where
    B: Body<Data = Bytes, Error = BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if let Some(message) = this.next.take() {
                return Poll::Ready(Some(Ok(Frame::data(message))));
            }
            if let Some(inflating) = this.inflating.as_mut() {
                let inflated = std::task::ready!(inflating.as_mut().poll(cx));
                *this.inflating = None;
                return Poll::Ready(Some(match inflated {
                    Ok((header, message)) => {
                        *this.next = Some(message);
                        Ok(Frame::data(header))
                    }
                    Err(status) => Err(Box::new(status)),
                }));
            }
            if !this.rest.is_empty() {
                let rest = &*this.rest;
                let whole = (rest.len() >= HEADER)
                    .then(|| u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize)
                    .filter(|&len| rest.len() - HEADER >= len);
                let (Some(len), Some(coding)) = (whole, *this.coding) else {
                    // Uncompressed messages, or what tonic will refuse: as they came.
                    if whole.is_some() && rest[0] == 0 {
                        let len = whole.unwrap_or_default();
                        return Poll::Ready(Some(Ok(Frame::data(
                            this.rest.split_to(HEADER + len),
                        ))));
                    }
                    return Poll::Ready(Some(Ok(Frame::data(std::mem::take(this.rest)))));
                };
                let message = this.rest.split_to(HEADER + len);
                if message[0] != 1 {
                    return Poll::Ready(Some(Ok(Frame::data(message))));
                }
                let (budget, max) = (this.budget.clone(), *this.max_message);
                *this.inflating = Some(Box::pin(async move {
                    let mut held = budget.reserve();
                    let inflated = inflate_message(message.slice(HEADER..), coding, max, &mut held)
                        .await
                        .map_err(|e| e.to_grpc())?;
                    let len = u32::try_from(inflated.len()).map_err(|_| {
                        Status::resource_exhausted(message_too_large(u32::MAX as usize, true))
                    })?;
                    let mut header = BytesMut::with_capacity(HEADER);
                    header.put_u8(0);
                    header.put_u32(len);
                    Ok((header.freeze(), inflated))
                }));
                continue;
            }
            match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => *this.rest = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
            && self.inflating.is_none()
            && self.next.is_none()
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
