//! A look at a message's wire bytes before it is decoded. An empty entry of a repeated
//! message field costs two bytes on the wire and a whole struct once decoded (an empty
//! `InferInputTensor` is some 300 bytes), so a message within the size limit could make the
//! decoder allocate a hundred times its size. Counting the top-level fields first caps that.

use super::super::error::{ProtocolError, Result};

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
pub fn check_fanout(mut bytes: &[u8], names: &[(u64, &str)]) -> Result<()> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    while !bytes.is_empty() {
        let Some(key) = varint(&mut bytes) else {
            return Ok(());
        };
        let (field, wire_type) = (key >> 3, key & 7);
        let skip = match wire_type {
            0 => match varint(&mut bytes) {
                Some(_) => 0,
                None => return Ok(()),
            },
            1 => 8,
            2 => match varint(&mut bytes).and_then(|n| usize::try_from(n).ok()) {
                Some(n) => n,
                None => return Ok(()),
            },
            5 => 4,
            _ => return Ok(()),
        };
        if skip > bytes.len() {
            return Ok(());
        }
        bytes = &bytes[skip..];
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
    use super::*;

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
