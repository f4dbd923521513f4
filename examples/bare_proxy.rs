//! A bare hyper reverse proxy, for `bench/proxy_core.sh`: what hyper and tokio cost on their
//! own on the path tensorgate takes, so that the bench can tell the stack's share of the gap
//! to nginx from tensorgate's. It is not part of tensorgate and does nothing a gateway must:
//! no validation, routing, metrics or log. Every request goes to one backend over pooled
//! keep-alive HTTP/1 connections (hyper's `client::conn`, as `fleet::pool` uses), and the
//! backend's answer comes back as it is.
//!
//! `--buffer`: the request body is read whole before it is sent on, as a gateway that
//! validates bodies must; without it, the body streams through, as nginx's does.
//!
//! ```text
//! cargo run --release --example bare_proxy -- --listen 127.0.0.1:8000 --backend 127.0.0.1:8001 [--buffer]
//! ```
//! It runs tokio's current-thread runtime, as tensorgate does with one worker thread.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Forwarded = Either<Incoming, Full<Bytes>>;

struct Proxy {
    backend: SocketAddr,
    buffer: bool,
    idle: Mutex<Vec<SendRequest<Forwarded>>>,
}

impl Proxy {
    /// An idle connection to the backend, or a new one.
    async fn connection(&self) -> Result<SendRequest<Forwarded>, String> {
        loop {
            let Some(mut sender) = self.idle.lock().unwrap().pop() else {
                break;
            };
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let stream = TcpStream::connect(self.backend)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        Ok(sender)
    }

    async fn forward(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, String> {
        let (parts, body) = req.into_parts();
        let body = if self.buffer {
            let whole = body.collect().await.map_err(|e| e.to_string())?;
            Either::Right(Full::new(whole.to_bytes()))
        } else {
            Either::Left(body)
        };
        let mut sender = self.connection().await?;
        let answer = sender
            .send_request(Request::from_parts(parts, body))
            .await
            .map_err(|e| format!("backend: {e}"))?;
        // The answer is read whole before the connection goes back to the pool: a small
        // answer is one chunk, which `to_bytes` hands on without a copy.
        let (parts, body) = answer.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        self.idle.lock().unwrap().push(sender);
        Ok(Response::from_parts(parts, Full::new(body)))
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: bare_proxy --listen ADDR --backend ADDR [--buffer]";
    let listen: SocketAddr = arg(&args, "--listen").ok_or(usage)?.parse()?;
    let backend: SocketAddr = arg(&args, "--backend").ok_or(usage)?.parse()?;
    let proxy = Arc::new(Proxy {
        backend,
        buffer: args.iter().any(|a| a == "--buffer"),
        idle: Mutex::new(Vec::new()),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let proxy = proxy.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let proxy = proxy.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(match proxy.forward(req).await {
                            Ok(answer) => answer,
                            Err(why) => {
                                let mut answer = Response::new(Full::new(Bytes::from(why)));
                                *answer.status_mut() = StatusCode::BAD_GATEWAY;
                                answer
                            }
                        })
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
