//! Checking a decoded request against the model's metadata, before any backend sees it.

use super::datatype::DataType;
use super::error::{ProtocolError, Result};
use super::message::InferRequest;
use super::metadata::ModelMetadata;
use super::tensor::format_shape;

fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    it.collect::<Vec<_>>().join(", ")
}

/// Checks input names, datatypes, ranks and fixed dimensions, that every input is present,
/// and that every requested output exists. A model with no declared signature (see
/// `ModelMetadata::has_signature`) passes.
pub fn validate_request(req: &InferRequest, model: &ModelMetadata) -> Result<()> {
    if !model.has_signature() {
        return Ok(());
    }
    for t in &req.inputs {
        let Some(meta) = model.input(&t.name) else {
            return Err(ProtocolError::invalid(format!(
                "unknown input '{}' for model '{}' (its inputs are {})",
                t.name,
                model.name,
                names(model.inputs.iter().map(|i| i.name.as_str()))
            )));
        };
        let want = DataType::parse(&meta.datatype);
        if want != Some(t.datatype) {
            return Err(ProtocolError::invalid(format!(
                "input '{}': datatype {} does not match the model's {}",
                t.name, t.datatype, meta.datatype
            )));
        }
        if t.shape.len() != meta.shape.len() {
            return Err(ProtocolError::invalid(format!(
                "input '{}': shape {} has rank {} but the model expects rank {} {}",
                t.name,
                format_shape(&t.shape),
                t.shape.len(),
                meta.shape.len(),
                format_shape(&meta.shape)
            )));
        }
        for (i, (got, want)) in t.shape.iter().zip(&meta.shape).enumerate() {
            if *want >= 0 && *got != *want as u64 {
                return Err(ProtocolError::invalid(format!(
                    "input '{}': shape {} does not match the model's {} at dimension {i}",
                    t.name,
                    format_shape(&t.shape),
                    format_shape(&meta.shape)
                )));
            }
        }
    }
    for meta in &model.inputs {
        if !req.inputs.iter().any(|t| t.name == meta.name) {
            return Err(ProtocolError::invalid(format!(
                "model '{}' requires input '{}', which the request does not have",
                model.name, meta.name
            )));
        }
    }
    for o in req.outputs.iter().flatten() {
        if model.output(&o.name).is_none() {
            return Err(ProtocolError::invalid(format!(
                "unknown output '{}' requested from model '{}' (its outputs are {})",
                o.name,
                model.name,
                names(model.outputs.iter().map(|i| i.name.as_str()))
            )));
        }
    }
    Ok(())
}
