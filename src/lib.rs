//! tensorgate: a gateway for fleets of Open Inference Protocol (KServe v2) model servers.
//! See docs/ARCHITECTURE.md for the path of a request and which module may use which.

pub mod body;
pub mod body_budget;
pub mod config;
pub mod error;
pub mod fleet;
pub mod gateway;
pub mod grpc;
pub mod headers;
pub mod logformat;
pub mod logwriter;
pub mod metrics;
pub mod models;
pub mod pinstore;
pub mod protocol;
pub mod reload;
pub mod rest;
pub mod routing;
pub mod run;
pub mod server;
pub mod tls;
