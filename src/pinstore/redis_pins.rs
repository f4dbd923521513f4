//! The Redis side of the shared pins: one key per live sequence, holding its backend's key
//! (the backend URL, the same on every replica), with a TTL of the sequence idle timeout.

use std::time::Duration;

use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Client;

use crate::config::redis_url::redact;

use crate::protocol::SequenceId;

use super::claims::{Claimed, Claims};

pub struct RedisPins {
    /// For the startup probe, which opens a connection of its own.
    client: Client,
    conn: ConnectionManager,
    claims: Claims,
    prefix: String,
    ttl_ms: u64,
}

impl RedisPins {
    /// Connects lazily: a Redis that is down at startup delays nothing, and the manager
    /// reconnects by itself after a connection breaks.
    /// `ca`: a PEM bundle that replaces the usual roots for `rediss://`. `claim_trips` counts
    /// the script calls that carry claims, one per batch.
    pub fn new(
        url: &str,
        ca: Option<Vec<u8>>,
        prefix: &str,
        ttl: Duration,
        timeout: Duration,
        claim_trips: IntCounter,
    ) -> Result<Self, String> {
        let client = match ca {
            Some(pem) => Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            ),
            None => Client::open(url),
        }
        .map_err(|e| format!("{}: {e}", redact(url)))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            // One reconnection attempt per failed operation: the caller already routes
            // without the store meanwhile, and retries come with later requests.
            .set_number_of_retries(1)
            .set_max_delay(timeout);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)
            .map_err(|e| format!("{}: {e}", redact(url)))?;
        let ttl_ms = ttl.as_millis().max(1) as u64;
        Ok(RedisPins {
            client,
            claims: Claims::new(conn.clone(), ttl_ms, claim_trips),
            conn,
            prefix: prefix.to_string(),
            ttl_ms,
        })
    }

    /// Opens a connection and sends PING, within `wait`. At startup, with more time than an
    /// operation gets, so that a refusal (a wrong password, a certificate that is not
    /// trusted) is reported as what it is: within `timeout_ms` it would only be "no answer".
    pub async fn probe(&self, wait: Duration) -> Result<(), String> {
        let ping = async {
            let mut conn = self
                .client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(wait, ping)
            .await
            .map_err(|_| format!("no answer within {} ms", wait.as_millis()))?
    }

    pub fn key(&self, model: &str, id: &SequenceId) -> String {
        pin_key(&self.prefix, model, id)
    }

    /// The sequence's backend: the one already stored (its TTL renewed), or `backend`,
    /// stored now. Batched with the claims of other requests (see `claims`).
    pub async fn claim(&self, key: String, backend: &str) -> Result<Claimed, String> {
        self.claims.claim(key, backend.to_string()).await
    }

    /// Stores `backend` whatever was there: a start begins a new sequence, and a past owner
    /// that served the sequence holds its state.
    pub async fn put(&self, key: &str, backend: &str) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(key)
            .arg(backend)
            .arg("PX")
            .arg(self.ttl_ms)
            .query_async(&mut conn)
            .await
    }

    pub async fn remove(&self, key: &str) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("DEL").arg(key).query_async(&mut conn).await
    }
}

/// `{prefix}{model}:u:{id}` or `{prefix}{model}:s:{id}`, so that 7 and "7" differ. The model
/// name has `%` and `:` percent-encoded, so that no two (model, id) pairs share a key.
pub fn pin_key(prefix: &str, model: &str, id: &SequenceId) -> String {
    let mut key = String::with_capacity(prefix.len() + model.len() + 24);
    key.push_str(prefix);
    for c in model.chars() {
        match c {
            '%' => key.push_str("%25"),
            ':' => key.push_str("%3A"),
            c => key.push(c),
        }
    }
    match id {
        SequenceId::Uint(u) => {
            key.push_str(":u:");
            key.push_str(itoa::Buffer::new().format(*u));
        }
        SequenceId::String(s) => {
            key.push_str(":s:");
            key.push_str(s);
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_readable_and_unambiguous() {
        let p = "tensorgate:pin:";
        assert_eq!(
            pin_key(p, "accumulate", &SequenceId::Uint(7)),
            "tensorgate:pin:accumulate:u:7"
        );
        assert_eq!(
            pin_key(p, "accumulate", &SequenceId::String("7".into())),
            "tensorgate:pin:accumulate:s:7"
        );
        // Without the escape these two would both be "a:s:u:7".
        assert_ne!(
            pin_key(p, "a:s", &SequenceId::Uint(7)),
            pin_key(p, "a", &SequenceId::String("u:7".into()))
        );
        assert_eq!(
            pin_key(p, "a:s%", &SequenceId::Uint(7)),
            "tensorgate:pin:a%3As%25:u:7"
        );
    }
}
