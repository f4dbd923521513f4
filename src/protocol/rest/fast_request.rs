//! A single-pass reader for well-formed JSON inference requests. serde would walk each
//! tensor's `data` array once to capture it and the codec a second time to convert it; here
//! the envelope is read by hand, small values (id, parameters, shape, outputs) go to
//! serde_json, and each `data` array is converted as it is met when its `datatype` came
//! first (the usual order). Anything unusual returns `None`: the serde path then decodes the
//! request, or words the error, exactly as before.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::json_data;
use super::wire::{WireData, WireRequest, WireShape, WireTensor};
use crate::protocol::datatype::DataType;
use crate::protocol::limits::Limits;
use crate::protocol::tensor::MAX_RANK;

struct Reader<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.s.get(self.pos) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.pos) == Some(&b)).then(|| self.pos += 1)
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.pos).copied()
    }

    /// An object key without escapes, and its colon.
    fn key(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.pos;
        let off = memchr::memchr2(b'"', b'\\', &self.s[start..])?;
        if self.s[start + off] != b'"' {
            return None;
        }
        self.pos = start + off + 1;
        self.eat(b':')?;
        Some(&self.s[start..start + off])
    }

    /// One value of type `T`, by serde_json.
    fn value<T: Deserialize<'a>>(&mut self) -> Option<T> {
        self.ws();
        let mut it = serde_json::Deserializer::from_slice(&self.s[self.pos..]).into_iter::<T>();
        let v = it.next()?.ok()?;
        self.pos += it.byte_offset();
        Some(v)
    }

    /// A string without escapes or control characters, borrowed in place; anything else by
    /// serde_json (a `StreamDeserializer` per value cost more than the value itself).
    fn str_ref(&mut self) -> Option<Cow<'a, str>> {
        self.ws();
        if self.s.get(self.pos) == Some(&b'"') {
            let start = self.pos + 1;
            let rest = &self.s[start..];
            let end = memchr::memchr2(b'"', b'\\', rest)?;
            if rest[end] == b'"' && rest[..end].iter().all(|&b| b >= 0x20) {
                let text = std::str::from_utf8(&rest[..end]).ok()?;
                self.pos = start + end + 1;
                return Some(Cow::Borrowed(text));
            }
        }
        self.value::<String>().map(Cow::Owned)
    }

    /// A shape of plain non-negative integers read in place (no sign, fraction, exponent or
    /// leading zero, at most 19 digits); anything else by serde_json.
    fn shape(&mut self) -> Option<WireShape> {
        self.ws();
        let start = self.pos;
        if let Some(dims) = self.plain_dims() {
            return Some(WireShape::Dims(dims));
        }
        self.pos = start;
        self.value::<WireShape>()
    }

    fn plain_dims(&mut self) -> Option<Vec<u64>> {
        self.eat(b'[')?;
        let mut dims = Vec::new();
        if self.eat(b']').is_some() {
            return Some(dims);
        }
        loop {
            self.ws();
            let digits = self.s[self.pos..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let text = &self.s[self.pos..self.pos + digits];
            if digits == 0 || digits > 19 || (digits > 1 && text[0] == b'0') {
                return None;
            }
            let v = std::str::from_utf8(text).ok()?.parse::<u64>().ok()?;
            self.pos += digits;
            if dims.len() == MAX_RANK {
                return None; // serde's path refuses it, with the field's place
            }
            dims.push(v);
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(dims);
                }
                _ => return None,
            }
        }
    }

    /// Walks an object, calling `field` for each key; `field` must consume the value.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let k = self.key()?;
            field(self, k)?;
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// Sets a field once; a repeated field makes the fast path give up (serde reports it).
fn once<T>(slot: &mut Option<T>, v: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(v?);
    Some(())
}

fn tensor<'a>(r: &mut Reader<'a>, limits: &Limits) -> Option<WireTensor<'a>> {
    let (mut name, mut datatype, mut shape, mut parameters, mut data) =
        (None, None, None, None, None);
    r.object(|r, k| match k {
        b"name" => once(&mut name, r.str_ref().map(Cow::into_owned)),
        b"datatype" => once(&mut datatype, r.str_ref()),
        b"shape" => once(&mut shape, r.shape()),
        b"parameters" => once(&mut parameters, r.value()),
        b"data" => {
            if r.peek()? != b'[' {
                return None;
            }
            let text = &r.s[r.pos..];
            let dt = datatype.as_deref().and_then(DataType::parse);
            let (wire, len) = match dt {
                Some(dt) => {
                    let expected = shape
                        .as_ref()
                        .and_then(WireShape::element_count)
                        .unwrap_or(0);
                    let (bytes, n, len) =
                        json_data::parse_data_prefix(text, dt, limits.max_json_depth, expected)
                            .ok()?;
                    (WireData::Parsed(bytes, n), len)
                }
                None => {
                    let len = json_data::array_len(text, limits.max_json_depth).ok()?;
                    (WireData::Text(&text[..len]), len)
                }
            };
            r.pos += len;
            once(&mut data, Some(wire))
        }
        _ => r.value::<IgnoredAny>().map(drop),
    })?;
    Some(WireTensor {
        name: name?,
        datatype: datatype?,
        shape: shape?,
        parameters: parameters.unwrap_or_default(),
        data,
    })
}

/// The request's wire form, or `None` to let serde handle it.
pub(crate) fn parse_request<'a>(json: &'a [u8], limits: &Limits) -> Option<WireRequest<'a>> {
    let mut r = Reader { s: json, pos: 0 };
    let (mut id, mut parameters, mut inputs, mut outputs) = (None, None, None, None);
    r.object(|r, k| match k {
        b"id" => once(&mut id, r.value::<Option<String>>()),
        b"parameters" => once(&mut parameters, r.value()),
        b"outputs" => once(&mut outputs, r.value()),
        b"inputs" => {
            r.eat(b'[')?;
            let mut list = Vec::new();
            if r.eat(b']').is_none() {
                loop {
                    list.push(tensor(r, limits)?);
                    match r.peek()? {
                        b',' => r.pos += 1,
                        b']' => {
                            r.pos += 1;
                            break;
                        }
                        _ => return None,
                    }
                }
            }
            once(&mut inputs, Some(list))
        }
        _ => r.value::<IgnoredAny>().map(drop),
    })?;
    r.ws();
    if r.pos != json.len() {
        return None;
    }
    Some(WireRequest {
        id: id.flatten(),
        parameters: parameters.unwrap_or_default(),
        inputs: inputs?,
        outputs: outputs.flatten(),
    })
}

/// The `name` of tensor `idx` of the top-level list `list` ("inputs" or "outputs"), read
/// only as far as it takes: for an error message about a document that does not parse,
/// where the fault lies after the name (Python's bare `NaN` in `data`, say).
pub(crate) fn tensor_name(json: &[u8], list: &str, idx: usize) -> Option<String> {
    let mut r = Reader { s: json, pos: 0 };
    r.eat(b'{')?;
    loop {
        let key = r.key()?;
        if key != list.as_bytes() {
            r.value::<IgnoredAny>()?;
            r.eat(b',')?;
            continue;
        }
        r.eat(b'[')?;
        for _ in 0..idx {
            r.value::<IgnoredAny>()?;
            r.eat(b',')?;
        }
        r.eat(b'{')?;
        loop {
            if r.key()? == b"name" {
                return r.str_ref().map(Cow::into_owned);
            }
            r.value::<IgnoredAny>()?;
            r.eat(b',')?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::rest::decode::{decode_request, RequestBody};
    use bytes::Bytes;

    /// The fast path must decode exactly what the serde path decodes.
    fn same_as_serde(json: &str, fast_path_taken: bool) {
        let limits = Limits::default();
        assert_eq!(
            parse_request(json.as_bytes(), &limits).is_some(),
            fast_path_taken,
            "fast path declined: {json}"
        );
        let fast = decode_request(&Bytes::copy_from_slice(json.as_bytes()), None, &limits);
        let slow = crate::protocol::rest::decode::decode_request_serde_only(
            &Bytes::copy_from_slice(json.as_bytes()),
            &limits,
        );
        match (fast, slow) {
            (Ok(RequestBody::Message(a)), Ok(RequestBody::Message(b))) => {
                assert_eq!(a, b, "{json}")
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{json}"),
            (a, b) => panic!("fast {a:?} and serde {b:?} differ for {json}"),
        }
    }

    #[test]
    fn agrees_with_serde() {
        for json in [
            r#"{"id":"7","inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1.5,"NaN"]}]}"#,
            r#"{"inputs":[{"data":[[1,2],[3,4]],"name":"A","shape":[2,2],"datatype":"INT64"}],"outputs":[{"name":"O","parameters":{"binary_data":true}}]}"#,
            r#" { "parameters" : {"sequence_id": 5, "sequence_start": true} , "inputs" : [ { "name" : "S" , "datatype" : "BYTES" , "shape" : [ 2 ] , "data" : [ "a\"b" , "" ] } ] , "extra": {"x": [1]} } "#,
            r#"{"inputs":[{"name":"B","datatype":"BOOL","shape":[3],"data":[true,false,true],"parameters":{"p":1}}],"id":null}"#,
            r#"{"inputs":[{"name":"U","datatype":"UINT8","shape":[3],"data":[1,3]}]}"#,
            r#"{"inputs":[{"name":"H","datatype":"FP16","shape":[1],"data":[0.5]}, {"name":"B","datatype":"BF16","shape":[1],"data":[2]}]}"#,
            r#"{"inputs":[]}"#,
            // Names with escapes and non-ASCII, shapes with spaces, signs, fractions, large
            // numbers: read in place or by serde, the same either way.
            r#"{"inputs":[{"name":"A\u00e9\"q","datatype":"INT32","shape":[ 1 , 2 ],"data":[1,2]}]}"#,
            r#"{"inputs":[{"name":"é","datatype":"INT32","shape":[-1],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[2.0],"data":[1,2]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[1e0],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[18446744073709551615],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[184467440737095516150],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[0],"data":[]}]}"#,
        ] {
            same_as_serde(json, true);
        }
        // Invalid JSON the in-place readers must not accept: serde words the error.
        for json in [
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[01],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[1,],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[+1],"data":[1]}]}"#,
            "{\"inputs\":[{\"name\":\"a\tb\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[1]}]}",
        ] {
            same_as_serde(json, false);
        }
        // A bad element makes the fast path decline; serde's path words the error.
        same_as_serde(
            r#"{"inputs":[{"name":"U","datatype":"UINT8","shape":[2],"data":[1,300]}]}"#,
            false,
        );
    }

    #[test]
    fn finds_a_tensor_name_before_the_fault() {
        let doc = br#"{"id":"x","inputs":[{"name":"A","data":[1]}, {"shape":[1],"name":"B","data":[NaN]}]}"#;
        assert_eq!(tensor_name(doc, "inputs", 1).as_deref(), Some("B"));
        assert_eq!(tensor_name(doc, "inputs", 0).as_deref(), Some("A"));
        assert_eq!(tensor_name(doc, "outputs", 0), None);
        assert_eq!(tensor_name(doc, "inputs", 2), None);
        // The fault before the name: no name.
        let doc = br#"{"inputs":[{"data":[NaN],"name":"A"}]}"#;
        assert_eq!(tensor_name(doc, "inputs", 0), None);
    }

    #[test]
    fn declines_what_it_does_not_handle() {
        let limits = Limits::default();
        for json in [
            r#"{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1]}],"inputs":[]}"#,
            r#"{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1,]}]}"#,
            r#"{"inp\u0075ts":[]}"#,
            r#"{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":null}]}"#,
            r#"{"inputs":[]} x"#,
            r#"{"inputs":[{"name":"A","datatype":"FP32","data":[1]}]}"#,
        ] {
            assert!(parse_request(json.as_bytes(), &limits).is_none(), "{json}");
        }
    }
}
