//! Writing tensor bytes as a flat JSON `data` array. Floats use zmij's shortest round-trip
//! form, integers itoa; non-finite floats become the strings "NaN", "Infinity", "-Infinity".

use half::{bf16, f16};

use super::datatype::DataType;
use super::error::{ProtocolError, Result};

trait WriteElem: Copy {
    const SIZE: usize;
    fn read(b: &[u8]) -> Self;
    fn write(self, out: &mut Vec<u8>, ibuf: &mut itoa::Buffer, fbuf: &mut zmij::Buffer);
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl WriteElem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunk of element size"))
            }
            #[inline]
            fn write(self, out: &mut Vec<u8>, ibuf: &mut itoa::Buffer, _: &mut zmij::Buffer) {
                out.extend_from_slice(ibuf.format(self).as_bytes());
            }
        }
    )*};
}
int_elem!(u8, u16, u32, u64, i8, i16, i32, i64);

#[inline]
fn write_non_finite(out: &mut Vec<u8>, nan: bool, negative: bool) {
    out.extend_from_slice(match (nan, negative) {
        (true, _) => b"\"NaN\"",
        (false, false) => b"\"Infinity\"",
        (false, true) => b"\"-Infinity\"",
    });
}

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl WriteElem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunk of element size"))
            }
            #[inline]
            fn write(self, out: &mut Vec<u8>, _: &mut itoa::Buffer, fbuf: &mut zmij::Buffer) {
                if self.is_finite() {
                    out.extend_from_slice(fbuf.format_finite(self).as_bytes());
                } else {
                    write_non_finite(out, self.is_nan(), self < 0.0);
                }
            }
        }
    )*};
}
float_elem!(f32, f64);

/// Half-precision values are written through f32, which holds every one of them exactly, so
/// the shortest f32 text reads back to the same half value.
#[derive(Clone, Copy)]
struct Half(f32);

fn write_elems<T: WriteElem>(out: &mut Vec<u8>, data: &[u8], conv: impl Fn(&[u8]) -> T) {
    let mut ibuf = itoa::Buffer::new();
    let mut fbuf = zmij::Buffer::new();
    out.reserve(data.len() / T::SIZE.max(1) * 12 + 2);
    out.push(b'[');
    for (i, chunk) in data.chunks_exact(T::SIZE).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        conv(chunk).write(out, &mut ibuf, &mut fbuf);
    }
    out.push(b']');
}

impl WriteElem for Half {
    const SIZE: usize = 2;
    fn read(_: &[u8]) -> Self {
        unreachable!("half values are converted by the caller")
    }
    #[inline]
    fn write(self, out: &mut Vec<u8>, i: &mut itoa::Buffer, f: &mut zmij::Buffer) {
        self.0.write(out, i, f)
    }
}

/// Appends `data` (the binary layout of `dt`) to `out` as a flat JSON array.
/// Fails only for BYTES elements that are not UTF-8, which JSON strings cannot carry.
pub fn write_data(out: &mut Vec<u8>, dt: DataType, data: &[u8]) -> Result<()> {
    match dt {
        DataType::Bool => {
            out.reserve(data.len() * 6 + 2);
            out.push(b'[');
            for (i, &b) in data.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(if b != 0 { b"true" } else { b"false" });
            }
            out.push(b']');
        }
        DataType::Uint8 => write_elems(out, data, u8::read),
        DataType::Uint16 => write_elems(out, data, u16::read),
        DataType::Uint32 => write_elems(out, data, u32::read),
        DataType::Uint64 => write_elems(out, data, u64::read),
        DataType::Int8 => write_elems(out, data, i8::read),
        DataType::Int16 => write_elems(out, data, i16::read),
        DataType::Int32 => write_elems(out, data, i32::read),
        DataType::Int64 => write_elems(out, data, i64::read),
        DataType::Fp32 => write_elems(out, data, f32::read),
        DataType::Fp64 => write_elems(out, data, f64::read),
        DataType::Fp16 => write_elems(out, data, |c| {
            Half(f16::from_le_bytes([c[0], c[1]]).to_f32())
        }),
        DataType::Bf16 => write_elems(out, data, |c| {
            Half(bf16::from_le_bytes([c[0], c[1]]).to_f32())
        }),
        DataType::Bytes => write_bytes(out, data)?,
    }
    Ok(())
}

fn write_bytes(out: &mut Vec<u8>, data: &[u8]) -> Result<()> {
    out.push(b'[');
    let mut pos = 0;
    let mut i = 0u64;
    while pos + 4 <= data.len() {
        let len = u32::from_le_bytes(data[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let Some(elem) = data.get(pos + 4..pos + 4 + len) else {
            break;
        };
        let s = std::str::from_utf8(elem).map_err(|_| {
            ProtocolError::invalid(format!(
                "BYTES element {i} is not valid UTF-8, so it cannot be written as JSON; request this output with \"binary_data\": true"
            ))
        })?;
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
        pos += 4 + len;
        i += 1;
    }
    out.push(b']');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tensor::frame_bytes;

    fn json(dt: DataType, data: &[u8]) -> String {
        let mut out = Vec::new();
        write_data(&mut out, dt, data).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn writes_each_type() {
        assert_eq!(json(DataType::Bool, &[1, 0]), "[true,false]");
        assert_eq!(json(DataType::Int8, &[0xff, 1]), "[-1,1]");
        let v: Vec<u8> = [u64::MAX].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(json(DataType::Uint64, &v), "[18446744073709551615]");
        let v: Vec<u8> = [1.5f32, 0.1, -0.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(json(DataType::Fp32, &v), "[1.5,0.1,-0.0]");
        let v: Vec<u8> = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(
            json(DataType::Fp64, &v),
            r#"["NaN","Infinity","-Infinity"]"#
        );
        let v: Vec<u8> = [f16::from_f32(0.1), f16::MAX]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(json(DataType::Fp16, &v), "[0.099975586,65504.0]");
        let v: Vec<u8> = [bf16::from_f32(3.0)]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(json(DataType::Bf16, &v), "[3.0]");
        assert_eq!(
            json(DataType::Bytes, &frame_bytes([&b"a\"b"[..], b""])),
            r#"["a\"b",""]"#
        );
    }

    #[test]
    fn non_utf8_bytes_cannot_be_json() {
        let mut out = Vec::new();
        let e = write_data(
            &mut out,
            DataType::Bytes,
            &frame_bytes([&b"ok"[..], &[0xff]]),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "BYTES element 1 is not valid UTF-8, so it cannot be written as JSON; request this output with \"binary_data\": true"
        );
    }
}
