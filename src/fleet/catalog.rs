//! The catalog: for each model, its metadata (for validation) and the backends that have it
//! ready. Rebuilt after every refresh and read lock-free by every request.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::BackendHandle;
use crate::protocol::ModelMetadata;

#[derive(Clone)]
pub struct CatalogEntry {
    pub metadata: Arc<ModelMetadata>,
    /// Backends that report the model ready, in config order.
    pub ready: Vec<Arc<BackendHandle>>,
}

#[derive(Clone, Default)]
pub struct Catalog {
    pub models: BTreeMap<String, CatalogEntry>,
}

impl Catalog {
    /// The first backend (in config order) that reports a model provides its metadata, so the
    /// choice is the same on every replica.
    pub fn build(backends: &[Arc<BackendHandle>]) -> Catalog {
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
                });
                if m.ready {
                    entry.ready.push(h.clone());
                }
            }
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
