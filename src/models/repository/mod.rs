//! A Triton-style model repository: `DIR/<model>/<version>/model.onnx`, with an optional
//! `DIR/<model>/config.pbtxt`. Each model is loaded on its own: one that fails is
//! UNAVAILABLE with its reason, and the others serve.

pub mod config;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::config::{ModelConfigFile, VersionPolicy};
use super::{Model, ModelError};
use crate::protocol::{InferRequest, ModelMetadata, Tensor, TensorMetadata};

const MODEL_FILE: &str = "model.onnx";
const ONNX_PLATFORMS: &[&str] = &["onnxruntime_onnx", "onnxruntime", "onnx"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    Ready,
    Unavailable,
    Loading,
}

impl ModelState {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Ready => "READY",
            ModelState::Unavailable => "UNAVAILABLE",
            ModelState::Loading => "LOADING",
        }
    }
}

/// What the repository knows of a model version beside its `model.onnx`: the parts of
/// config.pbtxt that shape its metadata.
#[derive(Debug, Clone, Default)]
pub struct ModelSettings {
    pub name: String,
    pub versions: Vec<String>,
    /// `platform` or `backend` from config.pbtxt; "onnxruntime_onnx" as Triton reports it
    /// otherwise.
    pub platform: Option<String>,
    pub max_batch_size: u32,
    /// Tensors config.pbtxt lists (name, datatype, dims without the batch dimension when
    /// `max_batch_size > 0`). Empty: the graph's own.
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
    /// config.pbtxt's `reshape` of inputs and of outputs, by tensor name: the shape in the
    /// model after any batch dimension, where the tensor's dims are what clients see.
    pub input_reshapes: HashMap<String, Vec<i64>>,
    pub output_reshapes: HashMap<String, Vec<i64>>,
    /// Classification labels by output name.
    pub labels: HashMap<String, Vec<String>>,
    pub instances: usize,
}

/// Loads one version's model file: with tract, or not at all in a build without the `onnx`
/// feature.
#[cfg(feature = "onnx")]
fn load_version(path: &Path, settings: ModelSettings) -> Result<Arc<dyn Model>, String> {
    super::onnx::OnnxModel::load(path, settings).map(|m| Arc::new(m) as Arc<dyn Model>)
}

#[cfg(not(feature = "onnx"))]
fn load_version(path: &Path, _settings: ModelSettings) -> Result<Arc<dyn Model>, String> {
    Err(format!(
        "{}: this tensorgate was built without ONNX support (the onnx feature)",
        path.display()
    ))
}

/// One line of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    pub version: Option<String>,
    pub state: ModelState,
    pub reason: String,
}

/// The result of loading one model directory.
pub struct LoadedModel {
    /// Present when at least one version loaded.
    pub model: Option<Arc<dyn Model>>,
    /// One entry per version tried (one without a version when the model failed as a whole).
    pub entries: Vec<IndexEntry>,
}

pub struct Repository {
    dir: PathBuf,
    /// Names a repository model may not take (the built-in models').
    reserved: BTreeSet<String>,
}

impl Repository {
    pub fn open(dir: &Path, reserved: impl IntoIterator<Item = String>) -> Result<Self, String> {
        if !dir.is_dir() {
            return Err(format!(
                "model repository {} is not a directory",
                dir.display()
            ));
        }
        Ok(Repository {
            dir: dir.to_path_buf(),
            reserved: reserved.into_iter().collect(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model directories, by name.
    pub fn model_names(&self) -> Result<Vec<String>, String> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Whether `name` is a model directory of this repository.
    pub fn has(&self, name: &str) -> bool {
        is_plain_name(name) && self.dir.join(name).is_dir()
    }

    /// Reads and loads one model, with every version its policy selects. Slow (tract
    /// optimises each graph): call it on a blocking thread.
    pub fn load(&self, name: &str) -> LoadedModel {
        match self.try_load(name) {
            Ok(loaded) => loaded,
            Err(reason) => LoadedModel {
                model: None,
                entries: vec![IndexEntry {
                    name: name.to_string(),
                    version: None,
                    state: ModelState::Unavailable,
                    reason,
                }],
            },
        }
    }

    /// Whether `name` is a built-in model's, which no repository model may take.
    pub fn is_reserved(&self, name: &str) -> bool {
        self.reserved.contains(name)
    }

    fn try_load(&self, name: &str) -> Result<LoadedModel, String> {
        if !is_plain_name(name) {
            return Err(format!("'{name}' is not a model directory name"));
        }
        if self.is_reserved(name) {
            return Err(format!(
                "'{name}' is the name of a built-in model; rename the repository's directory"
            ));
        }
        let dir = self.dir.join(name);
        let config_path = dir.join("config.pbtxt");
        let config = if config_path.exists() {
            config::read(&config_path)?
        } else {
            ModelConfigFile::default()
        };
        for field in &config.ignored {
            tracing::warn!(model = name, field = %field, "config.pbtxt: not honoured by tensorgate; ignored");
        }
        if let Some(n) = config.name.as_deref().filter(|n| *n != name) {
            return Err(format!(
                "config.pbtxt names the model '{n}', but its directory is '{name}'"
            ));
        }
        if let Some(p) = [&config.platform, &config.backend]
            .into_iter()
            .flatten()
            .find(|p| !ONNX_PLATFORMS.contains(&p.as_str()))
        {
            return Err(format!(
                "platform or backend '{p}' is not supported: tensorgate runs ONNX models (onnxruntime_onnx) only"
            ));
        }
        let labels = read_labels(&dir, &config)?;
        let selected = select_versions(&dir, &config.version_policy)?;
        if selected.is_empty() {
            return Err(format!(
                "no version directory with a {MODEL_FILE} in {}",
                dir.display()
            ));
        }
        let served: Vec<String> = selected.iter().map(|(v, _)| v.to_string()).collect();
        let mut entries = Vec::new();
        let mut versions = BTreeMap::new();
        for (version, path) in selected {
            let entry = |state, reason: String| IndexEntry {
                name: name.to_string(),
                version: Some(version.to_string()),
                state,
                reason,
            };
            let Some(path) = path else {
                entries.push(entry(
                    ModelState::Unavailable,
                    format!("version {version} has no {MODEL_FILE} in {}", dir.display()),
                ));
                continue;
            };
            let settings = ModelSettings {
                name: name.to_string(),
                versions: served.clone(),
                platform: config.platform.clone(),
                max_batch_size: config.max_batch_size,
                inputs: config.inputs.iter().map(|i| i.tensor.clone()).collect(),
                outputs: config.outputs.iter().map(|o| o.tensor.clone()).collect(),
                input_reshapes: reshapes(&config.inputs),
                output_reshapes: reshapes(&config.outputs),
                labels: labels.clone(),
                instances: config.instances.unwrap_or(1),
            };
            match load_version(&path, settings) {
                Ok(m) => {
                    entries.push(entry(ModelState::Ready, String::new()));
                    versions.insert(version, m);
                }
                Err(reason) => {
                    tracing::error!(model = name, version, %reason, "model version failed to load");
                    entries.push(entry(ModelState::Unavailable, reason));
                }
            }
        }
        agree_with_latest(&mut versions, &mut entries);
        let label_files = config
            .outputs
            .iter()
            .filter_map(|o| Some((o.tensor.name.clone(), o.label_filename.clone()?)))
            .collect();
        let model =
            VersionedModel::new(versions, label_files).map(|m| Arc::new(m) as Arc<dyn Model>);
        Ok(LoadedModel { model, entries })
    }
}

fn reshapes(tensors: &[config::IoConfig]) -> HashMap<String, Vec<i64>> {
    tensors
        .iter()
        .filter_map(|t| Some((t.tensor.name.clone(), t.reshape.clone()?)))
        .collect()
}

/// Versions of one model share one configuration (in Triton, one config.pbtxt), and a
/// gateway publishes one set of inputs and outputs per model: a version whose tensors differ
/// from the latest version's would be advertised with shapes it refuses. It is UNAVAILABLE,
/// with a reason that says so, and the others serve.
fn agree_with_latest(versions: &mut BTreeMap<i64, Arc<dyn Model>>, entries: &mut [IndexEntry]) {
    let Some((&latest, model)) = versions.iter().next_back() else {
        return;
    };
    let (inputs, outputs) = {
        let meta = model.metadata();
        (meta.inputs.clone(), meta.outputs.clone())
    };
    versions.retain(|&version, model| {
        let meta = model.metadata();
        if meta.inputs == inputs && meta.outputs == outputs {
            return true;
        }
        let reason = format!(
            "its inputs or outputs differ from version {latest}'s (inputs {}, outputs {} against {}, {}); the versions of a model share one configuration, as in Triton: serve it as a model of its own",
            describe(&meta.inputs),
            describe(&meta.outputs),
            describe(&inputs),
            describe(&outputs)
        );
        tracing::error!(model = %meta.name, version, %reason, "model version not served");
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.version.as_deref() == Some(version.to_string().as_str()))
        {
            e.state = ModelState::Unavailable;
            e.reason = reason;
        }
        false
    });
}

/// `[A INT32 [-1,4], B FP32 [3]]`.
fn describe(tensors: &[TensorMetadata]) -> String {
    let each: Vec<String> = tensors
        .iter()
        .map(|t| {
            let shape = crate::protocol::tensor::format_shape(&t.shape);
            format!("{} {} {shape}", t.name, t.datatype)
        })
        .collect();
    format!("[{}]", each.join(", "))
}

/// Model directory names are single path components: nothing may reach outside the
/// repository through a name in a load request.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// The version a directory's name is, as Triton reads them: digits only, not starting with 0
/// (Triton ignores `0`, `007`, `+1` and the like, and so does this).
fn version_of(name: &str) -> Option<i64> {
    let digits = name.bytes().all(|b| b.is_ascii_digit());
    (digits && !name.starts_with('0'))
        .then(|| name.parse().ok())
        .flatten()
}

/// The versions the policy selects, highest first for `latest`, each with its model file if
/// it has one.
fn select_versions(
    dir: &Path,
    policy: &VersionPolicy,
) -> Result<Vec<(i64, Option<PathBuf>)>, String> {
    let listing =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut present: BTreeMap<i64, PathBuf> = BTreeMap::new();
    for entry in listing.filter_map(Result::ok) {
        let Some(v) = entry.file_name().to_str().and_then(version_of) else {
            continue;
        };
        if entry.path().is_dir() {
            present.insert(v, entry.path().join(MODEL_FILE));
        }
    }
    let file = |p: &PathBuf| p.is_file().then(|| p.clone());
    Ok(match policy {
        VersionPolicy::Latest(n) => present
            .iter()
            .rev()
            .filter(|(_, p)| p.is_file())
            .take(*n as usize)
            .map(|(v, p)| (*v, Some(p.clone())))
            .collect(),
        VersionPolicy::All => present.iter().map(|(v, p)| (*v, file(p))).collect(),
        VersionPolicy::Specific(list) => list
            .iter()
            .map(|v| (*v, present.get(v).and_then(file)))
            .collect(),
    })
}

/// The largest label file read: a million classes of 60 bytes each.
const MAX_LABELS_BYTES: u64 = 64 << 20;

/// Reads a text file of a model's directory (config.pbtxt, a label file). Only a regular
/// file, after symlinks, of at most `max` bytes: a FIFO would block the load forever, and a
/// link to a device such as /dev/zero would never end.
fn read_small_file(path: &Path, max: u64) -> Result<String, String> {
    use std::io::Read;
    let cannot = |e: &dyn std::fmt::Display| format!("cannot read {}: {e}", path.display());
    let meta = std::fs::metadata(path).map_err(|e| cannot(&e))?;
    if !meta.is_file() {
        return Err(cannot(&"not a regular file"));
    }
    if meta.len() > max {
        return Err(cannot(&format!(
            "it has {} bytes, more than the {max} such a file may have",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_string(&mut text))
        .map_err(|e| cannot(&e))?;
    if text.len() as u64 > max {
        return Err(cannot(&format!(
            "it grew past the {max} bytes such a file may have"
        )));
    }
    Ok(text)
}

fn read_labels(
    dir: &Path,
    config: &ModelConfigFile,
) -> Result<HashMap<String, Vec<String>>, String> {
    let mut labels = HashMap::new();
    for output in &config.outputs {
        let Some(file) = &output.label_filename else {
            continue;
        };
        if !is_plain_name(file) {
            return Err(format!(
                "output '{}': label_filename '{file}' must be a file in the model's directory",
                output.tensor.name
            ));
        }
        let path = dir.join(file);
        let text = read_small_file(&path, MAX_LABELS_BYTES)
            .map_err(|e| format!("output '{}': {e}", output.tensor.name))?;
        let mut lines: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
        while lines.last().is_some_and(String::is_empty) {
            lines.pop();
        }
        labels.insert(output.tensor.name.clone(), lines);
    }
    Ok(labels)
}

/// The loaded versions of one model behind one name: requests without a version run the
/// latest, as in Triton. The metadata (inputs, outputs) is the latest version's.
pub struct VersionedModel {
    versions: BTreeMap<i64, Arc<dyn Model>>,
    meta: ModelMetadata,
    /// config.pbtxt's `label_filename`s, by output.
    label_files: Vec<(String, String)>,
}

impl VersionedModel {
    fn new(
        versions: BTreeMap<i64, Arc<dyn Model>>,
        label_files: Vec<(String, String)>,
    ) -> Option<Self> {
        let (_, latest) = versions.iter().next_back()?;
        let mut meta = latest.metadata().clone();
        meta.versions = versions.keys().map(i64::to_string).collect();
        Some(VersionedModel {
            meta,
            versions,
            label_files,
        })
    }

    fn latest(&self) -> &Arc<dyn Model> {
        self.versions
            .values()
            .next_back()
            .expect("a VersionedModel has a version")
    }
}

impl Model for VersionedModel {
    fn metadata(&self) -> &ModelMetadata {
        &self.meta
    }

    fn infer(&self, req: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
        self.latest().infer(req)
    }

    fn infer_version(
        &self,
        version: Option<&str>,
        req: &InferRequest,
    ) -> Result<Vec<Tensor>, ModelError> {
        let Some(v) = version else {
            return self.infer(req);
        };
        let model = v
            .parse::<i64>()
            .ok()
            .and_then(|v| self.versions.get(&v))
            .ok_or_else(|| {
                ModelError::Invalid(format!(
                    "model '{}' has no version '{v}' loaded",
                    self.meta.name
                ))
            })?;
        model.infer(req)
    }

    fn labels(&self, output: &str) -> Option<Arc<Vec<String>>> {
        self.latest().labels(output)
    }

    fn label_files(&self) -> Vec<(String, String)> {
        self.label_files.clone()
    }

    fn instances(&self) -> Option<usize> {
        self.latest().instances()
    }

    fn max_batch_size(&self) -> Option<u32> {
        self.latest().max_batch_size()
    }

    fn sequence_batching(&self) -> bool {
        self.latest().sequence_batching()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = std::env::temp_dir().join(format!("tg-small-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let labels = dir.join("labels.txt");
        std::fs::write(&labels, "cat\ndog\n").unwrap();
        assert_eq!(read_small_file(&labels, 8).unwrap(), "cat\ndog\n");
        assert_eq!(
            read_small_file(&labels, 7).unwrap_err(),
            format!(
                "cannot read {}: it has 8 bytes, more than the 7 such a file may have",
                labels.display()
            )
        );
        // A link to a device that never ends, and a FIFO that would block the load.
        let zero = dir.join("zero.txt");
        let _ = std::fs::remove_file(&zero);
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let fifo = dir.join("fifo.txt");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for path in [&zero, &fifo] {
            assert_eq!(
                read_small_file(path, 1 << 20).unwrap_err(),
                format!("cannot read {}: not a regular file", path.display())
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn version_directories_are_named_as_triton_reads_them() {
        for (name, version) in [
            ("1", Some(1)),
            ("12", Some(12)),
            ("0", None),
            ("007", None),
            ("+1", None),
            ("-1", None),
            ("1a", None),
            ("", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(version_of(name), version, "{name:?}");
        }
    }

    #[test]
    fn names_stay_inside_the_repository() {
        for bad in ["", ".", "..", "a/b", "../x", "a\\b", "a\0b"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
        assert!(is_plain_name("resnet50") && is_plain_name("my.model-v2"));
        let dir = std::env::temp_dir().join(format!("tg-repo-names-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("m")).unwrap();
        let repo = Repository::open(&dir, ["simple".to_string()]).unwrap();
        assert!(repo.has("m") && !repo.has("..") && !repo.has("missing"));
        let loaded = repo.load("m");
        assert!(loaded.model.is_none());
        assert_eq!(
            loaded.entries[0].reason,
            format!(
                "no version directory with a model.onnx in {}",
                dir.join("m").display()
            )
        );
        std::fs::create_dir_all(dir.join("simple")).unwrap();
        assert_eq!(
            repo.load("simple").entries[0].reason,
            "'simple' is the name of a built-in model; rename the repository's directory"
        );
        assert_eq!(
            Repository::open(&dir.join("nope"), []).err(),
            Some(format!(
                "model repository {} is not a directory",
                dir.join("nope").display()
            ))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Versions share one configuration: one whose tensors differ from the latest's is not
    /// served (it would be published with shapes it refuses), and says why; the latest is.
    #[cfg(feature = "onnx")]
    #[test]
    fn a_version_whose_tensors_differ_from_the_latest_is_unavailable() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx/repo");
        let dir = std::env::temp_dir().join(format!("tg-repo-versions-{}", std::process::id()));
        for (version, source) in [("1", "cnn/1"), ("2", "mlp/2"), ("3", "mlp/1")] {
            std::fs::create_dir_all(dir.join("m").join(version)).unwrap();
            std::fs::copy(
                fixtures.join(source).join(MODEL_FILE),
                dir.join("m").join(version).join(MODEL_FILE),
            )
            .unwrap();
        }
        std::fs::write(dir.join("m/config.pbtxt"), "version_policy: { all: {} }\n").unwrap();
        let loaded = Repository::open(&dir, []).unwrap().load("m");
        let states: Vec<(Option<&str>, ModelState)> = loaded
            .entries
            .iter()
            .map(|e| (e.version.as_deref(), e.state))
            .collect();
        assert_eq!(
            states,
            [
                (Some("1"), ModelState::Unavailable),
                (Some("2"), ModelState::Ready),
                (Some("3"), ModelState::Ready)
            ]
        );
        assert_eq!(
            loaded.entries[0].reason,
            "its inputs or outputs differ from version 3's (inputs [IMAGE FP32 [-1,1,28,28]], outputs [LOGITS FP32 [-1,10]] against [INPUT FP32 [-1,16]], [PROBS FP32 [-1,10]]); the versions of a model share one configuration, as in Triton: serve it as a model of its own"
        );
        let model = loaded.model.unwrap();
        assert_eq!(model.metadata().versions, ["2", "3"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
