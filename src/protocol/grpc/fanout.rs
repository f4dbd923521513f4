//! A look at a message's wire bytes before it is decoded. An empty entry of a repeated
//! message field costs two bytes on the wire and a whole struct once decoded (an empty
//! `InferInputTensor` is some 300 bytes), so a message within the size limit could make the
//! decoder allocate a hundred times its size. Counting the top-level fields first caps that
//! (`check_fanout`); for ModelInfer, an input's typed contents are also counted against its
//! shape (`check_contents`). Both read the wire through one field iterator (`fields`).

use super::super::error::{ProtocolError, Result};
use super::pb;
use crate::protocol::tensor::{format_shape, too_many_dimensions, MAX_RANK};

/// Most entries of any one top-level field of a message: far more inputs, outputs or raw
/// contents than any model has.
pub const MAX_REPEATED: usize = 4096;

/// A ModelInferRequest's repeated fields (a map is a repeated field on the wire), by number:
/// the refusal names them.
pub const INFER_REQUEST_FIELDS: &[(u64, &str)] = &[
    (4, "parameters"),
    (5, "inputs"),
    (6, "outputs"),
    (7, "raw_input_contents"),
];

/// Counts the top-level fields of a protobuf message. Malformed bytes are left for the
/// decoder to word; only a field repeated more than `MAX_REPEATED` times is refused here,
/// by its name in `names` if it is there.
pub fn check_fanout(bytes: &[u8], names: &[(u64, &str)]) -> Result<()> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for (field, _) in fields(bytes) {
        let count = match counts.iter_mut().find(|(f, _)| *f == field) {
            Some((_, c)) => {
                *c += 1;
                *c
            }
            None => {
                counts.push((field, 1));
                1
            }
        };
        if count > MAX_REPEATED {
            let which = match names.iter().find(|(n, _)| *n == field) {
                Some((_, name)) => format!("'{name}' (field {field})"),
                None => format!("field {field}"),
            };
            return Err(ProtocolError::too_large(format!(
                "{which} of the message repeats more than {MAX_REPEATED} times"
            )));
        }
        // Distinct field numbers are few in a real message; many is itself a sign of abuse.
        if counts.len() > MAX_REPEATED {
            return Err(ProtocolError::too_large(format!(
                "the message has more than {MAX_REPEATED} distinct fields"
            )));
        }
    }
    Ok(())
}

/// One field of a protobuf message on the wire.
enum Wire<'a> {
    Varint(u64),
    /// A fixed64 (wire type 1) or fixed32 (5) value.
    Fixed,
    Delimited(&'a [u8]),
    /// A group (wire types 3 to 4, proto2's): prost steps over one in a field it does not
    /// know, so the look does too, rather than stop there and miss what follows it.
    Group,
}

/// How deep groups may nest: prost's own limit.
const GROUP_DEPTH: usize = 100;

/// Steps over the rest of a group of field `number`, to its end.
fn skip_group(bytes: &mut &[u8], number: u64, depth: usize) -> Option<()> {
    if depth >= GROUP_DEPTH {
        return None;
    }
    loop {
        let key = varint(bytes)?;
        match key & 7 {
            0 => {
                varint(bytes)?;
            }
            1 | 5 => *bytes = bytes.get(if key & 7 == 1 { 8 } else { 4 }..)?,
            2 => {
                let n = usize::try_from(varint(bytes)?).ok()?;
                *bytes = bytes.get(n..)?;
            }
            3 => skip_group(bytes, key >> 3, depth + 1)?,
            4 if key >> 3 == number => return Some(()),
            _ => return None,
        }
    }
}

/// The fields of a message, in wire order; stops at the first malformed one (the decoder
/// words that).
fn fields(mut bytes: &[u8]) -> impl Iterator<Item = (u64, Wire<'_>)> {
    std::iter::from_fn(move || {
        let key = varint(&mut bytes)?;
        let value = match key & 7 {
            0 => Wire::Varint(varint(&mut bytes)?),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                bytes = bytes.get(n..)?;
                Wire::Fixed
            }
            2 => {
                let n = usize::try_from(varint(&mut bytes)?).ok()?;
                let (value, rest) = (bytes.get(..n)?, bytes.get(n..)?);
                bytes = rest;
                Wire::Delimited(value)
            }
            3 => {
                skip_group(&mut bytes, key >> 3, 0)?;
                Wire::Group
            }
            _ => return None,
        };
        Some((key >> 3, value))
    })
}

/// `InferTensorContents` fields by number, the bytes a packed element takes on the wire (0:
/// a varint, 1 to 10 bytes), and the bytes one element takes once decoded.
const CONTENTS_FIELDS: &[(u64, &str, usize, usize)] = &[
    (1, "bool_contents", 0, 1),
    (2, "int_contents", 0, 4),
    (3, "int64_contents", 0, 8),
    (4, "uint_contents", 0, 4),
    (5, "uint64_contents", 0, 8),
    (6, "fp32_contents", 4, 4),
    (7, "fp64_contents", 8, 8),
    // A `Bytes` handle into the message; its bytes are not copied.
    (8, "bytes_contents", 0, std::mem::size_of::<bytes::Bytes>()),
];

/// Checks, before a ModelInferRequest is decoded, that no input's shape has more than
/// `MAX_RANK` dimensions and that no input's typed contents hold more elements than its
/// shape has, and returns how many bytes the decoded inputs take beyond the message's own
/// (for the budget for bodies). An empty `bytes_contents` entry is two bytes on the wire and
/// 32 once decoded, and a varint one byte on the wire and eight: 250 KB of gzip could make the
/// decoder build 4 GB for a shape of one element, which the decoder would then refuse with
/// this same message. Fewer elements than the shape needs are left to the decoder.
pub fn check_contents(bytes: &[u8]) -> Result<usize> {
    let mut decoded = 0usize;
    for (field, value) in fields(bytes) {
        match (field, value) {
            (5, Wire::Delimited(input)) => {
                let input = scan_input(input);
                input.check_rank()?;
                input.check_contents()?;
                decoded = decoded.saturating_add(input.decoded);
            }
            (7, Wire::Delimited(_)) => {
                decoded = decoded.saturating_add(std::mem::size_of::<bytes::Bytes>());
            }
            _ => {}
        }
    }
    Ok(decoded)
}

/// Only the rank check of `check_contents`, for tonic's codec (the generated service's
/// path; the gateway's own stream path decodes with `check_contents`): there a decoding error
/// ends the whole stream, which a message whose contents contradict its shape should not,
/// but a shape whose dimensions would cost eight times their wire bytes is not decoded at
/// all.
pub fn check_ranks(bytes: &[u8]) -> Result<()> {
    for (field, value) in fields(bytes) {
        if let (5, Wire::Delimited(input)) = (field, value) {
            scan_input(input).check_rank()?;
        }
    }
    Ok(())
}

/// What `check_contents` estimates before decoding, from a decoded message: the bytes its
/// inputs take beyond the message's own (for a stream's message, counted once decoded).
pub fn decoded_extra(msg: &pb::ModelInferRequest) -> usize {
    let handle = std::mem::size_of::<bytes::Bytes>();
    let inputs = msg.inputs.iter().map(|input| {
        let contents = input.contents.as_ref().map_or(0, |c| {
            c.bool_contents.len()
                + 4 * (c.int_contents.len() + c.uint_contents.len() + c.fp32_contents.len())
                + 8 * (c.int64_contents.len() + c.uint64_contents.len() + c.fp64_contents.len())
                + handle * c.bytes_contents.len()
        });
        std::mem::size_of::<pb::model_infer_request::InferInputTensor>()
            + 8 * input.shape.len()
            + contents
    });
    inputs.sum::<usize>() + handle * msg.raw_input_contents.len()
}

/// What the wire says about one `InferInputTensor`.
struct InputScan {
    name: String,
    /// The first `MAX_RANK` dimensions, and how many there are in all.
    shape: Vec<i64>,
    rank: usize,
    /// Elements per `InferTensorContents` field, by field number.
    counts: [u64; 9],
    /// Bytes its shape and contents take once decoded.
    decoded: usize,
}

fn scan_input(input: &[u8]) -> InputScan {
    let mut scan = InputScan {
        name: String::new(),
        shape: Vec::new(),
        rank: 0,
        counts: [0; 9],
        decoded: std::mem::size_of::<pb::model_infer_request::InferInputTensor>(),
    };
    let dim = |d: u64, scan: &mut InputScan| {
        if scan.shape.len() < MAX_RANK {
            scan.shape.push(d as i64);
        }
        scan.rank += 1;
    };
    for (field, value) in fields(input) {
        match (field, value) {
            (1, Wire::Delimited(n)) => scan.name = String::from_utf8_lossy(n).into_owned(),
            (3, Wire::Varint(d)) => dim(d, &mut scan),
            (3, Wire::Delimited(packed)) => {
                let mut packed = packed;
                while let Some(d) = varint(&mut packed) {
                    dim(d, &mut scan);
                }
            }
            (5, Wire::Delimited(contents)) => {
                for (f, v) in fields(contents) {
                    let Some(&(_, _, width, _)) = CONTENTS_FIELDS.iter().find(|c| c.0 == f) else {
                        continue;
                    };
                    scan.counts[f as usize] += match v {
                        // A packed run: its elements, or (for bytes) one entry.
                        Wire::Delimited(run) if f != 8 && width > 0 => (run.len() / width) as u64,
                        Wire::Delimited(run) if f != 8 => {
                            run.iter().filter(|b| **b & 0x80 == 0).count() as u64
                        }
                        _ => 1,
                    };
                }
            }
            _ => {}
        }
    }
    scan.decoded = scan.decoded.saturating_add(scan.rank.saturating_mul(8));
    for &(f, _, _, size) in CONTENTS_FIELDS {
        let elements = usize::try_from(scan.counts[f as usize]).unwrap_or(usize::MAX);
        scan.decoded = scan.decoded.saturating_add(elements.saturating_mul(size));
    }
    scan
}

impl InputScan {
    fn check_rank(&self) -> Result<()> {
        if self.rank > MAX_RANK {
            let e = too_many_dimensions(self.rank);
            return Err(ProtocolError::invalid(format!(
                "input '{}': {}",
                self.name,
                e.message()
            )));
        }
        Ok(())
    }

    fn check_contents(&self) -> Result<()> {
        let Some(needed) = self.shape.iter().try_fold(1u64, |n, d| {
            u64::try_from(*d).ok().and_then(|d| n.checked_mul(d))
        }) else {
            return Ok(());
        };
        for &(f, field, _, _) in CONTENTS_FIELDS {
            let has = self.counts[f as usize];
            if has > needed {
                return Err(ProtocolError::invalid(format!(
                    "input '{}': shape {} needs {needed} elements, {field} has {has}",
                    self.name,
                    format_shape(&self.shape)
                )));
            }
        }
        Ok(())
    }
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let b = *bytes.get(i)?;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::protocol::grpc::pb;

    fn request_with(contents: pb::InferTensorContents, shape: Vec<i64>) -> Vec<u8> {
        pb::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "IN".into(),
                datatype: "BYTES".into(),
                shape,
                contents: Some(contents),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn contents_beyond_the_shape_are_refused_before_decoding() {
        let many = pb::InferTensorContents {
            bytes_contents: vec![Default::default(); 1000],
            ..Default::default()
        };
        assert_eq!(
            check_contents(&request_with(many.clone(), vec![1, 1]))
                .unwrap_err()
                .to_string(),
            "input 'IN': shape [1,1] needs 1 elements, bytes_contents has 1000"
        );
        assert!(check_contents(&request_with(many, vec![10, 100])).is_ok());
        let ints = pb::InferTensorContents {
            int64_contents: vec![0; 20],
            ..Default::default()
        };
        assert_eq!(
            check_contents(&request_with(ints.clone(), vec![4]))
                .unwrap_err()
                .to_string(),
            "input 'IN': shape [4] needs 4 elements, int64_contents has 20"
        );
        let floats = pb::InferTensorContents {
            fp32_contents: vec![0.5; 8],
            ..Default::default()
        };
        assert!(check_contents(&request_with(floats.clone(), vec![8])).is_ok());
        assert!(check_contents(&request_with(floats, vec![7])).is_err());
        // Fewer than the shape needs, and malformed bytes, are the decoder's to word.
        assert!(check_contents(&request_with(ints, vec![40])).is_ok());
        assert!(check_contents(&[0x2a, 0xff, 0xff]).is_ok());
    }

    #[test]
    fn the_decoded_size_is_estimated_alike_before_and_after_decoding() {
        let contents = pb::InferTensorContents {
            bytes_contents: vec![Default::default(); 1000],
            int64_contents: vec![1; 10],
            fp32_contents: vec![0.5; 10],
            ..Default::default()
        };
        let wire = request_with(contents, vec![10, 100]);
        let before = check_contents(&wire).unwrap();
        let after = decoded_extra(&pb::ModelInferRequest::decode(&wire[..]).unwrap());
        assert_eq!(before, after);
        // 1000 entries of 2 bytes each on the wire take 32 bytes each once decoded.
        assert!(
            before > 32_000 && wire.len() < 2_100,
            "{before} {}",
            wire.len()
        );
    }

    #[test]
    fn a_shape_past_the_rank_limit_is_refused_before_decoding() {
        let ints = pb::InferTensorContents::default();
        let ok = request_with(ints.clone(), vec![1; MAX_RANK]);
        assert!(check_contents(&ok).is_ok() && check_ranks(&ok).is_ok());
        let over = request_with(ints, vec![1; 100_000]);
        let refused = "input 'IN': shape has 100000 dimensions; the limit is 64";
        assert_eq!(check_contents(&over).unwrap_err().to_string(), refused);
        assert_eq!(check_ranks(&over).unwrap_err().to_string(), refused);
    }

    /// A group before the inputs (an unknown field, which prost steps over) hides nothing
    /// from the look: the inputs after it are still counted.
    #[test]
    fn groups_are_stepped_over() {
        let contents = pb::InferTensorContents {
            bytes_contents: vec![Default::default(); 1000],
            ..Default::default()
        };
        let plain = request_with(contents, vec![1]);
        // Field 14 as a group holding a varint and a nested group, then its end.
        let mut grouped = vec![0x73, 0x08, 0x01, 0x7b, 0x7c, 0x74];
        grouped.extend_from_slice(&plain);
        assert!(pb::ModelInferRequest::decode(&grouped[..]).is_ok());
        assert_eq!(
            check_contents(&grouped).unwrap_err().to_string(),
            "input 'IN': shape [1] needs 1 elements, bytes_contents has 1000"
        );
        // An end that does not match its start is malformed: the look stops, as prost does.
        let mut broken = vec![0x73, 0x7c];
        broken.extend_from_slice(&plain);
        assert!(pb::ModelInferRequest::decode(&broken[..]).is_err());
        assert!(check_contents(&broken).is_ok());
    }

    #[test]
    fn repeated_fields_are_counted() {
        // Field 5, length 0, repeated.
        let ok: Vec<u8> = [0x2a, 0x00].repeat(MAX_REPEATED);
        assert!(check_fanout(&ok, &[]).is_ok());
        let over: Vec<u8> = [0x2a, 0x00].repeat(MAX_REPEATED + 1);
        assert_eq!(
            check_fanout(&over, &[]).unwrap_err().to_string(),
            "field 5 of the message repeats more than 4096 times"
        );
        assert_eq!(
            check_fanout(&over, INFER_REQUEST_FIELDS)
                .unwrap_err()
                .to_string(),
            "'inputs' (field 5) of the message repeats more than 4096 times"
        );
        // Varints, fixed widths and a truncated tail are read past, not refused.
        assert!(check_fanout(
            &[0x08, 0x96, 0x01, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0x2a, 0x05],
            &[]
        )
        .is_ok());
        assert!(check_fanout(&[0xff; 20], &[]).is_ok());
    }
}
