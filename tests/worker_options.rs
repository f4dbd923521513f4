//! `tensorgate worker --sequence-idle-timeout-ms` (or `TENSORGATE_SEQUENCE_IDLE_TIMEOUT_MS`):
//! how long the built-in `accumulate` model keeps an idle sequence, on real worker processes.

use crate::common_fleet;

use std::process::Command;
use std::time::Duration;

use common_fleet::*;

const IDLE_MS: u64 = 1_500;

fn not_started(id: u64) -> String {
    format!(
        "inference request for sequence {id} to model 'accumulate' must specify the START flag on the first request of the sequence"
    )
}

/// Sends one `accumulate` request and checks the running sum it answers.
async fn expect_sum(client: &reqwest::Client, w: &Worker, id: u64, start: bool, v: i32, sum: i64) {
    let r = accumulate(client, &w.url, id, start, false, v).await;
    assert_eq!(r.status, 200, "{}: {r:?}", w.name);
    assert_eq!(r.output_int("OUTPUT0"), Some(sum), "{}: {r:?}", w.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_sequence_idle_timeout_forgets_idle_sequences() {
    let idle = IDLE_MS.to_string();
    let by_flag = Worker::start_with(
        "flag",
        "127.0.0.1",
        0,
        &["accumulate"],
        &["--sequence-idle-timeout-ms", &idle],
        &[],
    )
    .await;
    let by_env = Worker::start_with(
        "env",
        "127.0.0.1",
        0,
        &["accumulate"],
        &[],
        &[("TENSORGATE_SEQUENCE_IDLE_TIMEOUT_MS", &idle)],
    )
    .await;
    // The default keeps a sequence for 60 s.
    let default = Worker::start("default", "127.0.0.1", 0, &["accumulate"]).await;
    let client = http_client();

    // Within the timeout, each request continues the sum.
    for w in [&by_flag, &by_env, &default] {
        expect_sum(&client, w, 7, true, 1, 1).await;
        expect_sum(&client, w, 7, false, 2, 3).await;
        expect_sum(&client, w, 7, false, 3, 6).await;
    }

    // Idle for twice the timeout: the short-timeout workers have forgotten sequence 7.
    tokio::time::sleep(Duration::from_millis(2 * IDLE_MS)).await;
    for w in [&by_flag, &by_env] {
        let r = accumulate(&client, &w.url, 7, false, false, 4).await;
        assert_eq!(r.status, 400, "{}: {r:?}", w.name);
        assert_eq!(r.error(), Some(not_started(7).as_str()), "{}", w.name);
        // It can start over.
        expect_sum(&client, w, 7, true, 5, 5).await;
    }
    expect_sum(&client, &default, 7, false, 4, 10).await;
}

#[test]
fn the_option_is_documented_and_checked() {
    let bin = env!("CARGO_BIN_EXE_tensorgate");
    let help = Command::new(bin)
        .args(["worker", "--help"])
        .output()
        .expect("run tensorgate worker --help");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for part in [
        "--sequence-idle-timeout-ms <MS>",
        "[env: TENSORGATE_SEQUENCE_IDLE_TIMEOUT_MS=]",
        "[default: 60000]",
        "must set sequence_start again",
    ] {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }

    for bad in ["0", "soon"] {
        let out = Command::new(bin)
            .args(["worker", "--sequence-idle-timeout-ms", bad])
            .output()
            .expect("run tensorgate worker");
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "invalid value '{bad}' for '--sequence-idle-timeout-ms <MS>'"
            )),
            "{bad}: {err}"
        );
    }
}

/// `tensorgate worker --metrics-listen`: the worker's own /metrics, with its models' series
/// counting what it served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_its_metrics_when_asked() {
    let port = free_port("127.0.0.1");
    let addr = format!("127.0.0.1:{port}");
    let w = Worker::start_with(
        "metrics",
        "127.0.0.1",
        0,
        &["simple"],
        &["--metrics-listen", &addr],
        &[],
    )
    .await;
    let client = http_client();
    for x in 0..3 {
        assert_eq!(infer_simple(&client, &w.url, x).await.status, 200);
    }
    let text = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("the worker's metrics answer")
        .text()
        .await
        .unwrap();
    assert!(
        text.lines()
            .any(|l| l == r#"nv_inference_request_success{model="simple",version="1"} 3"#),
        "{text}"
    );
    let bin = env!("CARGO_BIN_EXE_tensorgate");
    let help = Command::new(bin)
        .args(["worker", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--metrics-listen <ADDR>"), "{help}");
}
