//! TLS on the listener and to backends, with certificates made by rcgen: HTTPS with h2 and
//! http/1.1 by ALPN, mTLS, refusal of TLS 1.1, and certificate reload without a restart.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tensorgate::config::{BackendTls, Config, ServerTls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::pki;
use pki::Pki;

/// `_alpn` documents the protocol a call expects; hyper-rustls sets ALPN from the
/// connector's enabled HTTP versions.
fn client_tls(
    ca: &Path,
    client_cert: Option<(&Path, &Path)>,
    _alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match client_cert {
        Some((c, k)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(c)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_file(k).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

type TestClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn https_client(tls: rustls::ClientConfig, h2: bool) -> TestClient {
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    let connector = if h2 {
        b.enable_http2().build()
    } else {
        b.enable_http1().build()
    };
    Client::builder(TokioExecutor::new())
        .http2_only(h2)
        .build(connector)
}

async fn get(
    client: &TestClient,
    url: &str,
) -> Result<(http::StatusCode, http::Version, Bytes), String> {
    let req = http::Request::get(url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| format!("{e:?}"))?;
    let (status, version) = (resp.status(), resp.version());
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, version, body))
}

async fn start_tls_gateway(tls: ServerTls) -> tensorgate::run::Running {
    let mut config = Config::embedded_default();
    config.server.grpc_listen = None;
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.server.tls = Some(tls);
    tensorgate::run::start(config, false).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_h2_and_http1() {
    let pki = Pki::new("https");
    let (cert, key) = pki.issue("server", &["localhost", "127.0.0.1"], false);
    let gw = start_tls_gateway(ServerTls {
        cert,
        key,
        client_ca: None,
    })
    .await;
    let url = format!("https://localhost:{}/v2/health/ready", gw.addr.port());
    for (h2, alpn, version) in [
        (true, &[&b"h2"[..]][..], http::Version::HTTP_2),
        (false, &[&b"http/1.1"[..]][..], http::Version::HTTP_11),
    ] {
        let client = https_client(client_tls(&pki.ca(), None, alpn), h2);
        let (status, v, body) = get(&client, &url).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(v, version);
        assert_eq!(&body[..], br#"{"ready":true}"#);
    }
    // A client that does not trust our CA fails the handshake.
    let other = Pki::new("other");
    let client = https_client(client_tls(&other.ca(), None, &[b"http/1.1"]), false);
    assert!(get(&client, &url).await.is_err());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate() {
    let pki = Pki::new("mtls");
    let (cert, key) = pki.issue("server", &["localhost"], false);
    let (ccert, ckey) = pki.issue("client", &["client.test"], true);
    let gw = start_tls_gateway(ServerTls {
        cert,
        key,
        client_ca: Some(pki.ca()),
    })
    .await;
    let url = format!("https://localhost:{}/v2", gw.addr.port());
    let anonymous = https_client(client_tls(&pki.ca(), None, &[b"http/1.1"]), false);
    assert!(
        get(&anonymous, &url).await.is_err(),
        "a client without a certificate must be refused"
    );
    let rogue_pki = Pki::new("rogue");
    let (rc, rk) = rogue_pki.issue("rogue", &["rogue.test"], true);
    let rogue = https_client(
        client_tls(&pki.ca(), Some((&rc, &rk)), &[b"http/1.1"]),
        false,
    );
    assert!(
        get(&rogue, &url).await.is_err(),
        "a certificate from another CA must be refused"
    );
    // Both refusals are counted: an mTLS rollout that locks clients out shows in metrics.
    // Under TLS 1.3 the client may see its refusal before the server has counted it.
    let failures = &gw.gateway.metrics.tls_handshake_failures;
    for _ in 0..100 {
        if failures.with_label_values(&["error"]).get() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(failures.with_label_values(&["error"]).get(), 2);
    assert_eq!(failures.with_label_values(&["timeout"]).get(), 0);
    let client = https_client(
        client_tls(&pki.ca(), Some((&ccert, &ckey)), &[b"http/1.1"]),
        false,
    );
    let (status, _, body) = get(&client, &url).await.unwrap();
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("\"name\":\"tensorgate\""));
    gw.shutdown().await;
}

/// A TLS 1.1 ClientHello (legacy_version 0x0302, no supported_versions extension).
fn tls11_client_hello() -> Vec<u8> {
    let mut hello = vec![0x03, 0x02];
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // session id
    hello.extend_from_slice(&[0x00, 0x04, 0xc0, 0x13, 0x00, 0x2f]); // two CBC suites of TLS 1.0/1.1
    hello.extend_from_slice(&[0x01, 0x00]); // null compression
    let mut handshake = vec![0x01, 0x00, (hello.len() >> 8) as u8, hello.len() as u8];
    handshake.extend_from_slice(&hello);
    let mut record = vec![
        0x16,
        0x03,
        0x02,
        (handshake.len() >> 8) as u8,
        handshake.len() as u8,
    ];
    record.extend_from_slice(&handshake);
    record
}

/// A gateway over TLS with a certificate for localhost from a CA of its own, and that CA.
async fn localhost_tls_gateway(name: &str) -> (Pki, tensorgate::run::Running) {
    let pki = Pki::new(name);
    let (cert, key) = pki.issue("server", &["localhost"], false);
    let gw = start_tls_gateway(ServerTls {
        cert,
        key,
        client_ca: None,
    })
    .await;
    (pki, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_1_is_refused() {
    let (_pki, gw) = localhost_tls_gateway("tls11").await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(&tls11_client_hello()).await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    // The answer is a fatal alert record (0x15, level 2): rustls sends handshake_failure (40)
    // when no offered version is acceptable. Never a ServerHello (0x16).
    assert!(n >= 7, "expected an alert, got {n} bytes");
    assert_eq!(buf[0], 0x15, "record type: {:02x?}", &buf[..n]);
    assert_eq!(buf[5], 2, "alert level: {:02x?}", &buf[..n]);
    assert!(
        matches!(buf[6], 40 | 70),
        "alert description: {:02x?}",
        &buf[..n]
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_without_a_restart() {
    let first = Pki::new("reload-a");
    let (cert, key) = first.issue("server", &["localhost"], false);
    let gw = start_tls_gateway(ServerTls {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: None,
    })
    .await;
    let url = format!("https://localhost:{}/v2/health/live", gw.addr.port());
    let trusts_first = https_client(client_tls(&first.ca(), None, &[b"http/1.1"]), false);
    assert_eq!(get(&trusts_first, &url).await.unwrap().0, 200);
    let tls = gw.tls.clone().unwrap();
    assert!(tls.reload_if_changed().is_none(), "nothing changed yet");

    // Replace the files with a certificate from another CA.
    let second = Pki::new("reload-b");
    let (c2, k2) = second.issue("server", &["localhost"], false);
    std::fs::copy(&c2, &cert).unwrap();
    std::fs::copy(&k2, &key).unwrap();
    assert_eq!(tls.reload_if_changed(), Some(Ok(())));
    let trusts_second = https_client(client_tls(&second.ca(), None, &[b"http/1.1"]), false);
    assert_eq!(get(&trusts_second, &url).await.unwrap().0, 200);
    let fresh_first = https_client(client_tls(&first.ca(), None, &[b"http/1.1"]), false);
    assert!(
        get(&fresh_first, &url).await.is_err(),
        "new connections use the new certificate"
    );

    // A broken file keeps the old certificate, and is tried once, not on every poll.
    std::fs::write(&key, "not a key").unwrap();
    let e = tls.reload_if_changed().unwrap().unwrap_err();
    assert!(e.starts_with("key: cannot read a private key from"), "{e}");
    assert_eq!(get(&trusts_second, &url).await.unwrap().0, 200);
    assert!(
        tls.reload_if_changed().is_none(),
        "the same broken pair again"
    );
    // Fixed: loaded.
    std::fs::copy(&k2, &key).unwrap();
    assert_eq!(tls.reload_if_changed(), Some(Ok(())));
    gw.shutdown().await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends `signal` to the process `pid`.
fn kill(signal: &str, pid: u32) {
    assert!(std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificates_of_the_running_binary() {
    let first = Pki::new("sighup-a");
    let (cert, key) = first.issue("server", &["localhost"], false);
    let (port, metrics_port) = (free_port(), free_port());
    let config = std::env::temp_dir().join(format!("tg-sighup-tls-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{}\"\ngrpc_listen = \"\"\n\
             log_format = \"json\"\n\
             [server.tls]\ncert = {:?}\nkey = {:?}\n\
             [[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n",
            metrics_port,
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tensorgate"))
        .args(["serve", "--config", config.to_str().unwrap()])
        // Only the reload's lines: stderr is read after the exit, so it must not fill its pipe.
        .env("RUST_LOG", "warn,tensorgate::reload=info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let url = format!("https://localhost:{port}/v2/health/live");
    let trusting = |pki: &Pki| https_client(client_tls(&pki.ca(), None, &[b"http/1.1"]), false);
    let mut up = false;
    for _ in 0..200 {
        if get(&trusting(&first), &url).await.is_ok_and(|r| r.0 == 200) {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the gateway never served its first certificate");

    // Replace the files with a certificate from another CA, and signal.
    let second = Pki::new("sighup-b");
    let (c2, k2) = second.issue("server", &["localhost"], false);
    std::fs::copy(&c2, &cert).unwrap();
    std::fs::copy(&k2, &key).unwrap();
    let mut reloaded = false;
    for _ in 0..100 {
        kill("-HUP", pid);
        // A fresh client each time: a new connection, a new handshake.
        if get(&trusting(&second), &url)
            .await
            .is_ok_and(|r| r.0 == 200)
        {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reloaded,
        "no handshake with the new certificate after SIGHUP"
    );
    assert!(
        get(&trusting(&first), &url).await.is_err(),
        "new connections use the new certificate"
    );
    // Counted, so that a failed rotation can be alerted on.
    let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |result: &str| {
        let series = format!("tensorgate_tls_reloads_total{{result=\"{result}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |v| v.parse::<u64>().unwrap())
    };
    assert!(count("success") >= 1, "{metrics}");
    assert_eq!(count("failure"), 0, "{metrics}");

    kill("-TERM", pid);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    let mut logs = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut logs).unwrap();
    let _ = std::fs::remove_file(&config);
    // SIGHUP did it (the files are also polled for changes, which would reload them too).
    let by_sighup = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|v| {
            v["fields"]["message"] == "TLS certificates reloaded"
                && v["fields"]["trigger"] == "SIGHUP"
        });
    assert!(by_sighup, "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backend_with_custom_ca_and_client_certificate() {
    let pki = Pki::new("backend");
    let (cert, key) = pki.issue("worker", &["localhost"], false);
    let (ccert, ckey) = pki.issue("gateway", &["gateway.test"], true);
    // A worker that requires client certificates.
    let mut worker = Config::worker("127.0.0.1:0".parse().unwrap(), &["simple".to_string()]);
    worker.server.tls = Some(ServerTls {
        cert,
        key,
        client_ca: Some(pki.ca()),
    });
    let worker = tensorgate::run::start(worker, false).await.unwrap();

    let mut config = Config::embedded_default();
    config.server.grpc_listen = None;
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config
        .set_backends(&[format!("https://localhost:{}", worker.addr.port())])
        .unwrap();
    config.fleet.tls = BackendTls {
        ca: Some(pki.ca()),
        cert: Some(ccert),
        key: Some(ckey),
    };
    let gw = tensorgate::run::start(config, false).await.unwrap();

    let body = serde_json::json!({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": vec![5; 16]},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": vec![2; 16]}
    ]});
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v2/models/simple/infer", gw.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["outputs"][0]["data"], serde_json::json!(vec![7; 16]));
    assert_eq!(v["outputs"][1]["data"], serde_json::json!(vec![3; 16]));
    gw.shutdown().await;
    worker.shutdown().await;
}

/// check-config builds the TLS configs as serve does: a key that does not match its
/// certificate, or a client CA file without a certificate, fails the check (each file reads
/// fine on its own), with the line of the table that names them.
#[test]
fn check_config_refuses_tls_files_serve_would_refuse() {
    let pki = Pki::new("check-tls");
    let (cert, _) = pki.issue("server", &["127.0.0.1"], false);
    let (_, other_key) = pki.issue("other", &["127.0.0.1"], false);
    let config = cert.parent().unwrap().join("mismatch.toml");
    let check = |client_ca: Option<&Path>| {
        let mut text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[server.tls]\ncert = {:?}\nkey = {:?}\n",
            cert.display().to_string(),
            other_key.display().to_string(),
        );
        if let Some(ca) = client_ca {
            text.push_str(&format!("client_ca = {:?}\n", ca.display().to_string()));
        }
        std::fs::write(&config, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tensorgate"))
            .args(["check-config", config.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).trim_end().to_string()
    };
    assert_eq!(
        check(Some(&other_key)),
        format!(
            "{}:7: server.tls.client_ca: {} holds no certificate",
            config.display(),
            other_key.display()
        )
    );
    let err = check(None);
    assert!(
        err.starts_with(&format!(
            "{}:4: server.tls: certificate {} and key {} do not form a valid pair: ",
            config.display(),
            cert.display(),
            other_key.display()
        )),
        "{err}"
    );
}

/// A plain HTTP request on the TLS port is answered in plain HTTP, a 400 that says to use
/// https, as Go's and nginx's servers answer it: not a TLS alert that clients print as
/// garbage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_tls_port_gets_a_400_that_says_so() {
    let (pki, gw) = localhost_tls_gateway("plain").await;
    let r = reqwest::get(format!(
        "http://127.0.0.1:{}/v2/health/live",
        gw.addr.port()
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"error":"this port serves HTTPS: the request was sent as plain HTTP; use https://"}"#
    );
    // A POST whose body is still on its way gets the answer too, not a reset.
    let r = reqwest::Client::new()
        .post(format!(
            "http://127.0.0.1:{}/v2/models/simple/infer",
            gw.addr.port()
        ))
        .body(vec![b'7'; 32 << 10])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // TLS on the same port still works.
    let client = https_client(client_tls(&pki.ca(), None, &[b"http/1.1"]), false);
    let url = format!("https://localhost:{}/v2/health/live", gw.addr.port());
    assert_eq!(get(&client, &url).await.unwrap().0, 200);
    gw.shutdown().await;
}
