//! The protocol codec on the hot paths, each against a `serde_json::Value` baseline measured
//! in the same run:
//! - JSON → binary: decoding a JSON request with one FP32 tensor of 1M elements and encoding
//!   it in binary for a backend (throughput: JSON bytes read);
//! - binary → JSON: encoding a response with one FP32 output of 1M elements as JSON
//!   (throughput: JSON bytes written);
//! - counting the elements of a JSON `data` array without converting them;
//! - a 64 MB binary request decoded and re-encoded for forwarding (zero copy).

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tensorgate::protocol::rest::decode::{decode_request, RequestBody};
use tensorgate::protocol::rest::encode::{encode_request, encode_response};
use tensorgate::protocol::rest::json_data::count_elements;
use tensorgate::protocol::{DataType, InferResponse, Limits, Parameters, Tensor};

const N: usize = 1_000_000;

fn values() -> Vec<f32> {
    // Deterministic values with realistic text: about 10 significant digits each.
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..N)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

/// Keys in the order tritonclient writes them (name, shape, datatype, data).
fn json_request(vals: &[f32]) -> Bytes {
    let data = serde_json::to_string(vals).unwrap();
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{N}],"datatype":"FP32","data":{data}}}]}}"#
    );
    Bytes::from(body)
}

/// The text tritonclient sends for FP32: Python floats of the float32 values, printed as
/// doubles (`0.30000001192092896`), so about twice as many digits as the shortest form.
fn tritonclient_request(vals: &[f32]) -> Bytes {
    let data =
        serde_json::to_string(&vals.iter().map(|v| *v as f64).collect::<Vec<f64>>()).unwrap();
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{N}],"datatype":"FP32","data":{data}}}]}}"#
    );
    Bytes::from(body)
}

/// One group: our decode and re-encode against a serde_json::Value baseline, on `body`.
fn json_to_binary_group(c: &mut Criterion, group: &str, body: &Bytes) {
    let limits = Limits::default();
    let mut g = c.benchmark_group(group);
    g.sample_size(20);
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("fp32_1M/tensorgate", |b| {
        b.iter(|| {
            let RequestBody::Message(req) = decode_request(black_box(body), None, &limits).unwrap()
            else {
                unreachable!()
            };
            black_box(encode_request(&req, true).unwrap())
        })
    });
    g.bench_function("fp32_1M/serde_json_value", |b| {
        b.iter(|| {
            let v: serde_json::Value = serde_json::from_slice(black_box(body)).unwrap();
            let data = v["inputs"][0]["data"].as_array().unwrap();
            let mut out = Vec::with_capacity(data.len() * 4);
            for x in data {
                out.extend_from_slice(&(x.as_f64().unwrap() as f32).to_le_bytes());
            }
            black_box(out)
        })
    });
    g.finish();
}

fn json_to_binary(c: &mut Criterion) {
    let vals = values();
    json_to_binary_group(
        c,
        "json_to_binary_tritonclient_text",
        &tritonclient_request(&vals),
    );
    let body = json_request(&vals);
    json_to_binary_group(c, "json_to_binary", &body);

    let text = {
        // The data array: from after `"data":` to the `]` before the closing `}]}`.
        let s = std::str::from_utf8(&body).unwrap();
        let start = s.find("\"data\":").unwrap() + 7;
        body.slice(start..s.len() - 3)
    };
    let mut g = c.benchmark_group("count_elements");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("fp32_1M", |b| {
        b.iter(|| black_box(count_elements(black_box(&text), 64).unwrap()))
    });
    g.finish();
}

fn binary_to_json(c: &mut Criterion) {
    let vals = values();
    let resp = InferResponse {
        id: None,
        model_name: "identity_fp32".into(),
        model_version: Some("1".into()),
        parameters: Parameters::new(),
        outputs: vec![Tensor {
            name: "OUTPUT0".into(),
            datatype: DataType::Fp32,
            shape: vec![1, N as u64],
            parameters: Parameters::new(),
            data: Bytes::from(
                vals.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        }],
    };
    let written = encode_response(&resp, &[false]).unwrap().len();
    let mut g = c.benchmark_group("binary_to_json");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(written as u64));
    g.bench_function("fp32_1M/tensorgate", |b| {
        b.iter(|| black_box(encode_response(black_box(&resp), &[false]).unwrap()))
    });
    g.bench_function("fp32_1M/serde_json_value", |b| {
        b.iter(|| {
            let data: Vec<serde_json::Value> = resp.outputs[0]
                .data
                .chunks_exact(4)
                .map(|c| serde_json::json!(f32::from_le_bytes(c.try_into().unwrap())))
                .collect();
            let v = serde_json::json!({"model_name": "identity_fp32", "outputs": [
                {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, N], "data": data}]});
            black_box(serde_json::to_vec(&v).unwrap())
        })
    });
    g.finish();
}

fn passthrough(c: &mut Criterion) {
    let n = 16 << 20; // FP32 elements: 64 MB
    let header = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{n}],"datatype":"FP32","parameters":{{"binary_data_size":{}}}}}]}}"#,
        n * 4
    );
    let mut body = header.clone().into_bytes();
    body.resize(header.len() + n * 4, 7);
    let body = Bytes::from(body);
    let hl = header.len().to_string();
    let limits = Limits::default();
    let mut g = c.benchmark_group("binary_passthrough");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("64MB_decode_reencode", |b| {
        b.iter(|| {
            let RequestBody::Message(req) =
                decode_request(black_box(&body), Some(hl.as_bytes()), &limits).unwrap()
            else {
                unreachable!()
            };
            black_box(encode_request(&req, true).unwrap())
        })
    });
    g.finish();
}

criterion_group!(benches, json_to_binary, binary_to_json, passthrough);
criterion_main!(benches);
