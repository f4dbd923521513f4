//! Get-or-claim, batched: the claims that arrive while one round trip is in flight go to
//! Redis together, as one script call over all their keys.
//!
//! A claim is the store's hot operation (a sequence request this replica holds no fresh pin
//! for, and every background renewal). One script call per claim costs Redis a command's
//! fixed overhead (a read, a dispatch, a write) and the gateway a write, a read and a wake-up
//! each; under load a batch shares them. With no load a batch holds one claim and costs the
//! same as before; under load the batch grows with the round trip, so the queue drains as
//! fast as Redis answers.

use std::sync::OnceLock;

use prometheus::IntCounter;
use redis::aio::ConnectionManager;
use redis::Script;
use tokio::sync::{mpsc, oneshot};

/// Get-or-claim for every key: the holder of KEYS[i] if there is one (its TTL renewed,
/// since a request uses it), else '' after storing ARGV[i + 1] with the TTL ARGV[1] (an
/// empty string reads the same in RESP2 and RESP3, where Lua's false would not; no backend
/// key is empty). Redis runs a script atomically, so two replicas that claim at once agree on the
/// first, and a key that appears twice in a batch gets the first claim's backend both times
/// (the second as a holder).
const CLAIM_ALL: &str = r"
local holders = {}
for i, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder then
    redis.call('PEXPIRE', key, ARGV[1])
    holders[i] = holder
  else
    redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
    holders[i] = ''
  end
end
return holders
";

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The backend the store holds for the sequence.
    pub holder: String,
    /// This claim stored it: no replica had claimed the sequence before.
    pub created: bool,
}

/// Claims per script call at most: keeps one call's time inside Redis short for the other
/// clients it serves.
const MAX_BATCH: usize = 128;
/// Claims waiting for their batch at most. The callers are requests (bounded by
/// `limits.max_concurrent_requests`) and renewals; a full queue answers at once with an
/// error, and the caller routes without the store, as for any other failure.
const QUEUE: usize = 4096;

struct Claim {
    key: String,
    backend: String,
    reply: oneshot::Sender<Result<Claimed, String>>,
}

pub struct Claims {
    conn: ConnectionManager,
    ttl_ms: u64,
    round_trips: IntCounter,
    /// Started by the first claim, inside the runtime that serves requests.
    queue: OnceLock<mpsc::Sender<Claim>>,
}

impl Claims {
    pub fn new(conn: ConnectionManager, ttl_ms: u64, round_trips: IntCounter) -> Self {
        Claims {
            conn,
            ttl_ms,
            round_trips,
            queue: OnceLock::new(),
        }
    }

    /// The sequence's backend: the one already stored, or `backend`, stored now.
    pub async fn claim(&self, key: String, backend: String) -> Result<Claimed, String> {
        let (reply, answer) = oneshot::channel();
        self.queue()
            .try_send(Claim {
                key,
                backend,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    format!("{QUEUE} claims already wait for Redis")
                }
                mpsc::error::TrySendError::Closed(_) => "the claim batcher stopped".to_string(),
            })?;
        answer
            .await
            .map_err(|_| "the claim batcher stopped".to_string())?
    }

    fn queue(&self) -> &mpsc::Sender<Claim> {
        self.queue.get_or_init(|| {
            let (send, receive) = mpsc::channel(QUEUE);
            tokio::spawn(run(
                receive,
                self.conn.clone(),
                self.ttl_ms,
                self.round_trips.clone(),
            ));
            send
        })
    }
}

/// One batch in flight at a time; it ends when the `Claims` that feeds it is dropped.
async fn run(
    mut queue: mpsc::Receiver<Claim>,
    mut conn: ConnectionManager,
    ttl_ms: u64,
    round_trips: IntCounter,
) {
    let script = Script::new(CLAIM_ALL);
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // A caller that gave up (its timeout passed) needs no answer.
        batch.retain(|c: &Claim| !c.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let mut call = script.prepare_invoke();
        call.arg(ttl_ms);
        for claim in &batch {
            call.key(&claim.key).arg(&claim.backend);
        }
        round_trips.inc();
        let answer: Result<Vec<String>, String> = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| e.to_string())
            .and_then(|holders: Vec<String>| {
                if holders.len() == batch.len() {
                    Ok(holders)
                } else {
                    Err(format!(
                        "the claim script answered {} holders for {} keys",
                        holders.len(),
                        batch.len()
                    ))
                }
            });
        match answer {
            Ok(holders) => {
                for (claim, holder) in batch.drain(..).zip(holders) {
                    let claimed = if holder.is_empty() {
                        Claimed {
                            holder: claim.backend,
                            created: true,
                        }
                    } else {
                        Claimed {
                            holder,
                            created: false,
                        }
                    };
                    let _ = claim.reply.send(Ok(claimed));
                }
            }
            Err(error) => {
                for claim in batch.drain(..) {
                    let _ = claim.reply.send(Err(error.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn claims() -> Claims {
        // Never connected: the batcher gets no chance to run in these tests.
        let client = redis::Client::open("redis://127.0.0.1:1/0").unwrap();
        let conn = ConnectionManager::new_lazy_with_config(
            client,
            redis::aio::ConnectionManagerConfig::new(),
        )
        .unwrap();
        Claims::new(conn, 1000, IntCounter::new("trips", "trips").unwrap())
    }

    /// A full queue answers at once, with an error, instead of waiting behind the others:
    /// the caller routes without the store.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_refuses_at_once() {
        let claims = claims();
        for n in 0..QUEUE {
            // Each claim is queued, then waits for its answer; the wait is given up here.
            let polled = claims.claim(format!("k{n}"), "b".into()).now_or_never();
            assert!(polled.is_none(), "claim {n} waits for its batch");
        }
        let refused = claims.claim("one more".into(), "b".into()).now_or_never();
        assert_eq!(
            refused,
            Some(Err(format!("{QUEUE} claims already wait for Redis")))
        );
    }
}
