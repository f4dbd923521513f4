//! Typed `InferTensorContents` to the tensor model's little-endian layout. Each datatype
//! reads one field, as Triton does; a value out of its datatype's range is an error, never
//! truncated.

use bytes::Bytes;

use super::pb::InferTensorContents;
use crate::protocol::datatype::DataType;
use crate::protocol::error::{ProtocolError, Result};
use crate::protocol::tensor::{format_shape, frame_bytes};

pub fn is_empty(c: &InferTensorContents) -> bool {
    c.bool_contents.is_empty()
        && c.int_contents.is_empty()
        && c.int64_contents.is_empty()
        && c.uint_contents.is_empty()
        && c.uint64_contents.is_empty()
        && c.fp32_contents.is_empty()
        && c.fp64_contents.is_empty()
        && c.bytes_contents.is_empty()
}

/// Which field of `InferTensorContents` carries `dt`.
fn field(dt: DataType) -> Option<&'static str> {
    Some(match dt {
        DataType::Bool => "bool_contents",
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int_contents",
        DataType::Int64 => "int64_contents",
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => "uint_contents",
        DataType::Uint64 => "uint64_contents",
        DataType::Fp32 => "fp32_contents",
        DataType::Fp64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::Fp16 | DataType::Bf16 => return None,
    })
}

/// Fills of fields other than the one `dt` reads: a sign of a client bug, refused rather
/// than ignored.
fn other_fields(c: &InferTensorContents, wanted: &str) -> Option<&'static str> {
    [
        ("bool_contents", c.bool_contents.is_empty()),
        ("int_contents", c.int_contents.is_empty()),
        ("int64_contents", c.int64_contents.is_empty()),
        ("uint_contents", c.uint_contents.is_empty()),
        ("uint64_contents", c.uint64_contents.is_empty()),
        ("fp32_contents", c.fp32_contents.is_empty()),
        ("fp64_contents", c.fp64_contents.is_empty()),
        ("bytes_contents", c.bytes_contents.is_empty()),
    ]
    .into_iter()
    .find(|(name, empty)| !empty && *name != wanted)
    .map(|(name, _)| name)
}

pub fn to_bytes(c: InferTensorContents, dt: DataType, shape: &[u64], count: u64) -> Result<Bytes> {
    let Some(wanted) = field(dt) else {
        return Err(ProtocolError::invalid(format!(
            "{dt} data must be sent in raw_input_contents: InferTensorContents has no field for it"
        )));
    };
    if let Some(other) = other_fields(&c, wanted) {
        return Err(ProtocolError::invalid(format!(
            "has {other}, but {dt} data goes in {wanted}"
        )));
    }
    let len = match dt {
        DataType::Bool => c.bool_contents.len(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => c.int_contents.len(),
        DataType::Int64 => c.int64_contents.len(),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => c.uint_contents.len(),
        DataType::Uint64 => c.uint64_contents.len(),
        DataType::Fp32 => c.fp32_contents.len(),
        DataType::Fp64 => c.fp64_contents.len(),
        _ => c.bytes_contents.len(),
    } as u64;
    if len != count {
        return Err(ProtocolError::invalid(format!(
            "shape {} needs {count} elements, {wanted} has {len}",
            format_shape(shape)
        )));
    }
    fn narrow<T, U: TryFrom<T> + Copy>(
        values: Vec<T>,
        dt: DataType,
        put: impl Fn(U, &mut Vec<u8>),
    ) -> Result<Vec<u8>>
    where
        T: Copy + std::fmt::Display,
    {
        let mut out = Vec::with_capacity(values.len() * dt.fixed_size().unwrap_or(1));
        for (i, v) in values.into_iter().enumerate() {
            let n = U::try_from(v).map_err(|_| {
                ProtocolError::invalid(format!("element {i} ({v}) is out of range for {dt}"))
            })?;
            put(n, &mut out);
        }
        Ok(out)
    }
    let out: Vec<u8> = match dt {
        DataType::Bool => c.bool_contents.into_iter().map(u8::from).collect(),
        DataType::Int8 => narrow(c.int_contents, dt, |v: i8, o| o.extend(v.to_le_bytes()))?,
        DataType::Int16 => narrow(c.int_contents, dt, |v: i16, o| o.extend(v.to_le_bytes()))?,
        DataType::Int32 => c
            .int_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Int64 => c
            .int64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint8 => narrow(c.uint_contents, dt, |v: u8, o| o.push(v))?,
        DataType::Uint16 => narrow(c.uint_contents, dt, |v: u16, o| o.extend(v.to_le_bytes()))?,
        DataType::Uint32 => c
            .uint_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint64 => c
            .uint64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp32 => c
            .fp32_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp64 => c
            .fp64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        _ => {
            for (i, e) in c.bytes_contents.iter().enumerate() {
                if u32::try_from(e.len()).is_err() {
                    return Err(ProtocolError::invalid(format!(
                        "element {i} is longer than the 4 GiB a BYTES element can hold"
                    )));
                }
            }
            return Ok(frame_bytes(c.bytes_contents.iter().map(|b| &b[..])));
        }
    };
    Ok(Bytes::from(out))
}
