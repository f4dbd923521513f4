//! The real binary: help texts, check-config, a bad worker model list, and a worker with a
//! gateway in front of it, both stopped with SIGTERM.

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_tensorgate");

fn tensorgate(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn assert_mentions(out: &Output, words: &[&str]) {
    assert!(out.status.success(), "{out:?}");
    let s = text(&out.stdout);
    for w in words {
        assert!(s.contains(w), "help does not mention {w}:\n{s}");
    }
}

#[test]
fn help_texts_mention_every_documented_flag() {
    assert_mentions(
        &tensorgate(&["--help"]),
        &["serve", "worker", "check-config"],
    );
    assert_mentions(
        &tensorgate(&["serve", "--help"]),
        &[
            "--config",
            "--listen",
            "--metrics-listen",
            "--backend",
            "--worker-threads",
        ],
    );
    assert_mentions(
        &tensorgate(&["worker", "--help"]),
        &["--listen", "--models", "--worker-threads"],
    );
    assert_mentions(&tensorgate(&["check-config", "--help"]), &["FILE"]);
    let v = tensorgate(&["--version"]);
    assert!(v.status.success());
    assert!(text(&v.stdout).contains(env!("CARGO_PKG_VERSION")));
    // No subcommand is a usage error.
    assert!(!tensorgate(&[]).status.success());
}

#[test]
fn check_config_accepts_the_example() {
    let out = tensorgate(&["check-config", "config/tensorgate.toml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "config/tensorgate.toml: ok");
}

/// A config without backends is valid (a reload may add them), but check-config says what
/// it means.
#[test]
fn check_config_notes_a_config_without_backends() {
    let path = temp_file("no-backends.toml", "[server]\nlisten = \"127.0.0.1:0\"\n");
    let p = path.to_str().unwrap();
    let out = tensorgate(&["check-config", p]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("{p}: ok, but no [[backends]] are configured: such a gateway knows no model")
    );
}

/// Writes `contents` to a file of its own under the target's temp dir.
fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn check_config_reports_errors_with_line_numbers() {
    // Every schema error is reported, each with its line, and beside them the checks of
    // the values (the ftp:// URL), made with the lines in error set aside.
    let path = temp_file(
        "unknown-key.toml",
        "[server]\nlisten = \"0.0.0.0:1\"\nlisen = 3\n\n[[backends]]\nname = \"a\"\nurl = \"ftp://x:1\"\nwieght = 2\n",
    );
    let p = path.to_str().unwrap();
    let out = tensorgate(&["check-config", p]);
    assert!(!out.status.success());
    let lines: Vec<String> = text(&out.stderr).lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("{p}:3: server.lisen: unknown field `lisen`")),
        "{lines:?}"
    );
    assert_eq!(
        lines[1],
        format!("{p}:7: backend url 'ftp://x:1' must start with http:// or https:// (or be the word builtin)"),
    );
    assert!(
        lines[2].starts_with(&format!("{p}:8: backends.wieght: unknown field `wieght`")),
        "{lines:?}"
    );
    assert!(out.stdout.is_empty());

    // Checks after parsing report every error, each with its line.
    let path = temp_file(
        "bad-backends.toml",
        "[[backends]]\nname = \"a\"\nurl = \"ftp://x:1\"\n\n[[backends]]\nname = \"a\"\nurl = \"http://h:1/v2\"\n",
    );
    let p = path.to_str().unwrap();
    let out = tensorgate(&["check-config", p]);
    assert!(!out.status.success());
    let lines: Vec<String> = text(&out.stderr).lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    // The list of accepted schemes may grow; the start of the message is stable.
    assert!(
        lines[0].starts_with(&format!(
            "{p}:3: backend url 'ftp://x:1' must start with http://"
        )),
        "{lines:?}"
    );
    assert!(lines[0].ends_with("(or be the word builtin)"), "{lines:?}");
    assert_eq!(lines[1], format!("{p}:6: duplicate backend name 'a'"));
    assert_eq!(
        lines[2],
        format!("{p}:7: backend url 'http://h:1/v2' must not have a path")
    );

    // A valid config that names a file serve could not read.
    let path = temp_file(
        "missing-labels.toml",
        "[models.classifier]\nlabels = { OUTPUT0 = \"/nonexistent/classes.txt\" }\n",
    );
    let p = path.to_str().unwrap();
    let out = tensorgate(&["check-config", p]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr).trim_end(),
        format!("{p}:2: models.classifier.labels.OUTPUT0: cannot read /nonexistent/classes.txt: No such file or directory (os error 2)")
    );

    // What serve would refuse for the shared pins: a URL variable not set where it runs,
    // and a CA bundle without a certificate (rediss:// could never connect).
    let ca = temp_file(
        "not-a-ca.pem",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    );
    let path = temp_file(
        "pins.toml",
        &format!(
            "[fleet.pins]\nstore = \"redis\"\nurl_env = \"TENSORGATE_TEST_NEVER_SET\"\nca = {:?}\n",
            ca.display().to_string()
        ),
    );
    let p = path.to_str().unwrap();
    let out = tensorgate(&["check-config", p]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr).lines().collect::<Vec<_>>(),
        [
            format!("{p}:4: fleet.pins.ca: {} holds no PEM certificate (BEGIN CERTIFICATE)", ca.display()),
            format!("{p}:3: fleet.pins.url_env names TENSORGATE_TEST_NEVER_SET, which is not set here (serve would refuse to start)"),
        ]
    );

    // Tokens serve would find none of: a file of comments only, and a variable not set.
    let tokens = temp_file(
        "comment-only-tokens",
        "# rotated away; new token goes here\n\n",
    );
    for (key, value, message) in [
        (
            "tokens_file",
            tokens.display().to_string(),
            "auth is configured but no token was found (a tokens file of comments and blank lines holds none) here (serve would refuse to start)",
        ),
        (
            "tokens_env",
            "TENSORGATE_TEST_TOKENS_NEVER_SET".to_string(),
            "auth.tokens_env names TENSORGATE_TEST_TOKENS_NEVER_SET, which is not set here (serve would refuse to start)",
        ),
    ] {
        let path = temp_file("auth.toml", &format!("[auth]\n{key} = {value:?}\n"));
        let p = path.to_str().unwrap();
        let out = tensorgate(&["check-config", p]);
        assert!(!out.status.success(), "{key}");
        let line = if key == "tokens_env" { 2 } else { 1 };
        assert_eq!(text(&out.stderr).trim_end(), format!("{p}:{line}: {message}"));
    }

    // A missing file.
    let out = tensorgate(&["check-config", "/nonexistent/tensorgate.toml"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .starts_with("/nonexistent/tensorgate.toml: cannot read /nonexistent/tensorgate.toml:"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn worker_refuses_unknown_models() {
    let out = tensorgate(&["worker", "--models", "simple,nope"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let all = tensorgate::models::builtin_names().join(", ");
    assert_eq!(
        err.trim(),
        format!("--models: unknown built-in model 'nope' (the built-in models are {all})")
    );
}

#[test]
fn serve_refuses_a_bad_backend_url() {
    let out = tensorgate(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "",
        "--backend",
        "ftp://x:1",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.starts_with("--backend: backend url 'ftp://x:1' must start with http://"),
        "{err}"
    );
}

/// The two listeners that "" turns off say so when their address cannot be read.
#[test]
fn optional_listener_addresses_are_checked() {
    for flag in ["--metrics-listen", "--grpc-listen"] {
        let out = tensorgate(&["serve", flag, "localhost"]);
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!(
                "invalid value 'localhost' for '{flag} <ADDR>': 'localhost' is not an address (IP:port, or \"\" for none; host names are not resolved)"
            )),
            "{err}"
        );
    }
}

#[test]
fn worker_threads_beyond_the_bound_are_refused() {
    for args in [
        &["serve", "--worker-threads", "100000"][..],
        &["worker", "--worker-threads", "5000"],
    ] {
        let out = tensorgate(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        let n = args[2];
        assert!(
            err.contains(&format!(
                "invalid value '{n}' for '--worker-threads <N>': must be at most 1024 (0 picks one per core), not {n}"
            )),
            "{err}"
        );
    }
}

#[test]
fn worker_threads_that_are_not_a_number_or_come_from_the_environment_are_checked() {
    let out = tensorgate(&["worker", "--worker-threads", "abc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(
            "invalid value 'abc' for '--worker-threads <N>': 'abc' is not a number of threads"
        ),
        "{}",
        text(&out.stderr)
    );
    let out = Command::new(BIN)
        .args(["worker", "--listen", "127.0.0.1:0"])
        .env("TOKIO_WORKER_THREADS", "5000")
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr).trim(),
        "cannot start the async runtime: TOKIO_WORKER_THREADS must be at most 1024, not 5000"
    );
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A child process that is killed if the test ends without stopping it.
struct Proc {
    child: Option<Child>,
    name: &'static str,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, args: &[&str]) -> Proc {
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cli-{}-{name}.log", std::process::id()));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("the binary starts");
        Proc {
            child: Some(child),
            name,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits (bounded) for the exit.
    fn terminate(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("still running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit after SIGTERM; log:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Fails if the process has already exited.
    fn assert_running(&mut self) {
        if let Some(s) = self.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("{} exited early with {s}; log:\n{}", self.name, self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `url` until it answers 200 (bounded in count and time).
async fn wait_ready(client: &reqwest::Client, url: &str, procs: &mut [&mut Proc]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..1200 {
        for p in procs.iter_mut() {
            p.assert_running();
        }
        if let Ok(r) = client.get(url).send().await {
            if r.status().as_u16() == 200 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{url} never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never became ready");
}

#[tokio::test]
async fn worker_and_gateway_processes_serve_and_stop_on_sigterm() {
    let worker_port = free_port();
    let worker_addr = format!("127.0.0.1:{worker_port}");
    // The worker runs the single-threaded runtime, the gateway the multi-threaded one.
    let mut worker = Proc::spawn(
        "worker",
        &[
            "worker",
            "--listen",
            &worker_addr,
            "--models",
            "simple,accumulate",
            "--worker-threads",
            "1",
        ],
    );
    let client = client();
    wait_ready(
        &client,
        &format!("http://{worker_addr}/v2/health/ready"),
        &mut [&mut worker],
    )
    .await;

    let gw_addr = format!("127.0.0.1:{}", free_port());
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut gateway = Proc::spawn(
        "gateway",
        &[
            "serve",
            "--listen",
            &gw_addr,
            "--metrics-listen",
            &metrics_addr,
            "--grpc-listen",
            "",
            "--backend",
            &format!("http://{worker_addr}"),
        ],
    );
    wait_ready(
        &client,
        &format!("http://{gw_addr}/v2/health/ready"),
        &mut [&mut worker, &mut gateway],
    )
    .await;

    // One inference through both processes.
    let a: Vec<i32> = (0..16).collect();
    let b: Vec<i32> = vec![5; 16];
    let resp = client
        .post(format!("http://{gw_addr}/v2/models/simple/infer"))
        .json(&simple_request(&a, &b))
        .send()
        .await
        .unwrap();
    let r = Reply::read(resp).await;
    assert_eq!(r.header("x-tensorgate-backend"), Some("backend-0"));
    let out = r.decode();
    assert_eq!(
        int32s(output(&out, "OUTPUT0")),
        a.iter().map(|v| v + 5).collect::<Vec<_>>()
    );
    assert_eq!(
        int32s(output(&out, "OUTPUT1")),
        a.iter().map(|v| v - 5).collect::<Vec<_>>()
    );
    // The worker serves only the models it was given.
    let resp = client
        .post(format!("http://{gw_addr}/v2/repository/index"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let index: serde_json::Value = resp.json().await.unwrap();
    let mut names: Vec<&str> = index
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["accumulate", "simple"]);
    // The metrics listener counts the inference.
    let metrics = client
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("nv_inference_request_success{")
                && l.contains("model=\"simple\"")),
        "{metrics}"
    );

    // A reload (SIGHUP) applies the command line again: the flags it was started with are
    // not "changed settings that need a restart".
    let child = gateway.child.as_ref().unwrap().id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &child])
        .status()
        .unwrap()
        .success());
    let reloaded = "tensorgate_config_reloads_total{result=\"success\"} 1";
    let mut seen = String::new();
    for _ in 0..200 {
        let r = client
            .get(format!("http://{metrics_addr}/metrics"))
            .send()
            .await;
        seen = r.unwrap().text().await.unwrap();
        if seen.contains(reloaded) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen.contains(reloaded), "{seen}");
    assert!(
        !gateway.log().contains("only after a restart"),
        "{}",
        gateway.log()
    );
    drop(client);

    let status = gateway.terminate();
    assert!(
        status.success(),
        "gateway: {status}; log:\n{}",
        gateway.log()
    );
    let status = worker.terminate();
    assert!(status.success(), "worker: {status}; log:\n{}", worker.log());
}

/// An empty RUST_LOG, or one that is a misspelt level, does not silence the gateway: the
/// config's level applies, with a warning that says why, so a failed start still says why
/// it failed.
#[test]
fn a_rust_log_that_logs_nothing_falls_back_to_the_configs_level() {
    let config = temp_file(
        "missing-cert.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"\"\ngrpc_listen = \"\"\n\
         [server.tls]\ncert = \"/nonexistent/tensorgate.crt\"\nkey = \"/nonexistent/tensorgate.key\"\n",
    );
    for rust_log in ["", "  ", "verbose", "info"] {
        let out = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", rust_log)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{rust_log:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("server.tls") && err.contains("/nonexistent/tensorgate.crt"),
            "RUST_LOG={rust_log:?}: {err}"
        );
        let warning = match rust_log {
            "verbose" => "RUST_LOG is not a log filter: 'verbose' is neither a level",
            "info" => "",
            _ => "RUST_LOG is not a log filter: it is empty, which logs nothing; logging at info instead",
        };
        assert_eq!(
            err.contains("RUST_LOG is not a log filter"),
            !warning.is_empty(),
            "RUST_LOG={rust_log:?}: {err}"
        );
        assert!(err.contains(warning), "RUST_LOG={rust_log:?}: {err}");
    }
}
