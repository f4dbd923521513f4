//! Every integration test in one binary. Each test file of `tests/` is a module here rather
//! than a crate of its own: each of those crates linked the whole of tensorgate, tract and
//! tonic again (29 binaries of some 150 MB each), which cost minutes of linking and more
//! disk than a CI machine may have. The helpers they share are declared once, here.

#[path = "../codec_common/mod.rs"]
mod codec_common;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common_fleet/mod.rs"]
mod common_fleet;
#[path = "../common_grpc/mod.rs"]
mod common_grpc;
#[path = "../pki/mod.rs"]
mod pki;

#[path = "../backend_discovery.rs"]
mod backend_discovery;

#[path = "../backend_quirks.rs"]
mod backend_quirks;

#[path = "../cli.rs"]
mod cli;

#[path = "../fleet_routing.rs"]
mod fleet_routing;

#[path = "../forwarding_guarantees.rs"]
mod forwarding_guarantees;

#[path = "../gateway_errors.rs"]
mod gateway_errors;

#[path = "../gateway_infer.rs"]
mod gateway_infer;

#[path = "../grpc_codec_properties.rs"]
mod grpc_codec_properties;

#[path = "../grpc_front.rs"]
mod grpc_front;

#[path = "../limits_auth_drain.rs"]
mod limits_auth_drain;

#[path = "../logs.rs"]
mod logs;

#[path = "../malformed_corpus.rs"]
mod malformed_corpus;

#[path = "../metrics.rs"]
mod metrics;

#[path = "../model_repository.rs"]
mod model_repository;

#[path = "../passthrough.rs"]
mod passthrough;

#[path = "../protocol_properties.rs"]
mod protocol_properties;

#[path = "../protocol_seeds.rs"]
mod protocol_seeds;

#[path = "../recording_backend.rs"]
mod recording_backend;

#[path = "../replica_fleet_change.rs"]
mod replica_fleet_change;

#[path = "../shared_pins.rs"]
mod shared_pins;

#[path = "../tls.rs"]
mod tls;

#[path = "../worker_kill.rs"]
mod worker_kill;

#[path = "../worker_options.rs"]
mod worker_options;

#[path = "../zero_copy_forwarding.rs"]
mod zero_copy_forwarding;
