//! Reading the `data` array of a JSON tensor straight into little-endian bytes.
//!
//! The request's JSON is parsed by serde with `data` borrowed as raw text; this module walks
//! that text once, without building a `serde_json::Value` per element. Nested and flat arrays
//! are both accepted and only leaves are counted, as Triton does.
//!
//! Non-finite floats: JSON has no literal for them, so tensorgate reads and writes the strings
//! `"NaN"`, `"Infinity"` and `"-Infinity"` in float tensors (numpy and Python's `float()` parse
//! them). Bare `NaN` literals are not JSON and are rejected with a hint.

use half::{bf16, f16};

use super::datatype::DataType;
use super::error::{ProtocolError, Result};

/// One leaf of the data array, as raw text.
enum Leaf<'a> {
    Number(&'a [u8]),
    /// The text between the quotes, and whether it contains escapes.
    String(&'a [u8], bool),
    True,
    False,
    Null,
}

impl Leaf<'_> {
    fn describe(&self) -> String {
        match self {
            Leaf::Number(t) => format!("the number {}", String::from_utf8_lossy(t)),
            Leaf::String(..) => "a string".to_string(),
            Leaf::True => "true".to_string(),
            Leaf::False => "false".to_string(),
            Leaf::Null => "null".to_string(),
        }
    }
}

const fn number_chars() -> [bool; 256] {
    let mut t = [false; 256];
    let chars = b"0123456789+-.eE";
    let mut i = 0;
    while i < chars.len() {
        t[chars[i] as usize] = true;
        i += 1;
    }
    t
}
static NUMBER_CHAR: [bool; 256] = number_chars();

#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

fn syntax_error(pos: usize) -> ProtocolError {
    ProtocolError::invalid(format!("'data' is not valid JSON at byte {pos}"))
}

/// Walks a JSON array of arbitrary nesting and calls `leaf` for each element in row-major
/// order. Returns the number of leaves and the position just after the closing bracket.
fn walk<'a, F>(s: &'a [u8], max_depth: usize, mut leaf: F) -> Result<(u64, usize)>
where
    F: FnMut(Leaf<'a>, u64) -> Result<()>,
{
    let len = s.len();
    let mut pos = 0usize;
    let skip_ws = |pos: &mut usize| {
        while *pos < len && is_ws(s[*pos]) {
            *pos += 1;
        }
    };
    skip_ws(&mut pos);
    if pos >= len || s[pos] != b'[' {
        return Err(ProtocolError::invalid("'data' must be a JSON array"));
    }
    pos += 1;
    let mut depth = 1usize;
    let mut count = 0u64;
    let mut after_open = true;
    'value: loop {
        skip_ws(&mut pos);
        let Some(&b) = s.get(pos) else {
            return Err(syntax_error(pos));
        };
        match b {
            b'[' => {
                depth += 1;
                if depth > max_depth {
                    return Err(ProtocolError::invalid(format!(
                        "'data' is nested deeper than {max_depth} levels"
                    )));
                }
                pos += 1;
                after_open = true;
                continue 'value;
            }
            b']' if after_open => {
                pos += 1;
                depth -= 1;
            }
            b'"' => {
                let start = pos + 1;
                let mut i = start;
                let mut escaped = false;
                loop {
                    match memchr::memchr2(b'"', b'\\', &s[i..]) {
                        None => return Err(syntax_error(len)),
                        Some(off) if s[i + off] == b'\\' => {
                            escaped = true;
                            i += off + 2;
                            if i > len {
                                return Err(syntax_error(len));
                            }
                        }
                        Some(off) => {
                            i += off;
                            break;
                        }
                    }
                }
                leaf(Leaf::String(&s[start..i], escaped), count)?;
                count += 1;
                pos = i + 1;
            }
            b't' | b'f' | b'n' => {
                let (lit, word): (Leaf, &[u8]) = match b {
                    b't' => (Leaf::True, b"true"),
                    b'f' => (Leaf::False, b"false"),
                    _ => (Leaf::Null, b"null"),
                };
                if !s[pos..].starts_with(word) {
                    return Err(syntax_error(pos));
                }
                leaf(lit, count)?;
                count += 1;
                pos += word.len();
            }
            _ => {
                let start = pos;
                while pos < len && NUMBER_CHAR[s[pos] as usize] {
                    pos += 1;
                }
                if pos == start {
                    return Err(syntax_error(pos));
                }
                leaf(Leaf::Number(&s[start..pos]), count)?;
                count += 1;
            }
        }
        // After a value: a comma, or closing brackets.
        loop {
            if depth == 0 {
                break 'value;
            }
            skip_ws(&mut pos);
            match s.get(pos) {
                Some(b',') => {
                    pos += 1;
                    after_open = false;
                    continue 'value;
                }
                Some(b']') => {
                    pos += 1;
                    depth -= 1;
                }
                _ => return Err(syntax_error(pos)),
            }
        }
    }
    Ok((count, pos))
}

/// Only whitespace may follow the array.
fn check_end(s: &[u8], end: usize) -> Result<()> {
    match s[end..].iter().position(|b| !is_ws(*b)) {
        None => Ok(()),
        Some(off) => Err(syntax_error(end + off)),
    }
}

/// Counts the elements of a JSON `data` array without converting them.
pub fn count_elements(text: &[u8], max_depth: usize) -> Result<u64> {
    let (count, end) = walk(text, max_depth, |_, _| Ok(()))?;
    check_end(text, end)?;
    Ok(count)
}

/// The length of the JSON array at the start of `text` (for the fast request path, which
/// meets `data` before it knows the datatype).
pub fn array_len(text: &[u8], max_depth: usize) -> Result<usize> {
    Ok(walk(text, max_depth, |_, _| Ok(()))?.1)
}

fn element_error(i: u64, what: String) -> ProtocolError {
    ProtocolError::invalid(format!("data element {i} {what}"))
}

fn tok_str(t: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(t)
}

trait LeInt: lexical_core::FromLexical + Copy {
    const SIGNED: bool;
    fn put(self, out: &mut Vec<u8>);
}

macro_rules! le_int {
    ($($t:ty => $signed:expr),*) => {$(
        impl LeInt for $t {
            const SIGNED: bool = $signed;
            #[inline]
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
le_int!(u8 => false, u16 => false, u32 => false, u64 => false, i8 => true, i16 => true, i32 => true, i64 => true);

#[inline]
fn put_int<T: LeInt>(leaf: Leaf, i: u64, dt: DataType, out: &mut Vec<u8>) -> Result<()> {
    let Leaf::Number(tok) = leaf else {
        return Err(element_error(
            i,
            format!("is {}; {dt} needs a number", leaf.describe()),
        ));
    };
    match lexical_core::parse::<T>(tok) {
        Ok(v) if tok[0] != b'+' => {
            v.put(out);
            Ok(())
        }
        _ => Err(int_error(tok, i, dt, T::SIGNED)),
    }
}

#[cold]
fn int_error(tok: &[u8], i: u64, dt: DataType, signed: bool) -> ProtocolError {
    let t = tok_str(tok);
    let is_number = lexical_core::parse::<f64>(tok).is_ok() && tok[0] != b'+';
    if !is_number {
        element_error(i, format!("({t}) is not a valid JSON number"))
    } else if tok.iter().any(|b| matches!(b, b'.' | b'e' | b'E')) {
        element_error(i, format!("({t}) is not an integer, as {dt} requires"))
    } else if !signed && tok[0] == b'-' {
        element_error(i, format!("({t}) is negative, but {dt} is unsigned"))
    } else {
        element_error(i, format!("({t}) is out of range for {dt}"))
    }
}

/// Reads a float element: a number, or one of the strings that stand for non-finite values.
#[inline]
fn float_value(leaf: Leaf, i: u64, dt: DataType) -> Result<f64> {
    match leaf {
        Leaf::Number(tok) => match lexical_core::parse::<f64>(tok) {
            Ok(v) if tok[0] != b'+' && v.is_finite() => Ok(v),
            Ok(_) if tok[0] != b'+' => Err(element_error(
                i,
                format!("({}) is out of range for {dt}", tok_str(tok)),
            )),
            _ => Err(element_error(
                i,
                format!("({}) is not a valid JSON number", tok_str(tok)),
            )),
        },
        Leaf::String(b"NaN", false) => Ok(f64::NAN),
        Leaf::String(b"Infinity", false) => Ok(f64::INFINITY),
        Leaf::String(b"-Infinity", false) => Ok(f64::NEG_INFINITY),
        other => Err(element_error(
            i,
            format!(
                "is {}; {dt} needs a number, or \"NaN\", \"Infinity\" or \"-Infinity\"",
                other.describe()
            ),
        )),
    }
}

fn out_of_range(v: f64, i: u64, dt: DataType) -> ProtocolError {
    element_error(i, format!("({v:e}) is out of range for {dt}"))
}

#[inline]
fn put_f32(leaf: Leaf, i: u64, out: &mut Vec<u8>) -> Result<()> {
    // Parsing straight to f32 rounds once, from the decimal text.
    if let Leaf::Number(tok) = leaf {
        if let Ok(v) = lexical_core::parse::<f32>(tok) {
            if v.is_finite() && tok[0] != b'+' {
                out.extend_from_slice(&v.to_le_bytes());
                return Ok(());
            }
        }
    }
    let v = float_value(leaf, i, DataType::Fp32)?;
    let f = v as f32;
    if v.is_finite() && !f.is_finite() {
        return Err(out_of_range(v, i, DataType::Fp32));
    }
    out.extend_from_slice(&f.to_le_bytes());
    Ok(())
}

/// Converts JSON data to the binary layout of `dt`. `expected` is the element count the
/// shape calls for; it only sizes the buffer, and the caller compares it with the returned
/// count.
pub fn parse_data(
    text: &[u8],
    dt: DataType,
    max_depth: usize,
    expected: u64,
) -> Result<(Vec<u8>, u64)> {
    let (out, count, end) = parse_data_prefix(text, dt, max_depth, expected)?;
    check_end(text, end)?;
    Ok((out, count))
}

/// `parse_data` for an array at the start of `text`; also returns where the array ends.
pub fn parse_data_prefix(
    text: &[u8],
    dt: DataType,
    max_depth: usize,
    expected: u64,
) -> Result<(Vec<u8>, u64, usize)> {
    // Every element takes at least two bytes of text ("1,"), so a lying shape cannot make us
    // reserve more than the text justifies.
    let cap_elems = expected.min(text.len() as u64 / 2 + 1) as usize;
    let mut out = Vec::with_capacity(cap_elems * dt.fixed_size().unwrap_or(8));
    let (count, end) = match dt {
        DataType::Bool => walk(text, max_depth, |leaf, i| {
            match leaf {
                Leaf::True => out.push(1),
                Leaf::False => out.push(0),
                other => {
                    return Err(element_error(
                        i,
                        format!("is {}; BOOL needs true or false", other.describe()),
                    ))
                }
            }
            Ok(())
        })?,
        DataType::Uint8 => walk(text, max_depth, |l, i| put_int::<u8>(l, i, dt, &mut out))?,
        DataType::Uint16 => walk(text, max_depth, |l, i| put_int::<u16>(l, i, dt, &mut out))?,
        DataType::Uint32 => walk(text, max_depth, |l, i| put_int::<u32>(l, i, dt, &mut out))?,
        DataType::Uint64 => walk(text, max_depth, |l, i| put_int::<u64>(l, i, dt, &mut out))?,
        DataType::Int8 => walk(text, max_depth, |l, i| put_int::<i8>(l, i, dt, &mut out))?,
        DataType::Int16 => walk(text, max_depth, |l, i| put_int::<i16>(l, i, dt, &mut out))?,
        DataType::Int32 => walk(text, max_depth, |l, i| put_int::<i32>(l, i, dt, &mut out))?,
        DataType::Int64 => walk(text, max_depth, |l, i| put_int::<i64>(l, i, dt, &mut out))?,
        DataType::Fp32 => walk(text, max_depth, |l, i| put_f32(l, i, &mut out))?,
        DataType::Fp64 => walk(text, max_depth, |l, i| {
            let v = float_value(l, i, dt)?;
            out.extend_from_slice(&v.to_le_bytes());
            Ok(())
        })?,
        DataType::Fp16 => walk(text, max_depth, |l, i| {
            let v = float_value(l, i, dt)?;
            let h = f16::from_f64(v);
            if v.is_finite() && !h.is_finite() {
                return Err(out_of_range(v, i, dt));
            }
            out.extend_from_slice(&h.to_le_bytes());
            Ok(())
        })?,
        DataType::Bf16 => walk(text, max_depth, |l, i| {
            let v = float_value(l, i, dt)?;
            let h = bf16::from_f64(v);
            if v.is_finite() && !h.is_finite() {
                return Err(out_of_range(v, i, dt));
            }
            out.extend_from_slice(&h.to_le_bytes());
            Ok(())
        })?,
        DataType::Bytes => walk(text, max_depth, |l, i| {
            let Leaf::String(raw, escaped) = l else {
                return Err(element_error(
                    i,
                    format!("is {}; BYTES needs a string", l.describe()),
                ));
            };
            let unescaped;
            let bytes: &[u8] = if escaped {
                // Re-read the quoted token with serde_json, which knows every escape.
                let start = raw.as_ptr() as usize - text.as_ptr() as usize - 1;
                let quoted = &text[start..start + raw.len() + 2];
                unescaped = serde_json::from_slice::<String>(quoted).map_err(|_| {
                    element_error(i, "is a string with an invalid escape".to_string())
                })?;
                unescaped.as_bytes()
            } else {
                raw
            };
            let len = u32::try_from(bytes.len()).map_err(|_| {
                element_error(
                    i,
                    "is longer than the 4 GiB a BYTES element can hold".into(),
                )
            })?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(bytes);
            Ok(())
        })?,
    };
    Ok((out, count, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, dt: DataType) -> Result<(Vec<u8>, u64)> {
        parse_data(text.as_bytes(), dt, 32, 16)
    }

    fn err(text: &str, dt: DataType) -> String {
        parse(text, dt).unwrap_err().to_string()
    }

    #[test]
    fn flat_and_nested_give_the_same_bytes() {
        let flat = parse("[1, 2, 3, 4]", DataType::Int32).unwrap();
        let nested = parse("[[1,2],[3,4]]", DataType::Int32).unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat.1, 4);
        assert_eq!(
            flat.0,
            [1i32, 2, 3, 4]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn ragged_arrays_count_leaves() {
        assert_eq!(parse("[[1],[2,3],[]]", DataType::Int8).unwrap().1, 3);
        assert_eq!(parse("[]", DataType::Int8).unwrap().1, 0);
        assert_eq!(parse(" [ [ ] ] ", DataType::Int8).unwrap().1, 0);
    }

    #[test]
    fn integers_are_checked_exactly() {
        assert_eq!(
            err("[1, 256]", DataType::Uint8),
            "data element 1 (256) is out of range for UINT8"
        );
        assert_eq!(
            err("[-129]", DataType::Int8),
            "data element 0 (-129) is out of range for INT8"
        );
        assert_eq!(
            err("[-1]", DataType::Uint32),
            "data element 0 (-1) is negative, but UINT32 is unsigned"
        );
        assert_eq!(
            err("[1.0]", DataType::Int32),
            "data element 0 (1.0) is not an integer, as INT32 requires"
        );
        assert_eq!(
            err("[1e3]", DataType::Int64),
            "data element 0 (1e3) is not an integer, as INT64 requires"
        );
        assert_eq!(
            err("[18446744073709551616]", DataType::Uint64),
            "data element 0 (18446744073709551616) is out of range for UINT64"
        );
        assert_eq!(
            err("[true]", DataType::Int16),
            "data element 0 is true; INT16 needs a number"
        );
        assert_eq!(
            err("[\"1\"]", DataType::Uint16),
            "data element 0 is a string; UINT16 needs a number"
        );
        let (b, _) = parse("[18446744073709551615, 0]", DataType::Uint64).unwrap();
        assert_eq!(&b[..8], &u64::MAX.to_le_bytes());
        let (b, _) = parse("[-9223372036854775808]", DataType::Int64).unwrap();
        assert_eq!(&b[..], &i64::MIN.to_le_bytes());
    }

    #[test]
    fn bools_take_only_literals() {
        assert_eq!(parse("[true,false]", DataType::Bool).unwrap().0, vec![1, 0]);
        assert_eq!(
            err("[1]", DataType::Bool),
            "data element 0 is the number 1; BOOL needs true or false"
        );
        assert_eq!(
            err("[null]", DataType::Bool),
            "data element 0 is null; BOOL needs true or false"
        );
    }

    #[test]
    fn floats_and_half_precision() {
        let (b, _) = parse("[1.5, -2, 3e-1]", DataType::Fp32).unwrap();
        let v: Vec<f32> = b
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(v, vec![1.5, -2.0, 0.3]);
        let (b, _) = parse("[0.5, 65504]", DataType::Fp16).unwrap();
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 0.5);
        assert_eq!(f16::from_le_bytes([b[2], b[3]]).to_f32(), 65504.0);
        assert_eq!(
            err("[70000]", DataType::Fp16),
            "data element 0 (7e4) is out of range for FP16"
        );
        let (b, _) = parse("[1.0, -3.5]", DataType::Bf16).unwrap();
        assert_eq!(bf16::from_le_bytes([b[2], b[3]]).to_f32(), -3.5);
        assert_eq!(
            err("[1e39]", DataType::Fp32),
            "data element 0 (1e39) is out of range for FP32"
        );
        assert_eq!(
            err("[1e309]", DataType::Fp64),
            "data element 0 (1e309) is out of range for FP64"
        );
    }

    #[test]
    fn non_finite_floats_are_strings() {
        let (b, _) = parse(r#"["NaN", "Infinity", "-Infinity"]"#, DataType::Fp64).unwrap();
        let v: Vec<f64> = b
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(v[0].is_nan());
        assert_eq!(v[1], f64::INFINITY);
        assert_eq!(v[2], f64::NEG_INFINITY);
        assert_eq!(
            err(r#"["nan"]"#, DataType::Fp32),
            r#"data element 0 is a string; FP32 needs a number, or "NaN", "Infinity" or "-Infinity""#
        );
    }

    #[test]
    fn bytes_are_strings_with_escapes() {
        let (b, n) = parse(r#"["ab", "", "q\"\u00e9"]"#, DataType::Bytes).unwrap();
        assert_eq!(n, 3);
        let mut want = Vec::new();
        for s in ["ab", "", "q\"é"] {
            want.extend_from_slice(&(s.len() as u32).to_le_bytes());
            want.extend_from_slice(s.as_bytes());
        }
        assert_eq!(b, want);
        assert_eq!(
            err("[1]", DataType::Bytes),
            "data element 0 is the number 1; BYTES needs a string"
        );
    }

    #[test]
    fn structure_errors() {
        assert_eq!(err("5", DataType::Int32), "'data' must be a JSON array");
        assert_eq!(err("{}", DataType::Int32), "'data' must be a JSON array");
        assert_eq!(
            err("[1,]", DataType::Int32),
            "'data' is not valid JSON at byte 3"
        );
        assert_eq!(
            err("[1 2]", DataType::Int32),
            "'data' is not valid JSON at byte 3"
        );
        assert_eq!(
            err("[1", DataType::Int32),
            "'data' is not valid JSON at byte 2"
        );
        assert_eq!(
            err("[1]]", DataType::Int32),
            "'data' is not valid JSON at byte 3"
        );
        assert_eq!(
            err("[\"ab", DataType::Bytes),
            "'data' is not valid JSON at byte 4"
        );
        assert_eq!(
            err("[+1]", DataType::Int32),
            "data element 0 (+1) is not a valid JSON number"
        );
        assert_eq!(
            err("[-]", DataType::Fp32),
            "data element 0 (-) is not a valid JSON number"
        );
        let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
        assert_eq!(
            err(&deep, DataType::Int32),
            "'data' is nested deeper than 32 levels"
        );
    }

    #[test]
    fn counting_matches_parsing() {
        assert_eq!(count_elements(b"[[1,2],[3]]", 8).unwrap(), 3);
        assert_eq!(count_elements(br#"["a,b", "c]"]"#, 8).unwrap(), 2);
        assert_eq!(count_elements(b"[]", 8).unwrap(), 0);
    }

    #[test]
    fn a_lying_shape_cannot_reserve_memory() {
        let (b, n) = parse_data(b"[1]", DataType::Fp64, 8, u64::MAX).unwrap();
        assert_eq!(n, 1);
        assert!(b.capacity() < 64);
    }
}
