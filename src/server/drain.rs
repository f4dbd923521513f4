//! Graceful shutdown of connections: each is told to finish, and the server waits for all.
//!
//! hyper-util's `GracefulShutdown` does the same, with one difference that loses requests:
//! it passes the shutdown on before the connection's first poll, and hyper closes, as idle, a
//! connection it has read nothing from. A connection accepted just before or during the
//! shutdown (from the listener's queue) has its first bytes read already (`conn::sniff`),
//! with a request behind them; here hyper reads them before it hears of the shutdown, so it
//! serves that request and then closes.

use std::future::poll_fn;
use std::task::Poll;
use std::time::{Duration, Instant};

use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::watch;

use super::idle::Activity;

/// Sleeps until `at` (never, without one).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// How long a connection that has sent nothing yet may stay once a shutdown has begun: long
/// enough for a request its client is already sending, short enough that a silent peer (a
/// TCP health check, a client's spare pooled connection) does not hold the shutdown for the
/// whole header-read timeout.
pub const SILENT_GRACE: Duration = Duration::from_secs(1);

/// The server's side: starts the shutdown and waits for the connections.
pub struct Drain {
    /// `true` once the shutdown has begun.
    tx: watch::Sender<bool>,
}

/// One connection's side, taken when it is accepted: the drain waits until it is dropped.
pub struct Watch {
    rx: watch::Receiver<bool>,
}

impl Drain {
    pub fn new() -> Self {
        Drain {
            tx: watch::channel(false).0,
        }
    }

    pub fn watch(&self) -> Watch {
        Watch {
            rx: self.tx.subscribe(),
        }
    }

    /// Tells every connection to finish, then waits until all have ended.
    pub async fn shutdown(self) {
        // Connections accepted later (from the listener's queue) see the flag as it is.
        self.tx.send_replace(true);
        self.tx.closed().await;
    }
}

impl Watch {
    /// Completes `grace` after the shutdown begins (at once if it has): the moment to give
    /// up on a connection that has still sent nothing.
    pub async fn silent_for(&self, grace: Duration) {
        let mut rx = self.rx.clone();
        // An error means the server is gone: that is a shutdown too.
        let _ = rx.wait_for(|stopping| *stopping).await;
        tokio::time::sleep(grace).await;
    }

    /// Runs `conn` to its end. On shutdown, HTTP/1 finishes the request in progress (or the
    /// first one, on a new connection) and closes, an idle keep-alive connection closes at
    /// once, and h2 sends GOAWAY and finishes its open streams.
    pub async fn drive<C: GracefulConnection>(self, conn: C) -> C::Output {
        self.drive_idle(conn, None).await
    }

    /// [`Watch::drive`], and also a graceful close once the connection has had no open
    /// stream for `idle.1` (for h2, whose idle connections hyper never closes).
    pub async fn drive_idle<C: GracefulConnection>(
        self,
        conn: C,
        idle: Option<(&Activity, Duration)>,
    ) -> C::Output {
        let Watch { mut rx } = self;
        let mut conn = std::pin::pin!(conn);
        if let Poll::Ready(done) = poll_fn(|cx| Poll::Ready(conn.as_mut().poll(cx))).await {
            return done;
        }
        loop {
            // With streams open, look again a whole timeout later.
            let check = idle.map(|(a, t)| a.idle_deadline(t).unwrap_or_else(|| Instant::now() + t));
            tokio::select! {
                done = conn.as_mut() => return done,
                // An error means the server is gone without a word: shut down all the same.
                _ = rx.wait_for(|stopping| *stopping) => break,
                () = sleep_until(check), if check.is_some() => {
                    let (activity, timeout) = idle.expect("checked only with an idle bound");
                    if activity.idle_deadline(timeout).is_some_and(|d| d <= Instant::now()) {
                        tracing::debug!("h2 connection idle for the header-read timeout; closed");
                        break;
                    }
                }
            }
        }
        conn.as_mut().graceful_shutdown();
        // `rx` lives until here, so the drain waits for this connection.
        conn.await
    }
}
