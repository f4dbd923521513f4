//! Telling HTTP/1 from h2 by a connection's first bytes, and handing those bytes back to hyper.
//!
//! hyper-util's auto builder does the same, but (a) with no deadline, so a client that
//! connects and never sends holds its connection until the process exits, and (b) a graceful
//! shutdown that arrives before the first bytes drops the connection outright, losing a
//! request that was already on its way. Here the caller bounds the wait, and the connection
//! reaches hyper as HTTP/1 or h2, whose graceful shutdown lets a first request finish.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a client sends first on an h2 connection with prior knowledge or ALPN.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Http1,
    H2,
}

/// Reads just enough of `io` to know its protocol: the h2 preface, or the first byte that
/// differs from it. Fails when the peer closes before sending anything.
pub async fn sniff<I: AsyncRead + Unpin>(mut io: I) -> io::Result<(Proto, Prefixed<I>)> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    loop {
        let mut chunk = [0u8; 24];
        let want = H2_PREFACE.len() - seen.len();
        let n = poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut chunk[..want]);
            Pin::new(&mut io)
                .poll_read(cx, &mut buf)
                .map_ok(|()| buf.filled().len())
        })
        .await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before sending a request",
            ));
        }
        seen.extend_from_slice(&chunk[..n]);
        if !H2_PREFACE.starts_with(&seen) {
            return Ok((Proto::Http1, Prefixed::new(seen, io)));
        }
        if seen.len() == H2_PREFACE.len() {
            return Ok((Proto::H2, Prefixed::new(seen, io)));
        }
    }
}

/// `inner`, with bytes already read from it put back in front.
pub struct Prefixed<I> {
    prefix: Vec<u8>,
    at: usize,
    inner: I,
}

impl<I> Prefixed<I> {
    fn new(prefix: Vec<u8>, inner: I) -> Self {
        Prefixed {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.prefix.len() {
            let rest = &this.prefix[this.at..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads everything `io` yields.
    async fn drain<I: AsyncRead + Unpin>(mut io: I) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let mut chunk = [0u8; 7];
            let n = poll_fn(|cx| {
                let mut buf = ReadBuf::new(&mut chunk);
                Pin::new(&mut io)
                    .poll_read(cx, &mut buf)
                    .map_ok(|()| buf.filled().len())
            })
            .await
            .unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&chunk[..n]);
        }
    }

    #[tokio::test]
    async fn http1_is_told_by_its_first_byte_and_nothing_is_lost() {
        let req = b"GET /v2/health/live HTTP/1.1\r\nhost: a\r\n\r\n";
        let (proto, io) = sniff(&req[..]).await.unwrap();
        assert_eq!(proto, Proto::Http1);
        assert_eq!(drain(io).await, req);
        // "P" could start either; "PO" cannot be the preface.
        let (proto, io) = sniff(&b"POST / HTTP/1.1\r\n\r\n"[..]).await.unwrap();
        assert_eq!(proto, Proto::Http1);
        assert_eq!(drain(io).await, b"POST / HTTP/1.1\r\n\r\n");
    }

    #[tokio::test]
    async fn h2_needs_the_whole_preface() {
        let mut bytes = H2_PREFACE.to_vec();
        bytes.extend_from_slice(b"\x00\x00\x00\x04");
        let (proto, io) = sniff(&bytes[..]).await.unwrap();
        assert_eq!(proto, Proto::H2);
        assert_eq!(drain(io).await, bytes);
        // A preface cut short is not h2: the peer closed, having sent no request.
        let e = sniff(&H2_PREFACE[..10]).await.err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(
            sniff(&b""[..]).await.err().unwrap().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
