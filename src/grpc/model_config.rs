//! ModelConfig from what the gateway knows of a model: its v2 metadata and configured
//! labels. Enough for client scripts that read `max_batch_size`, the inputs and outputs.

use crate::gateway::labels::Labels;
use crate::protocol::grpc::pb;
use crate::protocol::{DataType, ModelMetadata, TensorMetadata};

/// A batch dimension is what Triton shows as a leading -1 in v2 metadata when its
/// `max_batch_size > 0`; the real limit is the backend's and v2 metadata does not carry it,
/// so a batching model reports `max_batch_size` as the largest value, and the dims without
/// the batch dimension, as Triton's config does.
pub const UNKNOWN_MAX_BATCH: i32 = i32::MAX;

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
                    format!("{}.labels", t.name)
                } else {
                    String::new()
                },
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}
