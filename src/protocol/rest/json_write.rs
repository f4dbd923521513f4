//! Writing tensor bytes as a flat JSON `data` array. Floats use zmij's shortest round-trip
//! form, integers itoa; non-finite floats become the strings "NaN", "Infinity", "-Infinity".

use half::{bf16, f16};

use crate::protocol::datatype::DataType;
use crate::protocol::error::{ProtocolError, Result};

trait WriteElem: Copy {
    const SIZE: usize;
    fn read(b: &[u8]) -> Self;
    /// The element's JSON text, at most `MAX_TEXT` bytes.
    fn text<'b>(self, ibuf: &'b mut itoa::Buffer, fbuf: &'b mut zmij::Buffer) -> &'b [u8];
}

/// The longest element text: `-2.2250738585072014e-308` (integers take at most 20).
const MAX_TEXT: usize = 24;

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl WriteElem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunk of element size"))
            }
            #[inline]
            fn text<'b>(self, ibuf: &'b mut itoa::Buffer, _: &'b mut zmij::Buffer) -> &'b [u8] {
                ibuf.format(self).as_bytes()
            }
        }
    )*};
}
int_elem!(u8, u16, u32, u64, i8, i16, i32, i64);

#[inline]
fn non_finite(nan: bool, negative: bool) -> &'static [u8] {
    match (nan, negative) {
        (true, _) => b"\"NaN\"",
        (false, false) => b"\"Infinity\"",
        (false, true) => b"\"-Infinity\"",
    }
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
            fn text<'b>(self, _: &'b mut itoa::Buffer, fbuf: &'b mut zmij::Buffer) -> &'b [u8] {
                if self.is_finite() {
                    fbuf.format_finite(self).as_bytes()
                } else {
                    non_finite(self.is_nan(), self < 0.0)
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

/// Copies an element text of at most `MAX_TEXT` bytes with two fixed-size, overlapping
/// moves: `extend_from_slice` would call memmove for every element, which cost a third of
/// the time of writing FP32 data.
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) -> usize {
    let n = src.len();
    if n >= 16 {
        dst[..16].copy_from_slice(&src[..16]);
        dst[n - 16..n].copy_from_slice(&src[n - 16..]);
    } else if n >= 8 {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..n].copy_from_slice(&src[n - 8..]);
    } else if n >= 4 {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..n].copy_from_slice(&src[n - 4..]);
    } else {
        dst[..n].copy_from_slice(src);
    }
    n
}

/// Elements written per batch: the output is grown by one batch's worst case, written by
/// index, then cut to what was written.
const BATCH: usize = 1024;

fn write_elems<T: WriteElem>(out: &mut Vec<u8>, data: &[u8], conv: impl Fn(&[u8]) -> T) {
    let mut ibuf = itoa::Buffer::new();
    let mut fbuf = zmij::Buffer::new();
    let slack = BATCH * (MAX_TEXT + 1);
    // The worst case, so that the buffer never moves as it grows: pages that are never
    // written are never touched, so the excess costs address space, not memory.
    out.reserve((data.len() / T::SIZE.max(1)) * (MAX_TEXT + 1) + 2 + slack);
    out.push(b'[');
    let mut first = true;
    for batch in data.chunks(BATCH * T::SIZE) {
        let base = out.len();
        out.resize(base + slack, 0);
        let buf = &mut out[base..];
        let mut pos = 0;
        for chunk in batch.chunks_exact(T::SIZE) {
            if !first {
                buf[pos] = b',';
                pos += 1;
            }
            first = false;
            pos += copy_short(&mut buf[pos..], conv(chunk).text(&mut ibuf, &mut fbuf));
        }
        out.truncate(base + pos);
    }
    out.push(b']');
}

impl WriteElem for Half {
    const SIZE: usize = 2;
    fn read(_: &[u8]) -> Self {
        unreachable!("half values are converted by the caller")
    }
    #[inline]
    fn text<'b>(self, i: &'b mut itoa::Buffer, f: &'b mut zmij::Buffer) -> &'b [u8] {
        self.0.text(i, f)
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
                "BYTES element {i} is not valid UTF-8, so it cannot be written as JSON"
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
    fn short_copies_of_every_length() {
        let src: Vec<u8> = (b'a'..).take(MAX_TEXT).collect();
        for n in 0..=MAX_TEXT {
            let mut dst = [b'.'; MAX_TEXT + 1];
            assert_eq!(copy_short(&mut dst, &src[..n]), n);
            assert_eq!(&dst[..n], &src[..n]);
            assert!(dst[n..].iter().all(|b| *b == b'.'));
        }
    }

    #[test]
    fn batches_join_with_commas() {
        let n = BATCH * 2 + 3;
        let v: Vec<u8> = (0..n as i64)
            .map(|x| x - 5)
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let want = format!(
            "[{}]",
            (0..n as i64)
                .map(|x| (x - 5).to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(json(DataType::Int64, &v), want);
        // The extremes of each type's text length.
        let v: Vec<u8> = [
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            5e-324,
        ]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
        let text = json(DataType::Fp64, &v);
        let back: Vec<f64> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back,
            [
                f64::MIN_POSITIVE,
                -f64::MIN_POSITIVE,
                f64::MAX,
                f64::MIN,
                5e-324
            ]
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
            "BYTES element 1 is not valid UTF-8, so it cannot be written as JSON"
        );
    }
}
