//! `map<string, InferParameter>` to and from the neutral parameters. gRPC has no order for
//! a map, so its parameters are kept sorted by name, which makes re-encoding stable.

use std::collections::HashMap;

use super::pb::infer_parameter::ParameterChoice;
use super::pb::InferParameter;
use crate::protocol::error::{ProtocolError, Result};
use crate::protocol::params::{check_count, ParamValue, Parameters};

/// A non-negative int64 is the same value as an unsigned one: both read as `Uint`, which is
/// how a JSON client's `"sequence_id": 42` reads too, so a sequence is the same key on
/// either transport.
fn from_choice(key: &str, p: InferParameter) -> Result<ParamValue> {
    Ok(match p.parameter_choice {
        Some(ParameterChoice::BoolParam(b)) => ParamValue::Bool(b),
        Some(ParameterChoice::Int64Param(i)) if i >= 0 => ParamValue::Uint(i as u64),
        Some(ParameterChoice::Int64Param(i)) => ParamValue::Int(i),
        Some(ParameterChoice::Uint64Param(u)) => ParamValue::Uint(u),
        Some(ParameterChoice::DoubleParam(f)) => ParamValue::Float(f),
        Some(ParameterChoice::StringParam(s)) => ParamValue::String(s),
        None => {
            return Err(ProtocolError::invalid(format!(
                "parameter '{key}' has no value"
            )))
        }
    })
}

pub fn params_from_proto(map: HashMap<String, InferParameter>) -> Result<Parameters> {
    // Before any value is converted: a map of a million entries is refused at its size.
    check_count(map.len())?;
    let mut entries: Vec<(String, InferParameter)> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let out = entries
        .into_iter()
        .map(|(k, v)| from_choice(&k, v).map(|value| (k, value)))
        .collect::<Result<Vec<_>>>()?;
    Parameters::from_distinct(out)
}

/// Unsigned values that fit go as int64_param, which is what Triton's clients read; JSON
/// values a REST backend put in a parameter go as their JSON text.
pub fn params_to_proto(p: &Parameters) -> HashMap<String, InferParameter> {
    p.iter()
        .map(|(k, v)| {
            let choice = match v {
                ParamValue::Bool(b) => ParameterChoice::BoolParam(*b),
                ParamValue::Int(i) => ParameterChoice::Int64Param(*i),
                ParamValue::Uint(u) => match i64::try_from(*u) {
                    Ok(i) => ParameterChoice::Int64Param(i),
                    Err(_) => ParameterChoice::Uint64Param(*u),
                },
                ParamValue::Float(f) => ParameterChoice::DoubleParam(*f),
                ParamValue::String(s) => ParameterChoice::StringParam(s.clone()),
                ParamValue::Json(j) => ParameterChoice::StringParam(j.to_string()),
            };
            (
                k.to_string(),
                InferParameter {
                    parameter_choice: Some(choice),
                },
            )
        })
        .collect()
}
