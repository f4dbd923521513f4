//! Choosing a backend for a request: sequences by a hash that every replica computes alike,
//! everything else by load.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::fleet::BackendHandle;
use crate::protocol::SequenceId;

/// The hash seed is fixed: replicas must agree, so nothing here may vary per process.
const SEED: u64 = 0x7465_6e73_6f72_6761;

/// The routing key of a sequence: the model name and the id.
pub fn sequence_key(model: &str, id: &SequenceId) -> u64 {
    let mut buf = Vec::with_capacity(model.len() + 1 + 24);
    buf.extend_from_slice(model.as_bytes());
    buf.push(0);
    match id {
        SequenceId::Uint(u) => {
            buf.push(b'u');
            buf.extend_from_slice(&u.to_le_bytes());
        }
        SequenceId::String(s) => {
            buf.push(b's');
            buf.extend_from_slice(s.as_bytes());
        }
    }
    xxh3_64_with_seed(&buf, SEED)
}

/// Rendezvous hashing: the backend with the highest hash of (key, backend name) wins.
pub fn pick_by_hash(candidates: &[Arc<BackendHandle>], key: u64) -> Option<Arc<BackendHandle>> {
    candidates
        .iter()
        .max_by_key(|h| xxh3_64_with_seed(h.name.as_bytes(), key ^ SEED))
        .cloned()
}

/// Power of two choices on outstanding requests.
pub fn pick_by_load(candidates: &[Arc<BackendHandle>]) -> Option<Arc<BackendHandle>> {
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0].clone()),
        n => {
            let a = fastrand::usize(..n);
            let mut b = fastrand::usize(..n - 1);
            if b >= a {
                b += 1;
            }
            let (x, y) = (&candidates[a], &candidates[b]);
            let load = |h: &BackendHandle| h.outstanding.load(Ordering::Relaxed);
            Some(if load(y) < load(x) {
                y.clone()
            } else {
                x.clone()
            })
        }
    }
}

pub fn pick(
    candidates: &[Arc<BackendHandle>],
    model: &str,
    sequence: Option<&SequenceId>,
) -> Option<Arc<BackendHandle>> {
    match sequence {
        Some(id) => pick_by_hash(candidates, sequence_key(model, id)),
        None => pick_by_load(candidates),
    }
}
