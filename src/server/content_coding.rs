//! Content codings as RFC 9110 writes them: case-insensitive (section 8.4.1), and `x-gzip`
//! is gzip (section 8.4.1.3). tower-http's request decompression matches the header's bytes
//! exactly (`gzip`, `deflate`), so this layer, just outside it, writes the header in the
//! form it matches; a request sent with `Content-Encoding: GZIP` or `x-gzip` was refused
//! with 415 while `Accept-Encoding` was already read case-insensitively.

use std::task::{Context, Poll};

use http::{header, HeaderMap, HeaderValue, Request};

/// Used as a layer through `tower::layer::layer_fn(CanonicalCoding)`.
#[derive(Clone)]
pub struct CanonicalCoding<S>(pub S);

impl<S, B> tower::Service<Request<B>> for CanonicalCoding<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        canonical_coding(req.headers_mut());
        self.0.call(req)
    }
}

/// Rewrites a single `Content-Encoding` that names gzip or deflate in another spelling.
/// Anything else (identity, several codings, codings we do not decode) stays as sent, for
/// the edge to accept or refuse by name.
fn canonical_coding(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::CONTENT_ENCODING).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        // None, or several header lines: stacked codings, refused by name at the edge.
        return;
    };
    let sent = value.as_bytes().trim_ascii();
    let canonical = if sent.eq_ignore_ascii_case(b"gzip") || sent.eq_ignore_ascii_case(b"x-gzip") {
        "gzip"
    } else if sent.eq_ignore_ascii_case(b"deflate") {
        "deflate"
    } else {
        return;
    };
    if sent != canonical.as_bytes() || value.as_bytes().len() != canonical.len() {
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(canonical),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coding(sent: &str) -> String {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_str(sent).unwrap(),
        );
        canonical_coding(&mut h);
        h[header::CONTENT_ENCODING].to_str().unwrap().to_string()
    }

    #[test]
    fn several_header_lines_stay_as_sent() {
        let mut h = HeaderMap::new();
        h.append(header::CONTENT_ENCODING, HeaderValue::from_static("GZIP"));
        h.append(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
        canonical_coding(&mut h);
        let values: Vec<_> = h.get_all(header::CONTENT_ENCODING).iter().collect();
        assert_eq!(values, ["GZIP", "br"]);
    }

    #[test]
    fn spellings_of_gzip_and_deflate_become_the_canonical_names() {
        for (sent, canonical) in [
            ("gzip", "gzip"),
            ("GZIP", "gzip"),
            ("x-gzip", "gzip"),
            ("X-Gzip", "gzip"),
            (" gzip ", "gzip"),
            ("Deflate", "deflate"),
            ("br", "br"),
            ("gzip, gzip", "gzip, gzip"),
            ("IDENTITY", "IDENTITY"),
        ] {
            assert_eq!(coding(sent), canonical, "{sent}");
        }
    }
}
