//! Why a ModelStreamInfer stream stops taking messages: the gateway shuts down, or its client
//! has sent nothing, and waits for no answer, for `limits.stream_idle_timeout_ms`. Either way
//! what was read is answered first, then the stream ends with UNAVAILABLE, which tells the
//! client to send the rest on a new stream.
//!
//! Without the idle end a client could hold streams, and what each keeps, for as long as its
//! connection lives; streams may idle between a sequence's requests, so the limit is long.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use crate::error::GatewayError;

pub const SHUTTING_DOWN: &str = "tensorgate is shutting down: this stream takes no more messages; every message answered on it was run, and any sent after the last answer was not: send those on a new stream";

const OPEN: u8 = 0;
const SHUTDOWN: u8 = 1;
const IDLE: u8 = 2;

/// Shared by the stream's reader, which counts messages in and answers out, and by the future
/// that ends the reading.
pub struct StreamWatch {
    start: Instant,
    /// `None`: a stream may idle for as long as its connection lives.
    idle: Option<Duration>,
    /// When a message last arrived or was answered, in ms since `start`.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    ended: AtomicU8,
}

impl StreamWatch {
    pub fn new(idle: Option<Duration>) -> Self {
        StreamWatch {
            start: Instant::now(),
            idle,
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            ended: AtomicU8::new(OPEN),
        }
    }

    pub fn arrived(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
    }

    pub fn answered(&self) {
        self.touch();
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// Resolves when the stream should take no more messages: `closed` (the gateway's
    /// shutdown) resolved, or the stream went idle. Says which in `status`.
    pub async fn end(&self, closed: impl Future<Output = ()>) {
        tokio::select! {
            () = closed => self.ended.store(SHUTDOWN, Ordering::Release),
            () = self.idle() => self.ended.store(IDLE, Ordering::Release),
        }
    }

    async fn idle(&self) {
        let Some(idle) = self.idle else {
            return std::future::pending().await;
        };
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Acquire));
            let Some(due) = last.checked_add(idle) else {
                // A limit too far away to reach.
                return std::future::pending().await;
            };
            if Instant::now() >= due {
                if self.in_flight.load(Ordering::Acquire) == 0 {
                    return;
                }
                // An answer still being worked on: its end counts as activity, so look again
                // a whole period after now at the latest.
                tokio::time::sleep(idle).await;
            } else {
                tokio::time::sleep_until(due).await;
            }
        }
    }

    /// The status the stream ends with once its answers are out, if reading was cut.
    pub fn status(&self) -> Option<Status> {
        match self.ended.load(Ordering::Acquire) {
            SHUTDOWN => Some(GatewayError::Unavailable(SHUTTING_DOWN.into()).to_grpc()),
            IDLE => {
                let ms = self.idle.map_or(0, |d| d.as_millis());
                Some(GatewayError::Unavailable(format!(
                    "the stream sent no message and awaited no answer for {ms} ms (limits.stream_idle_timeout_ms); every message answered on it was run: send further requests on a new stream"
                )).to_grpc())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_ends_after_the_limit() {
        let watch = StreamWatch::new(Some(Duration::from_millis(500)));
        let started = Instant::now();
        watch.end(std::future::pending()).await;
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        let status = watch.status().unwrap();
        assert_eq!(
            (status.code(), status.message()),
            (
                tonic::Code::Unavailable,
                "the stream sent no message and awaited no answer for 500 ms (limits.stream_idle_timeout_ms); every message answered on it was run: send further requests on a new stream"
            )
        );
    }

    /// A stream whose answer takes longer than the limit is not idle: it waits for the
    /// client, and the period restarts when the answer goes out.
    #[tokio::test(start_paused = true)]
    async fn a_pending_answer_keeps_the_stream_open() {
        let watch = std::sync::Arc::new(StreamWatch::new(Some(Duration::from_millis(500))));
        let started = Instant::now();
        watch.arrived();
        let answering = {
            let watch = watch.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                watch.answered();
            })
        };
        watch.end(std::future::pending()).await;
        answering.await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(1_700),
            "ended {:?} after the start",
            started.elapsed()
        );
        assert!(watch.status().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_it_at_once() {
        let watch = StreamWatch::new(None);
        watch.end(async {}).await;
        assert_eq!(
            watch.status().unwrap().message(),
            SHUTTING_DOWN,
            "without an idle limit only the shutdown ends it"
        );
    }

    #[test]
    fn an_open_stream_has_no_status() {
        assert!(StreamWatch::new(None).status().is_none());
    }
}
