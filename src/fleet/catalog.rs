//! The catalog: for each model, its metadata (for validation) and the backends that have it
//! ready. Rebuilt after every refresh and read lock-free by every request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{BackendHandle, BackendState};
use crate::protocol::ModelMetadata;
use crate::routing::table::SequenceTable;

#[derive(Clone)]
pub struct CatalogEntry {
    pub metadata: Arc<ModelMetadata>,
    /// Backends that report the model ready, in config order.
    pub ready: Vec<Arc<BackendHandle>>,
    /// The consistent-hash table over `ready`, for sequences.
    pub table: Arc<SequenceTable>,
    /// The tables this model had before its last membership changes, newest first, kept for
    /// one sequence idle timeout: a sequence that started under one of them lives on that
    /// table's owner, and a replica that never saw the sequence can only find it there.
    pub history: Vec<PastTable>,
    /// Some ready backend serves the name with other tensors than `metadata` (a rolling
    /// update to a version with new inputs, or two models that share a name): a request goes
    /// only to backends whose tensors are those it was checked against.
    pub mixed_tensors: bool,
    /// Whether the model's tensors start with a batch dimension, as the first ready backend
    /// that states a `max_batch_size` says (v2 metadata shows a leading -1 either way).
    /// `None`: no backend says.
    pub batches: Option<bool>,
    /// The smallest `max_batch_size` above 0 that a ready backend states: a request may go
    /// to any of them, and the model's configuration advertises it.
    pub max_batch_size: Option<u32>,
    /// Every ready backend states the model's configuration, and none runs it as a sequence
    /// model: a `sequence_id` sent to it is balanced like any request, not pinned. A backend
    /// that states nothing (MLServer, KServe) may keep state, so its sequences are pinned.
    pub stateless: bool,
    /// Every ready backend states the model keeps sequence state (`sequence_batching`): a
    /// request without a `sequence_id` is refused by the gateway, as each of them would.
    pub needs_sequence_id: bool,
}

pub use crate::routing::table::PastTable;

/// At most this many past tables per model: a rolling update changes membership once per
/// backend, and each past owner may cost a rejected attempt on a request's path.
pub const MAX_HISTORY: usize = 4;

/// How long past tables are kept, and the current time (a parameter, for tests).
#[derive(Clone, Copy)]
pub struct HistoryWindow {
    pub keep: Duration,
    pub now: Instant,
}

#[derive(Clone, Default)]
pub struct Catalog {
    pub models: BTreeMap<String, CatalogEntry>,
}

impl CatalogEntry {
    /// The model's backends as the router sees them.
    pub fn choices(&self) -> crate::routing::Choices<'_, BackendHandle> {
        crate::routing::Choices {
            ready: &self.ready,
            table: &self.table,
            history: &self.history,
        }
    }

    /// The ready backends a request for `version` (or any version) may go to.
    pub fn serving<'a>(
        &'a self,
        model: &'a str,
        version: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<BackendHandle>> + 'a {
        self.ready
            .iter()
            .filter(move |h| version.is_none_or(|v| h.lists_version(model, v) != Some(false)))
    }

    /// The largest batch a request for `version` (or any version) may carry: the smallest
    /// `max_batch_size` that the ready backends it may go to state.
    pub fn max_batch_size_for(&self, model: &str, version: Option<&str>) -> Option<u32> {
        if version.is_none() {
            return self.max_batch_size;
        }
        self.serving(model, version)
            .filter_map(|h| {
                let state = h.state.load();
                let n = state.models.get(model)?.stated.as_ref()?.max_batch_size?;
                (n > 0).then_some(n)
            })
            .min()
    }
}

impl Catalog {
    /// The first backend (in config order) that reports a model ready provides its metadata
    /// (else the first that reports it), so the choice is the same on every replica.
    /// Tables whose membership (and size) did not change are taken from `previous`.
    /// A model whose membership changed keeps the table it had in its `history`.
    pub fn build(
        backends: &[Arc<BackendHandle>],
        previous: &Catalog,
        table_size: usize,
        window: HistoryWindow,
    ) -> Catalog {
        let states: Vec<Arc<BackendState>> = backends.iter().map(|h| h.state.load_full()).collect();
        Catalog::build_from(backends, &states, previous, table_size, window)
    }

    /// [`Catalog::build`] from `states`, one per backend, which need not be the backends'
    /// own yet: a refresh builds the catalog from the states it found, and stores them after
    /// the catalog. Stored first, a model just loaded was in neither the old catalog nor
    /// its backend's list of unavailable models for a moment, and got 404 "unknown model".
    pub fn build_from(
        backends: &[Arc<BackendHandle>],
        states: &[Arc<BackendState>],
        previous: &Catalog,
        table_size: usize,
        window: HistoryWindow,
    ) -> Catalog {
        let mut models: BTreeMap<String, CatalogEntry> = BTreeMap::new();
        // Each model's ready backends' states, beside `CatalogEntry::ready`.
        let mut ready_states: HashMap<&str, Vec<&BackendState>> = HashMap::new();
        for (h, state) in backends.iter().zip(states) {
            let mut names: Vec<&String> = state.models.keys().collect();
            names.sort();
            for name in names {
                let m = &state.models[name];
                let entry = models.entry(name.clone()).or_insert_with(|| CatalogEntry {
                    metadata: Arc::new(m.metadata.clone()),
                    ready: Vec::new(),
                    table: Arc::new(SequenceTable::new(&[], table_size)),
                    history: Vec::new(),
                    mixed_tensors: false,
                    batches: None,
                    max_batch_size: None,
                    stateless: true,
                    needs_sequence_id: true,
                });
                if m.ready {
                    let stated = m.stated.as_ref();
                    entry.batches = entry
                        .batches
                        .or_else(|| stated?.max_batch_size.map(|n| n > 0));
                    entry.stateless &= stated.is_some_and(|s| !s.sequence_batching);
                    entry.needs_sequence_id &= stated.is_some_and(|s| s.sequence_batching);
                    if let Some(n) = stated.and_then(|s| s.max_batch_size).filter(|n| *n > 0) {
                        entry.max_batch_size = Some(entry.max_batch_size.map_or(n, |m| m.min(n)));
                    }
                    if entry.ready.is_empty() {
                        // Versions included: a backend that is not ready may list a
                        // version no ready backend serves.
                        entry.metadata = Arc::new(m.metadata.clone());
                    } else if !m.metadata.same_tensors(&entry.metadata) {
                        entry.mixed_tensors = true;
                    }
                    entry.ready.push(h.clone());
                    ready_states.entry(name).or_default().push(&**state);
                }
            }
        }
        for (name, e) in models.iter_mut() {
            e.stateless &= !e.ready.is_empty();
            e.needs_sequence_id &= !e.ready.is_empty();
            union_versions(
                name,
                e,
                ready_states.get(name.as_str()).map_or(&[], Vec::as_slice),
            );
        }
        // Models served by the same backends share one table.
        let mut built: HashMap<Vec<(String, u32)>, Arc<SequenceTable>> = HashMap::new();
        for prev in previous.models.values() {
            if prev.table.table_size() != table_size && !prev.ready.is_empty() {
                continue;
            }
            built
                .entry(signature(&prev.ready))
                .or_insert_with(|| prev.table.clone());
        }
        for (name, e) in models.iter_mut() {
            let sig = signature(&e.ready);
            e.table = built
                .entry(sig)
                .or_insert_with_key(|sig| {
                    let members: Vec<(&str, u32)> =
                        sig.iter().map(|(k, w)| (k.as_str(), *w)).collect();
                    // The model's own previous table is the cheap place to start from: a
                    // join or a leave updates it in O(buckets) rather than rebuilding.
                    Arc::new(match previous.models.get(name) {
                        Some(prev) => SequenceTable::derive(&prev.table, &members, table_size),
                        None => SequenceTable::new(&members, table_size),
                    })
                })
                .clone();
        }
        for (name, e) in models.iter_mut() {
            let prev = previous.models.get(name);
            if let Some(prev) = prev {
                e.history = history_after(prev, e, window);
            }
            if e.mixed_tensors && !prev.is_some_and(|p| p.mixed_tensors) {
                warn_mixed(name, e, &ready_states[name.as_str()]);
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

/// The versions a model lists are those of every ready backend that serves it with the
/// tensors shown (a rolling update has some backends on the new version and some on the
/// old): requests reach them all. Backends with other tensors keep theirs to themselves: a
/// request for one of those is checked against that backend's metadata (`lookup`).
fn union_versions(name: &str, e: &mut CatalogEntry, ready_states: &[&BackendState]) {
    let mut versions = e.metadata.versions.clone();
    for state in ready_states {
        let Some(m) = state.models.get(name) else {
            continue;
        };
        if m.metadata.same_tensors(&e.metadata) {
            for v in &m.metadata.versions {
                if !versions.contains(v) {
                    versions.push(v.clone());
                }
            }
        }
    }
    if versions.len() > e.metadata.versions.len() {
        // Numbers in their order, as Triton lists them; anything else after, as text.
        versions.sort_by(|a, b| {
            let key = |v: &String| v.parse::<u64>().map_err(|_| v.clone());
            key(a).cmp(&key(b))
        });
        Arc::make_mut(&mut e.metadata).versions = versions;
    }
}

/// Says once (when it begins) that backends serve `name` with different tensors, and which.
fn warn_mixed(name: &str, e: &CatalogEntry, ready_states: &[&BackendState]) {
    let (same, other): (Vec<_>, Vec<_>) = e.ready.iter().zip(ready_states).partition(|(_, s)| {
        s.models
            .get(name)
            .is_none_or(|m| m.metadata.same_tensors(&e.metadata))
    });
    let same: Vec<&Arc<BackendHandle>> = same.into_iter().map(|(h, _)| h).collect();
    let other: Vec<&Arc<BackendHandle>> = other.into_iter().map(|(h, _)| h).collect();
    let names =
        |hs: &[&Arc<BackendHandle>]| hs.iter().map(|h| &*h.name).collect::<Vec<_>>().join(", ");
    tracing::warn!(
        model = %name,
        shown = %names(&same),
        other = %names(&other),
        "backends serve this model with different tensors: requests without a version go only to those whose tensors the gateway shows, and a version to the backends that list it"
    );
}

/// The past tables of a model whose entry was `prev` and is now `now`: `prev`'s table joins
/// them if it differs, and tables older than the window, or beyond `MAX_HISTORY`, are
/// dropped.
fn history_after(prev: &CatalogEntry, now: &CatalogEntry, window: HistoryWindow) -> Vec<PastTable> {
    let mut history = Vec::with_capacity(MAX_HISTORY);
    let changed = signature(&prev.ready) != signature(&now.ready)
        || prev.table.table_size() != now.table.table_size();
    if changed && !prev.ready.is_empty() {
        history.push(PastTable {
            members: prev.ready.iter().map(|h| h.key.clone()).collect(),
            table: prev.table.clone(),
            replaced_at: window.now,
        });
    }
    history.extend(
        prev.history
            .iter()
            .filter(|t| window.now.saturating_duration_since(t.replaced_at) < window.keep)
            .cloned(),
    );
    history.truncate(MAX_HISTORY);
    history
}

/// The membership a table is built from: the key and weight of each ready backend, in order.
fn signature(ready: &[Arc<BackendHandle>]) -> Vec<(String, u32)> {
    ready.iter().map(|h| (h.key.clone(), h.weight)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::SequenceId;
    use crate::routing::{sequence_key, Router};

    const SIZE: usize = 65_537;

    fn handles(keys: &[&str]) -> Vec<Arc<BackendHandle>> {
        keys.iter()
            .map(|k| Arc::new(BackendHandle::for_test(k, 1, &["m"])))
            .collect()
    }

    fn members(t: &PastTable) -> Vec<&str> {
        t.members.iter().map(String::as_str).collect()
    }

    #[test]
    fn backends_with_other_tensors_mark_the_model_mixed() {
        let hs = handles(&["http://a", "http://b"]);
        let with_input = |h: &BackendHandle, input: &str| {
            let mut state = (**h.state.load()).clone();
            let m = state.models.get_mut("m").unwrap();
            m.metadata.inputs = vec![crate::protocol::TensorMetadata {
                name: input.into(),
                datatype: "FP32".into(),
                shape: vec![-1],
            }];
            h.state.store(Arc::new(state));
        };
        let window = HistoryWindow {
            keep: Duration::from_secs(60),
            now: Instant::now(),
        };
        with_input(&hs[0], "X");
        with_input(&hs[1], "X");
        let c = Catalog::build(&hs, &Catalog::default(), SIZE, window);
        assert!(!c.get("m").unwrap().mixed_tensors);
        with_input(&hs[1], "Y");
        let c = Catalog::build(&hs, &c, SIZE, window);
        let e = c.get("m").unwrap();
        assert!(e.mixed_tensors);
        assert_eq!(e.metadata.inputs[0].name, "X", "the first ready backend's");
        assert_eq!(e.ready.len(), 2, "both serve; routing picks by tensors");
        assert!(hs[1].has_other_tensors("m", &e.metadata));
        assert!(!hs[0].has_other_tensors("m", &e.metadata));
    }

    /// A model is stateless only when every ready backend states a configuration without
    /// `sequence_batching`; whether it batches is the first stating backend's word.
    #[test]
    fn what_backends_state_decides_pinning_and_batching() {
        use crate::fleet::backend::StatedConfig;
        let hs = handles(&["http://a", "http://b"]);
        let state = |h: &BackendHandle, stated: Option<StatedConfig>, ready: bool| {
            let mut s = (**h.state.load()).clone();
            let m = s.models.get_mut("m").unwrap();
            (m.stated, m.ready) = (stated, ready);
            h.state.store(Arc::new(s));
        };
        let says = |max_batch_size: Option<u32>, sequence_batching: bool| {
            Some(StatedConfig {
                max_batch_size,
                sequence_batching,
                labeled_outputs: vec![],
            })
        };
        let window = HistoryWindow {
            keep: Duration::from_secs(60),
            now: Instant::now(),
        };
        let built = || {
            let c = Catalog::build(&hs, &Catalog::default(), SIZE, window);
            let e = c.get("m").unwrap();
            (
                e.stateless,
                e.batches,
                e.needs_sequence_id,
                e.max_batch_size,
            )
        };
        assert_eq!(built(), (false, None, false, None), "nothing stated");
        state(&hs[0], says(None, false), true);
        assert_eq!(built(), (false, None, false, None), "b states nothing");
        state(&hs[1], says(Some(0), false), true);
        assert_eq!(built(), (true, Some(false), false, None));
        state(&hs[0], says(Some(8), false), true);
        assert_eq!(
            built(),
            (true, Some(true), false, Some(8)),
            "a's word, first in order"
        );
        state(&hs[1], says(Some(0), true), true);
        assert_eq!(
            built(),
            (false, Some(true), false, Some(8)),
            "b keeps sequence state"
        );
        state(&hs[1], None, false);
        assert_eq!(
            built(),
            (true, Some(true), false, Some(8)),
            "only ready backends count"
        );
        state(&hs[0], says(Some(8), false), false);
        assert_eq!(built(), (false, None, false, None), "none ready");
        state(&hs[0], says(Some(8), true), true);
        state(&hs[1], says(Some(4), true), true);
        assert_eq!(
            built(),
            (false, Some(true), true, Some(4)),
            "both keep state; the smaller limit"
        );
    }

    /// A rolling update: each backend lists its own versions; the model lists them all, in
    /// numeric order, but not those of a backend with other tensors.
    #[test]
    fn the_model_lists_every_ready_backends_versions() {
        let hs = handles(&["http://a", "http://b", "http://c"]);
        let set = |h: &BackendHandle, versions: &[&str], input: &str| {
            let mut s = (**h.state.load()).clone();
            let m = &mut s.models.get_mut("m").unwrap().metadata;
            m.versions = versions.iter().map(|v| v.to_string()).collect();
            m.inputs = vec![crate::protocol::TensorMetadata {
                name: input.into(),
                datatype: "FP32".into(),
                shape: vec![-1],
            }];
            h.state.store(Arc::new(s));
        };
        set(&hs[0], &["10"], "X");
        set(&hs[1], &["9", "10"], "X");
        set(&hs[2], &["11"], "Y");
        let window = HistoryWindow {
            keep: Duration::from_secs(60),
            now: Instant::now(),
        };
        let c = Catalog::build(&hs, &Catalog::default(), SIZE, window);
        assert_eq!(c.get("m").unwrap().metadata.versions, ["9", "10"]);
        assert_eq!(
            hs[0].state.load().models["m"].metadata.versions,
            ["10"],
            "the backend's own metadata is left alone"
        );
    }

    #[test]
    fn a_membership_change_keeps_the_past_table_for_the_window() {
        let t0 = Instant::now();
        let keep = Duration::from_secs(60);
        let at = |secs| HistoryWindow {
            keep,
            now: t0 + Duration::from_secs(secs),
        };
        let three = handles(&["http://a", "http://b", "http://c"]);
        let mut four = three.clone();
        four.extend(handles(&["http://d"]));

        let c0 = Catalog::build(&three, &Catalog::default(), SIZE, at(0));
        assert!(c0.get("m").unwrap().history.is_empty());

        let c1 = Catalog::build(&four, &c0, SIZE, at(10));
        let e1 = c1.get("m").unwrap();
        assert_eq!(e1.history.len(), 1);
        assert_eq!(
            members(&e1.history[0]),
            ["http://a", "http://b", "http://c"]
        );
        assert!(Arc::ptr_eq(
            &e1.history[0].table,
            &c0.get("m").unwrap().table
        ));

        // No change: the history stays as it was, until the window has passed.
        let c2 = Catalog::build(&four, &c1, SIZE, at(69));
        assert_eq!(c2.get("m").unwrap().history.len(), 1);
        let c3 = Catalog::build(&four, &c2, SIZE, at(70));
        assert!(c3.get("m").unwrap().history.is_empty());
    }

    #[test]
    fn history_is_newest_first_and_capped() {
        let t0 = Instant::now();
        let keys = [
            "http://a", "http://b", "http://c", "http://d", "http://e", "http://f", "http://g",
        ];
        let all = handles(&keys);
        let mut catalog = Catalog::build(
            &all[..1],
            &Catalog::default(),
            SIZE,
            HistoryWindow {
                keep: Duration::from_secs(600),
                now: t0,
            },
        );
        // A rolling update: one backend joins at a time.
        for n in 2..=keys.len() {
            let window = HistoryWindow {
                keep: Duration::from_secs(600),
                now: t0 + Duration::from_secs(n as u64),
            };
            catalog = Catalog::build(&all[..n], &catalog, SIZE, window);
        }
        let history = &catalog.get("m").unwrap().history;
        assert_eq!(history.len(), MAX_HISTORY);
        let sizes: Vec<usize> = history.iter().map(|t| t.members.len()).collect();
        assert_eq!(sizes, [6, 5, 4, 3]);
    }

    fn options(id: u64, start: bool) -> crate::protocol::RequestOptions {
        crate::protocol::RequestOptions {
            sequence_id: Some(SequenceId::Uint(id)),
            sequence_start: start,
            ..Default::default()
        }
    }

    #[test]
    fn an_unpinned_sequence_falls_back_to_its_owners_before_a_join() {
        let t0 = Instant::now();
        let window = |secs| HistoryWindow {
            keep: Duration::from_secs(300),
            now: t0 + Duration::from_secs(secs),
        };
        let all = handles(&["http://a", "http://b", "http://c", "http://d"]);
        let before = Catalog::build(&all[..3], &Catalog::default(), SIZE, window(0));
        let after = Catalog::build(&all, &before, SIZE, window(1));
        let (old, new) = (before.get("m").unwrap(), after.get("m").unwrap());
        let owner = |e: &CatalogEntry, id: u64| {
            e.ready[e
                .table
                .lookup(sequence_key("m", &SequenceId::Uint(id)))
                .unwrap()]
            .key
            .clone()
        };
        let moved = (1..1000u64)
            .find(|id| owner(old, *id) != owner(new, *id))
            .expect("a join moves some keys");
        let stayed = (1..1000u64)
            .find(|id| owner(old, *id) == owner(new, *id))
            .expect("most keys stay");

        let router = Router::new(100, Duration::from_secs(300));
        let route = router
            .route(new.choices(), "m", &options(moved, false), None)
            .unwrap();
        assert_eq!(route.backend.key, owner(new, moved));
        let fallbacks: Vec<&str> = route.fallbacks.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(fallbacks, [owner(old, moved).as_str()]);

        // A key that did not move, a start, and a pinned sequence have nothing to fall back to.
        assert!(router
            .route(new.choices(), "m", &options(stayed, false), None)
            .unwrap()
            .fallbacks
            .is_empty());
        let other = moved + 1_000_000;
        assert!(router
            .route(new.choices(), "m", &options(other, true), None)
            .unwrap()
            .fallbacks
            .is_empty());
        // Unpinned until a backend serves it: concurrent requests still fall back.
        let again = router
            .route(new.choices(), "m", &options(moved, false), None)
            .unwrap();
        assert!(again.pin_when_served() && !again.pinned_now);
        router.pin("m", &options(moved, false), again.fallbacks[0].as_ref());
        assert!(router
            .route(new.choices(), "m", &options(moved, false), None)
            .unwrap()
            .fallbacks
            .is_empty());

        // Once the window has passed, the hash alone decides.
        let later = Catalog::build(&all, &after, SIZE, window(301));
        let fresh = Router::new(100, Duration::from_secs(300));
        let route = fresh
            .route(
                later.get("m").unwrap().choices(),
                "m",
                &options(moved, false),
                None,
            )
            .unwrap();
        assert!(route.fallbacks.is_empty());
    }
}
