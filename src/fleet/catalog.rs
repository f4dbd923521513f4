//! The catalog: for each model, its metadata (for validation) and the backends that have it
//! ready. Rebuilt after every refresh and read lock-free by every request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::BackendHandle;
use crate::protocol::ModelMetadata;
use crate::routing::maglev::Maglev;

#[derive(Clone)]
pub struct CatalogEntry {
    pub metadata: Arc<ModelMetadata>,
    /// Backends that report the model ready, in config order.
    pub ready: Vec<Arc<BackendHandle>>,
    /// The consistent-hash table over `ready`, for sequences.
    pub maglev: Arc<Maglev>,
}

#[derive(Clone, Default)]
pub struct Catalog {
    pub models: BTreeMap<String, CatalogEntry>,
}

impl Catalog {
    /// The first backend (in config order) that reports a model provides its metadata, so the
    /// choice is the same on every replica.
    /// Tables whose membership (and size) did not change are taken from `previous`.
    pub fn build(
        backends: &[Arc<BackendHandle>],
        previous: &Catalog,
        table_size: usize,
    ) -> Catalog {
        let mut models: BTreeMap<String, CatalogEntry> = BTreeMap::new();
        for h in backends {
            let state = h.state.load();
            let mut names: Vec<&String> = state.models.keys().collect();
            names.sort();
            for name in names {
                let m = &state.models[name];
                let entry = models.entry(name.clone()).or_insert_with(|| CatalogEntry {
                    metadata: Arc::new(m.metadata.clone()),
                    ready: Vec::new(),
                    maglev: Arc::new(Maglev::new(&[], table_size)),
                });
                if m.ready {
                    entry.ready.push(h.clone());
                }
            }
        }
        // Models served by the same backends share one table.
        let mut built: HashMap<Vec<(String, u32)>, Arc<Maglev>> = HashMap::new();
        for prev in previous.models.values() {
            if prev.maglev.table_size() != table_size && !prev.ready.is_empty() {
                continue;
            }
            built
                .entry(signature(&prev.ready))
                .or_insert_with(|| prev.maglev.clone());
        }
        for e in models.values_mut() {
            let sig = signature(&e.ready);
            e.maglev = built
                .entry(sig)
                .or_insert_with_key(|sig| {
                    let members: Vec<(&str, u32)> =
                        sig.iter().map(|(k, w)| (k.as_str(), *w)).collect();
                    Arc::new(Maglev::new(&members, table_size))
                })
                .clone();
        }
        Catalog { models }
    }

    pub fn get(&self, model: &str) -> Option<&CatalogEntry> {
        self.models.get(model)
    }

    /// Ready: at least one model has a backend that reports it ready.
    pub fn any_ready(&self) -> bool {
        self.models.values().any(|e| !e.ready.is_empty())
    }
}

/// The membership a table is built from: the key and weight of each ready backend, in order.
fn signature(ready: &[Arc<BackendHandle>]) -> Vec<(String, u32)> {
    ready.iter().map(|h| (h.key.clone(), h.weight)).collect()
}
