//! Cost of picking a backend for a sequence: sequence-table lookups at 10, 100 and 1,000
//! backends, against per-key rendezvous hashing (the O(N) alternative) for comparison; plus
//! building a table, and updating one when a backend joins.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use tensorgate::protocol::SequenceId;
use tensorgate::routing::sequence_key;
use tensorgate::routing::table::{SequenceTable, DEFAULT_TABLE_SIZE};
use xxhash_rust::xxh3::xxh3_64_with_seed;

fn members(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("http://10.0.{}.{}:8000", i / 250, i % 250))
        .collect()
}

fn pick(c: &mut Criterion) {
    let mut g = c.benchmark_group("pick_backend");
    for n in [10usize, 100, 1000] {
        let names = members(n);
        let m: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
        let table = SequenceTable::new(&m, DEFAULT_TABLE_SIZE);
        let mut i = 0u64;
        g.bench_with_input(BenchmarkId::new("table", n), &n, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(1);
                // The whole routing step: hash (model, sequence id), then look up.
                let key = sequence_key("accumulate", &SequenceId::Uint(black_box(i)));
                black_box(table.lookup(key))
            })
        });
        let hashes: Vec<u64> = names
            .iter()
            .map(|s| xxh3_64_with_seed(s.as_bytes(), 7))
            .collect();
        g.bench_with_input(BenchmarkId::new("rendezvous", n), &n, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(1);
                let key = sequence_key("accumulate", &SequenceId::Uint(black_box(i)));
                black_box(
                    hashes
                        .iter()
                        .enumerate()
                        .max_by_key(|(_, h)| xxh3_64_with_seed(&key.to_le_bytes(), **h))
                        .map(|(i, _)| i),
                )
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("build_table");
    g.sample_size(10);
    for n in [10usize, 100] {
        let names = members(n);
        let m: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
        g.bench_with_input(BenchmarkId::new("full", n), &n, |b, _| {
            b.iter(|| black_box(SequenceTable::new(&m, DEFAULT_TABLE_SIZE)))
        });
    }
    // What a membership change costs: one backend joins a fleet of N - 1.
    for n in [10usize, 100, 1000] {
        let names = members(n);
        let m: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
        let before = SequenceTable::new(&m[..n - 1], DEFAULT_TABLE_SIZE);
        g.bench_with_input(BenchmarkId::new("join", n), &n, |b, _| {
            b.iter(|| black_box(SequenceTable::derive(&before, &m, DEFAULT_TABLE_SIZE)))
        });
    }
    g.finish();
}

criterion_group!(benches, pick);
criterion_main!(benches);
