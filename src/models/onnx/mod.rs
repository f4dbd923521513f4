//! ONNX models, run in pure Rust by tract. A model is parsed, typed and optimised once, when
//! it is loaded; each request then runs the optimised plan with its own state, so that
//! several run at once (as many as the model's `instance_group` count allows: the caller,
//! `fleet::builtin`, holds that many permits and runs the model on the blocking pool).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use tract_onnx::prelude::*;

use super::repository::ModelSettings;
use super::{Model, ModelError};
use crate::protocol::tensor::frame_bytes;
use crate::protocol::{DataType, InferRequest, ModelMetadata, Tensor as V2Tensor, TensorMetadata};

mod conv3x3;
mod maxpool;
mod nchw_op;

/// Most plans kept per model for concrete input shapes; shapes beyond run the general plan.
const MAX_SPECIALIZED: usize = 16;

pub struct OnnxModel {
    meta: ModelMetadata,
    /// The plan for any value of the graph's symbolic dimensions.
    plan: Arc<TypedRunnableModel>,
    /// The decluttered graph, symbols unbound, from which specialised plans are made.
    graph: TypedModel,
    /// Each symbolic dimension of an input: (input, axis, symbol).
    symbols: Vec<(usize, usize, Symbol)>,
    /// Plans optimised for concrete values of the symbols (a batch size, typically), made on
    /// first use: tract picks much better kernels when every dimension is known.
    specialized: std::sync::Mutex<HashMap<Vec<i64>, Arc<TypedRunnableModel>>>,
    /// The graph's inputs, in the order the plan takes them.
    inputs: Vec<(String, DatumType)>,
    /// Each input's shape in the model after any batch dimension, where config.pbtxt
    /// reshapes it (`reshape`, or a scalar given as `dims: [ 1 ]`).
    input_reshapes: Vec<Option<Vec<usize>>>,
    /// Each output's shape for clients after any batch dimension, where config.pbtxt
    /// reshapes it.
    output_reshapes: Vec<Option<Vec<usize>>>,
    labels: HashMap<String, Arc<Vec<String>>>,
    instances: usize,
    /// config.pbtxt's; 0: no batching dimension to bound.
    max_batch_size: u32,
}

impl OnnxModel {
    pub fn load(path: &Path, settings: ModelSettings) -> Result<OnnxModel, String> {
        let mut typed = tract_onnx::onnx()
            .model_for_path(path)
            .and_then(|m| m.into_typed())
            .map_err(|e| format!("{}: not a model tract can load: {e:#}", path.display()))?;
        let graph_inputs = tensors_of(&typed, typed.input_outlets().map_err(err)?)?;
        let mut graph_outputs = tensors_of(&typed, typed.output_outlets().map_err(err)?)?;
        // As in Triton, config.pbtxt may list some of the outputs: only those are served
        // (and computed).
        if !settings.outputs.is_empty() && settings.outputs.len() < graph_outputs.len() {
            known_names(&graph_outputs, &settings.outputs, "output")?;
            let kept: Vec<OutletId> = typed
                .output_outlets()
                .map_err(err)?
                .iter()
                .zip(&graph_outputs)
                .filter(|(_, g)| settings.outputs.iter().any(|c| c.name == g.name))
                .map(|(o, _)| *o)
                .collect();
            typed.select_output_outlets(&kept).map_err(err)?;
            graph_outputs = tensors_of(&typed, typed.output_outlets().map_err(err)?)?;
        }
        let inputs: Vec<(String, DatumType)> = typed
            .input_outlets()
            .map_err(err)?
            .iter()
            .zip(&graph_inputs)
            .map(|(o, t)| {
                Ok((
                    t.name.clone(),
                    typed.outlet_fact(*o).map_err(err)?.datum_type,
                ))
            })
            .collect::<Result<_, String>>()?;
        let meta = ModelMetadata {
            name: settings.name.clone(),
            versions: settings.versions.clone(),
            platform: settings
                .platform
                .clone()
                .unwrap_or_else(|| "onnxruntime_onnx".into()),
            inputs: Vec::new(),
            outputs: Vec::new(),
        };
        let mut meta = meta;
        let (inputs_meta, input_reshapes) = merge(
            &graph_inputs,
            &settings.inputs,
            &settings.input_reshapes,
            settings.max_batch_size,
            "input",
        )?;
        let (outputs_meta, output_reshapes) = merge(
            &graph_outputs,
            &settings.outputs,
            &settings.output_reshapes,
            settings.max_batch_size,
            "output",
        )?;
        meta.inputs = inputs_meta;
        meta.outputs = outputs_meta;
        // An input keeps the shape the model takes; an output gets the one clients see.
        let input_reshapes = input_reshapes
            .into_iter()
            .map(|r| r.map(|r| r.model))
            .collect();
        let output_reshapes = output_reshapes
            .into_iter()
            .map(|r| r.map(|r| r.served))
            .collect();
        for output in settings.labels.keys() {
            if !meta.outputs.iter().any(|t| &t.name == output) {
                return Err(format!(
                    "labels are given for output '{output}', which the model does not have"
                ));
            }
        }
        let graph = typed
            .into_decluttered()
            .map_err(|e| format!("{}: tract cannot simplify it: {e:#}", path.display()))?;
        let mut symbols = Vec::new();
        for (i, outlet) in graph.input_outlets().map_err(err)?.iter().enumerate() {
            for (axis, dim) in graph
                .outlet_fact(*outlet)
                .map_err(err)?
                .shape
                .iter()
                .enumerate()
            {
                if let TDim::Sym(sym) = dim {
                    symbols.push((i, axis, sym.clone()));
                }
            }
        }
        let plan = plan(graph.clone())
            .map_err(|e| format!("{}: tract cannot optimise it: {e:#}", path.display()))?;
        Ok(OnnxModel {
            meta,
            plan,
            graph,
            symbols,
            specialized: Default::default(),
            inputs,
            input_reshapes,
            output_reshapes,
            labels: settings
                .labels
                .into_iter()
                .map(|(o, l)| (o, Arc::new(l)))
                .collect(),
            instances: settings.instances.max(1),
            max_batch_size: settings.max_batch_size,
        })
    }

    /// The plan for this request's shapes: a specialised one (made now if there is room), or
    /// the general one.
    fn plan_for(&self, req: &InferRequest) -> Result<Arc<TypedRunnableModel>, ModelError> {
        if self.symbols.is_empty() {
            return Ok(self.plan.clone());
        }
        let mut bound: HashMap<Symbol, i64> = HashMap::new();
        let mut key = Vec::with_capacity(self.symbols.len());
        for (i, axis, sym) in &self.symbols {
            let (name, _) = &self.inputs[*i];
            let t = super::input(req, name)?;
            let value = self
                .model_shape(*i, &t.shape)
                .get(*axis)
                .copied()
                .unwrap_or(0) as i64;
            if let Some(previous) = bound.insert(sym.clone(), value).filter(|p| *p != value) {
                return Err(ModelError::Invalid(format!(
                    "inputs disagree on dimension {sym}: {previous} and {value} (input '{name}')"
                )));
            }
            key.push(value);
        }
        // A panic inside tract while a plan was made must not leave the model unusable.
        let mut cache = self
            .specialized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(plan) = cache.get(&key) {
            return Ok(plan.clone());
        }
        if cache.len() >= MAX_SPECIALIZED {
            return Ok(self.plan.clone());
        }
        let subs: HashMap<Symbol, TDim> =
            bound.into_iter().map(|(s, v)| (s, TDim::Val(v))).collect();
        match self.graph.set_symbols(&subs).and_then(plan) {
            Ok(plan) => {
                cache.insert(key, plan.clone());
                Ok(plan)
            }
            // The general plan still runs it; the next request with these shapes tries again.
            Err(e) => {
                tracing::debug!(model = %self.meta.name, error = %format!("{e:#}"), "no specialised plan");
                Ok(self.plan.clone())
            }
        }
    }

    /// Triton refuses a batch larger than `max_batch_size`: so does this, before any work.
    fn check_batch(&self, req: &InferRequest) -> Result<(), ModelError> {
        if self.max_batch_size == 0 {
            return Ok(());
        }
        crate::protocol::check_max_batch_size(req, self.max_batch_size)
            .map_err(|e| ModelError::Invalid(e.message().to_string()))
    }

    /// An input's shape as the model takes it: the request's, or config.pbtxt's `reshape`
    /// after the request's batch dimension. The gateway has checked the request's shape
    /// against the served dims, whose elements the reshape holds.
    fn model_shape(&self, input: usize, shape: &[u64]) -> Vec<usize> {
        match &self.input_reshapes[input] {
            Some(reshape) => {
                let batch = shape.iter().take(usize::from(self.max_batch_size > 0));
                batch
                    .map(|d| *d as usize)
                    .chain(reshape.iter().copied())
                    .collect()
            }
            None => shape.iter().map(|d| *d as usize).collect(),
        }
    }

    /// An output as clients see it: reshaped to config.pbtxt's dims after the batch
    /// dimension, where config.pbtxt reshapes it.
    fn served(&self, output: usize, mut t: V2Tensor) -> Result<V2Tensor, ModelError> {
        let Some(dims) = &self.output_reshapes[output] else {
            return Ok(t);
        };
        let batch = usize::from(self.max_batch_size > 0).min(t.shape.len());
        let shape: Vec<u64> = t.shape[..batch]
            .iter()
            .copied()
            .chain(dims.iter().map(|d| *d as u64))
            .collect();
        if shape.iter().product::<u64>() != t.shape.iter().product::<u64>() {
            return Err(ModelError::Failed(format!(
                "output '{}': the model made shape {:?}, which does not reshape to {shape:?}",
                t.name, t.shape
            )));
        }
        t.shape = shape;
        Ok(t)
    }

    fn to_tract(&self, req: &InferRequest) -> Result<TVec<TValue>, ModelError> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, (name, dt))| {
                let t = super::input(req, name)?;
                let shape = self.model_shape(i, &t.shape);
                let tensor = if *dt == DatumType::String {
                    let strings = t
                        .bytes_elements()
                        .map(|e| {
                            std::str::from_utf8(e).map(str::to_string).map_err(|_| {
                                ModelError::Invalid(format!(
                                    "input '{name}': the model takes UTF-8 strings"
                                ))
                            })
                        })
                        .collect::<Result<Vec<String>, _>>()?;
                    tract_ndarray::ArrayD::from_shape_vec(shape, strings)
                        .map_err(|e| ModelError::Failed(format!("input '{name}': {e}")))?
                        .into()
                } else {
                    // SAFETY: the gateway validated the request against this model's
                    // metadata, whose datatype is `dt`'s, and from_raw_dt checks the length.
                    unsafe { Tensor::from_raw_dt(*dt, &shape, &t.data) }
                        .map_err(|e| ModelError::Failed(format!("input '{name}': {e:#}")))?
                };
                Ok(tensor.into())
            })
            .collect()
    }
}

impl Model for OnnxModel {
    fn max_batch_size(&self) -> Option<u32> {
        Some(self.max_batch_size)
    }

    fn metadata(&self) -> &ModelMetadata {
        &self.meta
    }

    fn infer(&self, req: &InferRequest) -> Result<Vec<V2Tensor>, ModelError> {
        self.check_batch(req)?;
        let plan = self.plan_for(req)?;
        let inputs = self.to_tract(req)?;
        let outputs = plan
            .run(inputs)
            .map_err(|e| ModelError::Failed(format!("model '{}': {e:#}", self.meta.name)))?;
        self.meta
            .outputs
            .iter()
            .zip(outputs)
            .enumerate()
            .map(|(i, (meta, value))| self.served(i, from_tract(&meta.name, &value)?))
            .collect()
    }

    fn labels(&self, output: &str) -> Option<Arc<Vec<String>>> {
        self.labels.get(output).cloned()
    }

    fn instances(&self) -> Option<usize> {
        Some(self.instances)
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Names, datatypes and shapes of `outlets` (symbolic or unknown dimensions are -1).
fn tensors_of(model: &TypedModel, outlets: &[OutletId]) -> Result<Vec<TensorMetadata>, String> {
    outlets
        .iter()
        .map(|o| {
            let fact = model.outlet_fact(*o).map_err(err)?;
            let name = model
                .outlet_label(*o)
                .unwrap_or(&model.node(o.node).name)
                .to_string();
            let datatype = v2_datatype(fact.datum_type).ok_or_else(|| {
                format!(
                    "tensor '{name}' has type {:?}, which v2 has no datatype for",
                    fact.datum_type
                )
            })?;
            Ok(TensorMetadata {
                name,
                datatype: datatype.as_str().into(),
                shape: fact
                    .shape
                    .iter()
                    .map(|d| d.as_i64().unwrap_or(-1))
                    .collect(),
            })
        })
        .collect()
}

/// Why a batch limit cannot apply: the graph fixes the first dimension of `g`.
fn fixed_first_dimension(role: &str, g: &TensorMetadata, max_batch_size: u32) -> String {
    format!(
        "{role} '{}': config.pbtxt sets max_batch_size {max_batch_size}, but the model's first dimension is fixed at {}; set max_batch_size: 0 and give the full dims",
        g.name, g.shape[0]
    )
}

/// A tensor whose shape in the model is not the one clients see (config.pbtxt's `reshape`,
/// or a scalar it gives as `dims: [ 1 ]`): both after any batch dimension, holding the same
/// number of elements.
#[derive(Debug, Clone, PartialEq)]
struct Reshape {
    model: Vec<usize>,
    served: Vec<usize>,
}

/// config.pbtxt's tensors must be the model's: a name it lists that the graph lacks is
/// named, with the graph's names.
fn known_names(
    graph: &[TensorMetadata],
    config: &[TensorMetadata],
    role: &str,
) -> Result<(), String> {
    match config
        .iter()
        .find(|c| !graph.iter().any(|g| g.name == c.name))
    {
        None => Ok(()),
        Some(c) => Err(format!(
            "config.pbtxt lists {role} '{}', which the model does not have (its {role}s: {})",
            c.name,
            graph
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The metadata of one side: the graph's, or config.pbtxt's where it lists tensors (they must
/// exist in the graph with the same datatype; with batching the shape is [-1] + dims), with
/// each tensor's reshape, if it has one.
fn merge(
    graph: &[TensorMetadata],
    config: &[TensorMetadata],
    reshapes: &HashMap<String, Vec<i64>>,
    max_batch_size: u32,
    role: &str,
) -> Result<(Vec<TensorMetadata>, Vec<Option<Reshape>>), String> {
    if config.is_empty() {
        // Without tensors in config.pbtxt the graph's shapes stand, and a batch limit still
        // needs a variable first dimension to bound.
        if let Some(g) = graph
            .iter()
            .find(|g| max_batch_size > 0 && g.shape.first().is_some_and(|d| *d >= 0))
        {
            return Err(fixed_first_dimension(role, g, max_batch_size));
        }
        return Ok((graph.to_vec(), vec![None; graph.len()]));
    }
    known_names(graph, config, role)?;
    if config.len() != graph.len() {
        return Err(format!(
            "config.pbtxt lists {} {role}s, the model has {} ({})",
            config.len(),
            graph.len(),
            graph
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // The plan yields tensors in the graph's order; the metadata keeps that order.
    graph
        .iter()
        .map(|g| {
            let c = config.iter().find(|c| c.name == g.name).ok_or_else(|| {
                format!("config.pbtxt does not list the model's {role} '{}'", g.name)
            })?;
            if c.datatype != g.datatype {
                return Err(format!(
                    "{role} '{}': config.pbtxt says {}, the model has {}",
                    g.name, c.datatype, g.datatype
                ));
            }
            let batched = max_batch_size > 0;
            let reshape = match reshapes.get(&g.name) {
                Some(r) => Some(r.clone()),
                // Triton's rule for an ONNX scalar: config dims of ones stand for it.
                None if g.shape.len() == usize::from(batched)
                    && !c.shape.is_empty()
                    && c.shape.iter().all(|d| *d == 1) =>
                {
                    Some(Vec::new())
                }
                None => None,
            };
            // What the graph is checked against: the reshape, or the dims.
            let (in_model, gives) = match &reshape {
                Some(r) => (r, "config.pbtxt's reshape gives"),
                None => (&c.shape, "config.pbtxt gives"),
            };
            let mut model_shape = in_model.clone();
            if batched {
                model_shape.insert(0, -1);
            }
            let after_batch = if batched {
                " after the batch dimension"
            } else {
                ""
            };
            if model_shape.len() != g.shape.len() {
                return Err(format!(
                    "{role} '{}': {gives} {} dimensions{after_batch}, the model has {}",
                    g.name,
                    in_model.len(),
                    g.shape.len() - usize::from(batched && !g.shape.is_empty())
                ));
            }
            if batched && g.shape[0] >= 0 {
                return Err(fixed_first_dimension(role, g, max_batch_size));
            }
            // Triton's rule: config.pbtxt may fix a dimension the graph leaves variable, not
            // contradict one the graph fixes, nor leave it variable (clients would send
            // shapes the model refuses).
            let skip = usize::from(batched);
            for (axis, (&want, &has)) in model_shape.iter().zip(&g.shape).enumerate().skip(skip) {
                if want < -1 || (has >= 0 && want != has) {
                    return Err(format!(
                        "{role} '{}': {gives} dims {:?}{after_batch}, the model has {:?} (dimension {} is {has} in the model, {want} in config.pbtxt)",
                        g.name,
                        in_model,
                        &g.shape[skip..],
                        axis - skip
                    ));
                }
            }
            let reshape = match reshape {
                None => None,
                Some(r) => Some(fixed_reshape(role, c, r)?),
            };
            let mut shape = c.shape.clone();
            if batched {
                shape.insert(0, -1);
            }
            Ok((
                TensorMetadata {
                    name: g.name.clone(),
                    datatype: g.datatype.clone(),
                    shape,
                },
                reshape,
            ))
        })
        .collect::<Result<Vec<_>, String>>()
        .map(|tensors| tensors.into_iter().unzip())
}

/// A reshape between fixed shapes of as many elements: a variable dimension on either side
/// would leave the other's undetermined.
fn fixed_reshape(role: &str, c: &TensorMetadata, reshape: Vec<i64>) -> Result<Reshape, String> {
    let fixed = |dims: &[i64]| -> Option<Vec<usize>> {
        dims.iter().map(|d| usize::try_from(*d).ok()).collect()
    };
    let (Some(model), Some(served)) = (fixed(&reshape), fixed(&c.shape)) else {
        return Err(format!(
            "{role} '{}': config.pbtxt gives dims {:?} and reshape {:?}; tensorgate reshapes only between fixed shapes",
            c.name, c.shape, reshape
        ));
    };
    let elements = |d: &[usize]| d.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
    if elements(&model) != elements(&served) {
        return Err(format!(
            "{role} '{}': config.pbtxt's dims {:?} and reshape {:?} hold different numbers of elements",
            c.name, c.shape, reshape
        ));
    }
    Ok(Reshape { model, served })
}

fn v2_datatype(dt: DatumType) -> Option<DataType> {
    Some(match dt {
        DatumType::Bool => DataType::Bool,
        DatumType::U8 => DataType::Uint8,
        DatumType::U16 => DataType::Uint16,
        DatumType::U32 => DataType::Uint32,
        DatumType::U64 => DataType::Uint64,
        DatumType::I8 => DataType::Int8,
        DatumType::I16 => DataType::Int16,
        DatumType::I32 => DataType::Int32,
        DatumType::I64 => DataType::Int64,
        DatumType::F16 => DataType::Fp16,
        DatumType::F32 => DataType::Fp32,
        DatumType::F64 => DataType::Fp64,
        DatumType::String => DataType::Bytes,
        // Shape arithmetic (`Shape`, a `Cast` tract folds into it) yields dimensions: INT64
        // in ONNX, and in v2.
        DatumType::TDim => DataType::Int64,
        _ => return None,
    })
}

/// Keeps the memory of model runs in the process between runs, where the allocator is
/// glibc's. A run allocates and frees its intermediate tensors (the CNN of the fixtures at
/// batch 8: about 1 MB each call); glibc serves allocations over 128 KiB with mappings of
/// their own and hands a heap's free top back to the kernel past a threshold of the same
/// order, so with its defaults every run faulted its pages in again: that CNN's batch of 8
/// took 360 us in a worker against 267 us with these settings. Allocations up to 4 MiB
/// come from the heaps, and up to 16 MiB free at a heap's top is kept; larger activations
/// (4 MiB and up) are worth a mapping of their own. Called once, before any thread starts,
/// by processes that run repository models; a gateway without models keeps glibc's
/// defaults (its memory targets are measured with them).
pub fn keep_run_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before other threads run.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
    }
}

/// The runnable plan of a decluttered graph: tract's optimisations, with this crate's faster
/// kernels for what tract runs slowly (`conv3x3` before tract lowers convolutions, `maxpool`
/// after it has chosen its pools).
fn plan(mut graph: TypedModel) -> TractResult<Arc<TypedRunnableModel>> {
    conv3x3::replace_convs(&mut graph)?;
    let mut optimized = graph.into_optimized()?;
    maxpool::replace_pools(&mut optimized)?;
    optimized.into_runnable()
}

fn from_tract(name: &str, t: &Tensor) -> Result<V2Tensor, ModelError> {
    let failed = |e: String| ModelError::Failed(format!("output '{name}': {e}"));
    let (datatype, data) = if t.datum_type() == DatumType::String {
        let view = t
            .to_plain_array_view::<String>()
            .map_err(|e| failed(format!("{e:#}")))?;
        (
            DataType::Bytes,
            frame_bytes(view.iter().map(String::as_bytes)),
        )
    } else if t.datum_type() == DatumType::TDim {
        let t = t.cast_to::<i64>().map_err(|e| failed(format!("{e:#}")))?;
        (DataType::Int64, Bytes::copy_from_slice(t.as_bytes()))
    } else {
        let datatype = v2_datatype(t.datum_type())
            .ok_or_else(|| failed(format!("type {:?} has no v2 datatype", t.datum_type())))?;
        (datatype, Bytes::copy_from_slice(t.as_bytes()))
    };
    Ok(V2Tensor {
        name: name.to_string(),
        datatype,
        shape: t.shape().iter().map(|d| *d as u64).collect(),
        parameters: Default::default(),
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Parameters, RequestOptions};

    fn cnn() -> OnnxModel {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx/repo/cnn/1/model.onnx");
        let settings = ModelSettings {
            name: "cnn".into(),
            versions: vec!["1".into()],
            instances: 1,
            ..Default::default()
        };
        OnnxModel::load(&path, settings).unwrap()
    }

    fn image(batch: u64) -> InferRequest {
        let values: Vec<u8> = (0..batch * 28 * 28)
            .flat_map(|i| (((i * 37) % 255) as f32 / 255.0).to_le_bytes())
            .collect();
        InferRequest {
            id: None,
            parameters: Parameters::new(),
            options: RequestOptions::default(),
            inputs: vec![V2Tensor {
                name: "IMAGE".into(),
                datatype: DataType::Fp32,
                shape: vec![batch, 1, 28, 28],
                parameters: Parameters::new(),
                data: Bytes::from(values),
            }],
            outputs: None,
        }
    }

    /// How many of the plan's ops are this crate's: (convolutions, pools).
    fn own_ops(plan: &TypedRunnableModel) -> (usize, usize) {
        let count = |name: &str| {
            plan.model()
                .nodes()
                .iter()
                .filter(|n| n.op().name() == name)
                .count()
        };
        (
            count("tensorgate.Conv3x3Stride1"),
            count("tensorgate.MaxPool2x2Stride2"),
        )
    }

    /// Both plans run the crate's convolutions and pools: the one for a symbolic batch
    /// (tract's `MaxPool` replaced) and the one specialised for a batch of 3 (`OptMaxPool`
    /// replaced), and they agree on the logits.
    #[test]
    fn the_general_and_the_specialised_plans_run_alike() {
        let model = cnn();
        let req = image(3);
        let specialised = model.plan_for(&req).unwrap();
        assert!(!Arc::ptr_eq(&specialised, &model.plan));
        assert_eq!(own_ops(&model.plan), (2, 2));
        assert_eq!(own_ops(&specialised), (2, 2));
        let logits = |plan: &Arc<TypedRunnableModel>| -> Vec<f32> {
            let out = plan.run(model.to_tract(&req).unwrap()).unwrap();
            out[0]
                .try_as_plain_ram()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .to_vec()
        };
        let (general, special) = (logits(&model.plan), logits(&specialised));
        assert_eq!(general.len(), 30);
        for (a, b) in general.iter().zip(&special) {
            assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{a} against {b}");
        }
    }

    fn fixture(repo: &str, name: &str, settings: ModelSettings) -> Result<OnnxModel, String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/onnx")
            .join(repo)
            .join(name)
            .join("1/model.onnx");
        OnnxModel::load(
            &path,
            ModelSettings {
                name: name.into(),
                versions: vec!["1".into()],
                instances: 1,
                ..settings
            },
        )
    }

    /// Dimensions computed by the graph (`Shape`, a `Cast` of one) are tract's own type:
    /// published and answered as INT64, with onnxruntime's values.
    #[test]
    fn dimension_outputs_are_int64() {
        let model = fixture("dims", "dims", ModelSettings::default()).unwrap();
        let types: Vec<&str> = model
            .meta
            .outputs
            .iter()
            .map(|t| t.datatype.as_str())
            .collect();
        assert_eq!(types, ["INT64", "INT64"]);
        let x = V2Tensor {
            name: "X".into(),
            datatype: DataType::Fp32,
            shape: vec![5, 3],
            parameters: Parameters::new(),
            data: Bytes::from(vec![0u8; 5 * 3 * 4]),
        };
        let req = InferRequest {
            id: None,
            parameters: Parameters::new(),
            options: RequestOptions::default(),
            inputs: vec![x],
            outputs: None,
        };
        let out = model.infer(&req).unwrap();
        let int64s = |t: &V2Tensor| -> Vec<i64> {
            t.data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        assert_eq!(
            (out[0].datatype, int64s(&out[0])),
            (DataType::Int64, vec![5, 3])
        );
        assert_eq!(
            (out[1].datatype, int64s(&out[1])),
            (DataType::Int64, vec![5])
        );
    }

    /// config.pbtxt may list some of a model's outputs, as in Triton: only those are served.
    /// A name the model lacks is named.
    #[test]
    fn config_may_list_some_outputs() {
        let listed = |names: &[&str]| ModelSettings {
            outputs: names
                .iter()
                .map(|n| TensorMetadata {
                    name: n.to_string(),
                    datatype: if *n == "ARGMAX" { "INT64" } else { "INT32" }.into(),
                    shape: if *n == "ARGMAX" {
                        vec![-1]
                    } else {
                        vec![-1, 4]
                    },
                })
                .collect(),
            ..ModelSettings::default()
        };
        let model = fixture("repo", "intbool", listed(&["SUM"])).unwrap();
        let names: Vec<&str> = model.meta.outputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["SUM"]);
        let int32s = |name: &str, values: &[i32]| V2Tensor {
            name: name.into(),
            datatype: DataType::Int32,
            shape: vec![1, 4],
            parameters: Parameters::new(),
            data: values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        };
        let req = InferRequest {
            id: None,
            parameters: Parameters::new(),
            options: RequestOptions::default(),
            inputs: vec![int32s("A", &[1, 2, 3, 4]), int32s("B", &[10, 0, 10, 0])],
            outputs: None,
        };
        let out = model.infer(&req).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].name.as_str(), &out[0].shape[..]),
            ("SUM", &[1u64, 4][..])
        );
        let sums: Vec<i32> = out[0]
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(sums, [11, 2, 13, 4]);
        assert_eq!(
            fixture("repo", "intbool", listed(&["SUM", "TOTAL"])).err(),
            Some("config.pbtxt lists output 'TOTAL', which the model does not have (its outputs: SUM, GREATER, ARGMAX)".to_string())
        );
    }

    /// A reshape maps between fixed shapes of as many elements; an ONNX scalar may be given
    /// as dims of ones, as Triton allows.
    #[test]
    fn reshapes_map_fixed_shapes_of_as_many_elements() {
        let graph = [tensor("X", &[-1, 2, 2])];
        let reshape = |r: &[i64]| HashMap::from([("X".to_string(), r.to_vec())]);
        let (tensors, reshapes) =
            merge(&graph, &[tensor("X", &[4])], &reshape(&[2, 2]), 8, "input").unwrap();
        assert_eq!(tensors[0].shape, [-1, 4]);
        assert_eq!(
            reshapes[0],
            Some(Reshape {
                model: vec![2, 2],
                served: vec![4]
            })
        );
        let refused = [
            (
                &[5][..],
                &[2, 2][..],
                "input 'X': config.pbtxt's dims [5] and reshape [2, 2] hold different numbers of elements",
            ),
            (
                &[-1],
                &[2, 2],
                "input 'X': config.pbtxt gives dims [-1] and reshape [2, 2]; tensorgate reshapes only between fixed shapes",
            ),
            (
                &[4],
                &[4],
                "input 'X': config.pbtxt's reshape gives 1 dimensions after the batch dimension, the model has 2",
            ),
        ];
        for (dims, r, want) in refused {
            assert_eq!(
                merge(&graph, &[tensor("X", dims)], &reshape(r), 8, "input").map(|_| ()),
                Err(want.to_string())
            );
        }
        // Scalars: rank 0 after any batch dimension, given as dims of ones.
        for (shape, batch, served) in [(&[][..], 0, vec![1]), (&[-1], 8, vec![-1, 1])] {
            let scalar = [tensor("X", shape)];
            let (tensors, reshapes) = merge(
                &scalar,
                &[tensor("X", &[1])],
                &HashMap::new(),
                batch,
                "input",
            )
            .unwrap();
            assert_eq!(tensors[0].shape, served);
            assert_eq!(
                reshapes[0],
                Some(Reshape {
                    model: vec![],
                    served: vec![1]
                })
            );
        }
    }

    fn tensor(name: &str, shape: &[i64]) -> TensorMetadata {
        TensorMetadata {
            name: name.into(),
            datatype: "FP32".into(),
            shape: shape.to_vec(),
        }
    }

    /// config.pbtxt may fix what the graph leaves variable, and nothing else: dims that
    /// contradict the graph would be published and then refused by the model.
    #[test]
    fn config_dims_must_agree_with_the_graph() {
        let graph = [tensor("X", &[-1, 16, -1])];
        let merge = |graph: &[TensorMetadata], config: &[TensorMetadata], batch: u32, role| {
            merge(graph, config, &HashMap::new(), batch, role).map(|(tensors, _)| tensors)
        };
        let merged = merge(&graph, &[tensor("X", &[16, 4])], 8, "input").unwrap();
        assert_eq!(merged[0].shape, [-1, 16, 4]);
        let cases = [
            (
                &[8, 4][..],
                8,
                "input 'X': config.pbtxt gives dims [8, 4] after the batch dimension, the model has [16, -1] (dimension 0 is 16 in the model, 8 in config.pbtxt)",
            ),
            (
                &[-1, 4],
                8,
                "input 'X': config.pbtxt gives dims [-1, 4] after the batch dimension, the model has [16, -1] (dimension 0 is 16 in the model, -1 in config.pbtxt)",
            ),
            (
                &[16, -2],
                8,
                "input 'X': config.pbtxt gives dims [16, -2] after the batch dimension, the model has [16, -1] (dimension 1 is -1 in the model, -2 in config.pbtxt)",
            ),
            (
                &[16],
                8,
                "input 'X': config.pbtxt gives 1 dimensions after the batch dimension, the model has 2",
            ),
        ];
        for (dims, batch, want) in cases {
            assert_eq!(
                merge(&graph, &[tensor("X", dims)], batch, "input"),
                Err(want.to_string())
            );
        }
        let fixed = [tensor("X", &[1, 16])];
        assert_eq!(
            merge(&fixed, &[tensor("X", &[16])], 8, "input"),
            Err("input 'X': config.pbtxt sets max_batch_size 8, but the model's first dimension is fixed at 1; set max_batch_size: 0 and give the full dims".to_string())
        );
        assert!(merge(&fixed, &[tensor("X", &[1, 16])], 0, "input").is_ok());
        // Without tensors in config.pbtxt, the batch limit is checked against the graph all
        // the same: a user's max_batch_size on a fixed batch must not be ignored.
        assert_eq!(
            merge(&fixed, &[], 4, "input"),
            Err("input 'X': config.pbtxt sets max_batch_size 4, but the model's first dimension is fixed at 1; set max_batch_size: 0 and give the full dims".to_string())
        );
        assert!(merge(&fixed, &[], 0, "input").is_ok());
        assert!(merge(&[tensor("X", &[-1, 16])], &[], 4, "input").is_ok());
    }
}
