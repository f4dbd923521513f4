//! Prometheus metrics and their exposition on the metrics listener.

use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub config_reloads: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "tensorgate_http_requests_total",
                "HTTP requests answered, by status code",
            ),
            &["code"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(requests.clone()))
            .expect("unique metric");
        let config_reloads = IntCounterVec::new(
            Opts::new(
                "tensorgate_config_reloads_total",
                "Config reloads, by result",
            ),
            &["result"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(config_reloads.clone()))
            .expect("unique metric");
        Metrics {
            registry,
            requests,
            config_reloads,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding metrics to a Vec cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
