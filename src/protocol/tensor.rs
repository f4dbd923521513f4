//! The encoding-neutral tensor: typed little-endian bytes, plus length framing for BYTES.
//! A tensor looks the same whether it arrived as JSON, as binary, or (later) as protobuf.

use bytes::Bytes;

use super::datatype::DataType;
use super::error::{ProtocolError, Result};
use super::params::Parameters;

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<u64>,
    /// Parameters other than `binary_data_size`, which belongs to the encoding, not the tensor.
    pub parameters: Parameters,
    /// Elements in row-major order. Fixed-size types: little-endian, no padding. BYTES: each
    /// element is a 4-byte little-endian length followed by that many bytes, exactly the
    /// binary extension's layout, so binary data passes through without a copy.
    pub data: Bytes,
}

impl Tensor {
    /// The number of elements the shape describes. Construction has already checked that it
    /// does not overflow.
    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Checks that the data holds exactly the elements the shape describes. Decoded tensors
    /// always do (decoding checks it); one that a built-in model built is checked where it
    /// leaves the model (`fleet::builtin`), so that nothing downstream, encoding or
    /// classification, sees a tensor that contradicts its own shape. A failure is
    /// `ProtocolError::Inconsistent`: the server's fault, a 500.
    pub fn check_consistent(&self) -> Result<()> {
        let count = if self.shape.contains(&0) {
            Some(0)
        } else {
            self.shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d))
        };
        let inconsistent =
            |m: String| ProtocolError::Inconsistent(format!("inconsistent tensor: {m}"));
        match self.datatype.fixed_size() {
            Some(size) => {
                let need = count.and_then(|n| n.checked_mul(size as u64));
                if need == Some(self.data.len() as u64) {
                    return Ok(());
                }
                Err(inconsistent(format!(
                    "shape {} of {} needs {} bytes, data has {}",
                    format_shape(&self.shape),
                    self.datatype,
                    need.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string()),
                    self.data.len()
                )))
            }
            None => {
                let count = count.ok_or_else(|| {
                    inconsistent(format!(
                        "shape {} has more elements than fit in 64 bits",
                        format_shape(&self.shape)
                    ))
                })?;
                check_bytes_framing(&self.data, count).map_err(|e| inconsistent(e.message().into()))
            }
        }
    }

    /// Iterates over the elements of a BYTES tensor. Framing was checked when the tensor was
    /// built, so this cannot fail.
    pub fn bytes_elements(&self) -> BytesElements<'_> {
        BytesElements {
            data: &self.data,
            pos: 0,
        }
    }
}

pub struct BytesElements<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for BytesElements<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = &self.data[self.pos..];
        if rest.len() < 4 {
            return None;
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let elem = rest.get(4..4 + len)?;
        self.pos += 4 + len;
        Some(elem)
    }
}

/// Formats a shape the way error messages show it: `[2,-1,3]`.
pub fn format_shape<T: std::fmt::Display>(shape: &[T]) -> String {
    let mut s = String::from("[");
    for (i, d) in shape.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&d.to_string());
    }
    s.push(']');
    s
}

/// Most dimensions a tensor may have: numpy 2's limit, far beyond any model's. Decoders
/// stop reading a shape past it, so that a shape cannot cost memory in proportion to the
/// body that carries it.
pub const MAX_RANK: usize = 64;

/// The refusal of a shape with `rank` dimensions (more than `MAX_RANK`).
pub fn too_many_dimensions(rank: usize) -> ProtocolError {
    ProtocolError::invalid(format!(
        "shape has {rank} dimensions; the limit is {MAX_RANK}"
    ))
}

/// Multiplies dimensions, failing on overflow and beyond `max_elements`. A dimension must
/// also fit the protocol's int64 (the protobuf shape is `repeated int64`): a shape with a 0
/// in it has no elements whatever its other dimensions, and would otherwise pass.
pub fn checked_element_count(shape: &[u64], max_elements: u64) -> Result<u64> {
    if shape.len() > MAX_RANK {
        return Err(too_many_dimensions(shape.len()));
    }
    if let Some(d) = shape.iter().find(|&&d| d > i64::MAX as u64) {
        return Err(ProtocolError::invalid(format!(
            "shape {} has a dimension {d} larger than the int64 maximum {}",
            format_shape(shape),
            i64::MAX
        )));
    }
    // A zero dimension anywhere makes no elements, whatever the others would multiply to:
    // the same answer in any order of dimensions.
    if shape.contains(&0) {
        return Ok(0);
    }
    let mut n: u64 = 1;
    for &d in shape {
        n = n.checked_mul(d).ok_or_else(|| {
            ProtocolError::invalid(format!(
                "shape {} has more elements than fit in 64 bits",
                format_shape(shape)
            ))
        })?;
    }
    if n > max_elements {
        return Err(ProtocolError::too_large(format!(
            "shape {} has {n} elements; the limit is {max_elements} per tensor",
            format_shape(shape)
        )));
    }
    Ok(n)
}

/// Checks that `data` holds exactly `count` well-framed BYTES elements.
pub fn check_bytes_framing(data: &[u8], count: u64) -> Result<()> {
    let mut pos = 0usize;
    for i in 0..count {
        let rest = &data[pos..];
        if rest.len() < 4 {
            return Err(ProtocolError::invalid(format!(
                "BYTES data ends after {i} of {count} elements"
            )));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if rest.len() - 4 < len {
            return Err(ProtocolError::invalid(format!(
                "BYTES element {i} declares {len} bytes but only {} remain in its data",
                rest.len() - 4
            )));
        }
        pos += 4 + len;
    }
    if pos != data.len() {
        return Err(ProtocolError::invalid(format!(
            "BYTES data has {} bytes left over after {count} elements",
            data.len() - pos
        )));
    }
    Ok(())
}

/// BOOL data holds one byte per element, 0 or 1; anything else would reach a backend as an
/// undefined value.
pub fn check_bool_bytes(data: &[u8]) -> Result<()> {
    match data.iter().position(|b| *b > 1) {
        Some(i) => Err(ProtocolError::invalid(format!(
            "BOOL element {i} is the byte {}; it must be 0 or 1",
            data[i]
        ))),
        None => Ok(()),
    }
}

/// Frames byte strings as BYTES tensor data.
pub fn frame_bytes<'a>(elements: impl IntoIterator<Item = &'a [u8]>) -> Bytes {
    let mut out = Vec::new();
    for e in elements {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_that_contradict_their_shape_are_inconsistent() {
        let tensor = |datatype, shape: Vec<u64>, data: Bytes| Tensor {
            name: "OUT".into(),
            datatype,
            shape,
            parameters: Parameters::new(),
            data,
        };
        let cases = [
            (
                tensor(DataType::Fp32, vec![2], Bytes::from_static(&[0; 4])),
                "inconsistent tensor: shape [2] of FP32 needs 8 bytes, data has 4",
            ),
            (
                tensor(DataType::Int16, vec![1, 1], Bytes::from_static(&[0; 3])),
                "inconsistent tensor: shape [1,1] of INT16 needs 2 bytes, data has 3",
            ),
            (
                tensor(DataType::Int8, vec![u64::MAX, 2], Bytes::new()),
                "inconsistent tensor: shape [18446744073709551615,2] of INT8 needs more than 2^64 bytes, data has 0",
            ),
            (
                tensor(DataType::Bytes, vec![2], frame_bytes([&b"a"[..]])),
                "inconsistent tensor: BYTES data ends after 1 of 2 elements",
            ),
            (
                tensor(DataType::Bytes, vec![u64::MAX, 2], Bytes::new()),
                "inconsistent tensor: shape [18446744073709551615,2] has more elements than fit in 64 bits",
            ),
        ];
        for (t, want) in cases {
            let e = t.check_consistent().unwrap_err();
            assert_eq!(e.to_string(), want);
            assert!(matches!(e, ProtocolError::Inconsistent(_)), "{e:?}");
        }
        let good = tensor(DataType::Bytes, vec![2], frame_bytes([&b"a"[..], b""]));
        assert_eq!(good.check_consistent(), Ok(()));
        assert_eq!(
            tensor(DataType::Int16, vec![0, 3], Bytes::new()).check_consistent(),
            Ok(())
        );
    }

    #[test]
    fn framing_errors_are_precise() {
        let framed = frame_bytes([&b"ab"[..], b"xyz"]);
        assert!(check_bytes_framing(&framed, 2).is_ok());
        assert_eq!(
            check_bytes_framing(&framed, 3).unwrap_err().to_string(),
            "BYTES data ends after 2 of 3 elements"
        );
        assert_eq!(
            check_bytes_framing(&framed, 1).unwrap_err().to_string(),
            "BYTES data has 7 bytes left over after 1 elements"
        );
        let mut bad = framed.to_vec();
        bad[0] = 10;
        assert_eq!(
            check_bytes_framing(&bad, 2).unwrap_err().to_string(),
            "BYTES element 0 declares 10 bytes but only 9 remain in its data"
        );
    }

    #[test]
    fn element_count_limits() {
        assert_eq!(checked_element_count(&[2, 3], 100).unwrap(), 6);
        // A zero anywhere: no elements, in any order.
        let big = 1u64 << 40;
        assert_eq!(checked_element_count(&[big, big, 0], 100).unwrap(), 0);
        assert_eq!(checked_element_count(&[0, big, big], 100).unwrap(), 0);
        assert_eq!(checked_element_count(&[], 100).unwrap(), 1);
        assert_eq!(checked_element_count(&[1; MAX_RANK], 100).unwrap(), 1);
        assert_eq!(
            checked_element_count(&[1; MAX_RANK + 1], 100).unwrap_err(),
            ProtocolError::invalid("shape has 65 dimensions; the limit is 64")
        );
        assert_eq!(
            checked_element_count(&[i64::MAX as u64, 3], u64::MAX)
                .unwrap_err()
                .to_string(),
            "shape [9223372036854775807,3] has more elements than fit in 64 bits"
        );
        // No elements, but a dimension no int64 holds.
        assert_eq!(
            checked_element_count(&[0, 1 << 63], u64::MAX)
                .unwrap_err()
                .to_string(),
            "shape [0,9223372036854775808] has a dimension 9223372036854775808 larger than the int64 maximum 9223372036854775807"
        );
        assert_eq!(
            checked_element_count(&[10, 11], 100).unwrap_err(),
            ProtocolError::too_large("shape [10,11] has 110 elements; the limit is 100 per tensor")
        );
    }

    #[test]
    fn iterates_bytes_elements() {
        let t = Tensor {
            name: "x".into(),
            datatype: DataType::Bytes,
            shape: vec![3],
            parameters: Parameters::new(),
            data: frame_bytes([&b"a"[..], b"", b"bc"]),
        };
        let v: Vec<&[u8]> = t.bytes_elements().collect();
        assert_eq!(v, vec![&b"a"[..], b"", b"bc"]);
    }
}
