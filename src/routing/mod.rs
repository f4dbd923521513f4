//! Choosing a backend: sequences by their pin or by a consistent hash that every replica
//! computes alike, everything else by load (power of two choices on outstanding requests).

pub mod maglev;
pub mod pins;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::GatewayError;
use crate::fleet::{BackendHandle, CatalogEntry};
use crate::protocol::{RequestOptions, SequenceId};
use pins::PinTable;

/// The hash seed is fixed: replicas must agree, so nothing here may vary per process.
const SEED: u64 = 0x7465_6e73_6f72_6761;

/// The routing key of a sequence: the model name and the id. No allocation: the model's
/// hash seeds the hash of the id, and the id's kind is folded in so that 7 and "7" differ.
pub fn sequence_key(model: &str, id: &SequenceId) -> u64 {
    let model_seed = xxh3_64_with_seed(model.as_bytes(), SEED);
    match id {
        SequenceId::Uint(u) => xxh3_64_with_seed(&u.to_le_bytes(), model_seed ^ 0x75),
        SequenceId::String(s) => xxh3_64_with_seed(s.as_bytes(), model_seed ^ 0x73),
    }
}

pub fn describe_sequence(id: &SequenceId) -> String {
    match id {
        SequenceId::Uint(u) => u.to_string(),
        SequenceId::String(s) => format!("'{s}'"),
    }
}

/// Power of two choices on outstanding requests, among backends not ejected (all of them
/// if every one is ejected, rather than failing outright).
pub fn pick_by_load(
    candidates: &[Arc<BackendHandle>],
    exclude: Option<&str>,
) -> Option<Arc<BackendHandle>> {
    let usable: Vec<&Arc<BackendHandle>> = candidates
        .iter()
        .filter(|h| Some(h.key.as_str()) != exclude && !h.health.is_ejected())
        .collect();
    let usable = if usable.is_empty() {
        candidates
            .iter()
            .filter(|h| Some(h.key.as_str()) != exclude)
            .collect()
    } else {
        usable
    };
    match usable.len() {
        0 => None,
        1 => Some(usable[0].clone()),
        n => {
            let a = fastrand::usize(..n);
            let mut b = fastrand::usize(..n - 1);
            if b >= a {
                b += 1;
            }
            let load =
                |h: &BackendHandle| h.outstanding.load(Ordering::Relaxed) as f64 / h.weight as f64;
            Some(if load(usable[b]) < load(usable[a]) {
                usable[b].clone()
            } else {
                usable[a].clone()
            })
        }
    }
}

pub struct Router {
    pub pins: PinTable,
}

impl Router {
    pub fn new(max_sequences: usize, idle: Duration) -> Self {
        Router {
            pins: PinTable::new(max_sequences, idle),
        }
    }

    /// The backend for a request. `exclude` names a backend that just refused a connection.
    pub fn route(
        &self,
        entry: &CatalogEntry,
        model: &str,
        opts: &RequestOptions,
        exclude: Option<&str>,
    ) -> Result<Arc<BackendHandle>, GatewayError> {
        let Some(id) = &opts.sequence_id else {
            return pick_by_load(&entry.ready, exclude).ok_or_else(|| {
                GatewayError::Unavailable(format!("no healthy backend serves model '{model}'"))
            });
        };
        if !opts.sequence_start {
            if let Some(pinned) = self.pins.get(model, id) {
                // A pinned sequence goes to its backend or nowhere: its state lives there.
                return match entry.ready.iter().find(|h| h.key == pinned) {
                    Some(h) => {
                        if opts.sequence_end {
                            self.pins.remove(model, id);
                        }
                        Ok(h.clone())
                    }
                    None => {
                        self.pins.remove(model, id);
                        Err(GatewayError::Unavailable(format!(
                            "the backend of sequence {} of model '{model}' ({pinned}) is unavailable; the sequence's state is lost",
                            describe_sequence(id)
                        )))
                    }
                };
            }
        }
        // A start, or a sequence this replica has not seen: the consistent hash decides,
        // as it does on every replica.
        let key = sequence_key(model, id);
        let owner = entry
            .maglev
            .lookup(key)
            .map(|i| entry.ready[i].clone())
            .ok_or_else(|| {
                GatewayError::Unavailable(format!("no healthy backend serves model '{model}'"))
            })?;
        let chosen = if opts.sequence_start
            && (owner.health.is_ejected() || Some(owner.key.as_str()) == exclude)
        {
            // A new sequence need not go to an ejected owner; pick by a fallback hash
            // so that this replica's choice is still stable.
            entry
                .ready
                .iter()
                .filter(|h| !h.health.is_ejected() && Some(h.key.as_str()) != exclude)
                .max_by_key(|h| xxh3_64_with_seed(h.key.as_bytes(), key))
                .cloned()
                .unwrap_or(owner)
        } else {
            owner
        };
        if opts.sequence_end {
            self.pins.remove(model, id);
        } else if !self.pins.insert(model, id, &chosen.key) {
            tracing::warn!(model, "sequence pin table is full; routing by hash alone");
        }
        Ok(chosen)
    }
}

#[cfg(test)]
const GOLDEN_UINT: u64 = 1408428525561239483;
#[cfg(test)]
const GOLDEN_STRING: u64 = 5227969456568744064;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_keys_are_stable_and_typed() {
        // Golden values: replicas running different builds must route alike, so a change
        // here is a breaking change that needs a release note.
        assert_eq!(
            sequence_key("accumulate", &SequenceId::Uint(7)),
            GOLDEN_UINT
        );
        assert_eq!(
            sequence_key("accumulate", &SequenceId::String("7".into())),
            GOLDEN_STRING
        );
        assert_ne!(GOLDEN_UINT, GOLDEN_STRING);
        assert_ne!(sequence_key("other", &SequenceId::Uint(7)), GOLDEN_UINT);
    }
}
