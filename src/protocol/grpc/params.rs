//! `map<string, InferParameter>` to and from the neutral parameters. gRPC has no order for
//! a map, so its parameters are kept sorted by name, which makes re-encoding stable.

use std::collections::HashMap;

use super::pb::infer_parameter::ParameterChoice;
use super::pb::InferParameter;
use crate::protocol::error::{ProtocolError, Result};
use crate::protocol::params::{
    check_count, ParamValue, Parameters, SequenceId, MAX_SEQUENCE_ID_LEN,
};

/// A non-negative int64 is the same value as an unsigned one: both read as `Uint`, which is
/// how a JSON client's `"sequence_id": 42` reads too, so a sequence is the same key on
/// either transport. A negative int64 `sequence_id` is its 64 bits read unsigned, as
/// Triton casts it: tritonclient.grpc sends every integer id as int64, so this is how it
/// reaches a sequence whose id is 2^63 or more.
fn from_choice(key: &str, p: InferParameter) -> Result<ParamValue> {
    Ok(match p.parameter_choice {
        Some(ParameterChoice::BoolParam(b)) => ParamValue::Bool(b),
        Some(ParameterChoice::Int64Param(i)) if i >= 0 || key == "sequence_id" => {
            ParamValue::Uint(i as u64)
        }
        Some(ParameterChoice::Int64Param(i)) => ParamValue::Int(i),
        Some(ParameterChoice::Uint64Param(u)) => ParamValue::Uint(u),
        // JSON, in which the REST backends read parameters, has no NaN or infinity: such a
        // value would reach them as null.
        Some(ParameterChoice::DoubleParam(f)) if !f.is_finite() => {
            return Err(ProtocolError::invalid(format!(
                "parameter '{key}' is {f}; a double_param must be a finite number"
            )))
        }
        Some(ParameterChoice::DoubleParam(f)) => ParamValue::Float(f),
        Some(ParameterChoice::StringParam(s)) => ParamValue::String(s),
        None => {
            return Err(ProtocolError::invalid(format!(
                "parameter '{key}' has no value"
            )))
        }
    })
}

/// The `sequence_id` of a request not yet decoded, read as the decoder reads it; `None`
/// when it has none, or one the decoder will refuse (the wrong type, too long).
pub fn peek_sequence_id(parameters: &HashMap<String, InferParameter>) -> Option<SequenceId> {
    let p = parameters.get("sequence_id")?;
    match from_choice("sequence_id", p.clone()).ok()? {
        ParamValue::Uint(0) => None,
        ParamValue::Uint(u) => Some(SequenceId::Uint(u)),
        ParamValue::String(s) if s.is_empty() || s.len() > MAX_SEQUENCE_ID_LEN => None,
        ParamValue::String(s) => Some(SequenceId::String(s)),
        _ => None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_double_that_json_cannot_carry_is_refused() {
        for (f, shown) in [
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            let p = InferParameter {
                parameter_choice: Some(ParameterChoice::DoubleParam(f)),
            };
            let e = params_from_proto(HashMap::from([("temperature".to_string(), p)])).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "parameter 'temperature' is {shown}; a double_param must be a finite number"
                )
            );
        }
    }

    fn int64(i: i64) -> InferParameter {
        InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(i)),
        }
    }

    /// A negative int64 sequence id is its bits unsigned (Triton's cast); for any other
    /// parameter a negative number stays negative, and its checks refuse it.
    #[test]
    fn a_negative_int64_sequence_id_is_read_as_triton_casts_it() {
        let p = params_from_proto(HashMap::from([
            ("sequence_id".to_string(), int64(-1)),
            ("timeout".to_string(), int64(-5)),
            ("priority".to_string(), int64(3)),
        ]))
        .unwrap();
        assert_eq!(p.get("sequence_id"), Some(&ParamValue::Uint(u64::MAX)));
        assert_eq!(p.get("timeout"), Some(&ParamValue::Int(-5)));
        assert_eq!(p.get("priority"), Some(&ParamValue::Uint(3)));
        // Sorted by name, so that re-encoding is stable.
        let names: Vec<&str> = p.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["priority", "sequence_id", "timeout"]);
    }

    #[test]
    fn a_map_over_the_limit_is_refused_by_its_size() {
        let many: HashMap<String, InferParameter> = (0..=crate::protocol::params::MAX_PARAMETERS)
            .map(|i| (format!("p{i}"), int64(1)))
            .collect();
        assert_eq!(
            params_from_proto(many).unwrap_err().to_string(),
            "1025 parameters in one map; at most 1024 are accepted"
        );
    }
}
