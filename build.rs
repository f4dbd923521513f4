//! Compiles `proto/inference.proto` in pure Rust (protox), so that no `protoc` is needed:
//! the messages into `protocol::grpc` (pure data), the service into `grpc` (the edge). Also
//! `proto/model_config.proto` into a descriptor set, against which the model repository reads
//! Triton's config.pbtxt files (protobuf text format) at run time.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/inference.proto");
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    let fds = protox::compile(["inference.proto"], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let model_config = protox::compile(["model_config.proto"], ["proto"])?;
    std::fs::write(
        out.join("model_config.fds"),
        prost::Message::encode_to_vec(&model_config),
    )?;

    let messages = out.join("messages");
    std::fs::create_dir_all(&messages)?;
    // Tensor contents stay `Bytes`: raw tensors go to the tensor model without a copy.
    prost_build::Config::new()
        .bytes(["."])
        .out_dir(&messages)
        .compile_fds(fds.clone())?;

    let services = out.join("services");
    std::fs::create_dir_all(&services)?;
    tonic_prost_build::configure()
        .build_server(true)
        // The client is for the integration tests.
        .build_client(true)
        .build_transport(false)
        .extern_path(".inference", "crate::protocol::grpc::pb")
        // prost's codec behind a look at the wire bytes (src/grpc/codec.rs).
        .codec_path("crate::grpc::codec::GuardedCodec")
        .out_dir(&services)
        .compile_fds(fds)?;
    Ok(())
}
