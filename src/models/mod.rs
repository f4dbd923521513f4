//! The built-in models, behind the `Model` trait. They serve in-process (the `builtin`
//! backend) and from `tensorgate worker` processes.

mod accumulate;
mod classifier;
mod identity;
#[cfg(feature = "onnx")]
pub mod onnx;
pub mod repository;
mod simple;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::protocol::{DataType, InferRequest, ModelMetadata, Tensor, TensorMetadata};

pub use accumulate::Accumulate;
pub use classifier::Classifier;
pub use identity::Identity;
pub use simple::Simple;

/// Why a model refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// The request is wrong for this model (400).
    Invalid(String),
    /// The model failed to run a valid request (a runtime's error): 500 for this request,
    /// and the server goes on.
    Failed(String),
}

impl ModelError {
    pub fn message(&self) -> &str {
        match self {
            ModelError::Invalid(m) | ModelError::Failed(m) => m,
        }
    }
}

pub trait Model: Send + Sync {
    fn metadata(&self) -> &ModelMetadata;
    /// Runs the model. The request has been validated against `metadata()`; every output is
    /// returned and the caller keeps the ones the client asked for.
    fn infer(&self, req: &InferRequest) -> Result<Vec<Tensor>, ModelError>;
    /// Runs version `version` of the model (`None`: the one `infer` runs). Models with one
    /// version need not override it.
    fn infer_version(
        &self,
        _version: Option<&str>,
        req: &InferRequest,
    ) -> Result<Vec<Tensor>, ModelError> {
        self.infer(req)
    }
    /// The largest batch the model takes (config.pbtxt's `max_batch_size`; 0: no batch
    /// dimension), where the model knows it. `None`: not known (the demo models take any).
    fn max_batch_size(&self) -> Option<u32> {
        None
    }
    /// Whether the model keeps state across the requests of a sequence (Triton's
    /// `sequence_batching`): tools that read the configuration then send sequences.
    fn sequence_batching(&self) -> bool {
        false
    }
    /// Classification labels the model carries for `output`, if any.
    /// Shared, since the gateway asks on every request it classifies.
    fn labels(&self, _output: &str) -> Option<Arc<Vec<String>>> {
        None
    }
    /// The outputs that carry labels, each with the file its labels came from (config.pbtxt's
    /// `label_filename`), as the model's configuration shows them. A model whose labels are
    /// built in names each `<output>.labels`.
    fn label_files(&self) -> Vec<(String, String)> {
        self.metadata()
            .outputs
            .iter()
            .filter(|o| self.labels(&o.name).is_some())
            .map(|o| (o.name.clone(), format!("{}.labels", o.name)))
            .collect()
    }
    /// For a model whose runs take real time: how many may run at once. Such a model runs on
    /// the blocking pool, never on the async workers, so that it cannot delay health checks
    /// or other models. `None` (the built-in demo models): cheap, run in place.
    fn instances(&self) -> Option<usize> {
        None
    }
}

pub(crate) fn tensor_meta(name: &str, dt: DataType, shape: &[i64]) -> TensorMetadata {
    TensorMetadata {
        name: name.into(),
        datatype: dt.as_str().into(),
        shape: shape.to_vec(),
    }
}

pub(crate) fn metadata(
    name: &str,
    inputs: Vec<TensorMetadata>,
    outputs: Vec<TensorMetadata>,
) -> ModelMetadata {
    ModelMetadata {
        name: name.into(),
        versions: vec!["1".into()],
        platform: "tensorgate_builtin".into(),
        inputs,
        outputs,
    }
}

pub(crate) fn input<'a>(req: &'a InferRequest, name: &str) -> Result<&'a Tensor, ModelError> {
    req.inputs
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| ModelError::Invalid(format!("input '{name}' is missing")))
}

/// How long `accumulate` keeps an idle sequence's state unless the config or
/// `tensorgate worker --sequence-idle-timeout-ms` says otherwise.
pub const DEFAULT_SEQUENCE_IDLE_TIMEOUT_MS: u64 = 60_000;

/// Settings of the built-in models that come from the config.
#[derive(Debug, Clone)]
pub struct BuiltinSettings {
    pub sequence_idle_timeout: Duration,
}

impl Default for BuiltinSettings {
    fn default() -> Self {
        BuiltinSettings {
            sequence_idle_timeout: Duration::from_millis(DEFAULT_SEQUENCE_IDLE_TIMEOUT_MS),
        }
    }
}

/// Names of every built-in model.
pub fn builtin_names() -> Vec<String> {
    let mut v = vec![
        "simple".to_string(),
        "accumulate".into(),
        "classifier".into(),
    ];
    v.extend(DataType::ALL.iter().map(|dt| Identity::name_for(*dt)));
    v
}

/// Checks a built-in backend's `models` list: each name is a built-in model, or, with a
/// model repository, a model directory in it. `serve`, `worker` and `check-config` refuse
/// alike what it refuses.
pub fn check_model_names(
    names: &[String],
    repository: Option<&std::path::Path>,
) -> Result<(), String> {
    let builtin = builtin_names();
    // A model's name is one directory of the repository, never a path out of it.
    let plain = |n: &str| !n.is_empty() && n != "." && n != ".." && !n.contains(['/', '\\']);
    let Some(bad) = names.iter().find(|n| {
        !builtin.contains(n) && !repository.is_some_and(|dir| plain(n) && dir.join(n).is_dir())
    }) else {
        return Ok(());
    };
    Err(match repository {
        None => format!(
            "unknown built-in model '{bad}' (the built-in models are {})",
            builtin.join(", ")
        ),
        Some(dir) => format!(
            "model '{bad}' is neither a built-in model nor a model directory of {} (the built-in models are {})",
            dir.display(),
            builtin.join(", ")
        ),
    })
}

/// The built-in models a built-in backend whose config lists `models` builds: all of them
/// for an empty list, else those the list names (none when it names repository models only).
pub fn selected_builtin(models: &[String]) -> Option<Vec<String>> {
    if models.is_empty() {
        return Some(Vec::new());
    }
    let builtin = builtin_names();
    let named: Vec<String> = models
        .iter()
        .filter(|n| builtin.contains(n))
        .cloned()
        .collect();
    (!named.is_empty()).then_some(named)
}

/// Builds the named built-in models (all of them when `only` is empty).
pub fn builtin_models(
    only: &[String],
    settings: &BuiltinSettings,
) -> Result<BTreeMap<String, Arc<dyn Model>>, String> {
    let all = builtin_names();
    for n in only {
        if !all.contains(n) {
            return Err(format!(
                "unknown built-in model '{n}' (the built-in models are {})",
                all.join(", ")
            ));
        }
    }
    let mut out: BTreeMap<String, Arc<dyn Model>> = BTreeMap::new();
    for name in all
        .into_iter()
        .filter(|n| only.is_empty() || only.contains(n))
    {
        let m: Arc<dyn Model> = match name.as_str() {
            "simple" => Arc::new(Simple::new()),
            "accumulate" => Arc::new(Accumulate::new(settings.sequence_idle_timeout)),
            "classifier" => Arc::new(Classifier::new()),
            other => {
                let dt = DataType::ALL
                    .iter()
                    .copied()
                    .find(|dt| Identity::name_for(*dt) == other)
                    .expect("every other built-in name is an identity model");
                Arc::new(Identity::new(dt))
            }
        };
        out.insert(name, m);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name is one directory of the repository: a path out of it names nothing.
    #[test]
    fn model_names_are_plain_directory_names() {
        let root = std::env::temp_dir().join(format!("tg-names-{}", std::process::id()));
        let repo = root.join("repo");
        std::fs::create_dir_all(repo.join("double")).unwrap();
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_model_names(&names(&["double", "simple"]), Some(&repo)).is_ok());
        for bad in ["../elsewhere", "..", ".", "double/", ""] {
            let e = check_model_names(&names(&[bad]), Some(&repo)).unwrap_err();
            assert!(e.starts_with(&format!("model '{bad}' is neither")), "{e}");
        }
        assert!(check_model_names(&names(&["double"]), None).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
