//! The TOML configuration: every key, its default, and the checks `check-config` runs.
//! `config/tensorgate.toml` is the commented example and the embedded default.

mod check;
pub mod redis_url;
mod restart;
pub mod tokens;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub use check::{
    check_log_filter, error_at_key, error_at_path, parse_and_check, unreadable_files, ConfigError,
    MAX_WORKER_THREADS,
};
pub use restart::keep_restart_only;

/// The default config, embedded so that `tensorgate serve` runs with no files around it.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/tensorgate.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub fleet: FleetConfig,
    #[serde(default)]
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
    #[serde(default)]
    pub auth: AuthConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_listen", deserialize_with = "address")]
    pub listen: SocketAddr,
    /// Address of the Prometheus /metrics listener; `""` (None) turns it off.
    #[serde(
        default = "default_metrics_listen",
        deserialize_with = "optional_address"
    )]
    pub metrics_listen: Option<SocketAddr>,
    /// Address of the v2 gRPC listener; `""` (None) turns it off.
    #[serde(default = "default_grpc_listen", deserialize_with = "optional_address")]
    pub grpc_listen: Option<SocketAddr>,
    /// Log level filter (tracing syntax); `RUST_LOG` overrides it.
    #[serde(default = "default_log_level")]
    pub log_level: String,
    #[serde(default)]
    pub log_format: LogFormat,
    /// Name reported in server metadata.
    #[serde(default = "default_server_name")]
    pub name: String,
    /// Expose Triton's `nv_inference_*` series (their names predate Prometheus' naming
    /// rules, so promtool's lint flags them).
    #[serde(default = "default_true")]
    pub triton_metrics: bool,
    /// TLS on the v2 listener; absent means plain HTTP.
    #[serde(default)]
    pub tls: Option<ServerTls>,
    /// Threads that serve requests; 0 means `TOKIO_WORKER_THREADS`, else one per core. With
    /// 1 the process runs a single-threaded runtime, which skips the multi-threaded
    /// scheduler's cross-thread bookkeeping on every wake-up.
    #[serde(default)]
    pub worker_threads: usize,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA bundle: when set, clients must present a certificate it signed (mTLS).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendTls {
    /// PEM CA bundle that https:// backends must chain to (default: the Mozilla roots).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// Client certificate and key presented to backends that ask for one.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinStoreKind {
    /// Each replica pins the sequences it sees, in its own memory.
    #[default]
    Memory,
    /// Pins live in Redis, one fact that every replica pointed at it reads.
    Redis,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PinsConfig {
    pub store: PinStoreKind,
    /// `redis://[:password@]host:port[/db]`, or `rediss://` for TLS (checked against
    /// Mozilla's roots and the system's). Required with `store = "redis"`.
    pub url: Option<String>,
    /// The name of an environment variable that holds the URL instead (from a Kubernetes
    /// Secret, so that a password need not sit in the config).
    pub url_env: Option<String>,
    /// PEM CA bundle that a `rediss://` server's certificate must chain to, for a Redis
    /// whose certificate a private CA signed.
    pub ca: Option<PathBuf>,
    /// Prefix of every key, so that several gateways (or other users) can share one Redis.
    pub key_prefix: String,
    /// Bound of every Redis operation, connecting included. Past it the request is routed as
    /// if Redis were not there (by the hash table and the past owners), never failed.
    pub timeout_ms: u64,
}

impl Default for PinsConfig {
    fn default() -> Self {
        PinsConfig {
            store: PinStoreKind::Memory,
            url: None,
            url_env: None,
            ca: None,
            key_prefix: "tensorgate:pin:".into(),
            timeout_ms: 50,
        }
    }
}

impl PinsConfig {
    /// The Redis URL, from `url` or from the variable `url_env` names.
    pub fn resolve_url(&self) -> Result<Option<String>, String> {
        match (&self.url, &self.url_env) {
            (Some(url), _) => Ok(Some(url.clone())),
            (None, Some(var)) => std::env::var(var)
                .map(Some)
                .map_err(|_| format!("fleet.pins.url_env names {var}, which is not set")),
            (None, None) => Ok(None),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// File with one accepted bearer token per line.
    #[serde(default)]
    pub tokens_file: Option<PathBuf>,
    /// Environment variable with accepted tokens, separated by commas or newlines.
    #[serde(default)]
    pub tokens_env: Option<String>,
}

impl AuthConfig {
    pub fn enabled(&self) -> bool {
        self.tokens_file.is_some() || self.tokens_env.is_some()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Plain,
    Json,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            metrics_listen: default_metrics_listen(),
            grpc_listen: default_grpc_listen(),
            log_level: default_log_level(),
            log_format: LogFormat::Plain,
            name: default_server_name(),
            triton_metrics: true,
            tls: None,
            worker_threads: 0,
        }
    }
}

fn default_listen() -> SocketAddr {
    "0.0.0.0:8000".parse().expect("valid address")
}
fn default_metrics_listen() -> Option<SocketAddr> {
    Some("0.0.0.0:8002".parse().expect("valid address"))
}
fn default_grpc_listen() -> Option<SocketAddr> {
    Some("0.0.0.0:8001".parse().expect("valid address"))
}

/// An address, or `""` for none.
pub fn parse_optional_address(text: &str) -> Result<Option<SocketAddr>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|e| {
        format!("'{text}' is not an address (IP:port, or \"\" for none; host names are not resolved): {e}")
    })
}

fn address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(|e| {
        serde::de::Error::custom(format!(
            "'{text}' is not an address (IP:port, such as 0.0.0.0:8000 or [::]:8000; host names are not resolved): {e}"
        ))
    })
}

fn optional_address<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    parse_optional_address(&text).map_err(serde::de::Error::custom)
}
fn default_log_level() -> String {
    "info".into()
}
fn default_true() -> bool {
    true
}

fn default_server_name() -> String {
    "tensorgate".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request body, after decompression (413 beyond).
    pub max_body_bytes: usize,
    /// Largest JSON part of a body (413 beyond).
    pub max_json_bytes: usize,
    /// Deepest nesting of a tensor's `data` array (400 beyond).
    pub max_json_depth: usize,
    /// Most elements per tensor (413 beyond).
    pub max_tensor_elements: u64,
    /// Default deadline of an inference request; the v2 `timeout` parameter may shorten it.
    pub request_timeout_ms: u64,
    /// Largest request head (request line and headers); 431 beyond.
    pub max_header_bytes: usize,
    /// Requests handled at once; beyond it they are shed with 503 and Retry-After.
    pub max_concurrent_requests: usize,
    /// Client connections open at once over the REST and gRPC listeners; beyond it new ones
    /// wait in the listen queue. 0: what the open-file limit leaves after the gateway's own
    /// needs (`run::connection_cap`).
    pub max_connections: usize,
    /// Time to receive a request's headers, which is also how long an idle HTTP/1
    /// keep-alive connection is kept.
    pub header_read_timeout_ms: u64,
    /// Time to receive a request's body (408 beyond), a gRPC unary call's message, or one
    /// message of a gRPC stream from its first bytes (DEADLINE_EXCEEDED beyond).
    pub body_read_timeout_ms: u64,
    /// How long a write to a client may wait without progress before the connection is
    /// closed: a client that stops reading an answer does not hold it for ever.
    pub send_timeout_ms: u64,
    /// How long a gRPC ModelStreamInfer stream may send no message while it awaits no answer
    /// before it ends with UNAVAILABLE; 0: as long as its connection lives.
    pub stream_idle_timeout_ms: u64,
    /// Request bodies held in memory at once, across all requests (503 beyond); 0: half the
    /// memory the process may use (its cgroup's limit, else the machine's).
    pub max_buffered_body_bytes: usize,
    /// After SIGTERM, how long readiness reports 503 while requests are still accepted,
    /// so that load balancers stop sending before the listener closes.
    pub shutdown_delay_ms: u64,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub drain_timeout_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_body_bytes: 256 << 20,
            max_json_bytes: 64 << 20,
            max_json_depth: 64,
            max_tensor_elements: 1 << 28,
            request_timeout_ms: 60_000,
            max_header_bytes: 64 << 10,
            max_concurrent_requests: 1024,
            max_connections: 0,
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            stream_idle_timeout_ms: 300_000,
            max_buffered_body_bytes: 0,
            shutdown_delay_ms: 0,
            drain_timeout_ms: 30_000,
        }
    }
}

impl LimitsConfig {
    pub fn protocol(&self) -> crate::protocol::Limits {
        crate::protocol::Limits {
            max_json_bytes: self.max_json_bytes,
            max_json_depth: self.max_json_depth,
            max_tensor_elements: self.max_tensor_elements,
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// How often backends' metadata, models and health are refreshed.
    pub refresh_interval_ms: u64,
    /// Deadline of one metadata or health call to a backend.
    pub probe_timeout_ms: u64,
    /// Consecutive health checks without an answer (connection failure, timeout) after
    /// which a reachable backend is marked unreachable (at least 1). An answer of "not
    /// ready" takes effect at once, and one success marks it reachable again.
    pub unhealthy_after_checks: u32,
    /// Deadline for opening a connection to a backend.
    pub connect_timeout_ms: u64,
    /// Idle pooled connections to backends are dropped after this long (0: no pooling).
    /// Keep it below the backends' own keep-alive timeout (uvicorn, under MLServer and
    /// KServe, closes after 5 s), or a request may meet a connection the backend is closing.
    pub pool_idle_timeout_ms: u64,
    /// How often DNS backends (`discovery = "dns"`) are resolved again.
    pub dns_interval_ms: u64,
    /// Consecutive connection failures or 5xx answers after which a backend is ejected.
    pub eject_after_failures: u32,
    /// First ejection lasts this long; each further one doubles it, up to `eject_max_ms`.
    pub eject_base_ms: u64,
    pub eject_max_ms: u64,
    /// Slots of each consistent-hash table: a prime from 1,009 to 16,777,213. Every replica
    /// must use the same size, and changing it re-maps sequences that have no pin.
    #[serde(deserialize_with = "table_size")]
    pub hash_table_size: usize,
    /// A sequence's pin is dropped after this long without requests; at least as long as
    /// the backends keep an idle sequence's state, or a fleet change strands it.
    pub sequence_idle_timeout_ms: u64,
    /// Most live sequence pins; beyond it, new sequences are routed by hash alone.
    pub max_sequences: usize,
    /// Watch the config file and reload it when it changes (SIGHUP always reloads).
    pub watch_config: bool,
    /// TLS for https:// backends.
    pub tls: BackendTls,
    /// Where sequence pins live: this replica's memory, or a Redis that every replica shares.
    pub pins: PinsConfig,
}

fn table_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let size = usize::deserialize(d)?;
    if crate::routing::table::is_valid_table_size(size) {
        Ok(size)
    } else {
        Err(serde::de::Error::custom(format!(
            "hash_table_size must be from 1009 to 16777213, not {size}"
        )))
    }
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            refresh_interval_ms: 5_000,
            probe_timeout_ms: 2_000,
            unhealthy_after_checks: 2,
            connect_timeout_ms: 1_000,
            pool_idle_timeout_ms: 4_000,
            dns_interval_ms: 10_000,
            eject_after_failures: 3,
            eject_base_ms: 1_000,
            eject_max_ms: 30_000,
            hash_table_size: crate::routing::table::DEFAULT_TABLE_SIZE,
            sequence_idle_timeout_ms: 300_000,
            max_sequences: 1_000_000,
            watch_config: true,
            tls: BackendTls::default(),
            pins: PinsConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Binary if the backend lists `binary_tensor_data` in its server metadata, else JSON.
    #[default]
    Auto,
    Json,
    Binary,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub name: Spanned<String>,
    /// `http://host:port` of a v2 server, or `builtin` for the in-process models.
    pub url: Spanned<String>,
    #[serde(default)]
    pub encoding: Encoding,
    /// Only these models are used from this backend; empty means all it reports.
    #[serde(default)]
    pub models: Vec<String>,
    /// Who applies the classification extension for requests sent to this backend.
    #[serde(default)]
    pub classification: ClassificationMode,
    /// `"dns"`: every address the URL's host resolves to is a backend of its own (for a
    /// Kubernetes headless Service), re-resolved every `fleet.dns_interval_ms`.
    #[serde(default)]
    pub discovery: Discovery,
    /// Share of sequences and load relative to other backends (default 1).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// With `url = "builtin"`: a Triton-style model repository whose ONNX models are served
    /// in-process beside the built-in ones (`tensorgate serve --model-repository DIR`).
    #[serde(default)]
    pub model_repository: Option<PathBuf>,
}

fn default_weight() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Discovery {
    /// The URL is one backend.
    #[default]
    Static,
    /// One backend per address the host resolves to.
    Dns,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClassificationMode {
    /// The backend if it lists `classification` in its server metadata, else the gateway.
    /// An output whose labels the config names is classified by the gateway, with them.
    #[default]
    Auto,
    /// Always the gateway: the backend is asked for the raw tensor.
    Gateway,
    /// Always the backend: the parameter is passed on unchanged.
    Backend,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Classification label files per output: `{ OUTPUT0 = "config/labels/classifier.txt" }`.
    #[serde(default)]
    pub labels: BTreeMap<String, PathBuf>,
    /// Default deadline of this model's inference requests (overrides the limits' default).
    pub timeout_ms: Option<u64>,
    /// Built-in sequence models: drop a sequence's state after this long without requests.
    pub sequence_idle_timeout_ms: Option<u64>,
    /// A request outside any sequence whose backend connection closed before any answer is
    /// sent once more, to another backend (default true).
    pub retry_idempotent: Option<bool>,
}

impl Config {
    /// The embedded default: every built-in model in-process, ports 8000 and 8002.
    pub fn embedded_default() -> Config {
        parse_and_check(DEFAULT_CONFIG).expect("the embedded config is valid")
    }

    pub fn load(path: &Path) -> Result<Config, Vec<ConfigError>> {
        Config::load_with_text(path).map(|(config, _)| config)
    }

    /// The config and the text it was read from (for the lines of later messages).
    pub fn load_with_text(path: &Path) -> Result<(Config, String), Vec<ConfigError>> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![ConfigError {
                line: None,
                message: format!("cannot read {}: {e}", path.display()),
            }]
        })?;
        parse_and_check(&text).map(|config| (config, text))
    }

    /// Replaces the backends with the `--backend` URLs of the command line.
    pub fn set_backends(&mut self, urls: &[String]) -> Result<(), Vec<ConfigError>> {
        let text: String = urls
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let name = if u == "builtin" {
                    "builtin".to_string()
                } else {
                    format!("backend-{i}")
                };
                format!("[[backends]]\nname = {name:?}\nurl = {u:?}\n")
            })
            .collect();
        let parsed = parse_and_check(&text)?;
        self.backends = parsed.backends;
        Ok(())
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.get(name)
    }

    /// Serves the ONNX models of `dir` from the built-in backend (`--model-repository`).
    pub fn set_model_repository(&mut self, dir: &std::path::Path) -> Result<(), String> {
        let builtin = self
            .backends
            .iter_mut()
            .find(|b| b.url.get_ref() == "builtin")
            .ok_or("--model-repository needs the built-in backend, which runs the models in-process: add --backend builtin, or a [[backends]] entry with url = \"builtin\"")?;
        builtin.model_repository = Some(dir.to_path_buf());
        Ok(())
    }
}

impl Config {
    /// The config of `tensorgate worker`: the built-in models (all, or `models`) on `listen`.
    pub fn worker(listen: SocketAddr, models: &[String]) -> Config {
        let mut c = Config::embedded_default();
        c.server.listen = listen;
        // A worker is a REST backend; the gateway in front of it speaks gRPC to clients.
        c.server.grpc_listen = None;
        c.server.name = "tensorgate-worker".into();
        c.set_backends(&["builtin".to_string()])
            .expect("the builtin backend is valid");
        c.backends[0].models = models.to_vec();
        // The built-in classifier carries its own labels; no label files are needed.
        c.models.clear();
        c
    }

    /// Sets how long the built-in sequence model (`accumulate`) keeps the state of a
    /// sequence that gets no requests: `[models.accumulate] sequence_idle_timeout_ms`,
    /// which `tensorgate worker --sequence-idle-timeout-ms` sets since a worker has no file.
    pub fn set_sequence_idle_timeout(&mut self, timeout: Duration) {
        self.models
            .entry("accumulate".to_string())
            .or_default()
            .sequence_idle_timeout_ms = Some(timeout.as_millis() as u64);
    }
}
