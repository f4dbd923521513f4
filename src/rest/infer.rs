//! The REST edge of an inference: the body (JSON, binary chunks, or raw) decoded into the
//! core's request, and the core's answer encoded output by output as the client asked, or
//! the backend's own bytes passed back.

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderValue, Response};
use http_body_util::BodyExt;

use super::compress;
use crate::body::Body;
use crate::body_budget::Reservation;
use crate::config::Config;
use crate::error::GatewayError;
use crate::gateway::core::{self, InferContext, Original, Outcome};
use crate::gateway::observe::{Observation, Phase};
use crate::gateway::{heavy, Gateway, REQUEST_ID};
use crate::headers::{INFERENCE_HEADER_CONTENT_LENGTH, TRACEPARENT};
use crate::protocol::rest::decode::{decode_request, parse_header_length, RequestBody};
use crate::protocol::rest::encode::{encode_response, EncodedBody};
use crate::protocol::rest::raw::expand_raw;
use crate::protocol::{InferRequest, InferResponse};

/// Checks `Inference-Header-Content-Length` before the body is read: one value (repeated
/// lines must agree, or there is no right one to pick), a number, and within the JSON limit,
/// so that a body is not read for a header the limit refuses anyway. Returns the length.
/// `coded`: the body has a content coding, so its `Content-Length` is not the length the
/// header speaks of.
pub fn check_header_length(
    headers: &http::HeaderMap,
    max_json: usize,
    coded: bool,
) -> Result<Option<usize>, GatewayError> {
    let mut values = headers.get_all(&INFERENCE_HEADER_CONTENT_LENGTH).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.any(|v| v != first) {
        return Err(GatewayError::BadRequest(format!(
            "Inference-Header-Content-Length is sent {} times with different values; send it once",
            headers
                .get_all(&INFERENCE_HEADER_CONTENT_LENGTH)
                .iter()
                .count()
        )));
    }
    let n = parse_header_length(first.as_bytes())?;
    // As sent: a length past usize::MAX was read as usize::MAX.
    let sent = || String::from_utf8_lossy(first.as_bytes()).trim().to_string();
    // A length the body cannot have is a malformed request, not one too large for a limit.
    let body_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(len) = body_length.filter(|len| !coded && n as u64 > *len) {
        return Err(GatewayError::BadRequest(
            crate::protocol::rest::decode::header_length_past_body(&sent(), len),
        ));
    }
    if n > max_json {
        return Err(GatewayError::PayloadTooLarge(format!(
            "the JSON request is {} bytes (Inference-Header-Content-Length); the limit is {max_json} (limits.max_json_bytes)",
            sent()
        )));
    }
    Ok(Some(n))
}

pub async fn infer(
    gw: &Gateway,
    config: &Config,
    model: &str,
    version: Option<&str>,
    parts: &Parts,
    (body, header_length, held): (Bytes, Option<usize>, &mut Reservation),
    obs: &mut Observation,
) -> Result<Response<Body>, GatewayError> {
    let (entry, _pending) = core::begin(gw, model, version, obs)?;
    let decoding = Phase::start();
    let limits = config.limits.protocol();
    // Checked before the body was read (`check_header_length`); the codec reads it too.
    let raw_header = parts.headers.get(&INFERENCE_HEADER_CONTENT_LENGTH);
    // The JSON part is what costs: a large one is parsed off the async threads (`heavy`); a
    // small one in place, without the copies the hop needs.
    let json_size = header_length.unwrap_or(body.len());
    let decoded = if json_size <= heavy::INLINE_UP_TO {
        decode_request(&body, raw_header.map(HeaderValue::as_bytes), &limits)?
    } else {
        let (body, header, limits) = (
            body.clone(),
            raw_header.map(|h| h.as_bytes().to_vec()),
            limits.clone(),
        );
        heavy::run(json_size, "decoding the request", held, move |_| {
            decode_request(&body, header.as_deref(), &limits)
        })
        .await??
    };
    let (req, binary_in) = match decoded {
        RequestBody::Message(r) => {
            let binary = header_length.map_or(0, |n| (body.len() - n) as u64);
            (r, binary)
        }
        RequestBody::Raw(data) => (
            expand_raw(data, &entry.metadata, &limits)?,
            body.len() as u64,
        ),
    };
    // Tensors written out in JSON were decoded into new buffers, up to about four times
    // their text; binary ones are slices of the body. The new ones count from now on.
    let decoded: u64 = req.inputs.iter().map(|t| t.data.len() as u64).sum();
    let from_json = usize::try_from(decoded.saturating_sub(binary_in)).unwrap_or(usize::MAX);
    held.hold_decoded(body.len().saturating_add(from_json), "request")?;
    decoding.end(&mut obs.compute_input);
    let ctx = InferContext {
        model,
        version,
        traceparent: parts.headers.get(&TRACEPARENT),
        request_id: parts.headers.get(&REQUEST_ID),
        transport_deadline: None,
        original: Some(Original {
            body: &body,
            header_length,
        }),
        binary_in,
        held,
    };
    let outcome = core::infer(gw, config, &entry, &req, ctx, obs).await?;
    match outcome {
        Outcome::PassThrough(response) => {
            let mut answer = pass_through(response);
            compress::mark_passed_through(&mut answer);
            Ok(answer)
        }
        Outcome::Response {
            response,
            from_binary,
        } => {
            let encoding = Phase::start();
            let encoded = encode_for_client(&req, response, from_binary, held, obs).await?;
            let gzip = compress::accepts_gzip(&parts.headers);
            let answer = compress::own_answer(encoded, gzip, held).await;
            encoding.end(&mut obs.compute_output);
            answer
        }
    }
}

/// Each output in the encoding the client asked for: binary when it listed the output with
/// `binary_data: true`, or did not list it and set `binary_data_output`.
/// A large answer is encoded on the blocking pool (`heavy`): 4M FP64 elements written as
/// JSON took 0.3 s.
async fn encode_for_client(
    req: &InferRequest,
    response: InferResponse,
    from_binary: bool,
    held: &mut Reservation,
    obs: &mut Observation,
) -> Result<EncodedBody, GatewayError> {
    let binary: Vec<bool> = response
        .outputs
        .iter()
        .map(|o| req.wants_binary(&o.name))
        .collect();
    for (o, wants_binary) in response.outputs.iter().zip(&binary) {
        match (from_binary, wants_binary) {
            (true, false) => obs.binary_to_json += o.data.len() as u64,
            (false, true) => obs.json_to_binary += o.data.len() as u64,
            _ => {}
        }
    }
    let size = response.outputs.iter().map(|o| o.data.len()).sum();
    heavy::run(size, "encoding the answer", held, move |_| {
        encode_response(&response, &binary)
    })
    .await?
    .map_err(GatewayError::from)
}

fn pass_through(backend: http::Response<crate::gateway::core::BackendBody>) -> Response<Body> {
    let (mut parts, body) = backend.into_parts();
    // The values are moved from the backend's map, not copied through a builder.
    let mut r = Response::new(body.map_err(Into::into).boxed_unsync());
    *r.status_mut() = parts.status;
    let headers = r.headers_mut();
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        INFERENCE_HEADER_CONTENT_LENGTH,
    ] {
        if let Some(v) = parts.headers.remove(&name) {
            headers.insert(name, v);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_length_past_the_limit_is_named_as_sent() {
        let length = |v: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert(INFERENCE_HEADER_CONTENT_LENGTH, HeaderValue::from_static(v));
            check_header_length(&h, 100, false).map_err(|e| e.message().to_string())
        };
        assert_eq!(length("100"), Ok(Some(100)));
        for sent in ["101", "18446744073709551616", "99999999999999999999999"] {
            assert_eq!(
                length(sent),
                Err(format!("the JSON request is {sent} bytes (Inference-Header-Content-Length); the limit is 100 (limits.max_json_bytes)"))
            );
        }
    }

    /// A header length past the body's own (Content-Length) is a 400 however large it is;
    /// against a compressed body's length it means nothing, and the limit decides.
    #[test]
    fn a_header_length_past_the_body_is_a_bad_request() {
        let check = |v: &'static str, body: &'static str, coded: bool| {
            let mut h = http::HeaderMap::new();
            h.insert(INFERENCE_HEADER_CONTENT_LENGTH, HeaderValue::from_static(v));
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_static(body));
            check_header_length(&h, 100, coded).map_err(|e| (e.status(), e.message().to_string()))
        };
        assert_eq!(check("13", "13", false), Ok(Some(13)));
        for sent in ["14", "101", "18446744073709551621"] {
            assert_eq!(
                check(sent, "13", false),
                Err((
                    http::StatusCode::BAD_REQUEST,
                    format!(
                        "Inference-Header-Content-Length is {sent} but the body has only 13 bytes"
                    )
                ))
            );
        }
        assert_eq!(check("14", "13", true), Ok(Some(14)));
        assert_eq!(
            check("101", "13", true).unwrap_err().0,
            http::StatusCode::PAYLOAD_TOO_LARGE
        );
    }
}
