//! Content codings as RFC 9110 writes them: case-insensitive (section 8.4.1), and `x-gzip`
//! is gzip (section 8.4.1.3). This layer writes one gzip or deflate coding in the one form
//! the REST edge matches (`rest::content_coding`), so that a request sent with
//! `Content-Encoding: GZIP` or `x-gzip` is inflated like one sent with `gzip`.

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

/// Rewrites a `Content-Encoding` that comes to one gzip or deflate coding in another
/// spelling, or with `identity` beside it (a no-op coding, RFC 9110 8.4.1: `gzip, identity`
/// is gzip); one of identity alone is removed. Anything else (stacked codings, codings we do
/// not decode) stays as sent, for the edge to refuse by name.
fn canonical_coding(headers: &mut HeaderMap) {
    if !headers.contains_key(header::CONTENT_ENCODING) {
        return;
    }
    let mut codings = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"));
    let canonical = match (codings.next(), codings.next()) {
        (None, _) => {
            headers.remove(header::CONTENT_ENCODING);
            return;
        }
        (Some(c), None) if c.eq_ignore_ascii_case(b"gzip") || c.eq_ignore_ascii_case(b"x-gzip") => {
            "gzip"
        }
        (Some(c), None) if c.eq_ignore_ascii_case(b"deflate") => "deflate",
        _ => return,
    };
    let mut values = headers.get_all(header::CONTENT_ENCODING).iter();
    let as_is = matches!((values.next(), values.next()), (Some(v), None) if v == canonical);
    if !as_is {
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(canonical),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header lines after `canonical_coding`, joined by `|`.
    fn coding(sent: &[&'static str]) -> String {
        let mut h = HeaderMap::new();
        for v in sent {
            h.append(header::CONTENT_ENCODING, HeaderValue::from_static(v));
        }
        canonical_coding(&mut h);
        let values: Vec<&str> = h
            .get_all(header::CONTENT_ENCODING)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        values.join("|")
    }

    #[test]
    fn stacked_codings_stay_as_sent() {
        assert_eq!(coding(&["GZIP", "br"]), "GZIP|br");
        assert_eq!(coding(&["gzip, gzip"]), "gzip, gzip");
        assert_eq!(coding(&["gzip, br"]), "gzip, br");
    }

    #[test]
    fn identity_beside_a_coding_is_dropped_and_alone_removed() {
        assert_eq!(coding(&["gzip, identity"]), "gzip");
        assert_eq!(coding(&["identity", "Deflate"]), "deflate");
        assert_eq!(coding(&["IDENTITY"]), "");
        assert_eq!(coding(&["identity, identity"]), "");
        assert_eq!(coding(&["br, identity"]), "br, identity");
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
        ] {
            assert_eq!(coding(&[sent]), canonical, "{sent}");
        }
    }
}
