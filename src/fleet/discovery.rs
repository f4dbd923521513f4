//! Turning configured backends into concrete ones: a static URL is one backend; with
//! `discovery = "dns"`, every address its host resolves to is a backend of its own.

use std::net::IpAddr;

use super::backend::BoxFuture;

/// Resolves host names. The default uses the system's DNS configuration and hosts file
/// (hickory-resolver); tests substitute a fixed table.
pub trait Resolve: Send + Sync {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, String>>;
}

pub struct SystemResolver {
    resolver: hickory_resolver::TokioResolver,
}

impl SystemResolver {
    pub fn new() -> Result<Self, String> {
        let resolver = hickory_resolver::Resolver::builder_tokio()
            .map_err(|e| format!("cannot read the system DNS configuration: {e}"))?
            .build();
        Ok(SystemResolver { resolver })
    }
}

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, String>> {
        Box::pin(async move {
            if let Ok(ip) = host
                .trim_matches(|c| c == '[' || c == ']')
                .parse::<IpAddr>()
            {
                return Ok(vec![ip]);
            }
            let lookup = self
                .resolver
                .lookup_ip(host)
                .await
                .map_err(|e| format!("cannot resolve '{host}': {e}"))?;
            Ok(lookup.iter().collect())
        })
    }
}

/// A fixed table of names, for tests and for setups without DNS.
pub struct StaticResolver(pub std::collections::HashMap<String, Vec<IpAddr>>);

impl Resolve for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, String>> {
        Box::pin(async move {
            self.0
                .get(host)
                .cloned()
                .ok_or_else(|| format!("cannot resolve '{host}': not in the table"))
        })
    }
}

/// A static backend's URL in one spelling: its key (hashing, pins, shared pins in Redis)
/// must be the same on every replica, and `HTTP://Host:8000/` and `http://host:8000` name
/// the same server (a user's replicas that spelt one backend two ways refused each other's
/// sequences with 503s). The scheme and host are lowercased and a bare `/` path dropped; the
/// port stays as written, so that the keys of URLs already in this form do not change. A URL
/// with user information is left alone.
pub fn canonical_url(url: &str) -> String {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return url.to_string();
    };
    match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority))
            if !authority.as_str().contains('@')
                && matches!(uri.path(), "" | "/")
                && uri.query().is_none() =>
        {
            format!(
                "{}://{}",
                scheme.to_ascii_lowercase(),
                authority.as_str().to_ascii_lowercase()
            )
        }
        _ => url.to_string(),
    }
}

/// The URL of one address of a DNS backend: same scheme and port, the address as host.
pub fn address_url(url: &http::Uri, ip: IpAddr) -> String {
    let scheme = url.scheme_str().unwrap_or("http");
    let port = url.port_u16().unwrap_or(80);
    match ip {
        IpAddr::V4(v4) => format!("{scheme}://{v4}:{port}"),
        IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_url;

    #[test]
    fn one_server_has_one_key() {
        for url in [
            "http://127.0.0.1:19001",
            "http://127.0.0.1:19001/",
            "HTTP://127.0.0.1:19001",
            "Http://127.0.0.1:19001/",
        ] {
            assert_eq!(canonical_url(url), "http://127.0.0.1:19001", "{url}");
        }
        assert_eq!(
            canonical_url("https://Triton.Example"),
            "https://triton.example"
        );
        assert_eq!(canonical_url("http://[::1]:8000/"), "http://[::1]:8000");
        // Left as written: the word builtin, and user information (case matters there).
        assert_eq!(canonical_url("builtin"), "builtin");
        assert_eq!(
            canonical_url("http://User:Pw@host:1/"),
            "http://User:Pw@host:1/"
        );
    }
}
