//! The catalog: for each model, its metadata (for validation) and the backends that have it
//! ready. Rebuilt after every refresh and read lock-free by every request.

use std::collections::BTreeMap;
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
    /// Tables whose membership did not change are taken from `previous`.
    pub fn build(backends: &[Arc<BackendHandle>], previous: &Catalog) -> Catalog {
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
                    maglev: Arc::new(Maglev::new(&[])),
                });
                if m.ready {
                    entry.ready.push(h.clone());
                }
            }
        }
        for (name, e) in models.iter_mut() {
            let members: Vec<(&str, u32)> =
                e.ready.iter().map(|h| (h.key.as_str(), h.weight)).collect();
            let same = previous.models.get(name).is_some_and(|p| {
                p.ready.len() == e.ready.len()
                    && p.ready
                        .iter()
                        .zip(&e.ready)
                        .all(|(a, b)| a.key == b.key && a.weight == b.weight)
            });
            e.maglev = match previous.models.get(name) {
                Some(p) if same => p.maglev.clone(),
                _ => Arc::new(Maglev::new(&members)),
            };
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
