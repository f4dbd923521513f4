//! Redis URLs as `[fleet.pins]` takes them: checked by `check-config`, and shown without
//! their password in messages and logs. Here rather than in `pinstore`, which uses config,
//! so that the arrow between them points one way.

/// Accepts what the client accepts, and only the schemes the docs promise.
pub fn check_url(url: &str) -> Result<(), String> {
    // The URL's own complaint (empty host, invalid port number) where it does not parse.
    if let Err(e) = url::Url::parse(url) {
        return Err(format!("'{}' is not a valid URL: {e}", redact(url)));
    }
    let parsed = redis::parse_redis_url(url)
        .ok_or_else(|| format!("'{}' is not a redis:// or rediss:// URL", redact(url)))?;
    if !matches!(parsed.scheme(), "redis" | "rediss") {
        return Err(format!(
            "'{}' must start with redis:// or rediss://",
            redact(url)
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("'{}' has no host", redact(url)));
    }
    if parsed.port() == Some(0) {
        return Err(format!(
            "'{}' has port 0: a port is 1 to 65535",
            redact(url)
        ));
    }
    // The client reads no password from the query (a `?password=` went unused, and into
    // every log line that names the URL).
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!(
            "'{}' must not have a query or fragment: a password goes before the host, as in redis://:PASSWORD@host:6379/0",
            redact(url)
        ));
    }
    let db = parsed.path().trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        let why = if db.bytes().all(|b| b.is_ascii_digit()) {
            "is out of range"
        } else {
            "is not a number"
        };
        return Err(format!(
            "'{}': the path must be a database number, as in redis://host:6379/0; '/{db}' {why}",
            redact(url)
        ));
    }
    redis::Client::open(url)
        .map(drop)
        .map_err(|e| format!("'{}': {e}", redact(url)))
}

/// Reads `fleet.pins.ca`, a PEM bundle that replaces the usual roots for `rediss://`: for
/// `serve` and `check-config` alike. One without a certificate (a key, an empty file, DER
/// bytes) is refused: with it the store could never connect.
pub fn read_ca(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let pem = std::fs::read(path)
        .map_err(|e| format!("fleet.pins.ca: cannot read {}: {e}", path.display()))?;
    if !CertificateDer::pem_slice_iter(&pem).any(|c| c.is_ok()) {
        return Err(format!(
            "fleet.pins.ca: {} holds no PEM certificate (BEGIN CERTIFICATE)",
            path.display()
        ));
    }
    Ok(pem)
}

/// The URL without its password, for messages and logs, whatever its scheme. The password
/// ends at the last `@`, not at the first `/`, `?` or `#`: a password written without
/// percent-encoding may hold any of them (and such a URL is exactly the one an error message
/// shows). Erring the other way only hides more than the password.
/// A query (which `check_url` refuses) is hidden whole: it may carry a password too.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let at = url[scheme_end..].rfind('@').map(|i| scheme_end + i);
    let rest = at.unwrap_or(scheme_end);
    let tail = match url[rest..].find('?').map(|i| rest + i) {
        Some(q) => format!("{}?***", &url[rest..q]),
        None => url[rest..].to_string(),
    };
    match at.and_then(|at| url[scheme_end..at].find(':').map(|i| scheme_end + i)) {
        Some(colon) => format!("{}:***{tail}", &url[..colon]),
        None => format!("{}{tail}", &url[..rest]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_passwords_hidden() {
        assert_eq!(check_url("redis://127.0.0.1:6379/0"), Ok(()));
        assert_eq!(check_url("rediss://:secret@redis.example:6380"), Ok(()));
        let db = "the path must be a database number, as in redis://host:6379/0";
        for (url, error) in [
            ("http://127.0.0.1:6379", "'http://127.0.0.1:6379' is not a redis:// or rediss:// URL".to_string()),
            ("redis://:secret@127.0.0.1:6379/x", format!("'redis://:***@127.0.0.1:6379/x': {db}; '/x' is not a number")),
            ("redis://h:6379/99999999999", format!("'redis://h:6379/99999999999': {db}; '/99999999999' is out of range")),
            ("redis://:6379/0", "'redis://:6379/0' is not a valid URL: empty host".into()),
            ("redis://x:99999/0", "'redis://x:99999/0' is not a valid URL: invalid port number".into()),
            ("redis://127.0.0.1:6379/0?password=pw", "'redis://127.0.0.1:6379/0?***' must not have a query or fragment: a password goes before the host, as in redis://:PASSWORD@host:6379/0".into()),
            ("redis://127.0.0.1:0/0", "'redis://127.0.0.1:0/0' has port 0: a port is 1 to 65535".into()),
        ] {
            assert_eq!(check_url(url), Err(error), "{url}");
        }
        for (url, shown) in [
            ("redis://user:secret@h:1/2", "redis://user:***@h:1/2"),
            ("redis://h:1", "redis://h:1"),
            ("http://:pw@h:1", "http://:***@h:1"),
            ("redis://user@h:1", "redis://user@h:1"),
            ("not a url", "not a url"),
            ("redis://h:1/0?password=pw", "redis://h:1/0?***"),
            ("redis://:a?b@h:1/0?password=pw", "redis://:***@h:1/0?***"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
        // Passwords that were not percent-encoded hide nothing of themselves.
        for password in ["se?cret", "se/cret", "se#cret", "se@cret", "a/b?c#d@e"] {
            let url = format!("redis://:{password}@h:1/0");
            assert_eq!(redact(&url), "redis://:***@h:1/0", "{url}");
            if let Err(e) = check_url(&url) {
                assert!(!e.contains(password), "{e}");
            }
        }
    }
}
