//! Access logs, in JSON and in the plain format: each request has one access line with its
//! method, path, model, status, backend, bytes and duration.

use crate::common_fleet;
use crate::common_grpc;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use tensorgate::protocol::grpc::pb;

const BODY: &str = r#"{"parameters":{"sequence_id":9,"sequence_start":true},"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[3]}]}"#;

fn free_port() -> u16 {
    common_fleet::free_port("127.0.0.1")
}

/// A `tensorgate serve` process whose stderr (its log) is kept, started from `config` (the
/// listener is on `port`) and ready once `ready_path` answers 200.
struct LoggingGateway {
    child: std::process::Child,
    base: String,
    dir: std::path::PathBuf,
}

impl LoggingGateway {
    async fn start(tag: &str, port: u16, config: &str, ready_path: &str) -> LoggingGateway {
        let dir = std::env::temp_dir().join(format!("tg-logs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("tensorgate.toml");
        std::fs::write(&cfg, config).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tensorgate"))
            .args(["serve", "--config", cfg.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        for _ in 0..200 {
            if reqwest::get(format!("{base}{ready_path}"))
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        LoggingGateway { child, base, dir }
    }

    /// Stops it with SIGTERM (it must exit cleanly) and returns its log.
    fn stop(mut self) -> String {
        assert!(Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
        assert!(self.child.wait().unwrap().success());
        let mut text = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
        text
    }
}

/// The messages of the requests the gateway refused, as their clients got them.
struct Refusals {
    infer: String,
    unload: String,
}

/// Runs a gateway with `log_format`, sends it one `accumulate` request, one `simple`
/// request it refuses, an unload it refuses and one `simple` call over gRPC, stops it with
/// SIGTERM, and returns what it wrote to stderr and the refusals' messages.
async fn log_of_one_request(log_format: &str) -> (String, Refusals) {
    let (port, metrics, grpc) = (free_port(), free_port(), free_port());
    let gw = LoggingGateway::start(
        log_format,
        port,
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{metrics}\"\ngrpc_listen = \"127.0.0.1:{grpc}\"\nlog_format = \"{log_format}\"\nlog_level = \"info\"\n[[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n"
        ),
        "/v2/health/ready",
    )
    .await;
    let base = gw.base.clone();
    let r = reqwest::Client::new()
        .post(format!("{base}/v2/models/accumulate/infer"))
        .header("x-request-id", "req-42")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Two requests it refuses with 400; each line carries the message its body gives.
    let refused = |path: &str, body: &'static str| {
        let req = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .body(body);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 400);
            r.json::<serde_json::Value>().await.unwrap()["error"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let error = refused(
        "/v2/models/simple/infer",
        r#"{"parameters":{"sequence_id":77},"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[1]}]}"#,
    )
    .await;
    let unload_error = refused("/v2/repository/models/nope/unload", "").await;
    // Over gRPC, the request id comes from the call's metadata.
    let mut c = common_grpc::connect(([127, 0, 0, 1], grpc).into()).await;
    let mut call = tonic::Request::new(pb::ModelInferRequest {
        model_name: "simple".into(),
        inputs: vec![
            common_grpc::input("INPUT0", "INT32", &[1, 16]),
            common_grpc::input("INPUT1", "INT32", &[1, 16]),
        ],
        raw_input_contents: vec![common_grpc::le_i32(&[1; 16]), common_grpc::le_i32(&[2; 16])],
        ..Default::default()
    });
    call.metadata_mut()
        .insert("x-request-id", "grpc-7".parse().unwrap());
    c.model_infer(call).await.unwrap();
    // An RPC other than inference has its line too (a successful probe's at debug).
    let mut metadata = tonic::Request::new(pb::ModelMetadataRequest {
        name: "nope".into(),
        version: String::new(),
    });
    metadata
        .metadata_mut()
        .insert("x-request-id", "grpc-8".parse().unwrap());
    c.model_metadata(metadata).await.unwrap_err();
    c.server_live(pb::ServerLiveRequest {}).await.unwrap();
    let refusals = Refusals {
        infer: error,
        unload: unload_error,
    };
    (gw.stop(), refusals)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_logs() {
    let (text, refusals) = log_of_one_request("json").await;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    // The fields of the one access line for `path`.
    let line_of = |path: &str| {
        let found: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|v| v["target"] == "tensorgate::access" && v["fields"]["path"] == path)
            .collect();
        assert_eq!(found.len(), 1, "{path} in {text}");
        &found[0]["fields"]
    };
    // The shutdown's last line says how it ended.
    assert_eq!(
        lines.last().unwrap()["fields"]["message"],
        "shut down: every connection drained",
        "{text}"
    );
    let f = line_of("/v2/models/accumulate/infer");
    assert_eq!(f["method"], "POST");
    assert_eq!(f["model"], "accumulate");
    assert_eq!(f["status"], 200);
    assert_eq!(f["backend"], "builtin");
    assert_eq!(f["bytes_in"], BODY.len());
    assert_eq!(f["sequence_id"], "9");
    assert!(f["duration_us"].as_u64().is_some() && f["bytes_out"].as_u64().unwrap() > 0);
    assert_eq!(f["request_id"], "req-42");
    assert_eq!(f["error"], "-");
    // The client's address: an operator's first question about a request.
    let peer = f["peer"].as_str().unwrap();
    assert!(
        peer.starts_with("127.0.0.1:") && peer[10..].parse::<u16>().is_ok(),
        "{peer}"
    );
    // A refused request's line carries the message the client got.
    let refused = line_of("/v2/models/simple/infer");
    assert_eq!(refused["status"], 400);
    assert_eq!(refused["error"], refusals.infer.as_str());
    assert_eq!(refused["request_id"], "-");
    // Refused or not, a sequence's request is found by the sequence's id.
    assert_eq!(refused["sequence_id"], "77");
    let unload = line_of("/v2/repository/models/nope/unload");
    assert_eq!(unload["status"], 400);
    assert_eq!(unload["error"], refusals.unload.as_str());
    // A path that names a model names it in its line, inference or not.
    assert_eq!(unload["model"], "nope");
    let grpc: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["target"] == "tensorgate::access" && v["fields"]["protocol"] == "grpc")
        .collect();
    assert_eq!(grpc.len(), 2, "{text}");
    let m = &grpc[1]["fields"];
    assert_eq!(
        (&m["path"], &m["status"], &m["error"], &m["request_id"]),
        (
            &serde_json::json!("/inference.GRPCInferenceService/ModelMetadata"),
            &serde_json::json!(5),
            &serde_json::json!("unknown model 'nope'"),
            &serde_json::json!("grpc-8")
        )
    );
    let f = &grpc[0]["fields"];
    assert_eq!(
        (&f["method"], &f["path"], &f["model"], &f["status"]),
        (
            &serde_json::json!("gRPC"),
            &serde_json::json!("/inference.GRPCInferenceService/ModelInfer"),
            &serde_json::json!("simple"),
            &serde_json::json!(0)
        )
    );
    assert_eq!(f["request_id"], "grpc-7");
    assert!(f["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{f}");
}

/// The plain access line is written by tensorgate's own formatter (src/logformat.rs), in
/// tracing-subscriber's layout: `TIMESTAMP  INFO tensorgate::access: name=value ...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_access_logs() {
    let (text, _) = log_of_one_request("plain").await;
    let access: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" tensorgate::access: ") && l.contains("/accumulate/infer"))
        .collect();
    assert_eq!(access.len(), 1, "{text}");
    let (timestamp, rest) = access[0].split_once(' ').unwrap();
    assert_eq!(
        timestamp.len(),
        "2026-11-24T20:03:38.674332Z".len(),
        "{timestamp}"
    );
    assert!(timestamp.ends_with('Z') && timestamp.as_bytes()[10] == b'T');
    let expected_start = format!(
        " INFO tensorgate::access: method=\"POST\" path=\"/v2/models/accumulate/infer\" \
         protocol=\"rest\" model=\"accumulate\" status=200 backend=\"builtin\" bytes_in={} bytes_out=",
        BODY.len()
    );
    assert!(rest.starts_with(&expected_start), "{rest}");
    assert!(
        rest.contains(" sequence_id=\"9\" traceparent=\"00-"),
        "{rest}"
    );
    assert!(rest.contains(" peer=127.0.0.1:"), "{rest}");
    assert!(
        rest.ends_with(" request_id=\"req-42\" error=\"-\""),
        "{rest}"
    );
}

/// A request still waiting for its backend when the drain deadline comes is cut off by the
/// shutdown: its client gets a 503 that says so (with `Connection: close`), not a bare
/// disconnect, and its access line the same, with the backend that had the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_off_by_the_shutdown_is_logged_as_such() {
    let slow =
        common_fleet::ScriptedBackend::start(common_fleet::OnInfer::Delay(Duration::from_secs(10)))
            .await;
    let port = free_port();
    let gw = LoggingGateway::start(
        "cutoff",
        port,
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nmetrics_listen = \"\"\ngrpc_listen = \"\"\nlog_format = \"json\"\n\
             [limits]\nshutdown_delay_ms = 0\ndrain_timeout_ms = 300\n\
             [[backends]]\nname = \"slow\"\nurl = \"{}\"\n",
            slow.url
        ),
        "/v2/models/m/ready",
    )
    .await;
    let request = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}/v2/models/m/infer", gw.base))
            .body(r#"{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[1,2]}]}"#)
            .send(),
    );
    // Bounded wait until the backend has the request, then SIGTERM.
    for _ in 0..100 {
        if slow.infers() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(slow.infers(), 1);
    let text = gw.stop();
    let answer = request
        .await
        .unwrap()
        .expect("an answer, not a cut connection");
    assert_eq!(answer.status(), 503);
    assert_eq!(
        answer.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    assert_eq!(
        answer.text().await.unwrap(),
        r#"{"error":"the gateway shut down before the answer (limits.drain_timeout_ms passed)"}"#
    );
    let line: serde_json::Value = access_line(&text, "/v2/models/m/infer");
    let f = &line["fields"];
    assert_eq!(
        (&f["status"], &f["model"], &f["backend"], &f["error"]),
        (
            &serde_json::json!(503),
            &serde_json::json!("m"),
            &serde_json::json!("slow"),
            &serde_json::json!(
                "the gateway shut down before the answer (limits.drain_timeout_ms passed)"
            )
        )
    );
    assert_eq!(f["bytes_in"], serde_json::json!(73), "{line}");
}

/// A request a layer refuses (auth here; shedding answers the same way) has an access line
/// with the message its client got, and counts against the model its path names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layers_refusal_is_logged_with_its_message() {
    let (port, metrics, grpc) = (free_port(), free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("tg-logs-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "s3cret\n").unwrap();
    let gw = LoggingGateway::start(
        "auth",
        port,
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{metrics}\"\ngrpc_listen = \"127.0.0.1:{grpc}\"\nlog_format = \"json\"\nlog_level = \"info\"\n[auth]\ntokens_file = {:?}\n[[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n",
            tokens.display().to_string()
        ),
        "/v2/health/ready",
    )
    .await;
    // With a request id far longer than any log line should be.
    let long_id = "i".repeat(60_000);
    let r = reqwest::Client::new()
        .post(format!("{}/v2/models/accumulate/infer", gw.base))
        .header("x-request-id", &long_id)
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let message = r.json::<serde_json::Value>().await.unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    // A gRPC call the auth layer refuses names who sent it, as every other access line does.
    let mut c = common_grpc::connect(([127, 0, 0, 1], grpc).into()).await;
    let status = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "simple".into(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    let text = gw.stop();
    let refused = access_line(&text, "/inference.GRPCInferenceService/ModelMetadata");
    let peer = refused["fields"]["peer"].as_str().unwrap_or_default();
    assert!(peer.starts_with("127.0.0.1:"), "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
    let line = access_line(&text, "/v2/models/accumulate/infer");
    let f = &line["fields"];
    assert_eq!(
        (&f["status"], &f["model"], &f["error"]),
        (
            &serde_json::json!(401),
            &serde_json::json!("accumulate"),
            &serde_json::json!(message)
        ),
        "{text}"
    );
    // Quoted, never more than a screenful of it: the line stays whole for a JSON pipeline.
    assert_eq!(
        f["request_id"],
        format!(
            "{}... (59744 more bytes of this message left out)",
            "i".repeat(256)
        )
    );
}

/// An inference refused for a model or version the gateway does not serve counts in no
/// model's series, but its access line names the model its path (or gRPC message) asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_inference_names_its_model_in_the_access_line() {
    let (port, metrics, grpc) = (free_port(), free_port(), free_port());
    let gw = LoggingGateway::start(
        "unknown-model",
        port,
        &logging_config(
            (port, metrics, &format!("127.0.0.1:{grpc}")),
            "log_format = \"json\"\n[[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n",
        ),
        "/v2/health/ready",
    )
    .await;
    let client = reqwest::Client::new();
    for path in [
        "/v2/models/nosuch/infer",
        "/v2/models/simple/versions/7/infer",
    ] {
        let r = client
            .post(format!("{}{path}", gw.base))
            .body(BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    let mut c = common_grpc::connect(([127, 0, 0, 1], grpc).into()).await;
    let unknown = |model: &str| pb::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![common_grpc::input("INPUT0", "INT32", &[1, 16])],
        raw_input_contents: vec![common_grpc::le_i32(&[1; 16])],
        ..Default::default()
    };
    let status = c.model_infer(unknown("grpc-nosuch")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let answers: Vec<pb::ModelStreamInferResponse> = tokio::time::timeout(
        Duration::from_secs(20),
        futures_util::StreamExt::collect::<Vec<_>>(
            c.model_stream_infer(futures_util::stream::iter(vec![unknown("stream-nosuch")]))
                .await
                .unwrap()
                .into_inner(),
        ),
    )
    .await
    .expect("the stream ends")
    .into_iter()
    .map(Result::unwrap)
    .collect();
    assert_eq!(answers.len(), 1);
    assert!(
        answers[0].error_message.contains("stream-nosuch"),
        "{answers:?}"
    );
    let text = gw.stop();
    let models: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "tensorgate::access")
        .map(|v| {
            (
                v["fields"]["path"].as_str().unwrap().to_string(),
                v["fields"]["model"].as_str().unwrap().to_string(),
            )
        })
        .filter(|(path, _)| path.ends_with("Infer") || path.ends_with("/infer"))
        .collect();
    assert_eq!(
        models,
        [
            ("/v2/models/nosuch/infer".to_string(), "nosuch".to_string()),
            (
                "/v2/models/simple/versions/7/infer".to_string(),
                "simple".to_string()
            ),
            (
                "/inference.GRPCInferenceService/ModelInfer".to_string(),
                "grpc-nosuch".to_string()
            ),
            (
                "/inference.GRPCInferenceService/ModelStreamInfer".to_string(),
                "stream-nosuch".to_string()
            ),
        ],
        "{text}"
    );
}

/// A config logging at info on the REST, metrics and gRPC (`""`: none) addresses given,
/// with `rest` (more `[server]` keys first, then tables) after.
fn logging_config((port, metrics, grpc): (u16, u16, &str), rest: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{metrics}\"\ngrpc_listen = \"{grpc}\"\nlog_level = \"info\"\n{rest}"
    )
}

/// The JSON access line of `path` in a gateway's log `text`.
fn access_line(text: &str, path: &str) -> serde_json::Value {
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["target"] == "tensorgate::access" && v["fields"]["path"] == path)
        .unwrap_or_else(|| panic!("no access line for {path} in {text}"))
}

/// An outage's end is in the log as its start is: a backend's first good health check says
/// "backend reached", and one after failed checks "backend reachable again".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_comes_back_is_logged() {
    let (port, metrics, backend_port) = (free_port(), free_port(), free_port());
    let gw = LoggingGateway::start(
        "comes-back",
        port,
        &logging_config(
            (port, metrics, ""),
            &format!("[fleet]\nrefresh_interval_ms = 100\n[[backends]]\nname = \"w\"\nurl = \"http://127.0.0.1:{backend_port}\"\n"),
        ),
        "/v2/health/live",
    )
    .await;
    let ready = format!("{}/v2/models/simple/ready", gw.base);
    let status_becomes = |want: u16| {
        let ready = ready.clone();
        async move {
            for _ in 0..200 {
                let got = reqwest::get(&ready).await.map(|r| r.status().as_u16());
                if got.is_ok_and(|s| s == want) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        }
    };
    let worker = common_fleet::Worker::start("w", "127.0.0.1", backend_port, &["simple"]).await;
    assert!(status_becomes(200).await, "the backend was never reached");
    drop(worker);
    assert!(status_becomes(503).await, "the backend never went down");
    let worker = common_fleet::Worker::start("w", "127.0.0.1", backend_port, &["simple"]).await;
    assert!(status_becomes(200).await, "the backend never came back");
    let text = gw.stop();
    drop(worker);
    let reached = text
        .find("backend reached")
        .unwrap_or_else(|| panic!("{text}"));
    let failed = text[reached..]
        .find("backend health check failed")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        text[reached + failed..].contains("backend reachable again"),
        "{text}"
    );
}
