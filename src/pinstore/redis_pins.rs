//! The Redis side of the shared pins: one key per live sequence, holding its backend's key
//! (the backend URL, the same on every replica), with a TTL of the sequence idle timeout.

use std::time::Duration;

use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, Script};

use crate::config::redis_url::redact;

use crate::protocol::SequenceId;

use super::claims::{Claimed, Claims};

/// Stores ARGV[1] for KEYS[1] with the TTL ARGV[2] whatever was there, and when it replaces
/// another backend, announces it on the changes channel ARGV[3] as `backend\nkey`: replicas
/// that cached the old backend drop it, rather than send the id's next requests to the old
/// sequence's state until their next renewal. The channel is an argument, not a key: an ACL
/// user needs the channel, not a key of that name. A refused PUBLISH (an ACL without the
/// channel) does not undo the SET, which Redis does not roll back: the script answers -1,
/// stored but not announced, instead of an error that would read as a store outage.
const PUT: &str = r"
local old = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if old and old ~= ARGV[1] then
  local sent = redis.pcall('PUBLISH', ARGV[3], ARGV[1] .. '\n' .. KEYS[1])
  if type(sent) == 'table' and sent.err then
    return -1
  end
end
return 0
";

/// Deletes KEYS[1] only while it holds ARGV[1], the backend the caller knows the sequence
/// by, and announces the deletion on ARGV[2] (`\nkey`: no backend): 1 when deleted, 0 when
/// the key names another backend or none, -1 when deleted but not announced (see `PUT`). A
/// replica whose cached pin is out of date (another replica ended the sequence and a third
/// started the id again elsewhere) must not delete the pin of a sequence that lives.
const REMOVE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local sent = redis.pcall('PUBLISH', ARGV[2], '\n' .. KEYS[1])
  if type(sent) == 'table' and sent.err then
    return -1
  end
  return 1
end
return 0
";

/// Whether a write that moved or removed a pin reached the other replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announced {
    /// Announced, or nothing to announce.
    Yes,
    /// Written, but Redis refused the PUBLISH (an ACL user without the channel).
    Refused,
}

impl Announced {
    fn from_reply(code: i64) -> Self {
        if code < 0 {
            Announced::Refused
        } else {
            Announced::Yes
        }
    }
}

pub struct RedisPins {
    /// For the startup probe and the changes channel, which open connections of their own.
    client: Client,
    conn: ConnectionManager,
    claims: Claims,
    prefix: String,
    /// Where pins that move or go are announced: `{prefix}changes`.
    channel: String,
    ttl_ms: u64,
    put: Script,
    remove: Script,
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
        // The client leaves Nagle's algorithm on: a command written while another is still
        // unanswered (a PUT beside a claim batch) would wait for Redis to ACK the first.
        let info = url
            .into_connection_info()
            .map_err(|e| format!("{}: {e}", redact(url)))?;
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        let info = info.set_tcp_settings(tcp);
        let client = match ca {
            Some(pem) => Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            ),
            None => Client::open(info),
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
            channel: changes_channel(prefix),
            ttl_ms,
            put: Script::new(PUT),
            remove: Script::new(REMOVE),
        })
    }

    /// The key prefix, to read the keys the changes channel names.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A connection subscribed to the changes channel: each message is `backend\nkey` (a
    /// pin that moved to `backend`) or `\nkey` (a pin removed).
    pub async fn subscribe_to_changes(&self) -> redis::RedisResult<redis::aio::PubSub> {
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        Ok(pubsub)
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

    /// Sends PING through the connection that operations use, up to three times, each
    /// within `wait`. After an outage that connection may still hold the failure of its last
    /// reconnection, which the next operation gets even though Redis answers again; a failed
    /// PING makes it reconnect, and the next one goes over the new connection.
    pub async fn reconnect(&self, wait: Duration) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..3 {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("PING");
            match tokio::time::timeout(wait, cmd.query_async::<String>(&mut conn)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = format!("no answer within {} ms", wait.as_millis()),
            }
        }
        Err(last)
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
    /// that served the sequence holds its state. A replaced backend is announced (`PUT`).
    pub async fn put(&self, key: &str, backend: &str) -> redis::RedisResult<Announced> {
        let mut conn = self.conn.clone();
        self.put
            .key(key)
            .arg(backend)
            .arg(self.ttl_ms)
            .arg(&self.channel)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(Announced::from_reply)
    }

    /// Removes the pin if it still names `backend`, and announces it (`REMOVE`).
    pub async fn remove(&self, key: &str, backend: &str) -> redis::RedisResult<Announced> {
        let mut conn = self.conn.clone();
        self.remove
            .key(key)
            .arg(backend)
            .arg(&self.channel)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(Announced::from_reply)
    }
}

/// The channel on which the replicas sharing `prefix` announce pins that moved or went.
pub fn changes_channel(prefix: &str) -> String {
    format!("{prefix}changes")
}

/// A change announced on the channel: the sequence's new backend (`None`: its pin was
/// removed), its model and its id. `None` for a message that names no key under `prefix`.
pub fn parse_change(prefix: &str, message: &[u8]) -> Option<(Option<String>, String, SequenceId)> {
    let message = std::str::from_utf8(message).ok()?;
    let (backend, key) = message.split_once('\n')?;
    let rest = key.strip_prefix(prefix)?;
    // The model's own ':' are escaped, so the first ':' ends it.
    let (model, rest) = rest.split_once(':')?;
    let model = model.replace("%3A", ":").replace("%25", "%");
    let id = match rest.split_once(':')? {
        ("u", n) => SequenceId::Uint(n.parse().ok()?),
        ("s", s) => SequenceId::String(s.to_string()),
        _ => return None,
    };
    let backend = (!backend.is_empty()).then(|| backend.to_string());
    Some((backend, model, id))
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
    fn announced_changes_read_back_as_the_keys_they_name() {
        let p = "tensorgate:pin:";
        for (model, id) in [
            ("accumulate", SequenceId::Uint(u64::MAX)),
            ("a:s%3A", SequenceId::String("u:7\nnext line".into())),
            ("m", SequenceId::String(String::new())),
        ] {
            let key = pin_key(p, model, &id);
            assert_eq!(
                parse_change(p, format!("http://b:8000\n{key}").as_bytes()),
                Some((Some("http://b:8000".into()), model.to_string(), id.clone()))
            );
            assert_eq!(
                parse_change(p, format!("\n{key}").as_bytes()),
                Some((None, model.to_string(), id))
            );
        }
        for junk in [
            &b"no newline"[..],
            b"\nother:prefix:m:u:1",
            b"\ntensorgate:pin:m:x:1",
            b"\ntensorgate:pin:m:u:not a number",
            b"\ntensorgate:pin:m",
            b"\xff\ntensorgate:pin:m:u:1",
        ] {
            assert_eq!(parse_change(p, junk), None, "{junk:?}");
        }
    }

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

    /// Both connections (commands and the changes subscription) come from this client.
    #[tokio::test]
    async fn connections_are_made_without_nagle() {
        for url in ["redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0"] {
            let trips = IntCounter::new("trips", "trips").unwrap();
            let pins = RedisPins::new(
                url,
                None,
                "p:",
                Duration::from_secs(1),
                Duration::from_secs(1),
                trips,
            )
            .unwrap();
            let info = pins.client.get_connection_info();
            assert!(info.tcp_settings().nodelay(), "{url}");
        }
    }
}
