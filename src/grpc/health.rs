//! `grpc.health.v1.Health` for Kubernetes gRPC probes, answered from the gateway's own
//! readiness at the time of each call: SERVING when ready, NOT_SERVING while draining or
//! when no model is ready. The empty service name and `inference.GRPCInferenceService`
//! are known; any other name is NOT_FOUND, as the protocol asks.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer as Generated};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::gateway::queries;
use crate::gateway::Gateway;

pub type HealthServer = Generated<GatewayHealth>;

/// How often a Watch looks at readiness again.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);

pub fn service(gw: Arc<Gateway>) -> HealthServer {
    Generated::new(GatewayHealth { gw })
}

pub struct GatewayHealth {
    gw: Arc<Gateway>,
}

const INFERENCE: &str = "inference.GRPCInferenceService";

impl GatewayHealth {
    fn status(&self, service: &str) -> Result<ServingStatus, Status> {
        if !service.is_empty() && service != INFERENCE {
            return Err(Status::not_found(format!(
                "unknown service '{service}'; tensorgate reports '' and '{INFERENCE}'"
            )));
        }
        Ok(if queries::server_ready(&self.gw).is_ok() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        })
    }
}

impl GatewayHealth {
    fn watched(&self, service: &str) -> ServingStatus {
        self.status(service)
            .unwrap_or(ServingStatus::ServiceUnknown)
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for GatewayHealth {
    async fn check(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let status = self.status(&req.get_ref().service)?;
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }

    type WatchStream = WatchStream;

    /// Sends the status at once, then each change; ends when the client goes away. An
    /// unknown service is SERVICE_UNKNOWN, and the call stays open, as the protocol asks.
    async fn watch(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let service = req.into_inner().service;
        let first = self.watched(&service);
        let this = GatewayHealth {
            gw: self.gw.clone(),
        };
        let updates = futures_util::stream::unfold(
            (this, None::<ServingStatus>, first),
            move |(this, last, mut now)| {
                let service = service.clone();
                async move {
                    if last.is_some() {
                        // Once NOT_SERVING has been said during a drain, the watch ends, so
                        // that it does not hold the shutdown for the whole drain timeout.
                        if this.gw.is_draining() && last == Some(ServingStatus::NotServing) {
                            return None;
                        }
                        loop {
                            tokio::time::sleep(WATCH_INTERVAL).await;
                            now = this.watched(&service);
                            if Some(now) != last || this.gw.is_draining() {
                                break;
                            }
                        }
                    }
                    let item = Ok(HealthCheckResponse { status: now as i32 });
                    Some((item, (this, Some(now), now)))
                }
            },
        );
        Ok(Response::new(Box::pin(updates)))
    }
}
