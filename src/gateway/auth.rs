//! Optional bearer-token auth on the data plane. Health endpoints stay open so that
//! Kubernetes probes keep working. Tokens are compared in constant time and never logged.

use crate::config::AuthConfig;

#[derive(Default)]
pub struct Tokens(Vec<Vec<u8>>);

impl Tokens {
    /// `None` when auth is off.
    pub fn load(auth: &AuthConfig) -> Result<Option<Tokens>, String> {
        if !auth.enabled() {
            return Ok(None);
        }
        crate::config::tokens::read(auth).map(|t| Some(Tokens(t)))
    }

    /// Checks an `Authorization` header value.
    pub fn accepts(&self, header: Option<&http::HeaderValue>) -> bool {
        let Some(given) = header.and_then(|h| {
            let v = h.as_bytes();
            (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].trim_ascii())
        }) else {
            return false;
        };
        // Check every token without stopping early, so timing says nothing about them.
        self.0
            .iter()
            .fold(false, |ok, t| ok | constant_time_eq(t, given))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
