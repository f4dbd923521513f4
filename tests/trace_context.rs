//! W3C trace context reaches the backend: the client's `traceparent` is passed on, and one
//! is created when the client sent none. Checked in the access log of a worker process.

use std::process::{Command, Stdio};
use std::time::Duration;

use tensorgate::config::Config;

const BODY: &str = r#"{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2]}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_is_passed_to_backends_and_created_when_missing() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::env::temp_dir().join(format!("tg-trace-worker-{}.log", std::process::id()));
    let mut worker = Command::new(env!("CARGO_BIN_EXE_tensorgate"))
        .args(["worker", "--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if reqwest::get(format!("http://127.0.0.1:{port}/v2/health/ready"))
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut config = Config::embedded_default();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config
        .set_backends(&[format!("http://127.0.0.1:{port}")])
        .unwrap();
    let gw = tensorgate::run::start(config, false).await.unwrap();
    let url = format!("http://{}/v2/models/identity_fp32/infer", gw.addr);
    let client = reqwest::Client::new();
    let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = client
        .post(&url)
        .header("traceparent", given)
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client.post(&url).body(BODY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;
    let _ = worker.kill();
    let _ = worker.wait();

    let text = std::fs::read_to_string(&log).unwrap();
    let infer_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("path=/v2/models/identity_fp32/infer"))
        .collect();
    assert_eq!(infer_lines.len(), 2, "{text}");
    assert!(
        infer_lines[0].contains(given),
        "the client's trace reaches the backend: {}",
        infer_lines[0]
    );
    let created = infer_lines[1]
        .split("traceparent=")
        .nth(1)
        .unwrap()
        .trim_matches(|c| c == '"' || c == ' ');
    let parts: Vec<&str> = created.split('-').collect();
    assert_eq!(parts.len(), 4, "{created}");
    assert_eq!(
        (parts[0], parts[1].len(), parts[2].len()),
        ("00", 32, 16),
        "{created}"
    );
    assert_ne!(parts[1], "0af7651916cd43dd8448eb211c80319c");
}
