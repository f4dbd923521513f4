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

/// The URL of one address of a DNS backend: same scheme and port, the address as host.
pub fn address_url(url: &http::Uri, ip: IpAddr) -> String {
    let scheme = url.scheme_str().unwrap_or("http");
    let port = url.port_u16().unwrap_or(80);
    match ip {
        IpAddr::V4(v4) => format!("{scheme}://{v4}:{port}"),
        IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{port}"),
    }
}
