//! Model time of the ONNX fixtures in tract, as a built-in worker runs them (the copies into
//! and out of tract included, the hop to the blocking pool not): the CNN at batch 1 and 8,
//! which issue 16 compares with onnxruntime (bench/onnx_models.sh gives onnxruntime's side),
//! and the MLP.

use std::path::Path;

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tensorgate::models::onnx::OnnxModel;
use tensorgate::models::repository::ModelSettings;
use tensorgate::models::Model;
use tensorgate::protocol::{DataType, InferRequest, Parameters, RequestOptions, Tensor};

fn model(name: &str, version: &str) -> OnnxModel {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/onnx/repo")
        .join(name)
        .join(version)
        .join("model.onnx");
    let settings = ModelSettings {
        name: name.into(),
        versions: vec![version.into()],
        instances: 1,
        ..Default::default()
    };
    OnnxModel::load(&path, settings).unwrap_or_else(|e| panic!("{e}"))
}

/// An FP32 input of `shape`, filled with values in [0, 1) from a fixed sequence.
fn request(input: &str, shape: &[u64]) -> InferRequest {
    let n: u64 = shape.iter().product();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..n)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / 16_777_216.0).to_le_bytes()
        })
        .collect();
    InferRequest {
        id: None,
        parameters: Parameters::new(),
        options: RequestOptions::default(),
        inputs: vec![Tensor {
            name: input.into(),
            datatype: DataType::Fp32,
            shape: shape.to_vec(),
            parameters: Parameters::new(),
            data: Bytes::from(data),
        }],
        outputs: None,
    }
}

fn bench(c: &mut Criterion) {
    let cnn = model("cnn", "1");
    let mlp = model("mlp", "2");
    let mut g = c.benchmark_group("onnx");
    for batch in [1u64, 8] {
        let req = request("IMAGE", &[batch, 1, 28, 28]);
        g.throughput(Throughput::Elements(batch));
        g.bench_function(format!("cnn_batch{batch}"), |b| {
            b.iter(|| black_box(cnn.infer(black_box(&req)).unwrap()))
        });
    }
    let input = mlp.metadata().inputs[0].clone();
    let mut shape: Vec<u64> = input.shape.iter().map(|d| (*d).max(1) as u64).collect();
    shape[0] = 1;
    let req = request(&input.name, &shape);
    g.throughput(Throughput::Elements(1));
    g.bench_function("mlp_batch1", |b| {
        b.iter(|| black_box(mlp.infer(black_box(&req)).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
