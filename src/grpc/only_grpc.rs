//! The gRPC port answers gRPC only. tonic answers any request with `200 OK` and a
//! `grpc-status` header, so a plain HTTP request (a Kubernetes `httpGet` probe or a load
//! balancer's check pointed at this port by mistake) would look like a healthy answer even
//! while the gateway is not ready. gRPC's HTTP/2 protocol document says a request whose
//! content-type is not `application/grpc...` SHOULD get 415; gRPC needs HTTP/2, so an
//! HTTP/1 request gets 505. Both say where the REST API is.

use std::future::{ready, Ready};
use std::task::{Context, Poll};

use futures_util::future::Either;
use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use tonic::body::Body;

/// Used as a layer through `tower::layer::layer_fn(OnlyGrpc)`.
#[derive(Clone)]
pub struct OnlyGrpc<S>(pub S);

/// Why a request is not gRPC, if it is not.
fn refusal<B>(req: &Request<B>) -> Option<(StatusCode, &'static str)> {
    if req.version() < Version::HTTP_2 {
        return Some((
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            "this is tensorgate's gRPC port, and gRPC needs HTTP/2; the v2 REST API is on the REST port (server.listen)\n",
        ));
    }
    // `application/grpc`, or with a subtype (`+proto`) or parameters; not grpc-web.
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.as_bytes().strip_prefix(b"application/grpc"))
        .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';')));
    (!grpc).then_some((
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "this is tensorgate's gRPC port: requests need content-type application/grpc; the v2 REST API is on the REST port (server.listen)\n",
    ))
}

impl<S, B> tower::Service<Request<B>> for OnlyGrpc<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<Response<Body>, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match refusal(&req) {
            None => Either::Left(self.0.call(req)),
            Some((status, why)) => {
                let mut response = Response::new(Body::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(why.as_bytes()),
                )));
                *response.status_mut() = status;
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                Either::Right(ready(Ok(response)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, content_type: Option<&str>) -> Request<()> {
        let mut b = Request::builder().version(version).uri("/v2/health/ready");
        if let Some(ct) = content_type {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn only_grpc_over_http2_passes() {
        for ct in ["application/grpc", "application/grpc+proto"] {
            assert_eq!(refusal(&request(Version::HTTP_2, Some(ct))), None, "{ct}");
        }
        for ct in [
            None,
            Some("application/json"),
            Some("text/plain"),
            Some("application/grpc-web"),
        ] {
            assert_eq!(
                refusal(&request(Version::HTTP_2, ct)).map(|r| r.0),
                Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{ct:?}"
            );
        }
        assert_eq!(
            refusal(&request(Version::HTTP_11, Some("application/grpc"))).map(|r| r.0),
            Some(StatusCode::HTTP_VERSION_NOT_SUPPORTED)
        );
    }
}
