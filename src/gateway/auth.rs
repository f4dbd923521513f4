//! Optional bearer-token auth on the data plane. Health endpoints stay open so that
//! Kubernetes probes keep working. Tokens are compared in constant time (by digest, so that
//! not even their length leaks) and never logged.

use crate::config::AuthConfig;

/// The accepted tokens' SHA-256 digests. A presented token is hashed and compared with
/// each digest in constant time: comparing the tokens themselves would stop early at a
/// length mismatch and tell a client, by timing, how long the real tokens are.
#[derive(Default)]
pub struct Tokens(Vec<Digest>);

type Digest = [u8; 32];

fn digest(token: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

impl Tokens {
    /// `None` when auth is off.
    pub fn load(auth: &AuthConfig) -> Result<Option<Tokens>, String> {
        if !auth.enabled() {
            return Ok(None);
        }
        crate::config::tokens::read(auth)
            .map(|t| Some(Tokens(t.iter().map(|t| digest(t)).collect())))
    }

    /// Checks an `Authorization` header value.
    pub fn accepts(&self, header: Option<&http::HeaderValue>) -> bool {
        use subtle::ConstantTimeEq;
        let Some(given) = header.and_then(|h| {
            let v = h.as_bytes();
            (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].trim_ascii())
        }) else {
            return false;
        };
        let given = digest(given);
        // Every token is checked, without stopping at a match.
        self.0
            .iter()
            .fold(subtle::Choice::from(0), |ok, t| ok | t.ct_eq(&given))
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        std::env::set_var("TG_TEST_TOKENS", "alpha, beta\ngamma");
        let t = Tokens::load(&AuthConfig {
            tokens_file: None,
            tokens_env: Some("TG_TEST_TOKENS".into()),
        })
        .unwrap()
        .unwrap();
        let h = |s: &'static str| http::HeaderValue::from_static(s);
        assert!(t.accepts(Some(&h("Bearer beta"))));
        assert!(t.accepts(Some(&h("bearer gamma"))));
        assert!(!t.accepts(Some(&h("Bearer delta"))));
        assert!(!t.accepts(Some(&h("Bearer alph"))));
        assert!(!t.accepts(Some(&h("Bearer alphaa"))));
        assert!(!t.accepts(Some(&h("Basic alpha"))));
        assert!(!t.accepts(None));
        assert!(Tokens::load(&AuthConfig::default()).unwrap().is_none());
        let e = Tokens::load(&AuthConfig {
            tokens_file: None,
            tokens_env: Some("TG_TEST_UNSET_VAR".into()),
        })
        .err()
        .unwrap();
        assert_eq!(
            e,
            "auth.tokens_env names TG_TEST_UNSET_VAR, which is not set"
        );
    }
}
