//! ModelConfig from what the gateway knows of a model: its v2 metadata, configured labels,
//! and the batch limit a backend states. Enough for client scripts that read
//! `max_batch_size`, the inputs and outputs; served as gRPC's ModelConfig and REST's
//! `GET /v2/models/{m}/config`.

use super::core::lookup;
use super::Gateway;
use crate::error::GatewayError;
use crate::fleet::backend::StatedConfig;
use crate::gateway::labels::Labels;
use crate::protocol::grpc::pb;
use crate::protocol::{DataType, ModelMetadata, TensorMetadata};

/// The model's configuration. For a batching model, the limit is the smallest that the
/// backends serving it state (an in-process model's config.pbtxt, a tensorgate worker's or
/// Triton's configuration endpoint); where none states one it is `UNKNOWN_MAX_BATCH`.
pub fn model_config(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<pb::ModelConfig, GatewayError> {
    let entry = lookup(gw, model, version)?;
    let mut config = from_metadata(&entry.metadata, &gw.labels.load());
    // What each backend that serves it (the version asked for) stated when the fleet last
    // asked: a request may go to any of them, so the batch every one takes is the smallest
    // they state, and a model that one of them runs as a sequence model is one (its requests
    // need sequence ids).
    let stated: Vec<StatedConfig> = entry
        .serving(model, version)
        .filter_map(|h| h.state.load().models.get(model)?.stated.clone())
        .collect();
    // Every leading dimension is -1, which v2 metadata also shows for a model that does not
    // batch (`max_batch_size: 0`, dims starting with -1): its backends say which it is.
    let unbatched = !stated.is_empty() && stated.iter().all(|s| s.max_batch_size == Some(0));
    if config.max_batch_size == UNKNOWN_MAX_BATCH && unbatched {
        config.max_batch_size = 0;
        let m = &entry.metadata;
        for (c, t) in config.input.iter_mut().zip(&m.inputs) {
            c.dims = t.shape.clone();
        }
        for (c, t) in config.output.iter_mut().zip(&m.outputs) {
            c.dims = t.shape.clone();
        }
    } else if config.max_batch_size == UNKNOWN_MAX_BATCH {
        let smallest = stated
            .iter()
            .filter_map(|s| s.max_batch_size.filter(|n| *n > 0))
            .min();
        if let Some(n) = smallest {
            config.max_batch_size = i32::try_from(n).unwrap_or(UNKNOWN_MAX_BATCH);
        }
    }
    // Labels a backend states for an output (an in-process model's, Triton's or a worker's
    // label_filename): a client that reads the configuration learns that classifications
    // carry them.
    for output in config
        .output
        .iter_mut()
        .filter(|o| o.label_filename.is_empty())
    {
        if let Some((_, file)) = stated
            .iter()
            .flat_map(|s| &s.labeled_outputs)
            .find(|(name, _)| *name == output.name)
        {
            output.label_filename = file.clone();
        }
    }
    if stated.iter().any(|s| s.sequence_batching) {
        config.scheduling_choice = Some(pb::model_config::SchedulingChoice::SequenceBatching(
            Default::default(),
        ));
    }
    Ok(config)
}

pub use crate::fleet::backend::UNKNOWN_MAX_BATCH;

fn data_type(datatype: &str) -> i32 {
    let t = match DataType::parse(datatype) {
        Some(DataType::Bool) => pb::DataType::TypeBool,
        Some(DataType::Uint8) => pb::DataType::TypeUint8,
        Some(DataType::Uint16) => pb::DataType::TypeUint16,
        Some(DataType::Uint32) => pb::DataType::TypeUint32,
        Some(DataType::Uint64) => pb::DataType::TypeUint64,
        Some(DataType::Int8) => pb::DataType::TypeInt8,
        Some(DataType::Int16) => pb::DataType::TypeInt16,
        Some(DataType::Int32) => pb::DataType::TypeInt32,
        Some(DataType::Int64) => pb::DataType::TypeInt64,
        Some(DataType::Fp16) => pb::DataType::TypeFp16,
        Some(DataType::Bf16) => pb::DataType::TypeBf16,
        Some(DataType::Fp32) => pb::DataType::TypeFp32,
        Some(DataType::Fp64) => pb::DataType::TypeFp64,
        Some(DataType::Bytes) => pb::DataType::TypeString,
        None => pb::DataType::TypeInvalid,
    };
    t as i32
}

/// The name a configuration shows for an output's labels: the gateway holds the labels, not
/// the file they came from.
fn label_file(output: &str) -> String {
    format!("{output}.labels")
}

/// Whether every tensor of the model starts with a batch dimension.
fn batches(m: &ModelMetadata) -> bool {
    let all = m.inputs.iter().chain(&m.outputs);
    m.has_signature() && all.clone().all(|t| t.shape.len() >= 2 && t.shape[0] == -1)
}

pub fn from_metadata(m: &ModelMetadata, labels: &Labels) -> pb::ModelConfig {
    let batched = batches(m);
    let dims = |t: &TensorMetadata| {
        if batched {
            t.shape[1..].to_vec()
        } else {
            t.shape.clone()
        }
    };
    pb::ModelConfig {
        name: m.name.clone(),
        platform: m.platform.clone(),
        max_batch_size: if batched { UNKNOWN_MAX_BATCH } else { 0 },
        input: m
            .inputs
            .iter()
            .map(|t| pb::ModelInput {
                name: t.name.clone(),
                data_type: data_type(&t.datatype),
                dims: dims(t),
                ..Default::default()
            })
            .collect(),
        output: m
            .outputs
            .iter()
            .map(|t| pb::ModelOutput {
                name: t.name.clone(),
                data_type: data_type(&t.datatype),
                dims: dims(t),
                label_filename: if labels.is_configured(&m.name, &t.name) {
                    label_file(&t.name)
                } else {
                    String::new()
                },
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}
