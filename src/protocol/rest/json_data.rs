//! Reading the `data` array of a JSON tensor straight into little-endian bytes.
//!
//! The request's JSON is parsed by serde with `data` borrowed as raw text; this module walks
//! that text once, without building a `serde_json::Value` per element. Nested and flat arrays
//! are both accepted and only leaves are counted, as Triton does.
//!
//! Non-finite floats: JSON has no literal for them, so tensorgate writes the strings `"NaN"`,
//! `"Infinity"` and `"-Infinity"` in float tensors (numpy and Python's `float()` parse them)
//! and reads them. It also reads the bare literals `NaN`, `Infinity` and `-Infinity` in a
//! `data` array, which are not JSON but are what Python's json module (and so tritonclient)
//! writes, and what Triton reads; in any other tensor type they are an error that says so.
//! In backends' responses, which serde reads first, `decode::quote_non_finite` turns the
//! literals into the strings.

use half::{bf16, f16};

use super::json_count;
use super::json_number;
use crate::protocol::datatype::DataType;
use crate::protocol::error::{ProtocolError, Result};

/// One leaf of the data array, as raw text.
enum Leaf<'a> {
    Number(&'a [u8]),
    /// The text between the quotes, and whether it contains escapes.
    String(&'a [u8], bool),
    /// A bare `NaN`, `Infinity` or `-Infinity`: its value and its text.
    NonFinite(f64, &'static str),
    True,
    False,
    Null,
}

impl Leaf<'_> {
    fn describe(&self) -> String {
        match self {
            Leaf::Number(t) => format!("the number {}", String::from_utf8_lossy(t)),
            // A bare NaN reaches here quoted when the request took serde's path.
            Leaf::String(t @ (b"NaN" | b"Infinity" | b"-Infinity"), false) => {
                format!("{}, a float", String::from_utf8_lossy(t))
            }
            Leaf::String(..) => "a string".to_string(),
            Leaf::NonFinite(_, text) => format!("the bare literal {text}"),
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
                check_string(&s[start..i], count)?;
                leaf(Leaf::String(&s[start..i], escaped), count)?;
                count += 1;
                pos = i + 1;
            }
            // Valid JSON, but no tensor element: named as such, not as a syntax error.
            b'{' => {
                return Err(element_error(
                    count,
                    "is a JSON object; 'data' holds numbers, strings or booleans, in arrays".into(),
                ))
            }
            b'N' | b'I' | b'-' if non_finite_literal(&s[pos..]).is_some() => {
                let (value, text) = non_finite_literal(&s[pos..]).expect("just matched");
                leaf(Leaf::NonFinite(value, text), count)?;
                count += 1;
                pos += text.len();
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

/// The bare non-finite literal at the start of `s`, if there is one.
fn non_finite_literal(s: &[u8]) -> Option<(f64, &'static str)> {
    [
        (f64::NAN, "NaN"),
        (f64::INFINITY, "Infinity"),
        (f64::NEG_INFINITY, "-Infinity"),
    ]
    .into_iter()
    .find(|(_, text)| s.starts_with(text.as_bytes()))
}

/// Only whitespace may follow the array.
fn check_end(s: &[u8], end: usize) -> Result<()> {
    match s[end..].iter().position(|b| !is_ws(*b)) {
        None => Ok(()),
        Some(off) => Err(syntax_error(end + off)),
    }
}

/// The length of the run of number characters at the start of `s` (the token `walk` sees).
#[inline]
fn number_len(s: &[u8]) -> usize {
    s.iter()
        .position(|b| !NUMBER_CHAR[*b as usize])
        .unwrap_or(s.len())
}

/// The fast path for the common case: a flat array of numbers, as clients write it
/// (`[1,2]`, `[1, 2]`). `number` reads the number at the start of its slice and returns its
/// length. Anything else (nesting, strings, a bad element) returns `None`, and the caller
/// starts over with `walk`, which decides and words any error.
#[inline(always)]
fn flat(s: &[u8], mut number: impl FnMut(&[u8]) -> Option<usize>) -> Option<(u64, usize)> {
    let skip_ws = |pos: &mut usize| {
        while s.get(*pos).is_some_and(|b| is_ws(*b)) {
            *pos += 1;
        }
    };
    let mut pos = 0;
    skip_ws(&mut pos);
    if s.get(pos) != Some(&b'[') {
        return None;
    }
    pos += 1;
    skip_ws(&mut pos);
    if s.get(pos) == Some(&b']') {
        return Some((0, pos + 1));
    }
    let mut count = 0u64;
    loop {
        let len = number(&s[pos..])?;
        if len == 0 {
            return None;
        }
        pos += len;
        count += 1;
        // Tested for the common bytes first: this loop runs once per element.
        let mut next = *s.get(pos)?;
        if is_ws(next) {
            skip_ws(&mut pos);
            next = *s.get(pos)?;
        }
        match next {
            b',' => {
                pos += 1;
                if s.get(pos).is_some_and(|b| is_ws(*b)) {
                    skip_ws(&mut pos);
                }
            }
            b']' => return Some((count, pos + 1)),
            _ => return None,
        }
    }
}

/// Counts the elements of a flat number array, or of any array: the vector path, then the
/// scalar fast path, then `walk` for everything else.
fn count_and_end(text: &[u8], max_depth: usize) -> Result<(u64, usize)> {
    if let Some(done) =
        json_count::count_flat_numbers(text).or_else(|| flat(text, |s| Some(number_len(s))))
    {
        return Ok(done);
    }
    walk(text, max_depth, |_, _| Ok(()))
}

/// Counts the elements of a JSON `data` array without converting them.
pub fn count_elements(text: &[u8], max_depth: usize) -> Result<u64> {
    let (count, end) = count_and_end(text, max_depth)?;
    check_end(text, end)?;
    Ok(count)
}

/// The length of the JSON array at the start of `text` (for the fast request path, which
/// meets `data` before it knows the datatype).
pub fn array_len(text: &[u8], max_depth: usize) -> Result<usize> {
    Ok(count_and_end(text, max_depth)?.1)
}

fn element_error(i: u64, what: String) -> ProtocolError {
    ProtocolError::invalid(format!("data element {i} {what}"))
}

fn tok_str(t: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(t)
}

/// A numeric element type: how the flat fast path reads it, and how `walk` does.
trait Element {
    /// Reads the number at the start of `s` into `out` and returns its length; `None` when
    /// it is not a valid element (or not one the fast path takes).
    fn read_number(s: &[u8], out: &mut Vec<u8>) -> Option<usize>;
    /// Converts one leaf met by `walk`, with the exact error for a bad one.
    fn put(leaf: Leaf, i: u64, out: &mut Vec<u8>) -> Result<()>;
}

/// Reads a whole array of `E`: the flat fast path first, `walk` for everything else.
fn elements<E: Element>(text: &[u8], max_depth: usize, out: &mut Vec<u8>) -> Result<(u64, usize)> {
    if let Some(done) = flat(text, |s| E::read_number(s, out)) {
        return Ok(done);
    }
    out.clear();
    walk(text, max_depth, |leaf, i| E::put(leaf, i, out))
}

/// The number token at the start of `s`, if it is a JSON number.
#[inline]
fn number_token(s: &[u8]) -> Option<&[u8]> {
    Some(&s[..number_len(s)]).filter(|t| is_json_number(t))
}

/// Whether `tok` follows JSON's number grammar, `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
/// lexical, which converts the token, also takes `01`, `.5`, `1.` and `+1`; serde_json does
/// not, and a body must not be valid or not depending on which decoder read it. Checked
/// where a leaf is converted: counting an array (`walk` with no conversion) checks only
/// its structure.
fn is_json_number(tok: &[u8]) -> bool {
    let digits = |i: &mut usize| {
        let start = *i;
        while tok.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > start
    };
    let mut i = usize::from(tok.first() == Some(&b'-'));
    match tok.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if tok.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
    }
    if let Some(b'e' | b'E') = tok.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = tok.get(i) {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
    }
    i == tok.len()
}

/// A JSON string's contents must be UTF-8 without raw control characters (the escapes
/// stand for those).
fn check_string(raw: &[u8], i: u64) -> Result<()> {
    if raw.iter().any(|b| *b < 0x20) {
        return Err(element_error(
            i,
            "is a string with a raw control character; JSON needs an escape such as \\n or \\u0009"
                .into(),
        ));
    }
    if std::str::from_utf8(raw).is_err() {
        return Err(element_error(i, "is a string that is not UTF-8".into()));
    }
    Ok(())
}

/// An integer in range for `T`. JSON has no leading `+`, though lexical accepts one.
#[inline]
fn int_of<T: lexical_core::FromLexical>(tok: &[u8]) -> Option<T> {
    match lexical_core::parse::<T>(tok) {
        Ok(v) if is_json_number(tok) => Some(v),
        _ => None,
    }
}

/// A plain decimal integer at the start of `s`, `-?(0|[1-9][0-9]*)` with nothing of a number
/// after it (no fraction, exponent, or digit after a leading zero), whose magnitude fits in
/// a u64: `(negative, magnitude, length)`. Validating and converting in one pass costs a
/// third of the token scan, the grammar check and lexical's conversion together; anything
/// else returns `None` and takes that general path.
#[inline]
fn plain_int(s: &[u8]) -> Option<(bool, u64, usize)> {
    let negative = s.first() == Some(&b'-');
    let mut i = usize::from(negative);
    let first = *s.get(i)?;
    if !first.is_ascii_digit() {
        return None;
    }
    let mut v = u64::from(first - b'0');
    i += 1;
    if first != b'0' {
        while let Some(&b) = s.get(i) {
            if !b.is_ascii_digit() {
                break;
            }
            v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            i += 1;
        }
    }
    if s.get(i).is_some_and(|b| NUMBER_CHAR[*b as usize]) {
        return None;
    }
    Some((negative, v, i))
}

macro_rules! int_element {
    ($($t:ty => $dt:ident, $signed:expr);*) => {$(
        impl Element for $t {
            #[inline]
            fn read_number(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
                if let Some((negative, magnitude, len)) = plain_int(s) {
                    let v = if negative {
                        // -(magnitude), when it fits (never for unsigned types: "-0" and
                        // the rest take the general path and its exact error).
                        0i128.checked_sub(i128::from(magnitude)).and_then(|n| <$t>::try_from(n).ok())
                            .filter(|_| $signed)
                    } else {
                        <$t>::try_from(magnitude).ok()
                    };
                    if let Some(v) = v {
                        out.extend_from_slice(&v.to_le_bytes());
                        return Some(len);
                    }
                }
                let tok = number_token(s)?;
                out.extend_from_slice(&int_of::<$t>(tok)?.to_le_bytes());
                Some(tok.len())
            }

            fn put(leaf: Leaf, i: u64, out: &mut Vec<u8>) -> Result<()> {
                let dt = DataType::$dt;
                let Leaf::Number(tok) = leaf else {
                    return Err(element_error(
                        i,
                        format!("is {}; {dt} needs a number", leaf.describe()),
                    ));
                };
                let v = int_of::<$t>(tok).ok_or_else(|| int_error(tok, i, dt, $signed))?;
                out.extend_from_slice(&v.to_le_bytes());
                Ok(())
            }
        }
    )*};
}
int_element!(
    u8 => Uint8, false; u16 => Uint16, false; u32 => Uint32, false; u64 => Uint64, false;
    i8 => Int8, true; i16 => Int16, true; i32 => Int32, true; i64 => Int64, true
);

#[cold]
fn int_error(tok: &[u8], i: u64, dt: DataType, signed: bool) -> ProtocolError {
    let t = tok_str(tok);
    let is_number = is_json_number(tok);
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

/// A finite float written as a JSON number.
#[inline]
fn finite_of<T: lexical_core::FromLexical + Into<f64> + Copy>(tok: &[u8]) -> Option<T> {
    match lexical_core::parse::<T>(tok) {
        Ok(v) if v.into().is_finite() && is_json_number(tok) => Some(v),
        _ => None,
    }
}

/// Reads a float element: a number, or one of the strings that stand for non-finite values.
#[inline]
fn float_value(leaf: Leaf, i: u64, dt: DataType) -> Result<f64> {
    match leaf {
        Leaf::Number(tok) if !is_json_number(tok) => Err(element_error(
            i,
            format!("({}) is not a valid JSON number", tok_str(tok)),
        )),
        Leaf::Number(tok) => match lexical_core::parse::<f64>(tok) {
            Ok(v) if v.is_finite() => Ok(v),
            Ok(_) => Err(element_error(
                i,
                format!("({}) is out of range for {dt}", tok_str(tok)),
            )),
            _ => Err(element_error(
                i,
                format!("({}) is not a valid JSON number", tok_str(tok)),
            )),
        },
        Leaf::NonFinite(v, _) => Ok(v),
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

impl Element for f32 {
    #[inline]
    fn read_number(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        let (v, len) = json_number::f32_prefix(s).or_else(|| {
            let tok = number_token(s)?;
            Some((finite_of::<f32>(tok)?, tok.len()))
        })?;
        out.extend_from_slice(&v.to_le_bytes());
        Some(len)
    }

    fn put(leaf: Leaf, i: u64, out: &mut Vec<u8>) -> Result<()> {
        // Parsing straight to f32 rounds once, from the decimal text.
        if let Leaf::Number(tok) = leaf {
            if let Some(v) = finite_of::<f32>(tok) {
                out.extend_from_slice(&v.to_le_bytes());
                return Ok(());
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
}

impl Element for f64 {
    #[inline]
    fn read_number(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        let tok = number_token(s)?;
        out.extend_from_slice(&finite_of::<f64>(tok)?.to_le_bytes());
        Some(tok.len())
    }

    fn put(leaf: Leaf, i: u64, out: &mut Vec<u8>) -> Result<()> {
        let v = float_value(leaf, i, DataType::Fp64)?;
        out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
}

macro_rules! half_element {
    ($($t:ty => $dt:ident);*) => {$(
        impl Element for $t {
            #[inline]
            fn read_number(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
                let tok = number_token(s)?;
                let h = <$t>::from_f64(finite_of::<f64>(tok)?);
                if !h.is_finite() {
                    return None;
                }
                out.extend_from_slice(&h.to_le_bytes());
                Some(tok.len())
            }

            fn put(leaf: Leaf, i: u64, out: &mut Vec<u8>) -> Result<()> {
                let v = float_value(leaf, i, DataType::$dt)?;
                let h = <$t>::from_f64(v);
                if v.is_finite() && !h.is_finite() {
                    return Err(out_of_range(v, i, DataType::$dt));
                }
                out.extend_from_slice(&h.to_le_bytes());
                Ok(())
            }
        }
    )*};
}
half_element!(f16 => Fp16; bf16 => Bf16);

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
    let o = &mut out;
    let (count, end) = match dt {
        DataType::Bool => walk(text, max_depth, |leaf, i| {
            match leaf {
                Leaf::True => o.push(1),
                Leaf::False => o.push(0),
                other => {
                    return Err(element_error(
                        i,
                        format!("is {}; BOOL needs true or false", other.describe()),
                    ))
                }
            }
            Ok(())
        })?,
        DataType::Uint8 => elements::<u8>(text, max_depth, o)?,
        DataType::Uint16 => elements::<u16>(text, max_depth, o)?,
        DataType::Uint32 => elements::<u32>(text, max_depth, o)?,
        DataType::Uint64 => elements::<u64>(text, max_depth, o)?,
        DataType::Int8 => elements::<i8>(text, max_depth, o)?,
        DataType::Int16 => elements::<i16>(text, max_depth, o)?,
        DataType::Int32 => elements::<i32>(text, max_depth, o)?,
        DataType::Int64 => elements::<i64>(text, max_depth, o)?,
        DataType::Fp16 => elements::<f16>(text, max_depth, o)?,
        DataType::Bf16 => elements::<bf16>(text, max_depth, o)?,
        DataType::Fp32 => elements::<f32>(text, max_depth, o)?,
        DataType::Fp64 => elements::<f64>(text, max_depth, o)?,
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
            o.extend_from_slice(&len.to_le_bytes());
            o.extend_from_slice(bytes);
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

    /// The bare literals Python writes (tritonclient with `binary_data=False`), flat and
    /// nested, among numbers and strings; in other types, an error that names them.
    #[test]
    fn bare_non_finite_literals_are_read_in_float_data() {
        let text = "[NaN, 1.5, [Infinity,-Infinity], \"NaN\" ,-2]";
        for dt in [
            DataType::Fp16,
            DataType::Bf16,
            DataType::Fp32,
            DataType::Fp64,
        ] {
            let (b, n) = parse(text, dt).unwrap_or_else(|e| panic!("{dt}: {e}"));
            assert_eq!(n, 6, "{dt}");
            let width = dt.fixed_size().unwrap();
            let v: Vec<f64> = b
                .chunks(width)
                .map(|c| match dt {
                    DataType::Fp16 => f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
                    DataType::Bf16 => bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
                    DataType::Fp32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
                    _ => f64::from_le_bytes(c.try_into().unwrap()),
                })
                .collect();
            assert!(v[0].is_nan() && v[4].is_nan(), "{dt} {v:?}");
            assert_eq!(
                [v[1], v[2], v[3], v[5]],
                [1.5, f64::INFINITY, f64::NEG_INFINITY, -2.0],
                "{dt}"
            );
        }
        assert_eq!(
            err("[1, NaN]", DataType::Int32),
            "data element 1 is the bare literal NaN; INT32 needs a number"
        );
        // Quoted: as a bare NaN arrives when the request took serde's path.
        assert_eq!(
            err(r#"[1, "NaN"]"#, DataType::Int32),
            "data element 1 is NaN, a float; INT32 needs a number"
        );
        assert_eq!(
            err("[-Infinity]", DataType::Bytes),
            "data element 0 is the bare literal -Infinity; BYTES needs a string"
        );
        assert_eq!(
            err("[Infinity]", DataType::Bool),
            "data element 0 is the bare literal Infinity; BOOL needs true or false"
        );
        // Only the exact words, followed by a separator.
        for bad in ["[nan]", "[NaNa]", "[Inf]", "[-Inf]", "[+Infinity]"] {
            assert!(parse(bad, DataType::Fp32).is_err(), "{bad}");
        }
        // Counted like any other element, for the request path that meets data first.
        assert_eq!(count_elements(text.as_bytes(), 8).unwrap(), 6);
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
    fn only_json_numbers_and_json_strings_are_elements() {
        // lexical alone would take each of these; serde_json takes none.
        for tok in [
            "01", "-01", ".5", "1.", "-", "1e", "1e+", "1.e5", "+1", "--1", "1.5.5", "1e5e5",
        ] {
            for dt in [
                DataType::Int32,
                DataType::Uint8,
                DataType::Fp32,
                DataType::Fp64,
                DataType::Fp16,
            ] {
                for text in [format!("[{tok}]"), format!("[[2], [{tok}]]")] {
                    let i = if text.starts_with("[[") { 1 } else { 0 };
                    assert_eq!(
                        err(&text, dt),
                        format!("data element {i} ({tok}) is not a valid JSON number"),
                        "{text} as {dt}"
                    );
                }
            }
        }
        for tok in ["0", "-0", "10", "0.5", "-1.25e-3", "1E+2", "2e0"] {
            assert!(parse(&format!("[{tok}]"), DataType::Fp64).is_ok(), "{tok}");
        }
        assert_eq!(
            parse("[0, 10, -7]", DataType::Int32).unwrap().0,
            [0i32, 10, -7]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        );
        assert_eq!(
            err("[\"a\", \"b\tc\"]", DataType::Bytes),
            "data element 1 is a string with a raw control character; JSON needs an escape such as \\n or \\u0009"
        );
        let not_utf8 = parse_data(b"[\"\xff\"]", DataType::Bytes, 32, 1).unwrap_err();
        assert_eq!(
            not_utf8.to_string(),
            "data element 0 is a string that is not UTF-8"
        );
    }

    #[test]
    fn structure_errors() {
        assert_eq!(err("5", DataType::Int32), "'data' must be a JSON array");
        assert_eq!(err("{}", DataType::Int32), "'data' must be a JSON array");
        assert_eq!(
            err("[1, [{}]]", DataType::Int32),
            "data element 1 is a JSON object; 'data' holds numbers, strings or booleans, in arrays"
        );
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

    /// The flat fast path is only an accelerator: for any text, it must give what `walk`
    /// alone gives, value for value and error for error.
    fn matches_walk<E: Element>(text: &str) {
        let mut fast = Vec::new();
        let fast = elements::<E>(text.as_bytes(), 8, &mut fast).map(|r| (fast, r));
        let mut slow = Vec::new();
        let slow =
            walk(text.as_bytes(), 8, |leaf, i| E::put(leaf, i, &mut slow)).map(|r| (slow, r));
        assert_eq!(fast, slow, "{text}");
        let walked = walk(text.as_bytes(), 8, |_, _| Ok(()));
        assert_eq!(count_and_end(text.as_bytes(), 8), walked, "{text}");
    }

    proptest::proptest! {
        #[test]
        fn flat_fast_path_matches_walk(
            // Mostly valid numbers and separators, so that long arrays reach the later
            // blocks of the vector path before a fault, if any.
            elems in proptest::collection::vec(
                proptest::prop_oneof![
                    30 => r"-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,12})?([eE][+-]?[0-9]{1,2})?",
                    1 => r#""NaN"|true|\[1\]|1e39|\+1|01|-|1\.|\.5|1-2|300|-129|65536"#,
                ],
                0..40,
            ),
            seps in proptest::collection::vec(
                proptest::prop_oneof![40 => "(,|, )", 1 => "(,\n  | ,|,,| |, ,)"],
                40,
            ),
            open in "( |\n)?\\[ ?",
            close in " ?\\] ?",
        ) {
            let mut text = open;
            for (i, e) in elems.iter().enumerate() {
                if i > 0 {
                    text.push_str(&seps[i]);
                }
                text.push_str(e);
            }
            text.push_str(&close);
            matches_walk::<u8>(&text);
            matches_walk::<u32>(&text);
            matches_walk::<u64>(&text);
            matches_walk::<i8>(&text);
            matches_walk::<i64>(&text);
            matches_walk::<f16>(&text);
            matches_walk::<bf16>(&text);
            matches_walk::<f32>(&text);
            matches_walk::<f64>(&text);
        }
    }

    #[test]
    fn plain_integers_are_read_in_one_pass() {
        assert_eq!(plain_int(b"123,"), Some((false, 123, 3)));
        assert_eq!(plain_int(b"-45]"), Some((true, 45, 3)));
        assert_eq!(plain_int(b"0 "), Some((false, 0, 1)));
        assert_eq!(plain_int(b"-0"), Some((true, 0, 2)));
        assert_eq!(
            plain_int(b"18446744073709551615"),
            Some((false, u64::MAX, 20))
        );
        // Left to the general path: overflow, fractions, exponents, leading zeros, signs.
        for text in [
            "18446744073709551616",
            "1.5",
            "1e3",
            "01",
            "+1",
            "-",
            "1-2",
            "-a",
            "",
        ] {
            assert_eq!(plain_int(text.as_bytes()), None, "{text}");
        }
        // Through the element readers, the same values and errors as before.
        assert_eq!(
            parse("[-128, 127]", DataType::Int8).unwrap().0,
            [0x80, 0x7f]
        );
        assert_eq!(
            err("[-0]", DataType::Uint8),
            err("[-1]", DataType::Uint8).replace("(-1)", "(-0)")
        );
        assert_eq!(
            parse("[-0]", DataType::Int16).unwrap().0,
            0i16.to_le_bytes().to_vec()
        );
        assert_eq!(
            parse("[-9223372036854775808]", DataType::Int64).unwrap().0,
            i64::MIN.to_le_bytes().to_vec()
        );
    }

    #[test]
    fn a_lying_shape_cannot_reserve_memory() {
        let (b, n) = parse_data(b"[1]", DataType::Fp64, 8, u64::MAX).unwrap();
        assert_eq!(n, 1);
        assert!(b.capacity() < 64);
    }
}
