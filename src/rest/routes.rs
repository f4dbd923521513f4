//! The v2 REST paths the gateway answers.

use http::Method;

use crate::gateway::queries::RepositoryAction;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    ServerMetadata,
    Live,
    Ready,
    ModelMetadata {
        model: String,
        version: Option<String>,
    },
    ModelReady {
        model: String,
        version: Option<String>,
    },
    /// Triton's model configuration endpoint (`.../config`).
    ModelConfig {
        model: String,
        version: Option<String>,
    },
    Infer {
        model: String,
        version: Option<String>,
    },
    RepositoryIndex,
    /// `POST /v2/repository/models/{model}/load` or `/unload`.
    RepositoryControl {
        model: String,
        action: RepositoryAction,
    },
    Stats {
        model: Option<String>,
        version: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    NotFound,
    /// The path exists but not for this method; holds the allowed method.
    MethodNotAllowed(Method),
    /// A Triton shared-memory endpoint (`/v2/systemsharedmemory/...`,
    /// `/v2/cudasharedmemory/...`), named for the answer: the gateway offers none.
    SharedMemory(&'static str),
    /// Triton's trace or log settings (`/v2/trace/setting`, `/v2/models/{m}/trace/setting`,
    /// `/v2/logging`), which belong to each backend.
    BackendSetting(&'static str),
}

/// Segments matched without allocating (`route`).
const INLINE_SEGMENTS: usize = 8;

/// Matches a method and path. A trailing slash is tolerated.
pub fn route(method: &Method, path: &str) -> Result<Route, RouteError> {
    let path = path.strip_suffix('/').unwrap_or(path);
    // The segments on the stack: every route has at most seven, and a Vec for them was a
    // third of this function's cost on each inference. Longer paths (all refused, but some
    // with their own words) are matched from a Vec.
    let mut inline = [""; INLINE_SEGMENTS];
    let mut parts = path.split('/').skip(1);
    let mut count = 0;
    for (slot, part) in inline.iter_mut().zip(&mut parts) {
        *slot = part;
        count += 1;
    }
    let spilled: Vec<&str>;
    let segments: &[&str] = if parts.next().is_none() {
        &inline[..count]
    } else {
        spilled = path.split('/').skip(1).collect();
        &spilled
    };
    let (route, allowed) = match segments {
        ["v2", "systemsharedmemory", ..] => {
            return Err(RouteError::SharedMemory("system shared memory"))
        }
        ["v2", "cudasharedmemory", ..] => {
            return Err(RouteError::SharedMemory("CUDA shared memory"))
        }
        ["v2", "trace", "setting"] | ["v2", "models", .., "trace", "setting"] => {
            return Err(RouteError::BackendSetting("trace settings"))
        }
        ["v2", "logging"] => return Err(RouteError::BackendSetting("log settings")),
        ["v2"] => (Route::ServerMetadata, Method::GET),
        ["v2", "health", "live"] => (Route::Live, Method::GET),
        ["v2", "health", "ready"] => (Route::Ready, Method::GET),
        ["v2", "repository", "index"] => (Route::RepositoryIndex, Method::POST),
        ["v2", "repository", "models", model, action] if !model.is_empty() => {
            let action = match *action {
                "load" => RepositoryAction::Load,
                "unload" => RepositoryAction::Unload,
                _ => return Err(RouteError::NotFound),
            };
            let model = decode(model).ok_or(RouteError::NotFound)?;
            (Route::RepositoryControl { model, action }, Method::POST)
        }
        // As in Triton, "stats" right after /v2/models is the statistics extension.
        ["v2", "models", "stats"] => (
            Route::Stats {
                model: None,
                version: None,
            },
            Method::GET,
        ),
        ["v2", "models", rest @ ..] => model_route(rest).ok_or(RouteError::NotFound)?,
        _ => return Err(RouteError::NotFound),
    };
    if *method == allowed || (allowed == Method::GET && *method == Method::HEAD) {
        Ok(route)
    } else {
        Err(RouteError::MethodNotAllowed(allowed))
    }
}

/// A path segment as the name it encodes: clients percent-encode names (tritonclient quotes
/// every model name it puts in a path), and so does the gateway when it calls a backend.
/// `None` when the bytes it encodes are not UTF-8: no model has such a name.
fn decode(segment: &str) -> Option<String> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
        .map(|name| name.into_owned())
}

fn model_route(rest: &[&str]) -> Option<(Route, Method)> {
    let (model, version, tail) = match rest {
        [m, "versions", v, tail @ ..] if !m.is_empty() && !v.is_empty() => {
            (m, Some(decode(v)?), tail)
        }
        [m, tail @ ..] if !m.is_empty() => (m, None, tail),
        _ => return None,
    };
    let model = decode(model)?;
    Some(match tail {
        [] => (Route::ModelMetadata { model, version }, Method::GET),
        ["ready"] => (Route::ModelReady { model, version }, Method::GET),
        ["config"] => (Route::ModelConfig { model, version }, Method::GET),
        ["infer"] => (Route::Infer { model, version }, Method::POST),
        ["stats"] => (
            Route::Stats {
                model: Some(model),
                version,
            },
            Method::GET,
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(&Method::GET, "/v2/models/stats"),
            Ok(Route::Stats {
                model: None,
                version: None
            })
        );
        assert_eq!(
            route(&Method::GET, "/v2/models/m/versions/2/stats"),
            Ok(Route::Stats {
                model: Some("m".into()),
                version: Some("2".into())
            })
        );
        assert_eq!(route(&Method::GET, "/v2"), Ok(Route::ServerMetadata));
        assert_eq!(route(&Method::GET, "/v2/health/ready/"), Ok(Route::Ready));
        assert_eq!(
            route(&Method::POST, "/v2/models/simple/versions/3/infer"),
            Ok(Route::Infer {
                model: "simple".into(),
                version: Some("3".into())
            })
        );
        assert_eq!(
            route(&Method::GET, "/v2/models/simple/ready"),
            Ok(Route::ModelReady {
                model: "simple".into(),
                version: None
            })
        );
        assert_eq!(
            route(&Method::GET, "/v2/models/simple/infer"),
            Err(RouteError::MethodNotAllowed(Method::POST))
        );
        assert_eq!(
            route(&Method::POST, "/v2"),
            Err(RouteError::MethodNotAllowed(Method::GET))
        );
        assert_eq!(route(&Method::GET, "/v3"), Err(RouteError::NotFound));
        assert_eq!(
            route(&Method::POST, "/v2/repository/index"),
            Ok(Route::RepositoryIndex)
        );
        assert_eq!(
            route(&Method::GET, "/v2/models//infer"),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            route(&Method::GET, "/v2/models/x/versions/1/foo"),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn the_configuration_endpoint() {
        assert_eq!(
            route(&Method::GET, "/v2/models/mlp/versions/2/config"),
            Ok(Route::ModelConfig {
                model: "mlp".into(),
                version: Some("2".into())
            })
        );
        assert_eq!(
            route(&Method::POST, "/v2/models/mlp/config"),
            Err(RouteError::MethodNotAllowed(Method::GET))
        );
    }

    /// Names arrive percent-encoded, as tritonclient and the gateway itself send them.
    #[test]
    fn names_are_percent_decoded() {
        assert_eq!(
            route(&Method::POST, "/v2/models/cnn%20x/versions/v%2B1/infer"),
            Ok(Route::Infer {
                model: "cnn x".into(),
                version: Some("v+1".into())
            })
        );
        assert_eq!(
            route(&Method::POST, "/v2/repository/models/a%2Bb/load"),
            Ok(Route::RepositoryControl {
                model: "a+b".into(),
                action: RepositoryAction::Load
            })
        );
        // A literal '+' is a '+' in a path (not a space, as in a query string).
        assert_eq!(
            route(&Method::GET, "/v2/models/a+b"),
            Ok(Route::ModelMetadata {
                model: "a+b".into(),
                version: None
            })
        );
        assert_eq!(
            route(&Method::GET, "/v2/models/%FF"),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn triton_extensions_a_gateway_does_not_offer_are_named() {
        use RouteError::{BackendSetting, SharedMemory};
        let (system, cuda) = (
            SharedMemory("system shared memory"),
            SharedMemory("CUDA shared memory"),
        );
        let (trace, log) = (
            BackendSetting("trace settings"),
            BackendSetting("log settings"),
        );
        let cases = [
            (Method::GET, "/v2/systemsharedmemory/status", system.clone()),
            (
                Method::POST,
                "/v2/systemsharedmemory/region/r0/register",
                system,
            ),
            (Method::POST, "/v2/cudasharedmemory/unregister", cuda),
            (Method::GET, "/v2/trace/setting", trace.clone()),
            (Method::POST, "/v2/models/simple/trace/setting", trace),
            (Method::GET, "/v2/logging", log),
        ];
        for (method, path, expected) in cases {
            assert_eq!(route(&method, path), Err(expected), "{method} {path}");
        }
        assert_eq!(
            route(&Method::GET, "/v2/models/trace/setting/x"),
            Err(RouteError::NotFound)
        );
    }

    /// Paths of more segments than `route` holds on the stack are matched all the same.
    #[test]
    fn long_paths_are_matched_whole() {
        use RouteError::{BackendSetting, NotFound, SharedMemory};
        let deep = format!("/v2/systemsharedmemory{}", "/r".repeat(INLINE_SEGMENTS * 2));
        let trace = format!("/v2/models{}/trace/setting", "/m".repeat(INLINE_SEGMENTS));
        let cases = [
            (deep.as_str(), SharedMemory("system shared memory")),
            (trace.as_str(), BackendSetting("trace settings")),
            // Exactly as many segments as the stack holds (8), and one more (9).
            (
                "/v2/models/a/b/c/d/trace/setting",
                BackendSetting("trace settings"),
            ),
            (
                "/v2/models/a/b/c/d/e/trace/setting/",
                BackendSetting("trace settings"),
            ),
            ("/v2/models/m/versions/1/trace/setting/x", NotFound),
            ("/v2/models/m/versions/1/trace/setting/x/y", NotFound),
            ("/v2/models/m/versions/1/a/b/infer", NotFound),
        ];
        for (path, expected) in cases {
            assert_eq!(route(&Method::GET, path), Err(expected), "{path}");
        }
    }
}
