//! Writes a test PKI made by rcgen into a directory: `ca.crt`, `server.crt`/`server.key`
//! (for localhost and 127.0.0.1) and `client.crt`/`client.key`. The Python TLS tests
//! (tests/interop/test_tls.py) run it, so that tritonclient meets the same kind of
//! certificates as the Rust tests.
//!
//! Usage: `cargo run --example test_pki -- DIR`

#[path = "../tests/pki/mod.rs"]
mod pki;

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: test_pki DIR");
        std::process::exit(2);
    };
    let pki = pki::Pki::in_dir(std::path::Path::new(&dir), "interop");
    pki.issue("server", &["localhost", "127.0.0.1"], false);
    pki.issue("client", &["tensorgate-test-client"], true);
    println!("{}", pki.ca().display());
}
