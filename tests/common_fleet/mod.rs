//! Helpers for the fleet tests: `tensorgate worker` and `tensorgate serve` processes on free
//! loopback ports (killed on drop), in-process gateways, and small v2 request helpers.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tensorgate::config::{parse_and_check, Config};
use tensorgate::fleet::backend::BoxFuture;
use tensorgate::fleet::discovery::Resolve;
use tensorgate::run::Running;

pub const BACKEND_HEADER: &str = "x-tensorgate-backend";

/// How long a process may take to become ready: a worker answers (503) while it reads its
/// repository, and tract optimises VGG-19 in some 25 s in a debug build on a busy machine.
const READY_WAIT: Duration = Duration::from_secs(120);

/// A port that was free on `ip` a moment ago.
pub fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .expect("bind a free port")
        .local_addr()
        .expect("local address")
        .port()
}

/// A port that was free on every one of `ips` a moment ago.
pub fn free_port_on_all(ips: &[&str]) -> u16 {
    for _ in 0..50 {
        let listeners: Vec<TcpListener> = match TcpListener::bind((ips[0], 0)) {
            Ok(l) => vec![l],
            Err(_) => continue,
        };
        let port = listeners[0].local_addr().expect("local address").port();
        let others: Result<Vec<TcpListener>, _> = ips[1..]
            .iter()
            .map(|ip| TcpListener::bind((*ip, port)))
            .collect();
        if others.is_ok() {
            return port;
        }
    }
    panic!("no port is free on all of {ips:?}");
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client")
}

/// A child process that is killed (and reaped) when dropped.
pub struct ChildGuard {
    pub child: Child,
}

impl ChildGuard {
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process and waits until it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `GET {base}/v2/health/ready` until it answers 200, for a bounded time.
pub async fn wait_ready(client: &reqwest::Client, base: &str, child: &mut ChildGuard, log: &Path) {
    let deadline = Instant::now() + READY_WAIT;
    loop {
        if let Some(status) = child.exited() {
            panic!(
                "{base} exited with {status} before becoming ready; log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if let Ok(r) = client.get(format!("{base}/v2/health/ready")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{base} did not become ready within {READY_WAIT:?}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A scratch directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tg-fleet-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `tensorgate worker` process.
pub struct Worker {
    pub name: String,
    pub ip: String,
    pub port: u16,
    pub url: String,
    pub process: ChildGuard,
    pub log: PathBuf,
    _dir: TempDir,
}

impl Worker {
    /// Starts a worker on `ip:port` (port 0: a free one) serving `models` (empty: all) and
    /// waits until it is ready.
    pub async fn start(name: &str, ip: &str, port: u16, models: &[&str]) -> Worker {
        Worker::start_with(name, ip, port, models, &[], &[]).await
    }

    /// Like `start`, with more command-line arguments and environment variables for
    /// `tensorgate worker`.
    pub async fn start_with(
        name: &str,
        ip: &str,
        port: u16,
        models: &[&str],
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Worker {
        let mut w = Worker::spawn(name, ip, port, models, args, envs);
        let client = http_client();
        wait_ready(&client, &w.url, &mut w.process, &w.log).await;
        w
    }

    /// `start_with` without the wait for readiness.
    pub fn spawn(
        name: &str,
        ip: &str,
        port: u16,
        models: &[&str],
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Worker {
        let port = if port == 0 { free_port(ip) } else { port };
        let dir = TempDir::new("worker");
        let log = dir.path("worker.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensorgate"));
        cmd.arg("worker")
            .arg("--listen")
            .arg(format!("{ip}:{port}"));
        if !models.is_empty() {
            cmd.arg("--models").arg(models.join(","));
        }
        cmd.args(args).envs(envs.iter().copied());
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(&log).expect("create the worker log"),
            ))
            .spawn()
            .expect("spawn tensorgate worker");
        Worker {
            name: name.to_string(),
            ip: ip.to_string(),
            port,
            url: format!("http://{ip}:{port}"),
            process: ChildGuard { child },
            log,
            _dir: dir,
        }
    }

    /// Starts `n` workers on 127.0.0.1 named w0, w1, ... in parallel.
    pub async fn start_many(n: usize, models: &[&str]) -> Vec<Worker> {
        let mut workers: Vec<Worker> = (0..n)
            .map(|i| Worker::spawn(&format!("w{i}"), "127.0.0.1", 0, models, &[], &[]))
            .collect();
        let client = http_client();
        for w in &mut workers {
            wait_ready(&client, &w.url, &mut w.process, &w.log).await;
        }
        workers
    }
}

/// A gateway config in TOML: listeners on free loopback ports, `fleet` keys as given, and
/// `backends` as (name, url) pairs.
pub fn gateway_toml(backends: &[(&str, &str)], fleet: &str) -> String {
    let mut t = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\ngrpc_listen = \"\"\nlog_level = \"warn\"\n\n",
    );
    t.push_str("[fleet]\n");
    t.push_str(fleet);
    t.push_str("\n\n");
    for (name, url) in backends {
        t.push_str(&format!("[[backends]]\nname = {name:?}\nurl = {url:?}\n\n"));
    }
    t
}

pub fn parse_config(text: &str) -> Config {
    parse_and_check(text).unwrap_or_else(|e| panic!("invalid test config {e:?}:\n{text}"))
}

/// A config for an in-process gateway in front of `workers`, named as the workers are.
pub fn gateway_config(workers: &[&Worker], fleet: &str) -> Config {
    let backends: Vec<(&str, &str)> = workers
        .iter()
        .map(|w| (w.name.as_str(), w.url.as_str()))
        .collect();
    parse_config(&gateway_toml(&backends, fleet))
}

pub async fn start_gateway(config: Config) -> Running {
    tensorgate::run::start(config, false)
        .await
        .expect("the gateway starts")
}

/// The backend that owns sequence `id` of `accumulate` under a replica's current table.
pub fn hash_owner(gw: &Running, id: u64) -> String {
    let catalog = gw.gateway.fleet.catalog();
    let entry = catalog.get("accumulate").expect("accumulate is served");
    let key = tensorgate::routing::sequence_key(
        "accumulate",
        &tensorgate::protocol::SequenceId::Uint(id),
    );
    entry.ready[entry.table.lookup(key).expect("a non-empty table")]
        .name
        .to_string()
}

/// The sequences of `live` whose hash owner on `gw` is no longer the backend they started
/// on; at least 5, or a test of a fleet change would prove nothing.
pub fn moved_by_the_change(gw: &Running, live: &[Seq]) -> Vec<u64> {
    let moved: Vec<u64> = live
        .iter()
        .filter(|s| Some(hash_owner(gw, s.id)) != s.backend)
        .map(|s| s.id)
        .collect();
    assert!(
        moved.len() >= 5,
        "only {} live sequences hash elsewhere now",
        moved.len()
    );
    moved
}

pub fn base(running: &Running) -> String {
    format!("http://{}", running.addr)
}

/// A `tensorgate serve --config FILE` process.
pub struct GatewayProcess {
    pub base: String,
    pub process: ChildGuard,
    pub log: PathBuf,
}

impl GatewayProcess {
    pub async fn start(config: &Path, log: PathBuf) -> GatewayProcess {
        let port = free_port("127.0.0.1");
        let child = Command::new(env!("CARGO_BIN_EXE_tensorgate"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--metrics-listen")
            .arg("127.0.0.1:0")
            .arg("--grpc-listen")
            .arg("")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(&log).expect("create the gateway log"),
            ))
            .spawn()
            .expect("spawn tensorgate serve");
        let mut g = GatewayProcess {
            base: format!("http://127.0.0.1:{port}"),
            process: ChildGuard { child },
            log,
        };
        wait_ready(&http_client(), &g.base, &mut g.process, &g.log).await;
        g
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGHUP, which makes `serve` reload its config file.
    pub fn sighup(&self) {
        let status = Command::new("kill")
            .arg("-HUP")
            .arg(self.process.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP failed");
    }
}

/// Starts one `tensorgate serve` process per config file, each logging next to its file.
pub async fn start_gateway_processes(configs: &[PathBuf]) -> Vec<GatewayProcess> {
    let mut out = Vec::new();
    for c in configs {
        out.push(GatewayProcess::start(c, c.with_extension("log")).await);
    }
    out
}

/// Writes a file by renaming a complete temporary file over it, as a config manager would.
pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the temporary file");
    std::fs::rename(&tmp, path).expect("rename over the file");
}

/// What one inference answered.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub backend: Option<String>,
}

impl Reply {
    pub fn error(&self) -> Option<&str> {
        self.body.get("error").and_then(Value::as_str)
    }

    /// The first element of the named output, as an integer.
    pub fn output_int(&self, name: &str) -> Option<i64> {
        self.body
            .get("outputs")?
            .as_array()?
            .iter()
            .find(|o| o.get("name").and_then(Value::as_str) == Some(name))?
            .get("data")?
            .as_array()?
            .first()?
            .as_i64()
    }
}

pub async fn post_infer(client: &reqwest::Client, base: &str, model: &str, body: &Value) -> Reply {
    let r = client
        .post(format!("{base}/v2/models/{model}/infer"))
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {base}/v2/models/{model}/infer: {e}"));
    let status = r.status().as_u16();
    let backend = r
        .headers()
        .get(BACKEND_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = r.text().await.expect("read the response body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply {
        status,
        body,
        backend,
    }
}

/// A `simple` request: INPUT0 = 0..16 + x, INPUT1 = 1; OUTPUT0[0] is then x + 1.
pub fn simple_body(x: i32, parameters: Option<Value>) -> Value {
    let a: Vec<i32> = (0..16).map(|i| i + x).collect();
    let mut body = json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": vec![1; 16]},
        ]
    });
    if let Some(p) = parameters {
        body["parameters"] = p;
    }
    body
}

pub async fn infer_simple(client: &reqwest::Client, base: &str, x: i32) -> Reply {
    post_infer(client, base, "simple", &simple_body(x, None)).await
}

/// One request of an `accumulate` sequence.
pub async fn accumulate(
    client: &reqwest::Client,
    base: &str,
    id: u64,
    start: bool,
    end: bool,
    value: i32,
) -> Reply {
    let mut parameters = json!({ "sequence_id": id });
    if start {
        parameters["sequence_start"] = json!(true);
    }
    if end {
        parameters["sequence_end"] = json!(true);
    }
    let body = json!({
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [value]}],
        "parameters": parameters,
    });
    post_infer(client, base, "accumulate", &body).await
}

/// A planned `accumulate` sequence and how far it has got.
#[derive(Debug, Clone)]
pub struct Seq {
    pub id: u64,
    pub values: Vec<i32>,
    /// Requests sent so far.
    pub next: usize,
    pub sum: i32,
    /// The backend that served its first request.
    pub backend: Option<String>,
    /// Every backend that served one of its requests, in order.
    pub served_by: Vec<String>,
    /// The gateway each request was sent to, in order.
    pub via: Vec<String>,
}

impl Seq {
    pub fn new(id: u64, len: usize, rng: &mut fastrand::Rng) -> Seq {
        Seq {
            id,
            values: (0..len.max(2)).map(|_| rng.i32(-1000..1000)).collect(),
            next: 0,
            sum: 0,
            backend: None,
            served_by: Vec::new(),
            via: Vec::new(),
        }
    }

    pub fn done(&self) -> bool {
        self.next >= self.values.len()
    }

    /// Sends the next request and checks the running sum and the backend.
    pub async fn step(&mut self, client: &reqwest::Client, base: &str) -> Result<(), String> {
        let i = self.next;
        let start = i == 0;
        let end = i + 1 == self.values.len();
        let v = self.values[i];
        let r = accumulate(client, base, self.id, start, end, v).await;
        if r.status != 200 {
            return Err(format!(
                "sequence {} request {i} via {base}: status {} {:?}",
                self.id, r.status, r.body
            ));
        }
        let expected = self.sum.wrapping_add(v);
        let got = r.output_int("OUTPUT0");
        if got != Some(expected as i64) {
            return Err(format!(
                "sequence {} request {i} via {base}: OUTPUT0 {got:?}, expected {expected} ({:?})",
                self.id, r.body
            ));
        }
        let Some(backend) = r.backend else {
            return Err(format!(
                "sequence {} request {i}: no {BACKEND_HEADER} header",
                self.id
            ));
        };
        if let Some(first) = &self.backend {
            if *first != backend {
                return Err(format!(
                    "sequence {} request {i} was served by {backend}, its earlier requests by {first}",
                    self.id
                ));
            }
        } else {
            self.backend = Some(backend.clone());
        }
        self.served_by.push(backend);
        self.via.push(base.to_string());
        self.sum = expected;
        self.next += 1;
        Ok(())
    }
}

/// Runs `seqs` over `tasks` concurrent tasks, each interleaving its share of sequences in a
/// seeded random order and sending each request to a randomly chosen one of `bases`. Each
/// sequence is advanced until it has sent `until` requests (or all of them).
pub async fn drive(
    seqs: Vec<Seq>,
    bases: &[String],
    tasks: usize,
    seed: u64,
    until: usize,
) -> Result<Vec<Seq>, String> {
    let client = http_client();
    let mut shares: Vec<Vec<Seq>> = (0..tasks).map(|_| Vec::new()).collect();
    for (i, s) in seqs.into_iter().enumerate() {
        shares[i % tasks].push(s);
    }
    let mut handles = Vec::new();
    for (t, mut share) in shares.into_iter().enumerate() {
        let client = client.clone();
        let bases = bases.to_vec();
        handles.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed.wrapping_add(t as u64 * 7919));
            let limit = |s: &Seq| until.min(s.values.len());
            let budget: usize = share.iter().map(|s| limit(s).saturating_sub(s.next)).sum();
            // Every round advances one sequence, so the budget bounds the loop.
            for _ in 0..budget {
                let live: Vec<usize> = (0..share.len())
                    .filter(|i| share[*i].next < limit(&share[*i]))
                    .collect();
                if live.is_empty() {
                    break;
                }
                let i = live[rng.usize(..live.len())];
                let base = &bases[rng.usize(..bases.len())];
                share[i].step(&client, base).await?;
            }
            Ok::<Vec<Seq>, String>(share)
        }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.extend(
            h.await
                .map_err(|e| format!("a driver task failed: {e}"))??,
        );
    }
    out.sort_by_key(|s| s.id);
    Ok(out)
}

/// A resolver whose table the test can change while the gateway runs.
#[derive(Clone, Default)]
pub struct MutableResolver(pub Arc<Mutex<HashMap<String, Vec<IpAddr>>>>);

impl MutableResolver {
    pub fn set(&self, host: &str, ips: &[&str]) {
        self.0.lock().unwrap().insert(
            host.to_string(),
            ips.iter()
                .map(|ip| ip.parse().expect("an IP address"))
                .collect(),
        );
    }
}

impl Resolve for MutableResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, String>> {
        let found = self.0.lock().unwrap().get(host).cloned();
        Box::pin(async move { found.ok_or_else(|| format!("cannot resolve '{host}'")) })
    }
}

/// Polls `check` every `every` until it returns true, at most `tries` times.
pub async fn eventually<F, Fut>(tries: usize, every: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..tries {
        if check().await {
            return true;
        }
        tokio::time::sleep(every).await;
    }
    false
}

/// The names of the models `POST /v2/repository/index` lists READY.
pub async fn ready_models(client: &reqwest::Client, base: &str) -> Vec<String> {
    let Ok(r) = client
        .post(format!("{base}/v2/repository/index"))
        .send()
        .await
    else {
        return Vec::new();
    };
    let Ok(list) = r.json::<Vec<Value>>().await else {
        return Vec::new();
    };
    list.iter()
        .filter(|e| e.get("state").and_then(Value::as_str) == Some("READY"))
        .filter_map(|e| e.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// What a `ScriptedBackend` does with an infer request, once it has read all of it.
#[derive(Debug, Clone, Copy)]
pub enum OnInfer {
    /// 200 with OUTPUT0 = [1.5, 2.5].
    Answer,
    /// This status, with `{"error": message}`.
    Fail(u16, &'static str),
    /// Closes the connection without answering, as a crashing server would.
    Close,
    /// Answers as `Answer` after this long.
    Delay(Duration),
    /// 200 with a body that is not a v2 response, as a broken server would.
    Garbage,
}

/// A minimal v2 server without the binary extension, serving model `m` (FP32 INPUT0 [-1]
/// in, FP32 OUTPUT0 out), that counts the infer requests it receives and treats them as
/// scripted: for what only the backend's side of the wire shows.
pub struct ScriptedBackend {
    pub url: String,
    /// Infer requests whose head arrived.
    infers_seen: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl ScriptedBackend {
    pub async fn start(on_infer: OnInfer) -> ScriptedBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the scripted backend");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let infers_seen = Arc::new(AtomicUsize::new(0));
        let seen = infers_seen.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |r| {
                        scripted_answer(r, on_infer, seen.clone())
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
            }
        });
        ScriptedBackend {
            url,
            infers_seen,
            accept,
        }
    }

    pub fn infers(&self) -> usize {
        self.infers_seen.load(Ordering::SeqCst)
    }
}

impl Drop for ScriptedBackend {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

type ScriptedResponse = hyper::Response<http_body_util::Full<bytes::Bytes>>;

async fn scripted_answer(
    req: hyper::Request<hyper::body::Incoming>,
    on_infer: OnInfer,
    infers_seen: Arc<AtomicUsize>,
) -> Result<ScriptedResponse, std::io::Error> {
    use http_body_util::BodyExt;
    let path = req.uri().path().to_string();
    let is_infer = path.starts_with("/v2/models/m/") && path.ends_with("/infer");
    if is_infer {
        infers_seen.fetch_add(1, Ordering::SeqCst);
    }
    // The whole request is read before anything else happens: it has reached the backend.
    let _ = req.into_body().collect().await;
    let reply = |status: u16, body: Value| {
        Ok(hyper::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .expect("a valid response"))
    };
    let answer = json!({
        "model_name": "m",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]}],
    });
    if is_infer {
        return match on_infer {
            OnInfer::Answer => reply(200, answer),
            OnInfer::Fail(status, message) => reply(status, json!({ "error": message })),
            // An error from the service makes hyper drop the connection unanswered.
            OnInfer::Close => Err(std::io::Error::other("scripted close")),
            OnInfer::Delay(d) => {
                tokio::time::sleep(d).await;
                reply(200, answer)
            }
            OnInfer::Garbage => Ok(hyper::Response::builder()
                .status(200)
                .header("content-type", "text/html")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    b"<html>proxy error</html>",
                )))
                .expect("a valid response")),
        };
    }
    match path.as_str() {
        "/v2/health/ready" | "/v2/health/live" | "/v2/models/m/ready" => reply(200, json!({})),
        "/v2" => reply(
            200,
            json!({"name": "scripted", "version": "1", "extensions": []}),
        ),
        "/v2/models/m" => reply(
            200,
            json!({
                "name": "m",
                "platform": "test",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            }),
        ),
        "/v2/repository/index" => reply(200, json!([{"name": "m", "state": "READY"}])),
        _ => reply(404, json!({"error": "not found"})),
    }
}

/// A request for the scripted backends' model `m`.
pub fn m_body(parameters: Option<Value>) -> Value {
    let mut body = json!({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}],
    });
    if let Some(p) = parameters {
        body["parameters"] = p;
    }
    body
}

/// A gateway whose one backend entry is every address `workers.test` resolves to through
/// `resolver`, on `port`; `fleet` is the body of its `[fleet]` table.
pub async fn start_dns_gateway(
    fleet: &str,
    port: u16,
    resolver: Arc<dyn Resolve>,
) -> tensorgate::run::Running {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\ngrpc_listen = \"\"\nlog_level = \"warn\"\n\n\
         [fleet]\n{fleet}\n\n\
         [[backends]]\nname = \"pool\"\nurl = \"http://workers.test:{port}\"\ndiscovery = \"dns\"\n"
    );
    tensorgate::run::start_with_resolver(parse_config(&text), false, resolver)
        .await
        .expect("the gateway starts")
}

/// The gateway's Prometheus text, from its metrics listener.
pub async fn scrape(gw: &tensorgate::run::Running) -> String {
    reqwest::get(format!(
        "http://{}/metrics",
        gw.metrics_addr.expect("the metrics listener is on")
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap()
}

/// The names of the backends the gateway's catalog has ready for `accumulate`.
pub fn ready_names(gw: &tensorgate::run::Running) -> std::collections::BTreeSet<String> {
    gw.gateway
        .fleet
        .catalog()
        .get("accumulate")
        .map(|e| e.ready.iter().map(|h| h.name.to_string()).collect())
        .unwrap_or_default()
}
