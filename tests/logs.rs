//! Logs in JSON format: every line is a JSON object, and each request has one access line
//! with its method, path, model, status, backend, bytes and duration.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_logs() {
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (port, metrics) = (free(), free());
    let dir = std::env::temp_dir().join(format!("tg-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tensorgate.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{metrics}\"\ngrpc_listen = \"\"\nlog_format = \"json\"\nlog_level = \"info\"\n[[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensorgate"))
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if reqwest::get(format!("{base}/v2/health/ready"))
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = r#"{"parameters":{"sequence_id":9,"sequence_start":true},"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[3]}]}"#;
    let r = reqwest::Client::new()
        .post(format!("{base}/v2/models/accumulate/infer"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(status.success());
    let mut text = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let access: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| {
            v["target"] == "tensorgate::access"
                && v["fields"]["path"] == "/v2/models/accumulate/infer"
        })
        .collect();
    assert_eq!(access.len(), 1, "{text}");
    let f = &access[0]["fields"];
    assert_eq!(f["method"], "POST");
    assert_eq!(f["model"], "accumulate");
    assert_eq!(f["status"], 200);
    assert_eq!(f["backend"], "builtin");
    assert_eq!(f["bytes_in"], body.len());
    assert_eq!(f["sequence_id"], "9");
    assert!(f["duration_us"].as_u64().is_some() && f["bytes_out"].as_u64().unwrap() > 0);
}
