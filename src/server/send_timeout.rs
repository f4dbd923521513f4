//! Closes a connection whose client stopped reading: a write that makes no progress for
//! `limits.send_timeout_ms` fails the connection. Without it a client that never reads an
//! answer holds the answer's memory (and, through a pass-through, the backend's) for as
//! long as it keeps the connection open. The clock runs only while a write waits on the
//! socket, so a slow reader that keeps taking bytes is never cut off.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

pub struct SendTimeout<I> {
    inner: I,
    timeout: Duration,
    /// Armed when a write first waits, cleared by any progress. Boxed: rare, and it keeps
    /// the wrapper `Unpin`, as hyper wants its I/O.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<I> SendTimeout<I> {
    pub fn new(inner: I, timeout: Duration) -> Self {
        SendTimeout {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// What a write's poll says once its result is known: progress disarms the clock, a
    /// wait arms it, and a wait past the timeout is an error.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let stall = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match stall.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the client read nothing for {} ms (limits.send_timeout_ms)",
                            timeout.as_millis()
                        ),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for SendTimeout<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for SendTimeout<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A peer that reads nothing: writes fill the pipe, then wait, then fail at the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_waits_past_the_timeout_fails() {
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut io = SendTimeout::new(ours, Duration::from_secs(5));
        io.write_all(&[0; 64]).await.unwrap();
        let start = tokio::time::Instant::now();
        let e = io.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            e.to_string(),
            "the client read nothing for 5000 ms (limits.send_timeout_ms)"
        );
        assert!(start.elapsed() >= Duration::from_secs(5));
    }

    /// A reader that keeps taking bytes, however slowly, resets the clock.
    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_cut_off() {
        use tokio::io::AsyncReadExt;
        let (ours, mut theirs) = tokio::io::duplex(16);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let mut got = 0;
            while got < 256 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                got += theirs.read(&mut buf).await.unwrap();
            }
            got
        });
        let mut io = SendTimeout::new(ours, Duration::from_secs(5));
        io.write_all(&[0; 256]).await.unwrap();
        assert_eq!(reader.await.unwrap(), 256);
    }
}
