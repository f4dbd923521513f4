//! The bearer tokens that `[auth]` names, read from its file and its environment variable:
//! here, below both `serve` (which enforces them) and `check-config` (which must refuse what
//! `serve` would refuse to start with).

use super::AuthConfig;

/// Tokens separated by commas or line breaks. A line that starts with `#` is a comment:
/// operators annotate secret files, and a comment taken as a token would be a password that
/// nobody meant to set.
pub fn split(text: &str) -> impl Iterator<Item = Vec<u8>> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.as_bytes().to_vec())
}

/// Every token of `auth`, or why there is none to use: a file that cannot be read, a variable
/// that is not set, or sources that hold no token (auth configured with no way in).
pub fn read(auth: &AuthConfig) -> Result<Vec<Vec<u8>>, String> {
    let mut tokens = Vec::new();
    if let Some(path) = &auth.tokens_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read auth.tokens_file {}: {e}", path.display()))?;
        tokens.extend(split(&text));
    }
    if let Some(var) = &auth.tokens_env {
        let text = std::env::var(var)
            .map_err(|_| format!("auth.tokens_env names {var}, which is not set"))?;
        tokens.extend(split(&text));
    }
    if tokens.is_empty() {
        return Err("auth is configured but no token was found \
                    (a tokens file of comments and blank lines holds none)"
            .into());
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_separators() {
        let commented: Vec<Vec<u8>> =
            split("# rotated 2026-11, old one below\n  #old\none, two\n\nthree").collect();
        assert_eq!(commented, [&b"one"[..], b"two", b"three"]);
    }

    #[test]
    fn sources_without_a_token_are_refused() {
        let e = read(&AuthConfig {
            tokens_file: None,
            tokens_env: Some("TG_TEST_UNSET_VAR_TOKENS".into()),
        })
        .unwrap_err();
        assert_eq!(
            e,
            "auth.tokens_env names TG_TEST_UNSET_VAR_TOKENS, which is not set"
        );
        std::env::set_var("TG_TEST_COMMENT_ONLY_TOKENS", "# none yet\n\n");
        let e = read(&AuthConfig {
            tokens_file: None,
            tokens_env: Some("TG_TEST_COMMENT_ONLY_TOKENS".into()),
        })
        .unwrap_err();
        assert_eq!(
            e,
            "auth is configured but no token was found (a tokens file of comments and blank lines holds none)"
        );
    }
}
