//! Which settings a reload cannot apply: those read once, when the process starts.

use super::Config;

/// The restart-only settings that differ between `old` and `new`, by their config keys.
/// Everything else (backends, models, labels, auth, per-request limits, the hash table size,
/// the DNS interval) takes effect on reload.
pub fn restart_only_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    macro_rules! compare {
        ($section:ident: $($field:ident),+) => {$(
            if old.$section.$field != new.$section.$field {
                changed.push(concat!(stringify!($section), ".", stringify!($field)));
            }
        )+};
    }
    compare!(server: listen, metrics_listen, grpc_listen, log_level, log_format, triton_metrics, tls, worker_threads);
    compare!(limits: max_header_bytes, max_concurrent_requests, header_read_timeout_ms, shutdown_delay_ms, drain_timeout_ms);
    compare!(fleet: refresh_interval_ms, probe_timeout_ms, unhealthy_after_checks, connect_timeout_ms,
        pool_idle_timeout_ms, eject_after_failures, eject_base_ms, eject_max_ms,
        sequence_idle_timeout_ms, max_sequences, watch_config, tls, pins);
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_and_check;

    #[test]
    fn names_only_what_changed_and_cannot_be_applied() {
        let old = parse_and_check("[fleet]\nmax_sequences = 10\n").unwrap();
        let new = parse_and_check(
            "[server]\nlisten = \"127.0.0.1:9\"\n[limits]\nrequest_timeout_ms = 5\n\
             [fleet]\nmax_sequences = 20\nhash_table_size = 65537\n[models.m]\ntimeout_ms = 3\n",
        )
        .unwrap();
        assert_eq!(
            restart_only_changes(&old, &new),
            ["server.listen", "fleet.max_sequences"]
        );
        assert!(restart_only_changes(&old, &old).is_empty());
    }
}
