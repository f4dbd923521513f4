//! Decoding request and response bodies: pure JSON, JSON followed by binary chunks
//! (`Inference-Header-Content-Length`), mixed, and raw binary requests.

use std::collections::HashSet;

use bytes::Bytes;
use serde::Deserialize;

use super::json_data;
use super::wire::{WireData, WireRequest, WireShape, WireTensor};
use crate::protocol::datatype::DataType;
use crate::protocol::error::{ProtocolError, Result, Role};
use crate::protocol::limits::Limits;
use crate::protocol::message::{InferRequest, InferResponse, RequestedOutput};
use crate::protocol::params::{OutputOptions, Parameters, RequestOptions};
use crate::protocol::tensor::{check_bytes_framing, checked_element_count, format_shape, Tensor};
use crate::protocol::tolerance::{Tolerance, Tolerated};

pub const HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

/// A request body split by its `Inference-Header-Content-Length`.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestBody {
    /// JSON, possibly followed by binary tensor data.
    Message(InferRequest),
    /// `Inference-Header-Content-Length: 0`: the body is the data of the model's only input.
    /// Expanding it needs the model's metadata (`raw::expand_raw`).
    Raw(Bytes),
}

/// Why a header length (as sent) cannot be: the body is shorter.
pub fn header_length_past_body(sent: &str, body_len: u64) -> String {
    format!("Inference-Header-Content-Length is {sent} but the body has only {body_len} bytes")
}

/// Splits `body` into its JSON header and binary part. `header_length` is the raw value of
/// the `Inference-Header-Content-Length` header, if present.
pub fn split_body(body: &Bytes, header_length: Option<&[u8]>) -> Result<(Bytes, Bytes)> {
    let Some(raw) = header_length else {
        return Ok((body.clone(), Bytes::new()));
    };
    let n = parse_header_length(raw)?;
    if n > body.len() {
        return Err(ProtocolError::invalid(header_length_past_body(
            &n.to_string(),
            body.len() as u64,
        )));
    }
    Ok((body.slice(..n), body.slice(n..)))
}

/// The value of an `Inference-Header-Content-Length` header: the one place it is parsed.
pub fn parse_header_length(raw: &[u8]) -> Result<usize> {
    let text = std::str::from_utf8(raw).unwrap_or("").trim();
    // Digits past usize::MAX are a length too, only too large: the limit's 413 says so.
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| text.parse().unwrap_or(usize::MAX))
        .ok_or_else(|| {
            ProtocolError::invalid(format!(
                "Inference-Header-Content-Length must be a non-negative integer, got '{}'",
                String::from_utf8_lossy(raw)
            ))
        })
}

#[derive(Deserialize)]
struct WireResponse<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model_name: String,
    #[serde(default)]
    model_version: Option<String>,
    #[serde(default)]
    parameters: Parameters,
    #[serde(borrow)]
    outputs: Vec<WireTensor<'a>>,
}

/// Hands out the binary chunks that follow the JSON header, in order, as slices of the body.
struct BinaryCursor {
    rest: Bytes,
}

impl BinaryCursor {
    fn take(&mut self, n: u64) -> Result<Bytes> {
        if n > self.rest.len() as u64 {
            return Err(ProtocolError::invalid(format!(
                "binary_data_size is {n} but only {} bytes of binary data remain ({} missing)",
                self.rest.len(),
                n - self.rest.len() as u64
            )));
        }
        Ok(self.rest.split_to(n as usize))
    }

    fn finish(self, role: Role) -> Result<()> {
        if self.rest.is_empty() {
            return Ok(());
        }
        let what = match role {
            Role::Input => "request body has",
            Role::Output => "response body has",
        };
        Err(ProtocolError::invalid(format!(
            "{what} {} bytes after the last binary {role}",
            self.rest.len()
        )))
    }
}

fn check_json_size(json: &[u8], what: &str, limits: &Limits) -> Result<()> {
    if json.len() > limits.max_json_bytes {
        return Err(ProtocolError::too_large(format!(
            "the JSON {what} is {} bytes; the limit is {} (limits.max_json_bytes)",
            json.len(),
            limits.max_json_bytes
        )));
    }
    Ok(())
}

fn parse_json<'a, T: Deserialize<'a>>(json: &'a [u8], what: &str, limits: &Limits) -> Result<T> {
    check_json_size(json, what, limits)?;
    let mut de = serde_json::Deserializer::from_slice(json);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| describe_json_error(json, what, e))?;
    de.end()
        .map_err(|e| ProtocolError::invalid(format!("invalid JSON {what}: {e}")))?;
    Ok(value)
}

/// Turns a serde error into a message that names the tensor and field where possible,
/// e.g. `input 'INPUT0': field 'shape[1]': invalid type: ...`.
#[cold]
fn describe_json_error(
    json: &[u8],
    what: &str,
    err: serde_path_to_error::Error<serde_json::Error>,
) -> ProtocolError {
    let inner = err.inner().to_string();
    let hint = non_finite_hint(json, err.inner());
    let path = shorten_path(err.path().to_string());
    // Find "inputs[3]" or "outputs[0]" at the head of the path and name that tensor.
    let mut segments = path.splitn(2, '.');
    let head = segments.next().unwrap_or("");
    let field = segments.next();
    if let Some((list, idx)) = head.split_once('[') {
        let idx: Option<usize> = idx.trim_end_matches(']').parse().ok();
        let role = match list {
            "inputs" => Some("input"),
            "outputs" => Some("output"),
            _ => None,
        };
        if let (Some(role), Some(idx)) = (role, idx) {
            // Read only as far as the name (its data skipped, nothing built): parsing the
            // whole document into a `Value` to name the tensor cost 1 GB for a 66 MB body.
            // A document that does not parse may still name the tensor before its fault.
            let name = super::fast_request::tensor_name(json, list, idx);
            let who = match name {
                Some(n) => format!("{role} '{n}'"),
                None => format!("{role} {idx}"),
            };
            // `?`: a syntax error stopped serde before it knew the field.
            return ProtocolError::invalid(match field.filter(|f| *f != "?") {
                Some(f) => format!("{who}: field '{f}': {inner}{hint}"),
                None => format!("{who}: {inner}{hint}"),
            });
        }
    }
    // serde_path_to_error says `?` where a syntax error stops it before any field.
    if path == "." || path == "?" || path.is_empty() {
        ProtocolError::invalid(format!("invalid JSON {what}: {inner}{hint}"))
    } else {
        ProtocolError::invalid(format!(
            "invalid JSON {what}: field '{path}': {inner}{hint}"
        ))
    }
}

/// A field path as an error message shows it: a value nested past the parser's depth limit
/// has a path of a hundred `[0]`s, which would make the message mostly path.
fn shorten_path(path: String) -> String {
    const KEEP: usize = 60;
    if path.len() <= KEEP + 20 {
        return path;
    }
    let mut cut = KEEP;
    while !path.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} more characters)", &path[..cut], path.len() - cut)
}

/// What a well-formed JSON document that is not an object is, for the error that says so.
#[cold]
fn not_an_object(json: &[u8]) -> Option<&'static str> {
    let first = json.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first == b'{' {
        return None;
    }
    Some(
        match serde_json::from_slice::<serde_json::Value>(json).ok()? {
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::Bool(_) => "a bool",
            serde_json::Value::Null => "null",
            serde_json::Value::Object(_) => return None,
        },
    )
}

/// Python's json.dumps writes bare NaN and Infinity, which are not JSON; say what to send.
fn non_finite_hint(json: &[u8], err: &serde_json::Error) -> &'static str {
    if !err.is_syntax() {
        return "";
    }
    let (line, col) = (err.line(), err.column());
    let Some(text) = json.split(|b| *b == b'\n').nth(line.saturating_sub(1)) else {
        return "";
    };
    let at = &text[col.saturating_sub(1).min(text.len())..];
    if [&b"NaN"[..], b"Infinity", b"-Infinity"]
        .iter()
        .any(|w| at.starts_with(w))
    {
        " (write non-finite floats as the strings \"NaN\", \"Infinity\" and \"-Infinity\")"
    } else {
        ""
    }
}

/// Up to this many names are compared pairwise: a request's usual two or three tensors cost
/// a few comparisons that way, against a hasher's setup and a table's allocation.
const FEW_NAMES: usize = 8;

fn check_unique<'a>(names: impl Iterator<Item = &'a str> + Clone, role: Role) -> Result<()> {
    let duplicate = |n: &str| ProtocolError::invalid(format!("duplicate {role} name '{n}'"));
    if names.clone().nth(FEW_NAMES).is_none() {
        for (i, n) in names.clone().enumerate() {
            if names.clone().take(i).any(|earlier| earlier == n) {
                return Err(duplicate(n));
            }
        }
        return Ok(());
    }
    let mut seen = HashSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(duplicate(n));
        }
    }
    Ok(())
}

fn parse_shape(shape: WireShape) -> Result<Vec<u64>> {
    let raw = match shape {
        WireShape::Dims(dims) => return Ok(dims),
        WireShape::Numbers(raw) => raw,
    };
    raw.iter()
        .map(|n| {
            if let Some(u) = n.as_u64() {
                Ok(u)
            } else if n.as_i64().is_some() {
                Err(ProtocolError::invalid(format!(
                    "shape {} has a negative dimension {n}",
                    format_shape(&raw)
                )))
            } else {
                Err(ProtocolError::invalid(format!(
                    "shape {} has a dimension {n} that is not an unsigned 64-bit integer",
                    format_shape(&raw)
                )))
            }
        })
        .collect()
}

/// The error for a binary size that does not match the shape of a fixed-size type.
fn size_mismatch(size: u64, dt: DataType, shape: &[u64], need: Option<u64>) -> ProtocolError {
    ProtocolError::invalid(format!(
        "binary_data_size is {size} but shape {} of {dt} needs {} bytes",
        format_shape(shape),
        need.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string())
    ))
}

/// Checks binary tensor data against the datatype and element count: the byte size of
/// fixed-size types, the 0/1 values of BOOL, and the framing of BYTES.
pub(crate) fn check_binary(dt: DataType, shape: &[u64], count: u64, data: &[u8]) -> Result<()> {
    match dt.fixed_size() {
        Some(size) => {
            let need = count.checked_mul(size as u64);
            if need != Some(data.len() as u64) {
                return Err(size_mismatch(data.len() as u64, dt, shape, need));
            }
            if dt == DataType::Bool {
                crate::protocol::tensor::check_bool_bytes(data)?;
            }
            Ok(())
        }
        None => check_bytes_framing(data, count),
    }
}

/// `tolerated` is `Some` for a backend's response only: then `null` in a float tensor's data
/// reads as NaN, and is noted there.
/// A tensor's datatype, shape, parameters and data; the caller adds the name, which it keeps
/// to word any error.
fn build_tensor(
    w: WireTensor<'_>,
    cursor: &mut BinaryCursor,
    limits: &Limits,
    tolerated: Option<&mut Tolerated>,
) -> Result<(DataType, Vec<u64>, Parameters, Bytes)> {
    let datatype = DataType::parse(&w.datatype)
        .ok_or_else(|| ProtocolError::invalid(format!("unknown datatype '{}'", w.datatype)))?;
    let shape = parse_shape(w.shape)?;
    let count = checked_element_count(&shape, limits.max_tensor_elements)?;
    let mut parameters = w.parameters;
    if tolerated.is_none() {
        parameters.check_scalar()?;
        parameters.refuse_shared_memory()?;
    }
    let binary_size = parameters.get_uint("binary_data_size")?;
    parameters.remove("binary_data_size");
    let data = match (w.data, binary_size) {
        (Some(_), Some(_)) => {
            return Err(ProtocolError::invalid(
                "has both 'data' and 'parameters.binary_data_size'",
            ))
        }
        (None, None) => {
            return Err(ProtocolError::invalid(
                "has neither 'data' nor 'parameters.binary_data_size'",
            ))
        }
        (Some(data), None) => {
            let (bytes, n) = match data {
                WireData::Text(text) => {
                    match json_data::parse_data(text, datatype, limits.max_json_depth, count) {
                        Ok(parsed) => parsed,
                        // Only a float tensor of a backend's answer, and only after the strict
                        // read failed, so a well-formed body costs nothing.
                        Err(e) => match (tolerated, datatype.is_float()) {
                            (Some(tolerated), true) => {
                                let quoted = quote_nulls(text).ok_or(e)?;
                                let parsed = json_data::parse_data(
                                    &quoted,
                                    datatype,
                                    limits.max_json_depth,
                                    count,
                                )?;
                                tolerated.insert(Tolerance::NullFloat);
                                parsed
                            }
                            _ => return Err(e),
                        },
                    }
                }
                WireData::Parsed(bytes, n) => (bytes, n),
            };
            if n != count {
                return Err(ProtocolError::invalid(format!(
                    "shape {} needs {count} elements, data has {n}",
                    format_shape(&shape)
                )));
            }
            Bytes::from(bytes)
        }
        (None, Some(size)) => {
            // A size that contradicts the shape is reported before the body is consulted.
            if let Some(elem) = datatype.fixed_size() {
                let need = count.checked_mul(elem as u64);
                if need != Some(size) {
                    return Err(size_mismatch(size, datatype, &shape, need));
                }
            }
            let chunk = cursor.take(size)?;
            check_binary(datatype, &shape, count, &chunk)?;
            chunk
        }
    };
    Ok((datatype, shape, parameters, data))
}

fn build_tensors(
    wire: Vec<WireTensor<'_>>,
    binary: Bytes,
    role: Role,
    limits: &Limits,
    mut tolerated: Option<&mut Tolerated>,
) -> Result<Vec<Tensor>> {
    check_unique(wire.iter().map(|t| t.name.as_str()), role)?;
    let mut cursor = BinaryCursor { rest: binary };
    let mut out = Vec::with_capacity(wire.len());
    for mut w in wire {
        let name = std::mem::take(&mut w.name);
        match build_tensor(w, &mut cursor, limits, tolerated.as_deref_mut()) {
            Ok((datatype, shape, parameters, data)) => out.push(Tensor {
                name,
                datatype,
                shape,
                parameters,
                data,
            }),
            Err(e) => return Err(e.in_tensor(role, &name)),
        }
    }
    cursor.finish(role)?;
    Ok(out)
}

/// Decodes an inference request body.
pub fn decode_request(
    body: &Bytes,
    header_length: Option<&[u8]>,
    limits: &Limits,
) -> Result<RequestBody> {
    let (json, binary) = split_body(body, header_length)?;
    if header_length.is_some() && json.is_empty() {
        return Ok(RequestBody::Raw(binary));
    }
    // Well-formed requests take the single-pass path; anything else, including every
    // error, goes through serde, which also words the error.
    check_json_size(&json, "request", limits)?;
    let lenient;
    let wire: WireRequest = match super::fast_request::parse_request(&json, limits) {
        Some(w) => w,
        // The bare literals the fast path reads in float data stop serde: read as the
        // strings that stand for them, so that a document does not turn valid or not with
        // the decoder that reads it (such a literal in BYTES data then reads as its text).
        None => match quote_non_finite(&json) {
            Some(quoted) => {
                lenient = quoted;
                let grown = Limits {
                    max_json_bytes: limits.max_json_bytes + (lenient.len() - json.len()),
                    ..limits.clone()
                };
                parse_json(&lenient, "request", &grown)
            }
            None => parse_json(&json, "request", limits),
        }
        .map_err(|e| {
            if let Some(kind) = not_an_object(&json) {
                return ProtocolError::invalid(format!(
                    "the request must be a JSON object, not {kind}"
                ));
            }
            if header_length.is_none() && e.message().contains("trailing characters") {
                return ProtocolError::invalid(format!(
                    "{}; a body with binary tensors after its JSON needs the Inference-Header-Content-Length header (the JSON part's length)",
                    e.message()
                ));
            }
            // The JSON cut short where the header says it ends: the header is the likelier
            // mistake, and the parser's words do not name it.
            // (With nothing after the JSON, the JSON itself is what was cut short.)
            if header_length.is_some()
                && !binary.is_empty()
                && e.message().contains("EOF while parsing")
            {
                return ProtocolError::invalid(format!(
                    "{}; the JSON part ends at byte {} (Inference-Header-Content-Length): is the header the JSON part's length?",
                    e.message(),
                    json.len()
                ));
            }
            e
        })?,
    };
    request_from_wire(wire, binary, limits)
}

fn request_from_wire(wire: WireRequest<'_>, binary: Bytes, limits: &Limits) -> Result<RequestBody> {
    wire.parameters.check_scalar()?;
    let options = RequestOptions::from_parameters(&wire.parameters)?;
    let outputs = match wire.outputs {
        // An empty list asks for nothing in particular: every output, as Triton reads it and
        // as gRPC's empty repeated field says.
        None => None,
        Some(list) if list.is_empty() => None,
        Some(list) => {
            check_unique(list.iter().map(|o| o.name.as_str()), Role::Output)?;
            let mut out = Vec::with_capacity(list.len());
            for o in list {
                let options = o
                    .parameters
                    .check_scalar()
                    .and_then(|()| OutputOptions::from_parameters(&o.parameters))
                    .map_err(|e| e.in_tensor(Role::Output, &o.name))?;
                out.push(RequestedOutput {
                    name: o.name,
                    parameters: o.parameters,
                    options,
                });
            }
            Some(out)
        }
    };
    let inputs = build_tensors(wire.inputs, binary, Role::Input, limits, None)?;
    Ok(RequestBody::Message(InferRequest {
        id: wire.id,
        parameters: wire.parameters,
        options,
        inputs,
        outputs,
    }))
}

/// The serde path alone, for checking the fast path against it.
#[cfg(test)]
pub(crate) fn decode_request_serde_only(body: &Bytes, limits: &Limits) -> Result<RequestBody> {
    let wire: WireRequest = parse_json(body, "request", limits)?;
    request_from_wire(wire, Bytes::new(), limits)
}

/// Triton writes non-finite floats as the bare literals `NaN`, `Infinity` and `-Infinity`,
/// which are not JSON, and serde (which checks the whole body, `data` included) refuses them.
/// This rewrites those literals inside `data` arrays as the strings `json_data` reads for
/// float tensors (`"NaN"`, ...); literals anywhere else stay, and stay errors. `None` when
/// there is nothing to rewrite. Only responses get this leniency, and only after the strict
/// parse failed, so a well-formed body costs nothing; requests keep refusing the literals.
fn quote_non_finite(json: &[u8]) -> Option<Vec<u8>> {
    const LITERALS: [&[u8]; 3] = [b"NaN", b"Infinity", b"-Infinity"];
    let mut out = Vec::with_capacity(json.len() + 64);
    let mut changed = false;
    // Bracket depth inside a `data` array (0: outside), and what came just before.
    let mut data_depth = 0usize;
    let mut key_is_data = false;
    let mut after_data_colon = false;
    let mut i = 0;
    while i < json.len() {
        let b = json[i];
        if b == b'"' {
            let end = string_end(json, i + 1);
            key_is_data = data_depth == 0 && &json[i + 1..end.min(json.len())] == b"data";
            after_data_colon = false;
            let stop = (end + 1).min(json.len());
            out.extend_from_slice(&json[i..stop]);
            i = stop;
            continue;
        }
        if data_depth > 0 {
            if let Some(lit) = LITERALS.iter().find(|l| json[i..].starts_with(l)) {
                out.push(b'"');
                out.extend_from_slice(lit);
                out.push(b'"');
                i += lit.len();
                changed = true;
                continue;
            }
        }
        match b {
            b'[' if data_depth > 0 => data_depth += 1,
            b'[' if after_data_colon => data_depth = 1,
            b']' if data_depth > 0 => data_depth -= 1,
            _ => {}
        }
        // The key `data`, its colon, then the array: anything else in between breaks the chain.
        if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            after_data_colon = b == b':' && key_is_data && data_depth == 0;
            key_is_data = false;
        }
        out.push(b);
        i += 1;
    }
    changed.then_some(out)
}

/// KServe writes a NaN output element as `null`. This rewrites every `null` of one float
/// tensor's `data` array (`text` is the array alone) as the string `"NaN"` that `json_data`
/// reads; `None` when there is none, so the strict error stands.
fn quote_nulls(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() + 16);
    let mut changed = false;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'"' => {
                let stop = (string_end(text, i + 1) + 1).min(text.len());
                out.extend_from_slice(&text[i..stop]);
                i = stop;
            }
            b'n' if text[i..].starts_with(b"null") => {
                out.extend_from_slice(b"\"NaN\"");
                i += 4;
                changed = true;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

/// The position of the closing quote of the string whose text starts at `from` (or the end
/// of `json` when it has none).
fn string_end(json: &[u8], from: usize) -> usize {
    let mut i = from;
    while let Some(off) = memchr::memchr2(b'"', b'\\', &json[i.min(json.len())..]) {
        if json[i + off] == b'"' {
            return i + off;
        }
        i += off + 2;
    }
    json.len()
}

/// Decodes an inference response body, as a backend sends it (see
/// `decode_backend_response` for what is forgiven).
pub fn decode_response(
    body: &Bytes,
    header_length: Option<&[u8]>,
    limits: &Limits,
) -> Result<InferResponse> {
    decode_backend_response(body, header_length, limits).map(|(response, _)| response)
}

/// Decodes a backend's inference response, forgiving what real servers write that the
/// protocol does not allow (`tolerance`): bare non-finite literals and `null` in float data.
/// Returns what it forgave, for the metrics.
pub fn decode_backend_response(
    body: &Bytes,
    header_length: Option<&[u8]>,
    limits: &Limits,
) -> Result<(InferResponse, Tolerated)> {
    let (json, binary) = split_body(body, header_length)?;
    let mut tolerated = Tolerated::default();
    let lenient;
    let wire: WireResponse = match parse_json(&json, "response", limits) {
        Ok(wire) => wire,
        // Only a body that is not JSON is worth a second look, never one that is too large.
        Err(e @ ProtocolError::Invalid(_)) => {
            lenient = quote_non_finite(&json).ok_or(e)?;
            tolerated.insert(Tolerance::NonFiniteLiteral);
            let grown = Limits {
                max_json_bytes: limits.max_json_bytes + (lenient.len() - json.len()),
                ..limits.clone()
            };
            parse_json(&lenient, "response", &grown)?
        }
        Err(e) => return Err(e),
    };
    let outputs = build_tensors(
        wire.outputs,
        binary,
        Role::Output,
        limits,
        Some(&mut tolerated),
    )?;
    let response = InferResponse {
        id: wire.id,
        model_name: wire.model_name,
        model_version: wire.model_version,
        parameters: wire.parameters,
        outputs,
    };
    Ok((response, tolerated))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        decode_request(
            &Bytes::copy_from_slice(json.as_bytes()),
            None,
            &Limits::default(),
        )
        .unwrap_err()
        .to_string()
    }

    fn err_binary(json: &str, tail: &[u8]) -> String {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(tail);
        let hl = json.len().to_string();
        decode_request(&Bytes::from(body), Some(hl.as_bytes()), &Limits::default())
            .unwrap_err()
            .to_string()
    }

    fn input(fields: &str) -> String {
        format!(r#"{{"inputs":[{{"name":"X",{fields}}}]}}"#)
    }

    /// A shape is read up to the rank limit and no further, in either decoder.
    #[test]
    fn a_shape_past_the_rank_limit_is_refused_where_it_is() {
        let ones = |n: usize| vec!["1"; n].join(",");
        let body = |n| {
            input(&format!(
                r#""datatype":"INT32","shape":[{}],"data":[1]"#,
                ones(n)
            ))
        };
        let ok = Bytes::from(body(64));
        assert!(decode_request(&ok, None, &Limits::default()).is_ok());
        assert_eq!(
            err(&body(65)),
            "input 'X': field 'shape': more than 64 dimensions (the most a tensor may have) at line 1 column 181"
        );
        // Not plain dimensions: serde's path from the start.
        let spaced = input(&format!(
            r#""datatype":"INT32","shape":[ {} ],"data":[1]"#,
            ones(100)
        ));
        assert!(err(&spaced).contains("more than 64 dimensions (the most a tensor may have)"));
    }

    /// A parameter nested past the depth limit: the message names where, briefly.
    #[test]
    fn a_deep_path_is_shortened() {
        let deep = format!(
            r#"{{"inputs":[],"parameters":{{"p":{}1{}}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let e = err(&deep);
        assert!(e.len() < 200, "{e}");
        assert!(
            e.starts_with("invalid JSON request: field 'parameters.p[0][0][0]"),
            "{e}"
        );
        assert!(
            e.contains("... (327 more characters)': recursion limit exceeded"),
            "{e}"
        );
    }

    /// Shared memory is refused by name on inputs and requested outputs, never ignored.
    #[test]
    fn shared_memory_is_refused() {
        let why = "shared memory is not supported (the gateway forwards tensors over the network); send the tensor's data in the request, and take outputs in the response";
        assert_eq!(
            err(&input(
                r#""datatype":"INT8","shape":[1],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":1}"#
            )),
            format!("input 'X': parameter 'shared_memory_region': {why}")
        );
        assert_eq!(
            err(
                r#"{"inputs":[],"outputs":[{"name":"O","parameters":{"shared_memory_byte_size":4}}]}"#
            ),
            format!("output 'O': parameter 'shared_memory_byte_size': {why}")
        );
    }

    /// Errors that say what is wrong with the body as a whole.
    #[test]
    fn a_body_that_is_not_a_request_says_why() {
        assert_eq!(
            err("[1,2]"),
            "the request must be a JSON object, not an array"
        );
        assert_eq!(err(" 7"), "the request must be a JSON object, not a number");
        let truncated = err(r#"{"inputs":[{"name":"INPUT0","#);
        assert!(
            truncated.starts_with("input 'INPUT0': EOF while parsing a value"),
            "{truncated}"
        );
        let binary_without_header = err(&format!(
            "{}\u{1}\u{2}",
            input(r#""datatype":"INT8","shape":[2],"parameters":{"binary_data_size":2}"#)
        ));
        assert!(
            binary_without_header.ends_with("; a body with binary tensors after its JSON needs the Inference-Header-Content-Length header (the JSON part's length)"),
            "{binary_without_header}"
        );
        // A header length that cuts the JSON short is named as the likely cause.
        let body = Bytes::from(input(r#""datatype":"INT8","shape":[2],"data":[1,2]"#));
        let short = decode_request(&body, Some(b"20"), &Limits::default())
            .unwrap_err()
            .message()
            .to_string();
        assert!(
            short.ends_with("; the JSON part ends at byte 20 (Inference-Header-Content-Length): is the header the JSON part's length?"),
            "{short}"
        );
        assert!(short.contains("EOF while parsing"), "{short}");
        // With nothing after it, the JSON itself was cut short: no word of the header.
        let cut = Bytes::from_static(br#"{"inputs":["#);
        let alone = decode_request(&cut, Some(b"11"), &Limits::default())
            .unwrap_err()
            .message()
            .to_string();
        assert!(alone.contains("EOF while parsing"), "{alone}");
        assert!(
            !alone.contains("Inference-Header-Content-Length"),
            "{alone}"
        );
    }

    /// A client's parameter is a string, a number or a bool, wherever it is.
    #[test]
    fn parameters_of_other_types_are_refused() {
        let tensor = r#"{"name":"X","shape":[1],"datatype":"INT32","data":[1]"#;
        assert_eq!(
            err(&format!(
                r#"{{"parameters":{{"x":[1,2]}},"inputs":[{tensor}}}]}}"#
            )),
            "parameter 'x' must be a string, a number or a bool, not an array"
        );
        assert_eq!(
            err(&format!(
                r#"{{"inputs":[{tensor},"parameters":{{"q":{{"a":1}}}}}}]}}"#
            )),
            "input 'X': parameter 'q' must be a string, a number or a bool, not an object"
        );
        assert_eq!(
            err(&format!(
                r#"{{"inputs":[{tensor}}}],"outputs":[{{"name":"Y","parameters":{{"n":null}}}}]}}"#
            )),
            "output 'Y': parameter 'n' must be a string, a number or a bool, not null"
        );
    }

    #[test]
    fn an_empty_outputs_list_asks_for_every_output() {
        let decoded = |outputs: &str| {
            let json = format!(
                r#"{{"inputs":[{{"name":"X","shape":[1],"datatype":"INT32","data":[1]}}]{outputs}}}"#
            );
            match decode_request(&Bytes::from(json), None, &Limits::default()).unwrap() {
                RequestBody::Message(r) => r.outputs.map(|o| o.len()),
                RequestBody::Raw(_) => panic!("not raw"),
            }
        };
        assert_eq!(decoded(r#","outputs":[]"#), None);
        assert_eq!(decoded(""), None);
        assert_eq!(decoded(r#","outputs":[{"name":"Y"}]"#), Some(1));
    }

    #[test]
    fn shapes_and_datatypes() {
        assert_eq!(
            err(&input(r#""datatype":"FP8","shape":[1],"data":[1]"#)),
            "input 'X': unknown datatype 'FP8'"
        );
        assert_eq!(
            err(&input(r#""datatype":"FP32","shape":[2,-1],"data":[1]"#)),
            "input 'X': shape [2,-1] has a negative dimension -1"
        );
        assert_eq!(
            err(&input(r#""datatype":"FP32","shape":[1e30],"data":[1]"#)),
            "input 'X': shape [1e+30] has a dimension 1e+30 that is not an unsigned 64-bit integer"
        );
        assert_eq!(
            err(&input(
                r#""datatype":"FP32","shape":[4294967296,4294967296],"data":[1]"#
            )),
            "input 'X': shape [4294967296,4294967296] has more elements than fit in 64 bits"
        );
        assert_eq!(
            err(&input(r#""datatype":"INT32","shape":[2,2],"data":[1,2,3]"#)),
            "input 'X': shape [2,2] needs 4 elements, data has 3"
        );
        let too_many = decode_request(
            &Bytes::from(input(r#""datatype":"INT8","shape":[10,11],"data":[]"#)),
            None,
            &Limits {
                max_tensor_elements: 100,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            too_many,
            ProtocolError::too_large(
                "input 'X': shape [10,11] has 110 elements; the limit is 100 per tensor"
            )
        );
    }

    #[test]
    fn data_and_binary_data_size() {
        assert_eq!(
            err(&input(
                r#""datatype":"INT8","shape":[1],"data":[1],"parameters":{"binary_data_size":1}"#
            )),
            "input 'X': has both 'data' and 'parameters.binary_data_size'"
        );
        assert_eq!(
            err(&input(r#""datatype":"INT8","shape":[1]"#)),
            "input 'X': has neither 'data' nor 'parameters.binary_data_size'"
        );
        assert_eq!(
            err_binary(
                &input(r#""datatype":"INT32","shape":[2,2],"parameters":{"binary_data_size":12}"#),
                &[0; 12]
            ),
            "input 'X': binary_data_size is 12 but shape [2,2] of INT32 needs 16 bytes"
        );
        assert_eq!(
            err_binary(
                &input(r#""datatype":"INT32","shape":[4],"parameters":{"binary_data_size":16}"#),
                &[0; 3]
            ),
            "input 'X': binary_data_size is 16 but only 3 bytes of binary data remain (13 missing)"
        );
        assert_eq!(
            err_binary(
                &input(r#""datatype":"INT8","shape":[1],"parameters":{"binary_data_size":1}"#),
                &[0; 5]
            ),
            "request body has 4 bytes after the last binary input"
        );
        assert_eq!(
            err_binary(
                &input(r#""datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":6}"#),
                &[9, 0, 0, 0, b'a', b'b']
            ),
            "input 'X': BYTES element 0 declares 9 bytes but only 2 remain in its data"
        );
        assert_eq!(
            err_binary(
                &input(r#""datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}"#),
                &[1, 0, 0, 0, b'a', b'b', b'c']
            ),
            "input 'X': BYTES data has 2 bytes left over after 1 elements"
        );
        assert_eq!(
            err_binary(
                &input(r#""datatype":"BOOL","shape":[2],"parameters":{"binary_data_size":2}"#),
                &[1, 2]
            ),
            "input 'X': BOOL element 1 is the byte 2; it must be 0 or 1"
        );
    }

    #[test]
    fn header_length() {
        let body = Bytes::from_static(b"{}");
        let e = |h: &str| {
            split_body(&body, Some(h.as_bytes()))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e("12x"),
            "Inference-Header-Content-Length must be a non-negative integer, got '12x'"
        );
        assert_eq!(
            e("-1"),
            "Inference-Header-Content-Length must be a non-negative integer, got '-1'"
        );
        assert_eq!(
            e("3"),
            "Inference-Header-Content-Length is 3 but the body has only 2 bytes"
        );
        assert_eq!(
            e(""),
            "Inference-Header-Content-Length must be a non-negative integer, got ''"
        );
        assert_eq!(parse_header_length(b"99999999999999999999"), Ok(usize::MAX));
        let (json, bin) = split_body(&body, Some(b"2")).unwrap();
        assert_eq!(
            (json.len(), bin.len()),
            (2, 0),
            "a length equal to the body is allowed"
        );
    }

    fn response(json: &str, tail: &[u8]) -> Result<InferResponse> {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(tail);
        let hl = json.len().to_string();
        let header = (!tail.is_empty()).then_some(hl.as_bytes());
        decode_response(&Bytes::from(body), header, &Limits::default())
    }

    fn err_response(json: &str, tail: &[u8]) -> String {
        response(json, tail).unwrap_err().to_string()
    }

    fn output(fields: &str) -> String {
        format!(r#"{{"model_name":"m","outputs":[{{"name":"Y",{fields}}}]}}"#)
    }

    #[test]
    fn response_errors() {
        assert_eq!(
            err_response(
                &output(r#""datatype":"INT8","shape":[1],"parameters":{"binary_data_size":1}"#),
                &[0; 5]
            ),
            "response body has 4 bytes after the last binary output"
        );
        assert_eq!(
            err_response(
                &output(
                    r#""datatype":"INT8","shape":[1],"data":[1],"parameters":{"binary_data_size":1}"#
                ),
                &[0]
            ),
            "output 'Y': has both 'data' and 'parameters.binary_data_size'"
        );
        assert_eq!(
            err_response(&output(r#""datatype":"INT8","shape":[1]"#), &[]),
            "output 'Y': has neither 'data' nor 'parameters.binary_data_size'"
        );
        assert_eq!(
            err_response(
                &output(r#""datatype":"INT32","shape":[2,2],"parameters":{"binary_data_size":12}"#),
                &[0; 12]
            ),
            "output 'Y': binary_data_size is 12 but shape [2,2] of INT32 needs 16 bytes"
        );
        assert_eq!(
            err_response(
                &output(r#""datatype":"FP64","shape":[2],"parameters":{"binary_data_size":16}"#),
                &[0; 3]
            ),
            "output 'Y': binary_data_size is 16 but only 3 bytes of binary data remain (13 missing)"
        );
        let json = output(r#""datatype":"INT8","shape":[1],"data":[1]"#);
        let e = decode_response(
            &Bytes::from(json.clone()),
            Some(format!("{}", json.len() + 1).as_bytes()),
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "Inference-Header-Content-Length is {} but the body has only {} bytes",
                json.len() + 1,
                json.len()
            )
        );
        let two = r#"{"outputs":[{"name":"Y","datatype":"INT8","shape":[1],"data":[1]},{"name":"Y","datatype":"INT8","shape":[1],"data":[2]}]}"#;
        assert_eq!(err_response(two, &[]), "duplicate output name 'Y'");
    }

    fn floats(t: &Tensor) -> Vec<f64> {
        match t.datatype {
            DataType::Fp16 => t
                .data
                .chunks(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DataType::Bf16 => t
                .data
                .chunks(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DataType::Fp32 => t
                .data
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            _ => t
                .data
                .chunks(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        }
    }

    #[test]
    fn responses_take_bare_non_finite_literals_in_float_data() {
        for dt in ["FP16", "BF16", "FP32", "FP64"] {
            // As Triton writes them, flat and nested, with and without spaces.
            for data in [
                "[NaN,Infinity,-Infinity,1.5]",
                "[[NaN, Infinity], [-Infinity, 1.5]]",
                "[ NaN ,\n Infinity, -Infinity , \"NaN\"]",
            ] {
                let json = format!(
                    r#"{{"model_name":"m","outputs":[{{"name":"Y","datatype":"{dt}","shape":[4],"data" : {data}}}]}}"#
                );
                let r = response(&json, &[]).unwrap_or_else(|e| panic!("{dt} {data}: {e}"));
                let v = floats(&r.outputs[0]);
                assert!(v[0].is_nan(), "{dt} {data}");
                assert_eq!(&v[1..3], &[f64::INFINITY, f64::NEG_INFINITY], "{dt} {data}");
                assert!(v[3] == 1.5 || v[3].is_nan(), "{dt} {data}");
            }
        }
        // With binary outputs after the header, which stay slices of the body.
        let json = concat!(
            r#"{"model_name":"m","outputs":["#,
            r#"{"name":"A","datatype":"FP32","shape":[2],"data":[-Infinity,NaN]},"#,
            r#"{"name":"B","datatype":"INT8","shape":[2],"parameters":{"binary_data_size":2}}]}"#
        );
        let r = response(json, &[7, 9]).unwrap();
        assert!(floats(&r.outputs[0])[1].is_nan());
        assert_eq!(floats(&r.outputs[0])[0], f64::NEG_INFINITY);
        assert_eq!(&r.outputs[1].data[..], &[7, 9]);
        // Strings that look like the literals are left alone.
        let json = output(r#""datatype":"BYTES","shape":[2],"data":["NaN", "[Infinity"]"#);
        let r = response(&json, &[]).unwrap();
        let elems: Vec<&[u8]> = r.outputs[0].bytes_elements().collect();
        assert_eq!(elems, vec![&b"NaN"[..], b"[Infinity"]);
    }

    fn tolerated(json: &str) -> Result<(InferResponse, Vec<Tolerance>)> {
        decode_backend_response(&Bytes::from(json.to_string()), None, &Limits::default())
            .map(|(r, t)| (r, t.iter().collect()))
    }

    #[test]
    fn null_in_float_output_data_reads_as_nan() {
        for dt in ["FP16", "BF16", "FP32", "FP64"] {
            // As KServe writes a NaN output, flat and nested.
            for data in ["[null,1.5]", "[[null], [1.5]]", "[ null , \"NaN\"]"] {
                let json = format!(
                    r#"{{"model_name":"m","outputs":[{{"name":"Y","datatype":"{dt}","shape":[2],"data":{data}}}]}}"#
                );
                let (r, t) = tolerated(&json).unwrap_or_else(|e| panic!("{dt} {data}: {e}"));
                assert_eq!(t, [Tolerance::NullFloat], "{dt} {data}");
                let v = floats(&r.outputs[0]);
                assert!(v[0].is_nan(), "{dt} {data}");
                assert!(v[1] == 1.5 || v[1].is_nan(), "{dt} {data}");
            }
        }
        // A well-formed answer forgives nothing; Triton's literals are noted as such.
        let (_, t) = tolerated(&output(r#""datatype":"FP32","shape":[1],"data":[1]"#)).unwrap();
        assert_eq!(t, []);
        let (_, t) = tolerated(&output(r#""datatype":"FP32","shape":[1],"data":[NaN]"#)).unwrap();
        assert_eq!(t, [Tolerance::NonFiniteLiteral]);
        // A string that looks like null is not null.
        assert_eq!(
            err_response(&output(r#""datatype":"FP32","shape":[1],"data":["null"]"#), &[]),
            "output 'Y': data element 0 is a string; FP32 needs a number, or \"NaN\", \"Infinity\" or \"-Infinity\""
        );
    }

    #[test]
    fn null_stays_an_error_in_integer_bool_and_bytes_outputs_and_in_requests() {
        for (dt, need) in [
            ("INT32", "INT32 needs a number"),
            ("UINT8", "UINT8 needs a number"),
            ("BOOL", "BOOL needs true or false"),
            ("BYTES", "BYTES needs a string"),
        ] {
            let json = output(&format!(r#""datatype":"{dt}","shape":[1],"data":[null]"#));
            assert_eq!(
                err_response(&json, &[]),
                format!("output 'Y': data element 0 is null; {need}")
            );
        }
        assert_eq!(
            err(&input(r#""datatype":"FP32","shape":[1],"data":[null]"#)),
            "input 'X': data element 0 is null; FP32 needs a number, or \"NaN\", \"Infinity\" or \"-Infinity\""
        );
    }

    #[test]
    fn bare_literals_elsewhere_stay_errors() {
        // In integer data they are named as the floats they are.
        assert_eq!(
            err_response(
                &output(r#""datatype":"INT32","shape":[1],"data":[NaN]"#),
                &[]
            ),
            "output 'Y': data element 0 is NaN, a float; INT32 needs a number"
        );
        // Outside `data` nothing is rewritten, and serde's error stands.
        let e = err_response(
            r#"{"model_name":"m","parameters":{"p":NaN},"outputs":[]}"#,
            &[],
        );
        assert!(e.starts_with("invalid JSON response: "), "{e}");
    }

    /// Requests take the bare literals in float data, as Triton does and as Python's json
    /// module (tritonclient) writes them; elsewhere they stay errors that say what they are.
    #[test]
    fn requests_take_bare_non_finite_literals_in_float_data() {
        let body = input(r#""datatype":"FP32","shape":[3],"data":[NaN,-Infinity,Infinity]"#);
        let RequestBody::Message(r) =
            decode_request(&Bytes::from(body), None, &Limits::default()).unwrap()
        else {
            panic!("a message")
        };
        let v: Vec<f32> = r.inputs[0]
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(v[0].is_nan());
        assert_eq!(&v[1..], &[f32::NEG_INFINITY, f32::INFINITY]);
        // In integer data they stay errors, named by tensor and element.
        assert_eq!(
            err(&input(r#""datatype":"INT64","shape":[1],"data":[NaN]"#)),
            "input 'X': data element 0 is NaN, a float; INT64 needs a number"
        );
        // Outside data, where Triton reads no tensor, they are not JSON.
        let e = err(&input(
            r#""datatype":"FP32","shape":[1],"data":[1],"parameters":{"p":NaN}"#,
        ));
        assert!(e.starts_with("input 'X': field 'parameters"), "{e}");
        // A document only serde reads (an escaped key) reads them too, as the fast path does;
        // and a fault elsewhere in it is named where it is, not at the literal.
        let escaped = r#"{"inp\u0075ts":[{"name":"X","datatype":"FP32","shape":[2],"data":[NaN,-Infinity]}]}"#;
        let RequestBody::Message(r) = decode_request(
            &Bytes::from_static(escaped.as_bytes()),
            None,
            &Limits::default(),
        )
        .unwrap() else {
            panic!("a message")
        };
        assert_eq!(r.inputs[0].data.len(), 8);
        assert_eq!(
            err(
                r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[NaN]},{"name":"Y","datatype":"INT8","shape":[1],"data":[300]}]}"#
            ),
            "input 'Y': data element 0 (300) is out of range for INT8"
        );
    }

    #[test]
    fn quoting_is_limited_to_data_arrays() {
        let q = |s: &str| quote_non_finite(s.as_bytes()).map(|v| String::from_utf8(v).unwrap());
        assert_eq!(
            q(r#"{"data":[NaN,[Infinity]],"x":[NaN],"d":{"data":"NaN"}}"#).as_deref(),
            Some(r#"{"data":["NaN",["Infinity"]],"x":[NaN],"d":{"data":"NaN"}}"#)
        );
        assert_eq!(
            q(r#"{"data" : [-Infinity, "a\"]NaN"]}"#).as_deref(),
            Some(r#"{"data" : ["-Infinity", "a\"]NaN"]}"#)
        );
        assert_eq!(q(r#"{"data":[1,2],"y":NaN}"#), None);
        assert_eq!(q(r#"{"data":["unterminated"#), None);
    }

    /// Pairwise for a few names, hashed for more: the same first duplicate either way.
    #[test]
    fn duplicates_are_found_among_few_and_many_names() {
        let check = |names: &[&str]| {
            check_unique(names.iter().copied(), Role::Input).map_err(|e| e.to_string())
        };
        let many: Vec<String> = (0..40).map(|i| format!("T{i}")).collect();
        let mut names: Vec<&str> = many.iter().map(String::as_str).collect();
        for len in [0, 1, 2, FEW_NAMES, FEW_NAMES + 1, 40] {
            assert_eq!(check(&names[..len]), Ok(()), "{len} distinct names");
        }
        for len in [2, FEW_NAMES, FEW_NAMES + 1, 40] {
            let mut with_dup = names[..len].to_vec();
            with_dup[len - 1] = with_dup[0];
            with_dup.push(with_dup[1]);
            assert_eq!(
                check(&with_dup),
                Err("duplicate input name 'T0'".to_string()),
                "{len} names"
            );
        }
        // Exactly as many names as are compared pairwise, the last a duplicate.
        let mut eight = names[..FEW_NAMES - 1].to_vec();
        eight.push("T3");
        assert_eq!(check(&eight), Err("duplicate input name 'T3'".to_string()));
        names.truncate(3);
        names.push("T2");
        assert_eq!(check(&names), Err("duplicate input name 'T2'".to_string()));
    }

    #[test]
    fn names_and_json_types() {
        let two = r#"{"inputs":[{"name":"A","datatype":"INT8","shape":[1],"data":[1]},{"name":"A","datatype":"INT8","shape":[1],"data":[1]}]}"#;
        assert_eq!(err(two), "duplicate input name 'A'");
        assert_eq!(
            err(r#"{"inputs":[],"outputs":[{"name":"O"},{"name":"O"}]}"#),
            "duplicate output name 'O'"
        );
        let e = err(&input(r#""datatype":"INT8","shape":"1","data":[1]"#));
        assert!(
            e.starts_with("input 'X': field 'shape': invalid type: string \"1\""),
            "{e}"
        );
        let e = err(r#"{"inputs":{}}"#);
        assert!(
            e.starts_with("invalid JSON request: field 'inputs': invalid type: map"),
            "{e}"
        );
        let e = decode_request(
            &Bytes::from_static(b"{\"id\":\"\xff\",\"inputs\":[]}"),
            None,
            &Limits::default(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("invalid JSON request:"), "{e}");
        let e = decode_request(
            &Bytes::from(input(r#""datatype":"INT8","shape":[1],"data":[1]"#)),
            None,
            &Limits {
                max_json_bytes: 10,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, ProtocolError::TooLarge(_)));
        assert!(e.to_string().starts_with("the JSON request is"), "{e}");
    }
}
