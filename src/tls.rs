//! TLS with rustls (ring provider): the listener's config, reloadable without a restart, and
//! the client config for https:// backends. TLS 1.2 and 1.3 only; ALPN offers h2 and
//! http/1.1.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{BackendTls, ServerTls};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("invalid PEM in {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a private key from {}: {e}", path.display()))
}

fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    for c in certs(path)? {
        store
            .add(c)
            .map_err(|e| format!("invalid CA certificate in {}: {e}", path.display()))?;
    }
    Ok(store)
}

/// Builds the listener's TLS config from its files. An error names the key of the file at
/// fault (`cert`, `key`, `client_ca`).
/// `table` (`server.tls`, `fleet.tls`) before an error of `server_config` or
/// `client_config`: joined to the key the error names (`server.tls.cert: ...`), so that
/// check-config points at that key's line, not the table's.
pub fn in_table(table: &str, error: &str) -> String {
    let names_key = ["cert: ", "key: ", "ca: ", "client_ca: "]
        .iter()
        .any(|k| error.starts_with(k));
    if names_key {
        format!("{table}.{error}")
    } else {
        format!("{table}: {error}")
    }
}

pub fn server_config(tls: &ServerTls) -> Result<ServerConfig, String> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| e.to_string())?;
    let builder = match &tls.client_ca {
        Some(ca) => {
            let roots = roots(ca).map_err(|e| format!("client_ca: {e}"))?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| format!("client_ca: {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(
            certs(&tls.cert).map_err(|e| format!("cert: {e}"))?,
            key(&tls.key).map_err(|e| format!("key: {e}"))?,
        )
        .map_err(|e| {
            format!(
                "certificate {} and key {} do not form a valid pair: {e}",
                tls.cert.display(),
                tls.key.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The listener's TLS config, swapped in place when its files change.
pub struct ReloadableTls {
    files: ServerTls,
    current: ArcSwap<ServerConfig>,
    /// The files' contents as last tried, loaded or not: a pair that failed is not tried
    /// again (and logged again) every poll, only once the files change once more.
    fingerprint: std::sync::Mutex<u64>,
    /// `tensorgate_tls_handshake_failures_total`: a failed handshake is otherwise seen only
    /// at debug, and an mTLS rollout that locks clients out would go unnoticed.
    failures: Option<prometheus::IntCounterVec>,
}

impl ReloadableTls {
    pub fn new(files: ServerTls) -> Result<Self, String> {
        let config = server_config(&files)?;
        let fingerprint = fingerprint(&files);
        Ok(ReloadableTls {
            files,
            current: ArcSwap::from_pointee(config),
            fingerprint: std::sync::Mutex::new(fingerprint),
            failures: None,
        })
    }

    /// Counts failed handshakes in `failures` (label `reason`).
    pub fn counting_failures(mut self, failures: prometheus::IntCounterVec) -> Self {
        self.failures = Some(failures);
        self
    }

    /// A handshake failed (`timed_out`: none completed in time).
    pub fn handshake_failed(&self, timed_out: bool) {
        if let Some(f) = &self.failures {
            f.with_label_values(&[if timed_out { "timeout" } else { "error" }])
                .inc();
        }
    }

    /// The config new connections are accepted with.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    /// Reads the files again; on error the old config stays.
    pub fn reload(&self) -> Result<(), String> {
        *self.fingerprint.lock().expect("not poisoned") = fingerprint(&self.files);
        let config = server_config(&self.files)?;
        self.current.store(Arc::new(config));
        Ok(())
    }

    /// Reloads when the files' contents changed since the last attempt.
    pub fn reload_if_changed(&self) -> Option<Result<(), String>> {
        let now = fingerprint(&self.files);
        if now == *self.fingerprint.lock().expect("not poisoned") {
            return None;
        }
        Some(self.reload())
    }

    pub fn files(&self) -> Vec<PathBuf> {
        let mut v = vec![self.files.cert.clone(), self.files.key.clone()];
        v.extend(self.files.client_ca.clone());
        v
    }
}

fn fingerprint(files: &ServerTls) -> u64 {
    let mut all = Vec::new();
    for p in [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        all.extend(std::fs::read(p).unwrap_or_default());
        all.push(0);
    }
    xxhash_rust::xxh3::xxh3_64(&all)
}

/// The client config for https:// backends.
pub fn client_config(tls: &BackendTls) -> Result<ClientConfig, String> {
    let roots = match &tls.ca {
        Some(ca) => roots(ca).map_err(|e| format!("ca: {e}"))?,
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    // hyper-rustls sets ALPN itself from the HTTP versions enabled on the connector.
    let config = match (&tls.cert, &tls.key) {
        (Some(c), Some(k)) => builder
            .with_client_auth_cert(
                certs(c).map_err(|e| format!("cert: {e}"))?,
                key(k).map_err(|e| format!("key: {e}"))?,
            )
            .map_err(|e| format!("client certificate {}: {e}", c.display()))?,
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("fleet.tls needs both cert and key for a client certificate".into()),
    };
    Ok(config)
}
