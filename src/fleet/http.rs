//! A v2 server over HTTP: Triton, MLServer, KServe, or a `tensorgate worker`. Inference
//! goes over the backend's own pool of keep-alive HTTP/1 connections (`pool`); the
//! control-plane calls over hyper-util's pooled client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

use super::backend::{
    error_message, Backend, BackendError, BoxFuture, DiscoveredModel, InferCall, ModelList,
    Payload, Reply, RepositoryAction, StatedConfig,
};
use super::pool::{BackendBody, ConnPool, Connector, SendError};
use crate::body::{full, Body, PartsBody};
use crate::models::repository::{IndexEntry as RepoEntry, ModelState};
use crate::protocol::tolerance::Tolerance;
use crate::protocol::{ModelMetadata, ServerMetadata};

/// Metadata and error bodies larger than this are refused; they are never that large.
const MAX_SMALL_BODY: usize = 16 << 20;

/// What every HTTP backend connects with: hyper-util's client for the control plane, and
/// the connector and pool settings of each backend's inference pool.
#[derive(Clone)]
pub struct HttpClient {
    legacy: Client<Connector, Body>,
    connector: Connector,
    pool_idle_timeout: Duration,
    max_idle: usize,
}

/// Keep-alive clients for http:// and https:// backends.
pub fn new_client(
    connect_timeout: Duration,
    pool_idle_timeout: Duration,
    tls: rustls::ClientConfig,
) -> HttpClient {
    let https = super::pool::connector(connect_timeout, tls);
    let max_idle = if pool_idle_timeout.is_zero() { 0 } else { 1024 };
    let legacy = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool_idle_timeout)
        .pool_max_idle_per_host(max_idle)
        .build(https.clone());
    HttpClient {
        legacy,
        connector: https,
        pool_idle_timeout,
        max_idle,
    }
}

/// Models whose infer URI is kept: the catalog's models, far fewer in practice.
const MAX_CACHED_URIS: usize = 4096;

pub struct HttpBackend {
    base: String,
    client: Client<Connector, Body>,
    /// The inference connections; `None` only for a base URL that is not a URI, which the
    /// config check refuses.
    pool: Option<Arc<ConnPool>>,
    probe_timeout: Duration,
    /// Each model's `/v2/models/{m}/infer` URI, parsed once: building and parsing it was a
    /// tenth of the backend call's instructions for a small request.
    infer_uris: dashmap::DashMap<String, http::Uri>,
}

impl HttpBackend {
    pub fn new(base: &str, client: HttpClient, probe_timeout: Duration) -> Self {
        let base = base.trim_end_matches('/').to_string();
        let pool = ConnPool::new(
            client.connector,
            &base,
            client.pool_idle_timeout,
            client.max_idle,
        )
        .map_err(|e| tracing::warn!("{e}"))
        .ok();
        HttpBackend {
            base,
            client: client.legacy,
            pool,
            probe_timeout,
            infer_uris: dashmap::DashMap::new(),
        }
    }

    /// The infer URI of a model (and version: those are not cached, and rare).
    fn infer_uri(&self, model: &str, version: Option<&str>) -> Result<http::Uri, BackendError> {
        if version.is_none() {
            if let Some(uri) = self.infer_uris.get(model) {
                return Ok(uri.clone());
            }
        }
        let path = match version {
            Some(v) => format!(
                "/v2/models/{}/versions/{}/infer",
                path_segment(model),
                path_segment(v)
            ),
            None => format!("/v2/models/{}/infer", path_segment(model)),
        };
        let uri: http::Uri = self
            .uri(&path)
            .parse()
            .map_err(|e| BackendError::Failed(format!("{path} on {}: {e}", self.base)))?;
        if version.is_none() && self.infer_uris.len() < MAX_CACHED_URIS {
            self.infer_uris.insert(model.to_string(), uri.clone());
        }
        Ok(uri)
    }

    fn uri(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn send(
        &self,
        req: Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, BackendError> {
        self.client
            .request(req)
            .await
            .map_err(|e| self.send_error(e.is_connect(), &e))
    }

    /// An inference request, over the backend's own connection pool.
    async fn send_infer(&self, req: Request<Body>) -> Result<Response<BackendBody>, BackendError> {
        let Some(pool) = &self.pool else {
            return Err(BackendError::Failed(format!(
                "backend url '{}' is not a valid URI",
                self.base
            )));
        };
        pool.send(req).await.map_err(|e| match e {
            SendError::Connect(e) => self.send_error(true, e.as_ref()),
            SendError::Failed(e) => self.send_error(false, e.as_ref()),
        })
    }

    /// Why a request to this backend got no answer, from either client: nothing reached it
    /// (`connect`), it closed the connection before answering, or anything else.
    fn send_error(&self, connect: bool, e: &(dyn std::error::Error + 'static)) -> BackendError {
        if connect {
            BackendError::Connect(format!(
                "cannot connect to {}: {}",
                self.base,
                source_chain(e)
            ))
        } else if closed_before_answer(e) {
            BackendError::Reset(format!(
                "{} closed the connection before answering: {}",
                self.base,
                source_chain(e)
            ))
        } else {
            BackendError::Failed(format!(
                "request to {} failed: {}",
                self.base,
                source_chain(e)
            ))
        }
    }

    /// A small call (metadata, readiness) with the probe deadline. Returns the status and body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&'static str>,
    ) -> Result<(StatusCode, Bytes), BackendError> {
        let request = || {
            let mut req = Request::builder()
                .method(method.clone())
                .uri(self.uri(path));
            if body.is_some() {
                req = req.header(header::CONTENT_TYPE, "application/json");
            }
            req.body(full(body.unwrap_or("")))
                .map_err(|e| BackendError::Failed(e.to_string()))
        };
        let fut = async {
            // These calls only read, so one retry is safe. It covers a pooled connection
            // that the backend closed just as it was reused: the request never got there.
            let resp = match self.send(request()?).await {
                Err(BackendError::Failed(first) | BackendError::Reset(first)) => {
                    tracing::debug!(backend = %self.base, error = %first, "probe retried");
                    self.send(request()?).await?
                }
                other => other?,
            };
            let status = resp.status();
            Ok((status, self.small_body(resp, path).await?))
        };
        tokio::time::timeout(self.probe_timeout, fut)
            .await
            .map_err(|_| BackendError::Failed(format!("{path} on {} timed out", self.base)))?
    }

    /// A control-plane answer's body, up to `MAX_SMALL_BODY`.
    async fn small_body(
        &self,
        resp: http::Response<hyper::body::Incoming>,
        path: &str,
    ) -> Result<Bytes, BackendError> {
        Ok(Limited::new(resp.into_body(), MAX_SMALL_BODY)
            .collect()
            .await
            .map_err(|e| BackendError::Failed(format!("reading {path} from {}: {e}", self.base)))?
            .to_bytes())
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, BackendError> {
        let (status, body) = self.call(Method::GET, path, None).await?;
        if !status.is_success() {
            return Err(BackendError::Status {
                status,
                message: error_message(&body),
            });
        }
        serde_json::from_slice(&body)
            .map_err(|e| BackendError::Failed(format!("{path} on {} is not valid: {e}", self.base)))
    }

    /// What the server's configuration of `model` says (`GET /v2/models/{m}/config`,
    /// Triton's and tensorgate's); a server without that endpoint (MLServer, KServe), or one
    /// that does not answer, states nothing.
    async fn stated_config(&self, model: &str) -> Option<StatedConfig> {
        let path = format!("/v2/models/{}/config", path_segment(model));
        let config: serde_json::Value = self.get_json(&path).await.ok()?;
        // An ensemble's configuration has no room for `sequence_batching` (Triton's
        // scheduling choice is one or the other), though a model it runs may keep sequence
        // state: it states nothing about sequences, and stays pinned.
        if config
            .get("ensemble_scheduling")
            .is_some_and(|v| !v.is_null())
            || config["platform"] == "ensemble"
        {
            return None;
        }
        Some(StatedConfig {
            // A tensorgate server's "don't know" (its answer for a model none of its own
            // backends states a limit for) is not a limit.
            max_batch_size: config["max_batch_size"]
                .as_u64()
                .filter(|n| *n != super::backend::UNKNOWN_MAX_BATCH as u64)
                .and_then(|n| u32::try_from(n).ok()),
            sequence_batching: config
                .get("sequence_batching")
                .is_some_and(|v| !v.is_null()),
            labeled_outputs: config["output"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| {
                    let name = o["name"].as_str()?;
                    let file = o["label_filename"].as_str().filter(|f| !f.is_empty())?;
                    Some((name.to_string(), file.to_string()))
                })
                .collect(),
        })
    }

    /// The names a server lists, each with whether any of its entries is ready: first from
    /// the repository extension (Triton, MLServer, tensorgate), then from `GET /v2/models`
    /// (KServe). `Err` carries what was tried, for when neither answers.
    async fn listed_models(&self) -> Result<Result<Listed, String>, BackendError> {
        let index = "POST /v2/repository/index";
        let (status, body) = self
            .call(Method::POST, "/v2/repository/index", Some("{}"))
            .await?;
        let index_outcome = if status.is_success() {
            match serde_json::from_slice::<Vec<IndexEntry>>(&body) {
                Ok(entries) => return Ok(Ok(Listed::from_index(entries, index))),
                Err(e) => {
                    format!("{index} answered {status} with a body that is not an index ({e})")
                }
            }
        } else {
            format!("{index} answered {status}")
        };
        let list = "GET /v2/models";
        let (status, body) = self.call(Method::GET, "/v2/models", None).await?;
        let list_outcome = if status.is_success() {
            match serde_json::from_slice::<ModelNames>(&body) {
                Ok(names) => return Ok(Ok(Listed::from_names(names.models, list))),
                Err(e) => {
                    format!("{list} answered {status} with a body that is not a model list ({e})")
                }
            }
        } else {
            format!("{list} answered {status}")
        };
        Ok(Err(format!("{index_outcome}; {list_outcome}")))
    }

    async fn model_ready(&self, name: &str) -> bool {
        let path = format!("/v2/models/{}/ready", path_segment(name));
        matches!(self.call(Method::GET, &path, None).await, Ok((s, _)) if s.is_success())
    }
}

/// A model name as one path segment: anything but unreserved characters percent-encoded,
/// so that a name with a space, `?` or `/` still names that model.
fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One entry of `POST /v2/repository/index`. Triton writes one per version, with `state`
/// and `reason` only where it has them.
#[derive(serde::Deserialize)]
struct IndexEntry {
    name: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// KServe's `GET /v2/models`: `{"models": ["name", ...]}`.
#[derive(serde::Deserialize)]
struct ModelNames {
    models: Vec<String>,
}

/// Model names as a server lists them, once each, with whether one of its entries is ready.
struct Listed {
    names: Vec<(String, bool)>,
    /// The versions the index says are READY, by model.
    ready_versions: HashMap<String, Vec<String>>,
    /// They came from the repository index.
    from_index: bool,
    /// Index entries in a state other than READY, with the server's reason, for the
    /// gateway's own index.
    unavailable: Vec<RepoEntry>,
    /// Where they came from, for the explanation when none of them can be used.
    source: String,
}

impl Listed {
    fn from_index(entries: Vec<IndexEntry>, source: &str) -> Listed {
        let mut names: Vec<(String, bool)> = Vec::new();
        let mut ready_versions: HashMap<String, Vec<String>> = HashMap::new();
        let mut unavailable = Vec::new();
        for e in entries {
            let state = match e.state.as_deref().map(str::to_ascii_uppercase).as_deref() {
                Some("UNAVAILABLE") => Some(ModelState::Unavailable),
                Some("LOADING") => Some(ModelState::Loading),
                _ => None,
            };
            if let Some(state) = state {
                unavailable.push(RepoEntry {
                    name: e.name.clone(),
                    version: e.version.clone().filter(|v| !v.is_empty()),
                    state,
                    reason: e.reason.clone().unwrap_or_default(),
                });
            }
            // An entry without a state is a model the server has but did not say it loaded;
            // its readiness probe decides.
            let said_ready = e.state.as_deref().map(|s| s.eq_ignore_ascii_case("READY"));
            let ready = said_ready != Some(false);
            let version = e.version.as_ref().filter(|v| !v.is_empty());
            if let (Some(true), Some(v)) = (said_ready, version) {
                let versions = ready_versions.entry(e.name.clone()).or_default();
                if !versions.contains(v) {
                    versions.push(v.clone());
                }
            }
            match names.iter_mut().find(|(n, _)| *n == e.name) {
                Some((_, r)) => *r |= ready,
                None => names.push((e.name, ready)),
            }
        }
        Listed {
            names,
            ready_versions,
            from_index: true,
            unavailable,
            source: source.to_string(),
        }
    }

    fn from_names(models: Vec<String>, source: &str) -> Listed {
        let mut names: Vec<(String, bool)> = Vec::new();
        for m in models {
            if !names.iter().any(|(n, _)| *n == m) {
                names.push((m, true));
            }
        }
        Listed {
            names,
            ready_versions: HashMap::new(),
            from_index: false,
            unavailable: Vec::new(),
            source: source.to_string(),
        }
    }
}

/// Whether `e`, or an error under it, says the connection ended before any byte of a
/// response arrived: hyper's "connection closed before message completed", or a reset,
/// abort or broken pipe underneath. Both clients return only once a response head arrived,
/// so an error here means none did.
fn closed_before_answer(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl Backend for HttpBackend {
    fn in_process(&self) -> bool {
        false
    }

    fn server_metadata(&self) -> BoxFuture<'_, Result<ServerMetadata, BackendError>> {
        Box::pin(self.get_json("/v2"))
    }

    fn models<'a>(
        &'a self,
        configured: &'a [String],
    ) -> BoxFuture<'a, Result<ModelList, BackendError>> {
        Box::pin(async move {
            let listed = match self.listed_models().await? {
                Ok(listed) => listed,
                Err(tried) if configured.is_empty() => {
                    return Ok(ModelList {
                        tried: format!(
                            "{tried}; and the config names no models for it ([[backends]] models = [...])"
                        ),
                        ..ModelList::default()
                    })
                }
                Err(tried) => Listed {
                    names: configured.iter().map(|n| (n.clone(), true)).collect(),
                    ready_versions: HashMap::new(),
                    from_index: false,
                    unavailable: Vec::new(),
                    source: format!("{tried}; so the models the config names for it"),
                },
            };
            let mut out = ModelList {
                answers_index: listed.from_index,
                unavailable: listed.unavailable,
                ..ModelList::default()
            };
            let mut refused = Vec::new();
            // Models the config does not use from this backend are not asked about at all.
            let wanted = listed
                .names
                .into_iter()
                .filter(|(name, _)| configured.is_empty() || configured.contains(name));
            for (name, listed_ready) in wanted {
                let path = format!("/v2/models/{}", path_segment(&name));
                // One model that does not answer (loading, a reset) costs that model, not
                // the backend's others.
                let (status, body) = match self.call(Method::GET, &path, None).await {
                    Ok(answer) => answer,
                    Err(e) => {
                        tracing::warn!(backend = %self.base, model = %name, error = ?e, "model metadata did not arrive; the model is kept as it was, not ready, this round");
                        refused.push(format!("GET {path} failed"));
                        out.unanswered.push(name);
                        continue;
                    }
                };
                if !status.is_success() {
                    refused.push(format!("GET {path} answered {status}"));
                    continue;
                }
                // One model's unreadable metadata costs that model, not the backend's others.
                let (metadata, tolerated) = match ModelMetadata::from_backend(&body) {
                    Ok(read) => read,
                    Err(e) => {
                        tracing::warn!(backend = %self.base, model = %name, error = %e, "model metadata is not valid; the model is not used");
                        refused.push(format!(
                            "GET {path} answered metadata that is not valid ({e})"
                        ));
                        continue;
                    }
                };
                out.tolerated.extend(tolerated.iter());
                let mut metadata = metadata;
                if metadata.versions.is_empty() {
                    if let Some(versions) = listed.ready_versions.get(&name) {
                        metadata.versions = versions.clone();
                        out.tolerated.push(Tolerance::VersionsFromIndex);
                    }
                }
                let ready = listed_ready && self.model_ready(&name).await;
                // Asked of a ready model only: one that is loading may not answer yet.
                let stated = match ready {
                    true => self.stated_config(&name).await,
                    false => None,
                };
                out.models.push(DiscoveredModel {
                    metadata,
                    ready,
                    stated,
                });
            }
            if out.models.is_empty() {
                out.tried = if refused.is_empty() {
                    format!("{} lists no models", listed.source)
                } else {
                    format!("{} lists models, but {}", listed.source, refused.join(", "))
                };
            }
            Ok(out)
        })
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let (status, _) = self.call(Method::GET, "/v2/health/ready", None).await?;
            if status.is_success() {
                Ok(())
            } else {
                // An answer, not a lost probe: the fleet acts on it at once.
                Err(BackendError::Status {
                    status,
                    message: format!("GET /v2/health/ready on {} answered {status}", self.base),
                })
            }
        })
    }

    fn control<'a>(
        &'a self,
        model: &'a str,
        action: RepositoryAction,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let path = format!(
                "/v2/repository/models/{}/{}",
                path_segment(model),
                action.as_str()
            );
            let req = Request::builder()
                .method(Method::POST)
                .uri(self.uri(&path))
                .header(header::CONTENT_TYPE, "application/json")
                .body(full("{}"))
                .map_err(|e| BackendError::Failed(e.to_string()))?;
            let resp = self.send(req).await?;
            let status = resp.status();
            let body = self.small_body(resp, &path).await?;
            if status.is_success() {
                Ok(())
            } else {
                Err(BackendError::Status {
                    status,
                    message: error_message(&body),
                })
            }
        })
    }

    fn infer<'a>(&'a self, call: InferCall<'a>) -> BoxFuture<'a, Result<Reply, BackendError>> {
        Box::pin(async move {
            let Payload::Wire(body) = call.payload else {
                return Err(BackendError::Failed(
                    "an HTTP backend takes encoded requests".into(),
                ));
            };
            let uri = self.infer_uri(call.model, call.version)?;
            // Built in place: `Request::builder` converts and checks each header again,
            // which values already typed need not (a few percent of a small request).
            let mut headers = http::HeaderMap::with_capacity(4);
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(body.content_type),
            );
            if let Some(n) = body.header_length {
                headers.insert(
                    crate::headers::INFERENCE_HEADER_CONTENT_LENGTH,
                    HeaderValue::from(n as u64),
                );
            }
            for (k, v) in call.headers {
                headers.append(k, v.clone());
            }
            let mut req = Request::new(PartsBody::new(body.parts).boxed_unsync());
            *req.method_mut() = Method::POST;
            *req.uri_mut() = uri;
            *req.headers_mut() = headers;
            let resp = self.send_infer(req).await?;
            let (parts, body) = resp.into_parts();
            Ok(Reply::Http {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::backend::Backend;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A backend that answers the first request on each connection with keep-alive, then
    /// closes the connection as soon as a second request arrives on it, without answering:
    /// what a client sees when it reuses a connection the server is closing for idleness.
    async fn closes_reused_connections() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if read_head(&mut sock).await.is_none() {
                        return;
                    }
                    let mut buf = vec![0u8; 4096];
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if sock.write_all(ok).await.is_err() {
                        return;
                    }
                    let _ = sock.read(&mut buf).await;
                    // Dropped here: closed without an answer.
                });
            }
        });
        (format!("http://{addr}"), accepted)
    }

    /// What a client sent up to the end of its request head; `None` if it closed first.
    async fn read_head(sock: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        let mut seen = Vec::new();
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        Some(seen)
    }

    /// A server that lists model `m` in its index and closes every connection that asks for
    /// anything else without an answer: a backend going down between its index and a
    /// model's metadata.
    async fn lists_m_then_goes_silent() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Some(seen) = read_head(&mut sock).await else {
                        return;
                    };
                    if seen.starts_with(b"POST /v2/repository/index ") {
                        let index = br#"[{"name":"m","version":"1","state":"READY"}]"#;
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            index.len()
                        );
                        let _ = sock.write_all(head.as_bytes()).await;
                        let _ = sock.write_all(index).await;
                    }
                    // Anything else: closed without an answer.
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_listed_model_whose_metadata_gets_no_answer_is_named_as_unanswered() {
        let url = lists_m_then_goes_silent().await;
        let tls = crate::tls::client_config(&Default::default()).unwrap();
        let client = new_client(Duration::from_secs(1), Duration::from_secs(60), tls);
        let backend = HttpBackend::new(&url, client, Duration::from_secs(5));
        let list = backend.models(&[]).await.unwrap();
        assert_eq!(list.unanswered, ["m"]);
        assert!(list.models.is_empty());
        assert_eq!(
            list.tried,
            "POST /v2/repository/index lists models, but GET /v2/models/m failed"
        );
    }

    #[tokio::test]
    async fn infer_uris_are_encoded_and_cached_per_model() {
        let tls = crate::tls::client_config(&Default::default()).unwrap();
        let client = new_client(Duration::from_secs(1), Duration::from_secs(60), tls);
        let backend = HttpBackend::new("http://127.0.0.1:9/", client, Duration::from_secs(5));
        let uri = backend.infer_uri("a b/c", None).unwrap();
        assert_eq!(uri, "http://127.0.0.1:9/v2/models/a%20b%2Fc/infer");
        assert_eq!(backend.infer_uri("a b/c", None).unwrap(), uri);
        assert_eq!(
            backend.infer_uri("m", Some("2")).unwrap(),
            "http://127.0.0.1:9/v2/models/m/versions/2/infer"
        );
        // Versions are not cached; each model once.
        assert_eq!(backend.infer_uris.len(), 1);
    }

    #[tokio::test]
    async fn a_probe_on_a_connection_the_backend_closed_is_retried_once() {
        let (url, accepted) = closes_reused_connections().await;
        let tls = crate::tls::client_config(&Default::default()).unwrap();
        let client = new_client(Duration::from_secs(1), Duration::from_secs(60), tls);
        let backend = HttpBackend::new(&url, client, Duration::from_secs(5));
        backend.ready().await.unwrap();
        // Reuses the pooled connection, which the backend closes; the retry opens another.
        backend.ready().await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
