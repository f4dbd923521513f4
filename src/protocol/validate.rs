//! Checking a decoded request against the model's metadata, before any backend sees it.

use super::datatype::DataType;
use super::error::{ProtocolError, Result};
use super::message::InferRequest;
use super::metadata::ModelMetadata;
use super::tensor::format_shape;

fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    it.collect::<Vec<_>>().join(", ")
}

/// Checks each input's batch dimension (its first) against the model's `max_batch_size`,
/// for a model whose tensors start with one.
pub fn check_max_batch_size(req: &InferRequest, max_batch_size: u32) -> Result<()> {
    for t in &req.inputs {
        if let Some(&batch) = t.shape.first().filter(|b| **b > u64::from(max_batch_size)) {
            return Err(ProtocolError::invalid(format!(
                "input '{}': batch size {batch} exceeds the model's max_batch_size {max_batch_size}",
                t.name
            )));
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::rest::decode::{decode_request, RequestBody};
    use crate::protocol::{Limits, TensorMetadata};
    use bytes::Bytes;

    fn model() -> ModelMetadata {
        let t = |n: &str, s: &[i64]| TensorMetadata {
            name: n.into(),
            datatype: "INT32".into(),
            shape: s.to_vec(),
        };
        ModelMetadata {
            name: "simple".into(),
            versions: vec![],
            platform: String::new(),
            inputs: vec![t("INPUT0", &[-1, 16]), t("INPUT1", &[-1, 16])],
            outputs: vec![t("OUTPUT0", &[-1, 16]), t("OUTPUT1", &[-1, 16])],
        }
    }

    fn check(inputs: &str, outputs: &str) -> String {
        let json = format!(r#"{{"inputs":[{inputs}]{outputs}}}"#);
        let RequestBody::Message(r) =
            decode_request(&Bytes::from(json), None, &Limits::default()).unwrap()
        else {
            panic!()
        };
        match validate_request(&r, &model()) {
            Ok(()) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    fn t(name: &str, dt: &str, shape: &str, n: usize) -> String {
        format!(
            r#"{{"name":"{name}","datatype":"{dt}","shape":{shape},"data":{:?}}}"#,
            vec![0; n]
        )
    }

    #[test]
    fn against_the_model() {
        let ok = format!(
            "{},{}",
            t("INPUT0", "INT32", "[3,16]", 48),
            t("INPUT1", "INT32", "[3,16]", 48)
        );
        assert_eq!(check(&ok, ""), "ok");
        assert_eq!(
            check(&format!("{ok},{}", t("EXTRA", "INT32", "[1]", 1)), ""),
            "unknown input 'EXTRA' for model 'simple' (its inputs are INPUT0, INPUT1)"
        );
        assert_eq!(
            check(&t("INPUT0", "INT32", "[1,16]", 16), ""),
            "model 'simple' requires input 'INPUT1', which the request does not have"
        );
        assert_eq!(
            check(&t("INPUT0", "FP32", "[1,16]", 16), ""),
            "input 'INPUT0': datatype FP32 does not match the model's INT32"
        );
        assert_eq!(
            check(&t("INPUT0", "INT32", "[16]", 16), ""),
            "input 'INPUT0': shape [16] has rank 1 but the model expects rank 2 [-1,16]"
        );
        assert_eq!(
            check(&t("INPUT0", "INT32", "[1,15]", 15), ""),
            "input 'INPUT0': shape [1,15] does not match the model's [-1,16] at dimension 1"
        );
        assert_eq!(
            check(&ok, r#","outputs":[{"name":"OUTPUT9"}]"#),
            "unknown output 'OUTPUT9' requested from model 'simple' (its outputs are OUTPUT0, OUTPUT1)"
        );
        // A model without a declared signature (MLServer) only gets protocol checks.
        let unknown = ModelMetadata {
            inputs: vec![],
            outputs: vec![],
            ..model()
        };
        let json = format!(r#"{{"inputs":[{}]}}"#, t("ANY", "FP32", "[2]", 2));
        let RequestBody::Message(r) =
            decode_request(&Bytes::from(json), None, &Limits::default()).unwrap()
        else {
            panic!()
        };
        assert!(validate_request(&r, &unknown).is_ok());
    }
}
