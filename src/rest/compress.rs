//! Which inference answers are compressed, and where. tower-http's `CompressionLayer`
//! compresses as the body is written, on the async thread that serves the connection: for a
//! small answer that is cheaper than a hop, but a 70 MB JSON answer took 5.6 s of that
//! thread, and every request sharing it (liveness probes among them) waited as long. So
//! the layer gets only answers up to `heavy::INLINE_UP_TO` (`Compressible`); a larger
//! answer of the gateway's own is gzipped here on the blocking pool, for a client that
//! accepts gzip, and a larger passed-through answer goes as the backend sent it.

use bytes::Bytes;
use flate2::write::GzEncoder;
use http::{header, HeaderMap, HeaderValue, Response};
use std::io::Write;

use crate::body::{answer_head, encoded_response, Body, PartsBody};
use crate::body_budget::Reservation;
use crate::error::GatewayError;
use crate::gateway::heavy;
use crate::protocol::rest::encode::EncodedBody;

use http_body_util::BodyExt;

/// Marks the one kind of answer the server compresses for a client that accepts it: a
/// successful inference, as Triton does, small enough to compress in place (see above).
/// `tritonclient.http.aio` asks for gzip on every call but inflates only inference answers
/// itself, so a compressed metadata answer or error body is bytes it cannot read.
#[derive(Debug, Clone, Copy)]
pub struct Compressible;

/// True when `Accept-Encoding` takes gzip: named (or `x-gzip`) with a weight above zero,
/// or, when not named, `*` with a weight above zero (RFC 9110, 12.5.3).
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut named = None;
    let mut any = None;
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let mut fields = item.split(';');
            let coding = fields.next().unwrap_or("").trim();
            let weight = fields
                .filter_map(|f| f.trim().strip_prefix("q=").or(f.trim().strip_prefix("Q=")))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                named = Some(named.map_or(weight, |w: f32| w.max(weight)));
            } else if coding == "*" {
                any = Some(weight);
            }
        }
    }
    named.or(any).is_some_and(|w| w > 0.0)
}

/// The gateway's own answer, as the client may take it: marked for the layer when small,
/// gzipped on the blocking pool when large and the client accepts gzip, else as it is.
pub async fn own_answer(
    encoded: EncodedBody,
    gzip: bool,
    held: &mut Reservation,
) -> Result<Response<Body>, GatewayError> {
    let len: usize = encoded.parts.iter().map(Bytes::len).sum();
    if len <= heavy::INLINE_UP_TO {
        let mut answer = encoded_response(encoded);
        answer.extensions_mut().insert(Compressible);
        return Ok(answer);
    }
    if !gzip {
        return Ok(encoded_response(encoded));
    }
    // The head is the uncompressed answer's: IHCL counts bytes of the inflated body, as
    // Triton's clients read it.
    let head = answer_head(&encoded)
        .header(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"))
        .header(header::VARY, HeaderValue::from_static("accept-encoding"));
    let compressed = heavy::run(len, "compressing the answer", held, move |_| {
        gzip_parts(&encoded.parts)
    })
    .await?;
    Ok(head
        .body(PartsBody::new(vec![compressed]).boxed_unsync())
        .expect("valid response parts"))
}

/// A passed-through answer is marked for the layer only when its length is known and
/// small: it streams from the backend, and a large one is not held to compress it.
pub fn mark_passed_through(answer: &mut Response<Body>) {
    let small = answer
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n <= heavy::INLINE_UP_TO);
    if small {
        answer.extensions_mut().insert(Compressible);
    }
}

/// gzip at flate2's fastest level: a large answer is mostly numbers, which the fastest
/// level already shrinks to a third or less, at several times the default level's speed.
fn gzip_parts(parts: &[Bytes]) -> Bytes {
    let len: usize = parts.iter().map(Bytes::len).sum();
    let mut encoder = GzEncoder::new(Vec::with_capacity(len / 4), flate2::Compression::fast());
    for part in parts {
        encoder
            .write_all(part)
            .expect("writing to a Vec cannot fail");
    }
    encoder
        .finish()
        .expect("writing to a Vec cannot fail")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(values: &[&'static str]) -> bool {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT_ENCODING, HeaderValue::from_static(v));
        }
        accepts_gzip(&h)
    }

    #[test]
    fn gzip_is_accepted_as_rfc_9110_weighs_it() {
        assert!(accept(&["gzip"]));
        assert!(accept(&["deflate, GZIP;q=0.5"]));
        assert!(accept(&["br", "x-gzip"]));
        assert!(accept(&["*"]));
        assert!(!accept(&[]));
        assert!(!accept(&["deflate, br"]));
        assert!(!accept(&["gzip;q=0"]));
        assert!(!accept(&["gzip; q=0.0, *"]), "named beats the wildcard");
        assert!(!accept(&["*;q=0"]));
        assert!(!accept(&["identity"]));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_large_answer_is_gzipped_off_the_runtime_and_a_small_one_left_to_the_layer() {
        let part = |n: usize| Bytes::from(vec![b'1'; n]);
        let held = &mut Reservation::default();
        let small = EncodedBody {
            parts: vec![part(100)],
            json_len: 100,
        };
        let answer = own_answer(small, true, held).await.unwrap();
        assert!(answer.extensions().get::<Compressible>().is_some());
        assert!(answer.headers().get(header::CONTENT_ENCODING).is_none());

        let json = r#"{"outputs":[]}"#;
        let large = EncodedBody {
            parts: vec![
                Bytes::from_static(json.as_bytes()),
                part(heavy::INLINE_UP_TO),
            ],
            json_len: json.len(),
        };
        let answer = own_answer(large, true, held).await.unwrap();
        assert!(answer.extensions().get::<Compressible>().is_none());
        assert_eq!(answer.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(
            answer.headers()[crate::headers::INFERENCE_HEADER_CONTENT_LENGTH],
            json.len().to_string().as_str()
        );
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let mut inflated = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut inflated)
            .unwrap();
        assert_eq!(inflated.len(), json.len() + heavy::INLINE_UP_TO);
        assert!(inflated.starts_with(json.as_bytes()));

        // Not gzipped for a client that does not take it, and not left to the layer.
        let large = EncodedBody {
            parts: vec![part(heavy::INLINE_UP_TO + 1)],
            json_len: heavy::INLINE_UP_TO + 1,
        };
        let answer = own_answer(large, false, held).await.unwrap();
        assert!(answer.extensions().get::<Compressible>().is_none());
        assert!(answer.headers().get(header::CONTENT_ENCODING).is_none());
    }

    #[test]
    fn a_passed_through_answer_is_left_to_the_layer_only_when_known_small() {
        let answer = |length: Option<usize>| {
            let mut r = Response::new(crate::body::empty());
            if let Some(n) = length {
                r.headers_mut().insert(header::CONTENT_LENGTH, n.into());
            }
            mark_passed_through(&mut r);
            r.extensions().get::<Compressible>().is_some()
        };
        assert!(answer(Some(heavy::INLINE_UP_TO)));
        assert!(!answer(Some(heavy::INLINE_UP_TO + 1)));
        assert!(!answer(None));
    }
}
