//! Classification: the top 10 of 1M FP32 values (the target: 500 M elements/s), the
//! same on ascending input (the worst case for a bounded selection, O(n log k)), and the
//! whole post-processing step including formatting.

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tensorgate::protocol::classify::{classify, top_k};
use tensorgate::protocol::{DataType, Parameters, Tensor};

fn bench(c: &mut Criterion) {
    let n = 1_000_000usize;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let values: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / 16_777_216.0
        })
        .collect();
    let mut g = c.benchmark_group("classify");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("top10_fp32_1M", |b| {
        b.iter(|| black_box(top_k(black_box(&values), 10)))
    });
    // The worst order for a bounded selection: every value beats the worst one kept.
    let ascending: Vec<f32> = (0..n).map(|i| i as f32).collect();
    g.bench_function("top10_fp32_1M_ascending", |b| {
        b.iter(|| black_box(top_k(black_box(&ascending), 10)))
    });
    g.bench_function("top200_fp32_1M_ascending", |b| {
        b.iter(|| black_box(top_k(black_box(&ascending), 200)))
    });
    g.bench_function("top1000_fp32_1M_ascending", |b| {
        b.iter(|| black_box(top_k(black_box(&ascending), 1000)))
    });
    let tensor = Tensor {
        name: "OUTPUT0".into(),
        datatype: DataType::Fp32,
        shape: vec![1, n as u64],
        parameters: Parameters::new(),
        data: Bytes::from(
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
    };
    g.bench_function("classify_tensor_fp32_1M_k10", |b| {
        b.iter(|| black_box(classify(black_box(&tensor), 10, true, None).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
