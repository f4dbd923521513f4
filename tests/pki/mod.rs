//! A test CA made by rcgen that issues server and client certificates as PEM files. Shared
//! by `tests/tls.rs` and `examples/test_pki.rs`, which writes them for the Python TLS tests.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

pub struct Pki {
    dir: PathBuf,
    ca_cert: rcgen::Certificate,
    ca_key: KeyPair,
}

#[allow(dead_code)] // Each user of the module calls a different part of it.
impl Pki {
    /// A new CA in a fresh temporary directory.
    pub fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("tensorgate-tls-{tag}-{}", std::process::id()));
        Pki::in_dir(&dir, tag)
    }

    /// A new CA whose files (`ca.crt`, then what `issue` writes) go to `dir`.
    pub fn in_dir(dir: &Path, tag: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, format!("tensorgate test CA {tag}"));
        let ca_cert = p.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
            ca_cert,
            ca_key,
        }
    }

    /// Issues a certificate and writes `<name>.crt` and `<name>.key`. Names that parse as
    /// IP addresses become IP SANs, the others DNS SANs.
    pub fn issue(&self, name: &str, sans: &[&str], client: bool) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut p =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = p.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
        let (c, k) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
}
