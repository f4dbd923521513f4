//! Which settings a reload cannot apply: those read once, when the process starts.

use super::Config;

/// The restart-only settings in which `new` differs from the `running` config, by their
/// config keys, each set back to its running value: the config a reload stores then says
/// what is in effect, and the next reload names the same settings again, for as long as the
/// file and the process disagree. Everything else (backends, models, labels, auth,
/// per-request limits, the hash table size, the DNS interval) takes effect on reload.
pub fn keep_restart_only(running: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    macro_rules! compare {
        ($section:ident: $($field:ident),+) => {$(
            if running.$section.$field != new.$section.$field {
                changed.push(concat!(stringify!($section), ".", stringify!($field)));
                new.$section.$field = running.$section.$field.clone();
            }
        )+};
    }
    compare!(server: listen, metrics_listen, grpc_listen, log_level, log_format, triton_metrics, tls, worker_threads);
    compare!(limits: max_header_bytes, max_buffered_body_bytes, max_concurrent_requests, max_connections, header_read_timeout_ms, send_timeout_ms, shutdown_delay_ms, drain_timeout_ms);
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
        let running = parse_and_check("[fleet]\nmax_sequences = 10\n").unwrap();
        let file = parse_and_check(
            "[server]\nlisten = \"127.0.0.1:9\"\n[limits]\nrequest_timeout_ms = 5\n\
             [fleet]\nmax_sequences = 20\nhash_table_size = 65537\n[models.m]\ntimeout_ms = 3\n",
        )
        .unwrap();
        let mut new = file.clone();
        assert_eq!(
            keep_restart_only(&running, &mut new),
            ["server.listen", "fleet.max_sequences"]
        );
        // What a reload applies is taken; what needs a restart keeps its running value.
        assert_eq!(new.limits.request_timeout_ms, 5);
        assert_eq!(new.fleet.hash_table_size, 65537);
        assert_eq!(new.server.listen, running.server.listen);
        assert_eq!(new.fleet.max_sequences, 10);
        // A second reload of the same file names the same settings again.
        let mut again = file.clone();
        assert_eq!(
            keep_restart_only(&new, &mut again),
            ["server.listen", "fleet.max_sequences"]
        );
        assert!(keep_restart_only(&running, &mut running.clone()).is_empty());
    }
}
