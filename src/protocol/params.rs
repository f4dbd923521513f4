//! `$parameters`: ordered name/value pairs on requests, responses and tensors, and the typed
//! reading of the parameters that the protocol's extensions define.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

use super::error::{ProtocolError, Result};

/// A parameter value. The protocol allows strings, numbers and bools; `Json` keeps anything
/// else a backend sends (MLServer puts objects in some parameters) so that it is never lost.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    String(String),
    Json(serde_json::Value),
}

impl ParamValue {
    fn from_json(v: serde_json::Value) -> ParamValue {
        use serde_json::Value;
        match v {
            Value::Bool(b) => ParamValue::Bool(b),
            Value::String(s) => ParamValue::String(s),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    ParamValue::Uint(u)
                } else if let Some(i) = n.as_i64() {
                    ParamValue::Int(i)
                } else {
                    ParamValue::Float(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            other => ParamValue::Json(other),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            ParamValue::Bool(_) => "a bool",
            ParamValue::Int(_) => "a negative integer",
            // Also what gRPC's int64_param and uint64_param hold when not negative.
            ParamValue::Uint(_) => "an integer",
            ParamValue::Float(v) => float_kind(*v),
            ParamValue::String(_) => "a string",
            ParamValue::Json(v) if v.is_null() => "null",
            ParamValue::Json(v) if v.is_array() => "an array",
            ParamValue::Json(_) => "an object",
        }
    }
}

/// Says what kind of non-integer number a value was. serde_json reads an integer literal as
/// an integer whenever it fits in 64 bits, so a float is either written with a fraction or
/// an exponent (`3.0`, `3e0`: integral in value, but not an integer literal) or gRPC's
/// double_param, or an integer literal too large for 64 bits.
fn float_kind(v: f64) -> &'static str {
    // i64::MIN itself is a valid integer, but no integer literal reads as this float unless
    // it was below i64::MIN and rounded up to it.
    if v >= u64::MAX as f64 || v <= i64::MIN as f64 {
        "a number beyond the 64-bit integer range"
    } else {
        "a floating-point number"
    }
}

impl Serialize for ParamValue {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            ParamValue::Bool(b) => s.serialize_bool(*b),
            ParamValue::Int(i) => s.serialize_i64(*i),
            ParamValue::Uint(u) => s.serialize_u64(*u),
            ParamValue::Float(f) => s.serialize_f64(*f),
            ParamValue::String(v) => s.serialize_str(v),
            ParamValue::Json(v) => v.serialize(s),
        }
    }
}

/// Parameters in the order they arrived, so that a re-encoded body reads like the original.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters(Vec<(String, ParamValue)>);

/// Parameters in one map at most. The extensions define a handful; a client that sends
/// thousands gets a clear refusal rather than a request that costs the gateway for each.
pub const MAX_PARAMETERS: usize = 1024;

/// Up to this many, a duplicate is looked for by scanning; beyond, through a set, so that
/// reading a map costs time in proportion to its size (a scan per key was quadratic: 70,000
/// parameters in 1 MB of JSON held a core for seconds).
const SCAN_UP_TO: usize = 16;

impl Parameters {
    pub fn new() -> Self {
        Parameters(Vec::new())
    }

    /// From entries whose names are known to be distinct (a protobuf map's keys), checked
    /// against `MAX_PARAMETERS`.
    pub fn from_distinct(entries: Vec<(String, ParamValue)>) -> Result<Parameters> {
        check_count(entries.len())?;
        Ok(Parameters(entries))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &ParamValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&ParamValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key`, replacing an existing value in place.
    pub fn set(&mut self, key: &str, value: ParamValue) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_string(), value)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<ParamValue> {
        let pos = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(pos).1)
    }

    /// Refuses the shared-memory extension's parameters on a client's tensor: the gateway
    /// forwards tensors over the network and cannot read or write a region of the client's
    /// memory, so an input's data would be missing and an output's would go unwritten.
    pub fn refuse_shared_memory(&self) -> Result<()> {
        const SHARED_MEMORY: [&str; 3] = [
            "shared_memory_region",
            "shared_memory_byte_size",
            "shared_memory_offset",
        ];
        match self.iter().find(|(k, _)| SHARED_MEMORY.contains(k)) {
            None => Ok(()),
            Some((key, _)) => Err(ProtocolError::invalid(format!(
                "parameter '{key}': shared memory is not supported (the gateway forwards tensors over the network); send the tensor's data in the request, and take outputs in the response"
            ))),
        }
    }

    /// Refuses a value the protocol does not define for a client's parameters (a
    /// parameter is a string, a number or a bool): an array, an object or null. They are
    /// kept from a backend (MLServer sends objects), never taken from a client, whose
    /// request may go on to a backend that cannot read them, and over gRPC, which cannot
    /// carry them.
    pub fn check_scalar(&self) -> Result<()> {
        match self
            .0
            .iter()
            .find(|(_, v)| matches!(v, ParamValue::Json(_)))
        {
            None => Ok(()),
            Some((key, v)) => Err(ProtocolError::invalid(format!(
                "parameter '{key}' must be a string, a number or a bool, not {}",
                v.type_name()
            ))),
        }
    }

    /// A bool parameter; any other type is an error naming the parameter.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(ParamValue::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_type(key, "a bool", other)),
        }
    }

    /// A non-negative integer parameter.
    pub fn get_uint(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(ParamValue::Uint(u)) => Ok(Some(*u)),
            Some(other) => Err(wrong_type(key, "an unsigned integer", other)),
        }
    }
}

/// Refuses a map of more than `MAX_PARAMETERS` entries.
pub fn check_count(n: usize) -> Result<()> {
    if n > MAX_PARAMETERS {
        return Err(ProtocolError::invalid(format!(
            "{n} parameters in one map; at most {MAX_PARAMETERS} are accepted"
        )));
    }
    Ok(())
}

fn wrong_type(key: &str, want: &str, got: &ParamValue) -> ProtocolError {
    ProtocolError::invalid(format!(
        "parameter '{key}' must be {want}, not {}",
        got.type_name()
    ))
}

impl Serialize for Parameters {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Parameters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Parameters;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of parameters")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Parameters, A::Error> {
                let mut out: Vec<(String, ParamValue)> = Vec::new();
                let mut seen: std::collections::HashSet<String> = Default::default();
                while let Some((k, v)) = m.next_entry::<String, serde_json::Value>()? {
                    if out.len() == MAX_PARAMETERS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_PARAMETERS} parameters in one map"
                        )));
                    }
                    let duplicate = if out.len() < SCAN_UP_TO {
                        out.iter().any(|(e, _)| *e == k)
                    } else {
                        if seen.is_empty() {
                            seen.extend(out.iter().map(|(e, _)| e.clone()));
                        }
                        !seen.insert(k.clone())
                    };
                    if duplicate {
                        return Err(serde::de::Error::custom(format!(
                            "duplicate parameter '{k}'"
                        )));
                    }
                    out.push((k, ParamValue::from_json(v)));
                }
                Ok(Parameters(out))
            }
            fn visit_unit<E>(self) -> std::result::Result<Parameters, E> {
                Ok(Parameters::new())
            }
        }
        d.deserialize_any(V)
    }
}

/// The `sequence_id` of a request: absent, 0 and "" all mean "not in a sequence".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SequenceId {
    Uint(u64),
    String(String),
}

/// The request parameter (Triton's, for ModelStreamInfer) that asks each answer to say
/// whether it is the request's last.
pub const ENABLE_EMPTY_FINAL_RESPONSE: &str = "triton_enable_empty_final_response";
/// The answer's parameter that says so.
pub const FINAL_RESPONSE: &str = "triton_final_response";

/// Triton's limit on string sequence ids.
pub const MAX_SEQUENCE_ID_LEN: usize = 128;

/// Request-level parameters that the protocol's extensions define, read and checked once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestOptions {
    pub sequence_id: Option<SequenceId>,
    pub sequence_start: bool,
    pub sequence_end: bool,
    pub binary_data_output: bool,
    /// The v2 `timeout` parameter, in microseconds.
    pub timeout_us: Option<u64>,
}

impl RequestOptions {
    pub fn from_parameters(p: &Parameters) -> Result<RequestOptions> {
        for (k, _) in p.iter() {
            if k.starts_with("triton_") && k != ENABLE_EMPTY_FINAL_RESPONSE {
                return Err(ProtocolError::invalid(format!(
                    "parameter '{k}' is reserved: names starting with 'triton_' may not be used"
                )));
            }
        }
        let sequence_id = match p.get("sequence_id") {
            None | Some(ParamValue::Uint(0)) => None,
            Some(ParamValue::Uint(u)) => Some(SequenceId::Uint(*u)),
            Some(ParamValue::String(s)) if s.is_empty() => None,
            Some(ParamValue::String(s)) => {
                if s.len() > MAX_SEQUENCE_ID_LEN {
                    return Err(ProtocolError::invalid(format!(
                        "parameter 'sequence_id' is a string of {} bytes; the limit is {MAX_SEQUENCE_ID_LEN}",
                        s.len()
                    )));
                }
                Some(SequenceId::String(s.clone()))
            }
            Some(other) => {
                return Err(wrong_type(
                    "sequence_id",
                    "an unsigned integer or a string",
                    other,
                ))
            }
        };
        // Triton's one `triton_` request parameter: a stream's answers then say which is a
        // request's last (`triton_final_response`). Every answer is, here.
        p.get_bool(ENABLE_EMPTY_FINAL_RESPONSE)?;
        // Triton's scheduling priority: checked here, as `timeout` is, so that a wrong type
        // is the gateway's 400 naming it and not a backend's error (or silence).
        p.get_uint("priority")?;
        let sequence_start = p.get_bool("sequence_start")?.unwrap_or(false);
        let sequence_end = p.get_bool("sequence_end")?.unwrap_or(false);
        if sequence_id.is_none() {
            for (flag, set) in [
                ("sequence_start", sequence_start),
                ("sequence_end", sequence_end),
            ] {
                if set {
                    return Err(ProtocolError::invalid(format!(
                        "parameter '{flag}' needs a non-zero, non-empty 'sequence_id'"
                    )));
                }
            }
        }
        Ok(RequestOptions {
            sequence_id,
            sequence_start,
            sequence_end,
            binary_data_output: p.get_bool("binary_data_output")?.unwrap_or(false),
            timeout_us: p.get_uint("timeout")?,
        })
    }
}

/// Parameters of one requested output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputOptions {
    pub binary_data: Option<bool>,
    pub classification: Option<u64>,
}

impl OutputOptions {
    pub fn from_parameters(p: &Parameters) -> Result<OutputOptions> {
        p.refuse_shared_memory()?;
        Ok(OutputOptions {
            binary_data: p.get_bool("binary_data")?,
            classification: p.get_uint("classification")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(json: &str) -> Parameters {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn keeps_order_and_types() {
        let p = params(r#"{"b": true, "a": -3, "c": 7, "d": 1.5, "e": "x", "f": {"k": 1}}"#);
        let keys: Vec<_> = p.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a", "c", "d", "e", "f"]);
        assert_eq!(p.get("a"), Some(&ParamValue::Int(-3)));
        assert_eq!(p.get("c"), Some(&ParamValue::Uint(7)));
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"b":true,"a":-3,"c":7,"d":1.5,"e":"x","f":{"k":1}}"#
        );
    }

    #[test]
    fn duplicate_parameter_is_rejected() {
        let e = serde_json::from_str::<Parameters>(r#"{"a": 1, "a": 2}"#).unwrap_err();
        assert!(e.to_string().starts_with("duplicate parameter 'a'"), "{e}");
    }

    fn map_of(names: impl Iterator<Item = String>) -> String {
        let entries: Vec<String> = names.map(|n| format!("\"{n}\": 1")).collect();
        format!("{{{}}}", entries.join(","))
    }

    /// Past the scanned few, duplicates are still found (through the set), wherever they are.
    #[test]
    fn a_duplicate_among_many_is_rejected() {
        for first in [0, 15, 16, 500] {
            let names = (0..MAX_PARAMETERS - 1)
                .map(|i| format!("p{i}"))
                .chain([format!("p{first}")]);
            let e = serde_json::from_str::<Parameters>(&map_of(names)).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("duplicate parameter 'p{first}'")),
                "{e}"
            );
        }
        let p: Parameters =
            serde_json::from_str(&map_of((0..MAX_PARAMETERS).map(|i| format!("p{i}")))).unwrap();
        assert_eq!(p.len(), MAX_PARAMETERS);
        assert_eq!(p.get("p1023"), Some(&ParamValue::Uint(1)));
    }

    /// A map over the limit is refused at its first extra entry, before the rest is read.
    #[test]
    fn too_many_parameters_are_refused() {
        let e = serde_json::from_str::<Parameters>(&map_of(
            (0..MAX_PARAMETERS + 1).map(|i| format!("p{i}")),
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("more than 1024 parameters in one map"),
            "{e}"
        );
        assert_eq!(
            check_count(MAX_PARAMETERS + 1).unwrap_err().to_string(),
            "1025 parameters in one map; at most 1024 are accepted"
        );
        assert!(check_count(MAX_PARAMETERS).is_ok());
    }

    #[test]
    fn sequence_ids() {
        let o = RequestOptions::from_parameters(&params(
            r#"{"sequence_id": 42, "sequence_start": true}"#,
        ))
        .unwrap();
        assert_eq!(o.sequence_id, Some(SequenceId::Uint(42)));
        assert!(o.sequence_start);
        let o = RequestOptions::from_parameters(&params(r#"{"sequence_id": "abc"}"#)).unwrap();
        assert_eq!(o.sequence_id, Some(SequenceId::String("abc".into())));
        for none in [r#"{"sequence_id": 0}"#, r#"{"sequence_id": ""}"#, "{}"] {
            assert_eq!(
                RequestOptions::from_parameters(&params(none))
                    .unwrap()
                    .sequence_id,
                None
            );
        }
    }

    #[test]
    fn sequence_id_errors() {
        let err = |j: &str| {
            RequestOptions::from_parameters(&params(j))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(r#"{"sequence_id": -1}"#),
            "parameter 'sequence_id' must be an unsigned integer or a string, not a negative integer"
        );
        assert_eq!(
            err(r#"{"sequence_id": 1.5}"#),
            "parameter 'sequence_id' must be an unsigned integer or a string, not a floating-point number"
        );
        assert_eq!(
            err(r#"{"sequence_id": 18446744073709551616}"#),
            "parameter 'sequence_id' must be an unsigned integer or a string, not a number beyond the 64-bit integer range"
        );
        let long = format!(r#"{{"sequence_id": "{}"}}"#, "x".repeat(129));
        assert_eq!(
            err(&long),
            "parameter 'sequence_id' is a string of 129 bytes; the limit is 128"
        );
        assert_eq!(
            err(r#"{"sequence_start": true}"#),
            "parameter 'sequence_start' needs a non-zero, non-empty 'sequence_id'"
        );
        assert_eq!(
            err(r#"{"sequence_id": 0, "sequence_end": true}"#),
            "parameter 'sequence_end' needs a non-zero, non-empty 'sequence_id'"
        );
        assert_eq!(
            err(r#"{"sequence_id": 3, "sequence_end": 1}"#),
            "parameter 'sequence_end' must be a bool, not an integer"
        );
        assert_eq!(
            err(r#"{"binary_data_output": "yes"}"#),
            "parameter 'binary_data_output' must be a bool, not a string"
        );
        assert_eq!(
            err(r#"{"triton_other": true}"#),
            "parameter 'triton_other' is reserved: names starting with 'triton_' may not be used"
        );
        // The one Triton itself takes.
        assert_eq!(
            err(r#"{"triton_enable_empty_final_response": 1}"#),
            "parameter 'triton_enable_empty_final_response' must be a bool, not an integer"
        );
        let p: Parameters =
            serde_json::from_str(r#"{"triton_enable_empty_final_response": true}"#).unwrap();
        assert!(RequestOptions::from_parameters(&p).is_ok());
        assert_eq!(
            err(r#"{"timeout": -5}"#),
            "parameter 'timeout' must be an unsigned integer, not a negative integer"
        );
        assert_eq!(
            err(r#"{"priority": "high"}"#),
            "parameter 'priority' must be an unsigned integer, not a string"
        );
        let p: Parameters = serde_json::from_str(r#"{"priority": 2}"#).unwrap();
        assert!(RequestOptions::from_parameters(&p).is_ok());
    }

    #[test]
    fn output_options() {
        let o = OutputOptions::from_parameters(&params(
            r#"{"binary_data": true, "classification": 3}"#,
        ))
        .unwrap();
        assert_eq!(
            o,
            OutputOptions {
                binary_data: Some(true),
                classification: Some(3)
            }
        );
        let e = OutputOptions::from_parameters(&params(r#"{"classification": -2}"#)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameter 'classification' must be an unsigned integer, not a negative integer"
        );
        // Integral in value, but not an integer literal: JSON readers tell them apart.
        for text in ["2.5", "3.0", "3e0", "1E2", "-0.0", "1e300"] {
            let e = OutputOptions::from_parameters(&params(&format!(
                r#"{{"classification": {text}}}"#
            )))
            .unwrap_err();
            let kind = if text == "1e300" {
                "a number beyond the 64-bit integer range"
            } else {
                "a floating-point number"
            };
            assert_eq!(
                e.to_string(),
                format!("parameter 'classification' must be an unsigned integer, not {kind}"),
                "{text}"
            );
        }
        for text in ["18446744073709551616", "-9223372036854775809"] {
            let e = OutputOptions::from_parameters(&params(&format!(
                r#"{{"classification": {text}}}"#
            )))
            .unwrap_err();
            assert_eq!(
                e.to_string(),
                "parameter 'classification' must be an unsigned integer, not a number beyond the 64-bit integer range",
                "{text}"
            );
        }
        let e = OutputOptions::from_parameters(&params(r#"{"binary_data": null}"#)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameter 'binary_data' must be a bool, not null"
        );
    }
}
