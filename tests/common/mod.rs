//! Helpers shared by the integration tests: gateways started in-process on 127.0.0.1:0
//! (over the built-in backend, or in front of a worker over HTTP), request bodies in every
//! encoding, and responses decoded with the crate's own protocol layer.

#![allow(dead_code)]

use std::net::SocketAddr;

use bytes::Bytes;
use serde_json::{json, Value};
use tensorgate::config::Config;
use tensorgate::protocol::rest::decode::decode_response;
use tensorgate::protocol::{DataType, InferResponse, Limits, Tensor};
use tensorgate::run::{self, Running};

/// How the gateway under test reaches the built-in models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// The models run inside the gateway (the `builtin` backend).
    Builtin,
    /// The gateway forwards over HTTP to a `tensorgate worker` started in the same process.
    Worker,
    /// The same, with the backend set to `encoding = "json"`, as for a server without the
    /// binary extension: every request and response is transcoded through JSON.
    JsonWorker,
}

impl Topology {
    pub const ALL: [Topology; 3] = [Topology::Builtin, Topology::Worker, Topology::JsonWorker];

    /// The name the gateway reports in `x-tensorgate-backend`.
    pub fn backend_name(self) -> &'static str {
        match self {
            Topology::Builtin => "builtin",
            Topology::Worker | Topology::JsonWorker => "backend-0",
        }
    }
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid address")
}

/// The embedded default config (every built-in model in-process), listening on 127.0.0.1:0.
pub fn builtin_config() -> Config {
    let mut c = Config::embedded_default();
    c.server.listen = loopback();
    c.server.metrics_listen = Some(loopback());
    c.server.grpc_listen = Some(loopback());
    c
}

/// Starts a standalone worker (all built-in models) on 127.0.0.1:0.
pub async fn start_worker() -> Running {
    run::start(Config::worker(loopback(), &[]), false)
        .await
        .expect("the worker starts")
}

/// A gateway config whose only backend is `url`.
pub fn front_config(url: &str) -> Config {
    let mut c = builtin_config();
    c.set_backends(&[url.to_string()])
        .expect("the backend URL is valid");
    c
}

/// A running gateway, the worker behind it (if any), and a client.
pub struct Env {
    pub topology: Topology,
    pub gateway: Running,
    pub worker: Option<Running>,
    pub base: String,
    pub client: reqwest::Client,
}

/// Starts a gateway in the given topology with the default config.
pub async fn start(topology: Topology) -> Env {
    start_with(topology, |_| {}).await
}

/// Starts a gateway in the given topology; `adjust` may change its config (limits).
pub async fn start_with(topology: Topology, adjust: impl FnOnce(&mut Config)) -> Env {
    let (mut config, worker) = match topology {
        Topology::Builtin => (builtin_config(), None),
        Topology::Worker | Topology::JsonWorker => {
            let w = start_worker().await;
            let mut c = front_config(&format!("http://{}", w.addr));
            if topology == Topology::JsonWorker {
                c.backends[0].encoding = tensorgate::config::Encoding::Json;
            }
            (c, Some(w))
        }
    };
    adjust(&mut config);
    let gateway = run::start(config, false).await.expect("the gateway starts");
    Env::new(topology, gateway, worker)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .expect("a reqwest client")
}

impl Env {
    pub fn new(topology: Topology, gateway: Running, worker: Option<Running>) -> Env {
        Env {
            topology,
            base: format!("http://{}", gateway.addr),
            gateway,
            worker,
            client: client(),
        }
    }

    pub async fn shutdown(self) {
        drop(self.client);
        self.gateway.shutdown().await;
        if let Some(w) = self.worker {
            w.shutdown().await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let resp = req.send().await.expect("the request is answered");
        Reply::read(resp).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.client.get(self.url(path))).await
    }

    /// POSTs `body` with its `Inference-Header-Content-Length` (if any).
    pub async fn post(&self, path: &str, body: &Body) -> Reply {
        self.send(body.apply(self.client.post(self.url(path))))
            .await
    }

    pub async fn infer(&self, model: &str, body: &Body) -> Reply {
        self.post(&format!("/v2/models/{model}/infer"), body).await
    }

    /// Infers with a JSON body.
    pub async fn infer_json(&self, model: &str, v: &Value) -> Reply {
        self.infer(model, &json_body(v)).await
    }
}

/// A request body and the `Inference-Header-Content-Length` that goes with it.
#[derive(Debug, Clone)]
pub struct Body {
    pub bytes: Vec<u8>,
    pub header_length: Option<usize>,
}

impl Body {
    pub fn apply(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let mut req = req.body(self.bytes.clone());
        match self.header_length {
            Some(n) => {
                req = req
                    .header("Inference-Header-Content-Length", n.to_string())
                    .header("Content-Type", "application/octet-stream");
            }
            None => req = req.header("Content-Type", "application/json"),
        }
        req
    }
}

/// A pure JSON body (no IHCL header).
pub fn json_body(v: &Value) -> Body {
    Body {
        bytes: serde_json::to_vec(v).expect("JSON serializes"),
        header_length: None,
    }
}

/// A JSON header followed by binary chunks, with IHCL set to the header's length.
pub fn binary_body(header: &Value, chunks: &[&[u8]]) -> Body {
    let mut bytes = serde_json::to_vec(header).expect("JSON serializes");
    let header_length = bytes.len();
    for c in chunks {
        bytes.extend_from_slice(c);
    }
    Body {
        bytes,
        header_length: Some(header_length),
    }
}

/// A raw binary body: IHCL 0, the whole body is the data of the model's only input.
pub fn raw_body(data: &[u8]) -> Body {
    Body {
        bytes: data.to_vec(),
        header_length: Some(0),
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub async fn read(resp: reqwest::Response) -> Reply {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.expect("the body is read");
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn content_type(&self) -> Option<&str> {
        self.header("content-type")
    }

    pub fn header_length(&self) -> Option<usize> {
        self.header("inference-header-content-length")
            .map(|v| v.parse().expect("IHCL is a number"))
    }

    /// The whole body as JSON (for JSON responses).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The JSON part of the body (all of it without IHCL).
    pub fn json_header(&self) -> Value {
        let n = self.header_length().unwrap_or(self.body.len());
        serde_json::from_slice(&self.body[..n]).expect("the JSON header parses")
    }

    /// The `error` of an error body.
    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| {
                panic!(
                    "no error message in {}",
                    String::from_utf8_lossy(&self.body)
                )
            })
            .to_string()
    }

    /// Asserts a 200 and decodes the inference response with its IHCL.
    pub fn decode(&self) -> InferResponse {
        assert_eq!(
            self.status,
            200,
            "unexpected status; body: {}",
            String::from_utf8_lossy(&self.body)
        );
        let hl = self
            .headers
            .get("inference-header-content-length")
            .map(|v| v.as_bytes());
        decode_response(&self.body, hl, &Limits::default()).expect("the response decodes")
    }

    /// Asserts the status and the exact error message.
    #[track_caller]
    pub fn assert_error(&self, status: u16, message: &str) {
        assert_eq!(
            self.status,
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(self.error(), message);
    }

    /// Asserts the headers of a JSON response: `application/json`, no IHCL.
    #[track_caller]
    pub fn assert_json_response(&self) {
        assert_eq!(self.content_type(), Some("application/json"));
        assert_eq!(self.header_length(), None);
    }

    /// Asserts the headers of a binary response: octet-stream and an IHCL that is the length
    /// of the JSON part.
    #[track_caller]
    pub fn assert_binary_response(&self) {
        assert_eq!(self.content_type(), Some("application/octet-stream"));
        let n = self.header_length().expect("a binary response has IHCL");
        assert!(n < self.body.len(), "IHCL {n} of {}", self.body.len());
        serde_json::from_slice::<Value>(&self.body[..n]).expect("IHCL ends the JSON part");
    }
}

/// The output named `name` of a response.
pub fn output<'a>(resp: &'a InferResponse, name: &str) -> &'a Tensor {
    resp.outputs
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no output {name} in {resp:?}"))
}

/// Test data for one tensor: its bytes in the binary layout and its JSON `data`.
#[derive(Debug, Clone)]
pub struct TestTensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<u64>,
    /// Little-endian elements; BYTES framed with 4-byte lengths.
    pub data: Vec<u8>,
    /// The flat JSON `data` array.
    pub json: Vec<Value>,
}

impl TestTensor {
    /// The input as a JSON tensor.
    pub fn json_input(&self) -> Value {
        json!({
            "name": self.name,
            "datatype": self.datatype.as_str(),
            "shape": self.shape,
            "data": self.json,
        })
    }

    /// The input as a binary tensor (its bytes go in the body after the JSON).
    pub fn binary_input(&self) -> Value {
        json!({
            "name": self.name,
            "datatype": self.datatype.as_str(),
            "shape": self.shape,
            "parameters": { "binary_data_size": self.data.len() },
        })
    }

    /// Asserts that `t` holds exactly this tensor's data, type and shape (under `name`).
    #[track_caller]
    pub fn assert_same(&self, t: &Tensor, name: &str) {
        assert_eq!(t.name, name);
        assert_eq!(t.datatype, self.datatype, "datatype of {name}");
        assert_eq!(t.shape, self.shape, "shape of {name}");
        assert_eq!(
            &t.data[..],
            &self.data[..],
            "data of {name} ({})",
            self.datatype
        );
    }
}

/// Strings that exercise JSON escaping and UTF-8.
const STRING_PIECES: &[&str] = &[
    "a", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "\u{1}", "é", "日本", "🦀", "ok", "",
];

fn random_string(rng: &mut fastrand::Rng) -> String {
    let n = rng.usize(0..6);
    (0..n)
        .map(|_| STRING_PIECES[rng.usize(..STRING_PIECES.len())])
        .collect()
}

/// A random finite value of a float type, from random bits (so subnormals, -0.0 and extreme
/// exponents all occur), as the f64 that holds it exactly.
fn random_float(rng: &mut fastrand::Rng, dt: DataType) -> (Vec<u8>, f64) {
    loop {
        let (bytes, v) = match dt {
            DataType::Fp16 => {
                let h = half::f16::from_bits(rng.u16(..));
                (h.to_le_bytes().to_vec(), h.to_f64())
            }
            DataType::Bf16 => {
                let h = half::bf16::from_bits(rng.u16(..));
                (h.to_le_bytes().to_vec(), h.to_f64())
            }
            DataType::Fp32 => {
                let f = f32::from_bits(rng.u32(..));
                (f.to_le_bytes().to_vec(), f as f64)
            }
            DataType::Fp64 => {
                let f = f64::from_bits(rng.u64(..));
                (f.to_le_bytes().to_vec(), f)
            }
            _ => unreachable!("not a float type"),
        };
        if v.is_finite() {
            return (bytes, v);
        }
    }
}

/// A tensor of random elements of `dt` (UTF-8 strings with escapes for BYTES).
pub fn random_tensor(
    rng: &mut fastrand::Rng,
    name: &str,
    dt: DataType,
    shape: &[u64],
) -> TestTensor {
    let count: u64 = shape.iter().product();
    let mut data = Vec::new();
    let mut values = Vec::new();
    for _ in 0..count {
        let v = match dt {
            DataType::Bool => {
                let b = rng.bool();
                data.push(b as u8);
                json!(b)
            }
            DataType::Uint8 => {
                let x = rng.u8(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Uint16 => {
                let x = rng.u16(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Uint32 => {
                let x = rng.u32(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Uint64 => {
                let x = rng.u64(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Int8 => {
                let x = rng.i8(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Int16 => {
                let x = rng.i16(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Int32 => {
                let x = rng.i32(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Int64 => {
                let x = rng.i64(..);
                data.extend_from_slice(&x.to_le_bytes());
                json!(x)
            }
            DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64 => {
                let (bytes, v) = random_float(rng, dt);
                data.extend_from_slice(&bytes);
                json!(v)
            }
            DataType::Bytes => {
                let s = random_string(rng);
                data.extend_from_slice(&(s.len() as u32).to_le_bytes());
                data.extend_from_slice(s.as_bytes());
                json!(s)
            }
        };
        values.push(v);
    }
    TestTensor {
        name: name.to_string(),
        datatype: dt,
        shape: shape.to_vec(),
        data,
        json: values,
    }
}

/// An INT32 tensor with the given values.
pub fn int32_tensor(name: &str, shape: &[u64], values: &[i32]) -> TestTensor {
    TestTensor {
        name: name.to_string(),
        datatype: DataType::Int32,
        shape: shape.to_vec(),
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        json: values.iter().map(|v| json!(v)).collect(),
    }
}

/// The INT32 elements of a tensor.
pub fn int32s(t: &Tensor) -> Vec<i32> {
    assert_eq!(t.datatype, DataType::Int32);
    t.data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// The FP32 elements of a tensor.
pub fn fp32s(t: &Tensor) -> Vec<f32> {
    assert_eq!(t.datatype, DataType::Fp32);
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// A valid JSON request for `simple` (one batch row of 16).
pub fn simple_request(a: &[i32], b: &[i32]) -> Value {
    json!({
        "inputs": [
            int32_tensor("INPUT0", &[1, 16], a).json_input(),
            int32_tensor("INPUT1", &[1, 16], b).json_input(),
        ]
    })
}

/// A body compressed as HTTP's `deflate` coding: zlib format (RFC 1950).
pub fn deflate(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("deflate to memory");
    e.finish().expect("deflate to memory")
}

pub fn inflate(data: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(data)
        .read_to_end(&mut out)
        .expect("valid deflate (zlib) data");
    out
}

/// A body compressed with gzip.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("gzip to memory");
    e.finish().expect("gzip to memory")
}

pub fn gunzip(data: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

/// Serves `handler` on 127.0.0.1 (HTTP/1.1 and h2), a stand-in for a v2 backend whose
/// every answer a test scripts; returns its address.
pub async fn serve_fn<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<
            Output = Result<hyper::Response<http_body_util::Full<Bytes>>, std::convert::Infallible>,
        > + Send
        + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    hyper::service::service_fn(handler),
                )
                .await;
            });
        }
    });
    addr
}
