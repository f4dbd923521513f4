//! The repository extension across the fleet. In Triton behind a Service a load reaches one
//! pod; here it reaches every backend that lists `model_repository`, in parallel, and the
//! catalog is rebuilt before the answer, so that an infer sent right after a successful load
//! finds the model.

use std::sync::Arc;
use std::time::Duration;

use super::backend::{BackendError, RepositoryAction};
use super::{BackendHandle, Fleet};
use crate::models::repository::{IndexEntry, ModelState};

/// What one backend answered to a load or unload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlOutcome {
    pub backend: String,
    /// `Err` holds the backend's message.
    pub result: Result<(), String>,
    /// The failure was the backend refusing the request itself (a 4xx, or the in-process
    /// models' own check: no such model, a model that cannot load), not a failure of the
    /// backend or of the way to it.
    pub refused: bool,
    /// The backend is this process's own models (a worker's, or `serve`'s in-process ones).
    pub in_process: bool,
    /// Not asked: the health checks found it unreachable (it reads its repository again
    /// when it starts). `result` is `Ok`: it fails nothing that could be done.
    pub skipped: bool,
}

impl Fleet {
    /// Sends `action` on `model` to every backend that has a model repository and is
    /// reachable, and waits for all of them (each within `timeout`), then refreshes the
    /// catalog. Empty when no backend has a repository.
    pub async fn control(
        &self,
        model: &str,
        action: RepositoryAction,
        timeout: Duration,
    ) -> Vec<ControlOutcome> {
        let backends = self.backends();
        let calls = backends
            .iter()
            .filter(|h| {
                // A backend that never answered may have a repository: it is listed (as
                // skipped), so that the answer does not claim the whole fleet took the change.
                let state = h.state.load();
                state.capabilities.repository || (!state.reachable && state.server.is_none())
            })
            .map(|h| async move {
                let skipped = || ControlOutcome {
                    backend: h.name.to_string(),
                    result: Ok(()),
                    refused: false,
                    in_process: h.backend.in_process(),
                    skipped: true,
                };
                if !h.state.load().reachable {
                    // A backend that is down would fail every load and unload of the fleet
                    // until it returns; it reads its repository when it does.
                    return skipped();
                }
                if action == RepositoryAction::Load {
                    mark_loading(h, model);
                }
                let (result, refused) =
                    match tokio::time::timeout(timeout, h.backend.control(model, action)).await {
                        Ok(Ok(())) => (Ok(()), false),
                        // Down since the last health check: nothing was sent, as above.
                        Ok(Err(BackendError::Connect(_))) => return skipped(),
                        Ok(Err(e)) => (Err(message(&e)), refusal(&e)),
                        Err(_) => (
                            Err(format!("no answer within {} ms", timeout.as_millis())),
                            false,
                        ),
                    };
                ControlOutcome {
                    backend: h.name.to_string(),
                    result,
                    refused,
                    in_process: h.backend.in_process(),
                    skipped: false,
                }
            });
        let outcomes = futures_util::future::join_all(calls).await;
        if !outcomes.is_empty() {
            self.refresh().await;
        }
        outcomes
    }
}

/// Until the refresh after the load, the index says LOADING for the model on `h` (unless
/// `h` serves it already: a reload keeps the loaded model serving, and READY).
fn mark_loading(h: &BackendHandle, model: &str) {
    let mut state = (**h.state.load()).clone();
    state.unavailable.retain(|e| e.name != model);
    state.unavailable.push(IndexEntry {
        name: model.to_string(),
        version: None,
        state: ModelState::Loading,
        reason: "a load is in progress".into(),
    });
    h.state.store(Arc::new(state));
}

/// A 4xx answer to a load or unload (Triton answers 400 for a model it does not have or
/// cannot load), or the in-process models' refusal.
fn refusal(e: &BackendError) -> bool {
    match e {
        BackendError::Rejected(_) => true,
        BackendError::Status { status, .. } => status.is_client_error(),
        _ => false,
    }
}

fn message(e: &BackendError) -> String {
    match e {
        BackendError::Status { status, message } => format!("{}: {message}", status.as_u16()),
        BackendError::Connect(m)
        | BackendError::Reset(m)
        | BackendError::Failed(m)
        | BackendError::Rejected(m)
        | BackendError::Broken(m) => m.clone(),
    }
}
